"""Prompt lookup (n-gram) drafting, batched and in-graph.

As transformers' `prompt_lookup_num_tokens` and vLLM's `ngram` proposer, but for every row of a
batch inside the jitted loop: each row keeps its token history (the prompt, then every committed
token) in a static buffer. To draft, the row's last n tokens (n from `max_ngram` down to
`min_ngram`, the longest that matches) are looked up in the earlier history; the most recent
occurrence wins and the γ tokens that followed it are proposed (fewer where the history ends). A
row with no match runs a plain target step in the same call. Drafts are deterministic, verified
as one-hot proposals, so sampling stays exact. For T5 the history is the encoder input followed
by the generated decoder tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Tuple

import jax
import jax.numpy as jnp
from flax import struct

from specjax.drafting import (CallLayout, DraftFeedback, DraftInput, Drafter, Proposal,
                              chain_layout)
from specjax._checks import check_int
from specjax.models.padding import mask_padding

__all__ = ["PromptLookup", "LookupState", "alloc_history", "start_history", "append_history"]


@struct.dataclass
class LookupState:
  """history: int32 `[B, H]` (prompt, then committed tokens); length: `[B]` tokens held (the last
  one is the pending token)."""

  history: jax.Array
  length: jax.Array


def _rows_update(buf_BH: jax.Array, new_BC: jax.Array, at_B: jax.Array) -> jax.Array:
  return jax.vmap(lambda row, upd, s: jax.lax.dynamic_update_slice(row, upd, (s,)))(
      buf_BH, new_BC.astype(buf_BH.dtype), at_B)


def alloc_history(batch_size: int, prompt_len: int, cache_len: int, depth: int) -> LookupState:
  """Empty histories with room for the prompt, every committed token and one iteration's
  overshoot (`depth` drafted tokens and the bonus token)."""
  room = prompt_len + cache_len + depth + 2
  return LookupState(history=jnp.zeros((batch_size, room), jnp.int32),
                     length=jnp.zeros((batch_size,), jnp.int32))


def start_history(state: LookupState, prompts_BP, lengths_B, first_B) -> LookupState:
  """The histories after the prefill: each row's prompt (its padding never copied), then its
  first token."""
  history = state.history.at[:, :prompts_BP.shape[1]].set(mask_padding(prompts_BP, lengths_B))
  history = _rows_update(history, first_B[:, None], lengths_B)
  return LookupState(history=history, length=lengths_B.astype(jnp.int32) + 1)


def append_history(state: LookupState, feedback: DraftFeedback) -> LookupState:
  """The histories after a commit (the last committed token is the new pending one)."""
  history = _rows_update(state.history, feedback.committed_BC, state.length)
  return LookupState(history=history, length=state.length + feedback.count_B)


@dataclasses.dataclass(frozen=True)
class PromptLookup(Drafter):
  """Drafts by copying what followed the last n tokens earlier in the row.

  Attributes:
    max_ngram, min_ngram: the n-gram sizes tried, longest first (1 <= min_ngram <= max_ngram).
  """

  max_ngram: int = 3
  min_ngram: int = 1

  deterministic = True
  uses_target_params = False
  adaptive = True
  offers_room = True

  def __post_init__(self):
    for name in ("max_ngram", "min_ngram"):
      check_int(name, getattr(self, name), 1)
    if self.min_ngram > self.max_ngram:
      raise ValueError(f"min_ngram ({self.min_ngram}) must be <= max_ngram ({self.max_ngram})")

  def check_params(self, params: Any) -> None:
    self.refuse_params(params)

  def check(self, target: Any, gamma: int) -> None:
    del target, gamma  # Any target: the drafts are its own vocabulary's tokens.

  def layout(self, gamma: int) -> CallLayout:
    return chain_layout(gamma)

  def alloc(self, batch_size: int, prompt_len: int, cache_len: int, gamma: int) -> LookupState:
    return alloc_history(batch_size, prompt_len, cache_len, gamma)

  def start(self, params, state: LookupState, prompts_BP, lengths_B, first_B,
            target_cache) -> LookupState:
    del params, target_cache
    return start_history(state, prompts_BP, lengths_B, first_B)

  def match(self, state: LookupState, gamma: int) -> Tuple[jax.Array, jax.Array]:
    """(start_B, count_B): where the continuation starts in the history, its length (0: none)."""
    hist, length = state.history, state.length
    b, h = hist.shape
    span = h - self.max_ngram + 1  # candidate match starts j in [0, span)
    j_J = jnp.arange(span)
    start_B = jnp.zeros((b,), jnp.int32)
    found_B = jnp.zeros((b,), bool)
    for n in range(self.max_ngram, self.min_ngram - 1, -1):
      tail_Bn = jnp.take_along_axis(
          hist, jnp.clip(length[:, None] - n + jnp.arange(n)[None], 0, h - 1), axis=1)
      eq_BJ = jnp.ones((b, span), bool)
      for i in range(n):
        eq_BJ = eq_BJ & (hist[:, i:i + span] == tail_Bn[:, i:i + 1])
      # A match must leave at least one token after it, before the tail.
      ok_BJ = eq_BJ & (j_J[None, :] + n < length[:, None]) & (length[:, None] > n)
      any_B = jnp.any(ok_BJ, axis=1)
      last_B = span - 1 - jnp.argmax(ok_BJ[:, ::-1], axis=1)   # most recent occurrence
      take_B = any_B & ~found_B
      start_B = jnp.where(take_B, last_B + n, start_B).astype(jnp.int32)
      found_B = found_B | any_B
    count_B = jnp.where(found_B, jnp.minimum(gamma, length - start_B), 0).astype(jnp.int32)
    return start_B, count_B

  def preview(self, params, state: LookupState, inp: DraftInput, width: int
              ) -> Tuple[jax.Array, jax.Array]:
    """Each row's matched continuation (its first `width` tokens) and its length."""
    del params, inp
    start_B, count_B = self.match(state, width)
    h = state.history.shape[1]
    idx_BW = jnp.clip(start_B[:, None] + jnp.arange(width)[None], 0, h - 1)
    valid_BW = jnp.arange(width)[None] < count_B[:, None]
    return count_B, jnp.where(valid_BW, jnp.take_along_axis(state.history, idx_BW, axis=1), 0)

  def propose(self, params, state: LookupState, inp: DraftInput, u_BG, sampling,
              gamma: int) -> Tuple[Proposal, LookupState]:
    del u_BG, sampling
    count_B, drafts_BG = self.preview(params, state, inp, gamma)
    valid_BG = jnp.arange(gamma)[None] < count_B[:, None]
    tokens_BT = jnp.concatenate([inp.pending_B[:, None], drafts_BG], axis=1).astype(jnp.int32)
    return Proposal(tokens_BT=tokens_BT, valid_BKN=valid_BG[:, None, :]), state

  def update(self, params, state: LookupState, feedback: DraftFeedback) -> LookupState:
    del params
    return append_history(state, feedback)
