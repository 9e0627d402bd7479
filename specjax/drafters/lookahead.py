"""Lookahead decoding (Fu et al. 2024): Jacobi iteration plus an n-gram pool, no draft model.

Every iteration makes one target call of three parts, kept apart by the attention mask among
the call's tokens:

  * the pending token (decoded as usual);
  * the lookahead branch: a window of N - 1 levels × W columns of guessed tokens. Level j,
    column i stands at position +1+i+j after the pending token and attends to the pending token,
    to level 0's columns 0..i and to levels 1..j-1 of its own column (one causal sequence per
    column). The target's argmax after the last level gives each column a new token: the
    column's N tokens go into the row's n-gram pool, then the levels shift (level 0 drops, the
    new tokens become the last level): a Jacobi step along each column;
  * the verification branch: up to G pool n-grams whose first token is the pending token, each
    candidate's N - 1 remaining tokens attending only to the pending token and to each other.

The candidates are verified exactly as deterministic drafts sharing a root
(`specjax.verify.candidates_verify`); the accepted tokens' keys and values are moved next to the
pending token (`copy_slots`). Window, pool and candidate choice are per row, in static buffers,
inside the jitted loop.

Shapes: W window columns, N n-gram size (chain length N - 1), G candidates, P pool entries.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.drafting import CallLayout, DraftFeedback, DraftInput, Drafter, Proposal
from specjax._checks import check_int

__all__ = ["Lookahead", "LookaheadState"]


@struct.dataclass
class LookaheadState:
  """window: int32 `[B, N-1, W]` (levels × columns); pool: int32 `[B, P, N]` n-grams;
  pool_next `[B]`: the next pool slot to write (a ring); pool_size `[B]`: entries filled."""

  window: jax.Array
  pool: jax.Array
  pool_next: jax.Array
  pool_size: jax.Array


@dataclasses.dataclass(frozen=True)
class Lookahead(Drafter):
  """Lookahead decoding as a drafter (see the module doc).

  Attributes:
    window: W columns of the lookahead branch (e.g. 7 in the paper).
    ngram: N, the n-gram size (>= 2): N - 1 levels and candidates of N - 1 tokens (e.g. 5).
    candidates: G, n-grams verified per iteration (e.g. 7).
    pool_size: P, n-grams kept per row (the oldest are overwritten).
  """

  window: int = 4
  ngram: int = 4
  candidates: int = 4
  pool_size: int = 64

  deterministic = True
  uses_target_params = False

  def __post_init__(self):
    for name, low in (("window", 1), ("ngram", 2), ("candidates", 1), ("pool_size", 1)):
      check_int(name, getattr(self, name), low)

  @property
  def fixed_gamma(self) -> int:
    """Drafted tokens per candidate (N - 1): lookahead fixes γ."""
    return self.ngram - 1

  def check_params(self, params: Any) -> None:
    self.refuse_params(params)

  def check(self, target: Any, gamma: int) -> None:
    if gamma != self.fixed_gamma:
      raise ValueError(f"lookahead drafts ngram - 1 = {self.fixed_gamma} tokens per candidate; "
                       f"gamma must be that or None, got {gamma}")
    missing = [m for m in ("copy_slots",) if not hasattr(target, m)]
    if missing:
      raise TypeError(f"lookahead decoding needs a target with positions and an attention "
                      f"mask in `extend` and `copy_slots` (DecoderLM, T5); "
                      f"{type(target).__name__} lacks {', '.join(missing)}")

  def layout(self, gamma: int) -> CallLayout:
    w, n, g = self.window, self.ngram - 1, self.candidates
    la = 1 + n * w                          # first verification token
    t = la + g * n
    offsets = np.zeros((t,), np.int32)
    mask = np.zeros((t, t), bool)
    mask[0, 0] = True
    idx = lambda j, i: 1 + j * w + i        # lookahead level j, column i
    for j in range(n):
      for i in range(w):
        me = idx(j, i)
        offsets[me] = 1 + i + j
        mask[me, 0] = True
        mask[me, [idx(0, c) for c in range(i + 1)]] = True
        mask[me, [idx(l, i) for l in range(1, j + 1)]] = True
    chains = np.zeros((g, n), np.int32)
    for k in range(g):
      for s in range(n):
        me = la + k * n + s
        chains[k, s] = me
        offsets[me] = 1 + s
        mask[me, 0] = True
        mask[me, la + k * n: me + 1] = True
    return CallLayout(length=t, chains_KN=chains, offsets_T=offsets, mask_TT=mask)

  def alloc(self, batch_size: int, prompt_len: int, cache_len: int, gamma: int) -> LookaheadState:
    n = self.ngram - 1
    return LookaheadState(
        window=jnp.zeros((batch_size, n, self.window), jnp.int32),
        pool=jnp.zeros((batch_size, self.pool_size, self.ngram), jnp.int32),
        pool_next=jnp.zeros((batch_size,), jnp.int32),
        pool_size=jnp.zeros((batch_size,), jnp.int32))

  def start(self, params, state: LookaheadState, prompts_BP, lengths_B, first_B,
            target_cache) -> LookaheadState:
    """The window starts with a fixed pseudo-random pick of the row's prompt tokens."""
    del params, first_B, target_cache
    b, n, w = state.window.shape
    salt = jnp.arange(n * w, dtype=jnp.int32).reshape(1, n, w) * 7919 + 17
    idx = jnp.mod(salt, jnp.maximum(lengths_B, 1)[:, None, None])
    window = jnp.take_along_axis(prompts_BP.astype(jnp.int32), idx.reshape(b, -1), axis=1)
    return state.replace(window=window.reshape(b, n, w))

  def propose(self, params, state: LookaheadState, inp: DraftInput, u_BG, sampling,
              gamma: int) -> Tuple[Proposal, LookaheadState]:
    del params, u_BG, sampling
    b = inp.pending_B.shape[0]
    n, g, p = self.ngram - 1, self.candidates, self.pool_size
    # Candidates: the most recent pool entries that start with the pending token.
    slot_P = jnp.arange(p)[None, :]
    filled_BP = slot_P < state.pool_size[:, None]
    match_BP = filled_BP & (state.pool[:, :, 0] == inp.pending_B[:, None])
    age_BP = jnp.mod(state.pool_next[:, None] - 1 - slot_P, p)            # 0 = newest
    score_BP = jnp.where(match_BP, p - age_BP, 0)
    k = min(g, p)
    top_score, top_idx = jax.lax.top_k(score_BP, k)
    cands_BKN = jnp.take_along_axis(state.pool, top_idx[:, :, None], axis=1)[:, :, 1:]
    valid_BK = top_score > 0
    if k < g:  # fewer pool slots than candidates: pad with invalid ones
      cands_BKN = jnp.pad(cands_BKN, ((0, 0), (0, g - k), (0, 0)))
      valid_BK = jnp.pad(valid_BK, ((0, 0), (0, g - k)))
    valid_BKN = jnp.broadcast_to(valid_BK[:, :, None], (b, g, n))
    cands_BKN = jnp.where(valid_BKN, cands_BKN, 0)
    tokens_BT = jnp.concatenate([inp.pending_B[:, None], state.window.reshape(b, -1),
                                 cands_BKN.reshape(b, -1)], axis=1).astype(jnp.int32)
    return Proposal(tokens_BT=tokens_BT, valid_BKN=valid_BKN), state

  def update(self, params, state: LookaheadState, feedback: DraftFeedback) -> LookaheadState:
    del params
    b, n, w = state.window.shape
    last = 1 + (n - 1) * w                      # the last level's first call position
    new_BW = feedback.target_argmax_BT[:, last:last + w]
    grams_BWN = jnp.concatenate([jnp.swapaxes(state.window, 1, 2), new_BW[:, :, None]], axis=2)
    window = jnp.concatenate([state.window[:, 1:], new_BW[:, None, :]], axis=1)
    pool, nxt, size = state.pool, state.pool_next, state.pool_size
    p = self.pool_size
    for i in range(w):
      gram_BN = grams_BWN[:, i]
      present_B = jnp.any(jnp.all(pool == gram_BN[:, None, :], axis=2)
                          & (jnp.arange(p)[None] < size[:, None]), axis=1)
      add_B = ~present_B
      pool = jnp.where((add_B[:, None] & (jnp.arange(p)[None] == nxt[:, None]))[:, :, None],
                       gram_BN[:, None, :], pool)
      nxt = jnp.where(add_B, jnp.mod(nxt + 1, p), nxt)
      size = jnp.where(add_B, jnp.minimum(size + 1, p), size)
    return LookaheadState(window=window, pool=pool, pool_next=nxt, pool_size=size)
