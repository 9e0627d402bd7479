"""Long contexts × batch: where speculative decoding pays on a CPU (issue 29).

`configs/long_context.py` describes the task, the models and the grid;
`experiments/long_context.py` runs `run(config)`: the data and the models
here, the measurements in `long_context_measure` (which also holds the
cost model and the component timings that `benchmarks/long_context_cost.py`
measures with random weights before anything is trained), the report in
`long_context_report`.
"""

from __future__ import annotations

import os
import time
from typing import Dict, Sequence

import numpy as np
from absl import logging

from experiments.data import build_task, load_task
from experiments.data.code_vocab import train_code_sentencepiece
from experiments.programs import long_context_measure
from experiments.programs.chen import decoder
from experiments.programs.common import (enable_compilation_cache, open_workdir, train_config,
                                        train_or_restore)
from experiments.programs.stages import Stages
from specjax.models.decoder import DecoderLM
from specjax.tokenizers.sentencepiece import SentencePieceTokenizer
from specjax.training import LMSource, lm_examples

__all__ = ["package_streams", "prepare", "train_models", "run"]


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


def prepare(cfg):
  """(tokenizer, training records, held-out streams as token arrays)."""
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
  return DecoderLM(decoder(mcfg, vocab_size).config.replace(matvec_max_rows=0,
                                                            prefill_chunk=prefill_chunk))


def train_models(cfg, tok, train_records, workdir: str, stages):
  """(target, params), (draft, params): the target trained on short rows then
  continued on long rows; the draft on long rows. Reused when trained."""
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
                           train_config(cfg.train.target_short),
                           os.path.join(workdir, "target_short"))
  tp = train_or_restore(target, source(cfg.train.long_len), train_config(cfg.train.target_long),
                        os.path.join(workdir, "target"), init_params=short)
  stages.note("timing/train_target", time.time() - t0)
  t0 = time.time()
  dp = train_or_restore(draft, source(cfg.train.long_len), train_config(cfg.train.draft),
                        os.path.join(workdir, "draft"))
  stages.note("timing/train_draft", time.time() - t0)
  return (target, tp), (draft, dp)


# ----------------------------------------------------------------------------- run


def run(cfg) -> dict:
  """Prepares the data, trains (or reuses) the models, measures the grid,
  writes the report; returns the results (with "_out_dir")."""
  workdir = open_workdir(cfg.workdir)
  enable_compilation_cache(os.path.join(workdir, "jax_cache"))
  stages = Stages(os.path.join(workdir, "stages"))
  tok, train_records, streams = prepare(cfg)
  (target, tp), (draft, dp) = train_models(cfg, tok, train_records, workdir, stages)
  if cfg.stop_after == "train":
    logging.info("models trained in %s; stop_after=train", workdir)
    return {"_out_dir": None}
  return long_context_measure.measure_and_report(cfg, tok, streams, target, tp, draft, dp,
                                                 workdir, stages)
