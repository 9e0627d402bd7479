"""The Medusa-1 head network (Cai et al. 2024), shared by the drafter
(`specjax.drafters.medusa`) and its trainer (`specjax.training.heads`).

K heads read the target's final-normed hidden state h; head k is a residual block and a
vocabulary projection, z_k = h + SiLU(h W_k + b_k), logits_k = z_k U_k, with W_k = 0 at
initialisation (a fresh head is the target's LM head) and U_k copied from the target's LM head
(trainable), or the target's own, shared and frozen (`MedusaConfig.share_lm_head`).
"""

from __future__ import annotations

import dataclasses
from typing import Dict

import jax
import jax.numpy as jnp

from specjax.parallel.rules import whole_vocab
from specjax._checks import check_int

__all__ = ["MedusaConfig", "target_lm_head", "init_heads", "head_logits"]


@dataclasses.dataclass(frozen=True)
class MedusaConfig:
  """The heads' shape: `num_heads` K over width `d_model` E, vocabulary V."""

  num_heads: int
  d_model: int
  vocab_size: int
  share_lm_head: bool = False

  def __post_init__(self):
    for name in ("num_heads", "d_model", "vocab_size"):
      check_int(name, getattr(self, name), 1)


def target_lm_head(target, target_params) -> jax.Array:
  """The target's output projection `[E, V]` (tied: the embedding transposed)."""
  c = target.config
  if getattr(c, "tie_embeddings", False):
    return target_params["embed"]["embedding"].T
  return target_params["lm_head"]["kernel"]


def init_heads(config: MedusaConfig, target, target_params) -> Dict[str, jax.Array]:
  """Fresh heads: zero residual blocks, LM heads copied from the target's."""
  k, e = config.num_heads, config.d_model
  params = {"w": jnp.zeros((k, e, e), jnp.float32), "b": jnp.zeros((k, e), jnp.float32)}
  if not config.share_lm_head:
    lm = jnp.asarray(target_lm_head(target, target_params), jnp.float32)
    params["lm_head"] = jnp.broadcast_to(lm[None], (k,) + lm.shape).copy()
  return params


def head_logits(config: MedusaConfig, params, h_xE: jax.Array, shared_lm_head=None) -> jax.Array:
  """Hidden states `[..., E]` → float32 logits `[..., K, V]`."""
  h = h_xE.astype(jnp.float32)
  z = h[..., None, :] + jax.nn.silu(jnp.einsum("...e,kef->...kf", h, params["w"]) + params["b"])
  if config.share_lm_head:
    # Read in its own dtype (no float32 copy of a bf16 table per step), float32 sums.
    return whole_vocab(jnp.einsum("...ke,ev->...kv", z.astype(shared_lm_head.dtype),
                                  shared_lm_head, preferred_element_type=jnp.float32))
  return whole_vocab(jnp.einsum("...ke,kev->...kv", z, params["lm_head"]))
