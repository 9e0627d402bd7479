"""Leviathan et al. 2023 end to end on this machine (see configs/leviathan_t5.py).

Stages, each cached under the workdir (a rerun reuses them):

  1. data: EN→DE pairs and description → synopsis pairs (`experiments.data`);
  2. a shared SentencePiece vocabulary trained on both training splits;
  3. the target, one multi-task T5 v1.1 ("translate English to German: ...",
     "summarize: ..."), trained from scratch;
  4. three drafts (small/base/large analogs) trained on the same data,
     distilled from the target (config.train.draft.distill_weight);
  5. measurements on the test split at batch 1: α (exact β along the
     target's own outputs), the component times (c, verify cost), and the
     walltime of autoregressive vs speculative decoding for every task ×
     draft × temperature × γ; unigram/bigram α (Table 3) — each stage a
     file under `<workdir>/stages/` keyed by the digests of the models it
     reads and the settings (`experiments.programs.stages`);
  6. report: results.json, results.md (the paper's layout, its numbers next
     to ours), speedup_vs_gamma.png, alpha.png.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

import specjax
from specjax import theory
from specjax.measure.timing import now
from specjax.atomic_io import as_path, atomic_write_json
from specjax.checkpoints import params_digest
from experiments.data import build_task, debian, load_task, train_sentencepiece
from experiments.programs import report
from specjax.measure.beta import measure_beta, position_distributions
from specjax.measure.timing import count_params, prefill_seconds, step_times
from experiments.programs.common import (Stages, array_digest, check_data_host,
                                        checkpoint_fingerprint, enable_compilation_cache,
                                        open_workdir, pad_batch, pretrained_dir,
                                        publish_results, train_config, train_or_restore)
from experiments.programs.speed import (AUTO_CELLS, calibrate_drafts, cell_name, cell_speedup,
                                       configured_auto_cells, decode_ms_per_token, gamma_room,
                                       matched_speedup, summarize, sweep, sweep_cache_len)
from specjax.checkpoints.hf_common import read_json
from specjax.checkpoints.hf_t5 import import_hf_t5, t5_config_from_hf
from experiments.programs import placement
from specjax.models.ngram import fit_ngram
from specjax.models.t5 import T5
from specjax.models.sections import t5_from_section
from specjax.parallel.sharding import replicate, shard_params
from specjax.tokenizers.hf import check_tokenizers_compatible, load_tokenizer
from specjax.tokenizers.sentencepiece import SentencePieceTokenizer
from specjax.training import Mixture, seq2seq_examples, Seq2SeqSource

TASKS = {
    "translate": dict(data="translate_en_de", prefix="translate English to German: ",
                      paper="EN-DE"),
    "summarize": dict(data="summarize_debian", prefix="summarize: ", paper="CNN/DM"),
}


def task_data(cfg, task: str) -> str:
  """The dataset a task reads: `config.data.<task>_task` when set (the paper
  preset: wmt14_translate/de-en, cnn_dailymail), else the CPU presets' own."""
  return cfg.data.get(f"{task}_task", "") or TASKS[task]["data"]


# Leviathan et al. 2023, Table 2 (T5-XXL target, TPU-v4, batch 1): (γ, α, speedup).
PAPER_TABLE2 = {
    ("EN-DE", "small", 0): (7, 0.75, 3.4), ("EN-DE", "base", 0): (7, 0.80, 2.8),
    ("EN-DE", "large", 0): (7, 0.82, 1.7), ("EN-DE", "small", 1): (7, 0.62, 2.6),
    ("EN-DE", "base", 1): (5, 0.68, 2.4), ("EN-DE", "large", 1): (3, 0.71, 1.4),
    ("CNN/DM", "small", 0): (5, 0.65, 3.1), ("CNN/DM", "base", 0): (5, 0.73, 3.0),
    ("CNN/DM", "large", 0): (3, 0.74, 2.2), ("CNN/DM", "small", 1): (5, 0.53, 2.3),
    ("CNN/DM", "base", 1): (3, 0.55, 2.2), ("CNN/DM", "large", 1): (3, 0.56, 1.7),
}
# Table 3: T5-XXL EN-DE, unigram / bigram drafts (temperature 0).
PAPER_TABLE3 = {"unigram": 0.08, "bigram": 0.20}


