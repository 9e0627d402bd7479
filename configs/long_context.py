"""Long contexts × batch: where speculative decoding pays on a CPU (issue 29).

Run (from the repository root):
  python experiments/long_context.py --config=configs/long_context.py:quick \
      --config.workdir=runs/long_context_quick     # ≤ 30 min from a fresh clone (24.8 min measured;
                                                   # 5.8 before the three `auto` entries per cell)
  python experiments/long_context.py --config=configs/long_context.py:full \
      --config.workdir=runs/long_context_full --config.results_dir=results/long_context
                                                   # ≤ 3 h on 2 CPU cores, resumable
  python experiments/long_context.py --config=configs/long_context.py:micro \
      --config.workdir=/tmp/lc_micro               # seconds; the CI end-to-end test

Task: repository-level code completion. The held-out "repositories" are
standard-library packages (`data.heldout`: email, xml, http, ...), never
trained on; each package's files are concatenated (sorted, each under a
`# file: <path>` line) and a prompt is the `context` tokens before a point
of that stream, the continuation `eval.max_new_tokens` tokens. Every
other standard-library file is training data.

Models: a Chinchilla-style target of the Chen `full` shape (8 layers × 384,
6 heads × 64, 17.3M) trained here on packed code, first on 512-token rows,
then continued on 4096-token rows (a short phase: attention over 4k
positions costs ~2.4× per token) — the recipe long-context models use
(pretrain short, extend long), so the 4k phase only has to teach positions
past 512. (The Chen target itself is trained on 256-token rows of mixed
text and code; a code-only model with its own vocabulary fits this task.)
Drafts: the classic small draft (1 layer × 160, 1.0M, trained on 4096-token
rows), the windowed-KV self-draft (the target over 4 sinks + the last
`window` positions), prompt lookup.

Measured per (context, batch) and sampling setting (greedy, T = 1): AR and
each draft decoding from one shared prefill (`specjax.prefill`); α,
tokens per target call, decode walltime speedup (and end to end with the
prefill); the components (step, verify, draft step: `cache_step_times` on
the trained weights) and the speedup they predict; bytes per step. Results:
`<workdir>/results/` and --config.results_dir.
"""

import functools
import os
import runpy

import ml_collections

# configs/common.py, read by its path (see there why).
_COMMON = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "common.py"))
_decoder = _COMMON["decoder"]
_train = functools.partial(_COMMON["train"], checkpoints=6, evals=2, eval_batches=2,
                           log_every=10)


def get_config(preset: str = "quick") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.preset = preset
  c.workdir = f"runs/long_context_{preset}"
  c.results_dir = ""
  c.seed = 0
  c.stop_after = ""                  # "train": stop once the models are trained

  c.data = ml_collections.ConfigDict()
  c.data.cache_dir = "data_cache"
  c.data.code_source = ""            # "" = the standard library; or dir:PATH
  c.data.heldout = ["email", "xml", "http", "multiprocessing", "unittest", "logging",
                    "urllib", "concurrent", "json", "wsgiref", "xmlrpc", "html"]
  c.data.vocab_size = 4096
  c.data.spm_sentences = 30_000

  c.models = ml_collections.ConfigDict()
  c.models.target = _decoder(384, 8, 6, 64, 1024)                       # 17.3M
  c.models.draft = _decoder(160, 1, 4, 40, 448, tie_embeddings=True)     # 1.0M
  c.models.prefill_chunk = 512       # prefill in calls of this many positions (memory)

  c.train = ml_collections.ConfigDict()
  c.train.short_len = 512
  c.train.long_len = 4096
  c.train.target_short = _train(150, 8, 2e-3, 15)
  c.train.target_long = _train(40, 1, 5e-4, 4, log_every=5)
  c.train.draft = _train(150, 2, 3e-3, 15)

  c.eval = ml_collections.ConfigDict()
  c.eval.contexts = [512, 1024, 2048, 4096]
  c.eval.batches = [1, 4, 16, 32]
  c.eval.min_rows = 4                # rows per cell at least (batch 1: 4 prompts, one at a time)
  c.eval.max_new_tokens = 128
  c.eval.gamma = 4
  c.eval.window = 256                # the self-draft's window (+ sinks)
  c.eval.sinks = 4
  c.eval.lookup_max_ngram = 4
  c.eval.settings = ["greedy", "t1"]
  c.eval.sampled_batches = [1, 4, 16, 32]  # T = 1 at these batch sizes (greedy: every batch)
  c.eval.component_repeats = 3
  c.eval.drafts = ["lookup", "window", "small"]
  # Drafts measured again at another γ ("<draft>@<γ>", in stages of their own, e.g.
  # ["window@2"]: a verify over a long cache is compute-bound here, so its cost grows with
  # γ+1), at these contexts and settings.
  c.eval.variants = []
  c.eval.variant_contexts = [2048, 4096]
  c.eval.variant_settings = ["greedy"]
  # Drafts measured again with gamma="auto" (γ per iteration from {0, 1, 2, 4, 8}) in every
  # cell, beside their own AR run (stages of their own).
  c.eval.auto_drafts = ["lookup", "window", "small"]

  if preset == "quick":
    c.data.spm_sentences = 10_000
    c.data.vocab_size = 2048
    c.models.target = _decoder(256, 4, 4, 64, 704)                      # 4.2M
    c.models.draft = _decoder(96, 1, 2, 48, 256, tie_embeddings=True)
    c.train.long_len = 2048
    c.train.target_short = _train(60, 8, 3e-3, 6)
    c.train.target_long = _train(10, 1, 1e-3, 2, log_every=5)
    c.train.draft = _train(40, 2, 4e-3, 4)
    c.eval.contexts = [512, 2048]
    c.eval.batches = [1, 16]
    c.eval.max_new_tokens = 64
    c.eval.settings = ["greedy", "t1"]
    c.eval.sampled_batches = [1]
    c.eval.component_repeats = 2
  elif preset == "micro":
    c.data.spm_sentences = 2_000
    c.data.vocab_size = 512
    c.data.heldout = ["json"]
    c.models.target = _decoder(32, 2, 2, 16, 64)
    c.models.draft = _decoder(16, 1, 2, 8, 32, tie_embeddings=True)
    c.models.prefill_chunk = 64
    c.train.short_len = 64
    c.train.long_len = 128
    c.train.target_short = _train(4, 2, 3e-3, 1)
    c.train.target_long = _train(2, 1, 1e-3, 1)
    c.train.draft = _train(2, 1, 3e-3, 1)
    c.eval.contexts = [96]
    c.eval.batches = [2]
    c.eval.min_rows = 2
    c.eval.max_new_tokens = 8
    c.eval.gamma = 2
    c.eval.window = 16
    c.eval.sinks = 2
    c.eval.settings = ["greedy", "t1"]
    c.eval.sampled_batches = [2]
    c.eval.variants = ["window@1"]
    c.eval.auto_drafts = ["lookup"]
    c.eval.variant_contexts = [96]
    c.eval.variant_settings = ["greedy", "t1"]
    c.eval.component_repeats = 1
  elif preset != "full":
    raise ValueError(f"unknown long_context preset {preset!r}; known: quick, full, micro")
  return c
