"""Cost tables for `gamma="auto"`: what one iteration costs at each γ of Γ.

c(γ) is the wall time of one iteration at γ: the drafter's calls, the target's call on γ + 1
tokens *and* sampling, verification and the commit. It is measured on the very program the
adaptive decoder runs: the costs are data of that program, so with every γ's cost but one set
very high a run executes only that branch, timed for `iterations` iterations in `repeats`
interleaved rounds, minus the prefill alone, divided by the iterations run (median over rounds).

Tables are stored per machine (`specjax.machine_store`: `$SPECJAX_CACHE_DIR/gamma_costs.json`)
by the model pair, Γ, batch and cache-length buckets and greedy or not; `gamma="auto"` measures
only when the table is missing or older than `MAX_AGE_S` (costs drift; docs/adaptive.md, which
shows `calibrate_gamma_costs` in use).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import statistics
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import machine_store
from specjax._checks import check_int
from specjax._clock import interleaved_rounds, now
from specjax._clock import wall as _wall   # when a table was measured (tests rig it)
from specjax.adaptive import AdaptiveGamma, check_costs
from specjax.compiled import register
from specjax.drafting import Drafter
from specjax.generation import SpeculativeDecoder, check_adaptive
from specjax.protocol import required_cache_len
from specjax.sampling import SamplingConfig

__all__ = ["GammaCosts", "calibrate_gamma_costs", "lookup_gamma_costs", "gamma_costs_key",
           "resolve_gamma_costs", "measure_branch_seconds", "COSTS_FILE", "MAX_AGE_S"]

COSTS_FILE = "gamma_costs.json"
# In every key: bumped when what an iteration at some γ executes changes (old tables re-measured).
COSTS_VERSION = 3
# A stored table older than this (seconds; wall clock) is measured again.
MAX_AGE_S = 24 * 3600.0
_HIGH = 1e9  # the cost that keeps a branch from ever being chosen


@dataclasses.dataclass(frozen=True)
class GammaCosts:
  """A cost table.

  Attributes:
    gammas, seconds: Γ and, per γ, the measured seconds of one iteration.
    key: what the table is stored under (`gamma_costs_key`).
    measured: True when measured by this call; False when read back.
    calibration_seconds: the measurement's wall time, compilation included (0 when read back).
  """

  gammas: Tuple[int, ...]
  seconds: Tuple[float, ...]
  key: str = ""
  measured: bool = False
  calibration_seconds: float = 0.0

  @property
  def relative(self) -> Tuple[float, ...]:
    """c(γ) / c(min Γ)."""
    return tuple(s / self.seconds[0] for s in self.seconds)

  def to_dict(self) -> Dict[str, Any]:
    return {"gammas": list(self.gammas), "seconds": list(self.seconds), "key": self.key,
            "measured": self.measured, "calibration_seconds": self.calibration_seconds}


def _bucket(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


def _digest(obj: Any) -> str:
  return hashlib.sha1(repr(obj).encode()).hexdigest()[:16]


def gamma_costs_key(target: Any, drafter: Drafter, adaptive: AdaptiveGamma, batch_size: int,
                    cache_len: int, sampling: SamplingConfig) -> str:
  """The key a table is stored under (the store prefixes the machine's id): `COSTS_VERSION`, the
  models' configurations (hashed), Γ, the batch and cache-length buckets (next power of two) and
  greedy or sampled verification."""
  kind = "greedy" if sampling.is_greedy else "sampled"
  return (f"v{COSTS_VERSION} | target={type(target).__name__}:{_digest(target)} | drafter="
          f"{type(drafter).__name__}:{_digest(drafter)} | gammas={list(adaptive.gammas)} | "
          f"batch<={_bucket(batch_size)} | cache<={_bucket(cache_len)} | {kind}")


def lookup_gamma_costs(key: str, adaptive: AdaptiveGamma,
                       max_age_s: float = MAX_AGE_S) -> Optional[GammaCosts]:
  """The table stored under `key` on this machine, or None (also when malformed or older than
  `max_age_s`: it is then measured again)."""
  if isinstance(max_age_s, bool) or not isinstance(max_age_s, (int, float)) \
      or not max_age_s >= 0:
    raise ValueError(f"max_age_s must be a number of seconds >= 0, got {max_age_s!r}")
  entry = machine_store.lookup_entry(COSTS_FILE, key)
  if entry is None:
    return None
  measured_at = entry.get("measured_at") if isinstance(entry, dict) else None
  if not isinstance(measured_at, (int, float)) or not 0 <= _wall() - measured_at <= max_age_s:
    logging.info("the γ cost table for %s was measured %s: measuring it again", key,
                 "at an unknown time" if not isinstance(measured_at, (int, float))
                 else f"{(_wall() - measured_at) / 3600:.1f} h ago")
    return None
  try:
    seconds = tuple(float(s) for s in entry["seconds"])
    if tuple(entry["gammas"]) != adaptive.gammas or len(seconds) != len(adaptive.gammas) \
        or not all(np.isfinite(s) and s > 0 for s in seconds):
      raise ValueError(f"gammas {entry['gammas']}, seconds {entry['seconds']}")
  except (KeyError, TypeError, ValueError) as e:
    logging.warning("%s holds a malformed γ cost table for %s (%s): measuring it again",
                    machine_store.cache_path(COSTS_FILE), key, e)
    return None
  return GammaCosts(adaptive.gammas, seconds, key=key)


def measure_branch_seconds(run_branch: Callable[[int], int], run_base: Callable[[], None],
                           num_branches: int, repeats: int) -> Tuple[float, ...]:
  """Per branch, the median over `repeats` rounds of (wall(run_branch(i)) − wall(run_base())) /
  iterations, run_branch(i) running branch i and returning its iterations (its last run's count).
  Branches and base are timed in interleaved rounds (`_clock.interleaved_rounds`), so a slow
  spell of the machine spreads over all of them."""
  calls = {"base": run_base, **{i: functools.partial(run_branch, i)
                                for i in range(num_branches)}}
  timed = interleaved_rounds(calls, repeats)
  if any(not timed.last[i] > 0 for i in range(num_branches)):
    raise RuntimeError("a γ branch ran no iteration while its cost was measured")
  return tuple(float(statistics.median(max(wall - base, 1e-9) / timed.last[i] for wall, base
                                       in zip(timed.seconds[i], timed.seconds["base"])))
               for i in range(num_branches))


def calibrate_gamma_costs(target: Any, target_params: Any, drafter: Drafter, draft_params: Any,
                          adaptive: AdaptiveGamma, *, batch_size: int, prompt_len: int,
                          cache_len: int, sampling: SamplingConfig = SamplingConfig(),
                          iterations: int = 64, repeats: int = 5, store: bool = True,
                          seed: int = 0) -> GammaCosts:
  """Measures the cost of one iteration at each γ of `adaptive.gammas` (see the module doc) for
  this pair, batch and cache length, on random prompts of `prompt_len` tokens; stores it for
  this machine unless `store` is False. `draft_params`: as the decoder takes them."""
  check_adaptive(drafter, adaptive)
  batch_size = check_int("batch_size", batch_size, 1)
  prompt_len = check_int("prompt_len", prompt_len, 1)
  iterations = check_int("iterations", iterations, 2)
  repeats = check_int("repeats", repeats, 1)
  t_start = now()
  key = gamma_costs_key(target, drafter, adaptive, batch_size, cache_len, sampling)
  g_max = adaptive.max_gamma
  slots = max(int(cache_len), required_cache_len(target, prompt_len, iterations + 1, g_max))
  rng = np.random.default_rng(seed)
  prompts = jnp.asarray(rng.integers(0, target.vocab_size, (batch_size, prompt_len)), jnp.int32)
  lengths = jnp.full((batch_size,), prompt_len, jnp.int32)
  keys = jax.random.split(jax.random.key(seed), batch_size)
  dec = SpeculativeDecoder(target, drafter, g_max, sampling, iterations + 1, adaptive=adaptive)

  def fresh():
    return (target.init_cache(batch_size, slots, prompt_len),
            drafter.alloc(batch_size, prompt_len, slots, g_max))

  def run_branch(i: int) -> int:
    costs = np.full((len(adaptive.gammas),), _HIGH, np.float32)
    costs[i] = 1.0
    tc, dc = jax.block_until_ready(fresh())   # allocation: in the base's time too
    out = dec.run(target_params, draft_params, prompts, lengths, keys, tc, dc,
                  gamma_costs=costs)
    ran = np.asarray(out.stats.gamma_trace) >= 0   # blocks on the run
    return int(np.sum(ran if ran.ndim == 1 else np.any(ran, axis=0)))   # per row: [B, I]

  def run_base() -> None:
    tc, dc = jax.block_until_ready(fresh())
    jax.block_until_ready(_start(dec, target_params, draft_params, prompts, lengths, keys, tc,
                                 dc))

  for i in range(len(adaptive.gammas)):   # compile (timed as part of the calibration)
    run_branch(i)
  run_base()
  seconds = measure_branch_seconds(run_branch, run_base, len(adaptive.gammas), repeats)
  costs = GammaCosts(adaptive.gammas, seconds, key=key, measured=True,
                     calibration_seconds=now() - t_start)
  if store:
    path = machine_store.store_entry(COSTS_FILE, key, {"gammas": list(adaptive.gammas),
                                                      "seconds": list(seconds),
                                                      "measured_at": _wall()})
    logging.info("γ costs %s stored in %s", dict(zip(adaptive.gammas, seconds)), path)
  return costs


def resolve_gamma_costs(target: Any, target_params: Any, drafter: Drafter, draft_params: Any,
                        adaptive: AdaptiveGamma, *, batch_size: int, prompt_len: int,
                        cache_len: int, sampling: SamplingConfig,
                        gamma_costs: Optional[Sequence[float]] = None) -> GammaCosts:
  """The table to decode with: `gamma_costs` when given (seconds or relative costs, one per γ),
  else this machine's stored table, else one measured now (logged) and stored. A table found or
  measured is kept for the process (per store, models and shapes): later calls cost a lookup."""
  if gamma_costs is not None:
    return GammaCosts(adaptive.gammas, tuple(float(c) for c in check_costs(adaptive,
                                                                           gamma_costs)))
  memo = (machine_store.cache_path(COSTS_FILE), target, drafter, adaptive, int(batch_size),
          int(cache_len), sampling.is_greedy)
  try:
    hit = _RESOLVED.get(memo)
  except TypeError:   # an unhashable model or drafter: the store alone
    memo, hit = None, None
  if hit is not None:
    return hit
  key = gamma_costs_key(target, drafter, adaptive, batch_size, cache_len, sampling)
  found = lookup_gamma_costs(key, adaptive)
  if found is None:
    logging.info("gamma='auto': measuring the cost of each γ of %s on this machine (once per "
                 "model pair, batch and cache-length bucket)", adaptive.gammas)
    found = calibrate_gamma_costs(target, target_params, drafter, draft_params, adaptive,
                                  batch_size=batch_size, prompt_len=prompt_len,
                                  cache_len=cache_len, sampling=sampling)
  if memo is not None:
    if len(_RESOLVED) >= 256:
      _RESOLVED.clear()
    _RESOLVED[memo] = dataclasses.replace(found, measured=False, calibration_seconds=0.0)
  return found


# Tables resolved in this process (see resolve_gamma_costs).
_RESOLVED: Dict[tuple, GammaCosts] = {}


@register
@jax.jit(static_argnums=0)
def _start(dec: SpeculativeDecoder, target_params, draft_params, prompts_BP, lengths_B, keys_B,
           target_cache, draft_cache):
  """The prefill and the drafter's start alone (the calibration's base). The caches are not
  donated: none is returned, so XLA could not reuse them."""
  state = dec.init_state(target_params, draft_params, prompts_BP, lengths_B, keys_B,
                         target_cache, draft_cache)
  return state.tokens, state.seq_len
