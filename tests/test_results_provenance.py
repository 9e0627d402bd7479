"""Every committed results JSON carries one provenance record, and every writer produces it.

The record is `specjax.measure.provenance.provenance()` under the top-level "provenance" key:
commit, dirty flag, specjax version, CPU model and core count at least, None only where the
record says it was not recorded at run time (`experiments/tools/backfill_provenance.py`
reconstructs those from git history)."""

import ast
import json
import os
import subprocess

import ml_collections
import pytest

from bench_helpers import ROOT, run_script
from experiments.programs import common
from experiments.tools import backfill_provenance as backfill
from specjax.measure import provenance as prov

# Every program that writes a results JSON (results/, benchmarks/results/), by path.
WRITERS = [
    "benchmarks/adaptive_cost.py", "benchmarks/adaptive_rule.py", "benchmarks/bad_input_cost.py",
    "benchmarks/core_bench.py", "benchmarks/gpu_roofline.py", "benchmarks/loading_memory.py",
    "benchmarks/long_context_cost.py", "benchmarks/projections_bench.py",
    "benchmarks/sampling_bench.py", "benchmarks/tpu_aot.py", "benchmarks/verify_cost.py",
    "experiments/programs/common.py", "experiments/programs/demo.py",
    "experiments/programs/drafter_training.py", "experiments/programs/families.py",
    "experiments/programs/long_context_measure.py", "experiments/programs/peers_suite.py",
    "experiments/programs/seeds.py", "experiments/programs/shakespeare_heads.py",
    "experiments/programs/suffix.py", "specjax/aot/__main__.py",
]


def _head():
  return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                        check=True).stdout.strip()


def _git(cwd, *args):
  subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c",
                  "commit.gpgsign=false", *args], cwd=cwd, check=True, capture_output=True)


# --- the committed files ---------------------------------------------------------------------

def test_there_are_results_to_check():
  files = backfill.result_files()
  assert len(files) >= 70, files  # a glob that matched nothing would pass the test below
  assert any(f.startswith("benchmarks/results/") for f in files)
  assert any(f.startswith("results/tpu_aot/") for f in files)


@pytest.mark.parametrize("path", backfill.result_files())
def test_every_results_json_names_its_provenance(path):
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    result = json.load(f)
  assert prov.record_problems(result) == [], path
  rec = result["provenance"]
  assert isinstance(rec["cores"], int) or (rec["cores"] is None and not rec["recorded"])
  if not rec["recorded"]:  # reconstructed: it names what the run kept and where it came from
    assert set(rec["recorded_fields"]) <= set(prov.REQUIRED)
    assert all(rec[k] is not None for k in rec["recorded_fields"])
    assert len(rec["committed_in"]) == 40 and rec["note"] == backfill.NOTE


def test_the_backfill_has_nothing_left_to_do():
  assert backfill.main(["--check"]) == 0


# --- the checker -----------------------------------------------------------------------------

def _good():
  return {"rows": [1], "provenance": {"recorded": True, "commit": "a" * 40, "dirty": False,
                                      "specjax_version": "0.1.0", "cpu_model": "Test CPU",
                                      "cores": 2}}


def test_the_checker_accepts_a_full_record():
  assert prov.record_problems(_good()) == []


@pytest.mark.parametrize("breaks", [
    lambda r: r.pop("provenance"),                                # no block at all
    lambda r: r.update(provenance=" Provenance: code 0123abcd4567."),  # a sentence, not a dict
    lambda r: r["provenance"].pop("cpu_model"),                   # a required key missing
    lambda r: r["provenance"].pop("recorded"),
    lambda r: r["provenance"].update(commit=None),                # null though recorded
    lambda r: r["provenance"].update(recorded=False),             # reconstructed, no source
])
def test_the_checker_refuses_a_json_without_the_record(breaks):
  result = _good()
  breaks(result)
  assert prov.record_problems(result)
  assert prov.record_problems([1, 2])  # not an object at all


def test_a_reconstructed_record_may_hold_nulls():
  result = _good()
  result["provenance"].update(recorded=False, commit=None, cpu_model=None, committed_in="b" * 40,
                              note=backfill.NOTE)
  assert prov.record_problems(result) == []


