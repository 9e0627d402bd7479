"""T5 configuration: `T5Config`, the published shapes and small CPU sizes.

`specjax.models.t5` re-exports everything here; import from there.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional
from specjax._checks import check_bool, check_int, check_real

__all__ = ["T5Config", "T5_CONFIGS", "t5_config", "FEED_FORWARDS"]

_DTYPES = ("float32", "bfloat16", "float16")
FEED_FORWARDS = ("relu", "gated-gelu")


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Shape and numerics of a T5 encoder-decoder (frozen, hashable).

  Attributes:
    vocab_size: V, shared by the encoder input, decoder input and output.
    d_model, d_kv, num_heads, d_ff: E, D (one head's width; H * D need not equal E), H, and F
      (the feed-forward hidden width).
    num_layers: encoder layers; num_decoder_layers: decoder layers L (None: num_layers).
    relative_attention_num_buckets: buckets of the relative position bias.
    relative_attention_max_distance: distances at or beyond it share the last bucket.
    feed_forward: "relu" (T5 v1.0: relu(x wi) wo) or "gated-gelu" (T5 v1.1: (gelu_tanh(x wi_0) *
      x wi_1) wo, transformers' `gelu_new`).
    tie_word_embeddings: True (v1.0): logits = (h * d_model**-0.5) @ shared.T; False (v1.1): a
      separate lm_head, no scaling.
    layer_norm_epsilon: epsilon of the scale-only layer norms.
    pad_id, eos_id, decoder_start_id: special token ids.
    dtype: compute dtype name; param_dtype: parameter dtype name.
  """

  vocab_size: int
  d_model: int
  d_kv: int
  num_heads: int
  d_ff: int
  num_layers: int
  num_decoder_layers: Optional[int] = None
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  feed_forward: str = "relu"
  tie_word_embeddings: bool = True
  layer_norm_epsilon: float = 1e-6
  pad_id: int = 0
  eos_id: int = 1
  decoder_start_id: int = 0
  dtype: str = "float32"
  param_dtype: str = "float32"

  def __post_init__(self):
    if self.num_decoder_layers is None:
      object.__setattr__(self, "num_decoder_layers", self.num_layers)
    for name in ("vocab_size", "d_model", "d_kv", "num_heads", "d_ff", "num_layers",
                 "num_decoder_layers"):
      check_int(name, getattr(self, name), 1)
    check_int("relative_attention_num_buckets", self.relative_attention_num_buckets, 4)
    if self.relative_attention_num_buckets % 2:
      raise ValueError("relative_attention_num_buckets must be even (half of them per "
                       f"direction in the encoder), got {self.relative_attention_num_buckets}")
    check_int("relative_attention_max_distance", self.relative_attention_max_distance, 1)
    if self.relative_attention_max_distance <= self.relative_attention_num_buckets // 2:
      raise ValueError(
          "relative_attention_max_distance must exceed relative_attention_num_buckets // 2 "
          f"({self.relative_attention_num_buckets // 2}), got "
          f"{self.relative_attention_max_distance}")
    if self.feed_forward not in FEED_FORWARDS:
      raise ValueError(f"feed_forward must be one of {FEED_FORWARDS}, got {self.feed_forward!r}")
    check_bool("tie_word_embeddings", self.tie_word_embeddings)
    check_real("layer_norm_epsilon", self.layer_norm_epsilon, 0.0, 1.0, lo_open=True,
               hi_open=True)
    for name in ("pad_id", "eos_id", "decoder_start_id"):
      check_int(name, getattr(self, name), 0)
      if getattr(self, name) >= self.vocab_size:
        raise ValueError(f"{name} must lie in [0, vocab_size={self.vocab_size}), got "
                         f"{getattr(self, name)}")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"{name} must be one of {_DTYPES}, got {getattr(self, name)!r}")

  @property
  def is_gated(self) -> bool:
    return self.feed_forward == "gated-gelu"

  @property
  def inner_dim(self) -> int:
    """H * D, the width of the concatenated heads."""
    return self.num_heads * self.d_kv

  def num_params(self) -> int:
    """Exact parameter count (shared embedding counted once)."""
    e, f, v, a = self.d_model, self.d_ff, self.vocab_size, self.inner_dim
    attn = 4 * e * a
    mlp = (3 if self.is_gated else 2) * e * f
    bias = self.relative_attention_num_buckets * self.num_heads
    encoder = self.num_layers * (attn + mlp + 2 * e) + bias + e
    decoder = self.num_decoder_layers * (2 * attn + mlp + 3 * e) + bias + e
    head = 0 if self.tie_word_embeddings else e * v
    return v * e + encoder + decoder + head

  def replace(self, **changes) -> "T5Config":
    return dataclasses.replace(self, **changes)


