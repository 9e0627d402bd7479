"""The strategy picker (`specjax.planning.picker`, its JSON readers and CLI) on hand-made
measurements with known answers."""

import json
import os

import numpy as np
import pytest
from absl import flags

from specjax import theory
from specjax.cli.pick import main
from specjax.planning.picker import (FamilyMeasurement, VerifyCost, draft_memory_bytes, pick,
                                     predict_speedup)
from specjax.planning.picker_io import measurements_from_json, verify_cost_from_json

DRAFTERS_JSON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "benchmarks", "results", "drafters.json")
MB = 2**20
GB = 2**30


def _pick(ms, vc, **kw):
  args = dict(batch_size=1, memory_budget_bytes=None, context_tokens=128, max_new_tokens=256)
  args.update(kw)
  return pick(ms, vc, **args)


def chain(name, alpha, c, gamma=4, **kw):
  return FamilyMeasurement(family=name, cost_ratio=c, alpha=alpha, gamma=gamma, **kw)


# -----------------------------------------------------------------------------
# VerifyCost.
# -----------------------------------------------------------------------------


def test_verify_cost_interpolates_and_refuses_outside_the_measured_range():
  vc = VerifyCost({1: 1.0, 5: 2.0, 9: 2.4})
  assert vc(1) == 1.0 and vc(3) == pytest.approx(1.5) and vc(7) == pytest.approx(2.2)
  assert vc.covers(9) and not vc.covers(10)
  with pytest.raises(ValueError, match="outside the measured verify-cost range.*extrapolate"):
    vc(10)
  ex = VerifyCost({1: 1.0, 5: 2.0, 9: 2.4}, extrapolate=True)
  assert ex(13) == pytest.approx(2.8)  # the last segment's slope, 0.1 per token
  assert VerifyCost({5: 2.0}).points == {1: 1.0, 5: 2.0}  # V(1) = 1 added
  flat = VerifyCost.flat()
  assert flat(1) == flat(2) == flat(1000) == 1.0


def test_verify_cost_reads_a_non_decreasing_fit_of_noisy_points():
  # drafters.json, code, batch 1, T = 0: V(4) = 1.327 > V(5) = 1.273 (noise).
  vc = VerifyCost({1: 1.0, 4: 1.3265659352750088, 5: 1.272858813572746, 8: 1.4174591066002076})
  assert vc(4) == vc(5) == pytest.approx((1.3265659352750088 + 1.272858813572746) / 2)
  assert vc.points[4] == 1.3265659352750088  # the measured values are kept
  ratios = [vc(t) for t in range(1, 9)]
  assert ratios == sorted(ratios)
  low = VerifyCost({1: 1.0, 4: 0.79, 5: 1.58})  # batch 8, T = 1: a call "cheaper" than a step
  assert low(4) == 1.0 and low(5) == pytest.approx(1.58)
  raw = VerifyCost({1: 1.0, 4: 0.79}, monotone=False)
  assert raw(4) == pytest.approx(0.79)
  # Extrapolation never falls below the last measured ratio.
  falling = VerifyCost({1: 1.0, 4: 2.0, 8: 1.5}, extrapolate=True, monotone=False)
  assert falling(20) == pytest.approx(1.5)


@pytest.mark.parametrize("points, error, match", [
    ({1: 2.0, 5: 3.0}, ValueError, r"points\[1\] must be 1"),
    ({0: 1.0}, ValueError, "T .tokens per call. must be an int >= 1, got 0"),
    ({2: -1.0}, ValueError, r"points\[2\].*> 0, got -1.0"),
    ({}, TypeError, "non-empty mapping"),
    ({2.5: 1.0}, TypeError, "must be an int >= 1, got 2.5"),
])
def test_verify_cost_rejects_bad_points(points, error, match):
  with pytest.raises(error, match=match):
    VerifyCost(points)


# -----------------------------------------------------------------------------
# FamilyMeasurement validation.
# -----------------------------------------------------------------------------