# --- the shared function and the writers -----------------------------------------------------

def test_the_shared_function_makes_a_full_record(monkeypatch):
  monkeypatch.setattr(prov, "cpu_model", lambda: "Test CPU 9000")
  rec = prov.provenance()
  assert prov.record_problems({"provenance": rec}) == []
  assert rec["commit"] == _head() and rec["cores"] == os.cpu_count()
  assert rec["cpu_model"] == "Test CPU 9000" and rec["specjax_version"]
  assert prov.provenance_line(rec).startswith(f"code {rec['commit'][:12]}")


def _writes_the_record(source: str) -> bool:
  """Whether `source` puts a `provenance()` call under a "provenance" key: a dict entry, an
  item assignment or a `provenance=` keyword."""
  tree = ast.parse(source)

  def is_call(node):
    return (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", ""))
            == "provenance")
  # Names bound to the record (`record = provenance()`) count as the record.
  names = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and is_call(node.value)
           for t in node.targets if isinstance(t, ast.Name)}

  def is_record(node):
    return is_call(node) or (isinstance(node, ast.Name) and node.id in names)
  for node in ast.walk(tree):
    if isinstance(node, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value == "provenance" and is_record(v)
        for k, v in zip(node.keys, node.values)):
      return True
    if isinstance(node, ast.Assign) and is_record(node.value) and any(
        isinstance(t, ast.Subscript) and getattr(t.slice, "value", None) == "provenance"
        for t in node.targets):
      return True
    if isinstance(node, ast.Call) and any(k.arg == "provenance" and is_record(k.value)
                                          for k in node.keywords):
      return True
  return False


def test_the_writer_scan_tells_a_record_from_a_spread():
  assert _writes_the_record('r = {"rows": [], "provenance": provenance()}')
  assert _writes_the_record('r["provenance"] = provenance()')
  assert _writes_the_record('r.update(case=1, provenance=provenance())')
  assert _writes_the_record('record = provenance()\nwrite({"meta": m, "provenance": record})')
  assert not _writes_the_record('record = other()\nwrite({"meta": m, "provenance": record})')
  assert not _writes_the_record('meta = {**provenance(), "rows": []}')        # the old spread
  assert not _writes_the_record('r["provenance"] = provenance_sentence(p)')  # a string


@pytest.mark.parametrize("path", WRITERS)
def test_every_writer_puts_the_shared_record_under_provenance(path):
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    source = f.read()
  assert _writes_the_record(source), path
  # One function, no copies: no writer asks git or the CPU itself, or spreads the record.
  for copy in ("rev-parse", "/proc/cpuinfo", "**provenance()"):
    assert copy not in source, (path, copy)


def test_a_reproduction_writes_the_record(tmp_path):
  # publish_results is every reproduction's last step (Leviathan, Chen, ...): rigged, no run.
  cfg = ml_collections.ConfigDict({"results_dir": "", "preset": "test"})
  common.publish_results({"tasks": {}}, cfg, str(tmp_path), dict, lambda out_dir: None)
  result = json.loads((tmp_path / "results" / "results.json").read_text())
  rec = result["provenance"]
  assert rec["recorded"] is True and rec["commit"] == _head() and rec["cores"] == os.cpu_count()
  assert rec["cpu_model"] == prov.cpu_model()
  assert "commit" not in result["machine"]  # one home


def test_a_benchmark_writes_the_record(tmp_path):
  run_script(["benchmarks/adaptive_rule.py", "--quick", f"--out_dir={tmp_path}"], timeout=600)
  result = json.loads((tmp_path / "adaptive_rule_quick.json").read_text())
  rec = result["provenance"]
  assert set(prov.REQUIRED) <= set(rec) and rec["recorded"] is True
  assert rec["commit"] == _head() and rec["cores"] == os.cpu_count()
  assert rec["cpu_model"] == prov.cpu_model()
  assert rec["command"].startswith("benchmarks/adaptive_rule.py --quick")
  md = (tmp_path / "adaptive_rule_quick.md").read_text()
  assert f"Provenance: code {rec['commit'][:12]}" in md


