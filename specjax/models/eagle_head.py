"""The EAGLE head network (Li et al. 2024: EAGLE-1; 2025: EAGLE-3): one decoder layer over the
target's features, shared by the drafter (`drafters.eagle`) and its trainer (`training.eagle`).

The input at position t is the pair (f_t, x_{t+1}), the target's feature at t and the target's
(frozen) embedding of the next token, fused by `fc: [2E] → E` (`pair_inputs`); the output
predicts the next feature, which the target's frozen LM head turns into draft logits
(`head_logits`). EAGLE-1's feature is the target's final-normed state; EAGLE-3 fuses several
target blocks' outputs (`fuse_features`) and normalises its output before the LM head.

A *block* head (`EagleConfig.block` = K > 0; DFlash, arXiv 2602.06036) drafts K positions in
one pass: slot 0 is the pair at position t, slots 1..K-1 a learned mask input (`mask_inputs`)
at t+1..t+K-1, each attending to the head's cache and causally to the block; slot j predicts
x_{t+j+2}. It may stack `num_layers` layers; as in DFlash the context enters every layer
directly (layer i's keys and values of a committed pair are layer i's projections of the
pair's input, `layer_params`, so the cache depends on the pairs alone), while only the block's
slots flow through the layers. A layer is `qkv` → `attend` → `finish`.

Shapes: B batch, T positions, S key slots, H heads, D head dim, E target width, X the target's
feature width (E, or len(feature_layers) * E).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

import jax
import jax.numpy as jnp

from specjax._checks import check_int
from specjax.models.layers import apply_rope
from specjax.parallel.rules import on_mesh, whole_vocab
from specjax.models.medusa_head import target_lm_head

__all__ = ["EagleConfig", "init_eagle", "shared_weights", "fuse_features", "pair_inputs",
           "mask_inputs", "layer_params", "qkv", "attend", "finish", "head_logits"]


@dataclasses.dataclass(frozen=True)
class EagleConfig:
  """The head's shape.

  Attributes:
    d_model: E, the target's width (the head works at the same width).
    vocab_size: V, the target's vocabulary (embedding and LM head shared).
    num_heads, head_dim, mlp_dim: the head layer's attention and SwiGLU.
    feature_layers: () for EAGLE-1 (the target's final-normed state), or the target blocks
      whose outputs are fused (EAGLE-3: low, middle, high).
    rope_theta, norm_eps: as the target's.
    block: 0 for an autoregressive head (EAGLE), or K > 0: a block head (module doc).
    num_layers: the head's layers (> 1 for block heads only).
    split: on a mesh, the head is split over `model` like the target (Megatron-style) and its
      activations pinned to that layout; False: whole on every device. A layout only: no
      effect off a mesh, nor on the parameters.
  """

  d_model: int
  vocab_size: int
  num_heads: int = 4
  head_dim: int = 0
  mlp_dim: int = 0
  feature_layers: Tuple[int, ...] = ()
  rope_theta: float = 10000.0
  norm_eps: float = 1e-6
  block: int = 0
  num_layers: int = 1
  split: bool = False

  def __post_init__(self):
    for name in ("d_model", "vocab_size", "num_heads"):
      check_int(name, getattr(self, name), 1)
    if not self.head_dim:
      if self.d_model % self.num_heads:
        raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads "
                         f"({self.num_heads}) when head_dim is not given")
      object.__setattr__(self, "head_dim", self.d_model // self.num_heads)
    if not self.mlp_dim:
      object.__setattr__(self, "mlp_dim", 4 * self.d_model)
    check_int("head_dim", self.head_dim, 1)
    check_int("mlp_dim", self.mlp_dim, 1)
    check_int("block", self.block, 0)
    check_int("num_layers", self.num_layers, 1)
    if self.num_layers > 1 and not self.block:
      raise ValueError(f"num_layers={self.num_layers} needs a block head (block > 0): an "
                       f"autoregressive EAGLE head has one layer")
    layers = tuple(self.feature_layers)
    for i in layers:
      check_int("feature_layers entries", i, 0)
    object.__setattr__(self, "feature_layers", tuple(int(i) for i in layers))

  @property
  def version(self) -> int:
    """1 (final-state features) or 3 (fused multi-layer features)."""
    return 3 if self.feature_layers else 1

  @property
  def feature_width(self) -> int:
    """X: the width of what the target hands the head per position."""
    return self.d_model * max(len(self.feature_layers), 1)

  def num_params(self) -> int:
    e, hd, f = self.d_model, self.num_heads * self.head_dim, self.mlp_dim
    n = 2 * e * e + (4 * e * hd + 3 * e * f + 2 * e) * self.num_layers
    if self.version == 3:
      n += self.feature_width * e + e
    return n + (e if self.block else 0)


def init_eagle(config: EagleConfig, key: jax.Array) -> Dict[str, jax.Array]:
  """Fresh head parameters (float32); `fc` starts near [identity; 0], so a fresh head passes
  the feature through."""
  e, hd, f = config.d_model, config.num_heads * config.head_dim, config.mlp_dim
  ks = jax.random.split(key, 8)
  normal = lambda k, shape, fan_in: jax.random.normal(k, shape, jnp.float32) * fan_in ** -0.5
  params = {
      "fc": normal(ks[0], (2 * e, e), 2 * e),
      "attn_norm": jnp.ones((e,), jnp.float32),
      "q": normal(ks[1], (e, hd), e), "k": normal(ks[2], (e, hd), e),
      "v": normal(ks[3], (e, hd), e), "o": jnp.zeros((hd, e), jnp.float32),
      "mlp_norm": jnp.ones((e,), jnp.float32),
      "gate": normal(ks[4], (e, f), e), "up": normal(ks[5], (e, f), e),
      "down": jnp.zeros((f, e), jnp.float32),
  }
  params["fc"] = params["fc"] * 0.1 + jnp.concatenate(
      [jnp.eye(e, dtype=jnp.float32), jnp.zeros((e, e), jnp.float32)], axis=0)
  if config.version == 3:
    x = config.feature_width
    params["fuse"] = normal(ks[6], (x, e), x)
    params["out_norm"] = jnp.ones((e,), jnp.float32)
  if config.block:   # the mask slots' input (unit scale, as the normed features)
    params["mask"] = jax.random.normal(ks[7], (e,), jnp.float32)
  if config.num_layers > 1:   # the block head's later layers, stacked `[L - 1, ...]`
    one = dataclasses.replace(config, num_layers=1, feature_layers=(), block=0)
    keys = jax.random.split(jax.random.fold_in(ks[7], 1), config.num_layers - 1)
    extra = [init_eagle(one, k) for k in keys]
    params["layers"] = {n: jnp.stack([x[n] for x in extra]) for n in _LAYER_KEYS}
  return params


_LAYER_KEYS = ("attn_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down")


def layer_params(params, i: int) -> Dict[str, jax.Array]:
  """Layer `i`'s weights for `qkv` / `finish` (0: the first; i > 0: a block head's later)."""
  if i == 0:
    return params
  return {n: params["layers"][n][i - 1] for n in _LAYER_KEYS}


# A split head's layout (`EagleConfig.split`; no-ops otherwise): activations `[B, ..., E]`
# whole on every device, a column-split kernel's output split on its last axis as it is made
# (XLA then gathers the output, not the kernel), q / k / v / attention over `model` by head.
def _whole(config: EagleConfig, x_BxE: jax.Array) -> jax.Array:
  return on_mesh(x_BxE, "B" + "_" * (x_BxE.ndim - 1)) if config.split else x_BxE


def _split(config: EagleConfig, x_BxE: jax.Array) -> jax.Array:
  return on_mesh(x_BxE, "B" + "_" * (x_BxE.ndim - 2) + "F") if config.split else x_BxE


def _heads(config: EagleConfig, x_BTHD: jax.Array) -> jax.Array:
  return on_mesh(x_BTHD, "BTHD") if config.split else x_BTHD


def _rms(x, scale, eps):
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def shared_weights(target, target_params) -> Tuple[jax.Array, jax.Array]:
  """(embedding `[V, E]`, LM head `[E, V]`) of a decoder target (frozen, shared)."""
  return target_params["embed"]["embedding"], target_lm_head(target, target_params)


def fuse_features(config: EagleConfig, params, feats_xX: jax.Array) -> jax.Array:
  """The target's per-position features `[..., X]` → the head's `[..., E]`."""
  feats = feats_xX.astype(jnp.float32)
  if config.version == 3:
    return _whole(config, _split(config, feats @ params["fuse"]))
  return feats


def pair_inputs(config: EagleConfig, params, embedding_VE, feat_xE: jax.Array,
                tokens_x: jax.Array) -> jax.Array:
  """The head's input for pairs (feature, next token) → `[..., E]`."""
  emb = jnp.take(embedding_VE, tokens_x, axis=0).astype(jnp.float32)
  x = jnp.concatenate([feat_xE.astype(jnp.float32), emb], axis=-1) @ params["fc"]
  return _whole(config, _split(config, x))