@pytest.mark.parametrize("kw, error, match", [
    (dict(alpha=1.5, gamma=4), ValueError, r"alpha of 'x'.*\[0, 1\], got 1.5"),
    (dict(alpha=0.5, gamma=4, tree_nodes=8), ValueError, "exactly one of gamma and tree_nodes"),
    (dict(alpha=0.5), ValueError, "exactly one of gamma and tree_nodes"),
    (dict(gamma=4), ValueError, "needs alpha or tau"),
    (dict(alpha=0.5, tree_nodes=8, cost_per="iteration"), ValueError, "no tau"),
    (dict(tau=2.0, tree_nodes=8), ValueError, "cost_per of 'x' must be 'iteration'"),
    (dict(tau=6.0, gamma=4), ValueError, r"tau of 'x'.*\[1, gamma \+ 1 = 5\].*got 6.0"),
    (dict(tau=2.0, gamma=4, cost_per="step"), ValueError, "cost_per of 'x' must be one of"),
    (dict(tau=2.0, gamma=True), TypeError, "gamma of 'x' must be an int"),
    (dict(tau=2.0, gamma=4, draft_params_bytes=-1), ValueError, "draft_params_bytes"),
])
def test_family_measurement_rejects_bad_fields(kw, error, match):
  with pytest.raises(error, match=match):
    FamilyMeasurement(family="x", cost_ratio=0.1, **kw)


def test_family_measurement_rejects_negative_cost_ratio():
  with pytest.raises(ValueError, match=r"cost_ratio of 'x'.*got -0.1"):
    FamilyMeasurement(family="x", cost_ratio=-0.1, alpha=0.5, gamma=4)


# -----------------------------------------------------------------------------
# predict_speedup.
# -----------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.8, 0.9, 0.95])
@pytest.mark.parametrize("c", [0.01, 0.05, 0.2, 0.5])
def test_gamma_is_theorys_optimal_gamma_when_verification_is_free(alpha, c):
  p = predict_speedup(chain("d", alpha, c), VerifyCost.flat())
  want = theory.optimal_gamma(alpha, c)
  assert p.gamma == want and p.searched
  assert p.speedup == pytest.approx(theory.walltime_improvement(alpha, want, c), rel=1e-12)
  assert p.tau == pytest.approx(theory.expected_tokens_per_call(alpha, want), rel=1e-12)
  rec = _pick([chain("d", alpha, c)], VerifyCost.flat(), min_speedup=1e-9)
  assert rec.family == "d" and rec.gamma == want


def test_measured_tau_calibrates_alpha_and_is_used_at_the_measured_gamma():
  # α = 0.8 alone predicts τ(4) = 3.36; the run measured 2.6 (correlated acceptances).
  m = chain("d", 0.8, 0.05, tau=2.6)
  a_fit = theory.alpha_for_tokens(2.6, 4)
  p = predict_speedup(m, VerifyCost.flat())
  assert p.alpha_used == pytest.approx(a_fit)
  assert p.gamma == theory.optimal_gamma(a_fit, 0.05)
  assert p.per_gamma[4] == pytest.approx(2.6 / (4 * 0.05 + 1))
  raw = predict_speedup(m, VerifyCost.flat(), calibrate_alpha=False)
  assert raw.alpha_used == 0.8 and raw.gamma == theory.optimal_gamma(0.8, 0.05)
  assert raw.speedup > p.speedup


def test_a_verify_cost_that_grows_with_tokens_shortens_gamma():
  alpha, c = 0.9, 0.01
  vc = VerifyCost({1: 1.0, 65: 1.0 + 0.1 * 64})  # +0.1 step per extra token
  p = predict_speedup(chain("d", alpha, c), vc)
  gammas = np.arange(1, 33)
  want = gammas[np.argmax(theory.expected_tokens_per_call(alpha, gammas)
                          / (gammas * c + 1.0 + 0.1 * gammas))]
  assert p.gamma == want < theory.optimal_gamma(alpha, c)
  assert p.verify_cost == pytest.approx(1.0 + 0.1 * want)


def test_gamma_search_stays_inside_the_measured_verify_range():
  vc = VerifyCost({1: 1.0, 3: 1.05, 5: 1.1})  # calls up to 5 tokens measured
  p = predict_speedup(chain("d", 0.95, 0.01), vc)
  assert sorted(p.per_gamma) == [1, 2, 3, 4] and p.gamma == 4
  assert predict_speedup(chain("d", 0.95, 0.01), VerifyCost({1: 1.0, 5: 1.1},
                                                            extrapolate=True)).gamma > 4


def test_measured_only_family_uses_its_tau_and_call():
  tree = FamilyMeasurement(family="tree", cost_ratio=0.3, tau=3.2, tree_nodes=16,
                           cost_per="iteration")
  vc = VerifyCost({1: 1.0, 16: 1.4})
  p = predict_speedup(tree, vc)
  assert p.speedup == pytest.approx(3.2 / (0.3 + 1.4)) and p.tree_nodes == 16
  assert p.gamma is None and not p.searched
  own = predict_speedup(FamilyMeasurement(family="tree", cost_ratio=0.3, tau=3.2,
                                          tree_nodes=16, cost_per="iteration", call_cost=2.0),
                        vc)
  assert own.speedup == pytest.approx(3.2 / 2.3)  # its own measured call cost wins
  with pytest.raises(ValueError, match="does not cover 'tree'.*T=16"):
    predict_speedup(tree, VerifyCost({1: 1.0, 8: 1.2}))


