"""Unigram and bigram table models following the model protocol.

Real drafts (Leviathan et al. Table 3 measures their α) and, their distributions being exactly
enumerable, the models of the exactness tests. Their cache holds only the row lengths.

Params: `{"logits": [V]}` (unigram) or `{"logits": [V, V]}` (bigram, row = previous token).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from specjax._checks import check_int, check_real

__all__ = ["TableCache", "UnigramLM", "BigramLM", "fit_ngram"]


@struct.dataclass
class TableCache:
  """Cache of a table model: lengths `[B]` and the static slot count."""

  lengths: jax.Array
  max_len: int = struct.field(pytree_node=False)


@dataclasses.dataclass(frozen=True)
class _TableLM:
  vocab_size: int

  def __post_init__(self):
    check_int("vocab_size", self.vocab_size, 1)

  def init_cache(self, batch_size: int, max_len: int, prompt_len: int = 0) -> TableCache:
    return TableCache(lengths=jnp.zeros((batch_size,), jnp.int32), max_len=int(max_len))

  def prefill_positions(self, prompt_len: int) -> int:
    return prompt_len

  def _logits(self, params, tokens):
    raise NotImplementedError

  def _table_shape(self) -> Tuple[int, ...]:
    raise NotImplementedError

  def expected_params(self, params=None) -> Dict[str, jax.ShapeDtypeStruct]:
    """`{"logits": the table}` (any floating dtype; float32 here)."""
    return {"logits": jax.ShapeDtypeStruct(self._table_shape(), jnp.float32)}

  def extend(self, params, tokens_BT, cache: TableCache) -> Tuple[jax.Array, TableCache]:
    logits = self._logits(params, tokens_BT)
    return logits, cache.replace(lengths=cache.lengths + tokens_BT.shape[1])

  def prefill(self, params, prompts_BP, prompt_lengths_B, cache: TableCache):
    last_B = jnp.take_along_axis(prompts_BP, prompt_lengths_B[:, None] - 1, axis=1)[:, 0]
    logits_BV = self._logits(params, last_B[:, None])[:, 0]
    return logits_BV, last_B.astype(jnp.int32), cache.replace(
        lengths=prompt_lengths_B.astype(jnp.int32))


@dataclasses.dataclass(frozen=True)
class UnigramLM(_TableLM):
  """Next-token logits independent of the context."""

  def _table_shape(self):
    return (self.vocab_size,)

  def _logits(self, params, tokens_BT):
    b, t = tokens_BT.shape
    return jnp.broadcast_to(params["logits"].astype(jnp.float32), (b, t, self.vocab_size))


@dataclasses.dataclass(frozen=True)
class BigramLM(_TableLM):
  """Next-token logits given by the previous token: `logits[prev]`."""

  def _table_shape(self):
    return (self.vocab_size, self.vocab_size)

  def _logits(self, params, tokens_BT):
    return params["logits"].astype(jnp.float32)[tokens_BT]


def fit_ngram(sequences, vocab_size: int, order: int, smoothing: float = 0.1) -> Dict[str, np.ndarray]:
  """Maximum-likelihood unigram (order 1) or bigram (order 2) log-probabilities with additive
  smoothing, from an iterable of token-id sequences."""
  if order not in (1, 2):
    raise ValueError(f"order must be 1 (unigram) or 2 (bigram), got {order!r}")
  smoothing = check_real("smoothing", smoothing, 0.0, lo_open=True)
  shape = (vocab_size,) if order == 1 else (vocab_size, vocab_size)
  counts = np.full(shape, smoothing, np.float64)
  for seq in sequences:
    seq = np.asarray(seq, np.int64)
    if seq.size and (seq.min() < 0 or seq.max() >= vocab_size):
      raise ValueError(f"token ids must lie in [0, {vocab_size}), got range "
                       f"[{seq.min()}, {seq.max()}]")
    if order == 1:
      np.add.at(counts, seq, 1.0)
    elif seq.size > 1:
      np.add.at(counts, (seq[:-1], seq[1:]), 1.0)
  logp = np.log(counts / counts.sum(axis=-1, keepdims=True))
  return {"logits": logp.astype(np.float32)}
