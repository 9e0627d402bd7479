"""Building blocks shared by the decoder-only LM and T5.

Shape names follow `specjax.protocol`: B batch, T new tokens, S cache slots,
H query heads, K key/value heads, D head dim, E model width, L layers.
"""

from __future__ import annotations

import functools
from typing import Any, List, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

__all__ = ["KVCache", "RMSNorm", "apply_rope", "contract", "kv_specs", "zero_arrays",
           "replace_layer", "to_cache_layout", "write_kv", "attend", "attend_cached"]


@struct.dataclass
class KVCache:
  """Static-shape self-attention cache with a length per row.

  Attributes:
    k: a tuple of L key buffers `[B, K, S, D]` (rotary already applied for
      the decoder LM).
    v: a tuple of L value buffers `[B, K, D, S]` (slots last).
    lengths: int32 `[B]`, valid positions of each row. Slots at or past a
      row's length are masked by attention and overwritten later; rolling a
      row back is lowering its length.

  One buffer per layer, heads before slots and values transposed: each buffer
  is then, whole, the operand the attention contractions read (XLA copies a
  slice of a stacked `[L, ...]` buffer, or a transposed one, on every step).
  The batch axis (0) and the kv-head axis (1) of every buffer are the axes to
  shard over a mesh (`specjax.sharding`).
  """

  k: Tuple[jax.Array, ...]
  v: Tuple[jax.Array, ...]
  lengths: jax.Array

  @property
  def max_len(self) -> int:
    """Number of slots S (static)."""
    return self.k[0].shape[2]

  @property
  def batch_size(self) -> int:
    return self.k[0].shape[0]

  @classmethod
  def zeros(cls, num_layers: int, batch_size: int, max_len: int, kv_heads: int,
            head_dim: int, dtype=jnp.float32) -> "KVCache":
    *kv, lengths = zero_arrays(*kv_specs(num_layers, batch_size, max_len, kv_heads, head_dim,
                                         dtype), ((batch_size,), jnp.int32))
    return cls(k=tuple(kv[:num_layers]), v=tuple(kv[num_layers:]), lengths=lengths)


def zero_arrays(*specs: Tuple[Sequence[int], Any]) -> Tuple[jax.Array, ...]:
  """Fresh zero arrays, one per `(shape, dtype)` spec, made by one jitted call.

  Made one `jnp.zeros` at a time, each array costs a dispatch of its own
  (~0.3 ms on CPU: a 17-buffer cache took ~5.6 ms, paid by every request
  that allocates one); inside a trace the result is the same zeros."""
  key = tuple((tuple(int(n) for n in shape), jnp.dtype(dtype)) for shape, dtype in specs)
  return _zeros_fn(key)()


@functools.lru_cache(maxsize=128)
def _zeros_fn(specs):
  return jax.jit(lambda: tuple(jnp.zeros(shape, dtype) for shape, dtype in specs))


def kv_specs(num_layers: int, batch_size: int, slots: int, heads: int, head_dim: int,
             dtype) -> List[Tuple[Tuple[int, ...], Any]]:
  """`(shape, dtype)` of the L key buffers `[B, K, S, D]`, then the L value
  buffers `[B, K, D, S]` (for `zero_arrays`)."""
  return ([((batch_size, heads, slots, head_dim), dtype)] * num_layers
          + [((batch_size, heads, head_dim, slots), dtype)] * num_layers)


def replace_layer(buffers: Tuple[jax.Array, ...], layer: int,
                  value: jax.Array) -> Tuple[jax.Array, ...]:
  """The tuple of per-layer buffers with layer `layer` replaced by `value`."""
  return buffers[:layer] + (value,) + buffers[layer + 1:]


