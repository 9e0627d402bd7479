"""Host-stepped decoding: one jitted iteration at a time, as a streaming server runs.

`generate` / `speculative_generate` run the whole loop in one program; a streaming server steps
the same decoder from the host and reads the committed tokens after every iteration. `stream`
does that for either decoder: `init_state` and `step` are each jitted once per decoder (state
and caches donated), and after every call the rows' output lengths come to the host, stamped
with `clock()`:

  res = stream(dec, params, prompts_BP, lengths_B, keys_B, cache)
  res.events   # [(time, out_len_B)], the first after the prefill
  res.tokens_BN

The n + 1 tokens an iteration commits for a row share its timestamp, as a client sees them
(`measure.latency.emission_times` turns events into per-token times). The per-step fetch is one
host sync per iteration, which the fused loop does not pay.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, List, Optional, Tuple

import jax
import numpy as np

from specjax._clock import now
from specjax.compiled import enforce_limit, register
from specjax.generation import AutoregressiveDecoder, DecodeState, SpeculativeDecoder

__all__ = ["StreamResult", "stream"]


@dataclasses.dataclass
class StreamResult:
  """What `stream` returns.

  Attributes:
    start: `clock()` before the prefill was dispatched.
    events: `(clock(), out_len_B)` after the prefill and every iteration (`out_len_B` int numpy
      `[B]`, tokens committed so far).
    state: the final `DecodeState` (its caches are the donated inputs).
    tokens_BN: int numpy `[B, max_new_tokens]`; slots past a row's length are stale.
    lengths_B: int numpy `[B]`.
  """

  start: float
  events: List[Tuple[float, np.ndarray]]
  state: DecodeState
  tokens_BN: np.ndarray
  lengths_B: np.ndarray


@register
@functools.partial(jax.jit, static_argnums=0, donate_argnums=(5,))
def _ar_init(dec, params, prompts_BP, lengths_B, keys_B, cache):
  return dec.init_state(params, prompts_BP, lengths_B, keys_B, cache)


@register
@functools.partial(jax.jit, static_argnums=0, donate_argnums=(2,))
def _ar_step(dec, params, state):
  return dec.step(params, state)


@register
@functools.partial(jax.jit, static_argnums=0, donate_argnums=(6, 7))
def _sp_init(dec, target_params, draft_params, prompts_BP, lengths_B, keys_B, target_cache,
             draft_cache):
  return dec.init_state(target_params, draft_params, prompts_BP, lengths_B, keys_B,
                        target_cache, draft_cache)


@register
@functools.partial(jax.jit, static_argnums=0, donate_argnums=(3,))
def _sp_step(dec, target_params, draft_params, state):
  return dec.step(target_params, draft_params, state)


def stream(decoder: Any, params: Any, prompts_BP: Any, lengths_B: Any, keys_B: Any, cache: Any,
           *, draft_params: Any = None, draft_cache: Any = None,
           clock: Callable[[], float] = now,
           max_steps: Optional[int] = None) -> StreamResult:
  """Decodes one batch step by step from the host (see the module doc).

  Args:
    decoder: an `AutoregressiveDecoder` or a `SpeculativeDecoder`.
    params: the target's params.
    prompts_BP, lengths_B, keys_B: as `decoder.run` takes them (not validated here).
    cache: the target's cache (donated).
    draft_params, draft_cache: the drafter's params and state (speculative only; state donated).
    clock: the timestamp source (default `specjax._clock.now`, which `use_clock` rigs in tests).
    max_steps: iterations at most (default `decoder.max_new_tokens`).

  Returns: a `StreamResult`.
  """
  if isinstance(decoder, SpeculativeDecoder):
    init = lambda: _sp_init(decoder, params, draft_params, prompts_BP, lengths_B, keys_B,
                            cache, draft_cache)
    step = lambda s: _sp_step(decoder, params, draft_params, s)
  elif isinstance(decoder, AutoregressiveDecoder):
    if draft_params is not None or draft_cache is not None:
      raise ValueError("draft_params / draft_cache are for a SpeculativeDecoder; an "
                       "AutoregressiveDecoder has no drafter")
    init = lambda: _ar_init(decoder, params, prompts_BP, lengths_B, keys_B, cache)
    step = lambda s: _ar_step(decoder, params, s)
  else:
    raise TypeError(f"decoder must be an AutoregressiveDecoder or a SpeculativeDecoder, got "
                    f"{type(decoder).__name__}")
  max_steps = decoder.max_new_tokens if max_steps is None else max_steps
  start = clock()
  state = init()
  out_len, done = jax.device_get((state.out_len, state.done))
  events = [(clock(), np.asarray(out_len))]
  steps = 0
  while not np.all(done) and steps < max_steps:
    state = step(state)
    out_len, done = jax.device_get((state.out_len, state.done))
    events.append((clock(), np.asarray(out_len)))
    steps += 1
  tokens = np.asarray(jax.device_get(state.tokens))[:, :decoder.max_new_tokens]
  enforce_limit()
  return StreamResult(start=start, events=events, state=state, tokens_BN=tokens,
                      lengths_B=np.asarray(out_len))
