"""Training EAGLE heads on a frozen target (EAGLE-1 / EAGLE-3).

  data = distillation_data(target, tp, prompts, lengths, max_new=96)   # heads.py
  res = train_eagle(target, tp, config, data, valid, train_config, workdir)

The target is frozen: its features over the training sequences (the final state for EAGLE-1, the
chosen blocks' outputs for EAGLE-3) and its final states (for the labels) are computed once. The
labels are the target's own next-token distributions (soft cross-entropy: the head learns what
the target would say, not the corpus). The head runs as a causal one-layer transformer over the
pairs (f_t, x_{t+1}) of a whole sequence at once:

  step 1  input (f_t, x_{t+1}) → out1_t ≈ f_{t+1}; CE vs p_target(x_{t+2})
  step j  input (out{j-1}_t, x_{t+j}) → outj_t; CE vs p_target(x_{t+j+1})
          (training-time test, EAGLE-3: query t attends to the step-1 keys of positions ≤ t
          and to its own steps 2..j — exactly what the drafter sees at depth j-1 of a tree)

A block head (`EagleConfig.block` = K; DFlash, arXiv 2602.06036) is the same forward with step
j ≥ 2's input the learned mask (slot j-1 of the block anchored at every base t, attending as in
drafting), trained by CE at every slot, slot j weighted `step_decay`^(j-1) (it counts only when
every earlier slot is accepted), without feature loss or noise.

EAGLE-1 adds the feature regression smooth-L1(out1_t, f_{t+1}) (weight `feature_weight`, CE
weight `ce_weight`; the paper's 1.0 / 0.1) and uniform noise U(-noise, noise) on the input
features; EAGLE-3 uses CE only, step j weighted `step_decay`^(j-1), `unroll` steps.

Resumable (`heads.resumable_loop`); the final head goes to `<workdir>/final` with its validation
top-1 agreement per step.
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

from specjax._clock import now
from specjax import atomic_io
from specjax.models.eagle_head import (EagleConfig, attend, finish, fuse_features, head_logits,
                                       init_eagle, layer_params, mask_inputs, pair_inputs, qkv,
                                       shared_weights)
from specjax.training import mesh as mesh_lib
from specjax.training.checkpoint import save_final_params
from specjax.training.heads import DistillData, head_mesh, resumable_loop, target_states
from specjax.training.loop import quiet_orbax_info_logs
from specjax.training.optim import OptimizerSpec, make_optimizer, state_step

__all__ = ["EagleLoss", "unrolled_outputs", "block_outputs", "eagle_loss", "train_eagle",
           "step_agreement", "head_name"]


@dataclasses.dataclass(frozen=True)
class EagleLoss:
  """The loss's static settings (see the module doc)."""

  unroll: int = 1
  feature_weight: float = 1.0
  ce_weight: float = 0.1
  noise: float = 0.1
  step_decay: float = 0.8

  @classmethod
  def for_version(cls, version: int, unroll: Optional[int] = None) -> "EagleLoss":
    """EAGLE-1: feature + 0.1 CE, one step; EAGLE-3: CE only, 3 steps."""
    if version == 3:
      return cls(unroll=3 if unroll is None else unroll, feature_weight=0.0, ce_weight=1.0,
                 noise=0.0)
    return cls(unroll=1 if unroll is None else unroll)

  @classmethod
  def for_config(cls, config: EagleConfig, unroll: Optional[int] = None) -> "EagleLoss":
    """`for_version`, or for a block head: CE only over its `block` slots."""
    if config.block:
      return cls(unroll=config.block if unroll is None else unroll, feature_weight=0.0,
                 ce_weight=1.0, noise=0.0)
    return cls.for_version(config.version, unroll)


