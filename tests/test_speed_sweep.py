"""The walltime sweep (`experiments.programs.speed`): gamma="auto" cells on
their own and as one series over the prompts (the acceptance estimate
carried from call to call, and from chunk to chunk across a resumed run),
timing repeats, and the speedup at AR's output lengths."""

import os

import numpy as np
import pytest

import specjax
from specjax import calibration
from experiments.programs.speed import matched_speedup, summarize, sweep
from experiments.programs.stages import Stages
from specjax.sampling import GREEDY
from tiny import EOS, ragged_prompts, target

# Relative iteration costs of Γ = (0, 1, 2, 4, 8) at which the prior (α = 0.5)
# never drafts; a draft that is always right pays at every γ.
UNDERVALUED = (1.0, 1.6, 1.8, 2.2, 3.0)


@pytest.fixture
def fixed_costs(monkeypatch):
  def resolve(target, target_params, drafter, draft_params, adaptive, **kw):
    return calibration.GammaCosts(adaptive.gammas, UNDERVALUED[:len(adaptive.gammas)])
  monkeypatch.setattr(specjax.api, "resolve_gamma_costs", resolve)


def _sweep(stages, prompts, lengths, **kw):
  lm, params = target()
  # The target drafting for itself: every draft is accepted.
  return sweep(lm, params, {"self": (lm, params)}, np.asarray(prompts), np.asarray(lengths),
               gammas=[1, "auto", "auto_series"], sampling=GREEDY, max_new_tokens=10,
               eos_id=EOS, stages=stages, prefix="t0", fingerprints={"target": "t", "self": "t"},
               chunk=2, **kw)


def _traces(records, cell):
  return [t for r in records for t in r["cells"][cell]["gamma_trace"]]


def test_a_series_carries_its_estimate_across_calls_and_a_resumed_run(tmp_path, fixed_costs):
  prompts, lengths = ragged_prompts(batch=4, seed=3)
  stages = Stages(str(tmp_path / "stages"))
  records = _sweep(stages, prompts, lengths, repeats=2)
  alone, series = _traces(records, "self/gauto"), _traces(records, "self/gauto_series")
  # Each call on its own starts from the prior, which does not pay here: plain steps.
  assert all(g == 0 for t in alone for g in t), alone
  # The series probes at its first call (one draft, then longer ones once it is
  # accepted: the prior's weight, 6 pseudo-trials, takes a few iterations to overturn)
  # and learns that drafting pays: the later calls draft long from their start.
  assert series[0][0] == 1 and max(series[0]) >= 2, series
  assert min(series[1]) >= 4 and min(series[-1]) >= 4, series
  summary = summarize(records)
  assert summary["self/gauto_series"]["identical_fraction"] == 1.0
  assert summary["self/gauto_series"]["tokens_per_iteration"] > 2.0
  # A killed run loses its second chunk: the rerun measures it again from the
  # first chunk's stored estimate, so the series goes on as before.
  os.remove(stages.path("t0/chunk1/self/gauto_series"))
  again = _sweep(Stages(str(tmp_path / "stages")), prompts, lengths, repeats=2)
  assert _traces(again, "self/gauto_series") == series
  assert again[1]["cells"]["self/gauto_series"]["acceptance"] == \
      records[1]["cells"]["self/gauto_series"]["acceptance"]
  with pytest.raises(ValueError, match="repeats"):
    _sweep(Stages(str(tmp_path / "other")), prompts, lengths, repeats=0)


def test_the_speedup_at_ar_lengths():
  ar = {"seconds": 10.0, "tokens": 100}
  # 5 calls, 0.2 s prefill each; the cell's decode is 0.1 s a token (5 s / 50).
  assert matched_speedup(ar, {"seconds": 6.0, "tokens": 50}, 5, 0.2) == pytest.approx(10 / 11)
  # Where both emit as many tokens it is the per-token speedup.
  assert matched_speedup(ar, {"seconds": 8.0, "tokens": 100}, 5, 0.2) == pytest.approx(1.25)


def test_call_order_rotates_through_every_position():
  from experiments.programs.speed import call_order
  assert call_order(3, 0) == [-1, 0, 1, 2]
  assert call_order(3, 1) == [0, 1, 2, -1]
  assert call_order(3, 6) == [1, 2, -1, 0]
  # Over cells + 1 consecutive batches each call takes every position once.
  orders = [call_order(4, b) for b in range(7, 12)]
  for pos in range(5):
    assert sorted(o[pos] for o in orders) == [-1, 0, 1, 2, 3]


