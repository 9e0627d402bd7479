"""Train-state checkpoints (orbax CheckpointManager) and atomic final params.

Layout of a workdir:

  <workdir>/checkpoints/<step>/state/   the full `TrainState` (orbax StandardSave)
  <workdir>/checkpoints/<step>/meta/    JSON: model / teacher config, the training fields
                                        that fix the trajectory, data stats
  <workdir>/final/                      `orbax_io.save_params` layout (`restore_params`)
                                        and train_meta.json (the settings it was trained with)
  <workdir>/metrics.jsonl               one JSON line per log / eval event
  <workdir>/summary.json                the last run's summary

Atomicity: orbax writes each checkpoint into a temporary directory renamed to `<step>` when
complete, so a run killed mid-save leaves only the temporary directory, which `latest_step()`
ignores. `final/` is published whole by `atomic_io.atomic_dir`: the old or the new, complete
artifact.

Recovery: `restore_newest_intact` tries the steps newest first; a step orbax cannot read is
logged and moved aside to `<workdir>/checkpoints.corrupt/<step>`, so a damaged checkpoint costs
the steps since the one before it, nothing else.

Saves are asynchronous by default (a copy written in a background thread; `close()` waits for
it) and sharded over processes, nothing gathered to one host: every process of a multi-host run
must call `save` / `restore` (orbax coordinates them).
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Tuple

import jax
import numpy as np
from absl import logging
from jax.sharding import NamedSharding

from specjax import atomic_io
from specjax.checkpoints.integrity import first_line, quiet_asyncio_errors
from specjax.checkpoints.orbax_io import save_params

__all__ = ["Checkpointer", "save_final_params", "move_aside",
           "TRAIN_META"]


def move_aside(path: str, reason: str) -> str:
  """Moves a damaged checkpoint directory `path` to `<parent>.corrupt/<name>-<time>` (kept for
  inspection, out of the run's way) and logs why; returns the new path."""
  src = atomic_io.as_path(path)
  parent, name = src.parent, src.name
  aside_dir = parent.parent / (parent.name + ".corrupt") if name.isdigit() else parent
  aside_dir.mkdir(parents=True, exist_ok=True)
  dest = aside_dir / f"{name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
  while dest.exists():
    dest = dest.parent / (dest.name + "x")
  atomic_io.move_tree(src, dest)
  logging.warning("%s: %s; moved aside to %s", path, reason, dest)
  return str(dest)


_device_copy = jax.jit(jax.numpy.copy)


def _save_copy(tree):
  """A copy the next step's donation cannot touch, for an asynchronous save: host numpy for
  arrays this process holds whole; an array split over several processes is copied on its
  devices, keeping its sharding (orbax writes it sharded)."""
  def copy(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return _device_copy(x)
    return np.array(x, copy=True)
  return jax.tree_util.tree_map(copy, tree)


class Checkpointer:
  """Saves / restores train states under `<workdir>/checkpoints`."""

  def __init__(self, workdir: str, keep: int, async_save: bool = True):
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    self._ocp = ocp
    self.directory = str(atomic_io.as_path(workdir) / "checkpoints")  # orbax takes gs:// too
    # A save interrupted by a kill leaves a temporary directory; the next run removes it.
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=async_save,
                                           cleanup_tmp_directories=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         item_names=("state", "meta"))

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def save(self, step: int, state_dict: dict, meta: dict) -> None:
    ocp = self._ocp
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(_save_copy(state_dict)), meta=ocp.args.JsonSave(meta)),
        force=True)

  def restore_meta(self, step: int) -> dict:
    ocp = self._ocp
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

  def restore(self, step: int, like_state_dict: dict) -> dict:
    """The state at `step`, with the tree structure of `like_state_dict`.

    Leaves of `like_state_dict` placed with a `NamedSharding` come back as jax.Arrays in that
    layout, each device reading its own slice; the others as numpy arrays."""
    ocp = self._ocp

    def like(x):
      sharding = getattr(x, "sharding", None)
      if not isinstance(sharding, NamedSharding):
        sharding = None
      return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)
    target = jax.tree_util.tree_map(like, like_state_dict)
    return self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target))).state

  def restore_newest_intact(self, like_state_dict: dict,
                            check_meta: Callable[[dict, int], None]) -> Optional[Tuple[int, dict]]:
    """`(step, state)` of the newest step checkpoint that reads back whole, or None.

    `check_meta(meta, step)` runs first on each (it raises for a checkpoint of other settings:
    not damage, nothing is moved). An unreadable step is moved aside and the next one tried."""
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        with quiet_asyncio_errors():
          meta = self.restore_meta(step)
      except Exception as e:  # pylint: disable=broad-except  (orbax / tensorstore errors)
        self._set_aside(step, f"its meta cannot be read ({first_line(e)})")
        continue
      check_meta(meta, step)
      try:
        with quiet_asyncio_errors():
          state = self.restore(step, like_state_dict)
      except Exception as e:  # pylint: disable=broad-except
        self._set_aside(step, f"its train state cannot be read ({first_line(e)})")
        continue
      return step, state
    return None

  def _set_aside(self, step: int, reason: str) -> None:
    move_aside(f"{self.directory}/{step}",
               f"the checkpoint at step {step} is damaged: {reason}")
    self.manager.reload()

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


TRAIN_META = "train_meta.json"


def save_final_params(workdir: str, params, model_config, meta: Optional[dict] = None,
                      extra: Optional[dict] = None) -> str:
  """Atomically (`atomic_io.atomic_dir`) writes `<workdir>/final`; returns its path.

  `meta` (the run's `training_meta`) goes to `final/train_meta.json`, so a later run can tell
  whether the artifact matches its settings; `extra`: more JSON files, {file name: object}. On
  an object store `final/` is rewritten in place and `save_params` writes its config.json last
  (`restore_params` refuses a `final/` without one), so an interrupted write makes the next run
  train again rather than read half an artifact."""
  final = atomic_io.as_path(workdir) / "final"
  with atomic_io.atomic_dir(final) as directory:
    _write_final(directory, params, model_config, meta, extra)
  return str(final)


def _write_final(directory: str, params, model_config, meta, extra) -> None:
  save_params(directory, params, model_config)
  if meta is not None:
    atomic_io.atomic_write_json(f"{directory}/{TRAIN_META}", meta, default=str)
  for name, obj in (extra or {}).items():
    atomic_io.atomic_write_json(f"{directory}/{name}", obj, default=str)
