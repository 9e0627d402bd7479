"""Chen et al. 2023 end to end on this machine (see configs/chen_chinchilla.py).

Stages, each cached under the workdir (a rerun reuses them; every stage is a
file under `<workdir>/stages/` keyed by the digests of the models it reads
and the settings, so a retrained model recomputes what depends on it):

  1. data: the Python standard library (code documents), Debian package
     descriptions → synopses (XSum-like), the 164 HumanEval prompts;
  2. a lossless code + text SentencePiece vocabulary
     (`experiments.data.code_vocab`: newlines and indentation survive);
  3. the target, a decoder-only "Chinchilla-70B analog", trained on the
     mixture of packed code documents and "…text… Summary: <synopsis>"
     examples (loss on the synopsis);
  4. the draft, a "4B analog" ~1/17 of the target's size, built for sampling
     latency (few, wide layers), trained on the same mixture and distilled
     from the target;
  5. measurements: the K sweep (K = 0 autoregressive, 1..7 speculative) at
     batch 1 for XSum-like nucleus / greedy and HumanEval nucleus sampling,
     α from exact distributions along the target's own samples, component
     times (c, verify cost), speedup vs batch size at the headline K, and the
     quality checks (`chen_quality`);
  6. report (`chen_report`): results.json, results.md in the layout of Chen's
     Table 1 with their numbers next to ours, ms_per_token_vs_K.png,
     acceptance_vs_K.png, speedup_vs_batch.png.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Dict

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

import specjax
from specjax.atomic_io import as_path
from specjax.checkpoints import params_digest
from experiments.data import build_task, debian, load_task
from experiments.data.code_vocab import train_code_sentencepiece
from experiments.programs import chen_quality, chen_report
from specjax.measure.beta import measure_beta, position_distributions
from specjax.measure.timing import count_params, prefill_seconds, step_times
from experiments.programs.common import (Stages, array_digest, check_data_host,
                                        checkpoint_fingerprint, enable_compilation_cache,
                                        fingerprint, open_workdir, pad_batch, pretrained_dir,
                                        publish_results, train_config, train_or_restore)
from specjax import theory
from specjax.checkpoints.hf_common import read_json
from specjax.checkpoints.hf_llama import decoder_config_from_hf, import_hf_decoder
from experiments.programs import placement
from experiments.programs.speed import (calibrate_drafts, cell_name, configured_auto_cells,
                                       decode_ms_per_token, gamma_room, summarize, sweep)
from specjax.models.decoder import DecoderLM
from specjax.models.sections import decoder_from_section
from specjax.tokenizers.hf import check_tokenizers_compatible, load_tokenizer
from specjax.tokenizers.sentencepiece import SentencePieceTokenizer
from specjax.training import lm_examples, LMSource, Mixture

SUMMARY_PROMPT = "{inputs} Summary:"
SUMMARY_TARGET = " {targets}"  # The vocabulary has no dummy prefix: the space is explicit.
DRAFT = "draft"

# The three (task, sampling) rows of Chen's Table 1.
SETTINGS = {
    "xsum_nucleus": dict(task="xsum", temperature=1.0, top_p=0.8, label="Nucleus"),
    "xsum_greedy": dict(task="xsum", temperature=0.0, top_p=1.0, label="Greedy"),
    "humaneval_nucleus": dict(task="humaneval", temperature=0.8, top_p=0.95, label="Nucleus"),
}
# Chen et al. 2023 (arXiv 2302.01318), Table 1 (Chinchilla 70B, 4B draft, K = 4, batch 1,
# 16 TPU-v4): ms/token AR → SpS, speed-up, quality AR / SpS (None: not reproduced here).
PAPER_TABLE1 = {
    "xsum_nucleus": dict(ar_ms=14.1, sp_ms=7.52, speedup=1.92, metric="ROUGE-2",
                         ar_quality=0.112, sp_quality=0.114),
    "xsum_greedy": dict(ar_ms=14.1, sp_ms=7.00, speedup=2.01, metric="ROUGE-2",
                        ar_quality=None, sp_quality=None),
    "humaneval_nucleus": dict(ar_ms=14.1, sp_ms=5.73, speedup=2.46, metric="pass@100",
                              ar_quality=0.451, sp_quality=0.470),
}
PAPER_K_SWEEP = {"xsum": "bottoms near K ≈ 3", "humaneval": "keeps improving to K ≈ 6–7"}


def sampling_config(setting: str) -> specjax.SamplingConfig:
  s = SETTINGS[setting]
  return specjax.SamplingConfig(temperature=s["temperature"], top_p=s["top_p"])


decoder = decoder_from_section  # a config section -> `DecoderLM`


def summarize_task(cfg) -> str:
  """The summarisation dataset: `config.data.summarize_task` when set (the
  paper preset: xsum), else the CPU presets' Debian synopses."""
  return cfg.data.get("summarize_task", "") or "summarize_debian"


