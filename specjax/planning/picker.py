"""Strategy picker: which drafter family and γ / tree size to use, or none.

From measured α and / or τ per family, the draft's cost ratio c, the measured cost of a target
call on T tokens and each family's memory, it predicts each family's walltime speedup at the batch
size, output length and memory budget at hand, and recommends the best or "don't speculate"; the
numbers used come back with the answer.

The cost model (one iteration = one target call), in target-step units:

  speedup = τ / (draft cost per iteration + V(T))

  τ      tokens per target call (measured, or `theory.expected_tokens_per_call` for a chain),
  draft  γ·c for a chain drafter whose c is per drafted token, or c when it is per iteration,
  V(T)   a target call on T tokens (γ + 1, or a tree's nodes) relative to a one-token step.

With V ≡ 1 and a chain this is Leviathan et al.'s `theory.walltime_improvement`; with the
measured V, `theory.walltime_improvement_from_tokens`.
A chain with α known has its γ searched (each γ with its own V(γ + 1)); families measured only by
τ (trees, prompt lookup, lookahead, Medusa) keep their measured call shape. A results-JSON row
without a measured `cost_ratio` gets its draft cost per iteration from its measured speedup
(`picker_io.measurements_from_json`; `derived_cost_per="token"` searches γ instead).

"Don't speculate" comes with one of these reasons, checked in this order:

  * outputs shorter than `min_new_tokens` (default 50): compilation, the draft's prefill and the
    first iterations cost more than the few tokens can win back;
  * no family fits the memory budget;
  * verification is not free at this batch: some family would pay were a call on T tokens as
    cheap as a one-token step, none does at the measured V(T);
  * no family reaches `min_speedup` (the best one and its speedup named).

Usage: `pick(measurements_from_json(...), verify_cost_from_json(...), batch_size=1, ...).format()`
(readers in `specjax.planning.picker_io`), or `python -m specjax.cli.pick`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from specjax import theory
from specjax._checks import (check_bool, check_int, check_optional_int, check_optional_real,
                             check_real)

__all__ = [
    "FamilyMeasurement",
    "VerifyCost",
    "Prediction",
    "Recommendation",
    "predict_speedup",
    "draft_memory_bytes",
    "pick",
]

BASELINE = "autoregressive"
COST_PER = ("token", "iteration")

# --- Inputs ---


@dataclasses.dataclass(frozen=True)
class FamilyMeasurement:
  """What was measured for one drafter family (one row of a results JSON).

  Exactly one of `gamma` (a chain: γ drafts, a verify call on γ + 1 tokens) and `tree_nodes` (any
  other fixed call shape: a tree, or a measured-only family's call of that many tokens) is set.

  Attributes:
    family: the family's name, e.g. "classic draft".
    cost_ratio: c >= 0, the draft's cost in target decode steps (at this batch): per drafted
      token when `cost_per` is "token" (a draft model run γ times), per iteration when
      "iteration" (heads, trees, lookup: one draft pass).
    alpha: the expected acceptance rate α in [0, 1], or None (deterministic drafts: τ is used).
    tau: measured tokens per target call, or None (then a chain's τ comes from α by
      `theory.expected_tokens_per_call`; a tree needs it).
    gamma: the chain's draft length γ >= 1 at which τ was measured.
    tree_nodes: tokens in the verify call of a tree / fixed-shape family.
    cost_per: "token" or "iteration" (see `cost_ratio`); trees are per iteration. Only a chain
      with α and c per token has its γ searched.
    draft_params_bytes: the draft's own parameter bytes (0 for a self-draft), or None: unknown.
    draft_cache_bytes_per_token: cache bytes per position per sequence, or None: unknown.
    call_cost: the measured cost of this family's verify call relative to a one-token step, used
      at its measured call size instead of the `VerifyCost` curve; None: the curve.
    measured_speedup: the speedup measured for this configuration, if any (reported beside).
    batch: the batch size it was measured at, if known (checked by `pick`).
    temperature: the sampling temperature it was measured at, if known.
  """

  family: str
  cost_ratio: float
  alpha: Optional[float] = None
  tau: Optional[float] = None
  gamma: Optional[int] = None
  tree_nodes: Optional[int] = None
  cost_per: str = "token"
  draft_params_bytes: Optional[int] = None
  draft_cache_bytes_per_token: Optional[int] = None
  call_cost: Optional[float] = None
  measured_speedup: Optional[float] = None
  batch: Optional[int] = None
  temperature: Optional[float] = None

  def __post_init__(self):
    if not isinstance(self.family, str) or not self.family:
      raise TypeError(f"family must be a non-empty string, got {self.family!r}")
    f = self.family
    check_real(f"cost_ratio of {f!r}", self.cost_ratio, minimum=0.0)
    check_optional_real(f"alpha of {f!r}", self.alpha, minimum=0.0, maximum=1.0)
    check_optional_int(f"gamma of {f!r}", self.gamma, 1)
    check_optional_int(f"tree_nodes of {f!r}", self.tree_nodes, 1)
    if (self.gamma is None) == (self.tree_nodes is None):
      raise ValueError(f"exactly one of gamma and tree_nodes must be set for {f!r}, got "
                       f"gamma={self.gamma!r}, tree_nodes={self.tree_nodes!r}")
    if self.cost_per not in COST_PER:
      raise ValueError(f"cost_per of {f!r} must be one of {COST_PER}, got "
                       f"{self.cost_per!r}")
    if self.tree_nodes is not None and self.cost_per != "iteration":
      raise ValueError(f"cost_per of {f!r} must be 'iteration' for a tree / fixed-shape "
                       f"family (tree_nodes={self.tree_nodes}), got {self.cost_per!r}")
    if self.tau is not None:
      top = self.gamma + 1 if self.gamma is not None else self.tree_nodes + 1
      what = "gamma + 1" if self.gamma is not None else "tree_nodes + 1"
      check_real(f"tau of {f!r} (tokens per target call, in [1, {what} = {top}])", self.tau,
            minimum=1.0, maximum=float(top))
    if self.alpha is None and self.tau is None:
      raise ValueError(f"{f!r} needs alpha or tau (tokens per target call); both are None")
    if self.tree_nodes is not None and self.tau is None:
      raise ValueError(f"{f!r} has tree_nodes={self.tree_nodes} but no tau: a tree's tokens "
                       "per call must be measured (alpha alone does not give it)")
    check_optional_int(f"draft_params_bytes of {f!r}", self.draft_params_bytes, 0)
    check_optional_int(f"draft_cache_bytes_per_token of {f!r}", self.draft_cache_bytes_per_token, 0)
    check_optional_real(f"call_cost of {f!r}", self.call_cost, minimum=0.0, lo_open=True)
    check_optional_real(f"measured_speedup of {f!r}", self.measured_speedup, minimum=0.0,
                        lo_open=True)
    check_optional_int(f"batch of {f!r}", self.batch, 1)
    check_optional_real(f"temperature of {f!r}", self.temperature, minimum=0.0)

  @property
  def call_tokens(self) -> int:
    """Tokens in the verify call as measured: γ + 1, or the tree's nodes."""
    return self.gamma + 1 if self.gamma is not None else self.tree_nodes

  @property
  def searchable(self) -> bool:
    """Whether γ is searched: a chain with α known and c per drafted token."""
    return self.gamma is not None and self.alpha is not None and self.cost_per == "token"


@dataclasses.dataclass(frozen=True, eq=False)
class VerifyCost:
  """The cost of a target call on T tokens relative to a one-token step.

  Built from measured points {T: ratio} (at one batch size and cache length), read by
  piecewise-linear interpolation. V(1) = 1 by definition: added when missing, must be 1 when given.

  Measured ratios are noisy; with `monotone` (the default) the curve read is the least-squares
  non-decreasing fit of the points (pool-adjacent-violators, after lifting ratios below 1 to 1):
  a call on more tokens does at least the work of a call on fewer. `points` keeps the measured
  values; `curve` is what is read.

  Above the largest measured T: with `extrapolate` False (the default) `__call__` raises
  ValueError and `covers` is False, so `predict_speedup` searches only measured calls; with
  `extrapolate` True the line through the last two points is continued (never below the last
  ratio, so calls never get cheaper), and a single point extrapolates flat.

  Attributes:
    points: {T: ratio}, T an integer >= 1, ratio a finite number > 0.
    extrapolate, monotone: see above; batch: the points' batch size, if known.
  """

  points: Mapping[int, float]
  extrapolate: bool = False
  batch: Optional[int] = None
  monotone: bool = True

  def __post_init__(self):
    if not isinstance(self.points, Mapping) or not self.points:
      raise TypeError(f"points must be a non-empty mapping {{T: ratio}}, got {self.points!r}")
    pts = {}
    for t, r in self.points.items():
      t = check_int("points' T (tokens per call)", t, 1)
      pts[t] = check_real(f"points[{t}] (cost of a call on {t} tokens / a one-token step)", r,
                     minimum=0.0, lo_open=True)
    if 1 in pts and abs(pts[1] - 1.0) > 1e-6:
      raise ValueError(f"points[1] must be 1 (a one-token call relative to itself), got "
                       f"{pts[1]!r}; divide every ratio by it")
    pts[1] = 1.0
    for name in ("extrapolate", "monotone"):
      check_bool(name, getattr(self, name))
    check_optional_int("batch", self.batch, 1)
    pts = dict(sorted(pts.items()))
    object.__setattr__(self, "points", pts)
    ratios = list(pts.values())
    if self.monotone:
      ratios = _non_decreasing([max(r, 1.0) for r in ratios])
    object.__setattr__(self, "curve", dict(zip(pts, ratios)))

  @classmethod
  def flat(cls, batch: Optional[int] = None) -> "VerifyCost":
    """V(T) = 1 for every T: the paper's "verification is free" assumption."""
    return cls({1: 1.0}, extrapolate=True, batch=batch)

  @property
  def max_tokens(self) -> int:
    """The largest measured T."""
    return max(self.points)

  def covers(self, tokens: int) -> bool:
    """Whether V(tokens) is defined (measured range, or `extrapolate`)."""
    return self.extrapolate or 1 <= tokens <= self.max_tokens

  def __call__(self, tokens: int) -> float:
    t = check_int("tokens", tokens, 1)
    ts = np.array(list(self.curve), np.float64)
    rs = np.array(list(self.curve.values()), np.float64)
    if t <= ts[-1]:
      return float(np.interp(t, ts, rs))
    if not self.extrapolate:
      raise ValueError(
          f"tokens={t} is outside the measured verify-cost range T in [1, {int(ts[-1])}]; "
          "measure a call of that size or build the VerifyCost with extrapolate=True")
    if len(ts) == 1:
      return float(rs[-1])
    slope = (rs[-1] - rs[-2]) / (ts[-1] - ts[-2])
    return float(max(rs[-1], rs[-1] + slope * (t - ts[-1])))

  def as_dict(self) -> Dict[str, Any]:
    return {"points": dict(self.points), "curve": dict(self.curve),
            "extrapolate": self.extrapolate, "monotone": self.monotone, "batch": self.batch}


def _non_decreasing(values: Sequence[float]) -> List[float]:
  """The least-squares non-decreasing fit (pool adjacent violators, equal weights)."""
  blocks: List[List[float]] = []  # [mean, count]
  for v in values:
    blocks.append([float(v), 1.0])
    while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
      (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
      blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
  return [m for m, n in blocks for _ in range(int(n))]


# --- Outputs ---


@dataclasses.dataclass(frozen=True)
class Prediction:
  """One family's predicted speedup at its best setting (a table row).

  Attributes:
    family, speedup: the family's name; predicted walltime speedup over plain decoding.
    gamma / tree_nodes: the chosen γ (chains) or the tree / fixed call size; the other None.
    call_tokens: tokens in the verify call (γ + 1 or tree_nodes).
    tau: tokens per target call used (measured or from α).
    draft_cost: draft cost per iteration, in target steps; verify_cost: V(call_tokens) used.
    alpha_used: the α behind τ for a searched chain (see `predict_speedup`), else None.
    searched: whether γ was searched; per_gamma: {γ: predicted speedup} when it was.
    measured_speedup: the measured speedup of the measured configuration.
    memory_bytes: the draft's memory at the pick's batch and length (None: unknown / not computed).
    fits: whether it fits the memory budget (None when memory is unknown).
  """

  family: str
  speedup: float
  gamma: Optional[int]
  tree_nodes: Optional[int]
  call_tokens: int
  tau: float
  draft_cost: float
  verify_cost: float
  alpha_used: Optional[float] = None
  searched: bool = False
  per_gamma: Mapping[int, float] = dataclasses.field(default_factory=dict)
  measured_speedup: Optional[float] = None
  memory_bytes: Optional[int] = None
  fits: Optional[bool] = None

  @property
  def setting(self) -> str:
    """"γ=4" for a chain, "T=16" for a tree / fixed call of 16 tokens."""
    return f"γ={self.gamma}" if self.gamma is not None else f"T={self.tree_nodes}"


@dataclasses.dataclass(frozen=True)
class Recommendation:
  """The picker's answer.

  Attributes:
    family: the recommended family, or None for "don't speculate".
    gamma / tree_nodes: its γ (a chain) or its tree / call size; the other None.
    speedup: the predicted speedup (1.0 when not speculating).
    reason: why, in a sentence; numbers: the inputs and intermediate numbers it rests on.
    table: every family's `Prediction`, best first; those over the memory budget last.
  """

  family: Optional[str]
  gamma: Optional[int]
  tree_nodes: Optional[int]
  speedup: float
  reason: str
  numbers: Dict[str, Any]
  table: Tuple[Prediction, ...]

  @property
  def speculate(self) -> bool:
    return self.family is not None

  def format(self) -> str:
    """The recommendation and the table as text."""
    if self.speculate:
      setting = self.table[0].setting if self.table else ""
      head = f"recommend: {self.family} ({setting}), predicted speedup {self.speedup:.2f}x"
    else:
      head = "recommend: don't speculate (plain decoding)"
    lines = [head, f"reason: {self.reason}", "",
             f"{'family':<18} {'setting':<9} {'pred':>6} {'meas':>6} {'tau':>5} "
             f"{'draft':>6} {'V(T)':>6} {'T':>4} {'memory':>10} {'fits':>5}"]
    for p in self.table:
      meas = "-" if p.measured_speedup is None else f"{p.measured_speedup:.2f}x"
      mem = "?" if p.memory_bytes is None else _bytes(p.memory_bytes)
      fits = "?" if p.fits is None else ("yes" if p.fits else "NO")
      lines.append(f"{p.family:<18} {p.setting:<9} {p.speedup:>5.2f}x {meas:>6} {p.tau:>5.2f} "
                   f"{p.draft_cost:>6.3f} {p.verify_cost:>6.3f} {p.call_tokens:>4} {mem:>10} "
                   f"{fits:>5}")
    lines += ["", "numbers: " + json.dumps(self.numbers, default=str)]
    return "\n".join(lines)


def _bytes(n: int) -> str:
  for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= size:
      return f"{n / size:.1f} {unit}"
  return f"{n} B"


# --- Prediction ---


def predict_speedup(m: FamilyMeasurement, verify_cost: VerifyCost, *, max_gamma: int = 32,
                    calibrate_alpha: bool = True) -> Prediction:
  """A family's predicted speedup: τ / (draft cost per iteration + V(T)).

  A `m.searchable` chain is evaluated at every γ in 1..max_gamma whose V(γ + 1) `verify_cost`
  covers (plus its measured γ when `m.call_cost` prices that call), with τ(γ) =
  `theory.expected_tokens_per_call(α, γ)` and draft cost γ·c; the best γ wins (the smallest on
  ties; with V ≡ 1 it is `theory.optimal_gamma(α, c, max_gamma)`).

  With τ measured too and `calibrate_alpha`, α is `theory.alpha_for_tokens(τ, γ_measured)`, the
  i.i.d. α reproducing the measured τ (acceptances are correlated, so the raw α mispredicts τ),
  and the measured τ is used as is at the measured γ.

  Any other family keeps its measured call: τ measured (or from α at the measured γ), draft cost
  c per iteration (γ·c when per token), V(call) = `m.call_cost` or the curve.

  Args:
    m: the family's measurement.
    verify_cost: V(T) at the batch in question.
    max_gamma: the largest γ searched (an integer >= 1).
    calibrate_alpha: fit α to the measured τ (see above).

  Returns: the `Prediction` (memory fields unset).
  """
  if not isinstance(m, FamilyMeasurement):
    raise TypeError(f"m must be a FamilyMeasurement, got {type(m).__name__}")
  if not isinstance(verify_cost, VerifyCost):
    raise TypeError(f"verify_cost must be a VerifyCost, got {type(verify_cost).__name__}")
  max_gamma = check_int("max_gamma", max_gamma, 1)

  def v_at(tokens: int) -> Optional[float]:
    if m.call_cost is not None and tokens == m.call_tokens:
      return m.call_cost
    return verify_cost(tokens) if verify_cost.covers(tokens) else None

  if m.searchable:
    alpha = m.alpha
    if m.tau is not None and calibrate_alpha:
      alpha = float(theory.alpha_for_tokens(m.tau, m.gamma))
    gammas, costs = [], []
    for g in range(1, max(max_gamma, m.gamma) + 1):
      v = v_at(g + 1)
      if v is not None and (g <= max_gamma or g == m.gamma):
        gammas.append(g)
        costs.append(v)
    if not gammas:
      raise ValueError(
          f"verify_cost covers no call of {m.family!r}: it is measured for T in [1, "
          f"{verify_cost.max_tokens}] and the chain needs T = γ + 1 >= 2; measure larger "
          "calls or pass extrapolate=True")
    g_arr = np.array(gammas, np.int64)
    tau = np.asarray(theory.expected_tokens_per_call(alpha, g_arr), np.float64)
    if m.tau is not None and calibrate_alpha:  # exact at the measured γ (no bisection error)
      tau = np.where(g_arr == m.gamma, m.tau, tau)
    speedups = np.asarray(theory.walltime_improvement_from_tokens(
        tau, g_arr, m.cost_ratio, np.array(costs)), np.float64)
    i = int(np.argmax(speedups))
    g = gammas[i]
    return Prediction(
        family=m.family, speedup=float(speedups[i]), gamma=g, tree_nodes=None,
        call_tokens=g + 1, tau=float(tau[i]), draft_cost=g * m.cost_ratio,
        verify_cost=float(costs[i]), alpha_used=float(alpha), searched=True,
        per_gamma={gg: float(s) for gg, s in zip(gammas, speedups)},
        measured_speedup=m.measured_speedup)

  t = m.call_tokens
  v = v_at(t)
  if v is None:
    raise ValueError(
        f"verify_cost does not cover {m.family!r}'s call of T={t} tokens (measured for T in "
        f"[1, {verify_cost.max_tokens}]); give the family's call_cost, measure that call or "
        "pass extrapolate=True")
  tau = m.tau if m.tau is not None else float(theory.expected_tokens_per_call(m.alpha, m.gamma))
  draft = m.cost_ratio * (m.gamma if m.cost_per == "token" else 1)
  return Prediction(
      family=m.family, speedup=tau / (draft + v), gamma=m.gamma, tree_nodes=m.tree_nodes,
      call_tokens=t, tau=tau, draft_cost=draft, verify_cost=v,
      measured_speedup=m.measured_speedup)


def draft_memory_bytes(m: FamilyMeasurement, *, batch_size: int, tokens: int) -> Optional[int]:
  """Draft params + cache bytes per token × `tokens` (positions per sequence the draft caches:
  context + new) × `batch_size` (>= 1); None if unknown."""
  batch_size = check_int("batch_size", batch_size, 1)
  tokens = check_int("tokens", tokens, 0)
  if m.draft_params_bytes is None or m.draft_cache_bytes_per_token is None:
    return None
  return m.draft_params_bytes + m.draft_cache_bytes_per_token * tokens * batch_size


def pick(measurements: Sequence[FamilyMeasurement], verify_cost: VerifyCost, *,
         batch_size: int, memory_budget_bytes: Optional[float], context_tokens: int,
         max_new_tokens: int, temperature: Optional[float] = None,
         min_speedup: float = 1.05, min_new_tokens: int = 50, max_gamma: int = 32,
         calibrate_alpha: bool = True, require_known_memory: bool = False) -> Recommendation:
  """Recommends a drafter family and γ / tree size, or "don't speculate".

  Each family is predicted by `predict_speedup`; those whose `draft_memory_bytes` (at
  `batch_size`, context + max_new positions) exceed the budget are excluded; the fastest of the
  rest is recommended if it reaches `min_speedup` (the reasons not to: the module doc).

  Args:
    measurements: one `FamilyMeasurement` per family (distinct names), measured at this batch
      size and temperature (checked where they say).
    verify_cost: V(T) measured at this batch size.
    batch_size: sequences decoded together, >= 1.
    memory_budget_bytes: bytes available for the draft (params + cache), or None: no limit.
    context_tokens: prompt positions per sequence, >= 0.
    max_new_tokens: tokens to generate per sequence, >= 1.
    temperature: the sampling temperature (checked against the measurements'), or None.
    min_speedup: the least predicted speedup worth speculating for, > 0.
    min_new_tokens: shorter outputs are not worth speculating (compile / prefill dominate), >= 0.
    max_gamma: the largest γ searched for chains.
    calibrate_alpha: see `predict_speedup`.
    require_known_memory: exclude families whose memory is unknown (default: keep, marked "?").

  Returns: the `Recommendation`.
  """
  if isinstance(measurements, (FamilyMeasurement, str, bytes)) or not isinstance(
      measurements, Sequence):
    raise TypeError("measurements must be a sequence of FamilyMeasurement, got "
                    f"{type(measurements).__name__}")
  if not measurements:
    raise ValueError("measurements must hold at least one FamilyMeasurement, got none")
  names = set()
  for i, m in enumerate(measurements):
    if not isinstance(m, FamilyMeasurement):
      raise TypeError(f"measurements[{i}] must be a FamilyMeasurement, got "
                      f"{type(m).__name__}")
    if m.family in names:
      raise ValueError(f"measurements name the family {m.family!r} twice; give one each")
    names.add(m.family)
  if not isinstance(verify_cost, VerifyCost):
    raise TypeError(f"verify_cost must be a VerifyCost, got {type(verify_cost).__name__}")
  batch_size = check_int("batch_size", batch_size, 1)
  budget = check_optional_real("memory_budget_bytes", memory_budget_bytes, minimum=0.0)
  context_tokens = check_int("context_tokens", context_tokens, 0)
  max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
  temperature = check_optional_real("temperature", temperature, minimum=0.0)
  min_speedup = check_real("min_speedup", min_speedup, minimum=0.0, lo_open=True)
  min_new_tokens = check_int("min_new_tokens", min_new_tokens, 0)
  for m in measurements:
    if m.batch is not None and m.batch != batch_size:
      raise ValueError(f"{m.family!r} was measured at batch {m.batch}, but batch_size is "
                       f"{batch_size}; use measurements taken at batch {batch_size}")
    if (temperature is not None and m.temperature is not None
        and abs(m.temperature - temperature) > 1e-9):
      raise ValueError(f"{m.family!r} was measured at temperature {m.temperature}, but "
                       f"temperature is {temperature}; use measurements at {temperature}")
  if verify_cost.batch is not None and verify_cost.batch != batch_size:
    raise ValueError(f"verify_cost was measured at batch {verify_cost.batch}, but batch_size "
                     f"is {batch_size}")

  positions = context_tokens + max_new_tokens
  rows = []
  for m in measurements:
    p = predict_speedup(m, verify_cost, max_gamma=max_gamma, calibrate_alpha=calibrate_alpha)
    mem = draft_memory_bytes(m, batch_size=batch_size, tokens=positions)
    if mem is None:
      fits = False if (require_known_memory and budget is not None) else None
    else:
      fits = budget is None or mem <= budget
    rows.append((m, dataclasses.replace(p, memory_bytes=mem, fits=fits)))
  ok = [(m, p) for m, p in rows if p.fits is not False]
  ok.sort(key=lambda r: -r[1].speedup)
  excluded = sorted([r for r in rows if r[1].fits is False], key=lambda r: -r[1].speedup)
  table = tuple(p for _, p in ok + excluded)

  numbers: Dict[str, Any] = {
      "batch_size": batch_size, "context_tokens": context_tokens,
      "max_new_tokens": max_new_tokens, "temperature": temperature,
      "memory_budget_bytes": budget, "min_speedup": min_speedup,
      "min_new_tokens": min_new_tokens, "verify_cost": verify_cost.as_dict(),
      "excluded_by_memory": [p.family for _, p in excluded]}

  def no(reason: str, **extra) -> Recommendation:
    numbers.update(extra)
    return Recommendation(None, None, None, 1.0, reason, numbers, table)

  if max_new_tokens < min_new_tokens:
    return no(f"outputs of {max_new_tokens} tokens are shorter than {min_new_tokens}: the "
              "draft's compilation and prefill overhead dominates what speculation can win "
              "back on so few tokens")
  if not ok:
    known = [p.memory_bytes for _, p in excluded if p.memory_bytes is not None]
    least = _bytes(min(known)) if known else "an unknown amount"
    return no(f"no family fits the memory budget of {_bytes(int(budget))} at batch "
              f"{batch_size} with {positions} positions per sequence (the smallest needs "
              f"{least})")
  m_best, best = ok[0]
  if best.speedup < min_speedup:
    free = [(m, predict_speedup(dataclasses.replace(m, call_cost=None), VerifyCost.flat(),
                                max_gamma=max_gamma, calibrate_alpha=calibrate_alpha))
            for m, _ in ok]
    m_free, p_free = max(free, key=lambda r: r[1].speedup)
    if p_free.speedup >= min_speedup:
      return no(
          f"verification is not free at batch {batch_size}: {p_free.family} would reach "
          f"{p_free.speedup:.2f}x ({p_free.setting}) if a call on {p_free.call_tokens} tokens "
          f"cost one step, but at the measured verify cost the best, {best.family} "
          f"({best.setting}, V({best.call_tokens}) = {best.verify_cost:.2f}), reaches "
          f"{best.speedup:.2f}x < {min_speedup:.2f}x",
          best_family=best.family, best_speedup=best.speedup,
          free_verification_best_family=p_free.family,
          free_verification_best_speedup=p_free.speedup)
    return no(f"no family is predicted to reach {min_speedup:.2f}x: the best, "
              f"{best.family} ({best.setting}), reaches {best.speedup:.2f}x",
              best_family=best.family, best_speedup=best.speedup)

  numbers.update({
      "family": best.family, "gamma": best.gamma, "tree_nodes": best.tree_nodes,
      "predicted_speedup": best.speedup, "tau": best.tau, "alpha": m_best.alpha,
      "alpha_used": best.alpha_used, "cost_ratio": m_best.cost_ratio,
      "cost_per": m_best.cost_per, "draft_cost": best.draft_cost,
      "verify_cost_at_call": best.verify_cost, "call_tokens": best.call_tokens,
      "memory_bytes": best.memory_bytes, "measured_speedup": best.measured_speedup,
      "measured_gamma": m_best.gamma})
  runner = f"; runner-up {ok[1][1].family} {ok[1][1].speedup:.2f}x" if len(ok) > 1 else ""
  reason = (f"{best.family} ({best.setting}) is predicted fastest: τ {best.tau:.2f} tokens per "
            f"call for {best.draft_cost:.2f} + {best.verify_cost:.2f} target steps = "
            f"{best.speedup:.2f}x{runner}")
  if excluded:
    reason += f"; excluded by memory: {', '.join(p.family for _, p in excluded)}"
  return Recommendation(best.family, best.gamma, best.tree_nodes, best.speedup, reason,
                        numbers, table)
