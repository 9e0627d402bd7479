"""Training a DFlash-style block draft on a frozen target (DFlash, arXiv 2602.06036).

  data = distillation_data(target, tp, prompts, lengths, max_new=96)   # heads.py
  res = train_dflash(target, tp, config, data, valid, train_config, workdir)

Self-distillation: the training sequences are the target's own continuations of its prompts
(`heads.distillation_data`), and the labels the target's own next-token distributions there
(soft cross-entropy: the draft learns what the target would say). The frozen target's hidden
states after `config.target_layers` (the context) and its final states (the labels) are
computed once.

Each step draws `DFlashLoss.anchors` random anchor positions per sequence among its generated
tokens (`anchor_positions`; a pure function of the seed and the step, so a resumed run sees
the same batches). The block anchored at a — the anchor token, then the mask slots at a + 1 ..
a + K - 1 — reads the context of positions < a, exactly as when drafting after a commit that
left the anchor pending; all the anchors of a sequence run in one forward, block-diagonal
causal among the slots (`anchored_log_probs`). Slot j predicts the token at a + j: the loss is
the soft CE against the target's distribution after position a + j - 1, slot j weighted
`slot_decay`^(j - 1) (a later slot counts only when every earlier one is accepted).

The final draft goes to `<workdir>/final` with its validation top-1 agreement with the target's
argmax by slot (`agreement.json`, `{"agreement_by_step": [...]}`, entry j - 1 slot j's: what
`specjax.checkpoints.heads.read_agreement` reads for `gamma="auto"`'s prior). Resumable and
checkpointed by `heads.resumable_loop` (a rerun resumes exactly; other settings are refused by
field).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from specjax import atomic_io
from specjax._checks import check_int, check_real
from specjax._clock import now
from specjax.models.dflash_head import (DFlashConfig, block_hidden, block_inputs, block_logits,
                                        context_features, context_kv, init_dflash,
                                        shared_weights)
from specjax.training.checkpoint import save_final_params
from specjax.training.heads import DistillData, head_mesh, resumable_loop, target_states
from specjax.training.loop import quiet_orbax_info_logs
from specjax.training.optim import OptimizerSpec, make_optimizer, state_step

__all__ = ["DFlashLoss", "anchor_positions", "anchored_log_probs", "dflash_loss",
           "slot_agreement", "train_dflash"]


@dataclasses.dataclass(frozen=True)
class DFlashLoss:
  """The objective's static settings: `anchors` random anchors per sequence and step; slot j's
  loss weighted `slot_decay`^(j - 1)."""

  anchors: int = 8
  slot_decay: float = 0.8

  def __post_init__(self):
    check_int("anchors", self.anchors, 1)
    object.__setattr__(self, "slot_decay", check_real("slot_decay", self.slot_decay, 0.0, 1.0,
                                                      lo_open=True))


def anchor_positions(generated_NL: np.ndarray, anchors: int, rng: np.random.Generator
                     ) -> Tuple[np.ndarray, np.ndarray]:
  """`anchors` random anchor positions per sequence among its generated tokens that have a
  next token (`generated_NL[n, a] and generated_NL[n, a + 1]`; a >= 1: a context to read):
  (int32 positions `[N, A]`, bool `[N, A]` whether the row had any; rows without one get
  position 1, weighted 0)."""
  ok_NL = np.zeros_like(generated_NL, bool)
  ok_NL[:, 1:-1] = generated_NL[:, 1:-1] & generated_NL[:, 2:]
  count_N = ok_NL.sum(1)
  pick_NA = (rng.random((len(ok_NL), anchors)) * np.maximum(count_N, 1)[:, None]).astype(int)
  order_NL = np.argsort(~ok_NL, axis=1, kind="stable")   # each row's anchor candidates first
  pos_NA = np.take_along_axis(order_NL, pick_NA, axis=1)
  has_N = count_N > 0
  return np.where(has_N[:, None], pos_NA, 1).astype(np.int32), np.repeat(has_N[:, None],
                                                                          anchors, 1)


def anchored_log_probs(config: DFlashConfig, params, shared, hidden_BLX, tokens_BL,
                       anchors_BA) -> jax.Array:
  """The draft over whole sequences, a block at each anchor: log-probs `[B, A, K - 1, V]`,
  `[b, i, j - 1]` the draft of the token at `anchors_BA[b, i] + j` (module doc). What the drafter
  computes after a prefill of the first a positions (tests/test_dflash.py)."""
  emb, lm = shared
  b, l = tokens_BL.shape
  a, k = anchors_BA.shape[1], config.block
  ctx_BLE = context_features(config, params, hidden_BLX)
  ctx_k, ctx_v = context_kv(config, params, ctx_BLE,
                            jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32)[None], (b, l)))
  anchors_BA = anchors_BA.astype(jnp.int32)
  x = block_inputs(params, emb, jnp.take_along_axis(tokens_BL, anchors_BA, axis=1), k)
  pos_BAK = anchors_BA[:, :, None] + jnp.arange(k, dtype=jnp.int32)[None, None]
  ctx_mask = jnp.arange(l)[None, None, :] < jnp.repeat(anchors_BA, k, axis=1)[:, :, None]
  self_mask = np.kron(np.eye(a, dtype=bool), np.tril(np.ones((k, k), bool)))
  out = block_hidden(config, params, x.reshape(b, a * k, -1), pos_BAK.reshape(b, a * k),
                     ctx_k, ctx_v, ctx_mask, self_mask).reshape(b, a, k, -1)
  return jax.nn.log_softmax(block_logits(lm, out[:, :, 1:]), axis=-1)


def _slot_targets(final_BLE, lm_EV, anchors_BA, valid_BL, k: int):
  """(target log-probs `[B, A, K-1, V]` after positions a + j - 1, bool mask `[B, A, K-1]`:
  the token at a + j exists)."""
  l = final_BLE.shape[1]
  at = anchors_BA[:, :, None] + jnp.arange(k - 1, dtype=jnp.int32)[None, None]   # a + j - 1
  inside = at + 1 < l
  at = jnp.minimum(at, l - 2)
  b, a = anchors_BA.shape
  h = jnp.take_along_axis(final_BLE, at.reshape(b, -1)[:, :, None], axis=1)
  tgt = jax.nn.log_softmax(h.astype(jnp.float32) @ lm_EV.astype(jnp.float32), axis=-1)
  ok = jnp.take_along_axis(valid_BL, (at + 1).reshape(b, -1), axis=1).reshape(b, a, k - 1)
  return tgt.reshape(b, a, k - 1, -1), ok & inside


def dflash_loss(config: DFlashConfig, loss: DFlashLoss, params, shared, hidden_BLX, final_BLE,
                tokens_BL, valid_BL, anchors_BA, weight_BA):
  """(loss, metrics): the slot-weighted soft CE (module doc); metrics `ce{j}`, `agree{j}` (top-1
  agreement with the target's argmax) per slot j."""
  logp = anchored_log_probs(config, params, shared, hidden_BLX, tokens_BL, anchors_BA)
  tgt, ok = _slot_targets(final_BLE, shared[1], anchors_BA, valid_BL, config.block)
  mask = ok & weight_BA[:, :, None]
  ce = -jnp.sum(jnp.exp(tgt) * logp, axis=-1)
  agree = jnp.argmax(logp, -1) == jnp.argmax(tgt, -1)
  total, metrics = 0.0, {}
  for j in range(1, config.block):
    m = mask[:, :, j - 1].astype(jnp.float32)
    denom = jnp.maximum(jnp.sum(m), 1.0)
    ce_j = jnp.sum(ce[:, :, j - 1] * m) / denom
    total = total + loss.slot_decay ** (j - 1) * ce_j
    metrics[f"ce{j}"] = ce_j
    metrics[f"agree{j}"] = jnp.sum(agree[:, :, j - 1] * m) / denom
  return total, metrics


def slot_agreement(config: DFlashConfig, params, shared, hidden, final, data: DistillData,
                   batch_size: int = 8) -> np.ndarray:
  """`[K - 1]`: how often slot j's top-1 draft equals the target's argmax, over every anchor
  among the generated tokens and slots whose position holds a generated token (teacher-forced:
  slot j's greedy acceptance given slots < j accepted)."""
  fn = _agreement_fn(config)
  l = data.tokens.shape[1]
  hits, counts = np.zeros(config.block - 1), np.zeros(config.block - 1)
  anchors = np.arange(1, l - 1, dtype=np.int32)
  for s in range(0, len(data.tokens), batch_size):
    sl = slice(s, s + batch_size)
    gen = data.generated[sl]
    a_BA = np.broadcast_to(anchors[None], (len(gen), len(anchors)))
    w_BA = np.take_along_axis(gen, a_BA, axis=1)
    h, c = fn(params, shared, jnp.asarray(hidden[sl]), jnp.asarray(final[sl]),
              jnp.asarray(data.tokens[sl]), jnp.asarray(gen), jnp.asarray(a_BA),
              jnp.asarray(w_BA))
    hits += np.asarray(h)
    counts += np.asarray(c)
  return hits / np.maximum(counts, 1)


@functools.lru_cache(maxsize=8)
def _agreement_fn(config: DFlashConfig):
  return jax.jit(functools.partial(_agreement_counts, config))


def _agreement_counts(config, params, shared, hidden, final, tokens, generated, anchors,
                      weight):
  """Per slot: (hits, counted) of `slot_agreement` over one batch."""
  logp = anchored_log_probs(config, params, shared, hidden, tokens, anchors)
  tgt, ok = _slot_targets(final, shared[1], anchors, generated, config.block)
  mask = ok & weight[:, :, None]
  agree = (jnp.argmax(logp, -1) == jnp.argmax(tgt, -1)) & mask
  return jnp.sum(agree, axis=(0, 1)), jnp.sum(mask, axis=(0, 1))


def _valid_rows(data: DistillData) -> np.ndarray:
  """bool `[N, L]`: positions holding a prompt or generated token."""
  gen = data.generated
  last = np.where(gen.any(1), gen.shape[1] - 1 - np.argmax(gen[:, ::-1], axis=1), -1)
  return np.arange(gen.shape[1])[None] <= last[:, None]


@functools.lru_cache(maxsize=8)
def _train_step(config: DFlashConfig, loss: DFlashLoss, spec: OptimizerSpec):
  update = state_step(spec)

  def step(state, shared, hidden, final, tokens, valid, anchors, weight):
    return update(state, lambda p: dflash_loss(config, loss, p, shared, hidden, final, tokens,
                                               valid, anchors, weight))
  return jax.jit(step, donate_argnums=0)


def _states(target, target_params, config: DFlashConfig, tokens: np.ndarray):
  """(hidden states after the target layers `[N, L, X]`, final states `[N, L, E]`)."""
  return (target_states(target, target_params, tokens, layers=config.target_layers),
          target_states(target, target_params, tokens))


def train_dflash(target, target_params, config: DFlashConfig, data: DistillData,
                 valid: Optional[DistillData], train: Any, workdir: str,
                 loss: Optional[DFlashLoss] = None,
                 stop_at_step: Optional[int] = None) -> Dict[str, Any]:
  """Trains a DFlash draft (module doc); returns {"params", "agreement", "final"}.

  `train`: steps, batch_size, learning_rate, warmup_steps, checkpoint_every, log_every, seed,
  keep_checkpoints (as `train_eagle`; one device: mesh_data / mesh_model above 1 are refused).
  A rerun resumes exactly; other settings are a ValueError naming the field."""
  quiet_orbax_info_logs()
  loss = loss or DFlashLoss()
  _, mesh = head_mesh(train)
  if mesh is not None:
    raise ValueError("train.mesh_data / train.mesh_model: train_dflash runs on one device "
                     "(use 1 x 1)")
  target.check_layers(config.target_layers)
  atomic_io.as_path(workdir).mkdir(parents=True, exist_ok=True)
  shared = shared_weights(target, target_params)
  spec = OptimizerSpec(optimizer="adamw", learning_rate=float(train.learning_rate),
                       schedule="cosine", warmup_steps=int(train.warmup_steps),
                       total_steps=int(train.steps), weight_decay=0.0)
  meta = {"config": json.loads(json.dumps(dataclasses.asdict(config))),  # tuples as stored
          "loss": dataclasses.asdict(loss), "optimizer": dataclasses.asdict(spec),
          "batch_size": int(train.batch_size), "seed": int(train.seed),
          "data": {"rows": int(len(data.tokens)), "length": int(data.tokens.shape[1]),
                   "generated": int(data.generated.sum())}}
  t0 = now()
  hidden, final = _states(target, target_params, config, data.tokens)
  valid_mask = _valid_rows(data)
  logging.info("target states of %d sequences: %.1fs", len(hidden), now() - t0)
  init = init_dflash(config, jax.random.key(int(train.seed)))
  state = {"step": jnp.zeros((), jnp.int32), "params": init,
           "opt_state": make_optimizer(spec).init(init)}
  step_fn = _train_step(config, loss, spec)
  rows = len(data.tokens)

  def batch(s):
    rng = np.random.default_rng((int(train.seed), s))
    idx = rng.integers(0, rows, int(train.batch_size))
    anchors, weight = anchor_positions(data.generated[idx], loss.anchors, rng)
    arrays = (hidden[idx], final[idx], data.tokens[idx], valid_mask[idx], anchors, weight)
    return (shared,) + tuple(jnp.asarray(x) for x in arrays)

  describe = lambda m: "loss %.4f | top-1 agreement by slot %s" % (m["loss"], " ".join(
      f"{m[f'agree{j}']:.3f}" for j in range(1, config.block)))
  state = resumable_loop(workdir, meta, state, step_fn, batch, train,
                         f"DFlash draft (block {config.block})", describe, None, stop_at_step)
  agreement = final_path = None
  if int(state["step"]) == int(train.steps):
    eval_data = valid if valid is not None else data
    eh, ef = (hidden, final) if valid is None else _states(target, target_params, config,
                                                          valid.tokens)
    agreement = slot_agreement(config, state["params"], shared, eh, ef, eval_data)
    logging.info("DFlash top-1 agreement by slot on %s: %s",
                 "validation" if valid else "training data", np.round(agreement, 3).tolist())
    final_path = save_final_params(workdir, state["params"], config, meta,
                                   {"agreement.json": {"agreement_by_step": agreement.tolist()}})
  return {"params": state["params"], "agreement": agreement, "final": final_path}