def _summarize_options(cfg) -> dict:
  """The `build_task` options of the summarisation task."""
  opts = {"source": cfg.data.summarize_source or None}
  if not cfg.data.summarize_source and summarize_task(cfg) == "summarize_debian":
    opts["apt_update"] = bool(cfg.data.apt_update) and not debian.translation_en_files()
  return opts


# What to configure instead of the Debian default (DataHostError's message).
DATA_ALTERNATIVES = (
    "local files: --config.data.summarize_source=jsonl:PATH (fields document / summary; "
    "tsv:PATH and inputs / targets work too); TFDS (pip install -e \".[tfds]\", network): "
    "--config.data.summarize_task=xsum --config.data.summarize_source=tfds; or a data cache "
    "built on a Debian host, copied to --config.data.cache_dir.")


def preflight_data(cfg) -> None:
  """Before any work: `DataHostError` when the summarisation data is not cached and this
  host cannot build it (the Debian default without apt-get, or without root for apt-get
  update). The code and HumanEval tasks need no system tools."""
  check_data_host({summarize_task(cfg): _summarize_options(cfg)}, cfg.data.cache_dir,
                  DATA_ALTERNATIVES)


def prepare_tasks(cfg) -> None:
  """Builds the evaluation tasks: summarisation (XSum-like) and HumanEval."""
  cache = cfg.data.cache_dir
  build_task(summarize_task(cfg), cache, **_summarize_options(cfg))
  build_task("humaneval", cache, source=cfg.data.humaneval_source or None)


def prepare_data(cfg) -> str:
  """Builds the three tasks and the code + text vocabulary; returns the spm path."""
  cache = cfg.data.cache_dir
  build_task("code_python", cache, source=cfg.data.code_source or None)
  prepare_tasks(cfg)
  return train_code_sentencepiece(
      cache, cfg.data.vocab_size, max_sentences=cfg.data.spm_sentences,
      code_fraction=cfg.data.spm_code_fraction, text_template=SUMMARY_PROMPT + SUMMARY_TARGET,
      name=f"chen_code{cfg.data.vocab_size}_{cfg.data.spm_sentences}")


def _sources(cfg, tok, split: str) -> Dict[str, object]:
  """{"code": packed documents, "summarize": packed "text Summary: synopsis" rows}."""
  code = lm_examples(load_task("code_python", split, cfg.data.cache_dir), tok, None, "{inputs}")
  summ = lm_examples(load_task(summarize_task(cfg), split, cfg.data.cache_dir), tok,
                     SUMMARY_PROMPT, SUMMARY_TARGET)
  out = {}
  for name, ex, packing in (("code", code, True), ("summarize", summ, cfg.data.pack_summaries)):
    try:
      out[name] = LMSource(ex, cfg.data.seq_len, packing=packing)
    except ValueError as e:  # A tiny split (fixtures): no validation set for it.
      if split == "train":
        raise
      logging.warning("no %s %s source: %s", split, name, e)
  return out


def train_models(cfg, tok, workdir: str, stages: Stages):
  """(target, params), (draft, params): trained, or restored when already trained.
  The corpora are tokenized only when a model has to be trained (or rebuilt
  from its step checkpoints). With `train.parallel.parallel_slots` > 0 the
  draft is also fine-tuned as a PARD draft (mask slots,
  `specjax.training.parallel`) into `<workdir>/draft_parallel`."""
  data = {}

  def train():
    if "train" not in data:
      src = _sources(cfg, tok, "train")
      data["train"] = Mixture([(src["code"], cfg.data.code_weight),
                               (src["summarize"], 1 - cfg.data.code_weight)])
    return data["train"]

  def valid():
    if "valid" not in data:
      data["valid"] = _sources(cfg, tok, "validation") or None
    return data["valid"]
  target = decoder(cfg.models.target, tok.vocab_size)
  draft = decoder(cfg.models.draft, tok.vocab_size)
  t0 = time.time()
  tp = train_or_restore(target, train, train_config(cfg.train.target),
                        os.path.join(workdir, "target"), eval_dataset=valid)
  stages.note("timing/train_target", time.time() - t0)
  dcfg = train_config(cfg.train.draft)
  t0 = time.time()
  dp = train_or_restore(draft, train, dcfg, os.path.join(workdir, "draft"),
                        teacher=(target, tp) if dcfg.distill_weight > 0 else None,
                        eval_dataset=valid)
  stages.note("timing/train_draft", time.time() - t0)
  pcfg = cfg.train.get("parallel")
  if pcfg is not None and int(pcfg.parallel_slots) > 0:
    # PARD (`specjax.drafters.ParallelDraft`): the draft fine-tuned to fill mask
    # slots too, from its trained weights; read by the families comparison.
    pcfg = train_config(pcfg)
    t0 = time.time()
    train_or_restore(draft, train, pcfg, os.path.join(workdir, "draft_parallel"),
                     teacher=(target, tp) if pcfg.distill_weight > 0 else None,
                     eval_dataset=valid, init_params=dp)
    stages.note("timing/train_draft_parallel", time.time() - t0)
  return (target, tp), (draft, dp)


