"""Measuring how well a draft matches a target: α from exact distributions.

Leviathan et al. define α = E[β] with β = Σ_x min(p(x), q(x)) over the
positions the target actually generates. `position_distributions` teacher-
forces a model (through the protocol's prefill + one extend) on given
continuations and returns its processed distributions; `measure_beta` does it
for both models and returns β at every generated position.
"""

from __future__ import annotations

import functools
from typing import Tuple

import jax
import jax.numpy as jnp

from specjax.api import required_cache_len
from specjax.sampling import SamplingConfig, process_logits

__all__ = ["position_distributions", "measure_beta"]


@functools.partial(jax.jit, static_argnames=("model", "sampling"))
def position_distributions(model, params, prompts_BP, prompt_lengths_B, tokens_BN,
                           sampling: SamplingConfig) -> jax.Array:
  """Processed next-token distributions `[B, N, V]` of `model` at the N
  positions where tokens_BN[b, :] were generated after prompt b: position 0
  from the prefill, positions 1.. from one extend over tokens[:, :-1].
  Jitted; `model` and `sampling` are static."""
  b, p = prompts_BP.shape
  n = tokens_BN.shape[1]
  cache = model.init_cache(b, required_cache_len(model, p, n), p)
  first_BV, _, cache = model.prefill(params, prompts_BP, prompt_lengths_B, cache)
  if n > 1:
    rest_BTV, _ = model.extend(params, tokens_BN[:, :-1], cache)
    logits = jnp.concatenate([first_BV[:, None], rest_BTV], axis=1)
  else:
    logits = first_BV[:, None]
  return process_logits(logits, sampling)


def measure_beta(target, target_params, draft, draft_params, prompts_BP, prompt_lengths_B,
                 tokens_BN, token_lengths_B, sampling: SamplingConfig
                 ) -> Tuple[jax.Array, jax.Array]:
  """β = Σ min(p, q) at each generated position.

  Returns `(beta_BN, mask_BN)`; mask marks the positions < token_lengths_B.
  α is `sum(beta * mask) / sum(mask)`. With greedy sampling β is 1 where the
  argmaxes agree and 0 elsewhere.
  """
  q = position_distributions(target, target_params, prompts_BP, prompt_lengths_B, tokens_BN,
                             sampling)
  p = position_distributions(draft, draft_params, prompts_BP, prompt_lengths_B, tokens_BN,
                             sampling)
  beta = jnp.sum(jnp.minimum(p, q), axis=-1)
  mask = jnp.arange(tokens_BN.shape[1])[None] < token_lengths_B[:, None]
  return beta, mask
