"""The launchers (`experiments/NAME.py`) and their configs (`configs/NAME.py`): every config
launcher is `experiments.launch`'s main around its program, each one's --help lists its flags
when run as a script from any directory, and every `--config=configs/NAME.py[:preset]` that a
config's docstring documents loads by its path from any directory (as config_flags loads it)
to what `configs.NAME` builds when imported. Static checks and a few short subprocesses."""

import ast
import glob
import importlib
import os
import re
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHERS = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "experiments",
                                                                             "*.py"))
                   if os.path.basename(p) not in ("__init__.py", "launch.py"))
# The launcher with no config: its flags are its own (absl, no ml_collections).
NO_CONFIG = {"seeds_exercises": ("--out_dir", "--[no]quick")}
# Flags a config launcher defines beside --config.
OWN_FLAGS = {"train": ("--workdir", "--stop_at_step")}


def _calls(tree) -> set:
  """Dotted names of what a module calls ("launch.run", "app.run", ...)."""
  return {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}


def test_the_launchers_are_all_there():
  assert {"chen_chinchilla", "leviathan_t5", "train", "seeds_exercises"} <= set(LAUNCHERS)
  assert set(NO_CONFIG) | set(OWN_FLAGS) <= set(LAUNCHERS)


@pytest.mark.parametrize("name", [n for n in LAUNCHERS if n not in NO_CONFIG])
def test_each_config_launcher_runs_the_shared_main(name):
  """One main for all (experiments/launch.py): a launcher defines --config with
  launch.config_flag("NAME.py") and runs its program with launch.run, nothing of its own."""
  with open(os.path.join(ROOT, "experiments", f"{name}.py"), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  calls = _calls(tree)
  assert {"launch.config_flag", "launch.run"} <= calls, name
  assert not calls & {"app.run", "config_flags.DEFINE_config_file", "logging.set_verbosity"}
  flag = next(n for n in ast.walk(tree)
              if isinstance(n, ast.Call) and ast.unparse(n.func) == "launch.config_flag")
  assert ast.literal_eval(flag.args[0]) == f"{name}.py"
  assert os.path.isfile(os.path.join(ROOT, "configs", f"{name}.py"))


def test_each_launcher_prints_its_flags_on_help(tmp_path):
  """`python experiments/NAME.py --help` from another directory exits 0 (absl's `app.run`
  exits 1 after a help page; `specjax._app.run_app` turns that one exit into 0) and lists the
  launcher's own flags, --config first among them."""
  procs = {name: subprocess.Popen(
      [sys.executable, os.path.join(ROOT, "experiments", f"{name}.py"), "--help"],
      cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for name in LAUNCHERS}
  for name, p in procs.items():
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0 and "Traceback" not in err, (name, err[-2000:])
    expected = NO_CONFIG.get(name, ("--config", *OWN_FLAGS.get(name, ())))
    for flag in expected:
      assert f"  {flag}:" in out, (name, flag, out)
    if name not in NO_CONFIG:
      default = re.search(r"--config:.*?\(default: '([^']+)'\)", out, re.S).group(1)
      assert os.path.samefile(default, os.path.join(ROOT, "configs", f"{name}.py")), default


def _documented() -> list:
  """Every (config, preset) a config's docstring runs (`--config=configs/NAME.py[:preset]`;
  "" = the default preset)."""
  found = set()
  for path in glob.glob(os.path.join(ROOT, "configs", "*.py")):
    with open(path, encoding="utf-8") as f:
      doc = ast.get_docstring(ast.parse(f.read())) or ""
    found |= set(re.findall(r"--config=configs/(\w+)\.py(?::([\w-]+))?", doc))
  return sorted(found)


def test_the_docstrings_document_every_config():
  configs = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "configs", "*.py"))}
  assert {name for name, _ in _documented()} == configs - {"__init__", "common"}


@pytest.mark.parametrize("name,preset", _documented())
def test_each_documented_config_loads_by_path_from_any_directory(name, preset, tmp_path,
                                                                 monkeypatch):
  """config_flags loads `configs/NAME.py` from its file, outside the `configs` package
  (configs/common.py, which the configs share, is read by its path too)."""
  monkeypatch.chdir(tmp_path)
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "a config", flag_values=fv)
  path = os.path.join(ROOT, "configs", f"{name}.py")
  fv(["launcher", f"--config={path}:{preset}" if preset else f"--config={path}"])
  module = importlib.import_module(f"configs.{name}")
  expected = module.get_config(preset) if preset else module.get_config()
  assert fv.config.to_json() == expected.to_json()