def unigram_baselines(cfg, tok) -> dict:
  """{"code": CE, "summarize": CE}: each validation set's scored tokens (whole documents; the
  synopsis and its EOS) under their own unigram frequencies (`chen_quality.unigram_entropy`,
  nats / token) — the trivial baseline of the models' validation CE."""
  records = {"code": (load_task("code_python", "validation", cfg.data.cache_dir), None, "{inputs}"),
             "summarize": (load_task(summarize_task(cfg), "validation", cfg.data.cache_dir),
                           SUMMARY_PROMPT, SUMMARY_TARGET)}
  out = {}
  for name, (recs, prompt, target) in records.items():
    out[name] = chen_quality.unigram_entropy([ex.target for ex in
                                              lm_examples(recs, tok, prompt, target)])
  return out


def task_prompts(cfg, tok, task: str):
  """(prompts [N, P], lengths [N], records, number cut) for "xsum" / "humaneval".

  Prompts longer than the bucket keep their end (the "Summary:" cue, the end of
  the docstring), as the training rows do."""
  if task == "xsum":
    records = load_task(summarize_task(cfg), "test", cfg.data.cache_dir)[:cfg.eval.xsum_prompts]
    texts = [SUMMARY_PROMPT.format(**r) for r in records]
    p_len = cfg.eval.xsum_prompt_len
  else:
    records = load_task("humaneval", "test", cfg.data.cache_dir)[:cfg.eval.humaneval_prompts]
    texts = [r["inputs"] for r in records]
    p_len = cfg.eval.humaneval_prompt_len
  seqs = [tok.encode(t, add_eos=False) for t in texts]
  cut = sum(len(s) > p_len for s in seqs)
  prompts, lengths = pad_batch([s[-p_len:] for s in seqs], p_len)
  return prompts, lengths, records, cut


@functools.partial(jax.jit, static_argnums=(0, 2, 8))
def _beta(target, tp, draft, dp, prompts, lengths, tokens, token_lengths, sampling):
  return measure_beta(target, tp, draft, dp, prompts, lengths, tokens, token_lengths, sampling)


@functools.partial(jax.jit, static_argnums=(0, 5))
def _token_probs(model, params, prompts, lengths, tokens, sampling):
  q = position_distributions(model, params, prompts, lengths, tokens, sampling)
  return jnp.take_along_axis(q, tokens[..., None], axis=-1)[..., 0]


def _chunked(fn, batch: int, *arrays):
  """Applies fn to fixed-size row chunks (the last one padded by repeating
  row 0), concatenating the outputs; one compilation for all chunks."""
  n = arrays[0].shape[0]
  outs = []
  for s in range(0, n, batch):
    idx = np.arange(s, s + batch)
    idx = np.where(idx < n, idx, 0)
    out = fn(*[jnp.asarray(a[idx]) for a in arrays])
    out = jax.tree_util.tree_map(lambda x: np.asarray(x)[: min(batch, n - s)], out)
    outs.append(out)
  return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *outs)


def _first_eos_lengths(outputs, eos_id: int) -> np.ndarray:
  """Tokens up to and including the first EOS (all, when there is none)."""
  return np.asarray([o.index(eos_id) + 1 if eos_id in o else len(o) for o in outputs], np.int32)


