"""What a run records for TensorBoard: scalars (`ScalarWriter`) and profiler
traces of a few decode iterations (`profile_decode` / `maybe_profile`)."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, Mapping, Optional

import jax
import numpy as np
from absl import logging

from specjax._checks import check_int
from specjax.atomic_io import is_local
from specjax.parallel.distributed import is_main_process

__all__ = ["ScalarWriter", "maybe_profile", "profile_decode"]


class ScalarWriter:
  """TensorBoard scalars in `logdir` (an `events.out.tfevents.*` file written by tensorboardX),
  beside an experiment's JSONL logs. Only the main process writes; elsewhere (or with
  `enabled=False`) every method is a no-op. A non-local `logdir` (gs://...) is skipped with a
  logged note (tensorboardX reaches GCS only through its own client; the JSON holds the numbers).

  Example:
    with ScalarWriter(os.path.join(workdir, "tb")) as tb:
      tb.write(step, {"tokens_per_s": 812.5, "acceptance": 0.71})
  """

  def __init__(self, logdir: str, *, enabled: Optional[bool] = None, flush_secs: float = 30.0):
    if not isinstance(logdir, (str, os.PathLike)) or not str(logdir):
      raise ValueError(f"logdir must be a non-empty path, got {logdir!r}")
    self.logdir = os.fspath(logdir)
    self.enabled = is_main_process() if enabled is None else bool(enabled)
    if self.enabled and not is_local(self.logdir):
      logging.info("TensorBoard scalars skipped: %s is not local (the JSON logs hold them)",
                   self.logdir)
      self.enabled = False
    self._writer = None
    self._closed = False
    if self.enabled:
      try:
        from tensorboardX import SummaryWriter
      except ImportError as e:
        raise ImportError("ScalarWriter needs tensorboardX: pip install tensorboardX") from e
      self._writer = SummaryWriter(self.logdir, flush_secs=flush_secs)

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Adds each `{name: value}` (a number or a scalar array) at `step`."""
    if self._closed:
      raise ValueError(f"ScalarWriter({self.logdir!r}) is closed")
    step = check_int("step", step, 0)
    if not isinstance(scalars, Mapping):
      raise ValueError(f"scalars must be a mapping of name to number, got {scalars!r}")
    values = {}
    for name, value in scalars.items():
      if not isinstance(name, str) or not name:
        raise ValueError(f"scalar names must be non-empty strings, got {name!r}")
      try:
        values[name] = float(np.asarray(value).item())
      except (TypeError, ValueError):
        raise ValueError(f"scalar {name!r} must be a number or a one-element array, "
                         f"got {value!r}") from None
    if self._writer is not None:
      for name, value in values.items():
        self._writer.add_scalar(name, value, global_step=step)

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    """Flushes and closes the events file (idempotent)."""
    if self._writer is not None and not self._closed:
      self._writer.close()
    self._closed = True

  def __enter__(self) -> "ScalarWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


@contextlib.contextmanager
def maybe_profile(logdir: Optional[str], enabled: bool = True) -> Iterator[None]:
  """`jax.profiler.trace(logdir)` around the block when `enabled` and a logdir is given; the
  trace lands in `<logdir>/plugins/profile/<run>/` (TensorBoard or Perfetto read it)."""
  if not enabled or logdir is None:
    yield
    return
  with jax.profiler.trace(os.fspath(logdir)):
    yield


def profile_decode(fn: Callable[[], Any], logdir: str, steps: int = 3) -> Any:
  """Calls `fn()` `steps` times under a `jax.profiler` trace written to `logdir`, waiting for each
  result (so the trace holds the device work); returns the last. Call `fn` once before to keep
  compilation out of the trace."""
  if not callable(fn):
    raise ValueError(f"fn must be callable, got {fn!r}")
  steps = check_int("steps (config.profile_steps)", steps, 1)
  out = None
  with maybe_profile(logdir, True):
    for _ in range(steps):
      out = jax.block_until_ready(fn())
  return out
