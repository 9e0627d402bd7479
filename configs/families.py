"""The drafter families on one trained target (issue 26): classic draft, prompt
lookup, layer skip, windowed KV, lookahead, Medusa (chain and trees), EAGLE-1
(chain and tree), EAGLE-2 (dynamic tree), EAGLE-3, suffix drafting, a block head
(DFlash-style) and PARD (the classic draft trained with mask slots) — same target,
same prompts.

Run (from the repository root), after the Chen experiment and the learned drafters:
  python experiments/chen_chinchilla.py --config=configs/chen_chinchilla.py:quick \
      --config.workdir=runs/chen_quick
  for k in medusa eagle eagle3 block; do python experiments/train_drafter.py \
      --config=configs/train_drafter.py:${k}_quick --config.target_dir=runs/chen_quick/target \
      --config.workdir=runs/${k}_quick --config.data.dir=runs/distill_chen_quick; done
  python experiments/families.py --config=configs/families.py:quick \
      --config.results_dir=results/families   # 29 min measured (before the 3 tasks shared programs)

  (`full`: the same with runs/chen_full and the *_full drafters; 55 min measured with
  --config.prompts=8 and 29 rows, the exact commands in results/families/README.md.)
  python experiments/families.py --config=configs/families.py:smoke   # tiny random models
  python experiments/families.py --config=configs/families.py:block \
      --config.results_dir=results/families/block   # block heads, EAGLE-2's sampled trees
  python experiments/families.py --config=configs/families.py:pard \
      --config.results_dir=results/families/pard    # PARD (the Chen quick run trains it)
  python experiments/families.py --config=configs/families.py:auto_heads \
      --config.results_dir=results/families/auto_heads   # EAGLE-1 / PARD: fixed γ vs auto
      # (after experiments/train_drafter.py:pard_quick into runs/pard_quick)
  python experiments/families.py --config=configs/families.py:auto_full \
      --config.results_dir=results/families/auto_full   # every auto row and its fixed γ, full
  python experiments/families.py --config=configs/families.py:sampled_full \
      --config.results_dir=results/families/sampled_full   # EAGLE-2 sampled, the full target
      # (after chen_chinchilla.py:full and train_drafter.py:eagle_full)
  for g in 1 2 4 8; do python experiments/families.py --config=configs/families.py:lookup \
      --config.lookup_gamma=$g --config.workdir=runs/families_lookup_g$g; done   # fixed γ vs auto

Measured (`experiments.programs.families`): on code, summarisation and free text, at
T = 0 and T = 1, batch 1 and 8: α, τ (tokens per target call), the target
call's cost, walltime vs AR measured in the same run, greedy equality, the
drafter's own parameters and state bytes per row; a table in Spec-Bench's
layout beside its leaderboard, and the goals (EAGLE-2's τ above the classic
draft's and Medusa's; EAGLE-3 ≥ EAGLE-2). A killed run resumes per cell.
"""

import ml_collections

_DRAFTERS = ("medusa", "eagle", "eagle3", "block", "pard")


def _on_quick(c, *drafters):
  """Measures on the Chen quick run's target with `drafters`' *_quick runs (the other
  drafters' dirs empty: their rows are left out), 8 prompts of 48 new tokens."""
  c.chen_dir = "runs/chen_quick"
  for d in _DRAFTERS:
    c[f"{d}_dir"] = f"runs/{d}_quick" if d in drafters else ""
  c.prompts = 8
  c.max_new = 48


