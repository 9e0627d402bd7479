"""Train-state checkpoints (orbax CheckpointManager) and atomic final params.

Layout of a workdir:

  <workdir>/checkpoints/<step>/state/   the full `TrainState` (orbax StandardSave)
  <workdir>/checkpoints/<step>/meta/    JSON: model / teacher config
                                        (`orbax_io.config_to_dict`), the training
                                        fields that fix the trajectory, data stats
  <workdir>/final/                      `orbax_io.save_params` layout (params +
                                        config.json), loadable by `restore_params`
  <workdir>/metrics.jsonl               one JSON line per log / eval event
  <workdir>/summary.json                the last run's summary

Atomicity: orbax writes each checkpoint into a temporary directory and
renames it to `<step>` when complete (`CheckpointManager` finalisation); a
run killed mid-save leaves only the temporary directory, which
`latest_step()` ignores. The final params are written by `save_params` into
`<workdir>/final.tmp-<pid>` and then renamed to `<workdir>/final` (a previous
`final` is first renamed aside and removed after), so `final/` is either the
old or the new, complete artifact. Small JSON files are written to a temporary
file and `os.replace`d.

Saves are asynchronous by default: the state is first copied to host numpy
arrays (so the donated device buffers can be reused at once) and orbax writes
them in a background thread; `close()` waits for it.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Optional

import jax
import numpy as np

from specjax import atomic_io
from specjax.checkpoints.orbax_io import save_params

__all__ = ["Checkpointer", "save_final_params", "atomic_write_json"]


def atomic_write_json(obj: Any, path: str) -> None:
  """Writes `obj` as JSON (non-JSON values as str) atomically (`specjax.atomic_io`)."""
  atomic_io.atomic_write_json(path, obj, indent=1, default=str)


def _host_copy(tree):
  return jax.tree_util.tree_map(lambda x: np.array(x, copy=True), tree)


class Checkpointer:
  """Saves / restores train states under `<workdir>/checkpoints`."""

  def __init__(self, workdir: str, keep: int, async_save: bool = True):
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    self._ocp = ocp
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    # cleanup_tmp_directories: a save interrupted by a kill leaves a temporary
    # directory; the next run removes it.
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
        state=ocp.args.StandardSave(_host_copy(state_dict)), meta=ocp.args.JsonSave(meta)),
        force=True)

  def restore_meta(self, step: int) -> dict:
    ocp = self._ocp
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

  def restore(self, step: int, like_state_dict: dict) -> dict:
    """The state at `step`, with the tree structure of `like_state_dict`."""
    ocp = self._ocp
    target = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype),
                                    like_state_dict)
    return self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target))).state

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def save_final_params(workdir: str, params, model_config) -> str:
  """Atomically (tmp dir + rename) writes `<workdir>/final`; returns its path."""
  workdir = os.path.abspath(workdir)
  final = os.path.join(workdir, "final")
  tmp = f"{final}.tmp-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  save_params(tmp, params, model_config)
  old = f"{final}.old-{os.getpid()}"
  if os.path.exists(final):
    os.rename(final, old)
  os.rename(tmp, final)
  shutil.rmtree(old, ignore_errors=True)
  return final