# -----------------------------------------------------------------------------
# pick.
# -----------------------------------------------------------------------------


def test_a_high_alpha_cheap_draft_wins():
  ms = [chain("expensive", 0.9, 0.6), chain("poor", 0.3, 0.02), chain("cheap", 0.85, 0.05)]
  vc = VerifyCost({1: 1.0, 9: 1.1, 33: 1.5})
  rec = _pick(ms, vc)
  assert rec.speculate and rec.family == "cheap"
  assert [p.family for p in rec.table] == ["cheap", "poor", "expensive"]
  best = predict_speedup(ms[2], vc)
  assert rec.speedup == best.speedup and rec.gamma == best.gamma
  assert rec.numbers["cost_ratio"] == 0.05 and rec.numbers["alpha"] == 0.85
  assert "cheap" in rec.reason and "runner-up poor" in rec.reason
  speedups = [p.speedup for p in rec.table]
  assert speedups == sorted(speedups, reverse=True)


def test_a_family_over_the_memory_budget_is_excluded_though_fastest():
  big = chain("big", 0.9, 0.05, draft_params_bytes=2 * GB, draft_cache_bytes_per_token=0)
  small = chain("small", 0.7, 0.05, draft_params_bytes=100 * MB,
                draft_cache_bytes_per_token=1000)
  vc = VerifyCost.flat()
  kw = dict(batch_size=4, context_tokens=1000, max_new_tokens=200)
  assert _pick([big, small], vc, **kw).family == "big"  # no budget: the fastest
  rec = _pick([big, small], vc, memory_budget_bytes=1 * GB, **kw)
  assert rec.family == "small"
  assert rec.numbers["excluded_by_memory"] == ["big"]
  assert rec.numbers["memory_bytes"] == 100 * MB + 1000 * 1200 * 4
  assert [(p.family, p.fits) for p in rec.table] == [("small", True), ("big", False)]
  assert "excluded by memory: big" in rec.reason
  # The cache term scales with batch × positions: 1000 B × 1200 × 1024 > 1 GiB.
  rec = _pick([small], vc, memory_budget_bytes=1 * GB, **dict(kw, batch_size=1024))
  assert not rec.speculate and "no family fits the memory budget" in rec.reason
  assert draft_memory_bytes(small, batch_size=1024, tokens=1200) > 1 * GB


def test_unknown_memory_is_kept_unless_required():
  m = chain("d", 0.9, 0.05)
  rec = _pick([m], VerifyCost.flat(), memory_budget_bytes=MB)
  assert rec.family == "d" and rec.table[0].fits is None and rec.table[0].memory_bytes is None
  rec = _pick([m], VerifyCost.flat(), memory_budget_bytes=MB, require_known_memory=True)
  assert not rec.speculate and "memory budget" in rec.reason


def test_verify_cost_steep_at_large_batch_means_dont_speculate():
  ms = [chain("draft", 0.8, 0.05)]
  small_batch = VerifyCost({1: 1.0, 2: 1.02, 9: 1.1, 33: 1.3})
  # Large batch: the call is compute bound, ~linear in T.
  large_batch = VerifyCost({1: 1.0, 2: 1.9, 5: 4.5, 9: 8.0, 33: 30.0}, batch=64)
  assert _pick(ms, small_batch).family == "draft"
  rec = _pick(ms, large_batch, batch_size=64)
  assert not rec.speculate and rec.family is None and rec.speedup == 1.0
  assert "verification is not free at batch 64" in rec.reason
  assert rec.numbers["best_speedup"] < 1.05 <= rec.numbers["free_verification_best_speedup"]
  assert rec.table[0].family == "draft"  # the table is still there


def test_dont_speculate_when_no_family_pays():
  ms = [chain("weak", 0.2, 0.3), chain("weaker", 0.1, 0.3)]
  rec = _pick(ms, VerifyCost.flat())
  best = predict_speedup(ms[0], VerifyCost.flat()).speedup
  assert best < 1.05 and not rec.speculate
  assert rec.reason == (f"no family is predicted to reach 1.05x: the best, weak "
                        f"(γ={rec.table[0].gamma}), reaches {best:.2f}x")
  assert rec.numbers["best_family"] == "weak"
  # A lower bar lets it through.
  assert _pick(ms, VerifyCost.flat(), min_speedup=best * 0.99).family == "weak"


