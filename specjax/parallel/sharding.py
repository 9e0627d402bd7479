"""Scaling out with JAX's own SPMD: a mesh, partition specs, `device_put`.

Parameters, caches and inputs are placed with `NamedSharding`s over a 2-D (`data`, `model`)
mesh, and XLA (GSPMD) partitions the jitted decoding loop from those input shardings.

* batch rows (prompts, lengths, keys, every cache's batch axis) go over `data`;
* attention heads (q/k/v/o kernels, the cache's kv-head axis), MLP hidden units and the
  vocabulary of the output projection and the embedding table (vocab-parallel; logits are
  gathered once per call where small, else left split and sampled piece by piece,
  `rules.whole_vocab`) go over `model` (Megatron-style). An axis that does not divide evenly
  is replicated.
* a model axis larger than the kv heads would replicate the whole KV cache; `fit_to_mesh`
  stores each kv head `model / K` times instead (`DecoderLM.repeat_kv_heads`, exact). The
  packed decode layout shards the same way: pack first, then shard (`qkv` over kv heads,
  `gate_up` and `down_t` over hidden units).

  mesh = make_mesh(data=4, model=2)                       # 8 devices
  tp, dp = shard_params(tp, mesh), replicate(dp, mesh)   # a small draft: often replicated
  out = speculative_generate(target, tp, draft, dp, *shard_batch(mesh, prompts, lengths), ...)

More (CPU hosts, EAGLE heads, the sampler): docs/checkpoints.md.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from specjax.parallel.rules import suffix_partition

__all__ = ["make_mesh", "param_spec", "shard_params", "cache_spec", "sharded_cache", "shard_batch",
           "replicate", "fsdp_spec", "kv_head_repeats", "fit_to_mesh", "params_mesh",
           "place_cache_like", "rows_spec", "decode_mesh", "suffix_spec", "state_spec",
           "place_state"]

DATA, MODEL = "data", "model"

_HEAD_KERNELS = {"q", "k", "v"}            # [E, H, D]: heads on axis 1
_OUT_KERNELS = {"o"}                       # [H, D, E]: heads on axis 0
_COLUMN_KERNELS = {"gate", "up", "wi", "wi_0", "wi_1", "lm_head"}  # [E, F]: axis 1
_EMBEDDINGS = {"embed", "shared"}          # embedding [V, E]: the vocabulary (axis 0)
_ROW_KERNELS = {"down", "wo"}              # [F, E]: axis 0
# The packed decode layout (`models.decoder_layout`): the kv-head / hidden-unit axis by name, rank.
_PACKED_KERNELS = {("qkv", 4): 1, ("gate_up", 3): 1, ("down_t", 2): 1}
# An EAGLE head's flat kernels `[..., in, out]` (`models.eagle_head`; later layers stacked
# `[L - 1, ...]`), Megatron's layout: split over `model` on the output (q / k / v, gate / up,
# the fusions fc / fuse) or on the input (o, down: one all-reduce each).
_FLAT_OUT_KERNELS = {"q", "k", "v", "gate", "up", "fc", "fuse"}
_FLAT_IN_KERNELS = {"o", "down"}


def make_mesh(data: int = 1, model: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
  """A (`data`, `model`) mesh over `data * model` devices."""
  devices = list(jax.devices() if devices is None else devices)
  if data < 1 or model < 1:
    raise ValueError(f"mesh axes must be >= 1, got data={data}, model={model}")
  if data * model > len(devices):
    raise ValueError(f"a {data}x{model} mesh needs {data * model} devices, "
                     f"{len(devices)} are available")
  return Mesh(np.array(devices[: data * model]).reshape(data, model), (DATA, MODEL))


def _divisible(shape, axis, mesh: Mesh, name: str) -> bool:
  return shape[axis] % mesh.shape[name] == 0


def param_spec(path: Sequence[str], shape: Sequence[int], mesh: Mesh) -> P:
  """PartitionSpec of one parameter from its path in the params tree."""
  names = [str(getattr(k, "key", k)) for k in path]
  owner = names[-2] if len(names) >= 2 else ""
  spec = [None] * len(shape)
  if names[-1] == "kernel":
    if owner in _HEAD_KERNELS and len(shape) == 3:
      spec[1] = MODEL
    elif owner in _OUT_KERNELS and len(shape) == 3:
      spec[0] = MODEL
    elif owner in _COLUMN_KERNELS and len(shape) == 2:
      spec[1] = MODEL
    elif owner in _ROW_KERNELS and len(shape) == 2:
      spec[0] = MODEL
    elif (owner, len(shape)) in _PACKED_KERNELS:
      spec[_PACKED_KERNELS[owner, len(shape)]] = MODEL
  elif names[-1] == "embedding" and owner in _EMBEDDINGS and len(shape) == 2:
    spec[0] = MODEL
  elif names[-1] == "bias" and owner in _HEAD_KERNELS | {"qkv"} and len(shape) in (2, 3):
    spec[0] = MODEL  # q/k/v biases [H | K, D], packed [K, G + 2, D]: heads first
  elif names[-1] in _FLAT_OUT_KERNELS and len(shape) >= 2:
    spec[-1] = MODEL
  elif names[-1] in _FLAT_IN_KERNELS and len(shape) >= 2:
    spec[-2] = MODEL
  for axis, name in enumerate(spec):
    if name is not None and not _divisible(shape, axis, mesh, name):
      spec[axis] = None
  return P(*spec)


def kv_head_repeats(num_heads: int, num_kv_heads: int, model_axis: int) -> int:
  """How many times to store each kv head so the cache splits over `model_axis`.

  1 when K divides the axis (or the axis is 1); `model_axis // K` when K divides the axis and
  the axis divides the query heads H (each device holds one copy of one kv head and the query
  heads that read it); 1 otherwise (the cache stays replicated: no exact split exists)."""
  if model_axis <= 1 or num_kv_heads % model_axis == 0:
    return 1
  if model_axis % num_kv_heads == 0 and num_heads % model_axis == 0:
    return model_axis // num_kv_heads
  return 1


def fit_to_mesh(model, params, mesh: Mesh):
  """(model, params) laid out for `mesh`'s model axis: a decoder whose kv heads do not divide
  the axis gets them repeated (`kv_head_repeats`; the same outputs), so its cache splits;
  anything else is returned as is. Call before `shard_params` / `sharded_cache`; `params` may
  be None (a shapes-only plan)."""
  config = getattr(model, "config", None)
  if not hasattr(model, "repeat_kv_heads") or config is None:
    return model, params
  r = kv_head_repeats(config.num_heads, config.num_kv_heads, mesh.shape[MODEL])
  if r == 1:
    return model, params
  if params is None:
    return type(model)(config.replace(num_kv_heads=config.num_kv_heads * r)), None
  return model.repeat_kv_heads(params, r)


def fsdp_spec(shape: Sequence[int], mesh: Mesh, axis: str = MODEL) -> P:
  """PartitionSpec splitting an array over mesh axis `axis` along its largest dimension that
  `axis` divides (the first on a tie); replicated when none does or the axis has size 1.

  Fully sharded data parallelism (ZeRO-3 style) for `training.mesh`: shapes only, so it
  applies to any parameter tree and optimizer state (Adam's moments get their parameter's
  layout).
  """
  if axis not in mesh.shape:
    raise ValueError(f"axis must be one of the mesh axes {tuple(mesh.shape)}, got {axis!r}")
  size = mesh.shape[axis]
  spec = [None] * len(shape)
  if size > 1:
    candidates = [d for d in range(len(shape)) if shape[d] >= size and shape[d] % size == 0]
    if candidates:
      spec[max(candidates, key=lambda d: (shape[d], -d))] = axis
  return P(*spec)


def shard_params(params, mesh: Mesh):
  """Places a params tree on `mesh` (heads / hidden units over `model`)."""
  def put(path, x):
    return jax.device_put(x, NamedSharding(mesh, param_spec(path, x.shape, mesh)))
  return jax.tree_util.tree_map_with_path(put, params)


def cache_spec(x, mesh: Mesh) -> P:
  """Cache buffers (`[B, K, D, S]` keys, `[B, K, S, D]` values) → batch over data, kv heads
  over model; `[B]` vectors → data."""
  if getattr(x, "ndim", 0) == 4:
    spec = [DATA, MODEL, None, None]
  elif getattr(x, "ndim", 0) == 1:
    spec = [DATA]
  else:
    return P()
  for axis, name in enumerate(spec):
    if name is not None and not _divisible(x.shape, axis, mesh, name):
      spec[axis] = None
  return P(*spec)


def sharded_cache(model, mesh: Mesh, batch_size: int, max_len: int, prompt_len: int):
  """`model.init_cache(...)` placed on `mesh` (see `cache_spec`)."""
  cache = model.init_cache(batch_size, max_len, prompt_len)
  return jax.tree_util.tree_map(
      lambda x: jax.device_put(x, NamedSharding(mesh, cache_spec(x, mesh))), cache)


def rows_spec(shape: Sequence[int], mesh) -> P:
  """Rows `[B, ...]` over `data` where it divides B, else replicated (scalars too)."""
  return P(DATA) if len(shape) >= 1 and shape[0] % mesh.shape[DATA] == 0 else P()


def suffix_spec(name: str, shape: Sequence[int], mesh) -> P:
  """PartitionSpec of a drafter's state array from its name's shape suffix (e.g. `k_BSHD`):
  `B` over `data`, `H` / `K` / `F` over `model`, where each divides (`rules.suffix_partition`);
  a name without a suffix of `len(shape)` capitals: `rows_spec`."""
  suffix = str(name).rsplit("_", 1)[-1]
  if len(suffix) != len(shape) or not suffix.isalpha() or not suffix.isupper():
    return rows_spec(shape, mesh)
  return P(*suffix_partition(suffix, shape, dict(mesh.shape)))


def state_spec(path, shape: Sequence[int], mesh, split: bool) -> P:
  """A drafter's state array (`path`: its key path, the last key naming the field) → rows over
  `data`, and with `split` (`Drafter.splits_state`) heads over `model` by `suffix_spec`."""
  if not split or not path:
    return rows_spec(shape, mesh)
  last = path[-1]
  return suffix_spec(getattr(last, "name", getattr(last, "key", "")), shape, mesh)


def place_state(state, mesh: Mesh, split: bool):
  """A drafter's fresh state placed on `mesh` by `state_spec`."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: jax.device_put(x, NamedSharding(mesh, state_spec(path, x.shape, mesh,
                                                                       split))), state)


