"""Learned drafters trained on a frozen target (`experiments/train_drafter.py`):
Medusa heads (`medusa_*`), EAGLE-1 heads (`eagle_*`, also EAGLE-2's drafter),
EAGLE-3 heads (`eagle3_*`), block heads (`block_*`: DFlash-style, `eagle.block`
positions drafted in one call) and PARD drafts (`pard_*`: the Chen run's draft
fine-tuned with mask slots on the target's continuations), each at `quick` /
`full` / `micro`.

Run (after the Chen experiment trained its target):
  python experiments/train_drafter.py --config=configs/train_drafter.py:medusa_quick \
      --config.target_dir=runs/chen_full/target      # ≤ 15 min on 2 CPU cores
  python experiments/train_drafter.py --config=configs/train_drafter.py:medusa_full \
      --config.target_dir=runs/chen_full/target \
      --config.results_dir=results/medusa            # ≤ 2 h, resumable
  python experiments/train_drafter.py --config=configs/train_drafter.py:medusa_micro \
      --config.target_dir=/tmp/chen_micro/target --config.workdir=/tmp/medusa_micro   # seconds

  python experiments/train_drafter.py --config=configs/train_drafter.py:eagle_quick \
      --config.target_dir=runs/chen_full/target      # EAGLE-1 (EAGLE-2 drafts with it)
  python experiments/train_drafter.py --config=configs/train_drafter.py:eagle3_full \
      --config.target_dir=runs/chen_full/target --config.results_dir=results/eagle
  python experiments/train_drafter.py --config=configs/train_drafter.py:block_quick \
      --config.target_dir=runs/chen_quick/target --config.data.dir=runs/eagle_quick
  python experiments/train_drafter.py --config=configs/train_drafter.py:pard_quick \
      --config.target_dir=runs/chen_quick/target --config.data.dir=runs/distill_chen_quick_greedy

A rerun with the same workdir reuses the self-distillation data and resumes
training from the newest intact checkpoint. Results: `<workdir>/final` (the
heads), `trees.json` and `report.md` (validation top-k accuracies, the trees
built from them and their expected tokens per target call).
"""

import ml_collections


_KIND = {"medusa": "medusa", "eagle": "eagle1", "eagle3": "eagle3", "block": "block",
         "pard": "pard"}


def get_config(preset: str = "medusa_quick") -> ml_collections.ConfigDict:
  family, _, size = preset.rpartition("_")
  if family not in _KIND or size not in ("quick", "full", "micro"):
    raise ValueError(f"unknown preset {preset!r}; known: <medusa|eagle|eagle3|block|pard>_"
                     f"<quick|full|micro>")
  c = ml_collections.ConfigDict()
  c.kind = _KIND[family]
  c.preset = preset
  c.target_dir = "runs/chen_full/target"   # a trained Chen target (its final/)
  c.workdir = f"runs/{preset}"
  c.results_dir = ""                 # also write trees.json / report.md here (e.g. results/medusa)
  c.seed = 0

  c.data = ml_collections.ConfigDict()
  c.data.cache_dir = "data_cache"
  c.data.dir = ""                    # the self-distilled data ("" = the workdir); drafters
                                     # trained on one target may share it
  c.data.prompt_len = 64             # training prompts: code windows and summaries
  c.data.max_new = 96                # target tokens per self-distilled sequence
  c.data.temperature = 1.0           # the target samples its own continuations
  c.data.batch_size = 32
  c.data.train_sequences = 2048
  c.data.valid_sequences = 128

  c.medusa = ml_collections.ConfigDict()
  c.medusa.num_heads = 4
  c.medusa.share_lm_head = False     # True: heads share the target's frozen LM head
  c.medusa.tree_sizes = [4, 8, 16, 32, 64]

  c.eagle = ml_collections.ConfigDict()
  c.eagle.num_heads = 0              # the head layer's attention heads (0: the target's)
  c.eagle.mlp_dim = 0                # 0: the target's
  c.eagle.feature_layers = []        # EAGLE-3: [] = the second, middle and third-from-top blocks
  c.eagle.unroll = 0                 # 0: 1 step for EAGLE-1, 3 (training-time test) for EAGLE-3,
                                     # every slot for a block head
  c.eagle.block = 5                  # block heads: positions drafted in one call
  c.eagle.layers = 1                 # block heads: layers (the context enters each one)

  c.pard = ml_collections.ConfigDict()
  c.pard.draft_dir = ""              # the draft to fine-tune ("": the target run's draft/)
  c.pard.slots = 3                   # mask slots (a chain of slots + 1 in one draft call)
  c.pard.mask_id = 0                 # the mask token (the Chen vocabulary's pad id)
  c.pard.decay = 0.8                 # slot j's loss weight decay^j

  c.train = ml_collections.ConfigDict()
  c.train.steps = 2000
  c.train.batch_size = 16
  c.train.learning_rate = 1e-3
  c.train.warmup_steps = 100
  c.train.checkpoint_every = 250
  c.train.log_every = 50
  c.train.seed = 0
  c.train.keep_checkpoints = 2
  c.train.mesh_data = 1              # a data x model device mesh (specjax.training.mesh)
  c.train.mesh_model = 1

  if family == "pard":
    # The target's greedy continuations (sequence-level distillation: at this scale the
    # mask slots learn little from the data or from sampled continuations,
    # results/families/README.md): data of its own, never the shared T = 1 data dir.
    c.data.temperature = 0.0
  if size == "quick":
    c.data.train_sequences = 512
    c.data.max_new = 64
    c.medusa.num_heads = 3
    c.train.steps = 400
    c.train.checkpoint_every = 100
    if family != "medusa":
      c.train.learning_rate = 3e-3
  elif size == "micro":
    c.data.prompt_len = 16
    c.data.max_new = 8
    c.data.batch_size = 4
    c.data.train_sequences = 8
    c.data.valid_sequences = 4
    c.medusa.num_heads = 2
    c.medusa.tree_sizes = [4, 6]
    c.eagle.block = 3
    c.train.steps = 6
    c.train.batch_size = 4
    c.train.warmup_steps = 1
    c.train.checkpoint_every = 3
    c.train.log_every = 3
  elif family != "medusa":   # full
    c.train.learning_rate = 3e-3
  return c