def test_short_outputs_mean_dont_speculate():
  ms = [chain("draft", 0.9, 0.05)]
  rec = _pick(ms, VerifyCost.flat(), max_new_tokens=20)
  assert not rec.speculate and "20 tokens are shorter than 50" in rec.reason
  assert rec.table[0].speedup > 2  # it would pay per token; the overhead does not
  assert _pick(ms, VerifyCost.flat(), max_new_tokens=50).family == "draft"
  assert _pick(ms, VerifyCost.flat(), max_new_tokens=20, min_new_tokens=10).family == "draft"


def test_tree_against_chain_on_measured_tau():
  tree = FamilyMeasurement(family="tree", cost_ratio=0.3, tau=3.2, tree_nodes=16,
                           cost_per="iteration")
  lookup = FamilyMeasurement(family="lookup", cost_ratio=0.05, tau=2.2, gamma=4)
  cheap_big_calls = VerifyCost({1: 1.0, 5: 1.1, 16: 1.4})
  rec = _pick([lookup, tree], cheap_big_calls)
  assert rec.family == "tree" and rec.tree_nodes == 16 and rec.gamma is None
  assert rec.speedup == pytest.approx(3.2 / 1.7)
  assert rec.table[1].speedup == pytest.approx(2.2 / (4 * 0.05 + 1.1))
  costly_big_calls = VerifyCost({1: 1.0, 5: 1.2, 16: 3.0})
  rec = _pick([lookup, tree], costly_big_calls)
  assert rec.family == "lookup" and rec.gamma == 4  # τ-only chain: γ not searched
  assert rec.speedup == pytest.approx(2.2 / 1.4)


def test_pick_checks_batch_temperature_and_names():
  m = chain("d", 0.8, 0.05, batch=8, temperature=1.0)
  with pytest.raises(ValueError, match="'d' was measured at batch 8, but batch_size is 1"):
    _pick([m], VerifyCost.flat())
  with pytest.raises(ValueError, match="measured at temperature 1.0, but temperature is 0.0"):
    _pick([m], VerifyCost.flat(), batch_size=8, temperature=0.0)
  with pytest.raises(ValueError, match="verify_cost was measured at batch 2"):
    _pick([chain("d", 0.8, 0.05)], VerifyCost.flat(batch=2))
  with pytest.raises(ValueError, match="family 'd' twice"):
    _pick([chain("d", 0.8, 0.05), chain("d", 0.7, 0.05)], VerifyCost.flat())
  with pytest.raises(TypeError, match="measurements must be a sequence"):
    _pick(chain("d", 0.8, 0.05), VerifyCost.flat())
  with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1, got 0"):
    _pick([chain("d", 0.8, 0.05)], VerifyCost.flat(), max_new_tokens=0)
  with pytest.raises(TypeError, match="verify_cost must be a VerifyCost"):
    _pick([chain("d", 0.8, 0.05)], {1: 1.0})


# -----------------------------------------------------------------------------
# The measured results JSON and the command line.
# -----------------------------------------------------------------------------


def _cell_rows(task, batch, temperature):
  with open(DRAFTERS_JSON, encoding="utf-8") as f:
    cells = json.load(f)["tasks"][task]
  (cell,) = [c for c in cells if c["batch"] == batch and c["temperature"] == temperature]
  return {r["drafter"]: r for r in cell["rows"] if r["drafter"] != "autoregressive"}


def test_real_drafters_json_batch1_greedy_code_agrees_with_the_measurements():
  rows = _cell_rows("code", 1, 0.0)
  ms = measurements_from_json(DRAFTERS_JSON, "code", 1, 0.0)
  assert {m.family for m in ms} == set(rows)
  by = {m.family: m for m in ms}
  assert by["classic draft"].gamma == 4 and by["classic draft"].alpha == 0.671875
  assert by["Medusa tree 16"].tree_nodes == 16 and by["prompt lookup"].tree_nodes == 9
  vc = verify_cost_from_json(DRAFTERS_JSON, "code", 1, 0.0)
  rec = pick(ms, vc, batch_size=1, memory_budget_bytes=None, context_tokens=128,
             max_new_tokens=64, temperature=0.0)
  # Derived per-iteration costs reproduce every measured speedup ...
  for p in rec.table:
    assert p.speedup == pytest.approx(rows[p.family]["speedup"], rel=1e-9), p.family
  # ... so the pick is the measured best: the classic draft at γ = 4, 1.31x.
  measured_best = max(rows, key=lambda n: rows[n]["speedup"])
  assert measured_best == "classic draft"
  assert rec.family == measured_best and rec.gamma == 4
  assert rec.speedup == pytest.approx(1.3056770202846806)
  assert rec.table[1].family == "prompt lookup"