def test_a_sweep_times_its_calls_in_rotated_order(tmp_path, fixed_costs, monkeypatch):
  calls = []
  generate, speculative = specjax.generate, specjax.speculative_generate

  def logged_generate(*a, **kw):
    calls.append("ar")
    return generate(*a, **kw)

  def logged_speculative(*a, **kw):
    calls.append(str(kw["gamma"]) + ("+" if kw.get("acceptance") is not None else ""))
    return speculative(*a, **kw)

  monkeypatch.setattr(specjax, "generate", logged_generate)
  monkeypatch.setattr(specjax, "speculative_generate", logged_speculative)
  prompts, lengths = ragged_prompts(batch=4, seed=3)
  records = _sweep(Stages(str(tmp_path / "stages")), prompts, lengths)
  timed = calls[-16:]   # after the compiling calls: 4 batches of AR and 3 cells
  assert timed == ["ar", "1", "auto", "auto+",
                   "1", "auto", "auto+", "ar",
                   "auto", "auto+", "ar", "1",
                   "auto+", "ar", "1", "auto"], timed
  # Each record still lists its batches in prompt order, whatever the call order.
  assert [len(r["ar"]["seconds"]) for r in records] == [2, 2]
  assert all(r["cells"]["self/gauto"]["identical"] == [True, True] for r in records)


def test_auto_cells_share_one_calibration_per_pair(tmp_path, monkeypatch):
  """`calibrate_drafts` measures one table per draft (a rerun reads it back), and sweeps over
  two settings hand it to every auto cell: no cell calibrates on its own."""
  from experiments.programs import speed
  calls, given = [], []

  def calibrate(target, target_params, drafter, draft_params, adaptive, **kw):
    calls.append(kw)
    return calibration.GammaCosts(adaptive.gammas, UNDERVALUED, measured=True,
                                  calibration_seconds=7.0)

  def resolve(*a, gamma_costs=None, **kw):
    given.append(gamma_costs)
    assert gamma_costs is not None, "an auto cell resolved its own table"
    return calibration.GammaCosts(a[4].gammas, tuple(gamma_costs))

  def no_calibration(*a, **kw):
    raise AssertionError("the library calibrated")
  monkeypatch.setattr(speed, "calibrate_gamma_costs", calibrate)
  monkeypatch.setattr(specjax.api, "resolve_gamma_costs", resolve)
  monkeypatch.setattr(calibration, "calibrate_gamma_costs", no_calibration)
  lm, params = target()
  stages = Stages(str(tmp_path / "stages"))
  kw = dict(prompt_len=10, cache_len=32, sampling=GREEDY, stages=stages,
            fingerprints={"target": "t", "self": "t"})
  tables = speed.calibrate_drafts(lm, params, {"self": (lm, params)}, **kw)
  assert len(calls) == 1 and calls[0]["store"] is False and calls[0]["cache_len"] == 32
  assert tables["self"]["seconds"] == list(UNDERVALUED) and not tables["self"]["reused"]
  assert tables["self"]["calibration_seconds"] == 7.0
  again = speed.calibrate_drafts(lm, params, {"self": (lm, params)}, **kw)
  assert len(calls) == 1 and again["self"]["reused"] and again["self"]["seconds"] == \
      tables["self"]["seconds"]
  prompts, lengths = ragged_prompts(batch=4, seed=3)
  costs = {"self": tables["self"]["seconds"]}
  for prefix in ("t0", "t1"):
    records = sweep(lm, params, {"self": (lm, params)}, np.asarray(prompts),
                    np.asarray(lengths), gammas=[1, "auto", "auto_series"], sampling=GREEDY,
                    max_new_tokens=10, eos_id=EOS, stages=stages, prefix=prefix,
                    fingerprints={"target": "t", "self": "t"}, chunk=2, gamma_costs=costs)
  assert len(calls) == 1 and given and all(g == pytest.approx(UNDERVALUED) for g in given)
  # The table is part of the auto cells' keys: their stages name it.
  import json
  entry = json.loads(open(stages.path("t1/chunk0/self/gauto")).read())
  assert entry["deps"]["gamma_costs"] == list(UNDERVALUED)
  assert "gamma_costs" not in json.loads(open(stages.path("t1/chunk0/self/g1")).read())["deps"]
  assert summarize(records)["self/gauto"]["identical_fraction"] == 1.0
