"""Timing helpers shared by the demo, the experiments and `benchmarks/`.

* `time_call`: median wall time of a (jitted) call, outputs blocked on, after warm-up
  (compilation reported separately).
* `step_times`: the in-graph cost of one model call on T tokens, from a jitted `lax.fori_loop`
  of the call timed at 0 and at `steps` iterations, so neither prefill nor dispatch counts;
  `StepTimer` builds those loops once and measures them in rounds, between other timings.

The clock (`now`, `use_clock`) and the timer of calls compared with each other
(`interleaved_rounds`) live in `specjax._clock` and are re-exported here.
"""

from __future__ import annotations

import functools
import statistics
from typing import Any, Callable, Dict, Sequence

import jax
import jax.numpy as jnp

from specjax._clock import Rounds, interleaved_rounds, now, use_clock

__all__ = ["now", "use_clock", "interleaved_rounds", "Rounds", "time_call", "step_times",
           "StepTimer", "floor_step_seconds", "step_times_side_by_side", "prefill_seconds",
           "count_params", "cache_step_times"]


def time_call(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> Dict[str, float]:
  """Median/min wall seconds of `fn()` over `repeats` runs after `warmup` runs.

  `first_s` is the first call's time (compilation included)."""
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  t0 = now()
  jax.block_until_ready(fn())
  first = now() - t0
  for _ in range(max(warmup - 1, 0)):
    jax.block_until_ready(fn())
  times = interleaved_rounds({"call": fn}, repeats).seconds["call"]
  return {"median_s": statistics.median(times), "min_s": min(times), "first_s": first,
          "runs": times}


_RESOLUTION_S = 1e-7  # 0.1 µs: the smallest per-step time step_times reports


def _step_loop(model, params, batch_size: int, cache_len: int, prompt_len: int, t: int,
               steps: int):
  """`(run, cache)`, compiled and warmed up: a jitted `run(params, cache, n)` of the prefill and
  then `n` extend calls on T tokens in a `lax.fori_loop` (see `step_times`)."""
  tokens_proto = jnp.zeros((batch_size,), jnp.int32)
  prompt = jnp.ones((batch_size, prompt_len), jnp.int32)
  lengths = jnp.full((batch_size,), prompt_len, jnp.int32)
  cache = model.init_cache(batch_size, cache_len, prompt_len)

  def run(params, cache, n):
    logits0, _, cache = model.prefill(params, prompt, lengths, cache)
    start = cache.lengths

    def body(i, carry):
      cache, acc = carry
      toks = (tokens_proto[:, None] + i + jnp.arange(t)[None]) % model.vocab_size
      logits, cache = model.extend(params, toks, cache.replace(lengths=start))
      return cache, acc + jnp.sum(jnp.max(logits, axis=-1), axis=-1)

    _, acc = jax.lax.fori_loop(0, n, body, (cache, logits0[:, 0]))
    return acc

  fn = jax.jit(run)
  jax.block_until_ready(fn(params, cache, jnp.int32(steps)))  # compile + warm up
  return fn, cache


def _paired_step_seconds(loops, steps: int, repeats: int, base: int = 0) -> Dict[Any, list]:
  """Per key of `loops` ({key: (run, cache, params)}): `repeats` paired differences (time at
  n = base + steps − time at n = base) / steps, the keys interleaved (`interleaved_rounds`,
  reversed every other round)."""
  ns = (jnp.int32(base), jnp.int32(base + steps))
  calls = {(key, i): functools.partial(fn, params, cache, ns[i])
           for key, (fn, cache, params) in loops.items() for i in (0, 1)}
  sec = interleaved_rounds(calls, repeats, reverse=True).seconds
  return {key: [(hi - lo) / steps for lo, hi in zip(sec[key, 0], sec[key, 1])] for key in loops}


class StepTimer:
  """Compiled step loops of one model for several token counts (the method of `step_times`),
  built once and measured on demand, so that rounds can interleave with other timings."""

  def __init__(self, model, params, batch_size: int, cache_len: int, prompt_len: int,
               token_counts: Sequence[int], steps: int = 32):
    _check_steps(steps, 1)
    if not token_counts:
      raise ValueError(f"token_counts must name at least one T, got {token_counts!r}")
    self.steps = steps
    self._loops = {t: _step_loop(model, params, batch_size, cache_len, prompt_len, t, steps)
                   + (params,) for t in token_counts}

  def measure(self, repeats: int = 1) -> Dict[int, list]:
    """Per T: `repeats` seconds per `model.extend` call (T values interleaved)."""
    _check_steps(self.steps, repeats)
    return _paired_step_seconds(self._loops, self.steps, repeats)


def step_times(model, params, batch_size: int, cache_len: int, prompt_len: int,
               token_counts: Sequence[int], steps: int = 32, repeats: int = 7) -> Dict[int, float]:
  """Seconds per `model.extend` call on T tokens, for each T in token_counts.

  One jitted function per T runs the prefill and then `n` extend calls in a `lax.fori_loop`
  whose trip count is an argument; each repeat times it at n = 0 and right after at n = `steps`,
  and the median of these differences over `steps` is one call: prefill, dispatch and output
  transfer cancel. (Subtracting a separately timed prefill is wrong: XLA removes a prefill whose
  result is unused.) Every call writes at position `prompt_len` (lengths reset each time) on a
  cache of `cache_len` slots and every logit is consumed, as a decode/verify step does. Token
  counts are interleaved within each repeat; times below the noise floor read 0.1 µs, never 0.
  """
  _check_steps(steps, repeats)
  per_step = StepTimer(model, params, batch_size, cache_len, prompt_len, token_counts,
                       steps).measure(repeats)
  return {t: floor_step_seconds(d) for t, d in per_step.items()}


def floor_step_seconds(seconds: Sequence[float]) -> float:
  """The median of per-call seconds, floored at 0.1 µs: a step too cheap to resolve reads as the
  floor, not as 0 or < 0 (callers divide by these times)."""
  if len(seconds) == 0:
    raise ValueError(f"seconds must hold at least one measurement, got {seconds!r}")
  return max(statistics.median(seconds), _RESOLUTION_S)


def step_times_side_by_side(models: Dict[str, Any], params, batch_size: int, cache_len: int,
                            prompt_len: int, tokens: int, steps: int = 32,
                            repeats: int = 15) -> Dict[str, list]:
  """`step_times` of several models (e.g. a compute option on and off), interleaved call by
  call: per name, the `repeats` per-step seconds in order, so that `a[i] / b[i]` are ratios
  measured moments apart. `params`: one tree for every model, or a dict {name: tree} with the
  names of `models` (e.g. the same weights in two layouts)."""
  if not isinstance(models, dict) or not models:
    raise ValueError(f"models must be a non-empty dict {{name: model}}, got {models!r}")
  _check_steps(steps, repeats)
  per_name = isinstance(params, dict) and set(params) == set(models)
  loops = {}
  for name, m in models.items():
    p = params[name] if per_name else params
    fn, cache = _step_loop(m, p, batch_size, cache_len, prompt_len, tokens, steps)
    loops[name] = (fn, cache, p)
  return _paired_step_seconds(loops, steps, repeats)


def _check_steps(steps: int, repeats: int) -> None:
  if steps < 1:
    raise ValueError(f"steps must be >= 1, got {steps}")
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")


def prefill_seconds(model, params, batch_size: int, cache_len: int, prompt_len: int) -> float:
  """Median wall seconds of one jitted prefill of `prompt_len` tokens in every row, on a cache of
  `cache_len` slots: the per-request cost that decode-only speedups subtract."""
  prompt = jnp.ones((batch_size, prompt_len), jnp.int32)
  lengths = jnp.full((batch_size,), prompt_len, jnp.int32)
  fn = jax.jit(lambda params, cache: model.prefill(params, prompt, lengths, cache)[0])
  cache = model.init_cache(batch_size, cache_len, prompt_len)
  return time_call(lambda: fn(params, cache), repeats=5)["median_s"]


def count_params(params) -> int:
  """Number of parameters in a pytree."""
  return int(sum(x.size for x in jax.tree_util.tree_leaves(params)))


def cache_step_times(model, params, batch_size: int, cache_len: int, valid: int,
                     token_counts: Sequence[int], steps: int = 8,
                     repeats: int = 3) -> Dict[int, float]:
  """Seconds per `model.extend` call on T tokens over a cache holding `valid`
  positions per row, for each T in `token_counts` — without a prefill.

  For contexts whose prefill costs seconds: a fresh cache of `cache_len` slots has its lengths
  set to `valid` (the contents do not change what a dense step costs). The loop (as
  `step_times`') is timed at n = `steps` and n = 2·`steps`, so dispatch, the transfer and the
  copy of the undonated input cache cancel; medians, floored at 0.1 µs. Works for any
  `LanguageModel` whose `init_cache(batch, slots)` returns a cache with `lengths` (including
  `specjax.drafters.windowed.WindowedLM`)."""
  _check_steps(steps, repeats)
  if valid + max(token_counts) > cache_len:
    raise ValueError(f"valid ({valid}) + the largest T ({max(token_counts)}) exceeds "
                     f"cache_len ({cache_len})")
  cache = model.init_cache(batch_size, cache_len)
  cache = cache.replace(lengths=jnp.full((batch_size,), valid, jnp.int32))
  loops = {}
  for t in token_counts:
    def run(params, cache, n, t=t):
      start = cache.lengths

      def body(i, carry):
        cache, acc = carry
        toks = (i + jnp.arange(t)[None, :] + jnp.zeros((batch_size, 1), jnp.int32)) % (
            model.vocab_size)
        logits, cache = model.extend(params, toks, cache.replace(lengths=start))
        return cache, acc + jnp.sum(jnp.max(logits, axis=-1), axis=-1)

      return jax.lax.fori_loop(0, n, body, (cache, jnp.zeros((batch_size,))))[1]
    fn = jax.jit(run)
    jax.block_until_ready(fn(params, cache, jnp.int32(1)))
    loops[t] = (fn, cache, params)
  per = _paired_step_seconds(loops, steps, repeats, base=steps)
  return {t: floor_step_seconds(v) for t, v in per.items()}