def test_real_drafters_json_batch8_says_dont_speculate():
  rows = _cell_rows("code", 8, 0.0)
  assert max(r["speedup"] for r in rows.values()) < 1.0  # nothing paid at batch 8
  ms = measurements_from_json(DRAFTERS_JSON, "code", 8, 0.0)
  rec = pick(ms, verify_cost_from_json(DRAFTERS_JSON, "code", 8, 0.0), batch_size=8,
             memory_budget_bytes=None, context_tokens=128, max_new_tokens=64)
  assert not rec.speculate and rec.numbers["best_family"] == "classic draft"
  assert rec.numbers["best_speedup"] == pytest.approx(rows["classic draft"]["speedup"])


def test_real_drafters_json_with_gamma_search_keeps_the_measured_point():
  ms = measurements_from_json(DRAFTERS_JSON, "code", 1, 0.0, derived_cost_per="token")
  by = {m.family: m for m in ms}
  assert by["classic draft"].cost_per == "token" and by["prompt lookup"].cost_per == "iteration"
  vc = verify_cost_from_json(DRAFTERS_JSON, "code", 1, 0.0)
  p = predict_speedup(by["classic draft"], vc)
  assert p.searched and p.per_gamma[4] == pytest.approx(1.3056770202846806, rel=1e-9)
  assert p.speedup >= p.per_gamma[4]
  rec = pick(ms, vc, batch_size=1, memory_budget_bytes=None, context_tokens=128,
             max_new_tokens=64)
  assert rec.family == "classic draft"


def test_measurements_from_json_reads_families_fields_and_reports_bad_cells():
  results = {"tasks": {"t": [{"batch": 2, "temperature": 0.5, "rows": [
      {"drafter": "autoregressive", "tokens_per_call": 1.0, "call_tokens": 1,
       "call_cost": 1.0, "speedup": 1.0},
      {"drafter": "eagle", "tokens_per_call": 3.0, "alpha": 0.8, "gamma": 5, "call_tokens": 6,
       "call_cost": 1.2, "cost_ratio": 0.04, "draft_params_bytes": 1000,
       "draft_cache_bytes_per_token": 10, "speedup": 2.0},
      {"drafter": "tree", "tokens_per_call": 2.5, "tree_nodes": 12, "call_tokens": 12,
       "call_cost": 1.5, "cost_ratio": 0.2, "speedup": 1.4}]}]}}
  eagle, tree = measurements_from_json(results, "t", 2, 0.5)
  assert (eagle.gamma, eagle.cost_ratio, eagle.cost_per, eagle.draft_params_bytes,
          eagle.draft_cache_bytes_per_token, eagle.batch, eagle.temperature) == (
              5, 0.04, "token", 1000, 10, 2, 0.5)
  assert (tree.tree_nodes, tree.cost_ratio, tree.cost_per) == (12, 0.2, "iteration")
  vc = verify_cost_from_json(results, "t", 2, 0.5)
  assert vc.points == {1: 1.0, 6: 1.2, 12: 1.5} and vc.batch == 2
  with pytest.raises(ValueError, match=r"task must be one of \['t'\], got 'x'"):
    measurements_from_json(results, "x", 2, 0.5)
  with pytest.raises(ValueError, match=r"no cell at batch 1, temperature 0.5.*\[\(2, 0.5\)\]"):
    measurements_from_json(results, "t", 1, 0.5)


def test_cli_prints_the_recommendation_and_the_table(capsys):
  rc = main([f"--results={DRAFTERS_JSON}", "--task=code", "--batch=1", "--temperature=0",
             "--memory_budget_mb=512", "--context=128", "--max_new=64"])
  out = capsys.readouterr().out
  assert rc == 0
  assert out.startswith("recommend: classic draft (γ=4), predicted speedup 1.31x")
  assert "prompt lookup" in out and "Medusa tree 64" in out and "numbers: {" in out
  main([f"--results={DRAFTERS_JSON}", "--task=code", "--batch=1", "--temperature=0",
        "--max_new=20"])
  assert "don't speculate" in capsys.readouterr().out


def test_cli_flags_are_parsed_by_absl_per_call():
  with pytest.raises(flags.IllegalFlagValueError, match="--results"):
    main(["--task=code"])  # --results and --task are required
  with pytest.raises(flags.UnrecognizedFlagError, match="gama"):
    main([f"--results={DRAFTERS_JSON}", "--task=code", "--gama=4"])
  assert "results" not in flags.FLAGS  # defined on a FlagValues of the call's own
