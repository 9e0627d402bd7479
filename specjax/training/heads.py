"""Training draft heads on a frozen target, by self-distillation (Medusa-1).

  data = distillation_data(target, tp, prompts, lengths, max_new=96, ...)
  params = train_medusa(target, tp, config, data, train_config, workdir)

`distillation_data` lets the target continue its training prompts (its own samples, temperature 1
by default): the heads learn to guess what the target itself generates. The frozen target's final
hidden states over those sequences are computed once; head k is trained with cross-entropy to
predict the token k+1 positions after each generated position's predecessor.

The loop (`resumable_loop`): batch s is a pure function of (seed, s); the train state is
checkpointed with orbax every `checkpoint_every` steps, so a killed run resumes exactly; the
final heads go to `<workdir>/final` (atomic) with their validation top-k accuracies
(`accuracy.json`, read by `choose_tree`).

Sharded: `train.mesh_data` x `train.mesh_model` > 1 runs the step over that mesh as
`train_model` does (`specjax.training.mesh`); the mesh is not a stored setting, so a run may
resume on another one.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Callable, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from specjax._clock import now
from specjax import atomic_io
from specjax.api import generate
from specjax.models.medusa_head import MedusaConfig, head_logits, init_heads, target_lm_head
from specjax.sampling import SamplingConfig
from specjax.training import mesh as mesh_lib
from specjax.training.checkpoint import Checkpointer, save_final_params
from specjax.training.loop import meta_difference, quiet_orbax_info_logs
from specjax.training.optim import OptimizerSpec, make_optimizer, state_step

__all__ = ["DistillData", "distillation_data", "target_states", "train_medusa", "topk_accuracy",
           "save_heads", "resumable_loop"]


@dataclasses.dataclass
class DistillData:
  """tokens: int32 `[N, L]` (prompt, the target's continuation, pad); generated: bool `[N, L]`,
  the target's own tokens."""

  tokens: np.ndarray
  generated: np.ndarray

  def save(self, path: str) -> None:
    with atomic_io.atomic_path(path) as tmp, open(tmp, "wb") as f:
      np.savez(f, tokens=self.tokens, generated=self.generated)

  @classmethod
  def load(cls, path: str) -> "DistillData":
    with atomic_io.as_path(path).open("rb") as f, np.load(f) as z:
      return cls(tokens=z["tokens"], generated=z["generated"])


def distillation_data(target, target_params, prompts: np.ndarray, lengths: np.ndarray,
                      max_new: int, batch_size: int = 32, temperature: float = 1.0,
                      seed: int = 0, log: Optional[Callable[[str], None]] = None) -> DistillData:
  """The target's own continuations of `prompts` (right-padded `[N, P]`)."""
  n, p = prompts.shape
  rows = -(-n // batch_size) * batch_size
  idx = np.arange(rows) % n
  tokens = np.zeros((n, p + max_new), np.int32)
  generated = np.zeros((n, p + max_new), bool)
  sampling = SamplingConfig(float(temperature))
  t0 = now()
  for s in range(0, rows, batch_size):
    take = idx[s:s + batch_size]
    key = jax.random.split(jax.random.key(seed * 7919 + s), batch_size)
    out = generate(target, target_params, jnp.asarray(prompts[take]), jnp.asarray(lengths[take]),
                   max_new_tokens=max_new, sampling=sampling, key=key)
    gen, glen = np.asarray(out.tokens), np.asarray(out.lengths)
    for j, i in enumerate(take):
      if s + j >= n:
        break
      m = int(lengths[i])
      tokens[i, :m] = prompts[i, :m]
      tokens[i, m:m + glen[j]] = gen[j, :glen[j]]
      generated[i, m:m + glen[j]] = True
    if log:
      done = min(s + batch_size, n)
      rate = done / max(now() - t0, 1e-9)
      log(f"distillation data: {done}/{n} sequences ({rate:.1f}/s, ETA "
          f"{(n - done) / max(rate, 1e-9):.0f}s)")
  return DistillData(tokens=tokens, generated=generated)


def target_states(target, target_params, tokens: np.ndarray, batch_size: int = 16,
                  layers=None) -> np.ndarray:
  """The frozen target's final hidden states `[N, L, E]` (float32), or with `layers` its blocks'
  outputs concatenated `[N, L, len(layers) * E]`."""
  layers = None if layers is None else tuple(layers)
  fn = jax.jit(lambda p, x: target.forward_with_hidden(p, x, layers=layers)[1])
  out = []
  for s in range(0, len(tokens), batch_size):
    chunk = tokens[s:s + batch_size]
    pad = batch_size - len(chunk)
    x = np.concatenate([chunk, np.zeros((pad, chunk.shape[1]), chunk.dtype)]) if pad else chunk
    out.append(np.asarray(fn(target_params, jnp.asarray(x)), np.float32)[:len(chunk)])
  return np.concatenate(out)


def _head_targets(tokens_BL, generated_BL, k: int):
  """For head k (predicting k+1 ahead): the target tokens aligned with source positions
  0..L-k-2 and their mask (a generated token)."""
  return tokens_BL[:, k + 1:], generated_BL[:, k + 1:]


def _loss(config: MedusaConfig, params, shared, h_BLE, tokens_BL, generated_BL):
  k_heads = config.num_heads
  l = tokens_BL.shape[1]
  logits_BLKV = head_logits(config, params, h_BLE[:, :l - 1], shared)
  losses, metrics = [], {}
  for k in range(k_heads):
    # Head k+1 at position t predicts token t + k + 2.
    tgt_BL, mask_BL = _head_targets(tokens_BL, generated_BL, k + 1)
    lg = logits_BLKV[:, :l - k - 2, k]
    mask = mask_BL.astype(jnp.float32)
    ce = jax.nn.logsumexp(lg, -1) - jnp.take_along_axis(lg, tgt_BL[..., None], -1)[..., 0]
    denom = jnp.maximum(jnp.sum(mask), 1.0)
    losses.append(jnp.sum(ce * mask) / denom)
    metrics[f"acc{k + 1}"] = jnp.sum((jnp.argmax(lg, -1) == tgt_BL) * mask) / denom
  return sum(losses) / k_heads, metrics


def _step_fn(config: MedusaConfig, spec: OptimizerSpec):
  """`(state, shared, h, tokens, generated) -> (state, metrics)`, not jitted."""
  update = state_step(spec)
  return lambda state, shared, h, tokens, generated: update(
      state, lambda p: _loss(config, p, shared, h, tokens, generated))


@functools.lru_cache(maxsize=8)
def _train_step(config: MedusaConfig, spec: OptimizerSpec):
  return jax.jit(_step_fn(config, spec), donate_argnums=0)


def _state_shardings(state: dict, mesh) -> dict:
  """Heads params and optimizer state fsdp over `model`, the step replicated."""
  return {"step": jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()),
          "params": mesh_lib.fsdp_shardings(state["params"], mesh),
          "opt_state": mesh_lib.fsdp_shardings(state["opt_state"], mesh)}


def topk_accuracy(config: MedusaConfig, params, shared, states: np.ndarray, data: DistillData,
                  ranks: int = 10, batch_size: int = 16) -> np.ndarray:
  """`[K, ranks]`: how often head k+1's rank-r token is the right one, over the generated
  positions of `data` (states: `target_states`)."""
  fn = jax.jit(lambda p, h: jax.lax.top_k(head_logits(config, p, h, shared), ranks)[1])
  k_heads = config.num_heads
  hits = np.zeros((k_heads, ranks))
  total = np.zeros((k_heads,))
  for s in range(0, len(states), batch_size):
    h, tok, gen = states[s:s + batch_size], data.tokens[s:s + batch_size], \
        data.generated[s:s + batch_size]
    top = np.asarray(fn(params, jnp.asarray(h)))            # [B, L, K, R]
    l = tok.shape[1]
    for k in range(k_heads):
      off = k + 2
      tgt, mask = tok[:, off:], gen[:, off:]
      cand = top[:, :l - off, k]
      hits[k] += ((cand == tgt[..., None]) & mask[..., None]).sum(axis=(0, 1))
      total[k] += mask.sum()
  return hits / np.maximum(total, 1)[:, None]


def save_heads(directory: str, config: MedusaConfig, params, accuracy: Optional[np.ndarray],
               meta: dict) -> str:
  """Atomically writes `<directory>/final`: params (orbax), config, meta and `accuracy.json`."""
  extra = None if accuracy is None else {
      "accuracy.json": {"topk_accuracy": np.asarray(accuracy).tolist()}}
  return save_final_params(directory, params, config, meta, extra)


def head_mesh(train: Any):
  """`(mesh_data, mesh)`: a head trainer's mesh (`train.mesh_data` x `train.mesh_model`, default
  1 x 1), the batch checked to split evenly over `data`."""
  mesh_data, mesh_model = getattr(train, "mesh_data", 1), getattr(train, "mesh_model", 1)
  mesh = mesh_lib.training_mesh(mesh_data, mesh_model, owner="train")
  if int(train.batch_size) % mesh_data:
    raise ValueError(f"train.batch_size ({train.batch_size}) must be divisible by "
                     f"train.mesh_data ({mesh_data})")
  return mesh_data, mesh


def train_medusa(target, target_params, config: MedusaConfig, data: DistillData,
                 valid: Optional[DistillData], train: Any, workdir: str,
                 stop_at_step: Optional[int] = None) -> Dict[str, Any]:
  """Trains the heads (see the module doc); returns {"params", "accuracy", "final"}.

  `train` (an attribute object): steps, batch_size, learning_rate, warmup_steps,
  checkpoint_every, log_every, seed, keep_checkpoints and optionally mesh_data / mesh_model
  (default 1). Resuming with other settings is an error naming the field."""
  quiet_orbax_info_logs()
  mesh_data, mesh = head_mesh(train)
  atomic_io.as_path(workdir).mkdir(parents=True, exist_ok=True)
  shared = target_lm_head(target, target_params) if config.share_lm_head else None
  spec = OptimizerSpec(optimizer="adamw", learning_rate=float(train.learning_rate),
                       schedule="cosine", warmup_steps=int(train.warmup_steps),
                       total_steps=int(train.steps), weight_decay=0.0)
  meta = {"config": dataclasses.asdict(config), "optimizer": dataclasses.asdict(spec),
          "batch_size": int(train.batch_size), "seed": int(train.seed),
          "data": {"rows": int(len(data.tokens)), "length": int(data.tokens.shape[1]),
                   "generated": int(data.generated.sum())}}
  layout = None
  log_t = now()
  states = target_states(target, target_params, data.tokens)
  logging.info("target states of %d sequences: %.1fs", len(states), now() - log_t)
  init = init_heads(config, target, target_params)
  state = {"step": jnp.zeros((), jnp.int32), "params": init,
           "opt_state": make_optimizer(spec).init(init)}
  if mesh is None:
    step_fn = _train_step(config, spec)
  else:
    layout = _state_shardings(state, mesh)
    state = jax.device_put(state, layout)
    if shared is not None:
      shared = mesh_lib.shard_tree(shared, mesh)
    step_fn = mesh_lib.sharded_jit(
        _step_fn, (config, spec),
        (layout, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())))
  rows = len(data.tokens)

  def batch(s):
    idx = np.random.default_rng((int(train.seed), s)).integers(0, rows, int(train.batch_size))
    rows_s = (states[idx], data.tokens[idx], data.generated[idx])
    rows_s = (tuple(jnp.asarray(x) for x in rows_s) if mesh is None
              else mesh_lib.shard_rows(rows_s, mesh))
    return (shared,) + tuple(rows_s)

  describe = lambda m: "loss %.4f | top-1 %s" % (m["loss"], " ".join(
      f"{m[f'acc{k + 1}']:.3f}" for k in range(config.num_heads)))
  state = resumable_loop(workdir, meta, state, step_fn, batch, train, "heads", describe, layout,
                         stop_at_step)
  accuracy = final = None
  if int(state["step"]) == int(train.steps):
    eval_data = valid if valid is not None else data
    eval_states = states if valid is None else target_states(target, target_params,
                                                            valid.tokens)
    accuracy = topk_accuracy(config, state["params"], shared, eval_states, eval_data)
    logging.info("heads top-1 accuracy on %s: %s", "validation" if valid else "training data",
                 np.round(accuracy[:, 0], 3).tolist())
    final = save_heads(workdir, config, state["params"], accuracy, meta)
  return {"params": state["params"], "accuracy": accuracy, "final": final}