def task_options(cfg) -> Dict[str, dict]:
  """{dataset: `build_task` options} of both tasks (translation, summarisation)."""
  sources = {"translate": cfg.data.translate_source, "summarize": cfg.data.summarize_source}
  out = {}
  for name in TASKS:
    opts = dict(source=sources[name] or None)
    data = task_data(cfg, name)
    if data == "translate_en_de" and not sources[name]:
      opts["max_packages"] = cfg.data.max_packages
      if cfg.data.get("translate_sentences_only", False):   # full sentences, not UI strings
        opts.update(sentences_only=True,
                    min_target_words=int(cfg.data.get("translate_min_target_words", 0)) or None)
    if data in ("summarize_debian", "summarize_debian_lead") and not sources[name]:
      opts["apt_update"] = bool(cfg.data.apt_update) and not debian.translation_en_files()
    out[data] = opts
  return out


# What to configure instead of the Debian default (DataHostError's message).
DATA_ALTERNATIVES = (
    "local files: --config.data.translate_source=jsonl:PATH (fields en / de) and "
    "--config.data.summarize_source=jsonl:PATH (fields document / summary; tsv:PATH and "
    "inputs / targets work too); TFDS (pip install -e \".[tfds]\", network): "
    "--config.data.translate_task=wmt14_translate/de-en --config.data.translate_source=tfds "
    "--config.data.summarize_task=cnn_dailymail --config.data.summarize_source=tfds; or a "
    "data cache built on a Debian host, copied to --config.data.cache_dir.")


def preflight_data(cfg) -> None:
  """Before any work: `DataHostError` when the configured data is not cached and this host
  cannot build it (the Debian default without apt-get, or without root for apt-get update)."""
  check_data_host(task_options(cfg), cfg.data.cache_dir, DATA_ALTERNATIVES)


def prepare_tasks(cfg) -> None:
  """Builds both tasks (translation, summarisation)."""
  for data, opts in task_options(cfg).items():
    res = build_task(data, cfg.data.cache_dir, **opts)
    logging.info("task %s: %s", data, res.meta.get("counts", res.meta))


def prepare_data(cfg) -> str:
  """Builds both tasks and the shared vocabulary; returns the spm path."""
  prepare_tasks(cfg)
  cache = cfg.data.cache_dir
  return train_sentencepiece([task_data(cfg, t) for t in TASKS], cache,
                             vocab_size=cfg.data.vocab_size,
                             max_sentences=cfg.data.spm_sentences,
                             name=f"leviathan_{cfg.data.vocab_size}")


def _sources(cfg, tok, split: str):
  out = []
  for name, spec in TASKS.items():
    records = load_task(task_data(cfg, name), split, cfg.data.cache_dir)
    ex = seq2seq_examples(records, tok, input_template=spec["prefix"] + "{inputs}")
    out.append((Seq2SeqSource(ex, cfg.data.input_len, cfg.data.target_len), 1.0))
  return out


def train_models(cfg, tok, workdir: str):
  """The target and the drafts (trained, or restored when already trained)."""
  train = Mixture(_sources(cfg, tok, "train"))
  valid = {name: src for name, (src, _) in zip(TASKS, _sources(cfg, tok, "validation"))}
  target = t5_from_section(cfg.models.target, tok.vocab_size)
  tp = train_or_restore(target, train, train_config(cfg.train.target),
                        os.path.join(workdir, "target"), eval_dataset=valid)
  drafts = {}
  for name in cfg.eval.drafts:
    model = t5_from_section(cfg.models.drafts[name], tok.vocab_size)
    dcfg = train_config(cfg.train.draft)
    teacher = (target, tp) if dcfg.distill_weight > 0 else None
    dp = train_or_restore(model, train, dcfg, os.path.join(workdir, f"draft_{name}"),
                          teacher=teacher, eval_dataset=valid)
    drafts[name] = (model, dp)
  return target, tp, drafts


