"""The speculative accept/reject rule (Leviathan et al. 2023, Chen et al. 2023).

A verifier is a pure function

  verify_fn(keys_B, drafts_BG, draft_probs_BGV, target_probs_BG1V)
      -> (num_accepted_B, next_token_B)

where draft_probs_BGV[b, i] is the draft distribution p_{i+1} that
drafts_BG[b, i] was sampled from and target_probs_BG1V[b, i] the target
distribution q_{i+1} at the same position (one more at the end, after all G
drafts). Both are *processed* distributions (`specjax.sampling`). The
verifier returns how many leading drafts row b keeps (0..G) and the token
that follows them: the residual sample after a rejection, or the bonus
token when all G are kept. `speculative_generate` accepts any such function
(`verify_fn=`), which is how tests plant a broken sampler.
"""

from __future__ import annotations

from typing import Tuple

import jax
import jax.numpy as jnp

from specjax.sampling import row_uniforms, sample_from_uniform

__all__ = ["rejection_verify", "greedy_verify", "gather_probs"]


def gather_probs(probs_BXV: jax.Array, tokens_BX: jax.Array) -> jax.Array:
  """probs_BXV[b, x, tokens_BX[b, x]] → `[B, X]`."""
  return jnp.take_along_axis(probs_BXV, tokens_BX[..., None], axis=-1)[..., 0]


def rejection_verify(keys_B: jax.Array, drafts_BG: jax.Array, draft_probs_BGV: jax.Array,
                     target_probs_BG1V: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """Exact speculative sampling.

  Draft i is accepted with probability min(1, q_i(d_i) / p_i(d_i)), left to
  right; at the first rejection j the next token is drawn from
  norm(max(0, q_j − p_j)); if all G are accepted, from q_{G+1}. The output
  then has exactly the target's distribution. With one-hot (greedy)
  distributions this is "keep drafts while they equal the target's argmax,
  then emit the target's argmax".
  """
  b, g = drafts_BG.shape
  # One PRNG call per row: G acceptance uniforms and the residual draw's.
  u_BG1 = row_uniforms(keys_B, g + 1)
  u_BG = u_BG1[:, :g]
  p_BG = gather_probs(draft_probs_BGV, drafts_BG)
  q_BG = gather_probs(target_probs_BG1V[:, :g], drafts_BG)
  # u < q/p without dividing (p > 0 for a token sampled from p).
  accept_BG = u_BG * p_BG < q_BG
  num_accepted_B = jnp.sum(jnp.cumprod(accept_BG.astype(jnp.int32), axis=1), axis=1)

  zeros_B1V = jnp.zeros_like(draft_probs_BGV[:, :1])
  p_ext_BG1V = jnp.concatenate([draft_probs_BGV, zeros_B1V], axis=1)
  idx = num_accepted_B[:, None, None]
  q_BV = jnp.take_along_axis(target_probs_BG1V, idx, axis=1)[:, 0]
  p_BV = jnp.take_along_axis(p_ext_BG1V, idx, axis=1)[:, 0]
  residual_BV = jnp.maximum(q_BV - p_BV, 0.0)
  mass_B1 = jnp.sum(residual_BV, axis=-1, keepdims=True)
  dist_BV = jnp.where(mass_B1 > 0, residual_BV / jnp.where(mass_B1 > 0, mass_B1, 1.0), q_BV)
  next_B = sample_from_uniform(u_BG1[:, g], dist_BV)
  return num_accepted_B.astype(jnp.int32), next_B


def greedy_verify(keys_B: jax.Array, drafts_BG: jax.Array, draft_probs_BGV: jax.Array,
                  target_probs_BG1V: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """`rejection_verify` specialised to greedy (one-hot) distributions.

  Keeps drafts while they equal the target's argmax, then emits the target's
  argmax: exactly what the rejection rule does with one-hot p and q, without
  random numbers (keys_B and draft_probs_BGV are unused). The speculative
  decoder uses it automatically for temperature 0 with the default verifier.
  """
  del keys_B, draft_probs_BGV
  g = drafts_BG.shape[1]
  best_BG1 = jnp.argmax(target_probs_BG1V, axis=-1).astype(jnp.int32)
  match_BG = (drafts_BG == best_BG1[:, :g]).astype(jnp.int32)
  num_accepted_B = jnp.sum(jnp.cumprod(match_BG, axis=1), axis=1).astype(jnp.int32)
  next_B = jnp.take_along_axis(best_BG1, num_accepted_B[:, None], axis=1)[:, 0]
  return num_accepted_B, next_B