def resumable_loop(workdir: str, meta: dict, state: dict, step_fn: Callable,
                   batch_fn: Callable[[int], tuple], train: Any, what: str,
                   describe: Callable[[Dict[str, float]], str], layout=None,
                   stop_at_step: Optional[int] = None) -> dict:
  """The training loop of a drafter trained on a frozen target: restores the newest intact
  checkpoint of `workdir` (its stored `meta` must equal `meta`, else a ValueError naming the
  field), runs `state, metrics = step_fn(state, *batch_fn(s))` for s up to `train.steps` (or
  `stop_at_step`), logs `describe(metrics)` with rate and ETA every `train.log_every` steps
  (also to `metrics.jsonl`) and checkpoints every `train.checkpoint_every` steps and at the end.
  `layout`: shardings for a restored state (a mesh run). Returns the state."""
  ckpt = Checkpointer(workdir, int(train.keep_checkpoints))

  def check(m, step):
    diff = meta_difference(m, meta)
    if diff is not None:
      raise ValueError(f"cannot resume the {what} in {workdir} from step {step}: {diff[0]} was "
                       f"{diff[1]!r}, now {diff[2]!r}; use the same settings or a new workdir")
  try:
    found = ckpt.restore_newest_intact(state, check)
    if found is not None:
      state = found[1] if layout is None else jax.device_put(found[1], layout)
      logging.info("resumed the %s at step %d in %s", what, found[0], ckpt.directory)
    start = int(state["step"])
    end = int(train.steps) if stop_at_step is None else min(int(train.steps), stop_at_step)
    t0, done0, metrics_path = now(), start, f"{workdir}/metrics.jsonl"
    for s in range(start, end):
      state, metrics = step_fn(state, *batch_fn(s))
      done = s + 1
      if done % int(train.log_every) == 0 or done == end:
        m = {k: float(v) for k, v in jax.device_get(metrics).items()}
        rate = (done - done0) / max(now() - t0, 1e-9)
        rec = {"step": done, **m, "steps_per_s": rate, "eta_s": (end - done) / max(rate, 1e-9)}
        atomic_io.append_text(metrics_path, json.dumps(rec, sort_keys=True) + "\n")
        logging.info("%s step %d/%d | %s | %.2f steps/s | ETA %.1f min", what, done, end,
                     describe(m), rate, rec["eta_s"] / 60)
      if done % int(train.checkpoint_every) == 0 or done == end:
        ckpt.save(done, state, meta)
    ckpt.wait()
    return state
  finally:
    ckpt.close()
