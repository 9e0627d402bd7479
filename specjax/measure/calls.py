"""The fused decode loops' forward passes alone: a baseline for loop overhead.

A fused loop's wall time can exceed the sum of its component times (each
`model.extend` timed in its own loop, `specjax.measure.timing.step_times`) for
two different reasons: the loop's decoding logic (verify, commit, stopping,
statistics, PRNG, the API's host work) and the composition of the components
into one loop (a draft call that runs right after a target call finds colder
CPU caches than one that runs after itself; each call writes new cache
positions where the component loop rewrites the same ones). `model_call_loop`
separates them. It builds a jitted function that makes exactly the model
calls of `generate` / `speculative_generate`, in the same order, on the same
shapes and caches, with each call's input computed from the previous call's
output (an argmax), and nothing else:

  * autoregressive (`gamma` = 0): the target's prefill, then per iteration
    one target call on T = 1 token;
  * speculative: both prefills, then per iteration the draft on T = 2
    ([prev, pending] at seq_len − 1), γ − 1 draft calls on T = 1 in a
    `lax.scan`, and the target on T = γ + 1 ([pending, d_1..d_γ] at seq_len).

Each iteration advances every row by one position (the real loop advances
by the accepted count; with static buffers a call's cost does not depend on
the position). The iteration count is an argument, so one compilation serves
every request. Then, for the same requests and iteration counts:

  loop wall / model-call loop − 1   = the decoding logic's cost;
  model-call loop / components − 1  = the composition's cost.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Tuple

import jax
import jax.numpy as jnp
from specjax._checks import check_int

__all__ = ["model_call_loop"]


def _argmax(logits_BV: jax.Array) -> jax.Array:
  return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)


def model_call_loop(target: Any, draft: Any, gamma: int) -> Callable[..., Tuple]:
  """A jitted `run(target_params, draft_params, prompts_BP, lengths_B,
  target_cache, draft_cache, iterations)` → `(best_BG1, drafts_BG,
  target_cache, draft_cache)`: the target's argmax at each of the last
  call's G + 1 positions (`[B, 1]` when autoregressive), the last
  iteration's drafts (`[B, 0]` when autoregressive; zeros after 0
  iterations) and both caches, returned as the fused loops return theirs
  (they are donated). `draft` and `draft_cache` are unused (pass None) when
  `gamma` is 0. `iterations` is the loop's trip count: for an
  autoregressive request of N tokens, N − 1; for a speculative one, the
  number of iterations its `speculative_generate` call ran.

  Every logit of every call is consumed (an argmax, as the greedy verify
  does), so XLA cannot drop any part of a call. With one position per
  iteration, after K iterations `best_BG1[:, 0]` is greedy decoding's token
  K + 1, and the drafts are the draft's greedy continuation of the first K
  (the tests check both).

  Raises ValueError for a negative `gamma` or a speculative loop without a
  draft."""
  gamma = check_int("gamma (0: autoregressive)", gamma, 0)
  if gamma and draft is None:
    raise ValueError(f"a speculative model-call loop (gamma={gamma}) needs a draft model")

  def one_draft(dp, carry, _):
    tok_B, cache = carry
    logits_B1V, cache = draft.extend(dp, tok_B[:, None], cache)
    tok_B = _argmax(logits_B1V[:, 0])
    return (tok_B, cache), tok_B

  def iteration(tp, dp, carry):
    tc, dc, seq_B, prev_B, best_BG1, drafts_BG = carry
    pending_B = best_BG1[:, 0]
    if gamma:
      logits_B2V, dc = draft.extend(dp, jnp.stack([prev_B, pending_B], axis=1),
                                    dc.replace(lengths=seq_B - 1))
      d1_B = _argmax(logits_B2V[:, 1])
      (_, dc), ds_GB = jax.lax.scan(functools.partial(one_draft, dp), (d1_B, dc), None,
                                    length=gamma - 1)
      drafts_BG = jnp.concatenate([d1_B[:, None], jnp.swapaxes(ds_GB, 0, 1)], axis=1)
    logits_BG1V, tc = target.extend(tp, jnp.concatenate([pending_B[:, None], drafts_BG], axis=1),
                                    tc.replace(lengths=seq_B))
    return tc, dc, seq_B + 1, pending_B, _argmax(logits_BG1V), drafts_BG

  def run(tp, dp, prompts_BP, lengths_B, target_cache, draft_cache, iterations):
    logits_BV, prev_B, target_cache = target.prefill(tp, prompts_BP, lengths_B, target_cache)
    if gamma:
      _, _, draft_cache = draft.prefill(dp, prompts_BP, lengths_B, draft_cache)
    b = prompts_BP.shape[0]
    best_BG1 = jnp.zeros((b, gamma + 1), jnp.int32).at[:, 0].set(_argmax(logits_BV))
    carry = (target_cache, draft_cache, target_cache.lengths.astype(jnp.int32), prev_B,
             best_BG1, jnp.zeros((b, gamma), jnp.int32))
    tc, dc, _, _, best_BG1, drafts_BG = jax.lax.fori_loop(
        0, iterations, lambda _, c: iteration(tp, dp, c), carry)
    return best_BG1, drafts_BG, tc, dc

  return jax.jit(run, donate_argnums=(4, 5))