def exact_alpha(cfg, tok, target, draft, prompts, lengths, outputs, sampling) -> dict:
  """α = mean β along the target's own samples; for the XSum-like task also
  on the synopsis (up to its first EOS) and after it (eos is ignored)."""
  (tm, tp), (dm, dp) = target, draft
  out_NT, _ = pad_batch([o if o else [0] for o in outputs], cfg.eval.max_new_tokens)
  full = np.asarray([len(o) for o in outputs], np.int32)
  fn = lambda x, l, t, n: _beta(tm, tp, dm, dp, x, l, t, n, sampling)
  beta, mask = _chunked(fn, cfg.eval.alpha_batch, prompts, lengths, out_NT, full)
  eos_len = _first_eos_lengths(outputs, tok.eos_id)
  pos = np.arange(out_NT.shape[1])[None]
  before = mask & (pos < eos_len[:, None])
  after = mask & ~before
  mean = lambda m: float((beta * m).sum() / m.sum()) if m.sum() else None
  per_pos = [mean(mask & (pos == i)) for i in range(min(8, out_NT.shape[1]))]
  return {"alpha": mean(mask), "alpha_before_eos": mean(before), "alpha_after_eos": mean(after),
          "fraction_after_eos": float(after.sum() / max(mask.sum(), 1)),
          "alpha_by_position": per_pos}


def target_probs(cfg, target, prompts, lengths, outputs, sampling) -> np.ndarray:
  """The target's processed probability of every sampled token `[N, T]`."""
  tm, tp = target
  out_NT, _ = pad_batch([o if o else [0] for o in outputs], cfg.eval.max_new_tokens)
  fn = lambda x, l, t: _token_probs(tm, tp, x, l, t, sampling)
  return _chunked(fn, cfg.eval.alpha_batch, prompts, lengths, out_NT)


def components(target, draft, prompt_len: int, cache_len: int, ks, batch_sizes,
               head_k: int) -> dict:
  """In-graph step times (seconds): target on 1 and K+1 tokens (every K at
  batch 1, the headline K at larger batches), draft on 1 and 2 tokens; and
  the prefill of both (subtracted for the decode-only times)."""
  (tm, tp), (dm, dp) = target, draft
  out = {}
  for b in batch_sizes:
    t_counts = [1] + [k + 1 for k in ks] if b == 1 else [1, head_k + 1]
    out[str(b)] = {
        "target": {str(k): v for k, v in step_times(tm, tp, b, cache_len, prompt_len,
                                                    sorted(set(t_counts))).items()},
        DRAFT: {str(k): v for k, v in step_times(dm, dp, b, cache_len, prompt_len,
                                                 [1, 2]).items()},
        "prefill": {"target": prefill_seconds(tm, tp, b, cache_len, prompt_len),
                    DRAFT: prefill_seconds(dm, dp, b, cache_len, prompt_len)}}
  return out


def k_sweep_table(summary: dict, comp: dict, alpha: float, ks, n_prompts: int) -> list:
  """One row per K (0 = autoregressive) with timing, acceptance and predictions."""
  t1 = comp["target"]["1"]
  d1, d2 = comp[DRAFT]["1"], comp[DRAFT]["2"]
  pre_ar = comp["prefill"]["target"]
  pre_sp = pre_ar + comp["prefill"][DRAFT]
  ar = summary["ar"]
  ar_decode = decode_ms_per_token(ar["seconds"], ar["tokens"], n_prompts, pre_ar)
  rows = [{"k": 0, "ms_per_token": ar["ms_per_token"], "speedup": 1.0,
           "decode_ms_per_token": ar_decode, "decode_speedup": 1.0,
           "seconds_per_prompt": ar["seconds"] / n_prompts, "acceptance_rate": None,
           "accepted_per_iteration": 0.0, "tokens_per_iteration": 1.0}]
  for k in ks:
    if k == 0:
      continue
    c = summary[cell_name(DRAFT, k)]
    verify = comp["target"].get(str(k + 1))
    draft_iter = d2 + (k - 1) * d1
    decode = decode_ms_per_token(c["seconds"], c["tokens"], n_prompts, pre_sp)
    row = {"k": k, "ms_per_token": c["ms_per_token"], "speedup": c["speedup"],
           "decode_ms_per_token": decode, "decode_speedup": ar_decode / max(decode, 1e-9),
           "seconds_per_prompt": c["seconds"] / n_prompts,
           "acceptance_rate": c["acceptance_rate"],
           "accepted_per_iteration": c["tokens_per_iteration"] - 1.0,
           "tokens_per_iteration": c["tokens_per_iteration"],
           "accepted_hist": c["accepted_hist"], "identical_fraction": c["identical_fraction"],
           "predicted_from_alpha": float(theory.walltime_improvement(alpha, k, d1 / t1)),
           "expected_tokens_from_alpha": float(theory.expected_tokens_per_call(alpha, k))}
    if verify is not None:
      row["verify_cost"] = verify / t1
      row["predicted_from_components"] = theory.walltime_improvement_from_times(
          c["tokens_per_iteration"], t1, draft_iter + verify)
    rows.append(row)
  return rows


