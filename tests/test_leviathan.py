"""The Leviathan reproduction runs end to end on the micro preset (fixture data)."""

import json
import os
import shutil

import ml_collections
import pytest

from configs import leviathan_t5 as lev_config
from specjax.checkpoints import CheckpointError, params_digest, restore_params
from experiments.programs import leviathan, notebooks
from memgcs import memgcs, objects  # noqa: F401  (the gs:// fixture)


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory):
  """The micro run exactly as colab/leviathan_t5.ipynb configures it under
  SPECJAX_NOTEBOOK_WORKDIR = root (the notebook test then reuses it)."""
  root = tmp_path_factory.mktemp("lev")
  samples = notebooks.write_sample_tasks(str(root / "specjax_nb_data"))
  cfg = lev_config.get_config("micro")
  cfg.workdir = str(root / "specjax_nb_leviathan_t5")
  cfg.data.cache_dir = str(root / "specjax_nb_data" / "cache")
  cfg.data.translate_source = samples["translate"]
  cfg.data.summarize_source = samples["summarize"]
  return cfg, leviathan.run(cfg)


def test_the_notebook_reruns_the_micro_run(micro_run, monkeypatch):
  """colab/leviathan_t5.ipynb top to bottom: the same run, every stage reused."""
  from notebook_helpers import run_notebook
  cfg, _ = micro_run
  run_notebook("leviathan_t5.ipynb", monkeypatch, os.path.dirname(cfg.workdir))


def test_micro_preset_end_to_end(micro_run):
  cfg, results = micro_run
  out = results["_out_dir"]
  for name in ("results.json", "results.md", "speedup_vs_gamma.png", "alpha.png"):
    assert os.path.getsize(os.path.join(out, name)) > 0, name
  with open(os.path.join(out, "results.json")) as f:
    stored = json.load(f)
  for task in ("translate", "summarize"):
    temps = stored["tasks"][task]["temperatures"]
    assert set(temps) == {"0", "1"}
    for t, te in temps.items():
      for d in cfg.eval.drafts:
        assert 0.0 <= te["alpha"][d] <= 1.0
        best = te["best"][d]
        assert best["gamma"] in cfg.eval.gammas and best["speedup"] > 0
        assert 1.0 <= best["tokens_per_iteration"] <= best["gamma"] + 1
      for name in ("unigram", "bigram"):
        assert 0.0 <= te["alpha"][name] <= 1.0
    greedy = temps["0"]["cells"]
    assert all(c["identical_fraction"] == 1.0 for k, c in greedy.items() if k != "ar")
  md = open(os.path.join(out, "results.md")).read()
  assert "Table 2 layout" in md and "paper speedup" in md and "## Findings" in md
  split = stored["time_split_s"]
  stages = ("data", "training", "calibration", "measurement", "report", "other")
  assert set(stages) <= set(split) and all(split[k] >= 0 for k in split)
  assert split["total"] == pytest.approx(sum(split[k] for k in stages))
  assert split["measurement"] >= sum(v for k, v in split.items() if k.startswith("measurement/"))
  assert split["calibration"] == 0.0 and "calibration" not in stored   # micro: no auto cells
  # The fixture's run trained and measured everything (results.json may be the notebook's rerun).
  assert results["time_split_status"]["measurement"] == "computed"
  assert "trained: target" in results["time_split_status"]["training"]
  assert sum(l.startswith("Time split of this run") for l in md.splitlines()) == 1


def test_rerun_reuses_everything(micro_run):
  cfg, first = micro_run
  again = leviathan.run(cfg)
  for task in ("translate", "summarize"):
    a = first["tasks"][task]["temperatures"]["0"]["cells"]
    b = again["tasks"][task]["temperatures"]["0"]["cells"]
    assert a == b  # the measurements come from the stored stages, not a new run
  status = again["time_split_status"]
  assert status["training"] == "reused" and status["measurement"] == "reused"
  assert status["data"] == "reused" and again["time_split_s"]["measurement"] > 0


def _copy_of_run(cfg, dest):
  """The micro run's workdir copied to `dest` (trained models, stages,
  compiled executables), and a config pointing at it."""
  shutil.copytree(cfg.workdir, dest)
  copy = ml_collections.ConfigDict(cfg.to_dict())
  copy.workdir = str(dest)
  return copy


