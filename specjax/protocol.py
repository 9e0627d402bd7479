"""The small protocol a model follows to be decoded by specjax.

`specjax.generate` and `specjax.speculative_generate` never look inside a
model: they call four pure functions on a hashable model object (it is a jit
static argument) and read/write one field of its cache. Any model that
follows this protocol can be a target or a draft: the decoder-only LM, T5, an
n-gram table, or a rigged model in a test.

Shape convention used throughout specjax (also as name suffixes, e.g.
`tokens_BT`):

  B batch rows, P padded prompt length, T tokens fed in one call,
  S cache slots (static buffer length), V vocabulary, L layers,
  H query heads, K key/value heads, D head dim, E model width, G = gamma.

The decoder stream of a row is the sequence of tokens its cache holds at
positions 0, 1, ...: for a decoder-only model the prompt and then the
generated tokens; for an encoder-decoder model the decoder start token and
then the generated tokens (the prompt goes to the encoder).

A cache is a pytree (a `flax.struct.dataclass`) with

  * `lengths`: int32 `[B]`, the number of valid positions of each row;
    every slot at or past it is masked and may hold stale values, which are
    overwritten later. Rolling a row back is setting its length — nothing is
    copied;
  * `max_len`: a Python int property, the static number of slots S;
  * `replace(**fields)` (flax.struct gives it).

Protocol (all functions pure and jit-traceable):

  vocab_size: int
  init_cache(batch_size, max_len, prompt_len) -> cache
      An empty cache (lengths 0) with S = max_len decoder slots. prompt_len
      is the padded prompt length P (an encoder-decoder model sizes its
      cross-attention buffer with it; others ignore it).
  prefill_positions(prompt_len) -> int
      How many decoder slots a prompt of this length occupies after prefill.
  prefill(params, prompts_BP, prompt_lengths_B, cache) -> (logits_BV, last_token_B, cache)
      Processes right-padded prompts (row b's tokens are prompts_BP[b, :len_b]),
      returns the next-token logits of every row, the token at the last
      filled decoder position of every row (the draft re-feeds it), and the
      cache with lengths = filled positions.
  extend(params, tokens_BT, cache) -> (logits_BTV, cache)
      Writes T tokens for every row at that row's own length (row b's token t
      goes to slot lengths[b] + t), attending to every valid slot and
      causally among the T new ones; returns the logits of the T positions and
      the cache with lengths + T.

Optional, for drafters whose target call is not a plain chain (token trees,
lookahead decoding; `DecoderLM` and `T5` implement them):

  extend(params, tokens_BT, cache, positions_BT=None, mask_TT=None)
      `positions_BT`: the tokens' positions in their sequences (rotary / relative
      position encodings; default: their slots); `mask_TT` (bool `[T, T]` or
      `[B, T, T]`): which new tokens each new token attends to (default causal).
  copy_slots(cache, src_BN, dst_B) -> cache
      Row b's slots src_BN[b, i] copied to dst_B[b] + i (the accepted path of a
      tree moved into contiguous slots).
  extend_with_hidden(params, tokens_BT, cache, ...) -> (logits_BTV, hidden_BTE, cache)
      Also the final hidden states (draft heads such as Medusa read them).
"""

from __future__ import annotations

from typing import Any, Protocol, Tuple, runtime_checkable

import jax

__all__ = ["LanguageModel", "check_model", "required_cache_len"]

Params = Any
Cache = Any


@runtime_checkable
class LanguageModel(Protocol):
  """What `generate` and `speculative_generate` need from a model (see module doc)."""

  vocab_size: int

  def init_cache(self, batch_size: int, max_len: int, prompt_len: int) -> Cache:
    ...

  def prefill_positions(self, prompt_len: int) -> int:
    ...

  def prefill(
      self, params: Params, prompts_BP: jax.Array, prompt_lengths_B: jax.Array, cache: Cache
  ) -> Tuple[jax.Array, jax.Array, Cache]:
    ...

  def extend(self, params: Params, tokens_BT: jax.Array, cache: Cache) -> Tuple[jax.Array, Cache]:
    ...


def check_model(model: Any, name: str) -> None:
  """Raises TypeError naming `name` when `model` does not follow the protocol."""
  missing = [
      attr
      for attr in ("vocab_size", "init_cache", "prefill_positions", "prefill", "extend")
      if not hasattr(model, attr)
  ]
  if missing:
    raise TypeError(
        f"{name} must follow specjax.protocol.LanguageModel; "
        f"{type(model).__name__} lacks {', '.join(missing)}"
    )
  try:
    hash(model)
  except TypeError as e:
    raise TypeError(
        f"{name} must be hashable (it is a jit static argument), e.g. a frozen "
        f"dataclass; {type(model).__name__} is not"
    ) from e


def required_cache_len(model: Any, prompt_len: int, max_new_tokens: int, gamma: int = 0) -> int:
  """Slots a cache needs for `max_new_tokens` after a prompt of padded length
  `prompt_len`, with `gamma` drafts per iteration (0 for autoregressive)."""
  return model.prefill_positions(prompt_len) + max_new_tokens + gamma - 1
