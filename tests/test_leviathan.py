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


def test_rerun_reuses_everything(micro_run):
  cfg, first = micro_run
  again = leviathan.run(cfg)
  for task in ("translate", "summarize"):
    a = first["tasks"][task]["temperatures"]["0"]["cells"]
    b = again["tasks"][task]["temperatures"]["0"]["cells"]
    assert a == b  # the measurements come from the stored stages, not a new run


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
