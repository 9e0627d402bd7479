"""Long contexts × batch: where speculative decoding pays on a CPU (issue 29).

`configs/long_context.py` describes the task, the models and the grid;
`experiments/long_context.py` runs `run(config)`. The cost model
(`kv_bytes_per_position`, `step_bytes`, `predicted_speedup`) and the
component timings (`component_times`) are shared with
`benchmarks/long_context_cost.py`, which measures them with random weights
before anything is trained.
"""

from __future__ import annotations

import os
import time
from typing import Dict, Sequence

import jax
import numpy as np
from absl import logging

from specjax import theory

__all__ = ["kv_bytes_per_position", "step_bytes", "predicted_speedup", "component_times",
           "package_streams", "repo_prompts", "run"]


# ----------------------------------------------------------------------------- cost model


def kv_bytes_per_position(config, dtype_bytes: int = 4) -> int:
  """Bytes of keys and values one cached position holds, all layers."""
  return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes


def step_bytes(config, batch: int, context: int, dtype_bytes: int = 4) -> int:
  """Bytes one decode step reads: the weights plus every row's KV cache."""
  return dtype_bytes * config.num_params() + batch * context * kv_bytes_per_position(
      config, dtype_bytes)


def predicted_speedup(alpha: float, gamma: int, c: float, verify_ratio: float) -> float:
  """Tokens per AR step time, speculative over autoregressive:
  E[tokens per iteration] / (γ·c + verify cost in steps), with c = a draft
  step / a target step and the measured cost of the γ+1-token verify
  (Leviathan's Theorem 3.8 takes it as 1)."""
  if verify_ratio <= 0:
    raise ValueError(f"verify_ratio must be > 0, got {verify_ratio!r}")
  return float(theory.expected_tokens_per_call(alpha, gamma)) / (gamma * c + verify_ratio)


