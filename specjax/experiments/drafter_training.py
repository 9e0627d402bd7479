"""Training learned drafters on a frozen target: Medusa-1 heads (configs/train_drafter.py).

  1. the target (a trained Chen decoder, `<target_dir>`) and its vocabulary;
  2. prompts from its own training corpora (code documents, "<description>
     Summary:" rows), the target's continuations of them (self-distillation
     data, cached under the workdir and keyed by what they depend on);
  3. the heads trained on the frozen target's hidden states
     (`specjax.training.heads`: resumable, progress with ETA);
  4. the heads' validation top-k accuracies, and the trees `choose_tree`
     builds from them at several sizes with their expected accepted length
     (`trees.json`, `report.md`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

import numpy as np
from absl import logging

from specjax import atomic_io
from specjax.drafters.medusa import MedusaConfig, choose_tree
from specjax.experiments.common import pad_batch
from specjax.experiments.stages import fingerprint
from specjax.training.heads import DistillData, distillation_data, train_medusa

__all__ = ["run", "load_target", "training_prompts", "expected_tokens_per_call"]


def load_target(target_dir: str, data_cache: str):
  """(model, params, tokenizer) of a trained Chen target."""
  from specjax.bench.peers import _find_tokenizer, _restore  # pylint: disable=protected-access
  model, params = _restore(os.path.join(target_dir, "final") if os.path.exists(
      os.path.join(target_dir, "final")) else target_dir)
  workdir = os.path.dirname(os.path.abspath(target_dir.rstrip("/").removesuffix("/final")))
  tok, _ = _find_tokenizer(data_cache, "chen", model.vocab_size, workdir)
  return model, params, tok


def training_prompts(tok, data_cache: str, split: str, n: int, prompt_len: int, seed: int = 0):
  """`n` prompts of up to `prompt_len` tokens, half code, half summaries."""
  from specjax.data import load_task  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  rows: List[List[int]] = []
  code = load_task("code_python", split, data_cache)
  summ = load_task("summarize_debian", split, data_cache)
  for i in rng.permutation(len(summ))[: n - n // 2]:
    rows.append(tok.encode(f"{summ[i]['inputs']} Summary:", add_eos=False)[-prompt_len:])
  for i in rng.permutation(len(code)):
    ids = tok.encode(code[i]["inputs"], add_eos=False)
    if len(ids) <= prompt_len:
      continue
    start = int(rng.integers(0, len(ids) - prompt_len))
    rows.append(ids[start:start + prompt_len])
    if len(rows) >= n:
      break
  return pad_batch([r for r in rows if r], prompt_len)


def expected_tokens_per_call(values: List[float]) -> float:
  """1 + the sum of the tree nodes' acceptance probabilities (τ predicted)."""
  return 1.0 + float(np.sum(values))


def _data(cfg, split: str, n: int, target, tp, tok, workdir: str) -> DistillData:
  deps = {"target": cfg.target_dir, "split": split, "n": n, "prompt_len": cfg.data.prompt_len,
          "max_new": cfg.data.max_new, "temperature": cfg.data.temperature, "seed": cfg.seed}
  path = os.path.join(workdir, f"distill_{split}.npz")
  meta_path = path + ".json"
  if os.path.exists(path) and os.path.exists(meta_path):
    try:
      with open(meta_path, encoding="utf-8") as f:
        if json.load(f).get("fingerprint") == fingerprint(deps):
          return DistillData.load(path)
    except (OSError, ValueError) as e:
      logging.warning("%s unreadable (%s): regenerating", path, e)
  prompts, lengths = training_prompts(tok, cfg.data.cache_dir, split, n, cfg.data.prompt_len,
                                      seed=cfg.seed)
  data = distillation_data(target, tp, prompts, lengths, cfg.data.max_new,
                           batch_size=cfg.data.batch_size, temperature=cfg.data.temperature,
                           seed=cfg.seed + (split == "validation"), log=logging.info)
  data.save(path)
  atomic_io.atomic_write_json(meta_path, {"fingerprint": fingerprint(deps), "deps": deps})
  return data


