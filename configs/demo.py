"""Demo: autoregressive vs speculative decoding, prompt lookup and a draft model.

Run:
  python experiments/demo.py --config=configs/demo.py
  python experiments/demo.py --config=configs/demo.py:tiny   # seconds, for smoke tests
  python experiments/demo.py --config=configs/demo.py --config.gamma=7 --config.batch_size=8

The target has random weights (a trained pair comes with the reproductions).
The prompts repeat a random block, so prompt lookup gets drafts accepted;
the random draft model rarely agrees with the target. `draft="self"` drafts
with the target itself (every token accepted).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.target = "cpu-target-27m"   # a name in specjax.models.decoder.DECODER_CONFIGS
  c.draft = "cpu-draft-1m"      # a name, or "self"
  c.vocab_size = 8192
  c.batch_size = 4
  c.prompt_len = 32
  c.max_new_tokens = 64
  c.gamma = 4
  c.temperature = 0.0
  c.top_k = 0
  c.top_p = 1.0
  c.seed = 0
  c.repeats = 3
  c.drafters = "prompt_lookup,model"   # any of: prompt_lookup, model
  c.lookup_gamma = 8
  c.lookup_max_ngram = 3
  if arg == "tiny":
    c.target = "tiny"
    c.draft = "tiny"
    c.vocab_size = 64
    c.max_new_tokens = 16
    c.repeats = 1
  elif arg:
    raise ValueError(f"unknown demo preset {arg!r}; known: '', 'tiny'")
  return c
