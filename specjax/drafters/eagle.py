"""EAGLE heads (Li et al. 2024: EAGLE-1, EAGLE-2; 2025: EAGLE-3) as tree drafters.

An EAGLE head is one decoder layer that runs beside the target, one position behind it, on
*features*: its input at position t is the pair (f_t, x_{t+1}) (the target's feature at t and the
target's frozen embedding of the next token, fused by `fc: [2E] → E`) and its output predicts
f̂_{t+1}, which the target's frozen LM head turns into the draft distribution of x_{t+2}. Drafting
further, the head feeds on its own outputs: (f̂_{t+1}, d_{t+2}) → f̂_{t+2}, ...

  EAGLE-1  f_t = the target's final-normed state; logits = LM head(f̂).
  EAGLE-3  f_t = `fuse` of a low, a middle and a high target block's outputs
           (`EagleConfig.feature_layers`); logits = LM head(norm(f̂)).

The head keeps its own one-layer KV cache (`[B, S, H, D]`, slot t: the pair (f_t, x_{t+1})),
written from the target's prefill hidden states (`absorb`) and, after each verification, from
the target call's (`needs_hidden`): only keys and values, which with one layer depend on the
pair alone. Drafting runs level by level over a static `TokenTree` (EAGLE-1) or a per-row
`DynamicTree` (EAGLE-2; scores fall along a path, so a kept node's ancestors are kept), each
level in one head call attending to the cache and to the nodes' ancestors in a side buffer.

A block head (`EagleConfig.block` = K; DFlash, arXiv 2602.06036) drafts a static tree of depth
≤ K in ONE head call: the root pair and K-1 mask slots give every depth's draft distribution at
once, shared by that depth's nodes. Exact: a node's proposal distribution is the one its token was
drawn from, whatever it conditions on.

Shapes: B batch, S head-cache slots, H heads, D head dim, E target width, X the target's feature
width (E, or len(feature_layers) * E), N tree nodes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax._checks import check_int, check_probability
from specjax.checkpoints.heads import load_eagle_head
from specjax.drafting import (CallLayout, DraftFeedback, DraftInput, Drafter, Proposal,
                              check_head_params)
from specjax.models.eagle_head import (EagleConfig, attend, finish, fuse_features, head_logits,
                                       init_eagle, layer_params, mask_inputs, pair_inputs, qkv,
                                       shared_weights)
from specjax.models.padding import mask_padding
from specjax.parallel.rules import on_mesh
from specjax.protocol import check_tree
from specjax.tree import TokenTree, check_child_mode, draw_children

__all__ = ["Eagle", "EagleState", "DynamicTree", "load_eagle"]


@dataclasses.dataclass(frozen=True)
class DynamicTree:
  """EAGLE-2's dynamic tree: expand the `top_k` best nodes per level (top-k children each) to
  `depth` levels, then keep the best `nodes` candidates (root not counted): a call of `nodes + 1`
  tokens. `expand`: the sampled tree's nodes expanded per level (a divisor of top_k; 0: all top_k
  of them, one child each — `sampled_expansion`)."""

  top_k: int
  depth: int
  nodes: int
  expand: int = 0

  def __post_init__(self):
    check_int("top_k", self.top_k, 1)
    check_int("depth", self.depth, 1)
    check_int("nodes", self.nodes, 1)
    check_int("expand", self.expand, 0)
    if self.expand and self.top_k % self.expand:
      raise ValueError(f"expand ({self.expand}) must divide top_k ({self.top_k})")
    pool = self.top_k + (self.depth - 1) * self.top_k ** 2
    if self.nodes > pool:
      raise ValueError(f"nodes ({self.nodes}) exceeds the {pool} candidates of top_k "
                       f"{self.top_k} x depth {self.depth}")
    if self.nodes < self.depth:
      raise ValueError(f"nodes ({self.nodes}) must be >= depth ({self.depth}) to reach it")

  @property
  def pool(self) -> int:
    return self.top_k + (self.depth - 1) * self.top_k ** 2

  @property
  def sampled_expansion(self) -> Tuple[int, int]:
    """(m, c) of the sampled tree (children drawn at T > 0): each level after the root's expands
    its m best nodes with c children each, m * c = top_k; m = `expand`, by default top_k (c = 1:
    a second sampled sibling rarely is what the target samples; docs/drafters.md)."""
    m = self.expand or self.top_k
    return m, self.top_k // m


@struct.dataclass
class EagleState:
  """k_BSHD, v_BSHD: the head's cache (slot t: the pair (f_t, x_{t+1})), in the target's dtype;
  lengths_B: committed pairs (the pending token's position − 1); feat_BE: the head-space feature
  at the last committed position (the root pair's); root_B: the pending token the last proposal
  was rooted at; xk_LBSHD, xv_LBSHD: a block head's later layers' projections of the same pairs
  (`[num_layers - 1, B, S, H, D]`, empty for one layer)."""

  k_BSHD: jax.Array
  v_BSHD: jax.Array
  lengths_B: jax.Array
  feat_BE: jax.Array
  root_B: jax.Array
  xk_LBSHD: jax.Array
  xv_LBSHD: jax.Array


def _write(buf_BSHD, new_BTHD, start_B):
  return jax.vmap(lambda c, n, s: jax.lax.dynamic_update_slice(c, n.astype(c.dtype), (s, 0, 0)))(
      buf_BSHD, new_BTHD, start_B)


def _write_pairs(config: EagleConfig, hp, state: "EagleState", x_BTE, pos_BT, start_B):
  """Every layer's keys and values of the pairs `x_BTE` written at `start_B`."""
  _, k, v = qkv(config, hp, x_BTE, pos_BT)
  state = state.replace(k_BSHD=_write(state.k_BSHD, k, start_B),
                        v_BSHD=_write(state.v_BSHD, v, start_B))
  if config.num_layers > 1:
    xk, xv = [], []
    for i in range(1, config.num_layers):
      _, k, v = qkv(config, layer_params(hp, i), x_BTE, pos_BT)
      xk.append(_write(state.xk_LBSHD[i - 1], k, start_B))
      xv.append(_write(state.xv_LBSHD[i - 1], v, start_B))
    state = state.replace(xk_LBSHD=jnp.stack(xk), xv_LBSHD=jnp.stack(xv))
  return state


def _pinned(config: EagleConfig, state: "EagleState") -> "EagleState":
  """The state in its decode-loop layout (`rules.on_mesh`; no-op off a mesh): the cache by head
  for a split head, else by rows; the feature whole. Otherwise XLA carries the state out of the
  (split) prefill in a layout of its choosing: an all-reduce per head call for a replicated head."""
  cache = "BSHD" if config.split else "B___"
  return state.replace(k_BSHD=on_mesh(state.k_BSHD, cache), v_BSHD=on_mesh(state.v_BSHD, cache),
                       xk_LBSHD=on_mesh(state.xk_LBSHD, "L" + cache),
                       xv_LBSHD=on_mesh(state.xv_LBSHD, "L" + cache),
                       feat_BE=on_mesh(state.feat_BE, "B_"))


@functools.lru_cache(maxsize=16)
def _eagle_shapes(config: EagleConfig):
  return jax.eval_shape(lambda: init_eagle(config, jax.random.PRNGKey(0)))


@dataclasses.dataclass(frozen=True)
class Eagle(Drafter):
  """The EAGLE drafter: `config`, the `tree` (a static `TokenTree`, or a `DynamicTree` for
  EAGLE-2) and the `target` (a `DecoderLM`: its embedding and LM head are shared). Params:
  {"head": head params, "target": the target's params}.

  `children`: "top_k" (the head's most likely tokens, verified as one-hot proposals) or "iid" /
  "without" (drawn from the head's distribution after the target's temperature / top-k / top-p,
  with or without replacement among siblings, verified against those distributions:
  `specjax.tree.draw_children`); default (None): "without". On the dynamic tree the sampled modes
  fix each level's shape before its children are drawn (`DynamicTree.sampled_expansion`; a
  selection depending on the drawn tokens would bias them), so nodes <= top_k * depth. Exact in
  every mode; at T = 0 every mode makes the same decisions (docs/drafters.md).

  `stop_below` (a confidence stop, as HF's assisted generation's): a node's children are drafted
  only where the head's most likely token there has at least this probability (before
  temperature; 0: never stop); once no row continues, the remaining head levels are skipped.
  Exact: whether a node is drafted depends only on the tokens on its path, which are the
  committed ones wherever the verifier reaches it.

  With a static tree, `gamma="auto"` chooses each iteration's depth (γ ≤ the tree's depth; a
  chain `TokenTree.chain(D)` gives chains of every γ ≤ D); plain target steps (γ = 0) return the
  target's hidden state, from which `update` writes the pair, so the head can draft again."""

  config: EagleConfig
  tree: Any
  target: Any
  children: Optional[str] = None
  stop_below: float = 0.0

  uses_target_params = False
  needs_hidden = True
  needs_prompt_hidden = True
  reads_target_lm_head = True

  @property
  def splits_state(self) -> bool:
    """A head split like the target (`EagleConfig.split`) has its cache split by head."""
    return self.config.split

  def __post_init__(self):
    if not isinstance(self.tree, (TokenTree, DynamicTree)):
      raise TypeError(f"tree must be a TokenTree or a DynamicTree, got {self.tree!r}")
    if self.target is None:
      raise ValueError("Eagle needs the target (its embedding and LM head are shared)")
    if self.children is not None:
      check_child_mode("children", self.children)
    object.__setattr__(self, "stop_below", check_probability(
        "stop_below", self.stop_below, hi_open=True, note=" (0: no confidence stop)"))
    if isinstance(self.tree, DynamicTree) and self.child_mode != "top_k":
      most = self.tree.top_k * self.tree.depth
      if self.tree.nodes > most:
        raise ValueError(f"children={self.child_mode!r}: the sampled dynamic tree draws top_k x "
                         f"depth = {most} nodes at T > 0, fewer than nodes={self.tree.nodes} "
                         f"(use nodes <= {most}, or children='top_k')")
    if self.config.block:
      if not isinstance(self.tree, TokenTree):
        raise ValueError(f"a block head (EagleConfig.block={self.config.block}) drafts a static "
                         f"TokenTree in one call; got {self.tree!r}")
      if self.tree.depth > self.config.block:
        raise ValueError(f"tree depth {self.tree.depth} exceeds the block head's "
                         f"{self.config.block} slots (EagleConfig.block)")

  @property
  def deterministic(self) -> bool:
    return self.child_mode == "top_k"

  @property
  def adaptive(self) -> bool:
    """A static tree: γ chooses its depth (`gamma="auto"`, class doc)."""
    return isinstance(self.tree, TokenTree)

  @property
  def gamma_limit(self) -> int:
    return self.tree.depth

  def _tree(self, gamma: int):
    """The tree drafted at γ: a static tree's nodes at most γ deep."""
    if isinstance(self.tree, TokenTree):
      return self.tree.truncated(gamma)
    return self.tree

  @property
  def child_mode(self) -> str:
    """`children`, or its default: "without" (sampled at T > 0)."""
    return "without" if self.children is None else self.children

  @property
  def hidden_layers(self) -> Optional[Tuple[int, ...]]:
    return self.config.feature_layers or None

  def check_params(self, params: Any) -> None:
    check_head_params(params, ("head", "target"), "load_eagle", self.target)
    check_tree(_eagle_shapes(self.config), params["head"], "draft_params['head']",
               "the EAGLE head (init_eagle")

  @property
  def fixed_gamma(self) -> int:
    return self.tree.depth

  @property
  def num_nodes(self) -> int:
    """Tokens in a target call (root included)."""
    return self.tree.size if isinstance(self.tree, TokenTree) else self.tree.nodes + 1

  def check(self, target: Any, gamma: int) -> None:
    c = self.config
    if c.vocab_size != target.vocab_size:
      raise ValueError(f"the head's vocab_size ({c.vocab_size}) must equal the target's "
                       f"({target.vocab_size})")
    width = getattr(getattr(target, "config", None), "d_model", None)
    if width != c.d_model:
      raise ValueError(f"the head works at width {c.d_model}; the target's d_model is {width}")
    if not hasattr(target, "prefill_with_hidden"):
      raise TypeError(f"EAGLE needs the target's hidden states over the prompt "
                      f"(prefill_with_hidden); {type(target).__name__} has none")
    if c.feature_layers:
      target.check_layers(c.feature_layers)

  def layout(self, gamma: int) -> CallLayout:
    if isinstance(self.tree, TokenTree):
      return self._tree(gamma).layout()
    return CallLayout.dynamic(self.tree.nodes + 1, self.tree.depth, self.tree.top_k)

  def calls_per_iteration(self, gamma: int) -> int:
    if not gamma:   # a plain step of an adaptive loop: `update` writes the pair
      return 0
    return 1 if self.config.block else self._tree(gamma).depth

  def alloc(self, batch_size: int, prompt_len: int, cache_len: int, gamma: int) -> EagleState:
    c = self.config
    shape = (batch_size, cache_len, c.num_heads, c.head_dim)
    extra = (c.num_layers - 1,) + shape
    # Keys and values stored in the target's dtype (bf16: half the bytes per head call read);
    # computed in float32.
    kv = jnp.dtype(self.target.config.dtype)
    return EagleState(k_BSHD=jnp.zeros(shape, kv), v_BSHD=jnp.zeros(shape, kv),
                      lengths_B=jnp.zeros((batch_size,), jnp.int32),
                      feat_BE=jnp.zeros((batch_size, c.d_model), jnp.float32),
                      root_B=jnp.zeros((batch_size,), jnp.int32),
                      xk_LBSHD=jnp.zeros(extra, kv), xv_LBSHD=jnp.zeros(extra, kv))

  def absorb(self, params, state: EagleState, prompts_BP, lengths_B, start,
             hidden_BCX) -> EagleState:
    """Writes the pairs (f_t, x_{t+1}) of prompt positions t = start .. start + C - 1 at slots t
    and keeps the feature at each row's last prompt position. (The last position's pair takes a
    stand-in token: it lies at or past `lengths - 1` and is overwritten before it is read.)"""
    c, hp = self.config, params["head"]
    emb, _ = shared_weights(self.target, params["target"])
    feats_BCE = fuse_features(c, hp, hidden_BCX)
    b, n = feats_BCE.shape[:2]
    pos_C = start + jnp.arange(n, dtype=jnp.int32)
    prompts_BP = mask_padding(prompts_BP, lengths_B)   # the stand-in: a valid id, never padding's
    next_BC = jnp.take(prompts_BP, jnp.minimum(pos_C + 1, prompts_BP.shape[1] - 1), axis=1)
    x = pair_inputs(c, hp, emb, feats_BCE, next_BC)
    state = _write_pairs(c, hp, state, x, jnp.broadcast_to(pos_C[None], (b, n)),
                         jnp.full((b,), start, jnp.int32))
    at_B = lengths_B.astype(jnp.int32) - 1 - start
    last_BE = jnp.take_along_axis(feats_BCE, jnp.clip(at_B, 0, n - 1)[:, None, None], axis=1)
    inside_B = (at_B >= 0) & (at_B < n)
    state = state.replace(feat_BE=jnp.where(inside_B[:, None], last_BE[:, 0], state.feat_BE))
    return _pinned(c, state)

  def start(self, params, state: EagleState, prompts_BP, lengths_B, first_B,
            target_cache) -> EagleState:
    """The state `absorb` left, its length the prompt's pairs (lengths - 1)."""
    del params, prompts_BP, target_cache
    return state.replace(lengths_B=lengths_B.astype(jnp.int32) - 1,
                         root_B=first_B.astype(jnp.int32))

  def _level(self, params, state, feats_BTE, tokens_BT, side_k, side_v, *, depth, slots,
             anc_BTM):
    """One tree level: T nodes at depth `depth` (positions lengths + depth), written at side
    `slots`, through the head, attending to its cache and to the side slots `anc_BTM` marks
    (ancestors and self). → (outputs `[B, T, E]`, log-probs `[B, T, V]`, side_k, side_v)."""
    c, hp = self.config, params["head"]
    emb, lm = shared_weights(self.target, params["target"])
    x = pair_inputs(c, hp, emb, feats_BTE, tokens_BT)
    pos = jnp.broadcast_to((state.lengths_B + depth)[:, None], tokens_BT.shape)
    q, k, v = qkv(c, hp, x, pos)
    side_k = side_k.at[:, slots].set(k)
    side_v = side_v.at[:, slots].set(v)
    att = attend(c, q, [_cache_source(state), (side_k, side_v, anc_BTM)])
    out = finish(c, hp, x, att)
    logp = jax.nn.log_softmax(head_logits(c, hp, lm, out), axis=-1)
    return out, logp, side_k, side_v

  def _block(self, params, state, pending_B, depth: int) -> jax.Array:
    """A block head's one call: the root pair and `depth - 1` mask slots at positions lengths + j,
    causal within the block → log-probs `[B, depth, V]` (slot j: the tree's depth j + 1)."""
    c, hp = self.config, params["head"]
    emb, lm = shared_weights(self.target, params["target"])
    b = pending_B.shape[0]
    root = pair_inputs(c, hp, emb, state.feat_BE[:, None], pending_B[:, None].astype(jnp.int32))
    x = jnp.concatenate([root, mask_inputs(hp, (b, depth - 1))], axis=1)
    pos = state.lengths_B[:, None] + jnp.arange(depth, dtype=jnp.int32)[None]
    causal = np.tril(np.ones((depth, depth), bool))[None]
    k_c, v_c, mask = _cache_source(state)
    for i in range(c.num_layers):   # later layers read their own projections of the pairs
      p = layer_params(hp, i)
      if i:
        k_c, v_c = state.xk_LBSHD[i - 1], state.xv_LBSHD[i - 1]
      q, k, v = qkv(c, p, x, pos)
      x = finish(c, p, x, attend(c, q, [(k_c, v_c, mask), (k, v, causal)]))
    return jax.nn.log_softmax(head_logits(c, hp, lm, x), axis=-1)

  def propose(self, params, state: EagleState, inp: DraftInput, u_BT, sampling,
              gamma: int) -> Tuple[Proposal, EagleState]:
    state = state.replace(root_B=inp.pending_B.astype(jnp.int32))
    if isinstance(self.tree, TokenTree):
      return self._propose_static(params, state, inp, u_BT, sampling, gamma), state
    if self.child_mode == "top_k" or sampling.is_greedy:
      return self._propose_dynamic(params, state, inp), state
    return self._propose_dynamic_sampled(params, state, inp, u_BT, sampling), state

  def _side(self, b, m):
    c = self.config
    z = jnp.zeros((b, m, c.num_heads, c.head_dim), jnp.float32)
    return z, z

  def _propose_static(self, params, state: EagleState, inp: DraftInput, u_BT, sampling,
                      gamma: int) -> Proposal:
    tree = self._tree(gamma)
    b, n = inp.pending_B.shape[0], tree.size
    parents = np.asarray(tree.parents)
    depths, anc = tree.depths, tree.ancestor_mask
    kids = tree.children
    tokens = [None] * n
    tokens[0] = inp.pending_B.astype(jnp.int32)
    valid = [jnp.ones((b,), bool)] * n
    probs = [None] * n
    feats = {0: state.feat_BE}   # the feature each node's pair carries
    block = (self._block(params, state, inp.pending_B, tree.depth) if self.config.block
             else None)
    side_k, side_v = self._side(b, n) if block is None else (None, None)
    for d in range(tree.depth):
      idx = [i for i in range(n) if depths[i] == d and (parents == i).any()]
      if not idx:
        continue
      if block is None:
        f = jnp.stack([feats[i] for i in idx], axis=1)
        t = jnp.stack([tokens[i] for i in idx], axis=1)
        mask = jnp.broadcast_to(jnp.asarray(anc[idx])[None], (b, len(idx), n))
        level = functools.partial(self._level, params, state, depth=d,
                                  slots=np.asarray(idx), anc_BTM=mask)
        if d and self.stop_below:   # the level runs only while a row still drafts
          go = jnp.any(jnp.stack([valid[i] for i in idx]))
          shapes = jax.eval_shape(level, f, t, side_k, side_v)
          out, logp, side_k, side_v = jax.lax.cond(
              go, level, lambda *a: jax.tree_util.tree_map(
                  lambda x: jnp.zeros(x.shape, x.dtype), shapes[:2]) + a[2:],
              f, t, side_k, side_v)
        else:
          out, logp, side_k, side_v = level(f, t, side_k, side_v)
      for j, i in enumerate(idx):
        cs = [int(c) for c in kids[i] if c >= 0]
        logp_BV = block[:, d] if block is not None else logp[:, j]
        tok_BR, p_BRV, ok_BR = draw_children(
            logp_BV, sampling, len(cs), None if u_BT is None else u_BT[:, cs], self.child_mode)
        go_B = valid[i]   # a node's children only below a drafted node
        if self.stop_below:
          go_B = go_B & (jnp.max(logp_BV, axis=-1) >= np.log(self.stop_below))
        for r, child in enumerate(cs):
          tokens[child] = tok_BR[:, r]
          if block is None:
            feats[child] = out[:, j]
          valid[child] = ok_BR[:, r] & go_B
          if p_BRV is not None:
            probs[child] = p_BRV[:, r]
    tokens_BT = jnp.stack(tokens, axis=1)
    node_probs = None
    if probs[1] is not None:   # sampled children (at T > 0)
      probs[0] = jnp.zeros_like(probs[1])
      node_probs = jnp.stack(probs, axis=1)
    return Proposal(tokens_BT=tokens_BT, valid_BKN=None, node_valid_BT=jnp.stack(valid, axis=1),
                    node_probs_BTV=node_probs)

  def _root_level(self, params, state: EagleState, inp: DraftInput, slots: int):
    """A dynamic tree's level 0: the root through the head at side slot 0 of `slots` (`_level`)."""
    b = inp.pending_B.shape[0]
    side_k, side_v = self._side(b, slots)
    first = np.eye(slots, dtype=bool)[:1]
    return self._level(params, state, state.feat_BE[:, None],
                       inp.pending_B[:, None].astype(jnp.int32), side_k, side_v, depth=0,
                       slots=np.array([0]), anc_BTM=jnp.broadcast_to(first[None], (b, 1, slots)))

  def _propose_dynamic(self, params, state: EagleState, inp: DraftInput) -> Proposal:
    dt = self.tree
    k, depth = dt.top_k, dt.depth
    b = inp.pending_B.shape[0]
    m = 1 + (depth - 1) * k                     # expanded nodes (side slots)
    eye = jnp.eye(m, dtype=bool)
    out, logp, side_k, side_v = self._root_level(params, state, inp, m)
    top_lp, top_tok = jax.lax.top_k(logp[:, 0], k)               # [B, k]
    pool_tok, pool_score = [top_tok], [top_lp]
    pool_parent = [jnp.full((b, k), -1, jnp.int32)]               # pool index, -1: root
    # The current level's candidates: pool indices, their parent's output and side ancestors.
    lvl_base = 0                                                 # pool index of the level's first
    lvl_feat = jnp.broadcast_to(out[:, :1], (b, k, out.shape[-1]))
    lvl_anc = jnp.broadcast_to(eye[0][None, None], (b, k, m))   # their parents' ancestors
    lvl_score, lvl_tok = top_lp, top_tok
    base = k
    for d in range(1, depth):
      # Expand the level's k best candidates (at d = 1: all k of them).
      best_s, pick = jax.lax.top_k(lvl_score, k)                  # [B, k]
      take = lambda a: jnp.take_along_axis(a, pick.reshape(b, k, *([1] * (a.ndim - 2))),
                                           axis=1)
      feats, toks, anc = take(lvl_feat), take(lvl_tok), take(lvl_anc)
      # The picked candidates' pool indices (consecutive from `lvl_base`): arithmetic, not a
      # gather from a broadcast iota, which libtpu's gather simplification mis-shapes.
      pidx = lvl_base + pick.astype(jnp.int32)
      slots = 1 + (d - 1) * k + np.arange(k)
      anc = anc | np.eye(m, dtype=bool)[slots][None]   # host-side rows: no gather
      out, logp, side_k, side_v = self._level(params, state, feats, toks, side_k, side_v,
                                              depth=d, slots=slots, anc_BTM=anc)
      c_lp, c_tok = jax.lax.top_k(logp, k)                         # [B, k, k]
      c_score = (best_s[:, :, None] + c_lp).reshape(b, k * k)
      pool_tok.append(c_tok.reshape(b, k * k))
      pool_score.append(c_score)
      pool_parent.append(jnp.repeat(pidx, k, axis=1))
      lvl_base = base
      lvl_feat = jnp.repeat(out, k, axis=1)
      lvl_anc = jnp.repeat(anc, k, axis=1)
      lvl_score, lvl_tok = c_score, c_tok.reshape(b, k * k)
      base += k * k
    tok_BP = jnp.concatenate(pool_tok, axis=1).astype(jnp.int32)
    score_BP = jnp.concatenate(pool_score, axis=1)
    parent_BP = jnp.concatenate(pool_parent, axis=1)
    # The best `nodes` candidates, in pool order (parents before children).
    _, sel = jax.lax.top_k(score_BP, dt.nodes)
    sel = jnp.sort(sel, axis=1)
    tok_sel = jnp.take_along_axis(tok_BP, sel, axis=1)
    par_pool = jnp.take_along_axis(parent_BP, sel, axis=1)           # [B, nodes]
    match = par_pool[:, :, None] == sel[:, None, :]                 # parent's place in sel
    par_node = jnp.where(par_pool < 0, 0, jnp.argmax(match, axis=2) + 1)
    found = (par_pool < 0) | jnp.any(match, axis=2)
    parents_BT = jnp.concatenate([jnp.full((b, 1), -1, jnp.int32),
                                  par_node.astype(jnp.int32)], axis=1)
    tokens_BT = jnp.concatenate([inp.pending_B[:, None].astype(jnp.int32), tok_sel], axis=1)
    valid_BT = jnp.concatenate([jnp.ones((b, 1), bool), found], axis=1)
    return Proposal(tokens_BT=tokens_BT, valid_BKN=None, node_valid_BT=valid_BT,
                    node_parents_BT=parents_BT)

  def _propose_dynamic_sampled(self, params, state: EagleState, inp: DraftInput, u_BT,
                               sampling) -> Proposal:
    """EAGLE-2's tree with sampled children (T > 0): the root draws top_k children; each later
    level expands its m best nodes by path log-probability with c children each
    (`DynamicTree.sampled_expansion`); every drawn child is kept, those past `nodes` dropped. A
    node's number of children is fixed before they are drawn (it depends only on the tokens of
    its level and above), so recursive rejection sampling stays exact."""
    dt = self.tree
    k, depth = dt.top_k, dt.depth
    m, c = dt.sampled_expansion
    b = inp.pending_B.shape[0]
    slots = 1 + (depth - 1) * m                 # expanded nodes (side slots)
    eye = np.eye(slots, dtype=bool)
    out, logp, side_k, side_v = self._root_level(params, state, inp, slots)
    u = jnp.pad(u_BT, ((0, 0), (0, 1 + k * depth - u_BT.shape[1])))   # dropped nodes: zeros
    tok, prob, ok = draw_children(logp[:, 0], sampling, k, u[:, 1:1 + k], self.child_mode)
    score = jnp.take_along_axis(logp[:, 0], tok, axis=1)
    toks, probs, oks = [tok], [prob], [ok]
    parents = [jnp.zeros((b, k), jnp.int32)]
    lvl_feat = jnp.broadcast_to(out[:, :1], (b, k, out.shape[-1]))
    lvl_anc = jnp.broadcast_to(eye[0][None, None], (b, k, slots))
    first = 1                                    # node index of the level's first node
    for d in range(1, depth):
      # The level's m best nodes (invalid ones last), expanded by one head call.
      _, pick = jax.lax.top_k(jnp.where(ok, score, -jnp.inf), m)
      take = lambda a: jnp.take_along_axis(a, pick.reshape(b, m, *([1] * (a.ndim - 2))), axis=1)
      feats, ptok, anc, pscore = take(lvl_feat), take(tok), take(lvl_anc), take(score)
      rows = 1 + (d - 1) * m + np.arange(m)
      anc = anc | eye[rows][None]
      out, logp, side_k, side_v = self._level(params, state, feats, ptok, side_k, side_v,
                                              depth=d, slots=rows, anc_BTM=anc)
      at = first + k                             # node index of this new level's first node
      pok = take(ok)                             # an invalid node's children are invalid
      t_, p_, o_ = [], [], []
      for j in range(m):
        tj, pj, oj = draw_children(logp[:, j], sampling, c, u[:, at + j * c:at + (j + 1) * c],
                                   self.child_mode)
        t_.append(tj), p_.append(pj), o_.append(oj & pok[:, j:j + 1])
      tok = jnp.concatenate(t_, axis=1)
      prob, ok = jnp.concatenate(p_, axis=1), jnp.concatenate(o_, axis=1)
      score = jnp.repeat(pscore, c, axis=1) + jnp.take_along_axis(
          jnp.repeat(logp, c, axis=1), tok[..., None], axis=2)[..., 0]
      parents.append(jnp.repeat(first + pick.astype(jnp.int32), c, axis=1))
      toks.append(tok), probs.append(prob), oks.append(ok)
      lvl_feat, lvl_anc = jnp.repeat(out, c, axis=1), jnp.repeat(anc, c, axis=1)
      first = at
    fit = lambda parts: jnp.concatenate(parts, axis=1)[:, :dt.nodes]   # nodes <= k * depth
    root_prob = jnp.zeros((b, 1, prob.shape[-1]), prob.dtype)
    return Proposal(
        tokens_BT=jnp.concatenate([inp.pending_B[:, None].astype(jnp.int32), fit(toks)], 1),
        valid_BKN=None, node_valid_BT=jnp.concatenate([jnp.ones((b, 1), bool), fit(oks)], 1),
        node_probs_BTV=jnp.concatenate([root_prob, fit(probs)], 1),
        node_parents_BT=jnp.concatenate([jnp.full((b, 1), -1, jnp.int32), fit(parents)], 1))

  def update(self, params, state: EagleState, feedback: DraftFeedback) -> EagleState:
    c, hp = self.config, params["head"]
    emb, _ = shared_weights(self.target, params["target"])
    f_BCE = fuse_features(c, hp, feedback.target_hidden_BCX)       # root, accepted...
    # Pairs at slots lengths + j: (f_root-1, root), (f_root, a_1), ..., (f_{a_{C-2}}, a_{C-1}).
    feats = jnp.concatenate([state.feat_BE[:, None], f_BCE[:, :-1]], axis=1)
    toks = jnp.concatenate([state.root_B[:, None], feedback.committed_BC[:, :-1]], axis=1)
    x = pair_inputs(c, hp, emb, feats, toks)
    pos = state.lengths_B[:, None] + jnp.arange(x.shape[1], dtype=jnp.int32)[None]
    moved = feedback.count_B > 0
    last = jnp.take_along_axis(f_BCE, feedback.accepted_B[:, None, None], axis=1)[:, 0]
    # The next root is the new pending token (also after an adaptive loop's plain step).
    return _write_pairs(c, hp, state, x, pos, state.lengths_B).replace(
        lengths_B=jnp.where(moved, feedback.seq_len_B - 1, state.lengths_B),
        feat_BE=jnp.where(moved[:, None], last, state.feat_BE),
        root_B=jnp.where(moved, feedback.pending_B.astype(jnp.int32), state.root_B))


def _cache_source(state: EagleState):
  """The head's cache as an `attend` source: slots below each row's length."""
  s = state.k_BSHD.shape[1]
  mask = (jnp.arange(s)[None, :] < state.lengths_B[:, None])[:, None, :]
  return state.k_BSHD, state.v_BSHD, mask


def load_eagle(directory: str, target, target_params, tree) -> Tuple[Eagle, Dict[str, Any]]:
  """(drafter, draft params) from a trained head (`<directory>/final` of
  `experiments/train_drafter.py`); `tree`: a `TokenTree` or `DynamicTree`."""
  config, params = load_eagle_head(directory)
  return Eagle(config, tree, target), {"head": params, "target": target_params}