def _truncate_largest(directory, size=5):
  files = [os.path.join(b, f) for b, _, fs in os.walk(directory) for f in fs]
  path = max(files, key=os.path.getsize)
  with open(path, "r+b") as f:
    f.truncate(size)
  return path


def test_damaged_models_and_stages_are_recovered(micro_run, tmp_path):
  """A truncated params file in one draft's final/, a missing config.json in
  another's (whose newest step checkpoint is truncated too) and a truncated
  measurement chunk: the rerun rebuilds both drafts from their newest intact
  step checkpoints (bit-exact, so every measurement of them still holds),
  recomputes the one chunk, and reuses everything else."""
  cfg, first = micro_run
  run = tmp_path / "run"
  cfg2 = _copy_of_run(cfg, run)
  _truncate_largest(run / "draft_small" / "final" / "params")
  os.remove(run / "draft_large" / "final" / "config.json")
  steps = sorted(int(p) for p in os.listdir(run / "draft_large" / "checkpoints") if p.isdigit())
  _truncate_largest(run / "draft_large" / "checkpoints" / str(steps[-1]) / "state")
  chunk = run / "stages" / "translate" / "t0" / "chunk0" / "small" / "g2.json"
  chunk.write_text(chunk.read_text()[:40])
  again = leviathan.run(cfg2)
  assert again["stages"]["computed"] == 1, again["stages"]
  assert "unreadable file" in again["stages"]["recomputed"]["translate/t0/chunk0/small/g2"]
  for name in ("small", "large"):
    original, _ = restore_params(os.path.join(cfg.workdir, f"draft_{name}", "final"))
    rebuilt, _ = restore_params(str(run / f"draft_{name}" / "final"))
    assert params_digest(rebuilt) == params_digest(original), name
    assert any(d.startswith("final.corrupt-") for d in os.listdir(run / f"draft_{name}"))
  assert os.listdir(run / "draft_large" / "checkpoints.corrupt")[0].startswith(f"{steps[-1]}.")
  for task in ("translate", "summarize"):
    a, b = (r["tasks"][task]["temperatures"]["0"] for r in (first, again))
    assert a["alpha"] == b["alpha"]
    assert b["cells"]["small/g2"]["identical_fraction"] == 1.0


def test_a_retrained_draft_recomputes_only_its_own_stages(micro_run, tmp_path):
  cfg, _ = micro_run
  run = tmp_path / "run"
  cfg2 = _copy_of_run(cfg, run)
  cfg2.models.drafts.small.d_model = 16
  with pytest.raises(CheckpointError, match="d_model") as err:
    leviathan.run(cfg2)
  assert err.value.kind == "config_mismatch" and "draft_small to train it again" in str(err.value)
  shutil.rmtree(run / "draft_small")
  again = leviathan.run(cfg2)
  stored = {os.path.relpath(os.path.join(b, f), run / "stages")[:-5]
            for b, _, fs in os.walk(run / "stages") for f in fs}
  reads_small = {name for name in stored if "small" in name.split("/")}
  assert reads_small and set(again["stages"]["recomputed"]) == reads_small
  assert again["stages"]["computed"] == len(reads_small)
  assert again["stages"]["reused"] > 0
  assert again["stages"]["computed"] + again["stages"]["reused"] == len(stored - {
      n for n in stored if n.endswith("compile_s")})


def test_end_to_end_prediction_hand_computed():
  """2 prompts, 20 tokens each way; target step 2 ms, verify (γ=2) 4 ms, draft
  0.10 / 0.15 ms (T=1 / T=2), prefill 10 ms (target) + 1 ms (draft); the
  speculative run made 6 target calls after the 2 prefills."""
  results = {"tasks": {"x": {
      "components": {"target": {"1": 0.002, "3": 0.004}, "d": {"1": 0.0001, "2": 0.00015}},
      "prefill": {"target": 0.010, "d": 0.001}, "num_prompts": 2,
      "temperatures": {"0": {"alpha": {"d": 0.8}, "cells": {
          "ar": {"seconds": 0.06, "tokens": 20, "ms_per_token": 3.0},
          "d/g2": {"seconds": 0.05, "tokens": 20, "speedup": 1.2, "tokens_per_iteration": 2.5,
                   "target_calls": 8}}}}}}}
  cell = leviathan.add_predictions(results, [2], ["d"])["tasks"]["x"]["temperatures"]["0"]["cells"]["d/g2"]
  ar_s = 2 * 0.010 + 18 * 0.002                       # prefill per call, then 18 steps
  sp_s = 2 * (0.010 + 0.001) + 6 * (0.00015 + 0.0001 + 0.004)
  assert cell["predicted_end_to_end"] == pytest.approx(ar_s / sp_s)
  assert cell["measured_over_predicted"] == pytest.approx(1.2 / (ar_s / sp_s))
  assert cell["predicted_from_components"] == pytest.approx(2.5 * 0.002 / (0.00025 + 0.004))
  assert cell["decode_speedup"] == pytest.approx((0.06 - 0.02) / (0.05 - 0.022))