def auto_summary(summary: dict, gammas, cell: str = "auto") -> dict:
  """A gamma="auto" cell (`AUTO_CELLS`) beside the fixed K: its speedup, the best fixed
  K's, their ratio, and how often each γ ran."""
  a = summary[cell_name(DRAFT, cell)]
  best = max(gammas, key=lambda k: summary[cell_name(DRAFT, k)]["speedup"])
  return {"speedup": a["speedup"], "ms_per_token": a["ms_per_token"],
          "tokens_per_iteration": a["tokens_per_iteration"],
          "acceptance_rate": a["acceptance_rate"], "gamma_counts": a.get("gamma_counts", {}),
          "gamma_traces": a.get("gamma_traces", []),
          "identical_fraction": a["identical_fraction"], "best_k": int(best),
          "best_k_speedup": summary[cell_name(DRAFT, best)]["speedup"],
          "vs_best_k": a["speedup"] / summary[cell_name(DRAFT, best)]["speedup"]}


def measure(cfg, tok, target, draft, stages: Stages, fingerprints: Dict[str, str],
            place=None) -> dict:
  """Every measurement, each stage cached in `stages` and keyed by what it
  reads (`fingerprints`: {"target": digest, "draft": digest} of the trained
  params, the prompts, the settings)."""
  ks = [int(k) for k in cfg.eval.ks]
  gammas = [k for k in ks if k > 0]
  head = int(cfg.eval.headline_k)
  # Every id the checkpoint ends on (an instruct model's generation_config lists several).
  eos = None if cfg.eval.ignore_eos else (
      tok.eos_ids[0] if len(tok.eos_ids) == 1 else tok.eos_ids)
  results = {"settings": {}, "tasks": {}}
  autos = configured_auto_cells(cfg.eval)
  prompts_by_task = {}
  for task in ("xsum", "humaneval"):
    prompts, lengths, records, cut = task_prompts(cfg, tok, task)
    prompts_by_task[task] = (prompts, lengths, records)
    p_len = prompts.shape[1]
    cache_len = specjax.required_cache_len(target[0], p_len, cfg.eval.max_new_tokens, max(gammas))
    t0 = time.time()  # Keyed by shape: tasks with one prompt bucket share it.
    batch_sizes = [int(b) for b in cfg.eval.batch_sizes]
    comp = stages.run(f"components/p{p_len}_c{cache_len}", lambda: components(
        target, draft, p_len, cache_len, gammas, batch_sizes, head),
        deps={**fingerprints, "gammas": gammas, "batch_sizes": batch_sizes, "head_k": head})
    stages.note(f"timing/{task}/components", time.time() - t0)
    results["tasks"][task] = {"components": comp, "num_prompts": int(len(prompts)),
                              "prompts_cut": int(cut), "prompt_len": int(p_len)}
  gamma_costs = None
  if autos:
    # One cost table for the pair (not per setting and cell): at the largest prompt and cache
    # of the sweeps, with sampled verification since some settings sample.
    room = gamma_room(gammas + autos)
    p_max = max(prompts_by_task[t][0].shape[1] for t in prompts_by_task)
    cal_len = max(specjax.required_cache_len(m, p_max, cfg.eval.max_new_tokens, room)
                  for m in (target[0], draft[0]))
    t0 = time.time()
    results["calibration"] = calibrate_drafts(
        target[0], target[1], {DRAFT: draft}, prompt_len=p_max, cache_len=cal_len,
        sampling=specjax.SamplingConfig(temperature=max(
            float(s["temperature"]) for s in SETTINGS.values())),
        stages=stages, fingerprints=fingerprints)
    stages.note("timing/calibration", time.time() - t0)
    gamma_costs = {DRAFT: results["calibration"][DRAFT]["seconds"]}
  for name in SETTINGS:
    task = SETTINGS[name]["task"]
    prompts, lengths, records = prompts_by_task[task]
    sampling = sampling_config(name)
    t0 = time.time()
    recs = sweep(target[0], target[1], {DRAFT: draft}, prompts, lengths, gammas=gammas + autos,
                 sampling=sampling, max_new_tokens=cfg.eval.max_new_tokens, eos_id=eos,
                 stages=stages, prefix=f"{name}/k", fingerprints=fingerprints,
                 chunk=cfg.eval.chunk, seed=cfg.seed, keep_cell_tokens=[cell_name(DRAFT, head)],
                 place=place, gamma_costs=gamma_costs)
    summary = summarize(recs)
    ar_out = [o for r in recs for o in r["ar"]["outputs"]]
    sp_out = [o for r in recs for o in r["cells"][cell_name(DRAFT, head)]["outputs"]]
    n = len(ar_out)
    samples = {**fingerprints, "prompts": array_digest(prompts[:n], lengths[:n]),
               "ar_outputs": fingerprint(ar_out), "max_new_tokens": int(cfg.eval.max_new_tokens),
               "sampling": dataclasses.asdict(sampling)}
    alpha = stages.run(f"{name}/alpha", lambda: exact_alpha(
        cfg, tok, target, draft, prompts[:n], lengths[:n], ar_out, sampling), deps=samples)

    def quality():
      q = {}
      if not sampling.is_greedy:
        q_ar = target_probs(cfg, target, prompts[:n], lengths[:n], ar_out, sampling)
        q_sp = target_probs(cfg, target, prompts[:n], lengths[:n], sp_out, sampling)
        q["target_logprob"] = chen_quality.logprob_comparison(
            q_ar, q_sp, [len(o) for o in ar_out], [len(o) for o in sp_out])
      q.update(chen_quality.compare_samples(task, tok, records[:n], ar_out, sp_out, cfg.eval))
      return q
    quality_settings = {k: cfg.eval[k] for k in ("bootstrap", "humaneval_harness",
                                                  "harness_min_parse", "harness_timeout_s")}
    qual = stages.run(f"{name}/quality", quality,
                      deps=dict(samples, sp_outputs=fingerprint(sp_out), **quality_settings))
    stages.note(f"timing/{name}", time.time() - t0)
    comp = results["tasks"][task]["components"]["1"]
    results["settings"][name] = {
        **SETTINGS[name], "cells": summary, "alpha": alpha, "quality": qual,
        "k_sweep": k_sweep_table(summary, comp, alpha["alpha"], ks, n),
        "compile_s": stages.get(f"{name}/k/compile_s")}
    for cell in autos:
      results["settings"][name][cell] = auto_summary(summary, gammas, cell)
    jax.clear_caches()  # Free the finished executables (see leviathan.measure).
  comps = {t: r["components"] for t, r in results["tasks"].items()}
  results["batch"] = measure_batch(cfg, target, draft, prompts_by_task, comps, stages, eos, head,
                                   fingerprints, place)
  return results


