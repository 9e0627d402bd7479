"""Timing helpers shared by the demo, the experiments and `benchmarks/`.

Speed claims live in benchmarks, measured side by side in one process; these
helpers only make the measurements consistent:

* `time_call`: median wall time of a (jitted) call, outputs blocked on,
  after warm-up (compilation excluded and reported separately).
* `step_times`: the in-graph cost of one model call on T tokens, measured
  by running the call `steps` times inside one jitted `lax.fori_loop` (as the
  decoding loop runs it), so dispatch overhead is not counted.
* `predicted_speedup`: the speedup the measured component times and the
  measured tokens per iteration predict; measured / predicted is the loop
  overhead.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, Sequence

import jax
import jax.numpy as jnp

__all__ = ["time_call", "step_times", "prefill_seconds", "predicted_speedup", "count_params"]


def _block(tree):
  for leaf in jax.tree_util.tree_leaves(tree):
    if hasattr(leaf, "block_until_ready"):
      leaf.block_until_ready()
  return tree


def time_call(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> Dict[str, float]:
  """Median/min wall seconds of `fn()` over `repeats` runs after `warmup` runs.

  `first_s` is the first call's time (compilation included)."""
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  t0 = time.perf_counter()
  _block(fn())
  first = time.perf_counter() - t0
  for _ in range(max(warmup - 1, 0)):
    _block(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    _block(fn())
    times.append(time.perf_counter() - t0)
  return {"median_s": statistics.median(times), "min_s": min(times), "first_s": first,
          "runs": times}


def step_times(model, params, batch_size: int, cache_len: int, prompt_len: int,
               token_counts: Sequence[int], steps: int = 16, repeats: int = 5) -> Dict[int, float]:
  """Seconds per `model.extend` call on T tokens, for each T in token_counts.

  Every call writes at position `prompt_len` (lengths are reset each time),
  on a cache of `cache_len` slots — the cost of a decode/verify step of the
  static-shape loop.
  """
  out = {}
  tokens_proto = jnp.zeros((batch_size,), jnp.int32)
  prompt = jnp.ones((batch_size, prompt_len), jnp.int32)
  lengths = jnp.full((batch_size,), prompt_len, jnp.int32)

  @jax.jit
  def prefill_only(params, cache):
    return model.prefill(params, prompt, lengths, cache)[2].lengths

  cache = model.init_cache(batch_size, cache_len, prompt_len)
  t_prefill = time_call(lambda: prefill_only(params, cache), repeats=repeats)["median_s"]
  for t in token_counts:
    def run(params, cache, t=t):
      _, _, cache = model.prefill(params, prompt, lengths, cache)
      start = cache.lengths

      def body(i, carry):
        cache, acc = carry
        toks = (tokens_proto[:, None] + i + jnp.arange(t)[None]) % model.vocab_size
        logits, cache = model.extend(params, toks, cache.replace(lengths=start))
        return cache, acc + logits[:, -1, 0]

      cache, acc = jax.lax.fori_loop(0, steps, body, (cache, jnp.zeros((batch_size,))))
      return acc

    fn = jax.jit(run)
    timing = time_call(lambda: fn(params, cache), repeats=repeats)
    out[t] = max(timing["median_s"] - t_prefill, 0.0) / steps
  return out


def prefill_seconds(model, params, batch_size: int, cache_len: int, prompt_len: int) -> float:
  """Median wall seconds of one jitted prefill of a full prompt bucket
  (`prompt_len` tokens in every row, a cache of `cache_len` slots): the
  per-request cost that decode-only speedups subtract."""
  prompt = jnp.ones((batch_size, prompt_len), jnp.int32)
  lengths = jnp.full((batch_size,), prompt_len, jnp.int32)
  fn = jax.jit(lambda params, cache: model.prefill(params, prompt, lengths, cache)[0])
  cache = model.init_cache(batch_size, cache_len, prompt_len)
  return time_call(lambda: fn(params, cache), repeats=5)["median_s"]


def predicted_speedup(tokens_per_iteration: float, gamma: int, t_draft_s: float,
                      t_verify_s: float, t_target_s: float) -> float:
  """Autoregressive time per token / speculative time per token predicted from
  component times: tokens_per_iteration * t_target / (gamma * t_draft + t_verify)."""
  return tokens_per_iteration * t_target_s / (gamma * t_draft_s + t_verify_s)


def count_params(params) -> int:
  """Number of parameters in a pytree."""
  return int(sum(x.size for x in jax.tree_util.tree_leaves(params)))