def test_prompts(cfg, tok, task: str, prompt_len: int):
  """The first `num_prompts` test examples, encoded (EOS kept on truncation)."""
  records = load_task(task_data(cfg, task), "test", cfg.data.cache_dir)[: cfg.eval.num_prompts]
  seqs = []
  for r in records:
    ids = tok.encode(TASKS[task]["prefix"] + r["inputs"])
    if len(ids) > prompt_len:
      ids = ids[: prompt_len - 1] + [tok.eos_id]
    seqs.append(ids)
  prompts, lengths = pad_batch(seqs, prompt_len)
  return prompts, lengths, records


def _ngram_alpha(tables, target, tp, prompts, lengths, outputs_NT, out_lens, sampling):
  q = position_distributions(target, tp, jnp.asarray(prompts), jnp.asarray(lengths),
                             jnp.asarray(outputs_NT), sampling)
  prev = np.concatenate([np.zeros((len(outputs_NT), 1), np.int32), outputs_NT[:, :-1]], axis=1)
  mask = np.arange(outputs_NT.shape[1])[None] < out_lens[:, None]
  res = {}
  for name, logits in tables.items():
    table = jnp.asarray(logits)
    lg = table[jnp.asarray(prev)] if table.ndim == 2 else jnp.broadcast_to(table, q.shape)
    p = specjax.sampling.process_logits(lg, sampling)
    beta = np.asarray(jnp.sum(jnp.minimum(p, q), -1))
    res[name] = float((beta * mask).sum() / mask.sum())
  return res


def sweep_gammas(cfg) -> list:
  """The γ cells of the sweep: `eval.gammas`, and when `eval.auto` is set the `AUTO_CELLS`
  named by `eval.auto_cells` (default both: `gamma="auto"` per call, and the prompts as one
  series)."""
  return list(cfg.eval.gammas) + configured_auto_cells(cfg.eval)


class TimeSplit:
  """Where a run's time goes: seconds per stage on `specjax._clock.now` (summed over the
  stage's visits) and whether the stage was computed, reused from an earlier run, or both.

  `stage(name)` times a block; with `stages` (a `Stages`) the block's status is read from
  the stage files it computed and reused, else set with `mark`."""

  def __init__(self, stages: Optional[Stages] = None):
    self.seconds: Dict[str, float] = {}
    self.status: Dict[str, str] = {}
    self._stages = stages
    self._counts: Dict[str, List[int]] = {}

  @contextlib.contextmanager
  def stage(self, name: str):
    st = self._stages
    c0, r0 = (len(st.computed), len(st.reused)) if st is not None else (0, 0)
    t0 = now()
    try:
      yield
    finally:
      self.seconds[name] = self.seconds.get(name, 0.0) + now() - t0
      if st is not None:
        # A stage this run computed and then read again (two tasks of the same shapes) is
        # no reuse from an earlier run.
        earlier = set(st.computed)
        counts = self._counts.setdefault(name, [0, 0])
        counts[0] += len(st.computed) - c0
        counts[1] += sum(n not in earlier for n in st.reused[r0:])
        computed, reused = counts
        self.status[name] = ("reused" if reused and not computed else
                             f"partly reused: {reused} of {computed + reused} stages"
                             if reused else "computed")

  def mark(self, name: str, status: str) -> None:
    self.status[name] = status


