"""Building blocks shared by the decoder-only LM and T5.

Shape names follow `specjax.protocol`: B batch, T new tokens, S cache slots,
H query heads, K key/value heads, D head dim, E model width, L layers.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

__all__ = ["KVCache", "RMSNorm", "apply_rope", "write_rows", "attend", "valid_mask"]


@struct.dataclass
class KVCache:
  """Static-shape self-attention cache with a length per row.

  Attributes:
    k: keys `[L, B, S, K, D]` (rotary already applied for the decoder LM).
    v: values `[L, B, S, K, D]`.
    lengths: int32 `[B]`, valid positions of each row. Slots at or past a
      row's length are masked by attention and overwritten later; rolling a
      row back is lowering its length.

  The batch axis (1) and the kv-head axis (3) are the axes to shard over a
  mesh (`specjax.sharding`).
  """

  k: jax.Array
  v: jax.Array
  lengths: jax.Array

  @property
  def max_len(self) -> int:
    """Number of slots S (static)."""
    return self.k.shape[2]

  @property
  def batch_size(self) -> int:
    return self.k.shape[1]

  @classmethod
  def zeros(cls, num_layers: int, batch_size: int, max_len: int, kv_heads: int,
            head_dim: int, dtype=jnp.float32) -> "KVCache":
    shape = (num_layers, batch_size, max_len, kv_heads, head_dim)
    return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
               lengths=jnp.zeros((batch_size,), jnp.int32))


class RMSNorm(nn.Module):
  """Scale-only RMS layer norm (also T5's layer norm): x / rms(x) * scale."""

  eps: float = 1e-6
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (x32 * scale.astype(jnp.float32)).astype(self.dtype)


def apply_rope(x_BTHD: jax.Array, positions_BT: jax.Array, theta: float) -> jax.Array:
  """Rotary position embedding, "rotate half" layout (as Llama/transformers)."""
  d = x_BTHD.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
  angles_BTd = positions_BT.astype(jnp.float32)[..., None] * inv_freq
  angles_BTD = jnp.concatenate([angles_BTd, angles_BTd], axis=-1)[:, :, None, :]
  cos, sin = jnp.cos(angles_BTD), jnp.sin(angles_BTD)
  x32 = x_BTHD.astype(jnp.float32)
  x1, x2 = x32[..., : d // 2], x32[..., d // 2:]
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return (x32 * cos + rotated * sin).astype(x_BTHD.dtype)


def write_rows(buf_LBSKD: jax.Array, layer: int, new_BTKD: jax.Array,
               start_B: jax.Array) -> jax.Array:
  """Writes `new_BTKD` into layer `layer` of the buffer, row b at `start_B[b]`.

  A scatter of B*T entries: XLA updates the (loop-carried) buffer in place.
  Callers guarantee start + T <= S (the generation API checks capacity).
  """
  b, t = new_BTKD.shape[:2]
  pos_BT = start_B[:, None] + jnp.arange(t, dtype=start_B.dtype)[None, :]
  rows_BT = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
  return buf_LBSKD.at[layer, rows_BT, pos_BT].set(
      new_BTKD.astype(buf_LBSKD.dtype), indices_are_sorted=True, unique_indices=True)


def valid_mask(query_pos_BT: jax.Array, num_slots: int) -> jax.Array:
  """Causal mask over cache slots: slot s is visible to a query at position q
  iff s <= q. Since rows write their T new tokens at lengths..lengths+T-1,
  this also hides every stale slot past the row's length. Returns `[B, T, S]`."""
  return jnp.arange(num_slots)[None, None, :] <= query_pos_BT[:, :, None]


def attend(q_BTHD: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array, mask_BTS: jax.Array,
           bias_BHTS: jax.Array | None = None, scale: float = 1.0) -> jax.Array:
  """Multi-head / grouped-query attention over a masked key buffer.

  Query head h uses kv head h // (H // K). Softmax in float32. Rows whose mask
  is all false (never happens for valid queries) would average uniformly
  rather than produce NaN.
  """
  b, t, h, d = q_BTHD.shape
  s, kv = k_BSKD.shape[1], k_BSKD.shape[2]
  g = h // kv
  q_BTKGD = q_BTHD.reshape(b, t, kv, g, d)
  scores = jnp.einsum("btkgd,bskd->bkgts", q_BTKGD, k_BSKD,
                      preferred_element_type=jnp.float32) * scale
  if bias_BHTS is not None:
    scores = scores + bias_BHTS.reshape(b, kv, g, t, s).astype(jnp.float32)
  scores = jnp.where(mask_BTS[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(scores, axis=-1).astype(v_BSKD.dtype)
  out = jnp.einsum("bkgts,bskd->btkgd", weights, v_BSKD)
  return out.reshape(b, t, h, d)
