"""Padding is never read: right-padded prompts with their padding replaced by a valid id.

Prompts `[B, P]` are right-padded; only the first `lengths_B[b]` ids of row b are checked (any
int32 may lie past them: negative, >= the vocabulary, 2**31 - 1). Whatever reads a whole prompt
row (a model's prefill embedding every position, a drafter copying the prompt into its history)
passes it through `mask_padding` first, so the padding's ids never reach an embedding lookup
(where an id outside the table gives NaN that masked attention still multiplies by 0) and the
output is the same as with clean padding, bit for bit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["mask_padding"]


def mask_padding(tokens_BP: jax.Array, lengths_B: jax.Array, fill: int = 0) -> jax.Array:
  """int32 `tokens_BP` with every position >= its row's length set to `fill` (a valid id).

  Args:
    tokens_BP: right-padded ids `[B, P]` (any integer dtype).
    lengths_B: each row's length `[B]`; positions `>= lengths_B[b]` are padding.
    fill: the id written over the padding (0, or a model's own pad id).

  Returns:
    int32 `[B, P]`: the ids within the lengths as they are, `fill` past them. Pure and
    traceable (one select); positions within the lengths are untouched.
  """
  tokens_BP = jnp.asarray(tokens_BP).astype(jnp.int32)
  inside_BP = (jax.lax.broadcasted_iota(jnp.int32, tokens_BP.shape, 1)
               < jnp.asarray(lengths_B).astype(jnp.int32)[:, None])
  return jnp.where(inside_BP, tokens_BP, jnp.int32(fill))
