"""Result provenance (`specjax.measure.provenance`): the machine, the library versions, the
code's git commit, the command line and the UTC time, never an exception; one real writer
(the sampling benchmark's smoke mode) records them in its JSON meta and markdown header."""

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys

import jax
import pytest

from bench_helpers import run_script
from experiments.programs import report
from specjax.measure import provenance as prov

KEYS = {"recorded", "commit", "dirty", "specjax_version", "cpu_model", "cores", "machine",
        "python", "jax", "jaxlib", "flax", "orbax_checkpoint", "optax", "numpy", "libtpu",
        "command", "utc"}


def _git(cwd, *args):
  subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false",
                  *args], cwd=cwd, check=True, capture_output=True)


def test_the_dict_has_every_key():
  p = prov.provenance()
  assert set(p) == KEYS
  # The format results always had, then the CPU's model where the system names it.
  assert re.fullmatch(r"\S+ \d+ cores( \(.+\))?", p["machine"])
  assert p["jax"] == jax.__version__ and p["jaxlib"] and p["numpy"] and p["flax"]
  assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", p["utc"])
  json.dumps(p)  # every value serialisable


def test_a_package_not_installed_is_none(monkeypatch):
  monkeypatch.setattr(prov, "PACKAGES", {"jax": ("jax",), "absent": ("no-such-dist-xyz-0",)})
  assert prov.package_versions() == {"jax": jax.__version__, "absent": None}


def test_the_command_line_is_recorded(monkeypatch):
  monkeypatch.setattr(sys, "argv", ["experiments/x.py", "--config=c.py:quick", "--note=a b"])
  assert prov.provenance()["command"] == "experiments/x.py --config=c.py:quick '--note=a b'"


def test_outside_a_git_checkout_the_commit_is_none(tmp_path, monkeypatch):
  monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # never a repository above
  p = prov.provenance(source_dir=str(tmp_path))
  assert p["commit"] is None and p["dirty"] is None
  assert prov.provenance_line(p).startswith("code unknown commit")


def test_without_git_the_commit_is_none(tmp_path, monkeypatch):
  monkeypatch.setenv("PATH", str(tmp_path))  # no git executable anywhere
  assert prov.git_state() == (None, None)
  assert prov.git_state(str(tmp_path / "not a directory")) == (None, None)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_commit_and_dirty_count_tracked_files_only(tmp_path, monkeypatch):
  monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
  repo, pkg = tmp_path / "repo", tmp_path / "repo" / "pkg"
  pkg.mkdir(parents=True)
  (pkg / "a.py").write_text("x = 1\n")
  _git(repo, "init", "-q")
  _git(repo, "add", "pkg/a.py")
  _git(repo, "commit", "-q", "-m", "one")
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                        text=True, check=True).stdout.strip()
  assert prov.git_state(str(pkg)) == (head, False)
  (pkg / "new.py").write_text("untracked\n")
  assert prov.git_state(str(pkg)) == (head, False)  # untracked files do not count
  (pkg / "a.py").write_text("x = 2\n")
  assert prov.git_state(str(pkg)) == (head, True)
  p = prov.provenance(source_dir=str(pkg))
  assert prov.provenance_line(p).startswith(f"code {head[:12]} (dirty) · specjax ")
  # A directory of the checkout that git does not track (an installed copy, say): unknown.
  (repo / "site").mkdir()
  (repo / "site" / "b.py").write_text("")
  assert prov.git_state(str(repo / "site")) == (None, None)


def test_results_written_before_provenance_render_without_it():
  old = {"machine": "x86_64 2 cores", "jax": "0.4.30"}
  assert prov.provenance_line(old) == "" and prov.provenance_sentence(old) == ""


def test_machine_info_describes_the_machine_and_leaves_provenance_to_its_record():
  m = report.machine_info()
  assert {"machine", "python", "backend", "devices", "date", "load_average"} <= set(m)
  assert not {"commit", "git_commit", "command"} & set(m)  # one home: the "provenance" key
  assert m["jax"] == jax.__version__


def test_a_benchmark_records_provenance(tmp_path):
  run_script(["benchmarks/sampling_bench.py", "--quick", "--iters=2", "--repeats=1",
              f"--out_dir={tmp_path}"], timeout=600)
  result = json.loads((tmp_path / "sampling.json").read_text())
  meta, rec = result["meta"], result["provenance"]
  assert set(rec) == KEYS and rec["recorded"] is True
  assert rec["command"].startswith("benchmarks/sampling_bench.py --quick")
  assert meta["iters"] == 2 and meta["load_average_at_start"] >= 0  # the old keys stay
  md = (tmp_path / "sampling.md").read_text()
  assert "µs per call. Provenance: code " in md and f"· {rec['utc']} UTC." in md


def test_provenance_names_the_cpu_model_and_the_specjax_version(monkeypatch):
  monkeypatch.setattr(prov, "cpu_model", lambda: "Test CPU 9000")
  p = prov.provenance()
  assert p["cpu_model"] == "Test CPU 9000" and p["machine"].endswith("cores (Test CPU 9000)")
  assert p["specjax_version"] == importlib.metadata.version("specjax")
  monkeypatch.setattr(prov, "cpu_model", lambda: None)
  assert prov.provenance()["machine"].endswith(" cores")


def test_an_uninstalled_source_tree_reads_its_version_from_pyproject(monkeypatch):
  """Without the installed distribution, the version is the checkout's pyproject.toml's."""
  import os, tomllib  # pylint: disable=g-import-not-at-top,multiple-imports
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(root, "pyproject.toml"), "rb") as f:
    expected = tomllib.load(f)["project"]["version"]
  monkeypatch.setattr(prov, "package_versions", lambda *a, **k: {})
  assert prov.specjax_version() == expected
