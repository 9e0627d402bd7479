"""Learning-rate schedules and optimizers (optax), built from a hashable spec.

`OptimizerSpec` is frozen so that the jitted train step is cached per (model, teacher, optimizer)
and reused across runs in one process (a resumed run reuses the compiled step).

Schedules (`schedule`): linear warmup from 0 to `learning_rate` over `warmup_steps`, then

  * "cosine": cosine decay to `learning_rate * min_lr_ratio` at `total_steps`;
  * "linear": linear decay to `learning_rate * min_lr_ratio` at `total_steps`;
  * "inverse_sqrt": `learning_rate * sqrt(max(warmup_steps, 1) / step)` (T5);
  * "constant".

Optimizers: "adamw" (decoupled weight decay on matrices only, not on 1-D params) and "adafactor"
(optax's factored second moments, T5's default; `weight_decay` is its parameter decay rate).
Both clip the gradient's global norm to `grad_clip` first (0: no clipping).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Tuple

import jax
import jax.numpy as jnp
import optax

__all__ = ["OptimizerSpec", "make_schedule", "make_optimizer", "state_step", "SCHEDULES",
           "OPTIMIZERS"]

SCHEDULES = ("cosine", "linear", "inverse_sqrt", "constant")
OPTIMIZERS = ("adamw", "adafactor")


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
  """Hashable optimizer and schedule choices (see the module doc)."""
  optimizer: str = "adamw"
  learning_rate: float = 1e-3
  schedule: str = "cosine"
  warmup_steps: int = 0
  total_steps: int = 1000
  min_lr_ratio: float = 0.1
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  grad_clip: float = 1.0

  @classmethod
  def from_config(cls, config) -> "OptimizerSpec":
    return cls(optimizer=config.optimizer, learning_rate=float(config.learning_rate),
               schedule=config.schedule, warmup_steps=int(config.warmup_steps),
               total_steps=int(config.steps), min_lr_ratio=float(config.min_lr_ratio),
               weight_decay=float(config.weight_decay), b1=float(config.b1), b2=float(config.b2),
               eps=float(config.eps), grad_clip=float(config.grad_clip))


def make_schedule(spec: OptimizerSpec) -> Callable[[jax.Array], jax.Array]:
  """step (int) → learning rate (float32)."""
  if spec.schedule not in SCHEDULES:
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {spec.schedule!r}")
  lr, warm = spec.learning_rate, spec.warmup_steps
  end = lr * spec.min_lr_ratio
  decay_steps = max(spec.total_steps - warm, 1)

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warmup = lr * jnp.minimum(1.0, (step + 1.0) / max(warm, 1)) if warm else jnp.float32(lr)
    frac = jnp.clip((step - warm) / decay_steps, 0.0, 1.0)
    if spec.schedule == "cosine":
      after = end + (lr - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * frac))
    elif spec.schedule == "linear":
      after = lr + (end - lr) * frac
    elif spec.schedule == "inverse_sqrt":
      after = lr * jnp.sqrt(max(warm, 1) / jnp.maximum(step, max(warm, 1)))
    else:
      after = jnp.float32(lr)
    return jnp.where(step < warm, warmup, after).astype(jnp.float32)

  return schedule


def _decay_mask(params):
  return jax.tree_util.tree_map(lambda x: x.ndim >= 2, params)


def make_optimizer(spec: OptimizerSpec) -> optax.GradientTransformation:
  """The optax transformation: clip, then AdamW or Adafactor with the schedule."""
  schedule = make_schedule(spec)
  if spec.optimizer == "adamw":
    opt = optax.adamw(schedule, b1=spec.b1, b2=spec.b2, eps=spec.eps,
                      weight_decay=spec.weight_decay, mask=_decay_mask)
  elif spec.optimizer == "adafactor":
    opt = optax.adafactor(learning_rate=schedule, weight_decay_rate=spec.weight_decay or None,
                          clipping_threshold=None)
  else:
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {spec.optimizer!r}")
  if spec.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(spec.grad_clip), opt)
  return opt


def state_step(spec: OptimizerSpec
               ) -> Callable[[Dict[str, Any], Callable], Tuple[Dict[str, Any], Dict[str, Any]]]:
  """`(state, loss_fn) -> (state, metrics)`: one optimizer step on a train state `{"step",
  "params", "opt_state"}`, `loss_fn(params) -> (loss, metrics)`; the metrics come back with
  `loss` and the step's `lr`. Not jitted: the head trainers close over it in their jitted step."""
  tx, schedule = make_optimizer(spec), make_schedule(spec)

  def step(state, loss_fn):
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    metrics = dict(metrics, loss=loss, lr=schedule(state["step"]))
    return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, metrics
  return step