def measure(cfg, tok, target, tp, drafts, stages: Stages, fingerprints: Dict[str, str],
            place=None, split: Optional[TimeSplit] = None) -> dict:
  """All measurements, each stage cached in `stages` and keyed by what it
  reads: the models' parameter digests (`fingerprints`: {"target": ...,
  <draft>: ...}), the prompts and the settings. A retrained draft
  recomputes its own stages only.

  With `gamma="auto"` cells (`eval.auto`) each draft's γ cost table is calibrated once, at
  the sweep's largest shapes (`calibrate_drafts`: results["calibration"]), and handed to
  that draft's auto cells of every task and temperature. `split` (a `TimeSplit` over
  `stages`) gets the seconds of "calibration" and of the measurement's parts:
  "components", "prefill", "alpha" (n-gram tables included) and "sweep"."""
  split = split or TimeSplit(stages)
  results = {"tasks": {}, "params": {"target": count_params(tp)}}
  for name, (_, dp) in drafts.items():
    results["params"][name] = count_params(dp)
  models = {"target": (target, tp), **drafts}
  # Unigram/bigram drafts from the decoder streams of the training targets.
  with split.stage("alpha"):
    train_streams = []
    cap = int(cfg.eval.get("ngram_max_examples", 0)) or None   # per task; 0: all
    for task in TASKS:
      for r in load_task(task_data(cfg, task), "train", cfg.data.cache_dir)[:cap]:
        train_streams.append([0] + tok.encode(r["targets"]))
    tables = {"unigram": fit_ngram(train_streams, target.vocab_size, 1)["logits"],
              "bigram": fit_ngram(train_streams, target.vocab_size, 2)["logits"]}
    tables_digest = array_digest(tables["unigram"], tables["bigram"])
  gamma_costs = None
  if set(AUTO_CELLS) & set(sweep_gammas(cfg)) and drafts:
    # One table per draft (not per task, temperature and cell): at the largest prompt and
    # cache of the sweeps, with sampled verification when any temperature samples.
    room = gamma_room(sweep_gammas(cfg))
    p_max = max(int(cfg.eval[f"{t}_prompt_len"]) for t in TASKS)
    cal_len = max(sweep_cache_len(target, [m for m, _ in drafts.values()],
                                  int(cfg.eval[f"{t}_prompt_len"]), int(cfg.eval[f"{t}_max_new"]),
                                  room) for t in TASKS)
    t_max = max(float(t) for t in cfg.eval.temperatures)
    with split.stage("calibration"):
      results["calibration"] = calibrate_drafts(
          target, tp, drafts, prompt_len=p_max, cache_len=cal_len,
          sampling=specjax.SamplingConfig(temperature=t_max), stages=stages,
          fingerprints=fingerprints)
    gamma_costs = {d: v["seconds"] for d, v in results["calibration"].items()}
  for task in TASKS:
    p_len = cfg.eval[f"{task}_prompt_len"]
    max_new = cfg.eval[f"{task}_max_new"]
    prompts, lengths, _ = test_prompts(cfg, tok, task, p_len)
    prompts_digest = array_digest(prompts, lengths)
    cache_len = specjax.required_cache_len(target, p_len, max_new, max(cfg.eval.gammas))
    # One stage per model: tasks with the same shapes share it (and its compilation).
    comp = {}
    for name, (model, mp) in models.items():
      counts = [1] + [g + 1 for g in cfg.eval.gammas] if name == "target" else [1, 2]
      with split.stage("components"):
        comp[name] = stages.run(
            f"components/p{p_len}_n{max_new}/{name}",
            lambda model=model, mp=mp, counts=counts: {
                str(k): v for k, v in step_times(model, mp, 1, cache_len, p_len, counts).items()},
            deps={"model": fingerprints[name], "cache_len": cache_len, "prompt_len": p_len,
                  "token_counts": counts})
    # The per-request prefill (encoders, cross K/V, first token), kept apart from the
    # decode step times so measured speedups can be compared decode-only.
    sweep_len = sweep_cache_len(target, [m for m, _ in drafts.values()], p_len, max_new,
                                gamma_room(sweep_gammas(cfg)))
    with split.stage("prefill"):
      prefill = {name: stages.run(f"prefill/p{p_len}_n{max_new}/{name}",
                                  lambda m=m, mp=mp: prefill_seconds(m, mp, 1, sweep_len, p_len),
                                  deps={"model": fingerprints[name], "cache_len": sweep_len,
                                        "prompt_len": p_len})
                 for name, (m, mp) in models.items()}
    task_res = {"components": comp, "prefill": prefill, "temperatures": {},
                "num_prompts": int(len(prompts))}
    for temp in cfg.eval.temperatures:
      sampling = specjax.SamplingConfig(temperature=float(temp))
      with split.stage("sweep"):
        recs = sweep(target, tp, drafts, prompts, lengths, gammas=sweep_gammas(cfg),
                     sampling=sampling,
                     max_new_tokens=max_new, eos_id=tok.eos_id, stages=stages,
                     prefix=f"{task}/t{temp:g}", fingerprints=fingerprints,
                     chunk=cfg.eval.chunk, seed=cfg.seed, place=place,
                     repeats=int(cfg.eval.get("repeats", 1)), gamma_costs=gamma_costs)
      summary = summarize(recs)
      outputs = [o for r in recs for o in r["ar"]["outputs"]]
      out_NT, out_lens = pad_batch([o if o else [0] for o in outputs], max_new)
      out_lens = np.asarray([len(o) for o in outputs], np.int32)
      along = {"target": fingerprints["target"], "prompts": prompts_digest,
               "outputs": array_digest(out_NT, out_lens), "temperature": float(temp)}

      def draft_alpha(model, dp):
        beta, mask = measure_beta(target, tp, model, dp, jnp.asarray(prompts),
                                  jnp.asarray(lengths), jnp.asarray(out_NT),
                                  jnp.asarray(out_lens), sampling)
        beta, mask = np.asarray(beta), np.asarray(mask)
        return float((beta * mask).sum() / mask.sum())
      with split.stage("alpha"):
        alpha = {name: stages.run(f"{task}/t{temp:g}/alpha/{name}",
                                  lambda model=model, dp=dp: draft_alpha(model, dp),
                                  deps=dict(along, draft=fingerprints[name]))
                 for name, (model, dp) in drafts.items()}
        alpha.update(stages.run(f"{task}/t{temp:g}/alpha/ngram", lambda: _ngram_alpha(
            tables, target, tp, prompts, lengths, out_NT, out_lens, sampling),
            deps=dict(along, tables=tables_digest)))
      task_res["temperatures"][f"{temp:g}"] = {
          "alpha": alpha, "cells": summary, "compile_s": stages.get(f"{task}/t{temp:g}/compile_s"),
          # AR's outputs: how long, and how many stopped at max_new_tokens instead of EOS.
          "ar_outputs": {"median_tokens": float(np.median(out_lens)),
                         "at_max_new": float(np.mean(out_lens >= max_new)),
                         "max_new_tokens": int(max_new)}}
      # Each (draft, γ) cell is a compiled executable, and XLA:CPU maps memory sections
      # for each: dropping the finished ones keeps a long sweep under the kernel's map
      # limit (vm.max_map_count), which a full run otherwise hits.
      jax.clear_caches()
    results["tasks"][task] = task_res
  return results