def component_times(target, tp, draft, dp, window, batch: int, context: int, gamma: int,
                    repeats: int) -> dict:
  """In-graph seconds of a target step (T = 1), a verify (T = γ+1), a
  windowed self-draft step and a small-draft step at `context` cached
  positions per row (`specjax.bench.timing.cache_step_times`)."""
  from specjax.bench.timing import cache_step_times  # pylint: disable=g-import-not-at-top
  steps = max(4, min(32, 2 ** 19 // (context * batch)))  # ~0.5 s per timed call at most
  slots = context + gamma + 1
  tgt = cache_step_times(target, tp, batch, slots, context, (1, gamma + 1), steps=steps,
                         repeats=repeats)
  out = {"step_s": tgt[1], "verify_s": tgt[gamma + 1]}
  if window is not None:
    out["window_s"] = cache_step_times(window, tp, batch, window.slots,
                                       window.window + window.sinks, (1,), steps=steps,
                                       repeats=repeats)[1]
  if draft is not None:
    out["small_s"] = cache_step_times(draft, dp, batch, slots, context, (1,), steps=steps,
                                      repeats=repeats)[1]
  jax.clear_caches()
  return out


# ----------------------------------------------------------------------------- data


def _package(path: str) -> str:
  return path.split("/")[0] if "/" in path else ""


def package_streams(records: Sequence[dict], packages: Sequence[str]) -> Dict[str, str]:
  """{package: its files concatenated} for the named top-level packages:
  files sorted by path, each under a `# file: <path>` line."""
  out = {}
  for name in packages:
    files = sorted((r["path"], r["inputs"]) for r in records if _package(r["path"]) == name)
    if files:
      out[name] = "".join(f"# file: {p}\n{text.rstrip()}\n\n" for p, text in files)
  return out


def repo_prompts(streams_tokens: Dict[str, np.ndarray], context: int, n: int,
                 continuation: int) -> np.ndarray:
  """`n` prompts `[n, context]`: windows of the packages' token streams,
  each followed by at least `continuation` tokens of its stream, taken
  round-robin over the packages long enough, at evenly spaced end points
  within each package (deterministic)."""
  need = context + continuation
  usable = {k: v for k, v in sorted(streams_tokens.items()) if len(v) >= need}
  if not usable:
    longest = max((len(v) for v in streams_tokens.values()), default=0)
    raise ValueError(f"no held-out package has context + continuation = {need} tokens "
                     f"(the longest has {longest}); hold out larger packages or shorten "
                     "the context")
  names = list(usable)
  per = {k: (n + len(names) - 1 - i) // len(names) for i, k in enumerate(names)}
  rows = {}
  for k, m in per.items():
    toks = usable[k]
    span = len(toks) - need
    rows[k] = [toks[e - context:e] for e in
               (context + (j + 1) * span // (m + 1) for j in range(m))]
  out = []
  for j in range(max(per.values())):  # round-robin: every batch mixes packages
    out.extend(rows[k][j] for k in names if j < len(rows[k]))
  return np.stack(out[:n]).astype(np.int32)


def prepare(cfg):
  """(tokenizer, training records, held-out streams as token arrays)."""
  from specjax.data import build_task, load_task  # pylint: disable=g-import-not-at-top
  from specjax.data.code_vocab import train_code_sentencepiece
  from specjax.tokenizer import SentencePieceTokenizer
  cache = cfg.data.cache_dir
  build_task("code_python", cache, source=cfg.data.code_source or None)
  spm = train_code_sentencepiece(cache, cfg.data.vocab_size, text_tasks=(),
                                 max_sentences=cfg.data.spm_sentences, code_fraction=1.0,
                                 name=f"long_context_code{cfg.data.vocab_size}_"
                                      f"{cfg.data.spm_sentences}")
  tok = SentencePieceTokenizer(spm)
  records = [r for split in ("train", "validation", "test")
             for r in load_task("code_python", split, cache)]
  heldout = set(cfg.data.heldout)
  train = [r for r in records if _package(r["path"]) not in heldout]
  streams = package_streams(records, sorted(heldout))
  tokens = {k: np.asarray(tok.encode(v, add_eos=False), np.int32) for k, v in streams.items()}
  logging.info("held out %d packages, %d tokens; %d training files",
               len(tokens), sum(len(v) for v in tokens.values()), len(train))
  return tok, train, tokens


# ----------------------------------------------------------------------------- models


def _decoder(mcfg, vocab_size: int, prefill_chunk: int):
  """The Chen experiment's decoder from a config section, with the one-product
  path and chunked prefill."""
  from specjax.experiments.chen import decoder  # pylint: disable=g-import-not-at-top
  from specjax.models.decoder import DecoderLM
  return DecoderLM(decoder(mcfg, vocab_size).config.replace(matvec_max_rows=0,
                                                            prefill_chunk=prefill_chunk))


def train_models(cfg, tok, train_records, workdir: str, stages):
  """(target, params), (draft, params): the target trained on short rows then
  continued on long rows; the draft on long rows. Reused when trained."""
  from specjax.experiments.chen import _train_config  # pylint: disable=g-import-not-at-top
  from specjax.experiments.common import train_or_restore
  from specjax.train import LMSource, lm_examples
  examples = {}

  def source(seq_len):
    def build():
      if "ex" not in examples:
        examples["ex"] = lm_examples(train_records, tok, None, "{inputs}")
      return LMSource(examples["ex"], seq_len, packing=True)
    return build

  chunk = int(cfg.models.prefill_chunk)
  target = _decoder(cfg.models.target, tok.vocab_size, chunk)
  draft = _decoder(cfg.models.draft, tok.vocab_size, chunk)
  t0 = time.time()
  short = train_or_restore(target, source(cfg.train.short_len),
                           _train_config(cfg.train.target_short),
                           os.path.join(workdir, "target_short"))
  tp = train_or_restore(target, source(cfg.train.long_len), _train_config(cfg.train.target_long),
                        os.path.join(workdir, "target"), init_params=short)
  stages.note("timing/train_target", time.time() - t0)
  t0 = time.time()
  dp = train_or_restore(draft, source(cfg.train.long_len), _train_config(cfg.train.draft),
                        os.path.join(workdir, "draft"))
  stages.note("timing/train_draft", time.time() - t0)
  return (target, tp), (draft, dp)


# ----------------------------------------------------------------------------- run


def run(cfg) -> dict:
  """Prepares the data, trains (or reuses) the models, measures the grid,
  writes the report; returns the results (with "_out_dir")."""
  from specjax.experiments.common import enable_compilation_cache  # pylint: disable=g-import-not-at-top
  from specjax.experiments.stages import Stages
  workdir = os.path.abspath(cfg.workdir)
  os.makedirs(workdir, exist_ok=True)
  enable_compilation_cache(os.path.join(workdir, "jax_cache"))
  stages = Stages(os.path.join(workdir, "stages"))
  tok, train_records, streams = prepare(cfg)
  (target, tp), (draft, dp) = train_models(cfg, tok, train_records, workdir, stages)
  if cfg.stop_after == "train":
    logging.info("models trained in %s; stop_after=train", workdir)
    return {"_out_dir": None}
  from specjax.experiments import long_context_measure  # pylint: disable=g-import-not-at-top
  return long_context_measure.measure_and_report(cfg, tok, streams, target, tp, draft, dp,
                                                 workdir, stages)
