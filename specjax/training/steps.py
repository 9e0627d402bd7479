"""The train state, the losses and the jitted train / eval steps.

Loss (per real target token, mean over the batch's loss mask):

  CE = -log p_student(target)
  KL = sum_v q_tau(v) (log q_tau(v) - log p_tau(v)),  q_tau = softmax(teacher / tau),
                                                       p_tau = softmax(student / tau)
  loss = (1 - w) CE + w tau^2 KL          (w = distill_weight; no teacher: CE)

The teacher's logits are computed inside the jitted step from the frozen teacher params (an
argument, never differentiated or donated); both models are called as the batch layout says
(decoder rows or seq2seq rows, `model_logits`). `train_step(spec)` is cached per `StepSpec`,
so runs in one process share one compiled step. The state is donated.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax
from flax import struct

from specjax.training.optim import OptimizerSpec, make_optimizer, make_schedule
from specjax.training.parallel import ParallelObjective, parallel_logits, slot_targets

__all__ = ["TrainState", "StepSpec", "model_logits", "token_losses", "init_state", "init_params",
           "train_step", "eval_step"]


@struct.dataclass
class TrainState:
  """Everything a run needs to continue exactly: step, params, optimizer state and a raw
  uint32 PRNG key (split every step, for models with randomness such as dropout)."""
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array

  def to_dict(self) -> dict:
    return {"step": self.step, "params": self.params, "opt_state": self.opt_state,
            "rng": self.rng}

  @classmethod
  def from_dict(cls, d: dict) -> "TrainState":
    return cls(step=d["step"], params=d["params"], opt_state=d["opt_state"], rng=d["rng"])


@dataclasses.dataclass(frozen=True)
class StepSpec:
  """The static parts of a train step (hashable: the jit cache key)."""
  model: Any
  optimizer: OptimizerSpec
  teacher: Any = None
  distill_weight: float = 0.0
  distill_temperature: float = 1.0
  parallel: Optional[ParallelObjective] = None   # PARD's mask slots (decoder rows)


def model_logits(model, params, batch) -> jax.Array:
  """Logits `[B, T, V]` of a model on a batch (layout picks the call)."""
  if "decoder_inputs" in batch:
    return model.forward(params, batch["inputs"], batch["input_lengths"], batch["decoder_inputs"])
  return model.forward(params, batch["tokens"])


def token_losses(logits_BTV, targets_BT, mask_BT, teacher_logits_BTV=None,
                 distill_weight: float = 0.0, temperature: float = 1.0):
  """(loss, metrics): see the module doc. Metrics hold sums and the token count.

  Written as logsumexp minus gathered logits: a [B, T, V] log_softmax's backward pass is
  costly on CPU.
  """
  logits_BTV = logits_BTV.astype(jnp.float32)
  mask_BT = mask_BT.astype(jnp.float32)
  targets_BT1 = targets_BT[..., None].astype(jnp.int32)
  tokens = jnp.sum(mask_BT)
  denom = jnp.maximum(tokens, 1.0)
  lse_BT = jax.nn.logsumexp(logits_BTV, -1)
  ce_BT = lse_BT - jnp.take_along_axis(logits_BTV, targets_BT1, -1)[..., 0]
  ce = jnp.sum(ce_BT * mask_BT) / denom
  correct = jnp.sum((jnp.argmax(logits_BTV, -1) == targets_BT) * mask_BT)
  metrics = {"ce_sum": ce * tokens, "correct": correct, "tokens": tokens}
  if teacher_logits_BTV is None:
    return ce, metrics
  tau = temperature
  teacher_BTV = jax.lax.stop_gradient(teacher_logits_BTV).astype(jnp.float32)
  t_logq_BTV = jax.nn.log_softmax(teacher_BTV / tau)
  q_BTV = jnp.exp(t_logq_BTV)
  # KL(q || p_tau) = sum q log q - sum q s / tau + logsumexp(s / tau)   (sum q = 1).
  scaled_BTV = logits_BTV / tau
  kl_BT = (jnp.sum(q_BTV * (t_logq_BTV - scaled_BTV), -1)
           + jax.nn.logsumexp(scaled_BTV, -1))
  kl = jnp.sum(kl_BT * mask_BT) / denom
  metrics["kl_sum"] = kl * tokens
  # The teacher's own CE: how good the imitated model is on the data.
  t_ce_BT = (jax.nn.logsumexp(teacher_BTV, -1)
             - jnp.take_along_axis(teacher_BTV, targets_BT1, -1)[..., 0])
  metrics["teacher_ce_sum"] = jnp.sum(t_ce_BT * mask_BT)
  loss = (1.0 - distill_weight) * ce + distill_weight * tau * tau * kl
  return loss, metrics


@functools.lru_cache(maxsize=32)
def _jitted_init(model):
  return jax.jit(model.init)


def init_params(model, seed: int):
  """`model.init(PRNGKey(seed))`, jitted once per model (cached)."""
  return _jitted_init(model)(jax.random.PRNGKey(seed))


@functools.lru_cache(maxsize=32)
def _jitted_opt_init(spec: OptimizerSpec):
  return jax.jit(make_optimizer(spec).init)


def init_state(spec: StepSpec, params, seed: int) -> TrainState:
  """A fresh state at step 0 around a copy of `params` (the train step donates the state, so
  the caller's arrays must not be in it)."""
  params = jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), params)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=_jitted_opt_init(spec.optimizer)(params),
                    rng=jax.random.key_data(jax.random.PRNGKey(seed)).astype(jnp.uint32))