def add_predictions(results: dict, gammas: List[int], drafts: List[str]) -> dict:
  """Theory next to measurement, per (draft, γ) cell: Leviathan's formula from (α, c)
  ("predicted_from_alpha", free verification) and from (α, c, v_γ)
  ("predicted_from_alpha_verify": v_γ the measured target call on γ + 1 tokens over one
  step); from (tokens/iteration, component times) for decoding alone; and end to end from
  the component times, the measured prefills and the measured target calls, at AR's output
  lengths as `matched_speedup` measures. The best γ per (task, temperature, draft) is the
  one of the largest `cell_speedup`, the speedup every report prints."""
  for task, tr in results["tasks"].items():
    comp = tr["components"]
    t1 = comp["target"]["1"]
    pre = tr.get("prefill")
    for temp, te in tr["temperatures"].items():
      ar = te["cells"]["ar"]
      best = {}
      for d in drafts:
        c = comp[d]["1"] / t1
        alpha = te["alpha"][d]
        for g in gammas:
          cell = te["cells"][cell_name(d, g)]
          verify = comp["target"][str(g + 1)] / t1
          draft_iter = comp[d]["2"] + (g - 1) * comp[d]["1"]
          cell["c"] = c
          cell["verify_cost"] = verify
          cell["predicted_from_alpha"] = float(theory.walltime_improvement(alpha, g, c))
          # Leviathan et al. 2023 (Theorem 3.8) with the verify call's measured cost:
          # (1 − α^{γ+1}) / ((1 − α)(γc + v_γ)).
          cell["predicted_from_alpha_verify"] = float(theory.walltime_improvement_from_tokens(
              theory.expected_tokens_per_call(alpha, g), g, c, verify_cost=verify))
          cell["predicted_from_components"] = theory.walltime_improvement_from_times(
              cell["tokens_per_iteration"], t1, draft_iter + comp["target"][str(g + 1)])
          if pre:  # Each prompt's prefill was measured (one generate call per prompt).
            n = tr["num_prompts"]
            # End to end from the same components: every call pays its prefill (the
            # first token comes from it), then one step per token (AR) or one draft
            # block + verify per target call after the prefill (speculative) — its
            # decode time per token scaled to AR's tokens, as `matched_speedup` does.
            ar_pred = n * pre["target"] + (ar["tokens"] - n) * t1
            sp_decode = ((cell["target_calls"] - n) * (draft_iter + comp["target"][str(g + 1)])
                         / cell["tokens"])
            sp_pred = n * (pre["target"] + pre[d]) + ar["tokens"] * sp_decode
            cell["predicted_end_to_end"] = float(ar_pred / sp_pred)
            ar_ms = decode_ms_per_token(ar["seconds"], ar["tokens"], n, pre["target"])
            sp_ms = decode_ms_per_token(cell["seconds"], cell["tokens"], n,
                                        pre["target"] + pre[d])
            cell["decode_speedup"] = ar_ms / max(sp_ms, 1e-9)
            cell["decode_over_predicted"] = (cell["decode_speedup"]
                                             / cell["predicted_from_components"])
            cell["matched_speedup"] = matched_speedup(ar, cell, n, pre["target"] + pre[d])
          # Measured (end to end) over the prediction that counts the same work: with the
          # prefills when they were measured, else decoding alone.
          cell["measured_over_predicted"] = cell_speedup(cell) / cell.get(
              "predicted_end_to_end", cell["predicted_from_components"])
        for auto in (te["cells"].get(cell_name(d, a)) for a in AUTO_CELLS):
          if pre and auto is not None:   # its draft prefills only where it may draft
            drafts_ran = any(int(g) > 0 for g in auto.get("gamma_counts", {}))
            auto["matched_speedup"] = matched_speedup(
                ar, auto, tr["num_prompts"], pre["target"] + (pre[d] if drafts_ran else 0.0))
        g_best = max(gammas, key=lambda g: cell_speedup(te["cells"][cell_name(d, g)]))
        best[d] = {"gamma": g_best, **te["cells"][cell_name(d, g_best)], "alpha": alpha,
                   "theory_optimal_gamma": int(theory.optimal_gamma(alpha, c, max(gammas)))}
      te["best"] = best
  return results


