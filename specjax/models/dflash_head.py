"""A DFlash-style block draft (DFlash, arXiv 2602.06036): several draft layers conditioned on the
target's context features, drafting a whole block of tokens in one forward pass.

The target hands the draft, for every committed position t, its hidden states after the blocks
`DFlashConfig.target_layers` (a low-to-high selection, as EAGLE-3, arXiv 2503.01840, reads them),
concatenated `[X = k * E]`. They are fused into one context feature (`context_features`:
`fuse: [X] → E`, then RMS-normed) and, in **every** draft layer, projected to that layer's keys
and values (`context_kv`): the draft's KV cache holds these context keys and values only, per
layer, so it depends on the target's features alone and is written once per committed position
(at prefill and after each commit) — never recomputed as the block changes.

A block anchored at position a has K slots at positions a .. a + K - 1: slot 0 the anchor token
(the last committed one, the row's pending token) through the target's frozen embedding, slots
1 .. K - 1 a learned mask embedding. The slots run through the n draft layers; each slot's queries
attend to the context keys / values of positions < a (the target's features there) and to the
block's slots up to their own (causal within the block: a block cut to its first m slots gives
the same outputs for them, so one trained block serves every γ < K). After a final norm the
target's frozen LM head reads slot j's output as the draft distribution of the token at a + j
(j >= 1; slot 0's output is not used). The embedding and LM head are the target's (read from its
params, never copied into the draft's).

Shapes: B batch, T slots (queries), S context slots, L draft layers, H heads, D head dim, E the
target's width, X = k * E, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

import jax
import jax.numpy as jnp

from specjax._checks import check_int
from specjax.models.layers import apply_rope
from specjax.models.medusa_head import target_lm_head
from specjax.parallel.rules import whole_vocab

__all__ = ["DFlashConfig", "MAX_BLOCK", "init_dflash", "shared_weights", "context_features",
           "context_kv", "block_inputs", "block_hidden", "block_logits"]

MAX_BLOCK = 16
_LAYER_KEYS = ("attn_norm", "ctx_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class DFlashConfig:
  """The draft's shape (static).

  Attributes:
    d_model: E, the target's width (the draft works at the same width).
    vocab_size: V, the target's vocabulary (its embedding and LM head are shared).
    target_layers: the k >= 1 target blocks whose outputs are fused into the context feature.
    num_layers: n, the draft's layers (each reads the context).
    block: K in [2, 16], the block's slots (the anchor and K - 1 masks: up to K - 1 drafts).
    num_heads, head_dim, mlp_dim: each draft layer's attention and SwiGLU (defaults: E / heads,
      4 E).
    rope_theta, norm_eps: as the target's.
  """

  d_model: int
  vocab_size: int
  target_layers: Tuple[int, ...]
  num_layers: int = 2
  block: int = 8
  num_heads: int = 4
  head_dim: int = 0
  mlp_dim: int = 0
  rope_theta: float = 10000.0
  norm_eps: float = 1e-6

  def __post_init__(self):
    for name in ("d_model", "vocab_size", "num_layers", "num_heads"):
      check_int(name, getattr(self, name), 1)
    check_int("block", self.block, 2, MAX_BLOCK)
    try:
      layers = tuple(self.target_layers)
    except TypeError:
      raise TypeError(f"target_layers must be a sequence of target block indices, got "
                      f"{self.target_layers!r}") from None
    if not layers:
      raise ValueError("target_layers must name at least one target block (k >= 1), got ()")
    for i in layers:
      check_int("target_layers entries", i, 0)
    if len(set(layers)) != len(layers):
      raise ValueError(f"target_layers must be distinct, got {list(layers)}")
    object.__setattr__(self, "target_layers", tuple(int(i) for i in layers))
    if not self.head_dim:
      if self.d_model % self.num_heads:
        raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads "
                         f"({self.num_heads}) when head_dim is not given")
      object.__setattr__(self, "head_dim", self.d_model // self.num_heads)
    if not self.mlp_dim:
      object.__setattr__(self, "mlp_dim", 4 * self.d_model)
    check_int("head_dim", self.head_dim, 1)
    check_int("mlp_dim", self.mlp_dim, 1)

  @property
  def feature_width(self) -> int:
    """X: the width of what the target hands the draft per position."""
    return self.d_model * len(self.target_layers)

  @property
  def max_drafts(self) -> int:
    """K - 1: the drafts one block makes."""
    return self.block - 1

  def num_params(self) -> int:
    e, hd, f = self.d_model, self.num_heads * self.head_dim, self.mlp_dim
    per_layer = 3 * e + 3 * e * hd + hd * e + 3 * e * f
    return self.feature_width * e + 3 * e + self.num_layers * per_layer


def init_dflash(config: DFlashConfig, key: jax.Array) -> Dict[str, jax.Array]:
  """Fresh draft parameters (float32): {"fuse", "fuse_norm", "mask", "out_norm", "layers"}, the
  layers' weights stacked `[L, ...]`; output projections start at zero (each layer starts as the
  identity on its input)."""
  e, hd, f, n = config.d_model, config.num_heads * config.head_dim, config.mlp_dim, \
      config.num_layers
  x = config.feature_width
  ks = jax.random.split(key, 7)
  normal = lambda k, shape, fan_in: jax.random.normal(k, shape, jnp.float32) * fan_in ** -0.5
  ones = lambda: jnp.ones((n, e), jnp.float32)   # distinct buffers (a donated state)
  return {
      "fuse": normal(ks[0], (x, e), x),
      "fuse_norm": jnp.ones((e,), jnp.float32),
      "mask": jax.random.normal(ks[1], (e,), jnp.float32),
      "out_norm": jnp.ones((e,), jnp.float32),
      "layers": {
          "attn_norm": ones(), "ctx_norm": ones(), "mlp_norm": ones(),
          "q": normal(ks[2], (n, e, hd), e), "k": normal(ks[3], (n, e, hd), e),
          "v": normal(ks[4], (n, e, hd), e), "o": jnp.zeros((n, hd, e), jnp.float32),
          "gate": normal(ks[5], (n, e, f), e), "up": normal(ks[6], (n, e, f), e),
          "down": jnp.zeros((n, f, e), jnp.float32),
      },
  }


def _rms(x, scale, eps):
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def _layer(params, i: int) -> Dict[str, jax.Array]:
  return {n: params["layers"][n][i] for n in _LAYER_KEYS}


def shared_weights(target, target_params) -> Tuple[jax.Array, jax.Array]:
  """(embedding `[V, E]`, LM head `[E, V]`) of a decoder target: shared, frozen."""
  return target_params["embed"]["embedding"], target_lm_head(target, target_params)


def context_features(config: DFlashConfig, params, hidden_xX: jax.Array) -> jax.Array:
  """The target's concatenated block outputs `[..., X]` → the fused context feature `[..., E]`."""
  fused = hidden_xX.astype(jnp.float32) @ params["fuse"]
  return _rms(fused, params["fuse_norm"], config.norm_eps)