def _loss_fn(spec: StepSpec, params, teacher_params, batch):
  obj = spec.parallel
  if obj is None:
    logits = model_logits(spec.model, params, batch)
  else:  # PARD: one forward over the real tokens (slot 0) and the mask slots
    slots_BKLV = parallel_logits(spec.model, params, batch["tokens"], obj.slots, obj.mask_id)
    logits = slots_BKLV[:, 0]
  teacher_logits = None
  if spec.teacher is not None:
    teacher_logits = jax.lax.stop_gradient(model_logits(spec.teacher, teacher_params, batch))
  loss, metrics = token_losses(logits, batch["targets"], batch["loss_mask"], teacher_logits,
                               spec.distill_weight, spec.distill_temperature)
  if obj is not None:  # each mask slot's CE against the data, weighted (`ParallelObjective`)
    w = obj.weights
    loss = w[0] * loss
    for j in range(1, obj.slots + 1):
      ce, m = token_losses(slots_BKLV[:, j], *slot_targets(batch["targets"],
                                                           batch["loss_mask"], j))
      loss = loss + w[j] * ce
      metrics[f"slot{j}_correct"], metrics[f"slot{j}_tokens"] = m["correct"], m["tokens"]
  return loss, metrics


def _train_step(spec: StepSpec, state: TrainState, batch, teacher_params):
  tx = make_optimizer(spec.optimizer)
  _, step_rng = jax.random.split(jax.random.wrap_key_data(state.rng))
  grad_fn = jax.value_and_grad(functools.partial(_loss_fn, spec), has_aux=True)
  (loss, metrics), grads = grad_fn(state.params, teacher_params, batch)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads),
                 learning_rate=make_schedule(spec.optimizer)(state.step))
  new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                         rng=jax.random.key_data(step_rng))
  return new_state, metrics


@functools.lru_cache(maxsize=32)
def train_step(spec: StepSpec):
  """The jitted step `(state, batch, teacher_params) -> (state, metrics)`; state donated."""
  return jax.jit(functools.partial(_train_step, spec), donate_argnums=0)


def _eval_step(spec: StepSpec, params, batch, teacher_params):
  _, metrics = _loss_fn(spec, params, teacher_params, batch)
  return metrics


@functools.lru_cache(maxsize=32)
def eval_step(spec: StepSpec):
  """The jitted `(params, batch, teacher_params) -> metric sums`."""
  return jax.jit(functools.partial(_eval_step, spec))