# --- the backfill ----------------------------------------------------------------------------

def _repo_with(tmp_path, name, obj, **dumps):
  repo = tmp_path / "repo"
  (repo / "results" / "x").mkdir(parents=True)
  path = repo / "results" / "x" / name
  path.write_text(json.dumps(obj, **dumps) + "\n", encoding="utf-8")
  _git(repo, "init", "-q")
  _git(repo, "add", ".")
  _git(repo, "commit", "-q", "-m", "results")
  sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                       check=True).stdout.strip()
  return repo, path, sha


def test_the_backfill_copies_what_the_run_recorded_and_names_the_commit(tmp_path):
  legacy = {"meta": {"machine": "x86_64 2 cores (Test CPU)", "git_commit": "c" * 40,
                     "git_dirty": True, "jax": "0.1", "utc": "2026-01-01T00:00:00Z"},
            "rows": [{"ms": 1.5, "name": "ü"}]}
  repo, path, sha = _repo_with(tmp_path, "r.json", legacy, indent=1, sort_keys=True,
                               ensure_ascii=False)
  before = path.read_text(encoding="utf-8")
  rec = backfill.backfill_file("results/x/r.json", str(repo))
  after = json.loads(path.read_text(encoding="utf-8"))
  assert prov.record_problems(after) == []
  assert rec == after["provenance"]
  assert rec["recorded"] is False and rec["committed_in"] == sha and rec["note"] == backfill.NOTE
  assert rec["recorded_fields"] == ["commit", "dirty", "cpu_model", "cores"]
  assert (rec["commit"], rec["dirty"], rec["cpu_model"], rec["cores"]) == ("c" * 40, True,
                                                                          "Test CPU", 2)
  assert rec["specjax_version"] is None and rec["jax"] == "0.1"
  # Everything else as it was, dumped the same way (indent 1, sorted keys, ü unescaped).
  assert {k: v for k, v in after.items() if k != "provenance"} == legacy
  expected = json.dumps(dict(legacy, provenance=rec), indent=1, sort_keys=True,
                        ensure_ascii=False) + "\n"
  assert path.read_text(encoding="utf-8") == expected != before
  assert backfill.backfill_file("results/x/r.json", str(repo)) is None  # a second run: nothing


def test_the_backfill_reads_a_provenance_sentence_and_keeps_it(tmp_path):
  legacy = {"tasks": {}, "provenance": " Provenance: code 0123abcd4567 (dirty) · specjax 0.1.0"
                                       " · jaxlib 0.4.30 · 2025-01-31T12:00:00Z UTC."}
  repo, path, sha = _repo_with(tmp_path, "s.json", legacy, indent=2)
  rec = backfill.backfill_file("results/x/s.json", str(repo))
  assert list(json.loads(path.read_text())) == ["tasks", "provenance"]  # key order kept
  assert (rec["commit"], rec["dirty"], rec["specjax_version"], rec["jaxlib"], rec["utc"]) == (
      "0123abcd4567", True, "0.1.0", "0.4.30", "2025-01-31T12:00:00Z")
  assert rec["legacy"] == legacy["provenance"] and rec["cores"] is None
  assert rec["committed_in"] == sha
  assert prov.provenance_line(rec).startswith("code 0123abcd4567 (dirty) · specjax 0.1.0")


def test_a_file_with_nothing_recorded_is_reconstructed_from_git_alone(tmp_path):
  repo, path, sha = _repo_with(tmp_path, "n.json", {"rows": []})
  rec = backfill.backfill_file("results/x/n.json", str(repo))
  assert rec["recorded_fields"] == [] and all(rec[k] is None for k in prov.REQUIRED)
  assert rec["committed_in"] == sha
  assert prov.provenance_line(rec) == f"code not recorded (results committed in {sha[:12]})"
  text = path.read_text()
  assert text.count("\n") == 1 and text.endswith("}\n")  # one line, as it was
  assert json.loads(text) == {"rows": [], "provenance": rec}