def mask_inputs(params, shape: Tuple[int, ...]) -> jax.Array:
  """A block head's mask-slot input broadcast to `shape + (E,)`."""
  return jnp.broadcast_to(params["mask"], tuple(shape) + params["mask"].shape)


def qkv(config: EagleConfig, params, x_BTE, positions_BT):
  """The head layer's rotated queries and keys, and values, `[B, T, H, D]` each."""
  b, t = x_BTE.shape[:2]
  h = _rms(x_BTE, params["attn_norm"], config.norm_eps)
  shape = (b, t, config.num_heads, config.head_dim)
  heads = lambda x: _heads(config, x.reshape(shape))
  q = apply_rope(heads(h @ params["q"]), positions_BT, config.rope_theta)
  k = apply_rope(heads(h @ params["k"]), positions_BT, config.rope_theta)
  return q, k, heads(h @ params["v"])


def attend(config: EagleConfig, q_BTHD, sources, diag=()):
  """Softmax attention of `q_BTHD` over several key/value sources at once.

  sources: (k_BSHD, v_BSHD, mask) with mask broadcastable to `[B, T, S]`; diag: (k_BTHD,
  v_BTHD) pairs each query t also attends to at its own index t (training-time test: the same
  base position's later steps)."""
  scale = config.head_dim ** -0.5
  logits, values = [], []
  for k, v, mask in sources:
    s = jnp.einsum("bthd,bshd->bhts", q_BTHD, k) * scale
    logits.append(jnp.where(jnp.asarray(mask)[:, None], s, -1e30))
    values.append(("full", v))
  for k, v in diag:
    logits.append(jnp.einsum("bthd,bthd->bht", q_BTHD, k)[..., None] * scale)
    values.append(("diag", v))
  w = jax.nn.softmax(jnp.concatenate(logits, axis=-1), axis=-1)
  out, at = 0.0, 0
  for (kind, v), s in zip(values, logits):
    n = s.shape[-1]
    part = w[..., at:at + n]
    at += n
    if kind == "full":
      out = out + jnp.einsum("bhts,bshd->bthd", part, v)
    else:
      out = out + part[..., 0].transpose(0, 2, 1)[..., None] * v
  return _heads(config, out)


def finish(config: EagleConfig, params, x_BTE, att_BTHD):
  """The layer after attention: output projection, residual, SwiGLU MLP."""
  b, t = x_BTE.shape[:2]
  x = _whole(config, x_BTE + att_BTHD.reshape(b, t, -1) @ params["o"])
  h = _rms(x, params["mlp_norm"], config.norm_eps)
  return _whole(config,
                x + (jax.nn.silu(h @ params["gate"]) * (h @ params["up"])) @ params["down"])


def head_logits(config: EagleConfig, params, lm_head_EV, out_xE: jax.Array) -> jax.Array:
  """The head's outputs (predicted features) → float32 draft logits."""
  if config.version == 3:
    out_xE = _rms(out_xE, params["out_norm"], config.norm_eps)
  # The shared head is read in its own dtype (no float32 copy per step), accumulating in f32.
  return whole_vocab(jnp.matmul(out_xE.astype(lm_head_EV.dtype), lm_head_EV,
                               preferred_element_type=jnp.float32))
