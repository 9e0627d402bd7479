"""The fused decode loops' forward passes alone: a baseline for loop overhead.

A fused loop's wall time can exceed the sum of its component times (`measure.timing.step_times`)
through the loop's decoding logic (verify, commit, stopping, statistics, PRNG, host work) or
through composing the components into one loop (colder CPU caches, new cache positions per
call). `model_call_loop` separates the two: a jitted function making exactly the model calls
of `generate` / `speculative_generate`, in order, on the same shapes and caches, each call's
input an argmax of the previous call's output, and nothing else:

  * autoregressive (`gamma` = 0): the target's prefill, then one T = 1 target call per iteration;
  * speculative: both prefills, then per iteration the draft on T = 2 ([prev, pending] at
    seq_len − 1), γ − 1 draft calls on T = 1 in a `lax.scan`, and the target on T = γ + 1.

Each iteration advances every row by one position (with static buffers a call's cost does not
depend on the position); the iteration count is an argument (one compilation). Then:

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
  """A jitted `run(target_params, draft_params, prompts_BP, lengths_B, target_cache,
  draft_cache, iterations)` → `(best_BG1, drafts_BG, target_cache, draft_cache)`: the target's
  argmax at each of the last call's G + 1 positions (`[B, 1]` when autoregressive), the last
  iteration's drafts (`[B, 0]` when autoregressive; zeros after 0 iterations) and both
  (donated) caches. `draft` / `draft_cache`: None when `gamma` is 0. `iterations`: for an
  autoregressive request of N tokens, N − 1; for a speculative one, the iterations its
  `speculative_generate` call ran.

  Every logit is consumed (an argmax), so XLA cannot drop any part of a call. After K
  iterations `best_BG1[:, 0]` is greedy decoding's token K + 1, and the drafts the draft's
  greedy continuation of the first K.

  Raises ValueError for a negative `gamma` or a speculative loop without a draft."""
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