def _data_built(cfg) -> bool:
  """Whether every task is already built with the configured options (a build reuses it)."""
  from experiments.data.tasks import is_built  # pylint: disable=g-import-not-at-top
  try:
    return all(is_built(data, cfg.data.cache_dir, **opts)
               for data, opts in task_options(cfg).items())
  except Exception:  # pylint: disable=broad-except  (unknown: reported as built, not reused)
    return False


def _listing(directory: str) -> Optional[List[str]]:
  """The entries of a trained model's directory when its final/ exists, else None."""
  path = as_path(directory)
  if not (path / "final").exists():
    return None
  return sorted(p.name for p in path.iterdir())


def _training_status(before: Dict[str, Optional[List[str]]], dirs: Dict[str, str]) -> str:
  """"reused: target, small; trained: base (41 s)": a model whose final/ existed and whose
  directory is as it was was restored; any other was trained (or resumed) in this run, its
  seconds from the training loop's summary.json when readable."""
  reused, trained = [], []
  for name, directory in dirs.items():
    if before[name] is not None and _listing(directory) == before[name]:
      reused.append(name)
      continue
    try:
      summary = json.loads((as_path(directory) / "summary.json").read_text())
      trained.append(f"{name} ({float(summary['wall_s_this_run']):.0f} s)")
    except (OSError, ValueError, KeyError, TypeError):
      trained.append(name)
  parts = ([f"reused: {', '.join(reused)}"] if reused else []) + (
      [f"trained: {', '.join(trained)}"] if trained else [])
  return "; ".join(parts) if trained else "reused"


