"""Sharding rules: how arrays named by their shape suffix lie on a mesh.

The layout rules the models, the sampler and `parallel.sharding` share: a shape suffix ("BTHD")
maps batch to `data` and heads / kv heads / hidden units to `model` (`suffix_partition`);
`on_mesh` pins an activation to that layout under a mesh; `whole_vocab` lays out the logits.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import jax

__all__ = ["GATHER_MAX_BYTES", "on_mesh", "suffix_partition", "whole_vocab"]

# Mesh axes of the shape letters (rows over `data`; attention heads and MLP hidden units over
# `model`); other letters are not split.
_LETTER_AXES = {"B": "data", "H": "model", "K": "model", "F": "model"}


def suffix_partition(suffix: str, shape: Sequence[int], axis_sizes) -> Tuple[Optional[str], ...]:
  """The mesh axis of each axis of an array named by its shape `suffix` ("BTHD"): `B` over
  `data`, `H` / `K` / `F` over `model`, where the mesh has that axis (`axis_sizes`: name → size)
  and its size divides the length; any other letter, or a `_`, is not split."""
  if len(suffix) != len(shape):
    raise ValueError(f"suffix {suffix!r} names {len(suffix)} axes; the array has shape "
                     f"{tuple(shape)}")
  out = []
  for letter, n in zip(suffix, shape):
    name = _LETTER_AXES.get(letter)
    out.append(name if name in axis_sizes and n % axis_sizes[name] == 0 else None)
  return tuple(out)


def on_mesh(x: jax.Array, suffix: str) -> jax.Array:
  """`x` laid out by its shape `suffix` (`suffix_partition`) when traced under a mesh with a
  `model` axis of size > 1 (as decoding with split params is, `sharding.decode_mesh`); else `x`
  unchanged. Pins the layout where XLA's propagation would pick a costly one (a split head's
  activations, logits over a split vocabulary)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or "model" not in mesh.axis_names or mesh.shape["model"] == 1:
    return x
  spec = suffix_partition(suffix, x.shape, dict(mesh.shape))
  return jax.lax.with_sharding_constraint(x, jax.sharding.PartitionSpec(*spec))


# Logits up to this many bytes per device are gathered whole over the vocabulary
# (`whole_vocab`); larger ones stay split and the sampler works on each device's slice.
GATHER_MAX_BYTES = 4 << 20


def whole_vocab(logits_xV: jax.Array) -> jax.Array:
  """Logits `[B, ..., V]` laid out for the sampler under a mesh with a `model` axis (`on_mesh`;
  unchanged outside one): rows over `data`, and

  * whole over the vocabulary on every device when one device's share is at most
    `GATHER_MAX_BYTES` (float32): split, every reduction the sampler runs over them (max, sum,
    argmax, the draw, the finite check) would be a collective of its own, and one all-gather
    costs about what a few of those do at that size;
  * split over the vocabulary like the LM head otherwise (gathering would move and repeat large
    logits on every device): the sampler passes over each device's slice only
    (`specjax.sampling.vocab_shards`), and only per-row scalars cross devices.

  Decoding only: train steps do not trace under a mesh, and a loss over split logits should not
  gather them."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or "model" not in mesh.axis_names or mesh.shape["model"] == 1:
    return logits_xV
  rows = logits_xV.shape[0]
  data = mesh.shape.get("data", 1)
  per_device = (rows // data if rows % data == 0 else rows) * 4
  for n in logits_xV.shape[1:]:
    per_device *= n
  vocab, model = logits_xV.shape[-1], mesh.shape["model"]
  if per_device <= GATHER_MAX_BYTES or vocab % model:
    return on_mesh(logits_xV, "B" + "_" * (logits_xV.ndim - 1))
  spec = suffix_partition("B" + "_" * (logits_xV.ndim - 2), logits_xV.shape[:-1],
                          dict(mesh.shape)) + ("model",)
  return jax.lax.with_sharding_constraint(logits_xV, jax.sharding.PartitionSpec(*spec))