def _v10(d_model, d_kv, num_heads, d_ff, layers, **kw) -> T5Config:
  return T5Config(vocab_size=kw.pop("vocab_size", 32128), d_model=d_model, d_kv=d_kv,
                  num_heads=num_heads, d_ff=d_ff, num_layers=layers, feed_forward="relu",
                  tie_word_embeddings=True, **kw)


def _v11(d_model, d_kv, num_heads, d_ff, layers, **kw) -> T5Config:
  return T5Config(vocab_size=kw.pop("vocab_size", 32128), d_model=d_model, d_kv=d_kv,
                  num_heads=num_heads, d_ff=d_ff, num_layers=layers, feed_forward="gated-gelu",
                  tie_word_embeddings=False, **kw)


# The published checkpoints (Raffel et al. 2020; the T5 v1.1 release notes): v1.0 relu + tied,
# scaled output; v1.1 gated-gelu, untied lm_head, no scaling; encoder and decoder equally deep.
T5_CONFIGS: Dict[str, T5Config] = {
    "t5-small": _v10(512, 64, 8, 2048, 6),
    "t5-base": _v10(768, 64, 12, 3072, 12),
    "t5-large": _v10(1024, 64, 16, 4096, 24),
    "t5-3b": _v10(1024, 128, 32, 16384, 24),
    "t5-11b": _v10(1024, 128, 128, 65536, 24),
    "t5-v1_1-small": _v11(512, 64, 6, 1024, 8),
    "t5-v1_1-base": _v11(768, 64, 12, 2048, 12),
    "t5-v1_1-large": _v11(1024, 64, 16, 2816, 24),
    "t5-v1_1-xl": _v11(2048, 64, 32, 5120, 24),
    "t5-v1_1-xxl": _v11(4096, 64, 64, 10240, 24),
    # Small CPU sizes (v1.1 layout): a target / draft pair for benchmarks, tiny models for tests.
    "t5-cpu-target": _v11(384, 64, 6, 1024, 4, vocab_size=8192),
    "t5-cpu-draft": _v11(128, 32, 4, 256, 2, vocab_size=8192),
    "t5-tiny": _v10(32, 8, 4, 64, 2, vocab_size=128, relative_attention_num_buckets=8,
                    relative_attention_max_distance=16),
    "t5-v1_1-tiny": _v11(32, 8, 4, 64, 2, vocab_size=128, relative_attention_num_buckets=8,
                         relative_attention_max_distance=16),
}


def t5_config(name: str, **overrides) -> T5Config:
  """A named config, optionally with fields replaced (e.g. vocab_size=...)."""
  if name not in T5_CONFIGS:
    raise ValueError(f"unknown T5 config {name!r}; known: {sorted(T5_CONFIGS)}")
  fields = [f.name for f in dataclasses.fields(T5Config)]
  unknown = sorted(set(overrides) - set(fields))
  if unknown:
    raise TypeError(f"t5_config({name!r}): {unknown[0]} is not a T5Config field; the fields: "
                    f"{', '.join(fields)}")
  return T5_CONFIGS[name].replace(**overrides)