def test_a_gs_workdir_trains_measures_and_resumes(micro_run, memgcs, monkeypatch, tmp_path):
  """The main job on a gs:// workdir (served from memory, tests/memgcs.py): the
  micro run's workdir uploaded without the small draft and its measurements;
  the draft is trained there (orbax checkpoints, metrics, final params), its
  stages measured and written there with the results; a third run reuses
  everything."""
  from etils import epath
  from orbax.checkpoint._src.path import gcs_utils
  # orbax writes arrays through tensorstore's own GCS driver, which the fsspec fake does not
  # serve: its gs:// key-value stores are mapped to local files (metadata still goes to gs://).
  monkeypatch.setattr(gcs_utils, "get_kvstore_for_gcs", lambda p: {
      "driver": "file", "path": str(tmp_path / "ts" / p[len("gs://"):])})
  monkeypatch.setattr(gcs_utils, "is_hierarchical_namespace_enabled", lambda p: False)
  cfg, _ = micro_run
  shutil.copytree(cfg.workdir, tmp_path / "ts" / "bucket" / "run")  # the arrays, for tensorstore
  skipped = 0
  for base, _, files in os.walk(cfg.workdir):
    rel = os.path.relpath(base, cfg.workdir)
    if rel.split(os.sep)[0] in ("draft_small", "jax_cache"):
      continue
    for f in files:
      if rel.split(os.sep)[0] == "stages" and "small" in rel.split(os.sep):
        skipped += 1  # the small draft's measurements: measured again
        continue
      dest = epath.Path("gs://bucket/run") / os.path.normpath(os.path.join(rel, f))
      dest.parent.mkdir(parents=True, exist_ok=True)
      dest.write_bytes(open(os.path.join(base, f), "rb").read())
  cfg_gs = ml_collections.ConfigDict(cfg.to_dict())
  cfg_gs.workdir = "gs://bucket/run"
  again = leviathan.run(cfg_gs)
  assert skipped and again["stages"]["computed"] == skipped and again["stages"]["reused"] > 0
  stored = set(objects())
  for name in ("draft_small/final/config.json", "draft_small/metrics.jsonl",
               "results/results.json", "results/results.md"):
    assert f"gs://bucket/run/{name}" in stored, name
  assert not os.path.exists("gs:") and not os.path.exists("./gs:/bucket")
  third = leviathan.run(cfg_gs)
  assert third["stages"]["computed"] == 0
  for task in ("translate", "summarize"):
    assert (third["tasks"][task]["temperatures"]["0"]["cells"]
            == again["tasks"][task]["temperatures"]["0"]["cells"])


