"""Tests for specjax.theory against values computed by hand in the comments."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specjax import theory

alphas = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
gammas = st.integers(min_value=0, max_value=64)
costs = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


def _power_sum(alpha, gamma):
  """1 + α + … + α^γ, written independently of the closed form."""
  return sum(alpha**k for k in range(gamma + 1))


def _brute_force_optimum(alpha, c, max_gamma):
  """First γ in 1..max_gamma with the largest Σ α^k / (γc + 1)."""
  best_gamma, best_value = None, -math.inf
  for gamma in range(1, max_gamma + 1):
    value = _power_sum(alpha, gamma) / (gamma * c + 1)
    if value > best_value * (1 + 1e-12):
      best_gamma, best_value = gamma, value
  return best_gamma, best_value


# -----------------------------------------------------------------------------
# acceptance_rate
# -----------------------------------------------------------------------------


def test_acceptance_rate_hand_vectors():
  # min(.5,.2) + min(.5,.3) + min(0,.5) = .2 + .3 + 0 = .5
  # (= 1 − ½(|.3| + |.2| + |.5|) = 1 − .5).
  beta = theory.acceptance_rate([0.5, 0.5, 0.0], [0.2, 0.3, 0.5])
  assert isinstance(beta, float)
  assert beta == pytest.approx(0.5, abs=1e-12)


def test_acceptance_rate_identical_and_disjoint():
  assert theory.acceptance_rate([0.1, 0.9], [0.1, 0.9]) == pytest.approx(1.0)
  assert theory.acceptance_rate([1.0, 0.0], [0.0, 1.0]) == 0.0


def test_acceptance_rate_batched_and_axis():
  p = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
  q = np.array([[0.2, 0.3, 0.5], [0.2, 0.3, 0.5]])
  # Row 0: .5 (above); row 1: identical rows → 1.
  np.testing.assert_allclose(theory.acceptance_rate(p, q), [0.5, 1.0])
  np.testing.assert_allclose(theory.acceptance_rate(p.T, q.T, axis=0),
                             [0.5, 1.0])
  # A [2, 2, 3] batch: the same two rows twice.
  out = theory.acceptance_rate(np.stack([p, p]), np.stack([q, q]))
  assert out.shape == (2, 2)
  np.testing.assert_allclose(out, [[0.5, 1.0], [0.5, 1.0]])


def test_acceptance_rate_tolerance():
  # Sums 1 + 5e-6 are inside the 1e-5 tolerance; β clipped to <= 1.
  p = [0.5, 0.500005]
  assert theory.acceptance_rate(p, p) == 1.0
  with pytest.raises(ValueError, match=r"p must sum to 1 along axis -1"):
    theory.acceptance_rate([0.5, 0.5001], [0.5, 0.5])


@pytest.mark.parametrize(
    "p, q, axis, error, pattern",
    [
        ([0.5, 0.5], [0.2, 0.3, 0.5], -1, ValueError,
         r"p and q must have the same shape, got p.shape=\(2,\) and "
         r"q.shape=\(3,\)"),
        ([1.2, -0.2], [0.5, 0.5], -1, ValueError,
         r"p must be non-negative .*got -0.2 at index \(1,\)"),
        ([0.5, 0.5], [0.5, 0.4], -1, ValueError,
         r"q must sum to 1 along axis -1 .*got sum 0.9"),
        (0.5, 0.5, -1, ValueError, r"at least 1-D"),
        ([0.5, 0.5], [0.5, 0.5], 1, ValueError,
         r"axis must be in \[-1, 0\] .*got 1"),
        ([0.5, 0.5], [0.5, 0.5], 0.0, TypeError, r"axis must be an int"),
        (["a", "b"], [0.5, 0.5], -1, TypeError, r"p must be a real number"),
        ([0.5, np.nan], [0.5, 0.5], -1, ValueError, r"p must be finite"),
        ([0.5, 0.5], [[0.5, 0.5], [0.5]], -1, ValueError,
         r"q must be a real number or a rectangular array-like"),
    ],
)
def test_acceptance_rate_errors(p, q, axis, error, pattern):
  with pytest.raises(error, match=pattern):
    theory.acceptance_rate(p, q, axis=axis)


# -----------------------------------------------------------------------------
# expected_tokens_per_call
# -----------------------------------------------------------------------------


def test_tokens_hand_values():
  # α=.8, γ=3: .8^4 = .4096 → (1 − .4096)/.2 = .5904/.2 = 2.952.
  assert theory.expected_tokens_per_call(0.8, 3) == pytest.approx(2.952,
                                                                 rel=1e-14)
  # α=.5, γ=1: (1 − .25)/.5 = 1.5; γ=2: (1 − .125)/.5 = 1.75.
  assert theory.expected_tokens_per_call(0.5, 1) == pytest.approx(1.5)
  assert theory.expected_tokens_per_call(0.5, 2) == pytest.approx(1.75)
  # Leviathan Table 2, EN-DE small, T=0: α=.75, γ=7. .75^2 = .5625,
  # .75^4 = .31640625, .75^8 = .1001129150390625; 1 − that = .8998870849609375,
  # / .25 = 3.59954833984375 (≈ 3.6×, the c = 0 ceiling of the 3.4× row).
  assert theory.expected_tokens_per_call(0.75, 7) == pytest.approx(
      3.59954833984375, rel=1e-14)


def test_tokens_limits():
  # α = 1: γ + 1 exactly; α = 0: 1; γ = 0: 1 for every α.
  assert theory.expected_tokens_per_call(1.0, 5) == 6.0
  assert theory.expected_tokens_per_call(1, 0) == 1.0
  assert theory.expected_tokens_per_call(0.0, 5) == 1.0
  for alpha in (0.0, 0.3, 0.999, 1.0):
    assert theory.expected_tokens_per_call(alpha, 0) == 1.0
  # Just below 1 there is no cancellation: 1 + α + … + α^5 with α = 1 − 1e-12
  # is 6 − 15e-12 to first order.
  value = theory.expected_tokens_per_call(1 - 1e-12, 5)
  assert value == pytest.approx(6 - 15e-12, abs=1e-13)


def test_tokens_broadcasting_and_types():
  out = theory.expected_tokens_per_call([0.0, 0.5, 1.0], 2)
  assert isinstance(out, np.ndarray)
  # 1; 1 + .5 + .25 = 1.75; 3.
  np.testing.assert_allclose(out, [1.0, 1.75, 3.0])
  grid = theory.expected_tokens_per_call(np.array([[0.5], [1.0]]), [0, 1, 2])
  np.testing.assert_allclose(grid, [[1.0, 1.5, 1.75], [1.0, 2.0, 3.0]])
  assert isinstance(theory.expected_tokens_per_call(0.5, np.int32(2)), float)
  with pytest.raises(ValueError, match=r"alpha shape \(2,\), gamma shape "
                     r"\(3,\)"):
    theory.expected_tokens_per_call([0.5, 0.6], [1, 2, 3])


@settings(max_examples=200, deadline=None)
@given(alpha=alphas, gamma=gammas)
def test_tokens_in_range_and_matches_power_sum(alpha, gamma):
  value = theory.expected_tokens_per_call(alpha, gamma)
  assert 1.0 <= value <= gamma + 1
  assert value == pytest.approx(_power_sum(alpha, gamma), rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(a=alphas, b=alphas, gamma=gammas)
def test_tokens_increasing_in_alpha(a, b, gamma):
  lo, hi = min(a, b), max(a, b)
  assert (theory.expected_tokens_per_call(lo, gamma)
          <= theory.expected_tokens_per_call(hi, gamma) * (1 + 1e-13))


# -----------------------------------------------------------------------------
# alpha_for_tokens
# -----------------------------------------------------------------------------


def test_alpha_for_tokens_hand_values():
  # γ = 1: tokens = 1 + α. γ = 2: 1 + α + α² = 1.95 → α = (−1 + √4.8) / 2 = 0.595445…
  assert theory.alpha_for_tokens(1.64, 1) == pytest.approx(0.64, abs=1e-14)
  assert theory.alpha_for_tokens(1.95, 2) == pytest.approx((math.sqrt(4.8) - 1) / 2, abs=1e-14)
  # Ends: one token per call is α = 0, γ + 1 tokens is α = 1 (exactly).
  assert theory.alpha_for_tokens(1.0, 5) == 0.0 and theory.alpha_for_tokens(6.0, 5) == 1.0
  out = theory.alpha_for_tokens([1.5, 2.5], [1, 3])
  assert isinstance(out, np.ndarray) and out.shape == (2,)


@settings(max_examples=200, deadline=None)
@given(alpha=alphas, gamma=st.integers(min_value=1, max_value=64))
def test_alpha_for_tokens_inverts_expected_tokens(alpha, gamma):
  tokens = min(_power_sum(alpha, gamma), gamma + 1.0)  # (the sum can round past γ + 1)
  assert theory.alpha_for_tokens(tokens, gamma) == pytest.approx(alpha, abs=1e-9)


def test_alpha_for_tokens_recovers_alpha_where_accepted_over_drafted_does_not():
  """Simulated i.i.d. acceptances (α = 0.7, γ = 4): the mean tokens per call
  inverted gives α back; accepted / drafted is far lower (the drafts after
  a rejection are never checked) — the reason the benchmarks gate on E[β]."""
  rng = np.random.default_rng(0)
  alpha, gamma, iters = 0.7, 4, 200_000
  ok = rng.random((iters, gamma)) < alpha
  accepted = np.where(ok.all(1), gamma, np.argmin(ok, axis=1))
  assert theory.alpha_for_tokens(np.mean(accepted + 1), gamma) == pytest.approx(alpha, abs=0.005)
  assert np.sum(accepted) / (iters * gamma) < alpha - 0.15


@pytest.mark.parametrize(
    "tokens, gamma, error, pattern",
    [
        (0.5, 3, ValueError, r"tokens_per_call must lie in \[1, gamma \+ 1\] .*got 0.5"),
        (4.5, 3, ValueError, r"tokens_per_call must lie in \[1, gamma \+ 1\] .*got 4.5"),
        (1.0, 0, ValueError, r"gamma must be an integer >= 1, got 0"),
        ("2", 3, TypeError, r"tokens_per_call must be a real number"),
        (float("nan"), 3, ValueError, r"tokens_per_call must be finite"),
    ],
)
def test_alpha_for_tokens_errors(tokens, gamma, error, pattern):
  with pytest.raises(error, match=pattern):
    theory.alpha_for_tokens(tokens, gamma)


# -----------------------------------------------------------------------------
# walltime_improvement and walltime_improvement_from_tokens
# -----------------------------------------------------------------------------


def test_walltime_hand_values():
  # α=.8, γ=3, c=.05: 2.952 / (3·.05 + 1) = 2.952 / 1.15 = 2.5669565217391…
  assert theory.walltime_improvement(0.8, 3, 0.05) == pytest.approx(
      2.952 / 1.15, rel=1e-14)
  assert theory.walltime_improvement(0.8, 3, 0.05) == pytest.approx(
      2.566956521739130, rel=1e-14)
  # Leviathan Table 2, CNN/DM small, T=0: α=.65, γ=5, c=0. .65^2 = .4225,
  # .65^3 = .274625, .65^6 = .075418890625; (1 − .075418890625)/.35
  # = .924581109375/.35 = 2.6416603125 (the c = 0 bound that Leviathan's measured 3.1× exceeds).
  assert theory.walltime_improvement(0.65, 5, 0.0) == pytest.approx(
      2.6416603125, rel=1e-14)
  # α=1, γ=4, c=.25: 5 / (1 + 1) = 2.5.  α=0, γ=2, c=.5: 1/2.
  assert theory.walltime_improvement(1.0, 4, 0.25) == 2.5
  assert theory.walltime_improvement(0.0, 2, 0.5) == 0.5
  # γ = 0 is plain decoding: 1 whatever α and c.
  assert theory.walltime_improvement(0.7, 0, 3.0) == 1.0


@settings(max_examples=200, deadline=None)
@given(alpha=alphas, gamma=gammas, c=costs)
def test_walltime_bounded_by_gamma_plus_one(alpha, gamma, c):
  value = theory.walltime_improvement(alpha, gamma, c)
  assert 0.0 < value <= gamma + 1
  assert value == pytest.approx(_power_sum(alpha, gamma) / (gamma * c + 1),
                                rel=1e-12)


def test_walltime_from_tokens_hand_values():
  # The measured 2.952 tokens/call at γ=3, c=.05, free verify: 2.952/1.15.
  assert theory.walltime_improvement_from_tokens(2.952, 3, 0.05) == (
      pytest.approx(2.566956521739130, rel=1e-14))
  # 3 tokens/call, γ=5, c=.1, verify 1.2 steps: 3 / (.5 + 1.2) = 3/1.7
  # = 1.76470588235…
  assert theory.walltime_improvement_from_tokens(
      3.0, 5, 0.1, verify_cost=1.2) == pytest.approx(1.7647058823529411)
  # Correlated acceptance: 3.5 tokens/call at γ=5, c=.02 predicts
  # 3.5 / 1.1 = 3.1818…, above the 2.64 the i.i.d. model gives for α = .65.
  assert theory.walltime_improvement_from_tokens(3.5, 5, 0.02) == (
      pytest.approx(3.1818181818181817))
  out = theory.walltime_improvement_from_tokens([1.0, 4.0], 3, [0.0, 0.5])
  # 1/1 and 4/2.5 = 1.6.
  np.testing.assert_allclose(out, [1.0, 1.6])


@settings(max_examples=100, deadline=None)
@given(alpha=alphas, gamma=gammas, c=costs)
def test_walltime_from_tokens_agrees_with_model(alpha, gamma, c):
  tokens = theory.expected_tokens_per_call(alpha, gamma)
  assert theory.walltime_improvement_from_tokens(tokens, gamma, c) == (
      pytest.approx(theory.walltime_improvement(alpha, gamma, c), rel=1e-14))


def test_walltime_from_times_hand_values_and_errors():
  # 2.5 tokens per iteration, 10 ms a plain step, 20 ms an iteration: 2.5 · 10 / 20 = 1.25.
  assert theory.walltime_improvement_from_times(2.5, 0.010, 0.020) == pytest.approx(1.25)
  # The same ratio in target steps: 3 tokens, γ = 5, c = .1, verify 1.2 steps → 3 / 1.7.
  assert theory.walltime_improvement_from_times(3.0, 1.0, 5 * 0.1 + 1.2) == pytest.approx(
      theory.walltime_improvement_from_tokens(3.0, 5, 0.1, verify_cost=1.2), rel=1e-14)
  np.testing.assert_allclose(theory.walltime_improvement_from_times([1.0, 3.0], 2.0, [4.0, 1.0]),
                             [0.5, 6.0])
  with pytest.raises(ValueError, match="tokens_per_iteration"):
    theory.walltime_improvement_from_times(0.5, 1.0, 1.0)
  with pytest.raises(ValueError, match="step_s"):
    theory.walltime_improvement_from_times(2.0, 0.0, 1.0)
  with pytest.raises(ValueError, match="iteration_s"):
    theory.walltime_improvement_from_times(2.0, 1.0, -1.0)
  with pytest.raises(TypeError, match="tokens_per_iteration"):
    theory.walltime_improvement_from_times("2", 1.0, 1.0)


# -----------------------------------------------------------------------------
# optimal_gamma
# -----------------------------------------------------------------------------


def test_optimal_gamma_hand_case():
  # α=.8, c=.05; (1 − .8^{γ+1})/.2 / (1 + .05γ):
  #   γ=6: (1 − .2097152)/.2 = 3.951424 / 1.30 = 3.03955…
  #   γ=7: (1 − .16777216)/.2 = 4.1611392 / 1.35 = 3.08232…
  #   γ=8: (1 − .134217728)/.2 = 4.32891136 / 1.40 = 3.09207954…
  #   γ=9: (1 − .1073741824)/.2 = 4.463129088 / 1.45 = 3.07801…
  assert theory.optimal_gamma(0.8, 0.05) == 8
  gamma, value = theory.optimal_gamma_and_improvement(0.8, 0.05)
  assert gamma == 8 and isinstance(gamma, int)
  assert value == pytest.approx(4.32891136 / 1.4, rel=1e-13)
  # α=.5, c=.5: γ=1 gives 1.5/1.5 = 1, γ=2 gives 1.75/2 = .875 → 1.
  assert theory.optimal_gamma(0.5, 0.5) == 1


def test_optimal_gamma_ties_and_edges():
  # α=0, c=0: every γ gives exactly 1 → the smallest, 1.
  assert theory.optimal_gamma(0.0, 0.0) == 1
  # α=1, c=0: γ + 1 grows → max_gamma; improvement max_gamma + 1.
  assert theory.optimal_gamma_and_improvement(1.0, 0.0, max_gamma=10) == (
      10, 11.0)
  # Large c: γ=1 is the least bad.
  assert theory.optimal_gamma(0.3, 5.0) == 1


@pytest.mark.parametrize("alpha, c", [(0.6, 0.05), (0.75, 0.01), (0.9, 0.1),
                                      (0.53, 0.2), (0.95, 0.02), (0.3, 0.1)])
def test_optimal_gamma_matches_brute_force(alpha, c):
  best_gamma, best_value = _brute_force_optimum(alpha, c, 32)
  gamma, value = theory.optimal_gamma_and_improvement(alpha, c, max_gamma=32)
  assert gamma == best_gamma
  assert value == pytest.approx(best_value, rel=1e-12)


def test_optimal_gamma_batched():
  alpha = np.array([0.5, 0.8, 0.9])
  c = np.array([0.5, 0.05, 0.1])
  gamma = theory.optimal_gamma(alpha, c)
  assert gamma.dtype.kind == "i" and gamma.shape == (3,)
  assert list(gamma) == [_brute_force_optimum(a, cc, 32)[0]
                         for a, cc in zip(alpha, c)]


@settings(max_examples=100, deadline=None)
@given(alpha=alphas, c=costs, max_gamma=st.integers(1, 40))
def test_optimal_gamma_property(alpha, c, max_gamma):
  gamma, value = theory.optimal_gamma_and_improvement(alpha, c, max_gamma)
  assert 1 <= gamma <= max_gamma
  for other in range(1, max_gamma + 1):
    assert theory.walltime_improvement(alpha, other, c) <= value
  assert value >= theory.improvement_lower_bound(alpha, c) * (1 - 1e-14)


# -----------------------------------------------------------------------------
# operations_factor
# -----------------------------------------------------------------------------


def test_operations_factor_hand_values():
  # α=.8, γ=3, ĉ=.1: (3·.1 + 3 + 1) / 2.952 = 4.3 / 2.952 = 1.45663956…
  assert theory.operations_factor(0.8, 3, 0.1) == pytest.approx(
      4.3 / 2.952, rel=1e-14)
  assert theory.operations_factor(0.8, 3, 0.1) == pytest.approx(
      1.4566395663956639, rel=1e-14)
  # α=1: (γĉ + γ + 1)/(γ + 1) = 4.3/4 = 1.075.
  assert theory.operations_factor(1.0, 3, 0.1) == pytest.approx(1.075)
  # α=.5, γ=1, ĉ=0: 2 / 1.5 = 4/3.
  assert theory.operations_factor(0.5, 1, 0.0) == pytest.approx(4 / 3)
  # γ=0: 1.
  assert theory.operations_factor(0.4, 0, 0.3) == 1.0


@settings(max_examples=100, deadline=None)
@given(alpha=alphas, gamma=gammas, c_hat=costs)
def test_operations_factor_at_least_one(alpha, gamma, c_hat):
  assert theory.operations_factor(alpha, gamma, c_hat) >= 1.0


# -----------------------------------------------------------------------------
# breakeven_alpha and improvement_lower_bound
# -----------------------------------------------------------------------------


def test_breakeven_alpha_hand_values():
  # ε/γ: .2/4 = .05; 3/5 = .6 (check: (1 + 5·.6)/(1 + 3) = 4/4 = 1).
  assert theory.breakeven_alpha(4, 0.2) == pytest.approx(0.05)
  assert theory.breakeven_alpha(5, 3.0) == pytest.approx(0.6)
  # 3/2 = 1.5 > 1: no α in [0, 1] breaks even; the raw ratio is returned.
  assert theory.breakeven_alpha(2, 3.0) == pytest.approx(1.5)
  assert theory.breakeven_alpha(3, 0.0) == 0.0
  np.testing.assert_allclose(theory.breakeven_alpha([1, 2, 4], 0.4),
                             [0.4, 0.2, 0.1])


def test_improvement_lower_bound_hand_values():
  # (1 + .6)/(1 + .1) = 1.6/1.1 = 1.4545…; it is the γ=1 improvement.
  assert theory.improvement_lower_bound(0.6, 0.1) == pytest.approx(1.6 / 1.1)
  assert theory.improvement_lower_bound(0.6, 0.1) == pytest.approx(
      theory.walltime_improvement(0.6, 1, 0.1))
  # α <= c promises nothing: (1 + .2)/(1 + .5) = .8 < 1.
  assert theory.improvement_lower_bound(0.2, 0.5) == pytest.approx(0.8)
  # α = c gives exactly 1.
  assert theory.improvement_lower_bound(0.25, 0.25) == 1.0


# -----------------------------------------------------------------------------
# expected_accepted_histogram
# -----------------------------------------------------------------------------


def test_histogram_hand_values():
  # α=.8, γ=3: P(0)=.2, P(1)=.8·.2=.16, P(2)=.64·.2=.128, P(3)=.512.
  # Sum 1; mean .16 + .256 + 1.536 = 1.952; + 1 = 2.952 = tokens per call.
  hist = theory.expected_accepted_histogram(0.8, 3)
  np.testing.assert_allclose(hist, [0.2, 0.16, 0.128, 0.512], rtol=1e-14)
  assert hist.sum() == pytest.approx(1.0)
  assert (hist * np.arange(4)).sum() + 1 == pytest.approx(2.952)


def test_histogram_edges_and_batch():
  np.testing.assert_array_equal(theory.expected_accepted_histogram(1.0, 3),
                                [0, 0, 0, 1])
  np.testing.assert_array_equal(theory.expected_accepted_histogram(0.0, 3),
                                [1, 0, 0, 0])
  np.testing.assert_array_equal(theory.expected_accepted_histogram(0.4, 0),
                                [1])
  batch = theory.expected_accepted_histogram([[0.5], [1.0]], 2)
  assert batch.shape == (2, 1, 3)
  # α=.5, γ=2: .5, .25, .25.
  np.testing.assert_allclose(batch[0, 0], [0.5, 0.25, 0.25])


@settings(max_examples=200, deadline=None)
@given(alpha=alphas, gamma=gammas)
def test_histogram_sums_to_one_and_mean_matches(alpha, gamma):
  hist = theory.expected_accepted_histogram(alpha, gamma)
  assert hist.shape == (gamma + 1,)
  assert np.all(hist >= 0)
  assert hist.sum() == pytest.approx(1.0, abs=1e-12)
  mean_plus_one = (hist * np.arange(gamma + 1)).sum() + 1
  assert mean_plus_one == pytest.approx(
      theory.expected_tokens_per_call(alpha, gamma), rel=1e-11)


# -----------------------------------------------------------------------------
# Validation of the scalar-model functions.
# -----------------------------------------------------------------------------

CALLS = {
    "tokens": lambda a=0.5, g=3: theory.expected_tokens_per_call(a, g),
    "walltime": lambda a=0.5, g=3, c=0.1: theory.walltime_improvement(a, g, c),
    "ops": lambda a=0.5, g=3, c=0.1: theory.operations_factor(a, g, c),
    "hist": lambda a=0.5, g=3: theory.expected_accepted_histogram(a, g),
    "bound": lambda a=0.5, c=0.1: theory.improvement_lower_bound(a, c),
    "optimal": lambda a=0.5, c=0.1: theory.optimal_gamma(a, c),
}


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize(
    "alpha, error, pattern",
    [
        (1.1, ValueError, r"alpha must lie in \[0, 1\], got 1.1"),
        (-0.1, ValueError, r"alpha must lie in \[0, 1\], got -0.1"),
        ([0.5, 2.0], ValueError,
         r"alpha must lie in \[0, 1\], got 2.0 at index \(1,\)"),
        (float("nan"), ValueError, r"alpha must be finite, got nan"),
        ("0.5", TypeError, r"alpha must be a real number .*'0.5'"),
        (True, TypeError, r"alpha must be a real number .*dtype bool"),
        (1 + 0j, TypeError, r"alpha must be a real number .*complex"),
    ],
)
def test_alpha_errors(name, alpha, error, pattern):
  with pytest.raises(error, match=pattern):
    CALLS[name](a=alpha)


@pytest.mark.parametrize("name", ["tokens", "walltime", "ops", "hist"])
@pytest.mark.parametrize(
    "gamma, error, pattern",
    [
        (-1, ValueError, r"gamma must be an int(eger)? >= 0, got -1"),
        (2.5, TypeError, r"gamma must be .*int.*2.5"),
        (3.0, TypeError, r"gamma must be .*int.*3.0"),
        (True, TypeError, r"gamma must be .*int.*True"),
        ("3", TypeError, r"gamma must be .*int.*'3'"),
    ],
)
def test_gamma_errors(name, gamma, error, pattern):
  with pytest.raises(error, match=pattern):
    CALLS[name](g=gamma)


def test_histogram_gamma_must_be_scalar():
  with pytest.raises(TypeError, match=r"gamma must be an int"):
    theory.expected_accepted_histogram(0.5, [1, 2])


@pytest.mark.parametrize(
    "call, pattern",
    [
        (lambda: theory.walltime_improvement(0.5, 3, -0.1),
         r"c must be >= 0, got -0.1"),
        (lambda: theory.walltime_improvement(0.5, 3, float("inf")),
         r"c must be finite, got inf"),
        (lambda: theory.operations_factor(0.5, 3, -1.0),
         r"c_hat must be >= 0, got -1.0"),
        (lambda: theory.improvement_lower_bound(0.5, -2.0),
         r"c must be >= 0, got -2.0"),
        (lambda: theory.optimal_gamma(0.5, -0.5),
         r"c must be >= 0, got -0.5"),
        (lambda: theory.breakeven_alpha(0, 0.2),
         r"gamma must be an integer >= 1, got 0"),
        (lambda: theory.breakeven_alpha(3, -0.2),
         r"overhead must be >= 0, got -0.2"),
        (lambda: theory.walltime_improvement_from_tokens(0.5, 3, 0.1),
         r"tokens_per_call must lie in \[1, gamma \+ 1\] .*got 0.5 with "
         r"gamma 3"),
        (lambda: theory.walltime_improvement_from_tokens(4.5, 3, 0.1),
         r"tokens_per_call must lie in \[1, gamma \+ 1\] .*got 4.5"),
        (lambda: theory.walltime_improvement_from_tokens(2.0, 3, 0.1, 0.0),
         r"verify_cost must be > 0, got 0.0"),
        (lambda: theory.walltime_improvement_from_tokens(2.0, -1, 0.1),
         r"gamma must be an integer >= 0, got -1"),
        (lambda: theory.walltime_improvement_from_tokens(2.0, 3, -0.1),
         r"c must be >= 0, got -0.1"),
        (lambda: theory.acceptance_rate([0.5, 0.5], [0.5, 0.5], atol=-1.0),
         r"atol must be >= 0, got -1.0"),
    ],
)
def test_value_errors_name_the_argument(call, pattern):
  with pytest.raises(ValueError, match=pattern):
    call()


def test_type_error_names_tokens_per_call():
  with pytest.raises(TypeError, match=r"tokens_per_call must be a real number"):
    theory.walltime_improvement_from_tokens("2", 3, 0.1)


@pytest.mark.parametrize(
    "max_gamma, error, pattern",
    [
        (0, ValueError, r"max_gamma must be an int >= 1, got 0"),
        (8.0, TypeError, r"max_gamma must be an int >= 1, got 8.0"),
        (True, TypeError, r"max_gamma must be an int"),
    ],
)
def test_max_gamma_errors(max_gamma, error, pattern):
  with pytest.raises(error, match=pattern):
    theory.optimal_gamma(0.5, 0.1, max_gamma=max_gamma)


def test_public_api_is_documented():
  for name in theory.__all__:
    fn = getattr(theory, name)
    assert fn.__doc__ and len(fn.__doc__) > 80, name
    if name != "optimal_gamma_and_improvement":  # Refers to optimal_gamma's.
      assert "Args:" in fn.__doc__ and "Returns:" in fn.__doc__, name