def _heads(config: DFlashConfig, x_BTx: jax.Array) -> jax.Array:
  return x_BTx.reshape(x_BTx.shape[:2] + (config.num_heads, config.head_dim))


def context_kv(config: DFlashConfig, params, ctx_BSE: jax.Array, positions_BS: jax.Array
               ) -> Tuple[jax.Array, jax.Array]:
  """Every draft layer's keys (rotated at `positions_BS`) and values of context features
  `ctx_BSE`: `(k_BLSHD, v_BLSHD)`, float32 (rows first: a cache laid out by rows)."""
  ks, vs = [], []
  for i in range(config.num_layers):
    p = _layer(params, i)
    h = _rms(ctx_BSE, p["ctx_norm"], config.norm_eps)
    ks.append(apply_rope(_heads(config, h @ p["k"]), positions_BS, config.rope_theta))
    vs.append(_heads(config, h @ p["v"]))
  return jnp.stack(ks, axis=1), jnp.stack(vs, axis=1)


def block_inputs(params, embedding_VE: jax.Array, anchors_xA: jax.Array, slots: int
                 ) -> jax.Array:
  """The blocks' slot inputs `[..., A, slots, E]`: each anchor token's embedding, then the mask."""
  emb = jnp.take(embedding_VE, anchors_xA, axis=0).astype(jnp.float32)[..., None, :]
  mask = jnp.broadcast_to(params["mask"], emb.shape[:-2] + (slots - 1,) + emb.shape[-1:])
  return jnp.concatenate([emb, mask], axis=-2)


def block_hidden(config: DFlashConfig, params, x_BTE: jax.Array, positions_BT: jax.Array,
                 ctx_k_BLSHD: jax.Array, ctx_v_BLSHD: jax.Array, ctx_mask_BTS: jax.Array,
                 self_mask_TT: jax.Array) -> jax.Array:
  """The draft layers over slot inputs `x_BTE` at `positions_BT` → final-normed outputs `[B, T,
  E]`. Query t attends to context slot s where `ctx_mask_BTS[b, t, s]` (broadcastable) and to
  slot u where `self_mask_TT[t, u]` (several blocks may share one call: training's anchors)."""
  scale = config.head_dim ** -0.5
  x = x_BTE.astype(jnp.float32)
  b, t = x.shape[:2]
  ctx_mask = jnp.broadcast_to(ctx_mask_BTS, (b, t, ctx_k_BLSHD.shape[2]))[:, None]
  self_mask = jnp.asarray(self_mask_TT, bool)[None, None]
  for i in range(config.num_layers):
    p = _layer(params, i)
    h = _rms(x, p["attn_norm"], config.norm_eps)
    q = apply_rope(_heads(config, h @ p["q"]), positions_BT, config.rope_theta)
    k = apply_rope(_heads(config, h @ p["k"]), positions_BT, config.rope_theta)
    v = _heads(config, h @ p["v"])
    ck = ctx_k_BLSHD[:, i].astype(jnp.float32)
    cv = ctx_v_BLSHD[:, i].astype(jnp.float32)
    s_ctx = jnp.where(ctx_mask, jnp.einsum("bthd,bshd->bhts", q, ck) * scale, -1e30)
    s_self = jnp.where(self_mask, jnp.einsum("bthd,buhd->bhtu", q, k) * scale, -1e30)
    w = jax.nn.softmax(jnp.concatenate([s_ctx, s_self], axis=-1), axis=-1)
    s = ck.shape[1]
    att = (jnp.einsum("bhts,bshd->bthd", w[..., :s], cv)
           + jnp.einsum("bhtu,buhd->bthd", w[..., s:], v))
    x = x + att.reshape(b, t, -1) @ p["o"]
    h = _rms(x, p["mlp_norm"], config.norm_eps)
    x = x + (jax.nn.silu(h @ p["gate"]) * (h @ p["up"])) @ p["down"]
  return _rms(x, params["out_norm"], config.norm_eps)


def block_logits(lm_head_EV: jax.Array, out_xE: jax.Array) -> jax.Array:
  """Slot outputs → float32 draft logits through the target's LM head (read in its own dtype)."""
  return whole_vocab(jnp.matmul(out_xE.astype(lm_head_EV.dtype), lm_head_EV,
                                preferred_element_type=jnp.float32))