def unrolled_outputs(config: EagleConfig, params, embedding_VE, feats_BLE, tokens_BL,
                     unroll: int):
  """The head over whole sequences, unrolled `unroll` steps (module doc).

  feats_BLE: head-space features (fused) at positions 0..L-1; tokens_BL. Returns a list of
  `unroll` arrays `[B, L-1, E]`: step j's output at base position t (for t + j < L; later
  entries are padding-fed)."""
  b, l = tokens_BL.shape
  tokens_pad = jnp.concatenate([tokens_BL, jnp.zeros((b, unroll), tokens_BL.dtype)], axis=1)
  base = jnp.broadcast_to(jnp.arange(l - 1, dtype=jnp.int32)[None], (b, l - 1))
  causal = (jnp.arange(l - 1)[None, :] <= jnp.arange(l - 1)[:, None])[None]
  outs, diag = [], []
  feat = feats_BLE[:, :-1]
  k1 = v1 = None
  if config.block:
    return block_outputs(config, params, embedding_VE, feats_BLE, tokens_BL, unroll)
  for j in range(1, unroll + 1):
    x = pair_inputs(config, params, embedding_VE, feat, tokens_pad[:, j:j + l - 1])
    q, k, v = qkv(config, params, x, base + (j - 1))
    if j == 1:
      k1, v1 = k, v
      att = attend(config, q, [(k1, v1, causal)])
    else:
      diag.append((k, v))
      att = attend(config, q, [(k1, v1, causal)], diag)
    out = finish(config, params, x, att)
    outs.append(out)
    feat = out
  return outs


def block_outputs(config: EagleConfig, params, embedding_VE, feats_BLE, tokens_BL, slots: int):
  """A block head over whole sequences: the block anchored at every base t at once (slot 0 the
  pair (f_t, x_{t+1}), slots 1.. the mask, at positions t + j), each layer's slot queries
  attending to that layer's projections of the pairs before t and to the block's slots up to
  their own (`specjax.models.eagle_head`). Returns `slots` arrays `[B, L-1, E]`."""
  b, l = tokens_BL.shape
  pair = pair_inputs(config, params, embedding_VE, feats_BLE[:, :-1], tokens_BL[:, 1:])
  base = jnp.broadcast_to(jnp.arange(l - 1, dtype=jnp.int32)[None], (b, l - 1))
  before = (jnp.arange(l - 1)[None, :] < jnp.arange(l - 1)[:, None])[None]
  hs = [pair] + [mask_inputs(params, (b, l - 1))] * (slots - 1)
  for i in range(config.num_layers):
    p = layer_params(params, i)
    proj = [qkv(config, p, h, base + j) for j, h in enumerate(hs)]
    # The context: this layer's projections of the pairs (layer 0's are slot 0's own).
    _, ctx_k, ctx_v = proj[0] if i == 0 else qkv(config, p, pair, base)
    hs = [finish(config, p, h, attend(config, q, [(ctx_k, ctx_v, before)],
                                      [(k, v) for _, k, v in proj[:j + 1]]))
          for j, (h, (q, _, _)) in enumerate(zip(hs, proj))]
  return hs


def eagle_loss(config: EagleConfig, loss: EagleLoss, params, shared, feats_BLX, final_BLE,
               tokens_BL, valid_BL, key):
  """(loss, metrics): soft CE against the target's next-token distribution per unrolled step (+
  the feature loss for EAGLE-1); metrics: each step's top-1 agreement (`agree{j}`)."""
  emb, lm = shared
  f = fuse_features(config, params, feats_BLX)
  if loss.noise > 0:
    f = f + jax.random.uniform(key, f.shape, minval=-loss.noise, maxval=loss.noise)
  b, l = tokens_BL.shape
  outs = unrolled_outputs(config, params, emb, f, tokens_BL, loss.unroll)
  pad = lambda a: jnp.concatenate([a, jnp.zeros((b, loss.unroll) + a.shape[2:], a.dtype)], 1)
  final_pad, valid_pad = pad(final_BLE.astype(jnp.float32)), pad(valid_BL)
  total, metrics = 0.0, {}
  for j, out in enumerate(outs, start=1):
    # Step j at base t predicts the token after position t + j.
    tgt_logits = final_pad[:, j:j + l - 1] @ lm.astype(jnp.float32)
    mask = valid_pad[:, j:j + l - 1].astype(jnp.float32)
    p_tgt = jax.nn.softmax(tgt_logits, axis=-1)
    logits = head_logits(config, params, lm, out)
    ce = -jnp.sum(p_tgt * jax.nn.log_softmax(logits, axis=-1), axis=-1)
    denom = jnp.maximum(jnp.sum(mask), 1.0)
    ce = jnp.sum(ce * mask) / denom
    total = total + loss.ce_weight * loss.step_decay ** (j - 1) * ce
    metrics[f"ce{j}"] = ce
    metrics[f"agree{j}"] = jnp.sum((jnp.argmax(logits, -1) == jnp.argmax(tgt_logits, -1))
                                   * mask) / denom
    if j == 1 and loss.feature_weight > 0:
      diff = out - final_BLE[:, 1:].astype(jnp.float32)
      a = jnp.abs(diff)
      sl1 = jnp.mean(jnp.where(a < 1.0, 0.5 * diff * diff, a - 0.5), axis=-1)
      fl = jnp.sum(sl1 * mask) / denom
      total = total + loss.feature_weight * fl
      metrics["feature"] = fl
  return total, metrics