def run(cfg) -> Dict[str, Any]:
  """Trains the configured drafter; returns its accuracies and trees."""
  if cfg.kind != "medusa":
    raise ValueError(f"config.kind must be 'medusa' (EAGLE comes next), got {cfg.kind!r}")
  from specjax.training.loop import quiet_orbax_info_logs  # pylint: disable=g-import-not-at-top
  quiet_orbax_info_logs()
  workdir = os.path.abspath(cfg.workdir)
  os.makedirs(workdir, exist_ok=True)
  target, tp, tok = load_target(cfg.target_dir, cfg.data.cache_dir)
  if tok is None:
    raise FileNotFoundError(f"no Chen vocabulary for {cfg.target_dir} under "
                            f"{cfg.data.cache_dir}/vocab (run the Chen experiment first)")
  train_data = _data(cfg, "train", cfg.data.train_sequences, target, tp, tok, workdir)
  valid = _data(cfg, "validation", cfg.data.valid_sequences, target, tp, tok, workdir)
  config = MedusaConfig(num_heads=int(cfg.medusa.num_heads), d_model=target.config.d_model,
                        vocab_size=target.vocab_size,
                        share_lm_head=bool(cfg.medusa.share_lm_head))
  res = train_medusa(target, tp, config, train_data, valid, cfg.train, workdir)
  acc = res["accuracy"]
  out = {"config": cfg.to_dict(), "final": res["final"]}
  if acc is not None:
    trees = {}
    for size in cfg.medusa.tree_sizes:
      tree, values = choose_tree(acc, int(size))
      trees[str(size)] = {"paths": [list(p) for p in tree.paths()], "parents": list(tree.parents),
                          "depth": tree.depth,
                          "expected_tokens_per_call": expected_tokens_per_call(values)}
    chain_values = list(np.cumprod(acc[:, 0]))
    trees["chain"] = {"paths": [list(range(0)) + [0] * (d + 1) for d in range(len(acc))],
                      "expected_tokens_per_call": expected_tokens_per_call(chain_values)}
    out["topk_accuracy"] = np.asarray(acc).tolist()
    out["trees"] = trees
    dirs = [workdir] + ([os.path.abspath(cfg.results_dir)] if cfg.get("results_dir") else [])
    for d in dirs:  # the committed copy names the heads relative to the working directory
      os.makedirs(d, exist_ok=True)
      atomic_io.atomic_write_json(os.path.join(d, "trees.json"), out if d == workdir else dict(
          out, final=os.path.relpath(out["final"])))
    lines = ["# Medusa heads on the Chen target", "",
             f"{config.num_heads} heads over d_model {config.d_model}; {len(train_data.tokens)} "
             f"self-distilled sequences ({cfg.data.max_new} target tokens each); "
             f"{cfg.train.steps} steps.", "", "## Validation top-k accuracy", "",
             "| head | " + " | ".join(f"rank {r}" for r in range(min(acc.shape[1], 5))) + " |",
             "|---" * (1 + min(acc.shape[1], 5)) + "|"]
    for k, row in enumerate(acc):
      lines.append(f"| {k + 1} (token t+{k + 2}) | " + " | ".join(
          f"{x:.3f}" for x in row[:5]) + " |")
    lines += ["", "## Trees from these accuracies (expected tokens per target call)", "",
              "| tree | nodes | depth | expected τ |", "|---|---|---|---|",
              f"| chain | {len(acc) + 1} | {len(acc)} | "
              f"{trees['chain']['expected_tokens_per_call']:.2f} |"]
    for size in cfg.medusa.tree_sizes:
      t = trees[str(size)]
      lines.append(f"| tree | {size} | {t['depth']} | {t['expected_tokens_per_call']:.2f} |")
    for d in dirs:
      atomic_io.atomic_write_text(os.path.join(d, "report.md"), "\n".join(lines) + "\n")
    logging.info("\n".join(lines))
  return out