def _rigged_results(paper_tasks=("translate", "summarize")):
  """A results dict as `measure` leaves it, with made-up numbers: 2 prompts, drafts small /
  large, γ ∈ {1, 3}, T ∈ {0, 1}. At T = 1 the γ = 1 cells emit short outputs and the γ = 3
  ones long outputs (AR: 40 tokens), so per-token and matched speedups disagree, down to
  which γ is best."""
  def cell(seconds, tokens, tpi, calls, ar):
    return {"seconds": seconds, "tokens": tokens, "ms_per_token": 1e3 * seconds / tokens,
            "speedup": (ar["seconds"] / ar["tokens"]) / (seconds / tokens),
            "tokens_per_iteration": tpi, "target_calls": calls, "identical_fraction": 1.0}
  tasks = {}
  for k, task in enumerate(paper_tasks):
    temps = {}
    for t in ("0", "1"):
      ar = {"seconds": 0.10 + 0.01 * k, "tokens": 40}
      ar["ms_per_token"] = 1e3 * ar["seconds"] / 40
      sampled = t == "1"
      cells = {"ar": ar,
               "small/g1": cell(0.060 if not sampled else 0.050, 40 if not sampled else 24,
                                1.4, 20, ar),
               "small/g3": cell(0.070 if not sampled else 0.095, 40 if not sampled else 56,
                                2.0, 14, ar),
               "large/g1": cell(0.080 if not sampled else 0.052, 40 if not sampled else 22,
                                1.6, 18, ar),
               "large/g3": cell(0.075 + 0.01 * k if not sampled else 0.110,
                                40 if not sampled else 60, 2.6, 12, ar)}
      temps[t] = {"alpha": {"small": 0.40 + 0.1 * sampled, "large": 0.60 + 0.05 * k,
                            "unigram": 0.1, "bigram": 0.3}, "cells": cells}
    tasks[task] = {"components": {"target": {"1": 0.002, "2": 0.0026, "4": 0.0034},
                                  "small": {"1": 0.0001, "2": 0.00012},
                                  "large": {"1": 0.0004, "2": 0.0005}},
                   "prefill": {"target": 0.010, "small": 0.001, "large": 0.002},
                   "num_prompts": 2, "temperatures": temps}
  cfg = lev_config.get_config("micro")
  cfg.eval.gammas = [1, 3]
  cfg.eval.drafts = ["small", "large"]
  return {"tasks": tasks, "params": {"target": 1e6, "small": 1e4, "large": 1e5},
          "config": cfg.to_dict(),
          "machine": {"machine": "test", "jax": "0", "backend": "cpu", "date": "today"}}


def _table2(md):
  """{(task, temp, draft): (γ, speedup, pred. (α, c, v_γ))} of results.md's Table 2."""
  rows = {}
  for line in md.split("## Table 2")[1].split("\n## ")[0].splitlines():
    cols = [c.strip() for c in line.strip("|").split("|")]
    if len(cols) > 9 and cols[0].endswith(")") and cols[4].replace(".", "").isdigit():
      rows[(cols[0].split(" (")[0], cols[2], cols[1])] = (
          int(cols[3]), float(cols[6].strip("*x")), float(cols[9].rstrip("x")))
  return rows


def _per_gamma(md, gammas):
  """{(task, temp, draft): {γ: speedup}} of the tables for every γ."""
  import re
  out, where = {}, None
  for line in md.split("## Speedup for every γ")[1].split("\n## ")[0].splitlines():
    head = re.match(r"\*\*(\w+), temperature (\S+)\*\*", line)
    if head:
      where = head.groups()
    elif where and line.startswith("| ") and "x (" in line:
      cols = [c.strip() for c in line.strip("|").split("|")]
      out[(*where, cols[0])] = {g: float(c.split("x")[0]) for g, c in zip(gammas, cols[2:])}
  return out


def test_the_report_prints_one_speedup_everywhere(tmp_path):
  """Table 2, the tables for every γ, the Findings and the best γ agree cell by cell on the
  speedup at AR's output lengths, where the per-token one tells another story."""
  import re
  from experiments.programs import report
  from experiments.programs.speed import cell_speedup
  results = leviathan.add_predictions(_rigged_results(), [1, 3], ["small", "large"])
  # The rig is what it claims: at T = 1 the per-token speedup picks another γ (or ranks the
  # drafts otherwise) than the matched one does.
  te = results["tasks"]["translate"]["temperatures"]["1"]
  per_token = {g: te["cells"][f"small/g{g}"]["speedup"] for g in (1, 3)}
  matched = {g: te["cells"][f"small/g{g}"]["matched_speedup"] for g in (1, 3)}
  assert max(per_token, key=per_token.get) != max(matched, key=matched.get)
  report.write_leviathan(results, str(tmp_path), leviathan.PAPER_TABLE2,
                         leviathan.PAPER_TABLE3, leviathan.TASKS)
  md = (tmp_path / "results.md").read_text()
  assert md.count("`matched_speedup`") == 1   # the measure, stated once
  table2, per_gamma = _table2(md), _per_gamma(md, [1, 3])
  assert len(table2) == 8 and set(per_gamma) == set(table2)
  fastest = {}
  for (task, t, d), (g, shown, predicted) in table2.items():
    best = results["tasks"][task]["temperatures"][t]["best"][d]
    assert g == best["gamma"] and shown == pytest.approx(cell_speedup(best), abs=0.006)
    assert predicted == pytest.approx(best["predicted_from_alpha_verify"], abs=0.006)
    row = per_gamma[(task, t, d)]
    assert row[g] == shown and shown == max(row.values())   # Table 2 picks the row's best
    cell = results["tasks"][task]["temperatures"][t]["cells"][f"{d}/g{g}"]
    assert shown == pytest.approx(cell["matched_speedup"], abs=0.006)
    if fastest.get((task, t), (None, -1))[1] < shown:
      fastest[(task, t)] = (d, shown, g)
  differs = [k for k, (g, shown, _) in table2.items() if abs(
      results["tasks"][k[0]]["temperatures"][k[1]]["cells"][f"{k[2]}/g{g}"]["speedup"]
      - shown) > 0.01]
  assert differs and all(t == "1" for _, t, _ in differs)
  line = next(l for l in md.splitlines() if "is not the fastest" in l)
  for (task, t), (d, shown, g) in fastest.items():
    assert f"{task} T={t}: fastest {d} {shown:.2f}x at γ={g}" in line, (task, t, line)
  for task, t, d in re.findall(r"(\w+) T=(\S+): fastest \w+ [\d.]+x at γ=\d+ \(c [\d.]+\), "
                               r"(\w+) [\d.]+x", line):
    assert f"{d} {table2[(task, t, d)][1]:.2f}x at γ={table2[(task, t, d)][0]}" in line


