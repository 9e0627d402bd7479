"""Suffix drafting (SuffixDecoding) against prompt lookup: agent-like code
edit sessions and summarisation, batch 1, greedy (`experiments.programs.suffix`).

Run (from the repository root):
  python experiments/suffix.py --config=configs/suffix.py \
      --config.results_dir=results/suffix   # ~3 min; code_edits reuses the demo's model
  python experiments/suffix.py --config=configs/suffix.py:smoke   # tiny random models, seconds

`summarize` needs the Chen reproduction's trained target (`chen_dir`; ~13 min):
  python experiments/chen_chinchilla.py --config=configs/chen_chinchilla.py:quick \
      --config.workdir=runs/chen_quick
"""

import os
import runpy

import ml_collections

# configs/demo.py (the code task's data, model and training), read by its path as
# configs/common.py says why.
_DEMO = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo.py"))


def get_config(preset: str = "") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.workdir = "runs/suffix"
  c.results_dir = ""                 # also write suffix.{json,md} here
  c.smoke = False
  c.seed = 0
  c.tasks = ["code_edits", "summarize"]
  c.data_cache = "data_cache"
  c.code = _DEMO["get_config"]("")  # the demo's code decoder, trained / reused in its workdir
  c.sessions = 4                     # edit sessions (one held-out file window each)
  c.turns = 5                        # requests per session (the first, then 4 edited versions)
  c.edit_max = 8                     # tokens rewritten per edit, at most
  c.prompt_len = 512
  c.max_new = 128
  c.chen_dir = "runs/chen_quick"
  c.summaries = 24
  c.summary_prompt_len = 256
  c.summary_max_new = 64
  c.lookup_gammas = [8, 16]
  c.lookup_max_ngram = 4
  c.max_match = 8                    # SuffixDraft: longest suffix matched
  c.nodes = 24                       # drafted tokens per call (the root not counted)
  c.depth = 16
  c.factor = 2.0                     # a match of p tokens drafts at most 2p deep
  c.min_prob = 0.1
  c.corpus_size = 8192               # the job corpus: the last 8192 output tokens
  if preset == "smoke":
    c.smoke = True
    c.sessions = 2
    c.turns = 2
    c.prompt_len = 96
    c.max_new = 16
    c.summaries = 3
    c.summary_max_new = 16
    c.lookup_gammas = [4]
    c.nodes = 8
    c.depth = 4
    c.corpus_size = 256
  elif preset:
    raise ValueError(f"unknown suffix preset {preset!r}; known: '', 'smoke'")
  return c