def head_name(config: EagleConfig) -> str:
  """"EAGLE-1", "EAGLE-3" or "block-K" (a block head of K slots)."""
  return f"block-{config.block}" if config.block else f"EAGLE-{config.version}"


def _valid_rows(data: DistillData) -> np.ndarray:
  """bool `[N, L]`: positions holding a prompt or generated token."""
  gen = data.generated
  last = np.where(gen.any(1), gen.shape[1] - 1 - np.argmax(gen[:, ::-1], axis=1), -1)
  return np.arange(gen.shape[1])[None] <= last[:, None]


def _step_fn(config: EagleConfig, loss: EagleLoss, spec: OptimizerSpec):
  """`(state, shared, feats, final, tokens, valid) -> (state, metrics)`, not jitted."""
  update = state_step(spec)

  def step(state, shared, feats, final, tokens, valid):
    key = jax.random.fold_in(jax.random.key(0), state["step"])
    return update(state, lambda p: eagle_loss(config, loss, p, shared, feats, final, tokens,
                                              valid, key))
  return step


@functools.lru_cache(maxsize=8)
def _train_step(config: EagleConfig, loss: EagleLoss, spec: OptimizerSpec):
  return jax.jit(_step_fn(config, loss, spec), donate_argnums=0)


def _states(target, tp, config: EagleConfig, tokens: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """(features `[N, L, X]`, final states `[N, L, E]`) of the frozen target."""
  final = target_states(target, tp, tokens)
  feats = final if config.version == 1 else target_states(target, tp, tokens,
                                                          layers=config.feature_layers)
  return feats, final


def step_agreement(config: EagleConfig, loss: EagleLoss, params, shared, feats, final,
                   data: DistillData, batch_size: int = 16) -> np.ndarray:
  """`[unroll]`: how often step j's top-1 draft equals the target's argmax (valid positions, no
  noise) — the chain's per-depth greedy acceptance, teacher-forced."""
  fn = jax.jit(lambda p, f, h, t, v: eagle_loss(config, dataclasses.replace(loss, noise=0.0),
                                                p, shared, f, h, t, v, jax.random.key(0))[1])
  valid = _valid_rows(data)
  hits = np.zeros(loss.unroll)
  rows = 0
  for s in range(0, len(data.tokens), batch_size):
    sl = slice(s, s + batch_size)
    m = fn(params, jnp.asarray(feats[sl]), jnp.asarray(final[sl]), jnp.asarray(data.tokens[sl]),
           jnp.asarray(valid[sl]))
    n = len(data.tokens[sl])
    hits += n * np.array([float(m[f"agree{j + 1}"]) for j in range(loss.unroll)])
    rows += n
  return hits / max(rows, 1)


def train_eagle(target, target_params, config: EagleConfig, data: DistillData,
                valid: Optional[DistillData], train: Any, workdir: str,
                loss: Optional[EagleLoss] = None,
                stop_at_step: Optional[int] = None) -> Dict[str, Any]:
  """Trains an EAGLE head (module doc); returns {"params", "agreement", "final"}.

  `train`: steps, batch_size, learning_rate, warmup_steps, checkpoint_every, log_every, seed,
  keep_checkpoints and optionally mesh_data / mesh_model (> 1: the step over that mesh, as
  `train_medusa`). A rerun resumes exactly (on any mesh); other settings are a ValueError naming
  the field."""
  quiet_orbax_info_logs()
  loss = loss or EagleLoss.for_config(config)
  if config.block and loss.unroll > config.block:
    raise ValueError(f"loss.unroll ({loss.unroll}) exceeds the block head's {config.block} "
                     f"slots (EagleConfig.block)")
  mesh_data, mesh = head_mesh(train)
  atomic_io.as_path(workdir).mkdir(parents=True, exist_ok=True)
  shared = shared_weights(target, target_params)
  spec = OptimizerSpec(optimizer="adamw", learning_rate=float(train.learning_rate),
                       schedule="cosine", warmup_steps=int(train.warmup_steps),
                       total_steps=int(train.steps), weight_decay=0.0)
  meta = {"config": json.loads(json.dumps(dataclasses.asdict(config))),  # tuples as stored
          "loss": dataclasses.asdict(loss),
          "optimizer": dataclasses.asdict(spec), "batch_size": int(train.batch_size),
          "seed": int(train.seed),
          "data": {"rows": int(len(data.tokens)), "length": int(data.tokens.shape[1]),
                   "generated": int(data.generated.sum())}}
  t0 = now()
  feats, final = _states(target, target_params, config, data.tokens)
  valid_mask = _valid_rows(data)
  logging.info("target features of %d sequences: %.1fs", len(feats), now() - t0)
  init = init_eagle(config, jax.random.key(int(train.seed)))
  state = {"step": jnp.zeros((), jnp.int32), "params": init,
           "opt_state": make_optimizer(spec).init(init)}
  layout = None
  if mesh is None:
    step_fn = _train_step(config, loss, spec)
  else:  # rows over `data`; the head, its optimizer state and the shared weights fsdp
    layout = {"step": jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()),
              "params": mesh_lib.fsdp_shardings(state["params"], mesh),
              "opt_state": mesh_lib.fsdp_shardings(state["opt_state"], mesh)}
    state = jax.device_put(state, layout)
    shared = mesh_lib.shard_tree(shared, mesh)
    step_fn = mesh_lib.sharded_jit(
        _step_fn, (config, loss, spec),
        (layout, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())))
  rows = len(data.tokens)

  def batch(s):
    idx = np.random.default_rng((int(train.seed), s)).integers(0, rows, int(train.batch_size))
    rows_s = tuple(a[idx] for a in (feats, final, data.tokens, valid_mask))
    rows_s = (tuple(jnp.asarray(x) for x in rows_s) if mesh is None
              else mesh_lib.shard_rows(rows_s, mesh))
    return (shared,) + tuple(rows_s)

  describe = lambda m: "loss %.4f | top-1 agreement by step %s" % (m["loss"], " ".join(
      f"{m[f'agree{j + 1}']:.3f}" for j in range(loss.unroll)))
  state = resumable_loop(workdir, meta, state, step_fn, batch, train, head_name(config),
                         describe, layout, stop_at_step)
  agreement = final_dir = None
  if int(state["step"]) == int(train.steps):
    eval_data = valid if valid is not None else data
    ef, eh = (feats, final) if valid is None else _states(target, target_params, config,
                                                         valid.tokens)
    # Several depths even when trained on one step (EAGLE-1 drafts chains too); a block's slots.
    depths = config.block or max(loss.unroll, 3)
    agreement = step_agreement(config, dataclasses.replace(loss, unroll=depths),
                               state["params"], shared, ef, eh, eval_data)
    logging.info("%s top-1 agreement by step on %s: %s", head_name(config),
                 "validation" if valid else "training data", np.round(agreement, 3).tolist())
    final_dir = save_final_params(workdir, state["params"], config, meta,
                                  {"agreement.json": {"agreement_by_step": agreement.tolist()}})
  return {"params": state["params"], "agreement": agreement, "final": final_dir}
