"""Sharded training: the train step jitted over a (`data`, `model`) device mesh.

  config.mesh_data, config.mesh_model = 2, 4      # 8 devices
  params = train_model(model, None, source, config, workdir)

With a mesh of more than one device (`training_mesh`), `train_model` (and `heads.train_medusa`)
place

  * the batch's rows over `data` (each data shard takes `batch_size / mesh_data` rows);
  * every leaf of the params and optimizer state over `model`, fsdp-style
    (`parallel.sharding.fsdp_spec`: along its largest dimension `mesh_model` divides, else
    replicated); step counter and PRNG key replicated; a distillation teacher's params split alike;

and jit the step with these layouts as its output shardings, so the state stays split from step
to step (donated in place); XLA (GSPMD) inserts the all-gathers and gradient reductions. Why fsdp
rather than `param_spec`'s Megatron rule: docs/training.md.

Numerics: the same math in another reduction order (tests/test_sharded_training.py); a run
resumed on the same mesh continues exactly. The mesh fields are run-only
(`config.RUN_ONLY_FIELDS`): a run may resume on another mesh, within float rounding.

Checkpoints have the single-device format: gathered to host numpy on save (`Checkpointer.save`),
restored straight into the mesh layout (`Checkpointer.restore` takes the given state's
shardings). One process only: the host copy needs every shard addressable.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Optional

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from specjax._checks import check_int
from specjax.parallel.sharding import DATA, fsdp_spec, make_mesh
from specjax.training.steps import StepSpec, TrainState, _train_step

__all__ = ["training_mesh", "fsdp_shardings", "shard_tree", "state_shardings", "shard_state",
           "shard_rows", "shard_eval_batches", "sharded_train_step", "sharded_jit"]


def training_mesh(mesh_data: int = 1, mesh_model: int = 1,
                  owner: str = "config") -> Optional[Mesh]:
  """The (`data`, `model`) mesh of a config's `mesh_data` x `mesh_model`, over the first devices;
  None for 1 x 1 (the single-device step). Errors name the fields as `<owner>.mesh_data`."""
  for name, v in (("mesh_data", mesh_data), ("mesh_model", mesh_model)):
    check_int(f"{owner}.{name}", v, 1)
  if mesh_data * mesh_model == 1:
    return None
  available = jax.device_count()
  if mesh_data * mesh_model > available:
    raise ValueError(f"{owner}.mesh_data x {owner}.mesh_model = {mesh_data} x {mesh_model} "
                     f"needs {mesh_data * mesh_model} devices, {available} are available; use "
                     "a smaller mesh (on CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N)")
  return make_mesh(mesh_data, mesh_model)


def fsdp_shardings(tree: Any, mesh: Mesh) -> Any:
  """A NamedSharding per array leaf of `tree` (`fsdp_spec` over `model`)."""
  return jax.tree_util.tree_map(lambda x: NamedSharding(mesh, fsdp_spec(x.shape, mesh)), tree)


def shard_tree(tree: Any, mesh: Mesh) -> Any:
  """`tree` (params, an optimizer state) placed on `mesh`, fsdp-style."""
  return jax.device_put(tree, fsdp_shardings(tree, mesh))


def state_shardings(state: TrainState, mesh: Mesh) -> TrainState:
  """A train state's layout: params and optimizer state fsdp over `model`, step, key replicated."""
  replicated = NamedSharding(mesh, P())
  return TrainState(step=replicated, params=fsdp_shardings(state.params, mesh),
                    opt_state=fsdp_shardings(state.opt_state, mesh), rng=replicated)


def shard_state(state: TrainState, mesh: Mesh) -> TrainState:
  """`state` placed in its mesh layout (`state_shardings`); leaves already there are not copied."""
  return jax.device_put(state, state_shardings(state, mesh))


def shard_rows(batch: Any, mesh: Mesh) -> Any:
  """Every array of `batch` (a dict of `[B, ...]` rows) with its leading axis over `data`;
  ValueError when `B` is not divisible by the data axis."""
  ways = mesh.shape[DATA]
  sharding = NamedSharding(mesh, P(DATA))

  def put(path, x):
    rows = x.shape[0] if getattr(x, "ndim", 0) else None
    if rows is None or rows % ways:
      name = jax.tree_util.keystr(path)
      raise ValueError(f"batch{name} has {rows} rows, not divisible by the mesh's data axis "
                       f"({ways}); use a batch_size divisible by config.mesh_data")
    return jax.device_put(x, sharding)
  return jax.tree_util.tree_map_with_path(put, batch)


def _frozen(tree: Any) -> tuple:
  """A hashable form of a pytree of shardings (a jit-cache key)."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, tuple(leaves)


@functools.lru_cache(maxsize=32)
def _cached_jit(factory, key: tuple, out: tuple, donate: tuple):
  return jax.jit(factory(*key), out_shardings=jax.tree_util.tree_unflatten(out[0], out[1]),
                 donate_argnums=donate)


def sharded_jit(factory, key: tuple, out_shardings: Any, donate_argnums: tuple = (0,)):
  """`jax.jit(factory(*key), out_shardings=..., donate_argnums=...)`, cached per (`factory` a
  module-level function, hashable `key`, layout), so a run and its resumption share one compiled
  step. The inputs' layouts come from the arrays (placed with `shard_state` / `shard_rows`)."""
  return _cached_jit(factory, tuple(key), _frozen(out_shardings), tuple(donate_argnums))


def _train_fn(spec: StepSpec):
  return functools.partial(_train_step, spec)


def sharded_train_step(spec: StepSpec, mesh: Mesh, state: TrainState):
  """The train step `(state, batch, teacher_params) -> (state, metrics)` jitted over `mesh`: the
  state keeps its `state_shardings` layout and is donated, the scalar metrics are replicated.
  Place its inputs with `shard_state`, `shard_rows` and (a teacher's params) `shard_tree`."""
  out = (state_shardings(state, mesh), NamedSharding(mesh, P()))
  return sharded_jit(_train_fn, (spec,), out)


def shard_eval_batches(batches: list[Mapping[str, Any]], mesh: Optional[Mesh]) -> list:
  """Fixed validation batches placed with their rows over `data` (as given without a mesh)."""
  return list(batches) if mesh is None else [shard_rows(b, mesh) for b in batches]
