"""A fused attention kernel over a KV cache for TPU (Pallas, Mosaic).

`cached_attention` computes, per row and kv head, the softmax attention of Q = T·G queries over
the row's cached slots `< lengths_B[b]` one block of slots at a time, keeping the scores on chip
(online softmax, as in flash attention: Dao et al. 2022). It returns the part's *unnormalised*
output, running max and sum of weights, which `layers.attend_cached` merges with the new tokens'
`[T, T]` block. Without it XLA writes each layer's float32 scores `[B, K, Q, S]` to HBM and
reads them twice (max and sum, then the product with the values).

Static choice: `DecoderConfig.attention_kernel = "pallas"` (TPU only; the default "xla" runs
everywhere); "pallas_interpret" runs it through Pallas's interpreter on any backend (tests). On a
mesh it runs per shard (`jax.shard_map`: rows over `data`, kv heads over `model`).

Shapes: B rows, K kv heads, Q = T·G queries per kv head, D head dim, S slots (a multiple of 128).
"""

from __future__ import annotations

import functools
from typing import Tuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

__all__ = ["cached_attention", "block_slots", "fits", "KERNELS"]

KERNELS = ("xla", "pallas", "pallas_interpret")
_LANES = 128


def block_slots(s: int) -> int:
  """Slots per kernel step: the largest of 512, 256, 128 dividing `s` (0: none)."""
  for bs in (512, 256, 128):
    if s % bs == 0:
      return bs
  return 0


def fits(slots: int, head_dim: int) -> bool:
  """Whether a cache of `slots` slots and `head_dim`-wide heads takes the kernel: both multiples
  of 128 (the TPU's lanes; XLA lays out narrower heads otherwise, and feeding them to the kernel
  relays them out into large temporaries)."""
  return bool(block_slots(slots)) and head_dim % _LANES == 0


def _pallas():
  """Pallas, imported when a kernel is built (not by `import specjax`)."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import tpu as pltpu
  return pl, pltpu


def _kernel(lengths_ref, q_ref, k_ref, v_ref, acc_ref, m_ref, l_ref, acc_sc, m_sc, l_sc, *,
            scale: float, bs: int):
  pl, _ = _pallas()
  b, j = pl.program_id(0), pl.program_id(2)
  neg = jnp.finfo(jnp.float32).min

  @pl.when(j == 0)
  def _init():
    m_sc[...] = jnp.full(m_sc.shape, neg, jnp.float32)
    l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
    acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

  length = lengths_ref[b]

  @pl.when(j * bs < length)
  def _step():
    q = q_ref[0, 0]                                             # [Q, D]
    s = jnp.dot(q, k_ref[0, 0], preferred_element_type=jnp.float32) * scale   # [Q, bs]
    slot = j * bs + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    valid = slot < length
    m_prev = m_sc[...]                                          # [Q, 128] (lanes equal)
    m_new = jnp.maximum(m_prev, jnp.max(jnp.where(valid, s, neg), axis=1, keepdims=True))
    p = jnp.where(valid, jnp.exp(s - m_new[:, :1]), 0.0)
    shrink = jnp.exp(m_prev - m_new)
    l_sc[...] = l_sc[...] * shrink + jnp.sum(p, axis=1, keepdims=True)
    m_sc[...] = m_new
    acc_sc[...] = acc_sc[...] * shrink[:, :1] + jnp.dot(
        p.astype(v_ref.dtype), v_ref[0, 0], preferred_element_type=jnp.float32)

  @pl.when(j == pl.num_programs(2) - 1)
  def _done():
    acc_ref[0, 0] = acc_sc[...]
    m_ref[0, 0] = m_sc[...]
    l_ref[0, 0] = l_sc[...]


def _call(q_BKQD, k_BKDS, v_BKSD, lengths_B, scale: float, interpret: bool):
  pl, pltpu = _pallas()
  b, kv, q, d = q_BKQD.shape
  s = k_BKDS.shape[3]
  bs = block_slots(s)
  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1, grid=(b, kv, s // bs),
      in_specs=[pl.BlockSpec((1, 1, q, d), lambda i, h, j, lens: (i, h, 0, 0)),
                pl.BlockSpec((1, 1, d, bs), lambda i, h, j, lens: (i, h, 0, j)),
                pl.BlockSpec((1, 1, bs, d), lambda i, h, j, lens: (i, h, j, 0))],
      out_specs=[pl.BlockSpec((1, 1, q, d), lambda i, h, j, lens: (i, h, 0, 0)),
                 pl.BlockSpec((1, 1, q, _LANES), lambda i, h, j, lens: (i, h, 0, 0)),
                 pl.BlockSpec((1, 1, q, _LANES), lambda i, h, j, lens: (i, h, 0, 0))],
      scratch_shapes=[pltpu.VMEM((q, d), jnp.float32), pltpu.VMEM((q, _LANES), jnp.float32),
                      pltpu.VMEM((q, _LANES), jnp.float32)])
  acc, m, l = pl.pallas_call(
      functools.partial(_kernel, scale=scale, bs=bs), grid_spec=grid_spec,
      out_shape=[jax.ShapeDtypeStruct((b, kv, q, d), jnp.float32),
                 jax.ShapeDtypeStruct((b, kv, q, _LANES), jnp.float32),
                 jax.ShapeDtypeStruct((b, kv, q, _LANES), jnp.float32)],
      interpret=interpret)(lengths_B.astype(jnp.int32), q_BKQD, k_BKDS, v_BKSD)
  return acc, m[..., 0], l[..., 0]


def cached_attention(q_BKQD: jax.Array, k_BKDS: jax.Array, v_BKSD: jax.Array,
                     lengths_B: jax.Array, scale: float, interpret: bool = False
                     ) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """(acc `[B, K, Q, D]`, max `[B, K, Q]`, sum `[B, K, Q]`), all float32: for each row b, kv head
  k and query i, over the slots s < lengths_B[b], max = max_s x_s, sum = Σ_s exp(x_s − max) and
  acc = Σ_s exp(x_s − max) v_s, with x_s = scale · q_i · k_s (a row with no slot: max = float32
  min, sum and acc 0). The caller divides after merging other parts (`attend_cached`).

  Traced under a mesh with a `model` axis, it runs per shard: rows over `data`, kv heads over
  `model` (both must divide)."""
  s = k_BKDS.shape[3]
  if not block_slots(s):
    raise ValueError(f"the fused attention kernel needs a multiple of 128 cache slots, got {s}")
  run = functools.partial(_call, scale=scale, interpret=interpret)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or all(n == 1 for n in mesh.shape.values()):
    return run(q_BKQD, k_BKDS, v_BKSD, lengths_B)
  rows = "data" if "data" in mesh.axis_names else None
  heads = "model" if "model" in mesh.axis_names else None
  for name, size, axis in (("rows", q_BKQD.shape[0], rows), ("kv heads", q_BKQD.shape[1], heads)):
    if axis is not None and size % mesh.shape[axis]:
      raise ValueError(f"the fused attention kernel splits {name} over {axis!r}: {size} do "
                       f"not divide over {mesh.shape[axis]} devices")
  spec = P(rows, heads)
  return jax.shard_map(run, mesh=mesh, in_specs=(spec, spec, spec, P(rows)),
                       out_specs=(spec, spec, spec), check_vma=False)(
                           q_BKQD, k_BKDS, v_BKSD, lengths_B)
