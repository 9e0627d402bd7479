"""Models from config sections: the shapes an experiment config names.

An ml_collections section (or any attribute mapping) gives a model's widths and depths; the
vocabulary comes from the tokenizer. The paper programs and `specjax.aot` build from them.

  t5_from_section(cfg.models.target, vocab)       # d_model, d_kv, num_heads, d_ff, num_layers
                                                  # (and num_decoder_layers, default the same)
  decoder_from_section(cfg.models.draft, vocab)   # d_model, num_layers, num_heads, num_kv_heads,
                                                  # head_dim, mlp_dim, tie_embeddings
"""

from __future__ import annotations

from typing import Any

from specjax.models.decoder import DecoderConfig, DecoderLM
from specjax.models.t5 import T5
from specjax.models.t5_config import T5Config

__all__ = ["t5_from_section", "decoder_from_section"]


def t5_from_section(section: Any, vocab_size: int) -> T5:
  """A T5 v1.1 (gated-GELU, untied embeddings) from a config section; `num_decoder_layers`
  (optional, 0 or absent: `num_layers`) gives the decoder its own depth."""
  decoder_layers = int(getattr(section, "num_decoder_layers", 0) or 0)   # an optional field
  return T5(T5Config(vocab_size=vocab_size, d_model=section.d_model, d_kv=section.d_kv,
                     num_heads=section.num_heads, d_ff=section.d_ff,
                     num_layers=section.num_layers,
                     num_decoder_layers=decoder_layers or section.num_layers,
                     feed_forward="gated-gelu", tie_word_embeddings=False))


def decoder_from_section(section: Any, vocab_size: int) -> DecoderLM:
  """A `DecoderLM` from a config section (d_model, num_layers, ...)."""
  return DecoderLM(DecoderConfig(
      vocab_size=vocab_size, d_model=section.d_model, num_layers=section.num_layers,
      num_heads=section.num_heads, num_kv_heads=section.num_kv_heads,
      head_dim=section.head_dim, mlp_dim=section.mlp_dim,
      tie_embeddings=bool(section.tie_embeddings)))