def load_pretrained_configs(cfg):
  """(tokenizer, target T5, {draft: T5}, {name: dir}) from local
  transformers-format T5 checkpoints (`config.models.source = 'hf'`): the
  target's `spiece.model` (or `config.models.tokenizer_dir`), checked
  against every draft that ships one."""
  dirs = {"target": pretrained_dir(cfg, "target_dir")}
  for name in cfg.eval.drafts:
    dirs[name] = pretrained_dir(cfg, f"draft_dirs.{name}")
  tok = load_tokenizer(cfg.models.get("tokenizer_dir", "") or dirs["target"])
  for name, directory in dirs.items():
    if name != "target" and any(os.path.exists(os.path.join(directory, f))
                                for f in ("spiece.model", "tokenizer.json")):
      check_tokenizers_compatible(load_tokenizer(directory), tok)
  models = {name: T5(t5_config_from_hf(read_json(os.path.join(d, "config.json")),
                                       dtype=cfg.dtype, param_dtype=cfg.dtype))
            for name, d in dirs.items()}
  target = models.pop("target")
  return tok, target, models, dirs


def run(cfg) -> dict:
  """Runs every stage (reusing finished ones) and writes the report.

  `config.models.source`: "train" (the CPU presets: data, vocabulary and
  models built here) or "hf" (the paper preset: local transformers-format
  T5 checkpoints streamed onto the mesh in `config.dtype`)."""
  t_run = now()
  preflight_data(cfg)  # the data this host cannot build stops the run before anything starts
  workdir = open_workdir(cfg.workdir)  # local (absolute) or gs://bucket/...
  enable_compilation_cache(os.path.join(workdir, "jax_cache"))
  stages = Stages(os.path.join(workdir, "stages"))
  split = TimeSplit(stages)
  source = cfg.models.get("source", "train")
  if source not in ("train", "hf"):
    raise ValueError(f"config.models.source must be 'train' or 'hf', got {source!r}")
  data_reused = _data_built(cfg)
  if source == "hf":
    with split.stage("data"):
      prepare_tasks(cfg)
    split.mark("data", "reused" if data_reused else "built")
    tok, target, draft_models, dirs = load_pretrained_configs(cfg)
    draft_configs = [m.config for m in draft_models.values()]
  else:
    spm = os.path.join(cfg.data.cache_dir, "vocab", f"leviathan_{cfg.data.vocab_size}",
                       "spiece.model")
    spm_before = os.path.getmtime(spm) if os.path.exists(spm) else None
    with split.stage("data"):
      spm_path = prepare_data(cfg)
    vocab_reused = spm_before is not None and os.path.exists(spm_path) and \
        os.path.getmtime(spm_path) == spm_before
    split.mark("data", "reused" if data_reused and vocab_reused else
               f"data {'reused' if data_reused else 'built'}, vocabulary "
               f"{'reused' if vocab_reused else 'trained'}")
    tok = SentencePieceTokenizer(spm_path)
    target = t5_from_section(cfg.models.target, tok.vocab_size)
    draft_configs = [t5_from_section(cfg.models.drafts[n], tok.vocab_size).config for n in cfg.eval.drafts]
  p_max = max(int(cfg.eval[f"{t}_prompt_len"]) for t in TASKS)
  n_max = max(int(cfg.eval[f"{t}_max_new"]) for t in TASKS)
  cache_len = specjax.required_cache_len(target, p_max, n_max, gamma_room(sweep_gammas(cfg)))
  largest = max(draft_configs, key=lambda c: c.num_params()) if draft_configs else None
  mesh = placement.experiment_mesh(cfg, target.config, largest, batch_size=1,
                                   cache_len=cache_len)
  draft_sharded = bool(cfg.models.get("draft_sharded", False))
  if source == "hf":
    with split.stage("training"):
      tp, _ = import_hf_t5(dirs["target"], target.config, mesh=mesh)
      drafts = {}
      for name, model in draft_models.items():
        dp, _ = import_hf_t5(dirs[name], model.config, mesh=mesh if draft_sharded else None)
        drafts[name] = (model, dp if draft_sharded else replicate(dp, mesh))
    split.mark("training", "none: checkpoints imported")
    fingerprints = {name: checkpoint_fingerprint(d) + f"|{cfg.dtype}" for name, d in dirs.items()}
  else:
    model_dirs = {"target": os.path.join(workdir, "target"),
                  **{n: os.path.join(workdir, f"draft_{n}") for n in cfg.eval.drafts}}
    before = {n: _listing(d) for n, d in model_dirs.items()}
    with split.stage("training"):
      target, tp, drafts = train_models(cfg, tok, workdir)
    split.mark("training", _training_status(before, model_dirs))
    fingerprints = {"target": params_digest(tp),
                    **{name: params_digest(dp) for name, (_, dp) in drafts.items()}}
    if mesh.devices.size > 1:
      tp = shard_params(tp, mesh)
      drafts = {n: (m, shard_params(dp, mesh) if draft_sharded else replicate(dp, mesh))
                for n, (m, dp) in drafts.items()}
  fingerprints = placement.mesh_fingerprints(fingerprints, mesh)
  place = placement.batch_placer(mesh)
  if cfg.get("profile_steps", 0) and drafts:
    task = next(iter(TASKS))
    x, l, _ = test_prompts(cfg, tok, task, cfg.eval[f"{task}_prompt_len"])
    placement.profile_decode(cfg, workdir, (target, tp), next(iter(drafts.values())),
                             jnp.asarray(x), jnp.asarray(l), max(cfg.eval.gammas), place)
  with split.stage("measurement"):
    results = measure(cfg, tok, target, tp, drafts, stages, fingerprints, place=place,
                      split=split)
  results["stages"] = stages.summary()
  logging.info("stages: %d computed, %d reused%s", results["stages"]["computed"],
               results["stages"]["reused"],
               "".join(f"\n  recomputed {k}: {v}" for k, v in stages.recomputed.items()))
  results = add_predictions(results, list(cfg.eval.gammas), list(cfg.eval.drafts))
  results["mesh"] = {"data": int(mesh.devices.shape[0]), "model": int(mesh.devices.shape[1]),
                     "dtype": cfg.get("dtype", "float32") if source == "hf" else "float32",
                     "source": source}
  results["time_split_s"], results["time_split_status"] = _time_split(split, now() - t_run)

  def write_report(out_dir):
    # The report adds its own seconds to the split (and to the total): results.json again.
    report.write_leviathan(results, out_dir, PAPER_TABLE2, PAPER_TABLE3, TASKS)
    atomic_write_json(os.path.join(out_dir, "results.json"),
                      {k: v for k, v in results.items() if k != "_out_dir"}, indent=2)

  return publish_results(
      results, cfg, workdir,
      lambda: {f"{task}/t{temp}/{d}/{key}": (cell_speedup(best) if key == "speedup"
                                             else best[key])
               for task, te in results["tasks"].items() for temp, tr in te["temperatures"].items()
               for d, best in tr.get("best", {}).items() for key in ("speedup", "alpha", "gamma")
               if isinstance(best.get(key), (int, float))},
      write_report)


MEASUREMENT_PARTS = ("components", "prefill", "alpha", "sweep")


def _time_split(split: TimeSplit, total_s: float):
  """(results["time_split_s"], results["time_split_status"]) of a run so far: "data"
  (tasks and vocabulary), "training", "calibration", "measurement" (its parts
  "measurement/<part>" of `MEASUREMENT_PARTS`), "other" (loading, mesh, predictions) and
  "total" — `report.write_leviathan` adds "report" (and adds it to the total)."""
  sec, status = split.seconds, split.status
  out = {"data": sec.get("data", 0.0), "training": sec.get("training", 0.0),
         "calibration": sec.get("calibration", 0.0),
         "measurement": sec.get("measurement", 0.0) - sec.get("calibration", 0.0)}
  out.update({f"measurement/{p}": sec.get(p, 0.0) for p in MEASUREMENT_PARTS})
  out["other"] = max(total_s - sum(out[k] for k in ("data", "training", "calibration",
                                                     "measurement")), 0.0)
  out["total"] = total_s
  states = {k: status[k] for k in ("data", "training", "calibration", "measurement")
            if k in status}
  states.update({f"measurement/{p}": status[p] for p in MEASUREMENT_PARTS if p in status})
  return out, states