def test_the_findings_check_the_papers_claims(tmp_path):
  """Each of Leviathan et al.'s findings is one checked line with its numbers; the formula
  with the measured verify cost is the hand-computed one."""
  from experiments.programs import report
  results = leviathan.add_predictions(_rigged_results(), [1, 3], ["small", "large"])
  cell = results["tasks"]["translate"]["temperatures"]["0"]["cells"]["large/g3"]
  a, c, v = 0.60, 0.0004 / 0.002, 0.0034 / 0.002   # α, c, v_3 of the rig
  assert cell["predicted_from_alpha_verify"] == pytest.approx(
      (1 - a ** 4) / ((1 - a) * (3 * c + v)))
  report.write_leviathan(results, str(tmp_path), leviathan.PAPER_TABLE2,
                         leviathan.PAPER_TABLE3, leviathan.TASKS)
  md = (tmp_path / "results.md").read_text()
  assert _table2(md)[("translate", "0", "large")] == (
      3, pytest.approx(1.33, abs=0.006), pytest.approx(cell["predicted_from_alpha_verify"],
                                                        abs=0.006))
  findings = md.split("## Findings")[1]
  # α: small < large in every case; α(T=0) < α(T=1) for small, equal for large.
  assert "- ✓ **α grows with draft size**" in findings
  assert "translate T=0: small 0.40 < large 0.60" in findings
  assert "- ✗ 0/4 **α at T=0 above α at T=1**" in findings
  assert "translate small 0.40 vs 0.50" in findings
  assert "**the best γ grows with α**" in findings
  assert "**the largest draft (large) is not the fastest**" in findings
  ratios = [x["decode_speedup"] / x["predicted_from_alpha_verify"]
            for tr in results["tasks"].values() for te in tr["temperatures"].values()
            for k, x in te["cells"].items() if k != "ar"]
  within = sum(abs(r - 1) <= 0.15 for r in ratios)
  assert f"within 15% in {within}/{len(ratios)} cells" in findings