def measure_batch(cfg, target, draft, prompts_by_task, comps, stages, eos, k: int,
                  fingerprints: Dict[str, str], place=None) -> dict:
  """Speedup at the headline K for each batch size, same prompts for all;
  `comps`: {task: components by batch size} (for the prefill times)."""
  out = {}
  for name in cfg.eval.batch_settings:
    prompts, lengths, _ = prompts_by_task[SETTINGS[name]["task"]]
    n = min(int(cfg.eval.batch_prompts), len(prompts))
    t0 = time.time()
    res = {}
    for b in cfg.eval.batch_sizes:
      if n < b:
        continue
      recs = sweep(target[0], target[1], {DRAFT: draft}, prompts[:n], lengths[:n], gammas=[k],
                   sampling=sampling_config(name), max_new_tokens=cfg.eval.max_new_tokens,
                   eos_id=eos, stages=stages, prefix=f"{name}/batch{b}",
                   fingerprints=fingerprints, batch_size=int(b),
                   chunk=max(int(cfg.eval.chunk), int(b)), seed=cfg.seed, keep_ar_tokens=False,
                   cache_gamma=gamma_room([int(x) for x in cfg.eval.ks]
                                          + configured_auto_cells(cfg.eval)),
                   place=place)
      s = summarize(recs)
      c = s[cell_name(DRAFT, k)]
      pre = comps[SETTINGS[name]["task"]].get(str(b), {}).get("prefill")
      calls = n // int(b)
      decode = {}
      if pre:
        ar_d = decode_ms_per_token(s["ar"]["seconds"], s["ar"]["tokens"], calls, pre["target"])
        sp_d = decode_ms_per_token(c["seconds"], c["tokens"], calls, pre["target"] + pre[DRAFT])
        decode = {"ar_decode_ms_per_token": ar_d, "sp_decode_ms_per_token": sp_d,
                  "decode_speedup": ar_d / max(sp_d, 1e-9)}
      res[str(b)] = {**decode, "ar_ms_per_token": s["ar"]["ms_per_token"],
                     "sp_ms_per_token": c["ms_per_token"],
                     "speedup": c["speedup"], "acceptance_rate": c["acceptance_rate"],
                     "tokens_per_iteration": c["tokens_per_iteration"], "num_prompts": n}
    stages.note(f"timing/{name}/batch", time.time() - t0)
    out[name] = res
  return out


