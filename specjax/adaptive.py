"""Adaptive γ inside the jitted loop: each iteration picks its draft length.

`speculative_generate(..., gamma="auto")` decodes with an `AdaptiveGamma`: a small static set Γ
of draft lengths (default {0, 1, 2, 4, 8}; 0 is a plain target step), one branch compiled per γ,
selected per iteration by `lax.switch` in the same `lax.while_loop` over the same cache buffers
(sized for max Γ): no fixed γ is right for every pair, prompt and machine. Each iteration
maximises expected tokens per unit of time:

    score(γ) = 1 / (c(γ) · max_b n_b / E_b(γ))   (objective "finish"), or
    score(γ) = Σ_b E_b(γ) / c(γ)                  (objective "throughput"),
    E_b(γ) = 1 + a_b (1 − r_b^k) / (1 − r_b),   k = min(γ, room_b)

c(γ) the measured time of one iteration at γ (`specjax.calibration`), n_b the tokens row b has
left, room_b the drafts it can offer, a_b / r_b its running estimates that its first draft, and
a draft after an accepted one, are accepted (with a_b = r_b = α, Leviathan et al.'s model).

Exactness: the γ of iteration i (and each row's valid drafts) is a function of the state before
it, never of its random numbers, so every iteration is an ordinary exact speculative iteration
and the output has the target's law; greedy output equals plain greedy decoding's. The rule,
the estimate, retries, probes and batch objectives: docs/adaptive.md.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax._checks import (check_bool, check_int, check_probability, check_real,
                             check_real_array)

__all__ = ["BATCH_OBJECTIVES", "AdaptiveGamma", "AdaptState", "Acceptance", "DEFAULT_GAMMAS",
           "expected_tokens", "choose", "observe", "idle_block", "estimated_alpha", "may_draft",
           "prior_may_draft", "probe_due", "after_idle", "retry_wait", "steps_to_retry"]

DEFAULT_GAMMAS: Tuple[int, ...] = (0, 1, 2, 4, 8)
BATCH_OBJECTIVES: Tuple[str, ...] = ("finish", "throughput")


@dataclasses.dataclass(frozen=True)
class AdaptiveGamma:
  """How `gamma="auto"` chooses γ (static: a jit argument).

  Attributes:
    gammas: Γ, the draft lengths to choose from (distinct ints >= 0, at least one > 0; 0 = a
      plain target step). One branch is compiled per value; caches are sized for the largest.
    decay: forgetting of the acceptance estimate per drafting iteration, in [0, 1): about the
      last 1 / (1 - decay) such iterations count.
    idle_decay: the forgetting per iteration in which the row drafted nothing (how soon it
      tries drafting again).
    slow_decay, slow_idle_decay: the forgetting of the row's long-run first-draft rate (the
      prior its estimate drifts back to) per drafting and per non-drafting iteration. Carried
      across calls (`Acceptance.long_run_2`).
    prior_alpha, prior_weight: the estimate before any evidence: prior_alpha in (0, 1)
      weighted as prior_weight >= 0 pseudo-trials; the same weight pulls the row's short-term
      estimate toward its long-run rate.
    per_row: each row drafts its own γ (the call is as long as the longest), so a row's tokens
      do not depend on the other rows; False: one γ for the batch.
    plain_block: while γ = 0 the loop revisits its choice after this many plain steps (the
      idle decay applied for the whole block).
    switch_margin: batch mode keeps the current γ unless another scores this much better
      (relative; a change of γ copies the caches once; 0: always the best). Plain steps are
      taken as soon as they score better.
    explore_below, explore_steps: with a carried estimate (`acceptance=`), a row whose decayed
      count of first-draft observations is below `explore_below` probes: it drafts (at least
      one token) in its next `explore_steps` iterations.
    retry_budget: a row that stopped drafting (a drafter without previews) retries one draft
      after (c(γ₁) − c(0)) / (retry_budget · c(0)) plain steps, the wait doubling after each
      rejected retry: at most this share of a plain step's time goes to retries. 0: no retries.
    batch_objective: how batch mode scores a γ: "finish" (the time the call needs to end, set
      by its slowest row) or "throughput" (the rows' expected tokens summed).
  """

  gammas: Tuple[int, ...] = DEFAULT_GAMMAS
  decay: float = 0.8
  idle_decay: float = 0.97
  slow_decay: float = 0.98
  slow_idle_decay: float = 0.995
  prior_alpha: float = 0.5
  prior_weight: float = 6.0
  per_row: bool = False
  plain_block: int = 8
  switch_margin: float = 0.1
  explore_below: float = 1e-4
  explore_steps: int = 4
  retry_budget: float = 0.05
  batch_objective: str = "finish"

  def __post_init__(self):
    g = self.gammas
    if isinstance(g, (str, bytes)) or not isinstance(g, Sequence) or len(g) == 0:
      raise ValueError(f"gammas must be a non-empty sequence of ints >= 0 (Γ, e.g. "
                       f"{DEFAULT_GAMMAS}), got {g!r}")
    vals = tuple(check_int("gammas[" + str(i) + "]", v, 0) for i, v in enumerate(g))
    if len(set(vals)) != len(vals):
      raise ValueError(f"gammas must be distinct, got {g!r}")
    if max(vals) == 0:
      raise ValueError(f"gammas must hold at least one γ > 0 (only 0 is plain decoding), "
                       f"got {g!r}")
    object.__setattr__(self, "gammas", tuple(sorted(vals)))
    for f, top in (("decay", 1), ("idle_decay", 1), ("slow_decay", 1), ("slow_idle_decay", 1),
                   ("prior_weight", 1e6), ("switch_margin", 10), ("explore_below", 1),
                   ("retry_budget", 1)):
      object.__setattr__(self, f, check_real(f, getattr(self, f), 0.0, top, hi_open=True))
    object.__setattr__(self, "prior_alpha", check_probability(
        "prior_alpha", self.prior_alpha, lo_open=True, hi_open=True))
    object.__setattr__(self, "per_row", check_bool("per_row", self.per_row))
    check_int("plain_block", self.plain_block, 1)
    check_int("explore_steps", self.explore_steps, 1)
    if self.batch_objective not in BATCH_OBJECTIVES:
      raise ValueError(f"batch_objective must be one of {BATCH_OBJECTIVES}, got "
                       f"{self.batch_objective!r}")

  @property
  def max_gamma(self) -> int:
    return self.gammas[-1]

  @property
  def first_drafting(self) -> int:
    """The index into Γ of its smallest γ > 0 (a probe's or a retry's call)."""
    return next(i for i, g in enumerate(self.gammas) if g > 0)

  @functools.lru_cache(maxsize=256)
  def limited_to(self, useful: int) -> "AdaptiveGamma":
    """Γ without the values above `useful` (the drafts `max_new_tokens` can use), keeping at
    least one γ > 0."""
    kept = tuple(g for g in self.gammas if g <= useful)
    if max(kept, default=0) == 0:
      kept = tuple(g for g in self.gammas if g == 0) + (max(1, useful),)
    return dataclasses.replace(self, gammas=kept)

  @functools.lru_cache(maxsize=256)
  def capped_at(self, limit: int) -> "AdaptiveGamma":
    """Γ with every value above `limit` (>= 1: the most a drafter drafts) replaced by it."""
    limit = check_int("limit", limit, 1)
    return dataclasses.replace(self, gammas=tuple(sorted({min(g, limit) for g in self.gammas})))

  def costs_of(self, kept: "AdaptiveGamma", costs) -> Tuple[float, ...]:
    """This Γ's `costs` for `kept`'s Γ (`limited_to`, `capped_at`); a γ not in this Γ gets the
    cost of the next larger γ (or of the largest)."""
    c = check_costs(self, costs)
    def cost(g):
      above = [i for i, h in enumerate(self.gammas) if h >= g]
      return float(c[above[0] if above else len(self.gammas) - 1])
    return tuple(cost(g) for g in kept.gammas)


@struct.dataclass
class AdaptState:
  """The loop's running estimate, its next choice and its record.

  accepted_B2, rejected_B2: float32 `[B, 2]` decayed counts of accepted and rejected drafts,
  first drafts in column 0, later ones in 1; branch: int32 `[]` the index into Γ of the next
  iteration; limit_B: int32 `[B]` each row's valid drafts in the next iteration; trace_I: int32
  `[I]` the γ of each iteration's call (-1 past the last); trace_BI: int32 `[B, I]` in per-row
  mode (`AdaptiveGamma.per_row`, else None): the valid drafts row b chose in iteration i (its
  own γ; 0: a plain step), -1 where the row was no longer active or past the last; synced_B: int32 `[B]` stream positions a
  drafter that `catches_up` holds; peek_B: int32 `[B]` for a drafter that `offers_room`, the
  previewed draft right after the row's valid ones (-1: none), which `observe` compares with
  the target's token; probe_B: int32 `[B]` drafting iterations left in the row's probe;
  slow_B2: float32 `[B, 2]` the long-run first-draft counts (accepted, rejected; None: the
  prior alone); idle_B: int32 `[B]` iterations since the row last drafted (-1: not in this
  call); backoff_B: int32 `[B]` retries rejected since the row's last accepted first draft
  (each doubles its wait).
  """

  accepted_B2: jax.Array
  rejected_B2: jax.Array
  branch: jax.Array
  limit_B: jax.Array
  trace_I: jax.Array
  synced_B: jax.Array
  peek_B: jax.Array
  probe_B: jax.Array
  slow_B2: Optional[jax.Array] = None
  idle_B: Optional[jax.Array] = None
  backoff_B: Optional[jax.Array] = None
  trace_BI: Optional[jax.Array] = None
  # Static: the estimate is carried across calls (rows without evidence probe).
  explore: bool = struct.field(pytree_node=False, default=False)
  # Static: rows that stopped drafting retry (set for drafters without previews).
  retries: bool = struct.field(pytree_node=False, default=False)

  @classmethod
  def zeros(cls, batch: int, iterations: int, start: Optional["Acceptance"] = None,
            retries: bool = False, per_row: bool = False) -> "AdaptState":
    """No evidence (the prior), or every row at a carried `start` (`explore` then set);
    `per_row`: keep each row's own trace (`trace_BI`)."""
    z = jnp.zeros((batch, 2), jnp.float32)
    acc, rej = z, z
    if start is not None:
      acc = jnp.broadcast_to(jnp.asarray(start.accepted_2, jnp.float32), (batch, 2))
      rej = jnp.broadcast_to(jnp.asarray(start.rejected_2, jnp.float32), (batch, 2))
    zi = jnp.zeros((batch,), jnp.int32)
    trace = jnp.full((iterations,), -1, jnp.int32)
    slow = jnp.stack([acc[:, 0], rej[:, 0]], axis=1)
    if start is not None and start.long_run_2 is not None:
      slow = jnp.broadcast_to(jnp.asarray(start.long_run_2, jnp.float32), (batch, 2))
    rows = jnp.full((batch, iterations), -1, jnp.int32) if per_row else None
    return cls(acc, rej, jnp.zeros((), jnp.int32), zi, trace, zi,
               jnp.full((batch,), -1, jnp.int32), zi, slow, zi - 1, zi, rows,
               explore=start is not None, retries=retries)

  def gamma_trace(self) -> jax.Array:
    """What `DecodeStats.gamma_trace` reports: each row's trace (`trace_BI`) in per-row mode,
    else the call's (`trace_I`)."""
    return self.trace_I if self.trace_BI is None else self.trace_BI

  def pooled(self) -> "Acceptance":
    """What this call learned, for the next (`Acceptance`): the rows' counts averaged."""
    return Acceptance(jnp.mean(self.accepted_B2, axis=0), jnp.mean(self.rejected_B2, axis=0),
                      None if self.slow_B2 is None else jnp.mean(self.slow_B2, axis=0))


@struct.dataclass
class Acceptance:
  """A pair's acceptance estimate carried from call to call
  (`speculative_generate(gamma="auto", acceptance=...)`, returned as `out.stats.acceptance`).

  accepted_2, rejected_2: float32 `[2]` decayed counts of accepted and rejected drafts (first,
  later: `AdaptState`'s columns), averaged over the call's rows; long_run_2: float32 `[2]` the
  rows' long-run first-draft counts (`AdaptState.slow_B2`), averaged (None: the first drafts'
  counts). `Acceptance.fresh()` starts a series: no evidence, so the first call probes.
  """

  accepted_2: jax.Array
  rejected_2: jax.Array
  long_run_2: Optional[jax.Array] = None

  @classmethod
  def fresh(cls) -> "Acceptance":
    z = np.zeros((2,), np.float32)
    return cls(z, z.copy(), z.copy())

  def evidence(self) -> float:
    """The decayed number of first-draft observations (host)."""
    return float(np.asarray(self.accepted_2)[0] + np.asarray(self.rejected_2)[0])


def check_acceptance(acceptance) -> Acceptance:
  """`acceptance` with float32 numpy `[2]` counts, or a clear error."""
  if not isinstance(acceptance, Acceptance):
    raise TypeError(f"acceptance must be a specjax.Acceptance (out.stats.acceptance of an "
                    f"earlier gamma='auto' call, or Acceptance.fresh()), got {acceptance!r}")
  acc = np.asarray(acceptance.accepted_2, np.float32)
  rej = np.asarray(acceptance.rejected_2, np.float32)
  long = (np.stack([acc[0], rej[0]]) if acceptance.long_run_2 is None
          else np.asarray(acceptance.long_run_2, np.float32))
  for name, v in (("accepted_2", acc), ("rejected_2", rej), ("long_run_2", long)):
    if v.shape != (2,) or not np.all(np.isfinite(v)) or np.any(v < 0):
      raise ValueError(f"acceptance.{name} must be 2 finite counts >= 0, got {v!r}")
  return Acceptance(acc, rej, long)


def probe_due(cfg: AdaptiveGamma, acceptance: Acceptance, steps: int) -> bool:
  """Whether a carried estimate's rows probe within `steps` plain steps (host)."""
  return acceptance.evidence() * cfg.idle_decay ** steps < cfg.explore_below


def after_idle(cfg: AdaptiveGamma, acceptance: Acceptance, steps_B: jax.Array) -> Acceptance:
  """The carried estimate after each row ran `steps_B` plain steps (the idle decay), averaged
  over the rows."""
  long = acceptance.long_run_2
  if long is None:
    long = jnp.stack([jnp.asarray(acceptance.accepted_2)[0], jnp.asarray(acceptance.rejected_2)[0]])
  d = jnp.mean(jnp.power(jnp.float32(cfg.idle_decay), steps_B.astype(jnp.float32)))
  ds = jnp.mean(jnp.power(jnp.float32(cfg.slow_idle_decay), steps_B.astype(jnp.float32)))
  return Acceptance(jnp.asarray(acceptance.accepted_2, jnp.float32) * d,
                    jnp.asarray(acceptance.rejected_2, jnp.float32) * d,
                    jnp.asarray(long, jnp.float32) * ds)


def estimated_alpha(cfg: AdaptiveGamma, st: AdaptState) -> jax.Array:
  """`[B, 2]` per-row acceptance estimates: of the first draft (a_b) and of a draft after an
  accepted one (r_b) (docs/adaptive.md)."""
  xp = _xp(st.accepted_B2)
  m = cfg.prior_weight
  acc, rej = st.accepted_B2, st.rejected_B2
  p_B1 = long_run_alpha(cfg, st)
  a_B1 = (acc[:, :1] + p_B1 * m) / xp.maximum(acc[:, :1] + rej[:, :1] + m, 1e-6)
  r_B1 = (acc[:, 1:] + a_B1 * m) / xp.maximum(acc[:, 1:] + rej[:, 1:] + m, 1e-6)
  return xp.clip(xp.concatenate([a_B1, r_B1], axis=1), 0.0, 0.999)


def long_run_alpha(cfg: AdaptiveGamma, st: AdaptState) -> jax.Array:
  """`[B, 1]` each row's long-run first-draft rate (`prior_alpha` without slow counts)."""
  xp = _xp(st.accepted_B2)
  if st.slow_B2 is None:
    return xp.full((st.accepted_B2.shape[0], 1), cfg.prior_alpha, xp.float32)
  m = cfg.prior_weight
  return ((st.slow_B2[:, :1] + cfg.prior_alpha * m)
          / xp.maximum(st.slow_B2[:, :1] + st.slow_B2[:, 1:] + m, 1e-6))


def _xp(x):
  """numpy for host arrays (the API's one-row decisions: no dispatch), else jax.numpy."""
  return np if isinstance(x, np.ndarray) else jnp


def expected_tokens(alpha_B2: jax.Array, k_BG: jax.Array) -> jax.Array:
  """E[tokens committed] of an iteration proposing k drafts: 1 + a (1 − r^k) / (1 − r), with
  a = alpha_B2[:, 0] (the first draft's acceptance) and r = alpha_B2[:, 1] (a later draft's,
  given the one before); a = r = α gives (1 − α^(k+1)) / (1 − α) (Leviathan et al. 2023, eq. 1)."""
  a, r = alpha_B2[:, :1], alpha_B2[:, 1:]
  return 1.0 + a * (1.0 - r ** k_BG.astype(np.float32)) / (1.0 - r)


def choose(cfg: AdaptiveGamma, st: AdaptState, costs_G: jax.Array, active_B: jax.Array,
           room_B: Optional[jax.Array] = None,
           left_B: Optional[jax.Array] = None) -> Tuple[jax.Array, jax.Array]:
  """(branch, limit_B): the index into Γ of this iteration's call and each row's number of
  valid drafts (0: the row proposes nothing).

  `costs_G`: seconds (or any unit) per iteration at each γ of Γ; `room_B`: drafts each row can
  offer (None: max Γ); `left_B`: tokens each row may still generate, for the "finish"
  objective (None: as many for every row)."""
  gam_G = jnp.asarray(cfg.gammas, jnp.int32)
  b = active_B.shape[0]
  room_B = jnp.full((b,), cfg.max_gamma, jnp.int32) if room_B is None else room_B
  k_BG = jnp.minimum(gam_G[None], room_B[:, None])
  e_BG = expected_tokens(estimated_alpha(cfg, st), k_BG)
  costs_G = jnp.asarray(costs_G, jnp.float32)
  own_B = jnp.argmax(e_BG / costs_G[None], axis=1)           # ties: the smaller γ
  own_gamma_B = jnp.take_along_axis(k_BG, own_B[:, None], axis=1)[:, 0]
  probe_B = jnp.zeros_like(active_B)
  if st.explore:   # rows without evidence draft to find out
    probe_B = active_B & (room_B > 0) & (_fresh(cfg, st) | (st.probe_B > 0))
  if st.retries:   # rows that stopped drafting try one draft again (module doc)
    due_B = active_B & (room_B > 0) & _retry_due(cfg, st, costs_G)
    if _retry_together(cfg):   # a batch's retry: once every row that drafted is due
      due_B = due_B & jnp.all(due_B | ~(active_B & (room_B > 0) & (st.idle_B >= 0)))
    probe_B = probe_B | due_B
  own_gamma_B = jnp.where(probe_B & (own_gamma_B == 0), 1, own_gamma_B)
  if cfg.per_row:
    limit_B = jnp.where(active_B, own_gamma_B, 0)
    want_G = gam_G[None] >= limit_B[:, None]
    # The shortest call that holds every row's own drafts.
    branch = jnp.argmax(jnp.all(want_G, axis=0))
    return branch.astype(jnp.int32), limit_B.astype(jnp.int32)
  # A drafting call verifies every row's drafts anyway: each active row sends its own.
  if cfg.batch_objective == "throughput":
    score_G = jnp.sum(e_BG * active_B[:, None], axis=0) / costs_G
  else:   # 1 / (the time to finish at γ): c(γ) · max over active rows of n_b / E_b(γ)
    n_B = jnp.ones((b,), jnp.float32) if left_B is None else \
        jnp.maximum(left_B, 1).astype(jnp.float32)
    iters_G = jnp.max(jnp.where(active_B[:, None], n_B[:, None] / e_BG, 0.0), axis=0)
    score_G = 1.0 / jnp.maximum(costs_G * iters_G, 1e-30)
  branch = jnp.argmax(score_G).astype(jnp.int32)
  # Hysteresis: leaving the current γ copies the caches; plain steps are taken as soon as they
  # score better (a margin there would keep a batch drafting at a loss).
  stay = ((score_G[branch] <= score_G[st.branch] * (1.0 + cfg.switch_margin))
          & ~((gam_G[branch] == 0) & (score_G[branch] > score_G[st.branch])))
  branch = jnp.where(stay, st.branch, branch)
  branch = jnp.where(jnp.any(probe_B) & (gam_G[branch] == 0), cfg.first_drafting,
                     branch).astype(jnp.int32)
  limit_B = jnp.where(active_B, jnp.take(k_BG, branch, axis=1), 0)
  return branch, limit_B.astype(jnp.int32)


_MAX_BACKOFF = 20   # 2^20 waits: no more retries within any call
_NEVER = 2 ** 30     # steps_to_retry where no retry falls due


def retry_wait(cfg: AdaptiveGamma, costs_G: jax.Array) -> jax.Array:
  """float32 `[]`: the plain steps before a stopped row's first retry, (c(γ₁) − c(0)) /
  (retry_budget · c(0)), at least 1 (infinite without a γ = 0 in Γ or without a budget)."""
  if 0 not in cfg.gammas or cfg.retry_budget == 0:
    return jnp.float32(np.inf)
  i0, i1 = cfg.gammas.index(0), cfg.first_drafting
  c_G = jnp.asarray(costs_G, jnp.float32)
  return jnp.maximum((c_G[i1] - c_G[i0]) / (cfg.retry_budget * c_G[i0]), 1.0)


def _retry_wait_B(cfg: AdaptiveGamma, st: AdaptState, costs_G: jax.Array) -> jax.Array:
  """float32 `[B]`: each row's wait in whole steps (cost rounding does not add a step)."""
  wait_B = retry_wait(cfg, costs_G) * jnp.exp2(st.backoff_B.astype(jnp.float32))
  return jnp.ceil(wait_B - 1e-3)


def _retry_due(cfg: AdaptiveGamma, st: AdaptState, costs_G: jax.Array) -> jax.Array:
  """bool `[B]`: rows that drafted in this call and have waited long enough."""
  return (st.idle_B >= 0) & (st.idle_B.astype(jnp.float32) >= _retry_wait_B(cfg, st, costs_G))


def _retry_together(cfg: AdaptiveGamma) -> bool:
  """Batch mode with the "finish" objective: a retry costs the whole batch a drafting call, so
  the batch retries once every active row that drafted is due; otherwise each row retries alone."""
  return not cfg.per_row and cfg.batch_objective == "finish"


def steps_to_retry(cfg: AdaptiveGamma, st: AdaptState, costs_G: jax.Array,
                   active_B: jax.Array) -> jax.Array:
  """int32 `[]`: plain steps until the next retry falls due (the first active row's; batch
  "finish": the last one's); 0: one is due now; a large number: none will."""
  if not st.retries:
    return jnp.int32(_NEVER)
  left_B = jnp.ceil(_retry_wait_B(cfg, st, costs_G) - st.idle_B.astype(jnp.float32))
  drafted_B = active_B & (st.idle_B >= 0)
  left_B = jnp.clip(left_B, 0.0, _NEVER)
  if _retry_together(cfg):
    return jnp.where(jnp.any(drafted_B), jnp.max(jnp.where(drafted_B, left_B, 0.0)),
                     float(_NEVER)).astype(jnp.int32)
  return jnp.min(jnp.where(drafted_B, left_B, float(_NEVER))).astype(jnp.int32)


def may_draft(cfg: AdaptiveGamma, st: AdaptState, costs_G: jax.Array, active_B: jax.Array,
              remaining: Optional[jax.Array] = None) -> jax.Array:
  """bool `[]`: whether, from this state, plain steps alone (the idle decay, nothing observed:
  a drafter without previews) can ever lead `choose` to a γ > 0.

  The rates' ceilings under idle decay bound every later choice (docs/adaptive.md, "Across
  calls"): if no γ > 0 pays for any active row at them, a plain segment can run to the end
  without asking again. With a carried estimate (`st.explore`) a row may also probe: where its
  evidence idles below `explore_below` within `remaining` iterations (None: assume it may), or
  it is probing."""
  xp = _xp(st.accepted_B2)   # numpy: the host's decision for a call, no dispatch
  probe_soon = xp.zeros((), bool)
  if st.explore:
    if remaining is None:
      return xp.ones((), bool)
    idled = (st.accepted_B2[:, 0] + st.rejected_B2[:, 0]) * xp.power(
        xp.float32(cfg.idle_decay), xp.asarray(remaining, xp.float32))
    probe_soon = xp.any(active_B & ((idled < cfg.explore_below) | (st.probe_B > 0)))
  now_B2 = estimated_alpha(cfg, st)
  seen_B2 = st.accepted_B2 + st.rejected_B2
  observed_B2 = xp.where(seen_B2 > 0, st.accepted_B2 / xp.maximum(seen_B2, 1e-6), 0.0)
  # a(t) = w(t) ρ + (1 − w(t)) p(t): the observed weight w shrinks from w0, p(t)
  # stays below M = max(p now, prior): a(t) <= max(M, a now + (1 − w0)(M − p now)).
  p_B1 = long_run_alpha(cfg, st)
  big_B1 = xp.maximum(p_B1, cfg.prior_alpha)
  w0_B1 = seen_B2[:, :1] / (seen_B2[:, :1] + cfg.prior_weight + 1e-6)
  a_B1 = xp.maximum(big_B1, now_B2[:, :1] + (1.0 - w0_B1) * (big_B1 - p_B1))
  r_B1 = xp.maximum(xp.maximum(now_B2[:, 1:], observed_B2[:, 1:]), a_B1)
  alpha_B2 = xp.clip(xp.concatenate([a_B1, r_B1], axis=1), 0.0, 0.999).astype(xp.float32)
  gam_G = xp.asarray(cfg.gammas, xp.int32)
  e_BG = expected_tokens(alpha_B2, xp.broadcast_to(gam_G, (alpha_B2.shape[0], len(cfg.gammas))))
  costs_G = xp.asarray(costs_G, xp.float32)
  best_B = gam_G[xp.argmax(e_BG / costs_G[None], axis=1)]
  cheapest_plain = gam_G[xp.argmin(costs_G)] == 0
  if cfg.per_row:
    return probe_soon | ~cheapest_plain | xp.any(active_B & (best_B > 0))
  # Batch mode leaves γ = 0 only by the switch margin; Σ_b max(E_b, 1) bounds the tokens any
  # set of drafting rows expects.
  tokens_G = xp.sum(xp.maximum(e_BG, 1.0) * active_B[:, None], axis=0)
  score_G = tokens_G / costs_G
  plain = xp.argmax(gam_G == 0)
  leave = xp.any((gam_G > 0) & (score_G > score_G[plain] * (1.0 + cfg.switch_margin)))
  return probe_soon | ~cheapest_plain | leave


def prior_may_draft(cfg: AdaptiveGamma, costs, start: Optional[Acceptance] = None) -> bool:
  """`may_draft` at the start of a run (every row at the prior or a carried `start`, probes
  not counted: `probe_due`), on the host. False: the rule would run plain steps to the end, so
  `speculative_generate` runs plain decoding's program instead (the same decisions)."""
  start = check_acceptance(Acceptance.fresh() if start is None else start)
  zi = np.zeros((1,), np.int32)
  acc, rej = np.asarray(start.accepted_2)[None], np.asarray(start.rejected_2)[None]
  st = AdaptState(acc, rej, np.zeros((), np.int32), zi, np.full((1,), -1, np.int32), zi, zi - 1,
                  zi, np.asarray(start.long_run_2)[None])
  return bool(may_draft(cfg, st, check_costs(cfg, costs), np.ones((1,), bool)))


def observe(cfg: AdaptiveGamma, st: AdaptState, accepted_B: jax.Array, valid_B: jax.Array,
            active_B: jax.Array, step: jax.Array, next_B: Optional[jax.Array] = None
            ) -> AdaptState:
  """The estimate after iteration `step` (run at `st.branch`), in which row b had `valid_B[b]`
  valid drafts and accepted `accepted_B[b]` of them (a rejection when fewer).

  `next_B`: the target's token after the accepted drafts (-1: unknown). Where the row accepted
  all its valid drafts and a draft after them was previewed (`peek_B`), that draft counts as
  accepted exactly if it equals `next_B`: an observation of the first (no valid drafts) or
  later drafts' rate with the verifier's acceptance probability (greedy: the target's argmax;
  a deterministic draft d when sampling: q(d))."""
  a = active_B.astype(jnp.float32)
  n, v = accepted_B, valid_B
  acc_B2 = jnp.stack([(n >= 1) & (v >= 1), jnp.zeros_like(v, bool)], axis=1).astype(jnp.float32)
  acc_B2 = acc_B2.at[:, 1].set(jnp.maximum(n - 1, 0).astype(jnp.float32))
  rej_B2 = jnp.stack([(v >= 1) & (n == 0), (n >= 1) & (n < v)], axis=1).astype(jnp.float32)
  seen_B = active_B & (valid_B > 0)
  if next_B is not None:
    peeked_B = active_B & (st.peek_B >= 0) & (next_B >= 0) & (n >= v)
    hit_B = peeked_B & (st.peek_B == next_B)
    col_B2 = jnp.stack([v == 0, v > 0], axis=1)
    acc_B2 = acc_B2 + (hit_B[:, None] & col_B2).astype(jnp.float32)
    rej_B2 = rej_B2 + ((peeked_B & ~hit_B)[:, None] & col_B2).astype(jnp.float32)
    seen_B = seen_B | peeked_B
  d = jnp.where(seen_B, cfg.decay, cfg.idle_decay)[:, None]
  gam_G = jnp.asarray(cfg.gammas, jnp.int32)
  at = jnp.minimum(step, st.trace_I.shape[0] - 1)
  trace = st.trace_I.at[at].set(gam_G[st.branch])
  rows = st.trace_BI
  if rows is not None:   # each row's own choice (its valid drafts), -1 once it finished
    rows = rows.at[:, at].set(jnp.where(active_B, jnp.minimum(st.limit_B, gam_G[st.branch]), -1).astype(jnp.int32))
  probe_B = st.probe_B
  if st.explore:   # a probe starts at a fresh row's drafting iteration, counts them down
    drafted_B = active_B & (valid_B > 0)
    left_B = jnp.where(st.probe_B > 0, st.probe_B - 1,
                       jnp.where(_fresh(cfg, st), cfg.explore_steps - 1, 0))
    probe_B = jnp.where(drafted_B, left_B, st.probe_B).astype(jnp.int32)
  slow = st.slow_B2
  if slow is not None:
    ds = jnp.where(seen_B, cfg.slow_decay, cfg.slow_idle_decay)[:, None]
    slow = ds * slow + jnp.stack([acc_B2[:, 0], rej_B2[:, 0]], axis=1) * a[:, None]
  idle, backoff = st.idle_B, st.backoff_B
  if idle is not None:   # the retries' clock (module doc)
    drafted_B = active_B & (valid_B > 0)
    idle = jnp.where(drafted_B, 0, jnp.where(active_B & (idle >= 0), idle + 1, idle))
    backoff = jnp.where(drafted_B & (n >= 1), 0, jnp.where(
        drafted_B & (st.idle_B > 0), jnp.minimum(backoff + 1, _MAX_BACKOFF), backoff))
  return st.replace(accepted_B2=d * st.accepted_B2 + acc_B2 * a[:, None],
                    rejected_B2=d * st.rejected_B2 + rej_B2 * a[:, None], trace_I=trace,
                    probe_B=probe_B, slow_B2=slow, idle_B=idle, backoff_B=backoff,
                    trace_BI=rows)


def _fresh(cfg: AdaptiveGamma, st: AdaptState) -> jax.Array:
  """bool `[B]`: rows whose first-draft evidence is below `explore_below`."""
  return st.accepted_B2[:, 0] + st.rejected_B2[:, 0] < cfg.explore_below


def check_costs(cfg: AdaptiveGamma, costs) -> np.ndarray:
  """`costs` as a float32 `[len(Γ)]` array of positive finite numbers."""
  what = (f"gamma costs must be {len(cfg.gammas)} positive finite numbers (one per γ of "
          f"{cfg.gammas}), got {costs!r}")
  try:   # strings, NaN, values <= 0: the first bad entry named
    c = check_real_array("gamma costs", costs, 0.0, lo_open=True)
  except (TypeError, ValueError) as e:
    raise type(e)(f"{what}: {e}") from None
  if c.shape != (len(cfg.gammas),):
    raise ValueError(what)
  return c.astype(np.float32)


def idle_block(cfg: AdaptiveGamma, st: AdaptState, start: jax.Array, end: jax.Array,
               steps_B: Optional[jax.Array] = None) -> AdaptState:
  """The estimate after plain iterations start .. end - 1 (the idle decay for each), recorded
  as γ = 0 in the trace. `steps_B`: int32 `[B]` the iterations of the block in which each row
  was active (the first ones; None: all), for the per-row trace (`trace_BI`)."""
  d = jnp.power(jnp.float32(cfg.idle_decay), (end - start).astype(jnp.float32))
  i_I = jnp.arange(st.trace_I.shape[0])
  trace = jnp.where((i_I >= start) & (i_I < end), 0, st.trace_I)
  rows = st.trace_BI
  if rows is not None:
    stop_B = end if steps_B is None else start + steps_B
    stop_B = jnp.broadcast_to(jnp.asarray(stop_B, jnp.int32), rows.shape[:1])
    rows = jnp.where((i_I[None] >= start) & (i_I[None] < stop_B[:, None]), 0, rows)
  slow = st.slow_B2
  if slow is not None:
    slow = slow * jnp.power(jnp.float32(cfg.slow_idle_decay), (end - start).astype(jnp.float32))
  idle = st.idle_B
  if idle is not None:
    idle = jnp.where(idle >= 0, idle + (end - start).astype(jnp.int32), idle)
  return st.replace(accepted_B2=st.accepted_B2 * d, rejected_B2=st.rejected_B2 * d,
                    trace_I=trace, slow_B2=slow, idle_B=idle, trace_BI=rows)