def test_the_time_split_counts_reused_stages_as_reused(tmp_path):
  """`TimeSplit` on an injected clock: seconds per stage summed over its visits, a stage
  read back says reused (not 0 s), and the report adds its own seconds and prints one line."""
  from experiments.programs import report
  from experiments.programs.stages import Stages
  from specjax._clock import use_clock

  class Clock:   # advanced by the test alone
    t = 0.0

    def __call__(self):
      return self.t
  clock = Clock()
  stages = Stages(str(tmp_path / "stages"))
  stages.put("a", 1, deps={"x": 1})
  split = leviathan.TimeSplit(stages)
  with use_clock(clock):
    with split.stage("sweep"):
      clock.t += 2.0
      stages.run("a", lambda: 1, deps={"x": 1})          # read back
    with split.stage("alpha"):
      clock.t += 0.5
      stages.run("b", lambda: 2, deps={"x": 1})          # computed
    with split.stage("sweep"):
      clock.t += 1.0
      stages.run("c", lambda: 3, deps={"x": 1})
    with split.stage("training"):
      clock.t += 4.0
    split.mark("training", "reused")
    times, status = leviathan._time_split(split, total_s=10.0)
  assert split.seconds == {"sweep": 3.0, "alpha": 0.5, "training": 4.0}
  assert status == {"training": "reused", "measurement/alpha": "computed",
                    "measurement/sweep": "partly reused: 1 of 2 stages"}
  assert times["measurement/sweep"] == 3.0 and times["other"] == 6.0 and times["total"] == 10.0
  results = leviathan.add_predictions(_rigged_results(), [1, 3], ["small", "large"])
  results.update(time_split_s=times, time_split_status=status)

  def ticking():   # every read of the clock 1.5 s after the last
    ticking.t += 1.5
    return ticking.t
  ticking.t = 0.0
  with use_clock(ticking):
    report.write_leviathan(results, str(tmp_path), leviathan.PAPER_TABLE2,
                           leviathan.PAPER_TABLE3, leviathan.TASKS)
  assert times["report"] == 1.5 and times["total"] == 11.5   # two reads: start, end
  line = next(l for l in (tmp_path / "results.md").read_text().splitlines()
              if l.startswith("Time split of this run"))
  assert "training 4.0 (reused)" in line and "sweep 3.0 (partly reused: 1 of 2 stages)" in line
  assert "report 1.5" in line and "12 in all" in line


def test_auto_cells_calibrate_once_per_draft(micro_run, tmp_path, monkeypatch):
  """With gamma="auto" cells, the micro run calibrates one table per draft (not per task,
  temperature and cell), hands it to every auto cell, and a rerun reads it back."""
  from specjax import calibration
  from experiments.programs import speed
  calls = []

  def calibrate(target, target_params, drafter, draft_params, adaptive, **kw):
    calls.append((drafter.model, kw))
    return calibration.GammaCosts(adaptive.gammas, (1.0, 1.3, 1.5, 1.9, 2.7), measured=True,
                                  calibration_seconds=3.0)

  def no_calibration(*a, **kw):
    raise AssertionError("an auto cell calibrated on its own")
  monkeypatch.setattr(speed, "calibrate_gamma_costs", calibrate)
  monkeypatch.setattr(calibration, "calibrate_gamma_costs", no_calibration)
  cfg, _ = micro_run
  cfg2 = _copy_of_run(cfg, tmp_path / "run")
  cfg2.eval.auto = True
  cfg2.eval.auto_cells = ["auto_series"]   # one cell: the table's hand-over is the same for both
  first = leviathan.run(cfg2)
  assert len(calls) == len(cfg2.eval.drafts) == len(first["calibration"])
  assert all(kw["sampling"].temperature == 1.0 and kw["store"] is False for _, kw in calls)
  assert not any(v["reused"] for v in first["calibration"].values())
  assert first["time_split_status"]["calibration"] == "computed"
  md = open(os.path.join(first["_out_dir"], "results.md")).read()
  assert "One γ cost table per draft" in md and "calibration " in md
  again = leviathan.run(cfg2)
  assert len(calls) == len(cfg2.eval.drafts)
  assert all(v["reused"] for v in again["calibration"].values())
  assert again["time_split_status"]["calibration"] == "reused"
  assert again["stages"]["computed"] == 0


def test_sweep_gammas_names_the_auto_cells_asked_for():
  """`eval.auto_cells` picks which `gamma="auto"` cells run (quick: only the per-call one); a
  name outside `AUTO_CELLS` is refused, naming the field."""
  import ml_collections
  import pytest
  from experiments.programs.leviathan import sweep_gammas
  cfg = ml_collections.ConfigDict(dict(eval=dict(gammas=[3, 6], auto=True)))
  assert sweep_gammas(cfg) == [3, 6, "auto", "auto_series"]
  cfg.eval.auto_cells = ["auto"]
  assert sweep_gammas(cfg) == [3, 6, "auto"]
  cfg.eval.auto = False
  assert sweep_gammas(cfg) == [3, 6]
  cfg.eval.auto, cfg.eval.auto_cells = True, ["auto", "sometimes"]
  with pytest.raises(ValueError, match="auto_cells"):
    sweep_gammas(cfg)