def get_config(preset: str = "quick") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.preset = preset
  c.chen_dir = "runs/chen_full"
  c.medusa_dir = "runs/medusa_full"
  c.eagle_dir = "runs/eagle_full"
  c.eagle3_dir = "runs/eagle3_full"
  c.block_dir = "runs/block_full"        # a block head (train_drafter.py:block_*)
  c.pard_dir = "runs/pard_full"          # a PARD draft (train_drafter.py:pard_*; the Chen
                                         # run's train.parallel: <chen_dir>/draft_parallel)
  c.only = []                          # measure only these rows (names; [] = all)
  c.eagle_shapes = []                  # more EAGLE-2 rows: [top_k, depth, nodes, expand] each
  c.data_cache = "data_cache"
  c.workdir = f"runs/families_{preset}"
  c.results_dir = ""                   # also write families.{json,md} here
  c.smoke = False
  c.tasks = ["code", "summarize", "free_text"]
  c.temperatures = [0.0, 1.0]
  c.batches = [1, 8]
  c.prompts = 16
  c.prompt_len = 128
  c.max_new = 64
  c.gamma = 4
  c.lookup_gamma = 8
  c.window = 64
  c.medusa_trees = ["chain", "16", "64"]
  c.eagle_dynamic = [4, 4, 16]         # EAGLE-2 / -3: top_k, depth, nodes (root not counted)
  c.eagle_tree_nodes = 16              # EAGLE-1's static tree (root included)
  c.sampled_children = "without"       # static trees again with sampled children ("": none)
  c.auto = True                        # rows with gamma="auto" (classic draft, prompt lookup,
                                       # PARD, EAGLE-1 chain and tree)
  c.eagle_stop = 0.0                   # > 0: an EAGLE-1 chain auto row with this confidence stop
  c.auto_series = False                # each auto row again, its estimate carried call to call
  c.agreement_prior = True             # auto rows of trained heads: prior = their agreement
  c.timing_repeats = 1                 # rounds of each batch's calls, rotating; medians kept
  if preset in ("quick", "block"):
    _on_quick(c, *_DRAFTERS)
    c.medusa_trees = ["chain", "16"]
    if preset == "block":   # results/families/block: block heads and EAGLE-2's sampled trees
      c.block_dir = "runs/block2_quick"
      c.medusa_dir = c.eagle3_dir = ""
      c.auto = False
      c.eagle_shapes = [[4, 4, 16, 2], [4, 4, 16, 1], [2, 8, 16, 2]]
      c.only = ["classic draft", "EAGLE-1 chain", "EAGLE-1 tree 16 sampled", "EAGLE-2",
                "EAGLE-2 sampled", "EAGLE-2 4/4/16 expand 2", "EAGLE-2 4/4/16 expand 1",
                "EAGLE-2 2/8/16 expand 2", "block chain", "block tree 16",
                "block tree 16 sampled"]
  elif preset == "pard":   # results/families/pard: PARD against the classic draft and EAGLE-1
    _on_quick(c, "eagle")
    c.pard_dir = "runs/chen_quick/draft_parallel"
    c.auto = False
    c.only = ["classic draft", "PARD chain", "EAGLE-1 chain"]
  elif preset == "auto_heads":   # results/families/auto_heads: EAGLE-1 and PARD, fixed vs auto
    _on_quick(c, "eagle", "pard")
    c.eagle_stop = 0.3
    c.auto_series = True
    c.only = ["EAGLE-1 chain", "EAGLE-1 chain auto", "EAGLE-1 chain auto series",
              "EAGLE-1 chain auto stop series", "EAGLE-1 tree 16", "EAGLE-1 tree 16 auto series",
              "PARD chain", "PARD chain auto", "PARD chain auto series"]
  elif preset == "lookup":   # prompt lookup at one fixed γ (--config.lookup_gamma) against auto
    _on_quick(c)
    c.only = ["prompt lookup", "prompt lookup auto"]
  elif preset == "sampled_full":   # results/families/sampled_full: EAGLE-2's sampled tree, full
    c.medusa_dir = c.eagle3_dir = c.block_dir = c.pard_dir = ""
    c.auto = False
    c.batches = [1]
    c.only = ["classic draft", "EAGLE-1 chain", "EAGLE-2", "EAGLE-2 sampled"]
  elif preset == "auto_full":   # results/families/auto_full: each auto row beside its fixed γ
    c.medusa_dir = c.eagle3_dir = c.block_dir = ""
    c.prompts = 8
    c.sampled_children = ""
    c.timing_repeats = 3   # one batch of 8 at batch 8: a call timed once is ±10%
    c.only = ["classic draft", "classic draft auto", "prompt lookup", "prompt lookup auto",
              "PARD chain", "PARD chain auto", "EAGLE-1 chain", "EAGLE-1 chain auto",
              "EAGLE-1 tree 16", "EAGLE-1 tree 16 auto"]
  elif preset == "smoke":
    c.smoke = True
    c.auto = False
    c.medusa_dir = c.eagle_dir = c.eagle3_dir = c.block_dir = c.pard_dir = ""
  elif preset != "full":
    raise ValueError(f"unknown preset {preset!r}; known: quick, full, block, pard, auto_heads, "
                     "lookup, sampled_full, auto_full, smoke")
  return c
