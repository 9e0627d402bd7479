"""Analytic results for speculative decoding (Leviathan, Kalman, Matias 2023).

The closed forms of arXiv 2211.17192 (§3) as small pure numpy functions: to set γ, to predict a
speedup before a run and to check a measured run against the model afterwards.

Notation (the paper's): p the draft model's next-token distribution, q the target's; β =
Σ_x min(p(x), q(x)) the acceptance rate of one step; α = E[β] over prefixes; γ (``gamma``) the
draft tokens per iteration; c = t_draft_step / t_target_step; ĉ the draft / target ratio of
arithmetic operations per token.

Every prediction except `acceptance_rate` assumes the β of successive positions are i.i.d. with
mean α. Real acceptance is correlated, so check a measured run with
`walltime_improvement_from_tokens` on the measured tokens per target call, not with α alone.

Arguments are scalars or array-likes that broadcast with numpy's rules; a result is a Python
``float`` (or ``int``) when every input is a scalar, an ``np.ndarray`` otherwise. Invalid input
raises ``TypeError`` (a string, a bool, a non-integer γ) or ``ValueError`` (a bad value or
shape), naming the argument, the bad value and what is allowed.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, Sequence, Tuple

import numpy as np
from numpy.typing import ArrayLike

from specjax._checks import check_int, check_int_array, check_real_array, first_bad

__all__ = [
    "acceptance_rate",
    "expected_tokens_per_call",
    "alpha_for_tokens",
    "walltime_improvement",
    "walltime_improvement_from_tokens",
    "walltime_improvement_from_times",
    "optimal_gamma",
    "optimal_gamma_and_improvement",
    "operations_factor",
    "breakeven_alpha",
    "improvement_lower_bound",
    "expected_accepted_histogram",
    "tokens_per_call_curve",
    "alpha_for_speedup",
    "traffic_mix",
]

Number = float | np.ndarray

# --- Validation helpers ---


# `specjax._checks`' array checks, under the names the closed forms use.
_real = check_real_array
_in_unit_interval = functools.partial(check_real_array, minimum=0.0, maximum=1.0)
_non_negative = functools.partial(check_real_array, minimum=0.0)
_positive = functools.partial(check_real_array, minimum=0.0, lo_open=True)
_integer = check_int_array
_first_bad = first_bad


def _check_tokens(t: np.ndarray, g: np.ndarray) -> None:
  """Tokens per call must lie in [1, γ + 1] (t and g broadcast)."""
  bad = (t < 1.0) | (t > g + 1.0)
  if bad.any():
    raise ValueError(
        "tokens_per_call must lie in [1, gamma + 1] (a call emits between 1 "
        f"and gamma + 1 tokens), got {_first_bad(t, bad)} with gamma "
        f"{_first_bad(g, bad)}")


def _broadcast(**named: np.ndarray) -> Tuple[np.ndarray, ...]:
  """Broadcasts the arrays together, naming them when their shapes clash."""
  try:
    return tuple(np.broadcast_arrays(*named.values()))
  except ValueError:
    shapes = ", ".join(f"{k} shape {v.shape}" for k, v in named.items())
    raise ValueError(
        f"arguments do not broadcast together: {shapes}") from None


def _out(x: np.ndarray) -> Number:
  """A Python float for a 0-d result, the array otherwise."""
  x = np.asarray(x)
  return float(x) if x.ndim == 0 else x


def _tokens(alpha: np.ndarray, gamma: np.ndarray) -> np.ndarray:
  """(1 − α^{γ+1}) / (1 − α) on validated, broadcast arrays.

  As −expm1((γ+1)·log α) / (1 − α): accurate to a few ulps for every α in [0, 1] (no
  cancellation as α → 1); α = 1 takes the exact limit γ + 1; the result is clipped to [1, γ + 1].
  """
  n = gamma.astype(np.float64) + 1.0
  with np.errstate(divide="ignore", invalid="ignore"):
    t = -np.expm1(n * np.log(alpha)) / (1.0 - alpha)
  t = np.where(alpha == 1.0, n, t)
  return np.clip(t, 1.0, n)


# --- The acceptance rate ---


def acceptance_rate(p: ArrayLike, q: ArrayLike, axis: int = -1,
                    atol: float = 1e-5) -> Number:
  """β = Σ_x min(p(x), q(x)) = 1 − TV(p, q), the chance a draft is accepted.

  Leviathan et al. 2023, Theorem 3.5 and Corollary 3.6: speculative sampling with draft p and
  target q accepts the drafted token with probability β = 1 − D_LK(p, q), D_LK being the total
  variation distance ½ Σ_x |p(x) − q(x)|.

  Args:
    p: draft distribution(s): non-negative, summing to 1 along `axis`; the other dimensions are
      batch dimensions.
    q: target distribution(s), of p's shape, under the same conditions.
    axis: the vocabulary axis (an int within p's dimensions).
    atol: tolerance (>= 0) on |Σ p − 1| and |Σ q − 1|.

  Returns:
    β in [0, 1] (clipped: sums within the tolerance could give a hair above 1): a float for 1-D
    inputs, else an array of p's shape without `axis`.
  """
  p_arr = _real("p", p)
  q_arr = _real("q", q)
  if p_arr.shape != q_arr.shape:
    raise ValueError(
        f"p and q must have the same shape, got p.shape={p_arr.shape} and "
        f"q.shape={q_arr.shape}")
  if p_arr.ndim == 0:
    raise ValueError(
        "p and q must be probability vectors (at least 1-D), got scalars "
        f"p={p_arr.item()!r}, q={q_arr.item()!r}")
  check_int("axis", axis)
  if not -p_arr.ndim <= axis < p_arr.ndim:
    raise ValueError(
        f"axis must be in [{-p_arr.ndim}, {p_arr.ndim - 1}] for p and q of "
        f"shape {p_arr.shape}, got {axis}")
  tol = float(_non_negative("atol", atol))
  for name, arr in (("p", p_arr), ("q", q_arr)):
    bad = arr < 0
    if bad.any():
      raise ValueError(f"{name} must be non-negative (a probability vector), "
                       f"got {_first_bad(arr, bad)}")
    sums = arr.sum(axis=axis)
    bad = np.abs(sums - 1.0) > tol
    if bad.any():
      raise ValueError(
          f"{name} must sum to 1 along axis {axis} (tolerance {tol:g}), got "
          f"sum {_first_bad(sums, bad)}")
  beta = np.minimum(p_arr, q_arr).sum(axis=axis)
  return _out(np.clip(beta, 0.0, 1.0))


# --- Tokens per call, walltime and operations (i.i.d. model) ---


def expected_tokens_per_call(alpha: ArrayLike, gamma: ArrayLike) -> Number:
  """Expected tokens produced per target call: (1 − α^{γ+1}) / (1 − α).

  Leviathan et al. 2023, Equation (1) (§3.3): with i.i.d. acceptances of mean α the accepted
  drafts are a capped geometric variable, and each iteration also emits a corrected or bonus
  token. The α → 1 limit γ + 1 is exact (no 0/0); α = 0 or γ = 0 (plain decoding) gives 1.

  Args:
    alpha: expected acceptance rate(s), in [0, 1].
    gamma: draft length(s), integer(s) >= 0.

  Returns:
    The expected tokens per call, in [1, γ + 1].
  """
  a = _in_unit_interval("alpha", alpha)
  g = _integer("gamma", gamma, 0)
  a, g = _broadcast(alpha=a, gamma=g)
  return _out(_tokens(a, g))


def alpha_for_tokens(tokens_per_call: ArrayLike, gamma: ArrayLike) -> Number:
  """The α at which `expected_tokens_per_call(α, γ)` equals tokens_per_call.

  The inverse of Equation (1) in α (strictly increasing from 1 at α = 0 to γ + 1 at α = 1), by
  bisection to float64 precision: the α a speedup target needs, or the α the i.i.d. model needs
  to explain a measured mean of tokens per call. (Not accepted / drafted, which in the i.i.d.
  model is below α for γ > 1: the drafts after a rejection are proposed but never checked.)

  Args:
    tokens_per_call: tokens per target call, in [1, γ + 1].
    gamma: draft length(s), integer(s) >= 1 (at γ = 0 every α gives 1 token).

  Returns:
    α in [0, 1].
  """
  t = _real("tokens_per_call", tokens_per_call)
  g = _integer("gamma", gamma, 1)
  t, g = _broadcast(tokens_per_call=t, gamma=g)
  _check_tokens(t, g)
  lo, hi = np.zeros_like(t), np.ones_like(t)
  for _ in range(64):  # Halves the bracket each time: 2^-64 < float64's spacing near 1.
    mid = 0.5 * (lo + hi)
    below = _tokens(mid, g) < t
    lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
  return _out(np.where(t >= g + 1.0, 1.0, np.where(t <= 1.0, 0.0, 0.5 * (lo + hi))))


def walltime_improvement(alpha: ArrayLike, gamma: ArrayLike,
                         c: ArrayLike) -> Number:
  """Expected walltime speedup: (1 − α^{γ+1}) / ((1 − α)(γc + 1)).

  Leviathan et al. 2023, Theorem 3.8: an iteration costs γ draft steps and one target call
  (taken as one target decode step: verifying γ + 1 tokens in parallel is ~free on idle
  hardware), and yields `expected_tokens_per_call` tokens.

  Args:
    alpha: expected acceptance rate(s), in [0, 1].
    gamma: draft length(s), integer(s) >= 0 (γ = 0 gives exactly 1).
    c: cost coefficient(s) t_draft_step / t_target_step, >= 0.

  Returns:
    The speedup factor over plain target decoding, in (0, γ + 1].
  """
  a = _in_unit_interval("alpha", alpha)
  g = _integer("gamma", gamma, 0)
  cc = _non_negative("c", c)
  a, g, cc = _broadcast(alpha=a, gamma=g, c=cc)
  return _out(_tokens(a, g) / (g * cc + 1.0))


def walltime_improvement_from_tokens(tokens_per_call: ArrayLike,
                                     gamma: ArrayLike, c: ArrayLike,
                                     verify_cost: ArrayLike = 1.0) -> Number:
  """Speedup predicted from MEASURED tokens per call and component costs.

  tokens_per_call / (γ·c + verify_cost), with c = t_draft_step / t_target_step and verify_cost =
  t_verify(γ + 1 tokens) / t_target_step (1.0: the paper's free verification).

  Real acceptances cluster, so the measured tokens per call can exceed the i.i.d. model's for the
  measured α (Leviathan et al.'s own CNN/DM temperature-0 row beats its c = 0 bound). Given the
  measured tokens per call and step times, the speedup (n_tokens · t_target_step) / (n_calls ·
  (γ t_draft_step + t_verify)) is exactly this ratio, so a gap to the measured speedup points at
  overheads (host syncs, sampling, cache bookkeeping), not at the acceptance model. With
  verify_cost = 1 and `expected_tokens_per_call(α, γ)` it is `walltime_improvement`.

  Args:
    tokens_per_call: measured mean tokens emitted per target call (accepted drafts + 1, averaged
      over iterations), in [1, γ + 1].
    gamma: draft length(s), integer(s) >= 0.
    c: draft-to-target step-time ratio(s), >= 0.
    verify_cost: cost of the verify call in target decode steps, > 0.

  Returns:
    The predicted speedup factor over plain target decoding.
  """
  t = _real("tokens_per_call", tokens_per_call)
  g = _integer("gamma", gamma, 0)
  cc = _non_negative("c", c)
  v = _positive("verify_cost", verify_cost)
  t, g, cc, v = _broadcast(tokens_per_call=t, gamma=g, c=cc, verify_cost=v)
  _check_tokens(t, g)
  return _out(t / (g * cc + v))


def walltime_improvement_from_times(tokens_per_iteration: ArrayLike, step_s: ArrayLike,
                                    iteration_s: ArrayLike) -> Number:
  """Speedup predicted from an iteration's measured or modelled time: τ · t_step / t_iteration.

  Leviathan et al. 2023, Theorem 3.8 in seconds: an iteration emits τ tokens and costs
  `iteration_s` (draft steps, verify call and the rest) where plain decoding spends τ · t_step.
  It is `walltime_improvement_from_tokens` with t_iteration / t_step = γ·c + verify_cost, for
  callers holding the iteration's whole time (a compiled program's cost, a sum of components).

  Args:
    tokens_per_iteration: τ, tokens emitted per iteration, >= 1 (measured:
      `DecodeStats.tokens_per_iteration`; modelled: `expected_tokens_per_call`).
    step_s: seconds of one plain decoding step, > 0.
    iteration_s: seconds of one speculative iteration, > 0.

  Returns:
    The predicted speedup factor over plain decoding.
  """
  t = _real("tokens_per_iteration", tokens_per_iteration)
  if (t < 1.0).any():
    raise ValueError("tokens_per_iteration must be >= 1 (an iteration emits at least one "
                     f"token), got {_first_bad(t, t < 1.0)}")
  step = _positive("step_s", step_s)
  it = _positive("iteration_s", iteration_s)
  t, step, it = _broadcast(tokens_per_iteration=t, step_s=step, iteration_s=it)
  return _out(t * step / it)


def _optimal(alpha: ArrayLike, c: ArrayLike,
             max_gamma: int) -> Tuple[np.ndarray, np.ndarray]:
  a = _in_unit_interval("alpha", alpha)
  cc = _non_negative("c", c)
  m = check_int("max_gamma", max_gamma, 1)
  a, cc = _broadcast(alpha=a, c=cc)
  gammas = np.arange(1, m + 1, dtype=np.int64)
  a_, c_ = a[..., None], cc[..., None]
  improvement = _tokens(a_, gammas) / (gammas * c_ + 1.0)
  best = np.argmax(improvement, axis=-1)  # First maximum: smallest γ on ties.
  value = np.take_along_axis(improvement, best[..., None], axis=-1)[..., 0]
  return best + 1, value


def optimal_gamma(alpha: ArrayLike, c: ArrayLike,
                  max_gamma: int = 32) -> int | np.ndarray:
  """The integer γ in 1..max_gamma that maximises `walltime_improvement`.

  Leviathan et al. 2023, §3.5 (Figure 3): the improvement has no closed-form maximiser, so every
  γ in 1..max_gamma is evaluated; ties (e.g. α = 0 with c = 0) go to the smallest γ. The optimum
  grows with α and shrinks with c; at α = 1 and c < 1 it is max_gamma.

  Args:
    alpha: expected acceptance rate(s), in [0, 1].
    c: cost coefficient(s) t_draft_step / t_target_step, >= 0.
    max_gamma: the largest γ searched, a scalar integer >= 1.

  Returns:
    The best γ: an int for scalar inputs, else an int64 array of alpha's and c's broadcast
    shape (`optimal_gamma_and_improvement` also returns the improvement).
  """
  best, _ = _optimal(alpha, c, max_gamma)
  return int(best) if best.ndim == 0 else best


def optimal_gamma_and_improvement(
    alpha: ArrayLike, c: ArrayLike, max_gamma: int = 32
) -> Tuple[int | np.ndarray, Number]:
  """`optimal_gamma` and the `walltime_improvement` it achieves.

  Same arguments and rules as `optimal_gamma`. Returns (γ*, improvement at
  γ*); the improvement is >= `improvement_lower_bound(alpha, c)`.
  """
  best, value = _optimal(alpha, c, max_gamma)
  return (int(best) if best.ndim == 0 else best), _out(value)


def operations_factor(alpha: ArrayLike, gamma: ArrayLike,
                      c_hat: ArrayLike) -> Number:
  """Factor of extra arithmetic: (1 − α)(γĉ + γ + 1) / (1 − α^{γ+1}).

  Leviathan et al. 2023, Theorem 3.11: an iteration runs the target on γ + 1 tokens and the draft
  on γ, i.e. γĉ + γ + 1 target-token units of work, for `expected_tokens_per_call` tokens. The
  factor is >= 1: speculative decoding trades extra work for fewer serial calls. The α → 1 limit
  (γĉ + γ + 1)/(γ + 1) is exact.

  Args:
    alpha: expected acceptance rate(s), in [0, 1].
    gamma: draft length(s), integer(s) >= 0 (γ = 0 gives exactly 1).
    c_hat: operations ratio(s) draft / target per token, >= 0.

  Returns:
    The expected operations of speculative decoding over plain decoding.
  """
  a = _in_unit_interval("alpha", alpha)
  g = _integer("gamma", gamma, 0)
  ch = _non_negative("c_hat", c_hat)
  a, g, ch = _broadcast(alpha=a, gamma=g, c_hat=ch)
  return _out((g * ch + g + 1.0) / _tokens(a, g))


# --- Break-even and bounds ---


def breakeven_alpha(gamma: ArrayLike, overhead: ArrayLike) -> Number:
  """α at which speculation breaks even: (1 + γα)/(1 + ε) = 1, so α = ε/γ.

  A first-order, single-request rule of thumb: an iteration costs (1 + ε) target steps (ε the
  relative extra cost of drafting and verifying: γc + verify_cost − 1 in
  `walltime_improvement_from_tokens`' notation; under high concurrency it grows) and yields
  about 1 + γα tokens. 1 + γα overestimates the i.i.d. model's tokens, so this is a lower bound
  on the α that model needs. The raw ε/γ is returned even above 1 (no inf, no raise): then no
  α ∈ [0, 1] recovers the overhead, and a gate `alpha >= breakeven_alpha(...)` never opens.

  Args:
    gamma: draft length(s), integer(s) >= 1.
    overhead: ε, relative extra cost per iteration, >= 0.

  Returns:
    The break-even α (>= 0; > 1 means unreachable).
  """
  g = _integer("gamma", gamma, 1)
  eps = _non_negative("overhead", overhead)
  g, eps = _broadcast(gamma=g, overhead=eps)
  return _out(eps / g)


def improvement_lower_bound(alpha: ArrayLike, c: ArrayLike) -> Number:
  """(1 + α)/(1 + c): a walltime improvement the best γ is sure to reach.

  Leviathan et al. 2023, Corollary 3.9: if α > c some γ improves walltime, by at least this
  factor (it is `walltime_improvement(α, 1, c)`). It is returned for any α and c; for α <= c it
  is <= 1 and promises no speedup (nothing is raised).

  Args:
    alpha: expected acceptance rate(s), in [0, 1].
    c: cost coefficient(s) t_draft_step / t_target_step, >= 0.

  Returns:
    (1 + α)/(1 + c).
  """
  a = _in_unit_interval("alpha", alpha)
  cc = _non_negative("c", c)
  a, cc = _broadcast(alpha=a, c=cc)
  return _out((1.0 + a) / (1.0 + cc))


def expected_accepted_histogram(alpha: ArrayLike, gamma: int) -> np.ndarray:
  """The i.i.d. model's distribution of accepted drafts n ∈ 0..γ per iteration.

  P(n = k) = α^k (1 − α) for k < γ and P(n = γ) = α^γ (Leviathan et al. 2023, §3.3: a geometric
  variable capped at γ); its mean plus 1 is `expected_tokens_per_call`. A measured histogram
  heavier at 0 and γ than this one is the signature of correlated acceptances.

  Args:
    alpha: expected acceptance rate(s), in [0, 1]; any shape.
    gamma: the draft length, a scalar integer >= 0.

  Returns:
    Array of shape alpha.shape + (γ + 1,) whose last axis sums to 1.
  """
  a = _in_unit_interval("alpha", alpha)
  g = check_int("gamma", gamma, 0)
  k = np.arange(g + 1)
  a_ = a[..., None]
  probs = np.power(a_, k) * (1.0 - a_)
  probs[..., g] = np.power(a, g)
  return probs


# --- Draft length, the α a speedup needs, traffic mixes (a draft's memory: planning) ---


def _scalar_non_negative(name: str, value: Any) -> float:
  """Validates a scalar real >= 0 (a cost, not a broadcast operand)."""
  arr = _non_negative(name, value)
  if arr.ndim != 0:
    raise ValueError(f"{name} must be a scalar, got an array of shape {arr.shape}")
  return float(arr)


def _vector(name: str, value: ArrayLike, arr: np.ndarray) -> np.ndarray:
  """`arr` (validated from `value`) as a non-empty 1-D array."""
  arr = np.atleast_1d(arr)
  if arr.ndim != 1 or arr.size == 0:
    raise ValueError(f"{name} must be a scalar or a non-empty 1-D sequence, got {value!r} "
                     f"(shape {arr.shape})")
  return arr


def _iteration_cost(gamma: ArrayLike, cost_ratio: ArrayLike,
                    overhead: ArrayLike) -> np.ndarray:
  """1 + ε + γ·c: one speculative iteration in target decode steps."""
  return 1.0 + overhead + gamma * cost_ratio


def tokens_per_call_curve(alphas: ArrayLike, n_max: int = 16,
                          cost_ratio: float = 0.05,
                          verify_overhead: float = 0.0) -> Dict[str, np.ndarray]:
  """Tokens per target call against the draft length N, and the best N per α.

  The tokens per call grow with N towards 1 / (1 − α), so the optimum comes from the iteration's
  cost in target decode steps (the model `alpha_for_speedup` and `traffic_mix` share): cost(N) =
  1 + ε + N·c, one verify call (a target step plus a relative overhead ε = `verify_overhead`) and
  N draft steps of c = `cost_ratio` target steps (a per-token verify cost folds into c). The
  speedup is tokens(α, N) / cost(N) and N* its argmax over 1..n_max (smallest on ties); with
  ε = 0, N* = `optimal_gamma(α, c, n_max)`.

  Args:
    alphas: acceptance rate(s) in [0, 1]: a scalar or a 1-D sequence.
    n_max: the longest draft length considered, a scalar integer >= 1.
    cost_ratio: c = t_draft_step / t_target_step, a scalar >= 0.
    verify_overhead: ε, the relative extra cost of one iteration's verify, a scalar >= 0.

  Returns:
    A dict of arrays (A = number of alphas): "n" [N] the draft lengths 1..n_max; "alpha" [A];
    "tokens" [A, N] expected tokens per target call; "cost" [N] iteration cost in target steps;
    "speedup" [A, N] tokens / cost; "optimal_n" [A] int, the N maximising the speedup;
    "optimal_speedup", "optimal_tokens" [A] the speedup and tokens there; "tokens_limit" [A]
    1 / (1 − α), the N → ∞ limit (inf at α = 1).
  """
  a = _vector("alphas", alphas, _in_unit_interval("alphas", alphas))
  m = check_int("n_max", n_max, 1)
  c = _scalar_non_negative("cost_ratio", cost_ratio)
  eps = _scalar_non_negative("verify_overhead", verify_overhead)
  n = np.arange(1, m + 1, dtype=np.int64)
  tokens = _tokens(a[:, None], n[None, :])
  cost = _iteration_cost(n.astype(np.float64), c, eps)
  speedup = tokens / cost[None, :]
  best = np.argmax(speedup, axis=1)  # First maximum: the smallest N on ties.
  rows = np.arange(a.size)
  with np.errstate(divide="ignore"):
    limit = np.where(a < 1.0, 1.0 / (1.0 - a), np.inf)
  return {"n": n, "alpha": a, "tokens": tokens, "cost": cost, "speedup": speedup,
          "optimal_n": n[best], "optimal_speedup": speedup[rows, best],
          "optimal_tokens": tokens[rows, best], "tokens_limit": limit}


_SPEEDUP_MODELS = ("geometric", "linear")


def alpha_for_speedup(speedup: ArrayLike, k: ArrayLike, overhead: ArrayLike = 0.15,
                      cost_ratio: ArrayLike = 0.0, model: str = "geometric") -> Number:
  """The acceptance rate α a walltime speedup needs at draft length K.

  A speedup S needs S·cost tokens per target call, with the iteration cost 1 + ε + K·c of
  `tokens_per_call_curve` (ε = `overhead`, c = `cost_ratio`). Two models of the tokens per call:

    "geometric"  (1 − α^{K+1}) / (1 − α), Leviathan et al.'s Equation (1):
                 α = `alpha_for_tokens(S·cost, K)`;
    "linear"     1 + K·α, the rule of thumb S = (1 + Kα)/(1 + ε): α = (S·cost − 1) / K.

  The linear form overestimates the tokens (every draft counts as if the earlier ones were
  accepted), so it asks for a lower α. Speedups that α = 0 already gives return 0; speedups no
  α ∈ [0, 1] reaches return NaN. At fixed S and K, dα/dε = S / (dtokens/dα): S / K in the linear
  model, while the geometric slope Σ_i i·α^{i−1} is below K at small α and above it near 1, so
  high speedups are less sensitive to ε than the linear rule says.

  Args:
    speedup: the walltime speedup(s) wanted, > 0 (2.0 for 2×).
    k: draft length(s) K, integer(s) >= 1.
    overhead: ε, the relative extra cost per iteration, >= 0 (it grows with concurrency).
    cost_ratio: c = t_draft_step / t_target_step, >= 0 (0: drafting counted inside ε).
    model: "geometric" (default) or "linear".

  Returns:
    α in [0, 1], or NaN where unreachable; broadcast over the arguments.
  """
  if not isinstance(model, str) or model not in _SPEEDUP_MODELS:
    raise ValueError(f"model must be one of {_SPEEDUP_MODELS}, got {model!r}")
  s = _positive("speedup", speedup)
  g = _integer("k", k, 1)
  eps = _non_negative("overhead", overhead)
  c = _non_negative("cost_ratio", cost_ratio)
  s, g, eps, c = _broadcast(speedup=s, k=g, overhead=eps, cost_ratio=c)
  need = s * _iteration_cost(g, c, eps)
  if model == "linear":
    alpha = np.maximum((need - 1.0) / g, 0.0)
    return _out(np.where(alpha > 1.0, np.nan, alpha))
  reachable = need <= g + 1.0
  clipped = np.clip(need, 1.0, g + 1.0)
  alpha = np.asarray(alpha_for_tokens(clipped, g), np.float64)
  return _out(np.where(reachable, alpha, np.nan))


_MIX_SHARES = ("tokens", "calls")


def traffic_mix(shares: Sequence[float], alphas: Sequence[float], k: int,
                overhead: float = 0.15, cost_ratio: float = 0.0, gate_alpha: float = 0.55,
                share_of: str = "tokens") -> Dict[str, Any]:
  """Expected tokens per call and speedup of a mix of traffic classes.

  Class i carries a share s_i of the traffic and accepts drafts at α_i (i.i.d. within the class),
  so its target calls emit T_i = (1 − α_i^{K+1}) / (1 − α_i) tokens on average. The shares count:

    share_of="tokens"  the class's share of generated tokens (the usual split): class i needs
                       s_i / T_i calls per token, so the mix emits 1 / Σ s_i / T_i tokens per
                       call (a harmonic mean);
    share_of="calls"   its share of target calls: the mix emits Σ s_i T_i tokens per call.

  The speedup is the mix's tokens per call over the iteration cost 1 + ε + K·c (see
  `tokens_per_call_curve`). Two averages of α are reported: the share-weighted Σ s_i α_i and the
  call-weighted one, which an aggregate accepted / drafted counter would read. T at the mean α is
  not the mix's: T is convex in α, so a call-weighted mix emits at least T(mean α), while a
  token-share mix can fall below it (the low class costs more calls than the high one saves).

  Args:
    shares: each class's share, >= 0, summing to 1 (tolerance 1e-6).
    alphas: each class's acceptance rate, in [0, 1], one per share.
    k: the draft length K, a scalar integer >= 1.
    overhead: ε, the relative extra cost per iteration, a scalar >= 0.
    cost_ratio: c = t_draft_step / t_target_step, a scalar >= 0.
    gate_alpha: the rollout gate on α, in [0, 1] (default: the practical break-even at high
      concurrency).
    share_of: "tokens" (default) or "calls", what the shares count.

  Returns:
    A dict of Python values: the inputs ("share_of", "k", "overhead", "cost_ratio",
    "gate_alpha", "shares", "alphas"); per class "class_tokens_per_call", "class_speedup" and
    "call_shares" (its share of target calls); "mean_alpha" (Σ s_i α_i), "call_weighted_alpha";
    the mix's "tokens_per_call", "tokens_at_mean_alpha" (T at the mean α), "iteration_cost"
    (1 + ε + K·c), "speedup" and "pays" (speedup > 1); "breakeven_alpha" (speedup 1 in the
    geometric model, NaN if none); "meets_gate" (mean α >= gate_alpha); "classes_below_gate"
    (indices of the classes with α_i < gate_alpha).
  """
  if not isinstance(share_of, str) or share_of not in _MIX_SHARES:
    raise ValueError(f"share_of must be one of {_MIX_SHARES}, got {share_of!r}")
  s = _vector("shares", shares, _non_negative("shares", shares))
  a = _vector("alphas", alphas, _in_unit_interval("alphas", alphas))
  if s.shape != a.shape:
    raise ValueError(f"shares and alphas must have one entry per class, got {s.size} shares "
                     f"and {a.size} alphas")
  if abs(float(s.sum()) - 1.0) > 1e-6:
    raise ValueError(f"shares must sum to 1 (tolerance 1e-6), got {s.tolist()!r} summing "
                     f"to {float(s.sum())!r}")
  g = check_int("k", k, 1)
  eps = _scalar_non_negative("overhead", overhead)
  c = _scalar_non_negative("cost_ratio", cost_ratio)
  gate = _in_unit_interval("gate_alpha", gate_alpha)
  if gate.ndim != 0:
    raise ValueError(f"gate_alpha must be a scalar, got an array of shape {gate.shape}")
  tokens = _tokens(a, np.full(a.shape, g))
  if share_of == "tokens":
    calls = s / tokens
    mix_tokens = 1.0 / calls.sum()
    call_shares = calls / calls.sum()
  else:
    mix_tokens = float(np.sum(s * tokens))
    call_shares = s
  mean_alpha = float(np.sum(s * a))
  cost = float(_iteration_cost(g, c, eps))
  speedup = float(mix_tokens) / cost
  return {
      "share_of": share_of, "k": g, "overhead": eps, "cost_ratio": c,
      "gate_alpha": float(gate), "shares": s.tolist(), "alphas": a.tolist(),
      "class_tokens_per_call": tokens.tolist(), "class_speedup": (tokens / cost).tolist(),
      "call_shares": call_shares.tolist(), "mean_alpha": mean_alpha,
      "call_weighted_alpha": float(np.sum(call_shares * a)),
      "tokens_per_call": float(mix_tokens),
      "tokens_at_mean_alpha": float(_tokens(np.asarray(mean_alpha), np.asarray(g))),
      "iteration_cost": cost, "speedup": speedup, "pays": bool(speedup > 1.0),
      "breakeven_alpha": float(alpha_for_speedup(1.0, g, eps, c)),
      "meets_gate": bool(mean_alpha >= float(gate)),
      "classes_below_gate": [int(i) for i in np.nonzero(a < float(gate))[0]],
  }
