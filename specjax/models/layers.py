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

from specjax.models import attention_kernel
from specjax.models.rope import rope_frequencies

__all__ = ["KVCache", "RMSNorm", "apply_rope", "contract", "accumulate_f32_dot", "kv_specs",
           "zero_arrays", "replace_layer", "to_cache_layout", "write_kv", "copy_slots", "attend",
           "attend_cached"]


@struct.dataclass
class KVCache:
  """Static-shape self-attention cache with a length per row.

  Attributes:
    k: a tuple of L key buffers `[B, K, D, S]` (slots last; rotary already applied for the
      decoder LM).
    v: a tuple of L value buffers `[B, K, S, D]` (slots first).
    lengths: int32 `[B]`, valid positions of each row. Slots at or past a row's length are
      masked by attention and overwritten later; rolling a row back is lowering its length.

  One buffer per layer, keys transposed: each is, whole, the right-hand operand of its attention
  product, read once per call however large T is (why: docs/architecture.md, "Shape
  convention"). Axes 0 (batch) and 1 (kv heads) are sharded over a mesh.
  """

  k: Tuple[jax.Array, ...]
  v: Tuple[jax.Array, ...]
  lengths: jax.Array

  @property
  def max_len(self) -> int:
    """Number of slots S (static)."""
    return self.v[0].shape[2]

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
  """Fresh zero arrays, one per `(shape, dtype)` spec, made by one jitted call (one dispatch for
  a cache of many buffers, not one per buffer); inside a trace, the same zeros."""
  key = tuple((tuple(int(n) for n in shape), jnp.dtype(dtype)) for shape, dtype in specs)
  return _zeros_fn(key)()


@functools.lru_cache(maxsize=128)
def _zeros_fn(specs):
  return jax.jit(lambda: tuple(jnp.zeros(shape, dtype) for shape, dtype in specs))


def kv_specs(num_layers: int, batch_size: int, slots: int, heads: int, head_dim: int,
             dtype) -> List[Tuple[Tuple[int, ...], Any]]:
  """`(shape, dtype)` of the L key `[B, K, D, S]`, then the L value `[B, K, S, D]` buffers."""
  return ([((batch_size, heads, head_dim, slots), dtype)] * num_layers
          + [((batch_size, heads, slots, head_dim), dtype)] * num_layers)


def replace_layer(buffers: Tuple[jax.Array, ...], layer: int,
                  value: jax.Array) -> Tuple[jax.Array, ...]:
  """The tuple of per-layer buffers with layer `layer` replaced by `value`."""
  return buffers[:layer] + (value,) + buffers[layer + 1:]


def to_cache_layout(k_BSKD: jax.Array, v_BSKD: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """Projected keys / values `[B, S, K, D]` → `[B, K, D, S]`, `[B, K, S, D]`."""
  return k_BSKD.transpose(0, 2, 3, 1), v_BSKD.transpose(0, 2, 1, 3)


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
  """`x [..., *in]` times `kernel` over its `kernel_in_axes` (matched, in order, to x's trailing
  axes) → `[..., *out]`, out = the kernel's other axes.

  With N = the product of x's leading axes, 1 < N <= `max_matvec_rows` issues N matrix-vector
  products back to back (the kernel streams from memory once), else one matrix-matrix product;
  same values up to float rounding. `dtype`: the compute dtype of both operands (None: as is).
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
  dot = functools.partial(accumulate_f32_dot, out_dtype=jnp.result_type(x_NI, kernel))
  if 1 < n <= max_matvec_rows:
    y = jnp.concatenate([dot(x_NI[i:i + 1], kernel, dims) for i in range(n)], axis=0)
  else:
    y = dot(x_NI, kernel, dims)
  return y.reshape(tuple(lead) + y.shape[1:])


def block_boundary(x_BTE: jax.Array) -> jax.Array:
  """The residual stream `[B, T, E]` between two blocks, materialised when T > 1 (an
  `optimization_barrier`; the identity on values). Without it XLA's TPU compiler fuses the
  stream into the final norm and keeps all 2L all-reduced block outputs `[B·T, E]` live until the
  call ends — most of a long prefill's memory per chip."""
  return jax.lax.optimization_barrier(x_BTE) if x_BTE.shape[1] > 1 else x_BTE


def accumulate_f32_dot(lhs, rhs, dimension_numbers, precision=None, out_dtype=None, **kw):
  """`lax.dot_general` that accumulates in float32 and rounds once to the operands' dtype: a
  bf16 / f16 product whose contraction is split over `model` (`o`, `down`) then equals the
  unsplit one, its partial sums and all-reduce staying in float32. float32 operands: unchanged."""
  out_dtype = jnp.result_type(lhs, rhs) if out_dtype is None else out_dtype
  if out_dtype == jnp.float32:
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision, **kw)
  kw.pop("preferred_element_type", None)
  y = jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                          preferred_element_type=jnp.float32, **kw)
  return y.astype(out_dtype)


