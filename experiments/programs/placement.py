"""Where an experiment runs: processes, the mesh, the memory plan, placement.

Both reproduction launchers read the same config fields:

  config.mesh          "auto" (the fewest model-axis devices whose memory
                       plan fits the target; `specjax.planning.mesh.choose_mesh`)
                       or "DxM" (data x model axis sizes, e.g. "2x4", "1x1")
  config.distributed   True: `jax.distributed.initialize()` first (one
                       process per host of a pod slice); only process 0
                       writes results and logs progress
  config.models.draft_sharded
                       False: the draft is replicated on every device (its
                       steps need no collectives); True: split like the target

`experiment_mesh` initialises the processes, chooses the mesh and logs the
memory plan (per-device bytes of params, caches and activations) before any
weight is loaded; a plan that cannot fit the devices' memory is a
ValueError naming the mesh and the shortfall. `place_models` and
`batch_placer` put params and batches on it with `specjax.parallel.sharding`.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Optional, Tuple, Union

import jax
from absl import logging
from jax.sharding import Mesh

import specjax
from specjax.measure import tensorboard
from specjax.parallel import distributed, sharding
from specjax.planning.memory import device_memory_bytes, memory_plan
from specjax.planning.mesh import choose_mesh

__all__ = ["parse_mesh", "experiment_mesh", "place_models", "batch_placer", "is_main_process",
           "mesh_fingerprints", "profile_decode", "write_scalars"]

MeshSpec = Union[str, Tuple[int, int]]


def parse_mesh(spec: Any) -> MeshSpec:
  """"auto", "DxM" (e.g. "2x4") or a (data, model) pair → "auto" or (data, model)."""
  if isinstance(spec, str):
    text = spec.strip().lower()
    if text == "auto":
      return "auto"
    m = re.fullmatch(r"(\d+)\s*x\s*(\d+)", text)
    if not m:
      raise ValueError(f"config.mesh must be 'auto' or 'DxM' (data x model axis sizes, e.g. "
                       f"'2x4'), got {spec!r}")
    data, model = int(m.group(1)), int(m.group(2))
  elif isinstance(spec, (tuple, list)) and len(spec) == 2:
    data, model = spec
  else:
    raise ValueError(f"config.mesh must be 'auto' or 'DxM' (e.g. '2x4'), got {spec!r}")
  if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in (data, model)):
    raise ValueError(f"config.mesh axis sizes must be ints >= 1, got {spec!r}")
  return (data, model)


def is_main_process() -> bool:
  """Whether this process writes results and logs progress (process 0)."""
  return distributed.is_main_process()


def experiment_mesh(cfg, target_config, draft_config, *, batch_size: int,
                    cache_len: int) -> Mesh:
  """Initialises `jax.distributed` when `cfg.distributed`, chooses the mesh
  (`cfg.mesh`), logs the memory plan and returns the mesh."""
  distributed.initialize_distributed(bool(cfg.get("distributed", False)))
  spec = parse_mesh(cfg.get("mesh", "1x1"))
  draft_sharded = bool(cfg.models.get("draft_sharded", False))
  capacity = device_memory_bytes()
  data, model = choose_mesh(
      target_config, draft_config, num_devices=jax.device_count(), batch_size=batch_size,
      cache_len=cache_len, capacity_bytes=capacity, mesh=spec, draft_sharded=draft_sharded)
  plan = memory_plan(target_config, draft_config, mesh_shape=(data, model),
                                 batch_size=batch_size, cache_len=cache_len,
                                 draft_sharded=draft_sharded)
  if is_main_process():
    logging.info("mesh data=%d x model=%d over %d %s device(s); memory plan:\n%s", data, model,
                 jax.device_count(), jax.devices()[0].device_kind, plan.describe(capacity))
  return sharding.make_mesh(data=data, model=model)


def place_models(mesh: Mesh, target, draft, draft_sharded: bool = False):
  """((target model, params split over `mesh`), (draft model, params
  replicated or split)). A decoder whose kv heads do not divide the model
  axis is first laid out for it (`sharding.fit_to_mesh`: kv heads repeated,
  the same outputs), so its KV cache splits instead of being copied whole to
  every device; already placed params are re-placed where needed."""
  (tm, tp), (dm, dp) = target, draft
  tm, tp = sharding.fit_to_mesh(tm, tp, mesh)
  tp = sharding.shard_params(tp, mesh)
  if draft_sharded:
    dm, dp = sharding.fit_to_mesh(dm, dp, mesh)
    dp = sharding.shard_params(dp, mesh)
  else:
    dp = sharding.replicate(dp, mesh)
  return (tm, tp), (dm, dp)


def batch_placer(mesh: Optional[Mesh]):
  """`place(prompts, lengths, keys)` for `speed.sweep`: rows over the data
  axis when the batch divides it (else replicated); identity without a mesh
  or on a 1x1 mesh."""
  if mesh is None or mesh.devices.size == 1:
    return None
  return lambda *arrays: sharding.shard_batch(mesh, *arrays)


def mesh_fingerprints(fingerprints, mesh: Mesh):
  """The models' fingerprints, marked with the mesh shape when it is not 1x1:
  results on a mesh are their own stages (reductions run in another order)."""
  if mesh.devices.size == 1:
    return dict(fingerprints)
  shape = "|mesh%dx%d" % tuple(mesh.devices.shape)
  return {k: v + shape for k, v in fingerprints.items()}


def profile_decode(cfg, workdir: str, target, draft, prompts, lengths, gamma: int,
                   place=None) -> Optional[str]:
  """With `cfg.profile_steps` > 0: a `jax.profiler` trace of one greedy
  speculative call of about that many decode iterations (γ + 1 tokens each)
  on the first prompt, compiled beforehand, in `<workdir>/profile`; returns
  the directory (None when off)."""
  steps = int(cfg.get("profile_steps", 0))
  if steps <= 0:
    return None
  (tm, tp), (dm, dp) = target, draft
  x, l, k = prompts[:1], lengths[:1], jax.random.PRNGKey(0)[None]
  if place is not None:
    x, l, k = place(x, l, k)
  fn = lambda: specjax.speculative_generate(
      tm, tp, dm, dp, x, l, max_new_tokens=steps * (gamma + 1), gamma=gamma,
      sampling=specjax.GREEDY, key=k)
  jax.block_until_ready(fn())  # compile outside the trace
  logdir = os.path.join(workdir, "profile")
  tensorboard.profile_decode(fn, logdir, steps=1)
  logging.info("profile of %d decode iterations in %s", steps, logdir)
  return logdir


def write_scalars(workdir: str, scalars: Mapping[str, float], step: int = 0) -> None:
  """An experiment's headline numbers as TensorBoard scalars in
  `<workdir>/tb` (process 0 only), beside its JSON results. Skipped, with a
  logged note, for a workdir that is not local (gs://...): the JSON results
  hold the same numbers, and tensorboardX reaches GCS only through its own
  client, not the filesystem the run writes through."""
  if not is_main_process() or not scalars:
    return
  with tensorboard.ScalarWriter(f"{workdir}/tb") as tb:  # skips a non-local workdir itself
    tb.write(step, dict(scalars))