def to_cache_layout(k_BSKD: jax.Array, v_BSKD: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """Projected keys / values `[B, S, K, D]` → `[B, K, S, D]`, `[B, K, D, S]`."""
  return k_BSKD.transpose(0, 2, 1, 3), v_BSKD.transpose(0, 2, 3, 1)


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


def contract(x: jax.Array, kernel: jax.Array, kernel_in_axes: Sequence[int],
             max_matvec_rows: int = 0, dtype=None) -> jax.Array:
  """`x [..., *in]` times `kernel` over its `kernel_in_axes` (matched, in
  order, to x's trailing axes) → `[..., *out]`, out = the kernel's other axes.

  With N = the product of x's leading axes, 1 < N <= `max_matvec_rows`
  computes N matrix-vector products issued back to back on the kernel (it
  streams from memory once; the later products read it from cache), else
  one matrix-matrix product. Same values either way, up to float rounding.
  `dtype`: the compute dtype both operands are cast to (None: unchanged).
  """
  k = len(kernel_in_axes)
  lead, inner = x.shape[: x.ndim - k], x.shape[x.ndim - k:]
  if tuple(kernel.shape[a] for a in kernel_in_axes) != tuple(inner):
    raise ValueError(f"x's trailing axes {tuple(inner)} do not match the kernel's axes "
                     f"{tuple(kernel_in_axes)} of shape {kernel.shape}")
  x_NI = x.reshape((-1,) + tuple(inner))
  if dtype is not None:
    x_NI, kernel = x_NI.astype(dtype), kernel.astype(dtype)
  dims = ((tuple(range(1, k + 1)), tuple(kernel_in_axes)), ((), ()))
  n = x_NI.shape[0]
  if 1 < n <= max_matvec_rows:
    y = jnp.concatenate([jax.lax.dot_general(x_NI[i:i + 1], kernel, dims) for i in range(n)],
                        axis=0)
  else:
    y = jax.lax.dot_general(x_NI, kernel, dims)
  return y.reshape(tuple(lead) + y.shape[1:])


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


def write_kv(k_BKSD: jax.Array, v_BKDS: jax.Array, new_k_BTKD: jax.Array,
             new_v_BTKD: jax.Array, start_B: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """Writes T new keys / values of row b at slots `start_B[b] .. + T - 1`.

  Scatters of B*T entries: XLA updates the (loop-carried) buffers in place.
  Callers guarantee start + T <= S (the generation API checks capacity).
  """
  b, t = new_k_BTKD.shape[:2]
  pos_BT = start_B[:, None] + jnp.arange(t, dtype=start_B.dtype)[None, :]
  rows_BT = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
  # Advanced indices split by slices: both indexed shapes are [B, T, K, D].
  k = k_BKSD.at[rows_BT, :, pos_BT].set(
      new_k_BTKD.astype(k_BKSD.dtype), indices_are_sorted=True, unique_indices=True)
  v = v_BKDS.at[rows_BT, :, :, pos_BT].set(
      new_v_BTKD.astype(v_BKDS.dtype), indices_are_sorted=True, unique_indices=True)
  return k, v


def attend(q_BTHD: jax.Array, k_BKSD: jax.Array, v_BKDS: jax.Array, mask_BTS: jax.Array,
           bias_BHTS: Optional[jax.Array] = None, scale: float = 1.0) -> jax.Array:
  """Multi-head / grouped-query attention over keys `[B, K, S, D]` and values
  `[B, K, D, S]` (the cache layout; `to_cache_layout` converts projections).

  Query head h uses kv head h // (H // K). Softmax in float32. A query whose
  mask is all false would average uniformly rather than produce NaN.
  """
  b, t, h, d = q_BTHD.shape
  kv, s = k_BKSD.shape[1], k_BKSD.shape[2]
  q_BTKGD = q_BTHD.reshape(b, t, kv, h // kv, d)
  scores = jnp.einsum("btkgd,bksd->bkgts", q_BTKGD, k_BKSD,
                      preferred_element_type=jnp.float32) * scale
  if bias_BHTS is not None:
    scores = scores + bias_BHTS.reshape(b, kv, h // kv, t, s).astype(jnp.float32)
  scores = jnp.where(mask_BTS[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(scores, axis=-1).astype(v_BKDS.dtype)
  out = jnp.einsum("bkgts,bkds->btkgd", weights, v_BKDS)
  return out.reshape(b, t, h, d)


def attend_cached(q_BTHD: jax.Array, new_k_BTKD: jax.Array, new_v_BTKD: jax.Array,
                  k_BKSD: jax.Array, v_BKDS: jax.Array, lengths_B: jax.Array,
                  bias_BHTS: Optional[jax.Array] = None, bias_new_BHTT: Optional[jax.Array] = None,
                  scale: float = 1.0, empty: bool = False) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """Attention of T new tokens (row b at positions `lengths_B[b] + 0..T-1`)
  over the row's cached slots `< lengths_B[b]` and, causally, over each
  other; then writes the new keys / values into the buffers (`write_kv`).

  Returns the attention output `[B, T, H, D]` and the updated buffers.

  The buffers are read (whole, by the contractions) before they are written.
  The written values are made to depend on the attention output (+ 0 times
  one of its elements: exact for finite values), so that XLA orders every
  read before the in-place write; without that dependency it copies each
  loop-carried buffer, twice per step. One softmax spans both parts.
  `bias_BHTS` is added to the cached part, `bias_new_BHTT` to the new part
  (T5's relative positions). `empty=True` (static) promises that every row's
  length is 0 (a prefill or a full forward): the cached part is skipped, and
  XLA does not constant-fold a fully masked `[B, K, G, T, S]` block.
  """
  b, t, h, d = q_BTHD.shape
  kv, s = k_BKSD.shape[1], k_BKSD.shape[2]
  g = h // kv
  q_BTKGD = q_BTHD.reshape(b, t, kv, g, d)
  new = jnp.einsum("btkgd,bukd->bkgtu", q_BTKGD, new_k_BTKD.astype(k_BKSD.dtype),
                   preferred_element_type=jnp.float32)
  new = new * scale
  if bias_new_BHTT is not None:
    new = new + bias_new_BHTT.reshape(bias_new_BHTT.shape[0], kv, g, t, t).astype(jnp.float32)
  neg = jnp.finfo(jnp.float32).min
  new = jnp.where(jnp.tril(jnp.ones((t, t), bool)), new, neg)
  new_v_BTKD = new_v_BTKD.astype(v_BKDS.dtype)
  if empty:
    weights = jax.nn.softmax(new, axis=-1).astype(v_BKDS.dtype)
    out = jnp.einsum("bkgtu,bukd->btkgd", weights, new_v_BTKD)
  else:
    old = jnp.einsum("btkgd,bksd->bkgts", q_BTKGD, k_BKSD,
                     preferred_element_type=jnp.float32) * scale
    if bias_BHTS is not None:
      old = old + bias_BHTS.reshape(b, kv, g, t, s).astype(jnp.float32)
    old = jnp.where((jnp.arange(s)[None, :] < lengths_B[:, None])[:, None, None, None, :], old, neg)
    weights = jax.nn.softmax(jnp.concatenate([old, new], axis=-1), axis=-1).astype(v_BKDS.dtype)
    out = (jnp.einsum("bkgts,bkds->btkgd", weights[..., :s], v_BKDS)
           + jnp.einsum("bkgtu,bukd->btkgd", weights[..., s:], new_v_BTKD))
  after = (out[0, 0, 0, 0, :1] * 0).astype(new_k_BTKD.dtype)
  k_BKSD, v_BKDS = write_kv(k_BKSD, v_BKDS, new_k_BTKD + after, new_v_BTKD + after, lengths_B)
  return out.reshape(b, t, h, d), k_BKSD, v_BKDS
