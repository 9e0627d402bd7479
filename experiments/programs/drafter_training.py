"""Training learned drafters on a frozen target: Medusa-1 heads, EAGLE-1 and EAGLE-3
heads (configs/train_drafter.py; EAGLE-2 drafts with the EAGLE-1 head), and block
heads (DFlash-style: `EagleConfig.block` slots drafted in one call, on EAGLE-3's
fused features).

  1. the target (a trained Chen decoder, `<target_dir>`) and its vocabulary;
  2. prompts from its own training corpora (code documents, "<description>
     Summary:" rows), the target's continuations of them (self-distillation
     data, cached under the workdir and keyed by what they depend on);
  3. the heads trained on the frozen target's hidden states
     (`specjax.training.heads` / `specjax.training.eagle`: resumable,
     progress with ETA);
  4. Medusa: the heads' validation top-k accuracies, and the trees
     `choose_tree` builds from them at several sizes with their expected
     accepted length (`trees.json`, `report.md`); EAGLE: the head's
     validation top-1 agreement with the target by draft depth
     (`<kind>.json`, `<kind>.md`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

import numpy as np
from absl import logging

from specjax import atomic_io
from specjax.checkpoints.heads import final_dir
from specjax.checkpoints.orbax_io import restore_model
from experiments.data import load_task
from specjax.drafters.medusa import choose_tree
from specjax.drafters.model import check_draft_model
from experiments.programs.common import (find_tokenizer, open_workdir, pad_batch, train_config,
                                        train_or_restore)
from experiments.programs.stages import fingerprint
from specjax.models.eagle_head import EagleConfig
from specjax.models.medusa_head import MedusaConfig
from specjax.measure.provenance import provenance
from specjax.training.eagle import EagleLoss, head_name, train_eagle
from specjax.training.batching import Example, LMSource
from specjax.training.heads import DistillData, distillation_data, train_medusa
from specjax.training.loop import quiet_orbax_info_logs

__all__ = ["run", "load_target", "training_prompts", "expected_tokens_per_call"]


def load_target(target_dir: str, data_cache: str):
  """(model, params, tokenizer) of a trained Chen target."""
  final = atomic_io.as_path(target_dir) / "final"
  model, params = restore_model(str(final) if final.exists() else target_dir)
  workdir = str(atomic_io.as_path(target_dir.rstrip("/").removesuffix("/final")).parent)
  tok, _ = find_tokenizer(data_cache, "chen", model.vocab_size, workdir)
  return model, params, tok


def training_prompts(tok, data_cache: str, split: str, n: int, prompt_len: int, seed: int = 0):
  """`n` prompts of up to `prompt_len` tokens, half code, half summaries."""
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
  data_dir = open_workdir(cfg.data.get("dir") or workdir)  # drafters may share one
  path = f"{data_dir}/distill_{split}.npz"
  meta_path = atomic_io.as_path(path + ".json")
  if atomic_io.as_path(path).exists() and meta_path.exists():
    try:
      if json.loads(meta_path.read_text()).get("fingerprint") == fingerprint(deps):
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


KINDS = ("medusa", "eagle1", "eagle3", "block", "pard")


def run(cfg) -> Dict[str, Any]:
  """Trains the configured drafter; returns its accuracies (and Medusa's trees)."""
  if cfg.kind not in KINDS:
    raise ValueError(f"config.kind must be one of {KINDS}, got {cfg.kind!r}")
  quiet_orbax_info_logs()
  workdir = open_workdir(cfg.workdir)
  target, tp, tok = load_target(cfg.target_dir, cfg.data.cache_dir)
  if tok is None:
    raise FileNotFoundError(f"no Chen vocabulary for {cfg.target_dir} under "
                            f"{cfg.data.cache_dir}/vocab (run the Chen experiment first)")
  train_data = _data(cfg, "train", cfg.data.train_sequences, target, tp, tok, workdir)
  valid = _data(cfg, "validation", cfg.data.valid_sequences, target, tp, tok, workdir)
  if cfg.kind == "pard":
    return _run_pard(cfg, target, train_data, valid, workdir)
  if cfg.kind != "medusa":
    return _run_eagle(cfg, target, tp, train_data, valid, workdir)
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
    out["provenance"] = provenance()
    dirs = [workdir] + ([open_workdir(cfg.results_dir)] if cfg.get("results_dir") else [])
    for d in dirs:  # the committed copy names the heads relative to the working directory
      atomic_io.atomic_write_json(f"{d}/trees.json", out if d == workdir else dict(
          out, final=_relative(out["final"])))
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


def eagle_feature_layers(num_layers: int) -> tuple:
  """EAGLE-3's low, middle and high blocks of a target with `num_layers`
  blocks: the second, the middle one and the second from the top (fewer
  when they coincide; every block of a target with fewer than 3)."""
  if num_layers < 3:
    return tuple(range(num_layers))
  return tuple(sorted({1, num_layers // 2, num_layers - 2}))


def _run_eagle(cfg, target, tp, train_data, valid, workdir) -> Dict[str, Any]:
  tc = target.config
  e = cfg.eagle
  layers = ()
  if cfg.kind in ("eagle3", "block"):
    layers = tuple(e.feature_layers) or eagle_feature_layers(tc.num_layers)
  heads = int(e.num_heads) or tc.num_heads  # 0: the target's attention shape
  config = EagleConfig(d_model=tc.d_model, vocab_size=target.vocab_size, num_heads=heads,
                       head_dim=tc.head_dim if heads == tc.num_heads else 0,
                       mlp_dim=int(e.mlp_dim) or tc.mlp_dim, feature_layers=layers,
                       rope_theta=tc.rope_theta,
                       block=int(e.block) if cfg.kind == "block" else 0,
                       num_layers=int(e.get("layers", 1)) if cfg.kind == "block" else 1)
  version = config.version
  loss = EagleLoss.for_config(config, unroll=int(e.unroll) or None)
  res = train_eagle(target, tp, config, train_data, valid, cfg.train, workdir, loss=loss)
  out = {"config": cfg.to_dict(), "final": res["final"], "head_params": config.num_params(),
         "target_params": tc.num_params()}
  if res["agreement"] is not None:
    agree = [float(a) for a in res["agreement"]]
    out["agreement_by_step"] = agree
    # A greedy chain's expected tokens per call if depth j is accepted with
    # the teacher-forced agreement of step j (the steps taken as independent).
    out["expected_chain_tokens_per_call"] = expected_tokens_per_call(list(np.cumprod(agree)))
    name = head_name(config)
    lines = [f"# {name} head on the Chen target", "",
             f"{config.num_layers} decoder layer(s) ({config.num_params() / 1e6:.2f}M params; "
             f"the target {tc.num_params() / 1e6:.1f}M) over "
             + ("the target's final state" if version == 1 else
                f"the target blocks {list(layers)} fused")
             + f"; {len(train_data.tokens)} self-distilled sequences ({cfg.data.max_new} target "
             f"tokens each); {cfg.train.steps} steps; loss {loss}.", "",
             "## Validation top-1 agreement with the target's argmax, by draft depth", "",
             "| depth | " + " | ".join(str(j + 1) for j in range(len(agree))) + " |",
             "|---" * (1 + len(agree)) + "|",
             "| agreement | " + " | ".join(f"{a:.3f}" for a in agree) + " |", "",
             f"Expected tokens per call of a greedy chain of {len(agree)}: "
             f"{out['expected_chain_tokens_per_call']:.2f}."]
    out["provenance"] = provenance()
    dirs = [workdir] + ([open_workdir(cfg.results_dir)] if cfg.get("results_dir") else [])
    for d in dirs:
      atomic_io.atomic_write_json(f"{d}/{cfg.kind}.json", out if d == workdir
                                  else dict(out, final=_relative(out["final"])))
      atomic_io.atomic_write_text(f"{d}/{cfg.kind}.md", "\n".join(lines) + "\n")
    logging.info("\n".join(lines))
  return out


def _distill_source(data: DistillData, seq_len: int) -> LMSource:
  """Decoder rows of the self-distilled sequences: the prompt, then the
  target's continuation (the loss on the continuation)."""
  examples = []
  for row, gen in zip(data.tokens, data.generated):
    at = np.flatnonzero(gen)
    if at.size:
      examples.append(Example(row[:at[0]], row[at[0]:at[-1] + 1]))
  return LMSource(examples, seq_len=seq_len)


def _run_pard(cfg, target, train_data, valid, workdir) -> Dict[str, Any]:
  """PARD: the Chen run's draft (`pard.draft_dir`, default the target's
  sibling `draft/`) fine-tuned with `pard.slots` mask slots on the target's
  self-distilled continuations — a target-aligned variant of PARD's
  data-trained draft (the Chen experiment's `train.parallel`)."""
  draft_dir = cfg.pard.draft_dir or os.path.join(
      os.path.dirname(cfg.target_dir.rstrip("/").removesuffix("/final")), "draft")
  draft, dp = restore_model(final_dir(draft_dir))
  check_draft_model(draft, target)
  tc = train_config(cfg.train)
  tc.parallel_slots = int(cfg.pard.slots)
  tc.parallel_mask_id = int(cfg.pard.mask_id)
  tc.parallel_decay = float(cfg.pard.decay)
  tc.distill_weight = 0.0       # the data are the target's own continuations
  tc.eval_every = max(int(tc.steps) // 4, 1)
  tc.eval_batches = 4
  seq_len = int(train_data.tokens.shape[1]) - 1
  train_or_restore(draft, _distill_source(train_data, seq_len), tc, workdir,
                   eval_dataset=_distill_source(valid, seq_len), init_params=dp)
  summary = record_pard_agreement(workdir)
  out = {"config": cfg.to_dict(), "final": os.path.join(workdir, "final"),
         "draft_dir": draft_dir, "draft_params": draft.config.num_params(),
         "summary": summary, "provenance": provenance()}
  dirs = [workdir] + ([open_workdir(cfg.results_dir)] if cfg.get("results_dir") else [])
  for d in dirs:
    atomic_io.atomic_write_json(f"{d}/pard.json", out if d == workdir
                                else dict(out, final=_relative(out["final"])))
  return out


def record_pard_agreement(workdir: str) -> Dict[str, Any]:
  """Writes `<workdir>/final/agreement.json` from a PARD run's summary and
  returns the summary: the validation next-token accuracy on the target's
  greedy continuations is a first draft's greedy acceptance rate, mask slot
  j's the (j + 1)-th draft's given the right prefix — the record an EAGLE
  head's training leaves (`read_agreement`). Nothing where the run has no
  validation record."""
  summary = json.loads((atomic_io.as_path(workdir) / "summary.json").read_text())
  ev = summary.get("last_eval") or {}
  if "eval_accuracy" in ev:
    agree, j = [float(ev["eval_accuracy"])], 1
    while f"eval_slot{j}_accuracy" in ev:
      agree.append(float(ev[f"eval_slot{j}_accuracy"]))
      j += 1
    atomic_io.atomic_write_json(f"{workdir}/final/agreement.json", {"agreement_by_step": agree})
  return summary


def _relative(path: str) -> str:
  """A local path relative to the working directory (the committed copy's
  form); a URL (gs://...) as it is."""
  return os.path.relpath(path) if atomic_io.is_local(path) else path