def shard_batch(mesh: Mesh, *arrays):
  """Places per-row arrays (prompts `[B, P]`, lengths `[B]`, keys `[B]`) rows over `data`."""
  return tuple(jax.device_put(x, NamedSharding(mesh, rows_spec(x.shape, mesh))) for x in arrays)


def replicate(tree, mesh: Mesh):
  """Places every array of `tree` (params, a cache) whole on every device of `mesh`."""
  if not isinstance(mesh, Mesh):
    raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
  sharding = NamedSharding(mesh, P())
  return jax.tree_util.tree_map(lambda x: jax.device_put(x, sharding), tree)


def params_mesh(params) -> Optional[Mesh]:
  """The mesh a params tree is placed on (its first leaf with a `NamedSharding` over several
  devices), or None."""
  for x in jax.tree_util.tree_leaves(params):
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
      return sharding.mesh
  return None


def decode_mesh(params):
  """The context a decoding program over `params` is traced in: `jax.set_mesh(mesh)` when
  `params` lie on a mesh of several devices, else a null context. Under it the models lay
  their logits out for the sampler (`rules.whole_vocab`, `sampling.vocab_shards`); only that
  layout depends on it, never a value. Decided from the first leaf alone (a params tree is
  placed as a whole)."""
  leaves = jax.tree_util.tree_leaves(params)
  sharding = getattr(leaves[0], "sharding", None) if leaves else None
  if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
    return jax.set_mesh(sharding.mesh)
  return contextlib.nullcontext()


def place_cache_like(cache, params):
  """A fresh cache placed the way its model's `params` are: by `cache_spec` when they are
  split over `model`, rows over `data` when whole on every device (a replicated draft), as is
  on one device. `generate` / `speculative_generate` place the caches they allocate with it."""
  mesh = params_mesh(params)
  if mesh is None:
    return cache
  split = any(not getattr(x, "sharding", None).is_fully_replicated
              for x in jax.tree_util.tree_leaves(params) if hasattr(x, "sharding"))

  spec = (lambda x: cache_spec(x, mesh)) if split else (lambda x: rows_spec(x.shape, mesh))
  return jax.tree_util.tree_map(lambda x: jax.device_put(x, NamedSharding(mesh, spec(x))), cache)
