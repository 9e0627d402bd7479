"""Non-finite training: the named error, the loop's loss / gradient-norm guard, the state check.

A step whose loss or gradient norm is NaN or infinite means the run has diverged (or its state
was damaged): the parameters that follow are worthless, and saving them would rotate good
checkpoints away. `train_model` therefore checks every step's loss and gradient norm before it
writes anything (a metrics line, a checkpoint, `final/`), and `Checkpointer.save` refuses a
state holding a non-finite value. What happens is `config.on_nonfinite`:

  "stop" (default)  `NonFiniteTrainingError` (a FloatingPointError) naming the first bad step,
                    the metric and its value. Nothing is written or rotated: the checkpoints
                    on disk are the good ones, and a rerun resumes from the newest of them.
  "skip_step"       the step runs through `guarded_train_step`: an update whose loss, gradient
                    norm or resulting parameters are non-finite is dropped (parameters and
                    optimizer state stay as they were, including the optimizer's step count;
                    the step counter and the data position advance, so the batch is skipped).
                    Each skipped step is logged by number; `config.max_skipped_steps` skipped
                    in a row stop the run with the same error.

No host sync per step: the metrics stay on the device until the next log / checkpoint / eval
step, where `NonFiniteGuard.check` fetches them (two scalars per step) before anything is
written. Restoring the last checkpoint with a lower learning rate ("restore_lower_lr") is not
offered: the learning rate is part of the trajectory a checkpoint belongs to; start a new
workdir with a lower `learning_rate` (e.g. from `final/` or a step checkpoint's parameters).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec as P

from specjax.training import mesh as mesh_lib
from specjax.training.steps import StepSpec, TrainState, _train_step, train_step

__all__ = ["NonFiniteTrainingError", "NonFiniteGuard", "ON_NONFINITE", "first_nonfinite",
           "guarded_train_step", "train_step_for"]

# The choices of `config.on_nonfinite`.
ON_NONFINITE = ("stop", "skip_step")

_GUARDED = ("loss", "grad_norm")  # the per-step metrics checked, in this order


class NonFiniteTrainingError(FloatingPointError):
  """Training produced a NaN / infinite value; raised before anything is written or rotated.

  Attributes:
    step: the step number (as in metrics.jsonl: the update that produced state `step`); None
      for parameters about to be written as `final/` without a step.
    metric: "loss", "grad_norm" or the path of a state leaf (`"params['embed']['embedding']"`).
    value: the offending value (a float).
    note: what was kept / what to do.
  """

  def __init__(self, step: Optional[int], metric: str, value: float, note: str = ""):
    self.step = None if step is None else int(step)
    self.metric, self.value, self.note = str(metric), float(value), note
    where = "in the final parameters" if self.step is None else f"at step {self.step}"
    super().__init__(
        f"non-finite {self.metric} {where}: {self.value!r}; training stopped "
        "before writing or rotating anything" + (f" ({note})" if note else "") + ". Lower "
        "config.learning_rate (a new workdir, since it fixes the trajectory) or look at the "
        "data; config.on_nonfinite='skip_step' drops such steps instead")


def _float_leaves(tree: Any) -> List[Tuple[str, Any]]:
  """`(path, leaf)` of the floating-point leaves of `tree`."""
  out = []
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    if jnp.issubdtype(dtype, jnp.inexact):
      out.append((jax.tree_util.keystr(path), x))
  return out


@jax.jit
def _device_first_bad(x):
  bad = ~jnp.isfinite(x.ravel())
  return jnp.any(bad), x.ravel()[jnp.argmax(bad)]


def first_nonfinite(tree: Any, prefix: str = "") -> Optional[Tuple[str, float]]:
  """`(leaf path, value)` of the first NaN / infinite entry of a float leaf of `tree` (host
  arrays checked with numpy, arrays split over processes on their devices), or None."""
  for path, x in _float_leaves(tree):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      any_bad, value = _device_first_bad(x)
      if bool(any_bad):
        return prefix + path, float(value)
      continue
    a = np.asarray(x)
    finite = np.isfinite(a)
    if not finite.all():
      return prefix + path, float(a.ravel()[np.argmin(finite.ravel())])
  return None


def _all_finite(tree) -> jax.Array:
  leaves = [x for _, x in _float_leaves(tree)]
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])) if leaves else True


def _guarded_step(spec: StepSpec, state: TrainState, batch, teacher_params):
  """`_train_step`, keeping `state`'s parameters and optimizer state when the update is
  non-finite; metrics gain "skipped" (1.0 for a dropped update)."""
  new, metrics = _train_step(spec, state, batch, teacher_params)
  ok = (jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
        & _all_finite(new.params))
  keep = functools.partial(jax.tree_util.tree_map, lambda a, b: jnp.where(ok, a, b))
  guarded = TrainState(step=new.step, params=keep(new.params, state.params),
                       opt_state=keep(new.opt_state, state.opt_state), rng=new.rng)
  return guarded, dict(metrics, skipped=jnp.where(ok, 0.0, 1.0).astype(jnp.float32))


@functools.lru_cache(maxsize=32)
def guarded_train_step(spec: StepSpec) -> Callable:
  """The jitted skip-step variant of `steps.train_step` (state donated)."""
  return jax.jit(functools.partial(_guarded_step, spec), donate_argnums=0)


def _guarded_fn(spec: StepSpec):
  return functools.partial(_guarded_step, spec)


def train_step_for(spec: StepSpec, on_nonfinite: str, mesh=None, state=None) -> Callable:
  """The step function `train_model` runs for `config.on_nonfinite` (on `mesh` when given:
  `state` gives the layout)."""
  if on_nonfinite not in ON_NONFINITE:
    raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, got {on_nonfinite!r}")
  if on_nonfinite == "stop":
    return train_step(spec) if mesh is None else mesh_lib.sharded_train_step(spec, mesh, state)
  if mesh is None:
    return guarded_train_step(spec)
  out = (mesh_lib.state_shardings(state, mesh), NamedSharding(mesh, P()))
  return mesh_lib.sharded_jit(_guarded_fn, (spec,), out)


class NonFiniteGuard:
  """Holds each step's loss / gradient norm (device scalars) until `check`, which fetches them
  and raises `NonFiniteTrainingError` ("stop") or logs the skipped steps ("skip_step")."""

  def __init__(self, on_nonfinite: str = "stop", max_skipped_steps: int = 10,
               note: Callable[[], str] = lambda: ""):
    if on_nonfinite not in ON_NONFINITE:
      raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, got {on_nonfinite!r}")
    self.mode = on_nonfinite
    self.max_skipped = int(max_skipped_steps)
    self.note = note
    self.pending: list = []
    self.skipped_in_a_row = 0
    self.skipped_steps: List[int] = []

  def add(self, step: int, metrics: dict) -> None:
    keys = _GUARDED + (("skipped",) if "skipped" in metrics else ())
    self.pending.append((step, {k: metrics[k] for k in keys}))

  def check(self) -> None:
    """Fetches the pending steps' metrics; raises for the first non-finite one ("stop"), or for
    more than `max_skipped_steps` skipped in a row ("skip_step")."""
    if not self.pending:
      return
    pending, self.pending = self.pending, []
    fetched = jax.device_get([m for _, m in pending])
    for (step, _), m in zip(pending, fetched):
      bad = [(k, float(m[k])) for k in _GUARDED if not math.isfinite(float(m[k]))]
      if self.mode == "stop":
        if bad:
          raise NonFiniteTrainingError(step, bad[0][0], bad[0][1], self.note())
        continue
      if float(m.get("skipped", 0.0)):
        self.skipped_in_a_row += 1
        self.skipped_steps.append(step)
        what = (f"{bad[0][0]} {bad[0][1]!r}" if bad
                else "the update made a parameter non-finite")
        logging.warning("step %d skipped (config.on_nonfinite='skip_step'): %s; %d in a row",
                        step, what, self.skipped_in_a_row)
        if self.skipped_in_a_row > self.max_skipped:
          metric, value = bad[0] if bad else ("update", math.nan)
          raise NonFiniteTrainingError(
              step, metric, value,
              f"{self.skipped_in_a_row} steps in a row skipped, more than "
              f"config.max_skipped_steps = {self.max_skipped}; " + self.note())
      else:
        self.skipped_in_a_row = 0
