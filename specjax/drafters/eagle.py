"""EAGLE heads (Li et al. 2024: EAGLE-1, EAGLE-2; 2025: EAGLE-3) as tree drafters.

An EAGLE head is one decoder layer that runs beside the target, one
position behind it, on *features* instead of tokens. The head's input at
position t is the pair (f_t, x_{t+1}) — the target's feature at t and the
embedding of the token after it (the target's frozen embedding), fused by
a linear layer `fc: [2E] → E` — and its output is a prediction of the next
feature f̂_{t+1}; the target's frozen LM head turns it into the draft
distribution of x_{t+2}. Drafting further, the head feeds on its own
outputs: (f̂_{t+1}, d_{t+2}) → f̂_{t+2}, ...

  EAGLE-1  f_t = the target's final-normed state; logits = LM head(f̂);
           trained with a feature regression (smooth L1) plus cross-entropy
           against the target's own distribution, with feature noise.
  EAGLE-3  f_t = `fuse` of the outputs of a low, a middle and a high target
           block (`EagleConfig.feature_layers`); logits = LM head(norm(f̂));
           no feature loss; "training-time test": the head is unrolled on
           its own outputs for several steps during training.

The head keeps its own KV cache (one layer, `[B, S, H, D]`) over the
committed pairs (slot t holds the pair (f_t, x_{t+1})); the prompt's pairs
are written from the target's prefill hidden states (`needs_prompt_hidden`),
the accepted ones after each verification from the hidden states the target
call returns (`needs_hidden`) — only keys and values: with one layer they
depend on the pair alone.

Drafting: level by level over a token tree, every node of a level in one
head call that attends to the head's cache and to the node's ancestors
(kept in a side buffer, never in the cache). Children are the parent's
top-ranked tokens (deterministic, verified as one-hot proposals: exact
for any sampling). Two tree rules:

  * a static `TokenTree` (EAGLE-1: a chain `TokenTree.chain(γ)` or any
    tree; node = the parent's i-th ranked token);
  * `DynamicTree(k, depth, nodes)` (EAGLE-2): expand the k nodes of best
    cumulative draft confidence (product of the head's probabilities along
    the path) at each level, top-k children each, then keep the `nodes`
    best of all candidates (scores fall along a path, so a kept node's
    ancestors are kept) — each row its own tree, in-graph.

Shapes: B batch, S head-cache slots, H heads, D head dim, E target width,
X the target's feature width (E, or len(feature_layers) * E), N tree nodes.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.drafters.base import CallLayout, DraftFeedback, DraftInput, Proposal
from specjax.models.layers import apply_rope
from specjax.tree import TokenTree

__all__ = ["EagleConfig", "Eagle", "EagleState", "DynamicTree", "init_eagle", "pair_inputs",
           "head_logits", "fuse_features", "load_eagle"]


def _pos_int(name, v, minimum=1):
  if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}, got {v!r}")


@dataclasses.dataclass(frozen=True)
class EagleConfig:
  """The head's shape.

  Attributes:
    d_model: E, the target's width (the head works at the same width).
    vocab_size: V, the target's vocabulary (embedding and LM head shared).
    num_heads, head_dim, mlp_dim: the head layer's attention and SwiGLU.
    feature_layers: () for EAGLE-1 (the target's final-normed state), or
      the target blocks whose outputs are fused (EAGLE-3: low, middle, high).
    rope_theta, norm_eps: as the target's.
  """

  d_model: int
  vocab_size: int
  num_heads: int = 4
  head_dim: int = 0
  mlp_dim: int = 0
  feature_layers: Tuple[int, ...] = ()
  rope_theta: float = 10000.0
  norm_eps: float = 1e-6

  def __post_init__(self):
    for name in ("d_model", "vocab_size", "num_heads"):
      _pos_int(name, getattr(self, name))
    if not self.head_dim:
      if self.d_model % self.num_heads:
        raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads "
                         f"({self.num_heads}) when head_dim is not given")
      object.__setattr__(self, "head_dim", self.d_model // self.num_heads)
    if not self.mlp_dim:
      object.__setattr__(self, "mlp_dim", 4 * self.d_model)
    _pos_int("head_dim", self.head_dim)
    _pos_int("mlp_dim", self.mlp_dim)
    layers = tuple(self.feature_layers)
    for i in layers:
      _pos_int("feature_layers entries", i, minimum=0)
    object.__setattr__(self, "feature_layers", tuple(int(i) for i in layers))

  @property
  def version(self) -> int:
    """1 (final-state features) or 3 (fused multi-layer features)."""
    return 3 if self.feature_layers else 1

  @property
  def feature_width(self) -> int:
    """X: the width of what the target hands the head per position."""
    return self.d_model * max(len(self.feature_layers), 1)

  def num_params(self) -> int:
    e, hd, f = self.d_model, self.num_heads * self.head_dim, self.mlp_dim
    n = 2 * e * e + 4 * e * hd + 3 * e * f + 2 * e
    if self.version == 3:
      n += self.feature_width * e + e
    return n


def init_eagle(config: EagleConfig, key: jax.Array) -> Dict[str, jax.Array]:
  """Fresh head parameters (float32). `fc` starts as [identity; 0]-ish plus
  noise so that a fresh head passes the feature through."""
  e, hd, f = config.d_model, config.num_heads * config.head_dim, config.mlp_dim
  ks = jax.random.split(key, 8)
  normal = lambda k, shape, fan_in: jax.random.normal(k, shape, jnp.float32) * fan_in ** -0.5
  params = {
      "fc": normal(ks[0], (2 * e, e), 2 * e),
      "attn_norm": jnp.ones((e,), jnp.float32),
      "q": normal(ks[1], (e, hd), e), "k": normal(ks[2], (e, hd), e),
      "v": normal(ks[3], (e, hd), e), "o": jnp.zeros((hd, e), jnp.float32),
      "mlp_norm": jnp.ones((e,), jnp.float32),
      "gate": normal(ks[4], (e, f), e), "up": normal(ks[5], (e, f), e),
      "down": jnp.zeros((f, e), jnp.float32),
  }
  params["fc"] = params["fc"] * 0.1 + jnp.concatenate(
      [jnp.eye(e, dtype=jnp.float32), jnp.zeros((e, e), jnp.float32)], axis=0)
  if config.version == 3:
    x = config.feature_width
    params["fuse"] = normal(ks[6], (x, e), x)
    params["out_norm"] = jnp.ones((e,), jnp.float32)
  return params


def _rms(x, scale, eps):
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def shared_weights(target, target_params) -> Tuple[jax.Array, jax.Array]:
  """(embedding `[V, E]`, LM head `[E, V]`) of a decoder target (frozen, shared)."""
  emb = target_params["embed"]["embedding"]
  if getattr(target.config, "tie_embeddings", False):
    return emb, emb.T
  return emb, target_params["lm_head"]["kernel"]


def fuse_features(config: EagleConfig, params, feats_xX: jax.Array) -> jax.Array:
  """The target's per-position features `[..., X]` → the head's `[..., E]`."""
  feats = feats_xX.astype(jnp.float32)
  if config.version == 3:
    return feats @ params["fuse"]
  return feats


def pair_inputs(params, embedding_VE, feat_xE: jax.Array, tokens_x: jax.Array) -> jax.Array:
  """The head's input for pairs (feature, next token) → `[..., E]`."""
  emb = jnp.take(embedding_VE, tokens_x, axis=0).astype(jnp.float32)
  return jnp.concatenate([feat_xE.astype(jnp.float32), emb], axis=-1) @ params["fc"]


def _qkv(config: EagleConfig, params, x_BTE, positions_BT):
  b, t = x_BTE.shape[:2]
  h = _rms(x_BTE, params["attn_norm"], config.norm_eps)
  shape = (b, t, config.num_heads, config.head_dim)
  q = apply_rope((h @ params["q"]).reshape(shape), positions_BT, config.rope_theta)
  k = apply_rope((h @ params["k"]).reshape(shape), positions_BT, config.rope_theta)
  return q, k, (h @ params["v"]).reshape(shape)


def _attend(config: EagleConfig, q_BTHD, sources, diag=()):
  """Softmax attention of `q_BTHD` over several key/value sources at once.

  sources: (k_BSHD, v_BSHD, mask) with mask broadcastable to `[B, T, S]`;
  diag: (k_BTHD, v_BTHD) pairs each query t also attends to at its own
  index t (training-time test: the same base position's later steps)."""
  scale = config.head_dim ** -0.5
  logits, values = [], []
  for k, v, mask in sources:
    s = jnp.einsum("bthd,bshd->bhts", q_BTHD, k) * scale
    logits.append(jnp.where(jnp.asarray(mask)[:, None], s, -1e30))
    values.append(("full", v))
  for k, v in diag:
    logits.append(jnp.einsum("bthd,bthd->bht", q_BTHD, k)[..., None] * scale)
    values.append(("diag", v))
  w = jax.nn.softmax(jnp.concatenate(logits, axis=-1), axis=-1)
  out, at = 0.0, 0
  for (kind, v), s in zip(values, logits):
    n = s.shape[-1]
    part = w[..., at:at + n]
    at += n
    if kind == "full":
      out = out + jnp.einsum("bhts,bshd->bthd", part, v)
    else:
      out = out + part[..., 0].transpose(0, 2, 1)[..., None] * v
  return out


def _finish(config: EagleConfig, params, x_BTE, att_BTHD):
  """The layer after attention: output projection, residual, SwiGLU MLP."""
  b, t = x_BTE.shape[:2]
  x = x_BTE + att_BTHD.reshape(b, t, -1) @ params["o"]
  h = _rms(x, params["mlp_norm"], config.norm_eps)
  return x + (jax.nn.silu(h @ params["gate"]) * (h @ params["up"])) @ params["down"]


def head_logits(config: EagleConfig, params, lm_head_EV, out_xE: jax.Array) -> jax.Array:
  """The head's outputs (predicted features) → float32 draft logits."""
  if config.version == 3:
    out_xE = _rms(out_xE, params["out_norm"], config.norm_eps)
  return (out_xE.astype(jnp.float32) @ lm_head_EV.astype(jnp.float32)).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class DynamicTree:
  """EAGLE-2's dynamic tree: expand the `top_k` best nodes per level (top-k
  children each) to `depth` levels, then keep the best `nodes` candidates
  (the root not counted). Static shape: a call of `nodes + 1` tokens."""

  top_k: int
  depth: int
  nodes: int

  def __post_init__(self):
    _pos_int("top_k", self.top_k)
    _pos_int("depth", self.depth)
    _pos_int("nodes", self.nodes)
    pool = self.top_k + (self.depth - 1) * self.top_k ** 2
    if self.nodes > pool:
      raise ValueError(f"nodes ({self.nodes}) exceeds the {pool} candidates of top_k "
                       f"{self.top_k} x depth {self.depth}")
    if self.nodes < self.depth:
      raise ValueError(f"nodes ({self.nodes}) must be >= depth ({self.depth}) to reach it")

  @property
  def pool(self) -> int:
    return self.top_k + (self.depth - 1) * self.top_k ** 2


@struct.dataclass
class EagleState:
  """k_BSHD, v_BSHD: the head's cache (slot t: the pair (f_t, x_{t+1}));
  lengths_B: committed pairs (the pending token's position − 1);
  feat_BE: the head-space feature at the last committed position (the
  root pair's feature); root_B: the pending token the last proposal was
  rooted at."""

  k_BSHD: jax.Array
  v_BSHD: jax.Array
  lengths_B: jax.Array
  feat_BE: jax.Array
  root_B: jax.Array


def _write(buf_BSHD, new_BTHD, start_B):
  return jax.vmap(lambda c, n, s: jax.lax.dynamic_update_slice(c, n.astype(c.dtype), (s, 0, 0)))(
      buf_BSHD, new_BTHD, start_B)


@dataclasses.dataclass(frozen=True)
class Eagle:
  """The EAGLE drafter: `config`, the `tree` (a static `TokenTree`, or a
  `DynamicTree` for EAGLE-2) and the `target` (a `DecoderLM`: its
  embedding and LM head are shared). Params: {"head": head params,
  "target": the target's params}."""

  config: EagleConfig
  tree: Any
  target: Any

  deterministic = True
  uses_target_params = False
  needs_hidden = True
  needs_prompt_hidden = True

  def __post_init__(self):
    if not isinstance(self.tree, (TokenTree, DynamicTree)):
      raise TypeError(f"tree must be a TokenTree or a DynamicTree, got {self.tree!r}")
    if self.target is None:
      raise ValueError("Eagle needs the target (its embedding and LM head are shared)")

  @property
  def hidden_layers(self) -> Optional[Tuple[int, ...]]:
    return self.config.feature_layers or None

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
      return self.tree.layout()
    return CallLayout.dynamic(self.tree.nodes + 1, self.tree.depth, self.tree.top_k)

  def calls_per_iteration(self, gamma: int) -> int:
    return self.tree.depth

  def alloc(self, batch_size: int, prompt_len: int, cache_len: int, gamma: int) -> EagleState:
    c = self.config
    shape = (batch_size, cache_len, c.num_heads, c.head_dim)
    return EagleState(k_BSHD=jnp.zeros(shape, jnp.float32), v_BSHD=jnp.zeros(shape, jnp.float32),
                      lengths_B=jnp.zeros((batch_size,), jnp.int32),
                      feat_BE=jnp.zeros((batch_size, c.d_model), jnp.float32),
                      root_B=jnp.zeros((batch_size,), jnp.int32))

  def start(self, params, state: EagleState, prompts_BP, lengths_B, first_B, target_cache,
            prompt_hidden_BPX=None) -> EagleState:
    if prompt_hidden_BPX is None:
      raise ValueError("Eagle.start needs the prompt's hidden states (prompt_hidden_BPX)")
    c, hp = self.config, params["head"]
    emb, _ = shared_weights(self.target, params["target"])
    feats_BPE = fuse_features(c, hp, prompt_hidden_BPX)
    p = prompts_BP.shape[1]
    lengths_B = lengths_B.astype(jnp.int32)
    if p > 1:  # the pairs (f_t, x_{t+1}), t < P - 1, at slots t
      x = pair_inputs(hp, emb, feats_BPE[:, :-1], prompts_BP[:, 1:])
      pos = jnp.broadcast_to(jnp.arange(p - 1, dtype=jnp.int32)[None], x.shape[:2])
      _, k, v = _qkv(c, hp, x, pos)
      zero = jnp.zeros_like(lengths_B)
      state = state.replace(k_BSHD=_write(state.k_BSHD, k, zero),
                            v_BSHD=_write(state.v_BSHD, v, zero))
    last = jnp.take_along_axis(feats_BPE, (lengths_B - 1)[:, None, None], axis=1)[:, 0]
    return state.replace(lengths_B=lengths_B - 1, feat_BE=last, root_B=first_B.astype(jnp.int32))

  def _level(self, params, state, feats_BTE, tokens_BT, depth, side_k, side_v, slots, anc_BTM):
    """One tree level: T nodes at depth `depth` (positions lengths + depth)
    are written at side-buffer `slots` and run through the head, attending
    to the head's cache and to the side slots `anc_BTM` marks (their
    ancestors and themselves). → (outputs `[B, T, E]`, log-probs
    `[B, T, V]`, side_k, side_v)."""
    c, hp = self.config, params["head"]
    emb, lm = shared_weights(self.target, params["target"])
    x = pair_inputs(hp, emb, feats_BTE, tokens_BT)
    pos = jnp.broadcast_to((state.lengths_B + depth)[:, None], tokens_BT.shape)
    q, k, v = _qkv(c, hp, x, pos)
    side_k = side_k.at[:, slots].set(k)
    side_v = side_v.at[:, slots].set(v)
    s = state.k_BSHD.shape[1]
    cache_mask = (jnp.arange(s)[None, :] < state.lengths_B[:, None])[:, None, :]
    att = _attend(c, q, [(state.k_BSHD, state.v_BSHD, cache_mask), (side_k, side_v, anc_BTM)])
    out = _finish(c, hp, x, att)
    logp = jax.nn.log_softmax(head_logits(c, hp, lm, out), axis=-1)
    return out, logp, side_k, side_v

  def propose(self, params, state: EagleState, inp: DraftInput, u_BT, sampling,
              gamma: int) -> Tuple[Proposal, EagleState]:
    state = state.replace(root_B=inp.pending.astype(jnp.int32))
    if isinstance(self.tree, TokenTree):
      return self._propose_static(params, state, inp), state
    return self._propose_dynamic(params, state, inp), state

  def _side(self, b, m):
    c = self.config
    z = jnp.zeros((b, m, c.num_heads, c.head_dim), jnp.float32)
    return z, z

  def _propose_static(self, params, state: EagleState, inp: DraftInput) -> Proposal:
    tree = self.tree
    b, n = inp.pending.shape[0], tree.size
    parents = np.asarray(tree.parents)
    depths, anc = tree.depths, tree.ancestor_mask
    kids = tree.children
    ranks = max(int(kids.shape[1]), 1)
    tokens = [None] * n
    tokens[0] = inp.pending.astype(jnp.int32)
    feats = {0: state.feat_BE}   # the feature each node's pair carries
    side_k, side_v = self._side(b, n)
    for d in range(tree.depth):
      idx = [i for i in range(n) if depths[i] == d and (parents == i).any()]
      if not idx:
        continue
      f = jnp.stack([feats[i] for i in idx], axis=1)
      t = jnp.stack([tokens[i] for i in idx], axis=1)
      mask = jnp.broadcast_to(jnp.asarray(anc[idx])[None], (b, len(idx), n))
      out, logp, side_k, side_v = self._level(params, state, f, t, d, side_k, side_v,
                                              np.asarray(idx), mask)
      _, top_BTR = jax.lax.top_k(logp, ranks)
      for j, i in enumerate(idx):
        for r, child in enumerate(kids[i]):
          if child >= 0:
            tokens[child] = top_BTR[:, j, r].astype(jnp.int32)
            feats[child] = out[:, j]
    tokens_BT = jnp.stack(tokens, axis=1)
    return Proposal(tokens_BT=tokens_BT, valid_BKN=None,
                    node_valid_BT=jnp.ones((b, n), bool))

  def _propose_dynamic(self, params, state: EagleState, inp: DraftInput) -> Proposal:
    dt = self.tree
    k, depth = dt.top_k, dt.depth
    b = inp.pending.shape[0]
    m = 1 + (depth - 1) * k                     # expanded nodes (side slots)
    side_k, side_v = self._side(b, m)
    eye = jnp.eye(m, dtype=bool)
    # Level 0: the root.
    out, logp, side_k, side_v = self._level(
        params, state, state.feat_BE[:, None], inp.pending[:, None].astype(jnp.int32), 0,
        side_k, side_v, np.array([0]), jnp.broadcast_to(eye[:1][None], (b, 1, m)))
    top_lp, top_tok = jax.lax.top_k(logp[:, 0], k)               # [B, k]
    pool_tok, pool_score = [top_tok], [top_lp]
    pool_parent = [jnp.full((b, k), -1, jnp.int32)]               # pool index, -1: root
    # The current level's candidates: pool indices, their parent's output
    # and side ancestors.
    lvl_idx = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32)[None], (b, k))
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
      pidx = take(lvl_idx)
      slots = 1 + (d - 1) * k + np.arange(k)
      anc = anc | eye[slots][None]
      out, logp, side_k, side_v = self._level(params, state, feats, toks, d, side_k, side_v,
                                              slots, anc)
      c_lp, c_tok = jax.lax.top_k(logp, k)                         # [B, k, k]
      c_score = (best_s[:, :, None] + c_lp).reshape(b, k * k)
      pool_tok.append(c_tok.reshape(b, k * k))
      pool_score.append(c_score)
      pool_parent.append(jnp.repeat(pidx, k, axis=1))
      lvl_idx = base + jnp.broadcast_to(jnp.arange(k * k, dtype=jnp.int32)[None], (b, k * k))
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
    tokens_BT = jnp.concatenate([inp.pending[:, None].astype(jnp.int32), tok_sel], axis=1)
    valid_BT = jnp.concatenate([jnp.ones((b, 1), bool), found], axis=1)
    return Proposal(tokens_BT=tokens_BT, valid_BKN=None, node_valid_BT=valid_BT,
                    node_parents_BT=parents_BT)

  def update(self, params, state: EagleState, feedback: DraftFeedback) -> EagleState:
    c, hp = self.config, params["head"]
    emb, _ = shared_weights(self.target, params["target"])
    f_BCE = fuse_features(c, hp, feedback.target_hidden_BCX)       # root, accepted...
    # Pairs at slots lengths + j: (f_root-1, root), (f_root, a_1), ..., (f_{a_{C-2}}, a_{C-1}).
    feats = jnp.concatenate([state.feat_BE[:, None], f_BCE[:, :-1]], axis=1)
    toks = jnp.concatenate([state.root_B[:, None], feedback.committed_BC[:, :-1]], axis=1)
    x = pair_inputs(hp, emb, feats, toks)
    pos = state.lengths_B[:, None] + jnp.arange(x.shape[1], dtype=jnp.int32)[None]
    _, k, v = _qkv(c, hp, x, pos)
    moved = feedback.count_B > 0
    last = jnp.take_along_axis(f_BCE, feedback.accepted_B[:, None, None], axis=1)[:, 0]
    return state.replace(
        k_BSHD=_write(state.k_BSHD, k, state.lengths_B),
        v_BSHD=_write(state.v_BSHD, v, state.lengths_B),
        lengths_B=jnp.where(moved, feedback.seq_len_B - 1, state.lengths_B),
        feat_BE=jnp.where(moved[:, None], last, state.feat_BE))


def load_eagle(directory: str, target, target_params, tree) -> Tuple[Eagle, Dict[str, Any]]:
  """(drafter, draft params) from a trained head (`<directory>/final` of
  `experiments/train_drafter.py`); `tree`: a `TokenTree` or `DynamicTree`."""
  from specjax.training.eagle import load_head  # pylint: disable=g-import-not-at-top
  config, params = load_head(directory)
  return Eagle(config, tree, target), {"head": params, "target": target_params}
