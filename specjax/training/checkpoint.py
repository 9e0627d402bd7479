"""Train-state checkpoints (orbax CheckpointManager) and atomic final params.

Layout of a workdir:

  <workdir>/checkpoints/<step>/state/      the full `TrainState` (orbax StandardSave)
  <workdir>/checkpoints/<step>/meta/       JSON: model / teacher config, the training fields
                                           that fix the trajectory, data stats
  <workdir>/checkpoints/<step>/integrity/  JSON: the step, sha256 of the state's values
                                           (`integrity.params_digest`) and of the meta
  <workdir>/final/                         `orbax_io.save_params` layout (`restore_params`)
                                           and train_meta.json (the settings it was trained with)
  <workdir>/metrics.jsonl                  one JSON line per log / eval event
  <workdir>/summary.json                   the last run's summary

Atomicity: orbax writes each checkpoint into a temporary directory renamed to `<step>` when
complete, so a run killed mid-save leaves only the temporary directory, which `latest_step()`
ignores (and the next run removes). The digest is computed from the very host copy that is
written and committed with it by that rename (on an object store, orbax's commit marker, written
last): a `<step>` directory holds its digest or is not a checkpoint. `final/` is published whole
by `atomic_io.atomic_dir`: the old or the new, complete artifact.

Verification: a step is *verified* when it reads back whole, its meta and values match the
digests written with them and every value is finite. `restore_newest_intact` verifies the steps
newest first; a step that fails (unreadable, truncated, a flipped byte, a foreign digest,
non-finite values) is logged with its path and what failed and moved aside to
`<workdir>/checkpoints.corrupt/<step>.corrupt-<time>`, so a damaged checkpoint costs the steps
since the one before it, nothing else. A step written before digests existed is read with
orbax's checks only (logged).

Rotation (`keep`): after a save completes (`wait`, or the start of the next `save`) the steps
beyond the newest `keep` are deleted, but only once a newer step has been verified (read back:
one read of a step per rotation), and never the newest verified one: a damaged or unreadable newest write never costs the last
good checkpoint. `save` refuses a state holding a NaN / infinity (`NonFiniteTrainingError`,
nothing written or deleted), and a failed write (disk full, ...) is a `CheckpointWriteError`
naming the step, the cause and the steps still on disk; nothing is deleted after it.

Saves are asynchronous by default (a copy written in a background thread; `wait()` / `close()`
wait for it) and sharded over processes, nothing gathered to one host: every process of a
multi-host run must call `save` / `restore` / `wait` (orbax coordinates them). A state split over
processes carries no value digest (no process holds it whole): it is checked by orbax's reads and
the finiteness check only.
"""

from __future__ import annotations

import errno as errno_lib
import hashlib
import json
import time
from typing import Any, Callable, Optional, Set, Tuple

import jax
import numpy as np
from absl import logging
from jax.sharding import NamedSharding

from specjax import atomic_io
from specjax._checks import check_int
from specjax.checkpoints.integrity import first_line, params_digest, quiet_asyncio_errors
from specjax.checkpoints.orbax_io import save_params
from specjax.training.nonfinite import NonFiniteTrainingError, first_nonfinite

__all__ = ["Checkpointer", "CheckpointWriteError", "save_final_params", "move_aside",
           "integrity_record", "TRAIN_META", "INTEGRITY"]

INTEGRITY = "integrity"   # the orbax item holding a step's digests
_INTEGRITY_FORMAT = 1


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


def _meta_digest(meta: Any) -> str:
  """sha256 of `meta` as canonical JSON (what a JSON round trip gives back)."""
  text = json.dumps(json.loads(json.dumps(meta)), sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _split_over_processes(tree) -> bool:
  return any(isinstance(x, jax.Array) and not x.is_fully_addressable
             for x in jax.tree_util.tree_leaves(tree))


def integrity_record(step: int, host_state: dict, meta: Any) -> dict:
  """The digests saved with a step checkpoint: its step, the sha256 of the state's values (None
  for a state split over processes) and of its meta."""
  split = _split_over_processes(host_state)
  return {"format": _INTEGRITY_FORMAT, "step": int(step),
          "state_sha256": None if split else params_digest(host_state),
          "leaves": len(jax.tree_util.tree_leaves(host_state)),
          "meta_sha256": _meta_digest(meta)}


def _host_target(tree) -> Optional[Any]:
  """Shape / dtype structs (no sharding: restored as host numpy) of `tree`, or None for a tree
  split over processes (no process can hold it whole)."""
  if _split_over_processes(tree):
    return None
  return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), tree)