def apply_rope(x_BTHD: jax.Array, positions_BT: jax.Array, theta: float,
               scaling=None) -> jax.Array:
  """Rotary position embedding, "rotate half" layout (as Llama/transformers).

  `scaling`: a context-extension rule (`specjax.models.rope`: linear, llama3, yarn; None: plain);
  its frequencies are trace constants computed on the host."""
  d = x_BTHD.shape[-1]
  inv_freq, attention_factor = rope_frequencies(d, theta, scaling)
  angles_BTd = positions_BT.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
  angles_BTD = jnp.concatenate([angles_BTd, angles_BTd], axis=-1)[:, :, None, :]
  cos, sin = jnp.cos(angles_BTD), jnp.sin(angles_BTD)
  if attention_factor != 1.0:
    cos, sin = cos * attention_factor, sin * attention_factor
  x32 = x_BTHD.astype(jnp.float32)
  x1, x2 = x32[..., : d // 2], x32[..., d // 2:]
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return (x32 * cos + rotated * sin).astype(x_BTHD.dtype)


# Up to this many rows, `write_kv` writes each row with its own dynamic-update-slice (in place,
# cheap); above it, one scatter (XLA:CPU's scatter of T > 1 positions is much slower per buffer).
_ROW_WRITES_MAX_ROWS = 64


def write_kv(k_BKDS: jax.Array, v_BKSD: jax.Array, new_k_BTKD: jax.Array,
             new_v_BTKD: jax.Array, start_B: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """Writes T new keys / values of row b at slots `start_B[b] .. + T - 1`.

  In place on the (loop-carried) buffers: one dynamic-update-slice per row (a scatter above 64
  rows). Callers guarantee start + T <= S (the generation API checks capacity)."""
  return _write_slots(k_BKDS, v_BKSD, new_k_BTKD.astype(k_BKDS.dtype).transpose(0, 2, 3, 1),
                      new_v_BTKD.astype(v_BKSD.dtype).transpose(0, 2, 1, 3), start_B)


def _write_slots(k_BKDS, v_BKSD, k_BKDT, v_BKTD, start_B):
  """Writes keys `[B, K, D, T]` / values `[B, K, T, D]` at slots start_B[b].. of each row."""
  b, t = k_BKDT.shape[0], k_BKDT.shape[3]
  if b <= _ROW_WRITES_MAX_ROWS:
    zero = jnp.zeros((), jnp.int32)
    for r in range(b):
      at = start_B[r].astype(jnp.int32)
      row = jnp.int32(r)
      k_BKDS = jax.lax.dynamic_update_slice(k_BKDS, k_BKDT[r:r + 1], (row, zero, zero, at))
      v_BKSD = jax.lax.dynamic_update_slice(v_BKSD, v_BKTD[r:r + 1], (row, zero, at, zero))
    return k_BKDS, v_BKSD
  pos_BT = start_B[:, None] + jnp.arange(t, dtype=start_B.dtype)[None, :]
  rows_BT = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
  # Advanced indices split by slices: the indexed shapes are [B, T, K, D].
  k = k_BKDS.at[rows_BT, :, :, pos_BT].set(k_BKDT.transpose(0, 3, 1, 2),
                                           indices_are_sorted=True, unique_indices=True)
  v = v_BKSD.at[rows_BT, :, pos_BT].set(v_BKTD.transpose(0, 2, 1, 3),
                                        indices_are_sorted=True, unique_indices=True)
  return k, v


def copy_slots(k_BKDS: jax.Array, v_BKSD: jax.Array, src_BN: jax.Array,
               dst_B: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """Copies row b's slots `src_BN[b, i]` to slots `dst_B[b] + i` (i < N), in both buffers; the
  entries are gathered first, so the ranges may overlap. Touches N slots per row, nothing else."""
  # Clipped, never NaN-filled: a finished row's call may point past the buffer.
  k_BKDN = jnp.take_along_axis(k_BKDS, src_BN[:, None, None, :], axis=3, mode="clip")
  v_BKND = jnp.take_along_axis(v_BKSD, src_BN[:, None, :, None], axis=2, mode="clip")
  return _write_slots(k_BKDS, v_BKSD, k_BKDN, v_BKND, dst_B)


def _queries(q_BTHD: jax.Array, kv: int) -> jax.Array:
  """Queries `[B, T, H, D]` → `[B, K, T·G, D]` (query head h = kv head h // G)."""
  b, t, h, d = q_BTHD.shape
  return q_BTHD.reshape(b, t, kv, h // kv, d).transpose(0, 2, 1, 3, 4).reshape(b, kv, -1, d)


def _bias_BKTGX(bias_BHTX: jax.Array, kv: int) -> jax.Array:
  """An additive bias `[B | 1, H, T, X]` → `[B | 1, K, T, G, X]`, float32."""
  b, h, t, x = bias_BHTX.shape
  return bias_BHTX.reshape(b, kv, h // kv, t, x).transpose(0, 1, 3, 2, 4).astype(jnp.float32)


def attend(q_BTHD: jax.Array, k_BKDS: jax.Array, v_BKSD: jax.Array, mask_BTS: jax.Array,
           bias_BHTS: Optional[jax.Array] = None, scale: float = 1.0) -> jax.Array:
  """Multi-head / grouped-query attention over keys `[B, K, D, S]` and values `[B, K, S, D]`
  (the cache layout; `to_cache_layout` converts projections).

  Query head h uses kv head h // (H // K); softmax in float32; an all-false mask row averages
  uniformly rather than produce NaN. The queries are the left operand of both products, so each
  buffer is read once for all T queries.
  """
  b, t, h, d = q_BTHD.shape
  kv, s = k_BKDS.shape[1], k_BKDS.shape[3]
  g = h // kv
  scores = jnp.einsum("bkqd,bkds->bkqs", _queries(q_BTHD, kv), k_BKDS,
                      preferred_element_type=jnp.float32).reshape(b, kv, t, g, s) * scale
  if bias_BHTS is not None:
    scores = scores + _bias_BKTGX(bias_BHTS, kv)
  scores = jnp.where(mask_BTS[:, None, :, None, :], scores, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(scores, axis=-1).astype(v_BKSD.dtype).reshape(b, kv, t * g, s)
  out = jnp.einsum("bkqs,bksd->bkqd", weights, v_BKSD)
  return out.reshape(b, kv, t, g, d).transpose(0, 2, 1, 3, 4).reshape(b, t, h, d)


def _with_new_block(cached_BKTGD, e_new_BKTGU, new_v_BUKD, total_BKTG1, dtype):
  """The attention output `[B, K, T, G, D]`: the cached part's unnormalised float32 output plus
  the new block's weighted values, divided once by both parts' total weight (same max)."""
  new_BKTGD = jnp.einsum("bktgu,bukd->bktgd", e_new_BKTGU.astype(dtype), new_v_BUKD,
                         preferred_element_type=jnp.float32)
  return ((cached_BKTGD + new_BKTGD) / total_BKTG1).astype(dtype)


def attend_cached(q_BTHD: jax.Array, new_k_BTKD: jax.Array, new_v_BTKD: jax.Array,
                  k_BKDS: jax.Array, v_BKSD: jax.Array, lengths_B: jax.Array,
                  bias_BHTS: Optional[jax.Array] = None, bias_new_BHTT: Optional[jax.Array] = None,
                  scale: float = 1.0, empty: bool = False,
                  mask_TT: Optional[jax.Array] = None, valid_BS: Optional[jax.Array] = None,
                  write_slots_BT: Optional[jax.Array] = None,
                  positions_BT: Optional[jax.Array] = None, window: Optional[int] = None,
                  kernel: str = "xla") -> Tuple[jax.Array, jax.Array, jax.Array]:
  """Attention of T new tokens (row b's at slots `lengths_B[b] + 0..T-1`) over the row's cached
  slots `< lengths_B[b]` and over each other — causally, or as `mask_TT` says (bool `[T, T]` or
  `[B, T, T]`: new token t attends to new token u; trees, lookahead) — then writes the new keys /
  values into the buffers (`write_kv`). Returns the output `[B, T, H, D]` and the buffers.

  The cached part is two products per kv head with the T·G queries on the left (`[T·G, D] @
  [D, S]`, `[T·G, S] @ [S, D]`), the orientation XLA:CPU handles without repacking a buffer, so a
  T-token call reads each buffer once; the new tokens' `[T, T]` block lies beside it and one
  softmax spans both. The buffers are read before they are written: the written values depend on
  the attention output (+ 0 times one of its elements, NaN-safe), so XLA orders every read
  before the in-place write instead of copying each loop-carried buffer.

  `bias_BHTS` / `bias_new_BHTT` are added to the cached / new part (T5's relative positions).
  `empty=True` (static) promises every row's length is 0 (a prefill or full forward): the cached
  part is skipped. A cache that is not a prefix of slots (a ring buffer:
  `specjax.drafters.windowed`) passes its valid slots (`valid_BS`, bool `[B, S]`) and where the
  new tokens go (`write_slots_BT`, int32 `[B, T]`).

  `window` (Mistral's sliding window): a token at position p attends only to positions > p -
  window; new tokens are at `positions_BT` (default: their slots), a cached slot at its index.
  Ignored for a ring buffer.

  `kernel="pallas"` (TPU; "pallas_interpret": any backend) computes the cached part in one fused
  kernel keeping its scores on chip (`specjax.models.attention_kernel`) for a plain prefix cache
  (no bias, window or ring buffer) that `attention_kernel.fits`; otherwise the XLA path.
  """
  b, t, h, d = q_BTHD.shape
  kv, s = k_BKDS.shape[1], k_BKDS.shape[3]
  g = h // kv
  neg = jnp.finfo(jnp.float32).min
  q_BTKGD = q_BTHD.reshape(b, t, kv, g, d)
  new_v_BTKD = new_v_BTKD.astype(v_BKSD.dtype)
  new = jnp.einsum("btkgd,bukd->bktgu", q_BTKGD, new_k_BTKD.astype(k_BKDS.dtype),
                   preferred_element_type=jnp.float32) * scale
  if bias_new_BHTT is not None:
    new = new + _bias_BKTGX(bias_new_BHTT, kv)
  if mask_TT is None:
    allowed = jnp.tril(jnp.ones((t, t), bool))[:, None, :]          # [T, 1, U]
  elif mask_TT.ndim == 2:
    allowed = mask_TT[:, None, :]
  else:
    allowed = mask_TT[:, None, :, None, :]                         # [B, 1, T, 1, U]
  use_window = window is not None and write_slots_BT is None
  if use_window:
    if positions_BT is None:
      positions_BT = lengths_B[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    pos_BT = positions_BT.astype(jnp.int32)
    near_BTU = pos_BT[:, None, :] > pos_BT[:, :, None] - window
    allowed = allowed & near_BTU[:, None, :, None, :]              # [B, 1, T, 1, U]
  new = jnp.where(allowed, new, neg)
  if empty:
    weights = jax.nn.softmax(new, axis=-1).astype(v_BKSD.dtype)
    out_BKTGD = jnp.einsum("bktgu,bukd->bktgd", weights, new_v_BTKD)
  elif (kernel != "xla" and bias_BHTS is None and valid_BS is None and not use_window
        and attention_kernel.fits(s, d)):
    acc_BKQD, m_BKQ, l_BKQ = attention_kernel.cached_attention(
        _queries(q_BTHD, kv), k_BKDS, v_BKSD, lengths_B, scale,
        interpret=kernel == "pallas_interpret")
    m_BKTG1 = m_BKQ.reshape(b, kv, t, g, 1)
    top = jnp.maximum(m_BKTG1, new.max(axis=-1, keepdims=True))
    e_new, shrink = jnp.exp(new - top), jnp.exp(m_BKTG1 - top)
    total = l_BKQ.reshape(b, kv, t, g, 1) * shrink + e_new.sum(axis=-1, keepdims=True)
    out_BKTGD = _with_new_block(acc_BKQD.reshape(b, kv, t, g, d) * shrink, e_new, new_v_BTKD,
                                total, v_BKSD.dtype)
  else:
    old = jnp.einsum("bkqd,bkds->bkqs", _queries(q_BTHD, kv), k_BKDS,
                     preferred_element_type=jnp.float32).reshape(b, kv, t, g, s) * scale
    if bias_BHTS is not None:
      old = old + _bias_BKTGX(bias_BHTS, kv)
    if valid_BS is None:
      valid_BS = jnp.arange(s)[None, :] < lengths_B[:, None]
    if use_window:  # [B, 1, T, 1, S]
      valid_BTS = valid_BS[:, None, :] & (jnp.arange(s)[None, None, :] > pos_BT[:, :, None] - window)
      old = jnp.where(valid_BTS[:, None, :, None, :], old, neg)
    else:
      old = jnp.where(valid_BS[:, None, None, None, :], old, neg)
    # One softmax over both parts without joining them: unnormalised weights against their
    # common max, outputs summed, one division of the [T, D] output (not the [T, S + T] weights).
    top = jnp.maximum(old.max(axis=-1, keepdims=True), new.max(axis=-1, keepdims=True))
    e_old, e_new = jnp.exp(old - top), jnp.exp(new - top)
    total = e_old.sum(axis=-1, keepdims=True) + e_new.sum(axis=-1, keepdims=True)
    cached = jnp.einsum("bkqs,bksd->bkqd", e_old.astype(v_BKSD.dtype).reshape(b, kv, t * g, s),
                        v_BKSD, preferred_element_type=jnp.float32)
    out_BKTGD = _with_new_block(cached.reshape(b, kv, t, g, d), e_new, new_v_BTKD, total,
                                v_BKSD.dtype)
  out_BTHD = out_BKTGD.transpose(0, 2, 1, 3, 4).reshape(b, t, h, d)
  # Zero, but computed from the output, so the cache is written after it is read (in place).
  # One element per row and kv head `[B, 1, K, 1]`: local to the device holding that head (one
  # for all would be all-reduced from device 0 at every layer of a model-split target), and a
  # NaN or inf in one row must not reach the others' keys: hence nan_to_num, never folded away.
  after = jnp.nan_to_num(jnp.swapaxes(out_BKTGD[:, :, :1, 0, :1], 1, 2) * 0, nan=0.0,
                         posinf=0.0, neginf=0.0).astype(new_k_BTKD.dtype)
  if write_slots_BT is None:
    k_BKDS, v_BKSD = write_kv(k_BKDS, v_BKSD, new_k_BTKD + after, new_v_BTKD + after, lengths_B)
  else:
    rows_BT = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
    k_BKDS = k_BKDS.at[rows_BT, :, :, write_slots_BT].set(
        (new_k_BTKD + after).astype(k_BKDS.dtype), unique_indices=True)
    v_BKSD = v_BKSD.at[rows_BT, :, write_slots_BT].set(
        (new_v_BTKD + after).astype(v_BKSD.dtype), unique_indices=True)
  return out_BTHD, k_BKDS, v_BKSD