def model_info(cfg, target, draft, workdir: str) -> dict:
  """Sizes, shapes and training summaries of both models."""
  import json
  info = {}
  for name, (model, params) in (("target", target), (DRAFT, draft)):
    c = model.config
    entry = {"params": count_params(params), "num_layers": c.num_layers, "d_model": c.d_model,
             "num_heads": c.num_heads, "head_dim": c.head_dim, "mlp_dim": c.mlp_dim,
             "tie_embeddings": c.tie_embeddings,
             "non_embedding_params": count_params(params) - c.vocab_size * c.d_model
             * (1 if c.tie_embeddings else 2)}
    path = as_path(workdir) / name / "summary.json"
    if path.exists():
      s = json.loads(path.read_text())
      tcfg = cfg.train.target if name == "target" else cfg.train.draft
      evals = {}  # The last validation CE per eval set.
      metrics = as_path(workdir) / name / "metrics.jsonl"
      if metrics.exists():
        with metrics.open() as f:
          for line in f:
            rec = json.loads(line)
            if "eval" in rec:
              evals[rec["eval"]] = rec["eval_ce"]
      entry["train"] = {"steps": s.get("step"), "positions": int(s.get("step") or 0)
                        * int(tcfg.batch_size) * int(cfg.data.seq_len),
                        "last_train_ce": (s.get("last_train") or {}).get("train_ce"),
                        "eval_ce": evals, "wall_s": s.get("wall_s_this_run")}
    info[name] = entry
  info["ratio"] = info["target"]["params"] / info[DRAFT]["params"]
  info["distill_weight"] = float(cfg.train.draft.distill_weight)
  return info


def check_config(cfg) -> None:
  """Settings that cannot work together are a ValueError before anything runs.
  (A changed setting needs no check: every stored stage is keyed by what it
  depends on, and the stages it touches are recomputed.)"""
  if int(cfg.eval.headline_k) not in [int(k) for k in cfg.eval.ks if int(k) > 0]:
    raise ValueError(f"config.eval.headline_k ({cfg.eval.headline_k}) must be one of the "
                     f"speculative K in config.eval.ks ({list(cfg.eval.ks)})")


def load_pretrained_configs(cfg):
  """(tokenizer, target DecoderLM, draft DecoderLM, {name: dir}) of a pair of
  local transformers-format checkpoints (`config.models.source = 'hf'`):
  the target's tokenizer (tokenizer.json or a SentencePiece model, from
  `models.tokenizer_dir` or the target's directory), checked against the
  draft's when the draft ships one."""
  dirs = {"target": pretrained_dir(cfg, "target_dir"), DRAFT: pretrained_dir(cfg, "draft_dir")}
  tok_dir = cfg.models.get("tokenizer_dir", "") or dirs["target"]
  tok = load_tokenizer(tok_dir, require_t5_ids=False)
  draft_tok = [f for f in ("tokenizer.json", "tokenizer.model", "spiece.model")
               if os.path.exists(os.path.join(dirs[DRAFT], f))]
  if draft_tok:
    check_tokenizers_compatible(load_tokenizer(dirs[DRAFT], require_t5_ids=False), tok)
  else:
    logging.warning("%s ships no tokenizer: the draft is assumed to share the target's",
                    dirs[DRAFT])
  models = {}
  for name, directory in dirs.items():
    config = decoder_config_from_hf(read_json(os.path.join(directory, "config.json")),
                                    dtype=cfg.dtype, param_dtype=cfg.dtype)
    models[name] = DecoderLM(config)
  if models["target"].vocab_size < tok.vocab_size:
    raise ValueError(f"the target's vocabulary ({models['target'].vocab_size}) is smaller than "
                     f"its tokenizer's ({tok.vocab_size}): wrong tokenizer_dir?")
  return tok, models["target"], models[DRAFT], dirs


