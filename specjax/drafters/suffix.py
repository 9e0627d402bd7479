"""Suffix drafting (SuffixDecoding, Oliaro et al. 2024, arXiv 2411.04975), batched and
in-graph: a tree of continuations from every earlier occurrence of the row's latest tokens.

  1. the haystack: the row's own history (prompt, then committed tokens), the other rows'
     histories (`share_rows`) and an optional corpus as the drafter's params (`SuffixCorpus`);
  2. the longest suffix of the row's history (up to `max_match` tokens) that occurred earlier
     with a token after it; its `occurrences` most recent occurrences (the row's own first);
  3. their continuations (up to `depth` tokens, `ceil(factor × match length)` for a short
     match) merged into a trie; a node's score is the fraction of the occurrences through it
     (SuffixDecoding's path probability), it needs `min_prob`, a node keeps its
     `max_children` best children, the tree its `nodes` best nodes (a parent scores at least
     its children, so the kept set is a tree), numbered by depth then score.

The tree is per row (a dynamic-tree layout of `nodes + 1` tokens, one target call); its tokens
are deterministic, verified as one-hot proposals by `verify.tree_verify`, so the output law is
exactly the target's at any temperature, whatever the haystack holds. A row with no match takes
a plain target step in the same call. Static shapes throughout (the haystack is `[C + B·H]`
with `share_rows`, `[C + H]` per row without it).

The match costs `B × S × max_match` comparisons over S haystack tokens; with `share_rows` S
grows with the batch (B²·H): turn it off for large batches. With `share_rows` a row's
*sampled* tokens for a given key depend on the other rows (its law does not); greedy output
is the target's either way. Usage: docs/drafters.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax._checks import check_bool, check_int, check_real, is_concrete
from specjax.drafters.prompt_lookup import (LookupState, alloc_history, append_history,
                                            start_history)
from specjax.drafting import CallLayout, DraftFeedback, DraftInput, Drafter, Proposal

__all__ = ["SuffixDraft", "SuffixCorpus", "outputs_of"]

_SEP = -1  # haystack padding and separators: never equal to a token


@struct.dataclass
class SuffixCorpus:
  """A fixed-size token corpus shared by every row (the drafter's params).

  tokens_C: int32 `[C]`, documents in order, each followed by -1; the unused front is -1.
  Fixed C: a growing corpus compiles once.
  """

  tokens_C: jax.Array

  @classmethod
  def build(cls, sequences: Iterable[Sequence[int]], size: int,
            vocab_size: int) -> "SuffixCorpus":
    """The most recent `sequences` that fit in `size` tokens (with separators); a sequence
    longer than the corpus keeps its end."""
    size = check_int("size", size, 2)
    return cls(tokens_C=jnp.asarray(np.full((size,), _SEP, np.int32))).add(sequences, vocab_size)

  def add(self, sequences: Iterable[Sequence[int]], vocab_size: int) -> "SuffixCorpus":
    """This corpus with `sequences` appended (the oldest tokens drop out)."""
    vocab_size = check_int("vocab_size", vocab_size, 1)
    parts = [np.asarray(self.tokens_C, np.int32)]
    for i, seq in enumerate(sequences):
      arr = np.asarray(seq)
      if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"sequences[{i}] must be a 1-D sequence of token ids, got shape "
                         f"{arr.shape}, dtype {arr.dtype}")
      if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        bad = arr[(arr < 0) | (arr >= vocab_size)][0]
        raise ValueError(f"sequences[{i}] holds token {int(bad)}, outside the vocabulary "
                         f"[0, {vocab_size})")
      parts += [arr.astype(np.int32), np.asarray([_SEP], np.int32)]
    size = int(self.tokens_C.shape[0])
    return SuffixCorpus(tokens_C=jnp.asarray(np.concatenate(parts)[-size:]))

  def check_vocab(self, vocab_size: int, name: str = "corpus") -> None:
    """ValueError naming `name`, the first id and its index when the corpus holds a token id
    >= `vocab_size` (a corpus built for another vocabulary: the target would be fed ids its
    embedding does not have). Tracers and multi-host arrays are not read."""
    tokens = self.tokens_C
    if not is_concrete(tokens) or not tokens.size:
      return
    t = np.asarray(tokens)
    bad = t >= vocab_size
    if bad.any():
      i = int(np.argmax(bad))
      raise ValueError(
          f"{name} (a SuffixCorpus) must hold token ids in [0, {vocab_size}) (the target's "
          f"vocabulary) and -1 separators; index {i} holds {int(t[i])} ({int(bad.sum())} ids "
          f"out of range): build it with SuffixCorpus.build(..., vocab_size="
          f"target.vocab_size)")


def outputs_of(out) -> list:
  """Each row's generated tokens (`out.tokens[b, :out.lengths[b]]`), for `SuffixCorpus.add`."""
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  return [tokens[b, :int(lengths[b])] for b in range(tokens.shape[0])]


def _cumall(x, axis=-1):
  """Running AND along `axis`."""
  return jnp.cumsum(~x, axis=axis) == 0


@dataclasses.dataclass(frozen=True)
class SuffixDraft(Drafter):
  """A tree of continuations from earlier occurrences of the row's suffix (module doc).
  `draft_params`: a `SuffixCorpus`, or None.

  Attributes:
    max_match, min_match: the suffix lengths matched (longest found wins).
    nodes: drafted tokens per call (the root not counted); the target call has `nodes + 1`.
    depth: the deepest node (the most tokens one iteration can accept).
    max_children: children per node.
    occurrences: the most recent occurrences of the suffix merged.
    factor: a match of p tokens drafts at most ceil(factor · p) deep.
    min_prob: the least fraction of the occurrences a node must carry.
    share_rows: also search the other rows of the batch.
  """

  max_match: int = 8
  min_match: int = 1
  nodes: int = 16
  depth: int = 8
  max_children: int = 4
  occurrences: int = 16
  factor: float = 2.0
  min_prob: float = 0.1
  share_rows: bool = True

  deterministic = True
  uses_target_params = False

  def __post_init__(self):
    for name in ("max_match", "min_match", "nodes", "depth", "max_children", "occurrences"):
      check_int(name, getattr(self, name), 1)
    if self.min_match > self.max_match:
      raise ValueError(f"min_match ({self.min_match}) must be <= max_match ({self.max_match})")
    if self.depth > self.nodes:
      raise ValueError(f"depth ({self.depth}) must be <= nodes ({self.nodes}) to reach it")
    if self.nodes > self.occurrences * self.depth:
      raise ValueError(f"nodes ({self.nodes}) exceeds the {self.occurrences * self.depth} "
                       f"candidates of occurrences {self.occurrences} x depth {self.depth}")
    check_real("factor", self.factor, 0.0, lo_open=True)
    check_real("min_prob", self.min_prob, 0.0, 1.0)
    check_bool("share_rows", self.share_rows)

  @property
  def fixed_gamma(self) -> int:
    return self.depth

  def check_params(self, params: Any) -> None:
    if params is None:
      return
    if not isinstance(params, SuffixCorpus):
      raise TypeError(f"draft_params must be a SuffixCorpus (SuffixCorpus.build) or None for "
                      f"SuffixDraft, got {type(params).__name__}")
    tokens = params.tokens_C
    if getattr(tokens, "ndim", None) != 1 or not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f"draft_params.tokens_C must be a 1-D int array, got shape "
                       f"{getattr(tokens, 'shape', None)}, dtype {getattr(tokens, 'dtype', None)}")
    if is_concrete(tokens) and tokens.size and int(jnp.min(tokens)) < _SEP:
      raise ValueError(f"draft_params.tokens_C holds {int(jnp.min(tokens))}: token ids are >= 0 "
                       f"and -1 separates documents")

  def layout(self, gamma: int) -> CallLayout:
    del gamma
    return CallLayout.dynamic(self.nodes + 1, self.depth, self.max_children)

  def alloc(self, batch_size: int, prompt_len: int, cache_len: int, gamma: int) -> LookupState:
    return alloc_history(batch_size, prompt_len, cache_len, self.depth)

  def start(self, params, state: LookupState, prompts_BP, lengths_B, first_B,
            target_cache) -> LookupState:
    del params, target_cache
    return start_history(state, prompts_BP, lengths_B, first_B)

  def update(self, params, state: LookupState, feedback: DraftFeedback) -> LookupState:
    del params
    return append_history(state, feedback)

  def _haystack(self, corpus: Optional[SuffixCorpus], state: LookupState
                ) -> Tuple[jax.Array, jax.Array]:
    """(hay_XS, own_start_B): the searched tokens (X = 1 shared by the rows, or B; -1 where
    nothing is) and where each row's own history starts in it."""
    hist, length = state.history, state.length
    b, h = hist.shape
    own_BH = jnp.where(jnp.arange(h)[None] < length[:, None], hist, _SEP)
    c = 0 if corpus is None else int(corpus.tokens_C.shape[0]) + 1  # and a separator
    if self.share_rows:
      parts = [own_BH.reshape(1, b * h)]
      own_start_B = c + jnp.arange(b, dtype=jnp.int32) * h
      rows = 1
    else:
      parts = [own_BH]
      own_start_B = jnp.full((b,), c, jnp.int32)
      rows = b
    if corpus is not None:
      sep = jnp.full((1,), _SEP, jnp.int32)
      text = jnp.concatenate([corpus.tokens_C.astype(jnp.int32), sep])
      parts = [jnp.broadcast_to(text[None], (rows, c))] + parts
    return jnp.concatenate(parts, axis=1), own_start_B

  def match(self, corpus: Optional[SuffixCorpus], state: LookupState
            ) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """(hay_XS, starts_BM, length_B): the haystack, the positions of the longest suffix's most
    recent occurrences (-1: none; continuations start at the next position) and the match
    length (0: none)."""
    hist, length = state.history, state.length
    b, h = hist.shape
    L = self.max_match
    hay_XS, own_start_B = self._haystack(corpus, state)
    s = hay_XS.shape[1]
    at_BL = length[:, None] - L + jnp.arange(L)[None]
    tail_BL = jnp.where(at_BL >= 0, jnp.take_along_axis(hist, jnp.clip(at_BL, 0, h - 1), 1), -2)
    padded_XS = jnp.concatenate([jnp.full((hay_XS.shape[0], L), _SEP, jnp.int32), hay_XS], 1)
    alive_BS = jnp.ones((b, s), bool)
    mlen_BS = jnp.zeros((b, s), jnp.int32)
    for k in range(L):  # hay[j - k] == the row's k-th token from the end
      alive_BS = alive_BS & (padded_XS[:, L - k:L - k + s] == tail_BL[:, L - 1 - k, None])
      mlen_BS = mlen_BS + alive_BS
    nxt_XS = jnp.concatenate([hay_XS[:, 1:], jnp.full((hay_XS.shape[0], 1), _SEP, jnp.int32)], 1)
    occ_BS = (mlen_BS >= self.min_match) & (nxt_XS >= 0)
    best_B = jnp.max(jnp.where(occ_BS, mlen_BS, 0), axis=1)
    cand_BS = occ_BS & (mlen_BS == best_B[:, None])
    j_S = jnp.arange(s, dtype=jnp.int32)
    own_BS = (j_S[None] >= own_start_B[:, None]) & (j_S[None] < own_start_B[:, None] + h)
    prio_BS = jnp.where(cand_BS, jnp.where(own_BS, s + j_S[None], j_S[None]), -1)
    m = min(self.occurrences, s)
    prio_BM, at_BM = jax.lax.top_k(prio_BS, m)
    starts_BM = jnp.where(prio_BM >= 0, at_BM, -1).astype(jnp.int32)
    if m < self.occurrences:
      starts_BM = jnp.pad(starts_BM, ((0, 0), (0, self.occurrences - m)), constant_values=-1)
    return hay_XS, starts_BM, best_B.astype(jnp.int32)

  def tree(self, hay_XS, starts_BM, match_B
           ) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """(tokens_BN, parents_BN, valid_BN): the drafted nodes (N = `nodes`, root excluded;
    parents are node indices in the call, 0 the root) from the occurrences' continuations."""
    b, m = starts_BM.shape
    d_, n = self.depth, self.nodes
    s = hay_XS.shape[1]
    ok_BM = starts_BM >= 0
    idx_BMD = starts_BM[:, :, None] + 1 + jnp.arange(d_)[None, None]
    flat = jnp.clip(idx_BMD, 0, s - 1).reshape(b, m * d_)
    if hay_XS.shape[0] == 1:
      tok_BMD = hay_XS[0][flat].reshape(b, m, d_)
    else:
      tok_BMD = jnp.take_along_axis(hay_XS, flat, axis=1).reshape(b, m, d_)
    cap_B = jnp.clip(jnp.ceil(self.factor * match_B).astype(jnp.int32), 1, d_)
    valid_BMD = _cumall((tok_BMD >= 0) & (idx_BMD < s)) & ok_BM[:, :, None]
    valid_BMD = valid_BMD & (jnp.arange(d_)[None, None] < cap_B[:, None, None])
    # same_BMKD[b, i, k, d]: occurrences i and k share their first d + 1 tokens.
    eq = ((tok_BMD[:, :, None] == tok_BMD[:, None]) & valid_BMD[:, :, None]
          & valid_BMD[:, None])
    same_BMKD = _cumall(eq, axis=3)
    count_BMD = jnp.sum(same_BMKD, axis=2).astype(jnp.int32)
    before_MK = jnp.asarray(np.tri(m, k=-1, dtype=bool))        # k < i
    rep_BMD = valid_BMD & ~jnp.any(same_BMKD & before_MK[None, :, :, None], axis=2)
    total_B = jnp.maximum(jnp.sum(ok_BM, axis=1), 1)
    m_M = jnp.arange(m, dtype=jnp.int32)
    key_BMD = count_BMD * m + (m - 1 - m_M)[None, :, None]       # distinct per node
    # Siblings: nodes at the same depth with the same parent prefix.
    root_BMK = jnp.broadcast_to((ok_BM[:, :, None] & ok_BM[:, None])[..., None], (b, m, m, 1))
    sib_BMKD = jnp.concatenate([root_BMK, same_BMKD[..., :-1]], axis=3)
    better = sib_BMKD & rep_BMD[:, None] & (key_BMD[:, None] > key_BMD[:, :, None])
    rank_BMD = jnp.sum(better, axis=2)
    keep_BMD = (rep_BMD & (rank_BMD < self.max_children)
                & (count_BMD >= self.min_prob * total_B[:, None, None]))
    # A node needs its parent: the first occurrence sharing its prefix one shorter.
    parent_BMD = jnp.concatenate(
        [jnp.zeros((b, m, 1), jnp.int32),
         jnp.argmax(same_BMKD[..., :-1], axis=2).astype(jnp.int32)], axis=2)
    for d in range(1, d_):
      up = jnp.take_along_axis(keep_BMD[:, :, d - 1], parent_BMD[:, :, d], axis=1)
      keep_BMD = keep_BMD.at[:, :, d].set(keep_BMD[:, :, d] & up)
    # The best `nodes` by count (ties: shallower, then more recent) ...
    d_D = jnp.arange(d_, dtype=jnp.int32)
    score = count_BMD * (d_ * m) + (d_ - 1 - d_D)[None, None] * m + (m - 1 - m_M)[None, :, None]
    score_BF = jnp.where(keep_BMD, score, -1).reshape(b, m * d_)
    top_BN, f_BN = jax.lax.top_k(score_BF, n)
    # ... numbered by depth, then score (children tried in that order).
    span = (m + 1) * d_ * m
    order_BN = jnp.where(top_BN >= 0, (d_ - f_BN % d_) * span + top_BN, -1)
    _, perm_BN = jax.lax.top_k(order_BN, n)
    f_BN = jnp.take_along_axis(f_BN, perm_BN, axis=1)
    valid_BN = jnp.take_along_axis(top_BN, perm_BN, axis=1) >= 0
    tok_BN = jnp.take_along_axis(tok_BMD.reshape(b, m * d_), f_BN, axis=1)
    dep_BN = f_BN % d_
    pm_BN = jnp.take_along_axis(parent_BMD.reshape(b, m * d_), f_BN, axis=1)
    pf_BN = pm_BN * d_ + dep_BN - 1
    hit_BNN = f_BN[:, None, :] == pf_BN[:, :, None]
    par_BN = jnp.where((dep_BN > 0) & valid_BN, jnp.argmax(hit_BNN, axis=2) + 1, 0)
    return (jnp.where(valid_BN, tok_BN, 0).astype(jnp.int32), par_BN.astype(jnp.int32),
            valid_BN)

  def propose(self, params, state: LookupState, inp: DraftInput, u_BG, sampling,
              gamma: int) -> Tuple[Proposal, LookupState]:
    del u_BG, sampling, gamma
    hay_XS, starts_BM, match_B = self.match(params, state)
    tok_BN, par_BN, valid_BN = self.tree(hay_XS, starts_BM, match_B)
    b = tok_BN.shape[0]
    tokens_BT = jnp.concatenate([inp.pending_B[:, None].astype(jnp.int32), tok_BN], axis=1)
    parents_BT = jnp.concatenate([jnp.full((b, 1), -1, jnp.int32), par_BN], axis=1)
    valid_BT = jnp.concatenate([jnp.ones((b, 1), bool), valid_BN], axis=1)
    return Proposal(tokens_BT=tokens_BT, valid_BKN=None, node_valid_BT=valid_BT,
                    node_parents_BT=parents_BT), state
