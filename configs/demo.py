"""Demo: plain decoding vs prompt lookup (fixed γ and gamma="auto") on code.

Run:
  python experiments/demo.py --config=configs/demo.py          # ~3 min the first time
  python experiments/demo.py --config=configs/demo.py:tiny     # seconds, for smoke tests
  python experiments/demo.py --config=configs/demo.py --config.prompt_len=2048

A small decoder is trained here on the Python standard library's sources
(~1 min on 2 CPU cores, then reused from the workdir) and continues long
prompts from held-out packages at batch 1, greedy; the output is checked
token for token against plain decoding (`experiments.programs.demo`).
"""

import os
import runpy

import ml_collections

# configs/common.py, read by its path (see there why).
_COMMON = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "common.py"))
_decoder = _COMMON["decoder"]


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.workdir = "runs/demo"
  c.seed = 0
  c.data = ml_collections.ConfigDict()
  c.data.cache_dir = "data_cache"
  c.data.code_source = ""          # "" = the standard library; or dir:PATH
  # Packages never trained on: their concatenated files are the prompts.
  c.data.heldout = ["json", "email", "http", "logging"]
  c.data.vocab_size = 2048
  c.data.spm_sentences = 10_000
  # 10.5M with the 2048-token vocabulary: wide and shallow, so a step streams its weights
  # (42 MB, more than the L3 of a small CPU) and a verify of γ + 1 tokens costs little more
  # than a step (a 4-layer 2.7M model was compute-bound here: a 5-token verify cost 2.7x).
  c.model = _decoder(512, 2, 8, 64, 2048)
  c.train_seq_len = 256
  c.train = ml_collections.ConfigDict(dict(
      steps=100, batch_size=8, learning_rate=3e-3, warmup_steps=10, checkpoint_every=25,
      eval_every=0, eval_batches=0, log_every=20))
  c.prompt_len = 1024
  c.num_prompts = 4
  c.max_new_tokens = 128
  c.gamma = 4                     # prompt lookup's fixed γ (beside gamma="auto")
  c.lookup_max_ngram = 4
  c.repeats = 2
  # Any of: lookup (fixed gamma), lookup_auto (gamma="auto", each prompt on its own),
  # lookup_series (gamma="auto", the prompts as one series: acceptance= carried).
  c.drafters = "lookup,lookup_auto,lookup_series"
  if arg == "tiny":
    c.data.heldout = ["json"]
    c.data.vocab_size = 512
    c.data.spm_sentences = 2_000
    c.model = _decoder(32, 2, 2, 16, 64)
    c.train_seq_len = 64
    c.train.steps = 4
    c.train.batch_size = 2
    c.train.warmup_steps = 1
    c.train.checkpoint_every = 2
    c.prompt_len = 96
    c.num_prompts = 2
    c.max_new_tokens = 16
    c.repeats = 1
  elif arg:
    raise ValueError(f"unknown demo preset {arg!r}; known: '', 'tiny'")
  return c