def run(cfg) -> dict:
  """Runs every stage (reusing finished ones) and writes the report.

  `config.models.source`: "train" (the CPU presets: build the data and the
  vocabulary, train both models) or "hf" (the paper preset: a local pair of
  transformers-format checkpoints, streamed onto the mesh in
  `config.dtype`)."""
  check_config(cfg)
  preflight_data(cfg)  # the data this host cannot build stops the run before anything starts
  workdir = open_workdir(cfg.workdir)
  enable_compilation_cache(os.path.join(workdir, "jax_cache"))
  stages = Stages(os.path.join(workdir, "stages"))
  source = cfg.models.get("source", "train")
  if source not in ("train", "hf"):
    raise ValueError(f"config.models.source must be 'train' or 'hf', got {source!r}")
  t0 = time.time()
  if source == "hf":
    if cfg.eval.packed_layout:
      raise ValueError("config.eval.packed_layout needs host params; it is for the CPU presets")
    prepare_tasks(cfg)
    tok, target_lm, draft_lm, dirs = load_pretrained_configs(cfg)
    vocab = {"path": os.path.abspath(cfg.models.get("tokenizer_dir", "") or dirs["target"]),
             "size": tok.vocab_size}
  else:
    spm_path = prepare_data(cfg)
    tok = SentencePieceTokenizer(spm_path)
    target_lm, draft_lm = (decoder(cfg.models.target, tok.vocab_size),
                           decoder(cfg.models.draft, tok.vocab_size))
    vocab = {"path": spm_path, "size": tok.vocab_size}
  stages.note("timing/data_and_vocab", time.time() - t0)
  ks = [int(k) for k in cfg.eval.ks]
  p_max = max(int(cfg.eval.xsum_prompt_len), int(cfg.eval.humaneval_prompt_len))
  cache_len = specjax.required_cache_len(target_lm, p_max, int(cfg.eval.max_new_tokens), max(ks))
  mesh = placement.experiment_mesh(cfg, target_lm.config, draft_lm.config,
                                   batch_size=max(int(b) for b in cfg.eval.batch_sizes),
                                   cache_len=cache_len)
  on_mesh = mesh.devices.size > 1
  draft_sharded = bool(cfg.models.get("draft_sharded", False))
  if source == "hf":
    t0 = time.time()
    tp, _ = import_hf_decoder(dirs["target"], target_lm.config, mesh=mesh)
    dp, _ = import_hf_decoder(dirs[DRAFT], draft_lm.config, mesh=mesh if draft_sharded else None)
    stages.note("timing/load_checkpoints", time.time() - t0)
    target, draft = placement.place_models(mesh, (target_lm, tp), (draft_lm, dp), draft_sharded)
    fingerprints = {name: checkpoint_fingerprint(d) + f"|{cfg.dtype}" for name, d in dirs.items()}
  else:
    target, draft = train_models(cfg, tok, workdir, stages)
    # What the measurements read: the weights, and the layout they are decoded from.
    layout = "|packed" if cfg.eval.packed_layout else ""
    fingerprints = {"target": params_digest(target[1]) + layout,
                    DRAFT: params_digest(draft[1]) + layout}
    if cfg.eval.packed_layout:  # The same weights, in DecoderLM.pack_params's decode layout.
      target, draft = ((m, m.pack_params(p)) for m, p in (target, draft))
    if on_mesh:
      target, draft = placement.place_models(mesh, target, draft, draft_sharded)
  fingerprints = placement.mesh_fingerprints(fingerprints, mesh)
  place = placement.batch_placer(mesh)
  if cfg.get("profile_steps", 0):
    x, l, _, _ = task_prompts(cfg, tok, "humaneval")
    placement.profile_decode(cfg, workdir, target, draft, jnp.asarray(x), jnp.asarray(l),
                             int(cfg.eval.headline_k), place)
  results = measure(cfg, tok, target, draft, stages, fingerprints, place=place)
  results["models"] = model_info(cfg, target, draft, workdir)
  if source == "train":  # The trivial baseline of the models' validation CE.
    results["baselines"] = {"unigram_ce": stages.run("unigram_baselines", lambda: unigram_baselines(
        cfg, tok), deps={"vocab": vocab, "task": summarize_task(cfg),
                         "sources": [cfg.data.code_source, cfg.data.summarize_source]})}
  results["vocab"] = vocab
  results["mesh"] = {"data": int(mesh.devices.shape[0]), "model": int(mesh.devices.shape[1]),
                     "dtype": cfg.get("dtype", "float32") if source == "hf" else "float32",
                     "source": source}
  results["timings"] = stages.values("timing")
  results["stages"] = stages.summary()
  logging.info("stages: %d computed, %d reused%s", results["stages"]["computed"],
               results["stages"]["reused"],
               "".join(f"\n  recomputed {k}: {v}" for k, v in stages.recomputed.items()))
  head = cell_name(DRAFT, int(cfg.eval.headline_k))
  return publish_results(
      results, cfg, workdir,
      lambda: {f"{name}/{key}": r["cells"][head][key] for name, r in results["settings"].items()
               for key in ("speedup", "acceptance_rate", "tokens_per_iteration", "ms_per_token")},
      lambda out_dir: chen_report.write_chen(results, out_dir, PAPER_TABLE1, PAPER_K_SWEEP))