class CheckpointWriteError(OSError):
  """A step checkpoint could not be written (disk full, permissions, ...). Carries the cause's
  errno (ENOSPC for a full disk); the checkpoints written before it are untouched.

  Attributes:
    step: the step whose checkpoint failed.
    directory: the checkpoints directory.
    kept: the steps still there (the last of them the one a rerun resumes from).
  """

  def __init__(self, step: Optional[int], directory: str, cause: BaseException, kept: list):
    self.step, self.directory, self.kept = step, directory, list(kept)
    code = getattr(cause, "errno", None) or errno_lib.EIO
    left = (f"the steps still there: {self.kept} (a rerun resumes from the newest intact one)"
            if self.kept else "no earlier step checkpoint is there")
    super().__init__(code, f"the checkpoint at step {step} in {directory} could not be written "
                           f"({type(cause).__name__}: {first_line(cause)}); nothing was deleted; "
                           f"{left}")


class Checkpointer:
  """Saves / restores / verifies train states under `<workdir>/checkpoints` (see the module
  doc); keeps the newest `keep` steps, and always the newest verified one."""

  def __init__(self, workdir: str, keep: int, async_save: bool = True):
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    self._ocp = ocp
    self.keep = check_int("keep", keep, 1)
    self.directory = str(atomic_io.as_path(workdir) / "checkpoints")  # orbax takes gs:// too
    # A save interrupted by a kill leaves a temporary directory; the next run removes it.
    # Rotation is ours (`prune`): orbax would delete the oldest step before the newest verified.
    options = ocp.CheckpointManagerOptions(max_to_keep=None, create=True,
                                           enable_async_checkpointing=async_save,
                                           cleanup_tmp_directories=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         item_names=("state", "meta", INTEGRITY))
    self.verified: Set[int] = set()   # steps this process verified (restored or read back)
    self._target = None   # host structs of the state, for reading a step back (`_remember`)
    self._split = False   # the state is split over processes: no read back, no value digest
    self._pending: Optional[int] = None   # the step an unfinished save is writing

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def steps(self) -> list:
    """The complete step checkpoints on disk, oldest first."""
    return sorted(self.manager.all_steps())

  def save(self, step: int, state_dict: dict, meta: dict) -> None:
    """Starts writing `state_dict` (with `meta` and their digests) as step `step`.

    Raises `NonFiniteTrainingError` for a state with a NaN / infinite value and
    `CheckpointWriteError` when this write (or the previous, asynchronous one) fails, in both
    cases before anything is deleted."""
    ocp = self._ocp
    copy = _save_copy(state_dict)
    bad = first_nonfinite(copy)
    if bad is not None:
      raise NonFiniteTrainingError(
          step, bad[0], bad[1], f"the checkpoint at step {step} was not written; the step "
          f"checkpoints in {self.directory} are {self.steps()}")
    record = integrity_record(step, copy, meta)
    self.wait()  # the previous save complete (or its failure raised), then rotation
    self._remember(copy)
    self._pending = step
    try:
      self.manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(copy), meta=ocp.args.JsonSave(meta),
          integrity=ocp.args.JsonSave(record)), force=True)
      if not self.manager.is_saving_in_progress():
        self._finish()
    except CheckpointWriteError:
      raise
    except Exception as e:  # pylint: disable=broad-except  (orbax / tensorstore / OS errors)
      raise self._write_error(e) from e

  def _write_error(self, cause: BaseException) -> CheckpointWriteError:
    step, self._pending = self._pending, None
    try:
      self.manager.reload()
      kept = self.steps()
    except Exception:  # pylint: disable=broad-except
      kept = []
    kept = [s for s in kept if s != step]
    err = CheckpointWriteError(step, self.directory, cause, kept)
    logging.warning("%s", err)
    return err

  def _finish(self) -> None:
    """Waits for the pending save; a failure becomes a `CheckpointWriteError`."""
    try:
      self.manager.wait_until_finished()
      self.manager.check_for_errors()
    except Exception as e:  # pylint: disable=broad-except
      raise self._write_error(e) from e
    self._pending = None

  def restore_meta(self, step: int) -> dict:
    ocp = self._ocp
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

  def restore_integrity(self, step: int) -> Optional[dict]:
    """The digests stored with `step`, None for a step written before digests existed (orbax's
    `_CHECKPOINT_METADATA` lists no such item); raises for a missing or malformed record."""
    ocp = self._ocp
    step_dir = atomic_io.as_path(self.directory) / str(step)
    if not (step_dir / INTEGRITY).exists():
      try:  # orbax lists the items a step was saved with: a digest written is a digest due
        handlers = json.loads((step_dir / "_CHECKPOINT_METADATA").read_text())["item_handlers"]
      except Exception as e:  # pylint: disable=broad-except
        raise ValueError(f"no {INTEGRITY}/ and no readable _CHECKPOINT_METADATA "
                         f"({first_line(e)})") from e
      if INTEGRITY in handlers:
        raise ValueError(f"{INTEGRITY}/ is missing")
      return None
    record = self.manager.restore(
        step, args=ocp.args.Composite(**{INTEGRITY: ocp.args.JsonRestore()}))[INTEGRITY]
    if not isinstance(record, dict) or "meta_sha256" not in record or "step" not in record:
      raise ValueError(f"not an integrity record: {str(record)[:80]!r}")
    return record

  def restore(self, step: int, like_state_dict: dict) -> dict:
    """The state at `step`, with the tree structure of `like_state_dict` (not verified:
    `restore_newest_intact` verifies).

    Leaves of `like_state_dict` placed with a `NamedSharding` come back as jax.Arrays in that
    layout, each device reading its own slice; the others as numpy arrays."""
    def like(x):
      sharding = getattr(x, "sharding", None)
      if not isinstance(sharding, NamedSharding):
        sharding = None
      return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)
    return self._restore_state(step, jax.tree_util.tree_map(like, like_state_dict))

  def _restore_state(self, step: int, target) -> dict:
    ocp = self._ocp
    return self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target))).state

  def verify(self, step: int, like_state_dict=None,
             check_meta: Optional[Callable[[dict, int], None]] = None) -> Optional[dict]:
    """The state at `step` if the step verifies (see the module doc), else None, the step moved
    aside with a logged warning naming it and what failed.

    `like_state_dict`: the restore target (as for `restore`); None reads it back to host numpy
    with the last saved / restored state's structure (for a state split over processes only its
    meta and digests are checked, and None is returned for a verified step too).
    `check_meta(meta, step)` runs after the meta's digest is checked; it raises for a checkpoint
    of other settings (not damage: nothing is moved)."""
    try:
      with quiet_asyncio_errors():
        meta = self.restore_meta(step)
    except Exception as e:  # pylint: disable=broad-except  (orbax / tensorstore errors)
      self._set_aside(step, f"its meta cannot be read ({first_line(e)})")
      return None
    try:
      with quiet_asyncio_errors():
        record = self.restore_integrity(step)
    except Exception as e:  # pylint: disable=broad-except
      self._set_aside(step, f"its digest cannot be read ({first_line(e)})")
      return None
    if record is not None:
      if record["step"] != step:
        self._set_aside(step, f"its digest belongs to step {record['step']!r}")
        return None
      if record["meta_sha256"] != _meta_digest(meta):
        self._set_aside(step, "its meta differs from its digest (sha256 "
                        f"{_meta_digest(meta)} read, {record['meta_sha256']} written)")
        return None
    if check_meta is not None:
      check_meta(meta, step)
    target = None
    if like_state_dict is None:
      if self._split:  # no process holds the state whole: orbax's reads decide at restore
        self.verified.add(step)
        return None
      target = self._target
      if target is None:  # nothing saved or restored yet: no structure to read it back with
        return None
    try:
      with quiet_asyncio_errors():
        state = (self._restore_state(step, target) if target is not None
                 else self.restore(step, like_state_dict))
    except Exception as e:  # pylint: disable=broad-except
      self._set_aside(step, f"its train state cannot be read ({first_line(e)})")
      return None
    if record is None:
      logging.warning("%s/%d carries no digest (written before checkpoint digests): its values "
                      "are checked by orbax's reads only", self.directory, step)
    elif record.get("state_sha256") is not None:
      got = params_digest(state)
      if got != record["state_sha256"]:
        self._set_aside(step, f"its train state differs from its digest (sha256 {got} read, "
                        f"{record['state_sha256']} written)")
        return None
    bad = first_nonfinite(state)
    if bad is not None:
      self._set_aside(step, f"its train state holds a non-finite value ({bad[0]} = {bad[1]!r})")
      return None
    self.verified.add(step)
    if like_state_dict is not None and self._target is None:
      self._remember(like_state_dict)
    return state

  def _remember(self, state_dict) -> None:
    """Keeps the structure of `state_dict` for reading steps back (`verify` without a target)."""
    self._target = _host_target(state_dict)
    self._split = self._target is None

  def restore_newest_intact(self, like_state_dict: dict,
                            check_meta: Callable[[dict, int], None]) -> Optional[Tuple[int, dict]]:
    """`(step, state)` of the newest step checkpoint that verifies, or None.

    `check_meta(meta, step)` runs first on each (it raises for a checkpoint of other settings:
    not damage, nothing is moved). A step that does not verify is moved aside and the next one
    tried."""
    for step in sorted(self.manager.all_steps(), reverse=True):
      state = self.verify(step, like_state_dict, check_meta)
      if state is not None:
        return step, state
    return None

  def newest_verified(self) -> Optional[int]:
    """The newest step that verifies (reading steps back, newest first, as needed; damaged ones
    are moved aside), or None."""
    for step in reversed(self.steps()):
      if step in self.verified:
        return step
      self.verify(step)
      if step in self.verified:
        return step
    return None

  def prune(self) -> None:
    """Deletes the steps beyond the newest `keep`, keeping the newest verified one (none is
    deleted while no step verifies). Call when no save is pending (`wait` does)."""
    steps = self.steps()
    if len(steps) <= self.keep:
      return
    good = self.newest_verified()
    if good is None:
      logging.warning("no step checkpoint in %s verifies: none of %s deleted", self.directory,
                      self.steps())
      return
    steps = self.steps()
    keep = set(steps[-self.keep:]) | {good}
    for step in steps:
      if step not in keep:
        self.manager.delete(step)
        self.verified.discard(step)

  def _set_aside(self, step: int, reason: str) -> None:
    move_aside(f"{self.directory}/{step}",
               f"the checkpoint at step {step} is damaged: {reason}")
    self.verified.discard(step)
    self.manager.reload()

  def wait(self) -> None:
    """Waits for the pending save (`CheckpointWriteError` if it failed), then rotates."""
    self._finish()
    self.prune()

  def close(self) -> None:
    """Waits for the pending save (a failure is logged, not raised: this runs on the way out of
    a failed run too) and closes the manager. Deletes nothing."""
    try:
      self._finish()
    except CheckpointWriteError:
      pass  # logged by `_write_error`
    self.manager.close()


TRAIN_META = "train_meta.json"


def save_final_params(workdir: str, params, model_config, meta: Optional[dict] = None,
                      extra: Optional[dict] = None, step: Optional[int] = None) -> str:
  """Atomically (`atomic_io.atomic_dir`) writes `<workdir>/final`; returns its path.

  `meta` (the run's `training_meta`) goes to `final/train_meta.json`, so a later run can tell
  whether the artifact matches its settings; `extra`: more JSON files, {file name: object}. On
  an object store `final/` is rewritten in place and `save_params` writes its config.json last
  (`restore_params` refuses a `final/` without one), so an interrupted write makes the next run
  train again rather than read half an artifact.

  Parameters holding a NaN / infinity are refused (`NonFiniteTrainingError`, naming `step` when
  given) before anything is written: a `final/` is never written from a diverged state."""
  bad = first_nonfinite(params, "params")
  if bad is not None:
    raise NonFiniteTrainingError(step, bad[0], bad[1], f"{workdir}/final was not written")
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
