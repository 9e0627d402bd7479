"""DFlash-style block drafting (DFlash, arXiv 2602.06036): one draft call per iteration drafts
every depth of a chain or of a static token tree.

The draft (`specjax.models.dflash_head`) has n layers, each attending to the target's fused
context features over the whole committed sequence and to the block's own slots: the anchor
(the row's pending token, at position seq_len) and K - 1 mask slots after it. Slot j's output
is the draft distribution of the token j places after the anchor, so one call gives the
distributions of drafts 1 .. γ (γ <= K - 1) at once.

State: per draft layer, the keys and values of the context features at every committed
position (`DFlashState`, a static `[B, L, S, H, D]` buffer with a length per row). The prompt's
are written chunk by chunk during the target's prefill (`absorb`, from the target's hidden
states after `DFlashConfig.target_layers`); after each commit, those of the call's root and of
the accepted tokens (`update`, from the target's hidden states of the verify call) — each row
from its own old length, its length then moved to its new one: entries past a row's length
(a rejected tail) are masked out and overwritten later. Nothing is recomputed.

Proposals, verified by the loop's exact rules:
  chain (`tree=None`): draft j drawn from slot j's distribution after the target's temperature /
    top-k / top-p (its argmax at T = 0), verified by the rejection rule against it;
  tree (`tree=TokenTree`, depth <= K - 1): the children of a node at depth d drawn from slot
    d + 1's distribution — its top-k (`children="top_k"`, verified as one-hot proposals) or
    sampled i.i.d. / without replacement among siblings (`specjax.tree.draw_children`,
    verified against the distributions they were drawn from) — by recursive rejection sampling
    over the tree (SpecInfer, arXiv 2305.09781; Jeon et al., arXiv 2402.14160).
Exact either way: a slot's distribution depends on committed tokens only, and it is the
distribution the verifier is given.

Shapes: B batch, S draft-cache slots, L draft layers, H heads, D head dim, E width, X the
target's feature width, G = γ, T call tokens, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.checkpoints.heads import final_dir
from specjax.checkpoints.orbax_io import restore_params
from specjax.drafting import (CallLayout, DraftFeedback, DraftInput, Drafter, Proposal,
                              chain_layout, check_head_params)
from specjax.models.dflash_head import (DFlashConfig, block_hidden, block_inputs, block_logits,
                                        context_features, context_kv, init_dflash,
                                        shared_weights)
from specjax.protocol import check_tree
from specjax.sampling import SamplingConfig, draw, process_logits
from specjax.tree import TokenTree, check_child_mode, draw_children

__all__ = ["DFlash", "DFlashState", "load_dflash"]


@struct.dataclass
class DFlashState:
  """k_BLSHD, v_BLSHD: each draft layer's keys / values of the context features, slot s holding
  position s (the target's dtype; rows first: on a mesh, rows over `data`); lengths_B: int32
  `[B]`, positions held (the pending token's position: the row's committed length)."""

  k_BLSHD: jax.Array
  v_BLSHD: jax.Array
  lengths_B: jax.Array


def _write(buf_BLSHD, new_BLTHD, start_B):
  """`new_BLTHD` written into every layer's buffer at each row's `start_B`."""
  return jax.vmap(lambda c, n, s: jax.lax.dynamic_update_slice(c, n.astype(c.dtype),
                                                               (0, s, 0, 0)))(
      buf_BLSHD, new_BLTHD, start_B)


@functools.lru_cache(maxsize=16)
def _shapes(config: DFlashConfig):
  return jax.eval_shape(lambda: init_dflash(config, jax.random.PRNGKey(0)))


@dataclasses.dataclass(frozen=True)
class DFlash(Drafter):
  """The DFlash-style drafter (module doc).

  Attributes:
    config: the draft's shape (`DFlashConfig`).
    target: the target (a `DecoderLM`: its embedding and LM head are shared, its hidden states
      after `config.target_layers` read).
    tree: None: a chain of the caller's γ (<= config.block - 1); or a static `TokenTree` of
      depth <= config.block - 1 (γ is its depth).
    children: a tree's children: "top_k", "iid" or "without" (default None: "without"; at T = 0
      every mode takes the top-k). Chains take None.

  Params: {"head": the draft's params (`init_dflash`), "target": the target's params}.

  `gamma="auto"` (Γ <= the block's drafts, or the tree's depth) chooses each iteration's block:
  γ + 1 slots (a tree's top γ levels); the block is causal, so its first slots do not depend on
  how many follow. Plain target steps (γ = 0) write their position's context like a commit.
  """

  config: DFlashConfig
  target: Any
  tree: Optional[TokenTree] = None
  children: Optional[str] = None

  needs_hidden = True
  needs_prompt_hidden = True
  reads_target_lm_head = True
  adaptive = True   # γ <= the block's drafts (a tree: its top γ levels); plain steps write context

  def __post_init__(self):
    if not isinstance(self.config, DFlashConfig):
      raise TypeError(f"config must be a DFlashConfig, got {type(self.config).__name__}")
    if self.target is None:
      raise ValueError("DFlash needs the target (its embedding and LM head are shared)")
    if self.tree is not None:
      if not isinstance(self.tree, TokenTree):
        raise TypeError(f"tree must be a TokenTree or None (a chain), got {self.tree!r}")
      if self.tree.depth > self.config.max_drafts:
        raise ValueError(f"tree depth {self.tree.depth} exceeds the {self.config.max_drafts} "
                         f"drafts of a block of {self.config.block} slots (DFlashConfig.block)")
    if self.children is not None:
      if self.tree is None:
        raise ValueError(f"children={self.children!r} applies to a tree; a chain (tree=None) "
                         "draws each slot's draft from its distribution")
      check_child_mode("children", self.children)

  @property
  def child_mode(self) -> str:
    return "without" if self.children is None else self.children

  @property
  def deterministic(self) -> bool:
    return self.tree is not None and self.child_mode == "top_k"

  @property
  def hidden_layers(self) -> Tuple[int, ...]:
    return self.config.target_layers

  @property
  def fixed_gamma(self) -> Optional[int]:
    return None if self.tree is None else self.tree.depth

  @property
  def gamma_limit(self) -> int:
    return self.config.max_drafts if self.tree is None else self.tree.depth

  def calls_per_iteration(self, gamma: int) -> int:
    return 1 if gamma else 0

  def check(self, target: Any, gamma: int) -> None:
    c = self.config
    if c.vocab_size != target.vocab_size:
      raise ValueError(f"the draft's vocab_size ({c.vocab_size}) must equal the target's "
                       f"({target.vocab_size})")
    width = getattr(getattr(target, "config", None), "d_model", None)
    if width != c.d_model:
      raise ValueError(f"the draft works at width {c.d_model}; the target's d_model is {width}")
    if not hasattr(target, "prefill_with_hidden"):
      raise TypeError(f"DFlash needs the target's hidden states over the prompt "
                      f"(prefill_with_hidden); {type(target).__name__} has none")
    target.check_layers(c.target_layers)
    if self.tree is None and not 1 <= gamma <= c.max_drafts:
      raise ValueError(f"gamma must be in [1, {c.max_drafts}] for a block of {c.block} slots "
                       f"(DFlashConfig.block), got {gamma}")

  def check_params(self, params: Any) -> None:
    check_head_params(params, ("head", "target"), "load_dflash", self.target)
    check_tree(_shapes(self.config), params["head"], "draft_params['head']",
               "the DFlash draft (init_dflash")

  def _tree_at(self, gamma: int) -> TokenTree:
    """The tree drafted at γ: its nodes at most γ deep (`gamma="auto"`)."""
    return self.tree.truncated(gamma)

  def layout(self, gamma: int) -> CallLayout:
    return chain_layout(gamma) if self.tree is None else self._tree_at(gamma).layout()

  def alloc(self, batch_size: int, prompt_len: int, cache_len: int, gamma: int) -> DFlashState:
    c = self.config
    shape = (batch_size, c.num_layers, cache_len, c.num_heads, c.head_dim)
    kv = jnp.dtype(self.target.config.dtype)
    return DFlashState(k_BLSHD=jnp.zeros(shape, kv), v_BLSHD=jnp.zeros(shape, kv),
                       lengths_B=jnp.zeros((batch_size,), jnp.int32))

  def _written(self, params, state: DFlashState, hidden_BCX, start_B) -> DFlashState:
    """The context keys / values of hidden states `hidden_BCX` at positions start_B + 0..C-1."""
    ctx = context_features(self.config, params["head"], hidden_BCX)
    pos_BC = start_B[:, None] + jnp.arange(ctx.shape[1], dtype=jnp.int32)[None]
    k, v = context_kv(self.config, params["head"], ctx, pos_BC)
    return state.replace(k_BLSHD=_write(state.k_BLSHD, k, start_B),
                         v_BLSHD=_write(state.v_BLSHD, v, start_B))

  def absorb(self, params, state: DFlashState, prompts_BP, lengths_B, start,
             hidden_BCX) -> DFlashState:
    """Writes prompt positions start .. start + C - 1 (those past a row's length are masked)."""
    del prompts_BP, lengths_B
    b = hidden_BCX.shape[0]
    return self._written(params, state, hidden_BCX, jnp.full((b,), start, jnp.int32))

  def start(self, params, state: DFlashState, prompts_BP, lengths_B, first_B,
            target_cache) -> DFlashState:
    """The prompt's positions are the context; the first token is the first anchor."""
    del params, prompts_BP, first_B, target_cache
    return state.replace(lengths_B=lengths_B.astype(jnp.int32))

  def block_log_probs(self, params, state: DFlashState, anchor_B: jax.Array,
                      slots: int) -> jax.Array:
    """One draft call: the block anchored at each row's pending token (position lengths_B), of
    `slots` slots → log-probs `[B, slots - 1, V]`, entry j - 1 the draft of the token j after
    the anchor."""
    c, hp = self.config, params["head"]
    emb, lm = shared_weights(self.target, params["target"])
    x_BTE = block_inputs(hp, emb, anchor_B.astype(jnp.int32)[:, None], slots)[:, 0]
    pos_BT = state.lengths_B[:, None] + jnp.arange(slots, dtype=jnp.int32)[None]
    s = state.k_BLSHD.shape[2]
    ctx_mask = (jnp.arange(s)[None, :] < state.lengths_B[:, None])[:, None, :]
    causal = np.tril(np.ones((slots, slots), bool))
    out = block_hidden(c, hp, x_BTE, pos_BT, state.k_BLSHD, state.v_BLSHD, ctx_mask, causal)
    return jax.nn.log_softmax(block_logits(lm, out[:, 1:]), axis=-1)

  def propose(self, params, state: DFlashState, inp: DraftInput, u_BT, sampling: SamplingConfig,
              gamma: int) -> Tuple[Proposal, DFlashState]:
    if self.tree is None:
      logp_BGV = self.block_log_probs(params, state, inp.pending_B, gamma + 1)
      return self._chain(logp_BGV, inp, u_BT, sampling), state
    tree = self._tree_at(gamma)
    logp_BGV = self.block_log_probs(params, state, inp.pending_B, tree.depth + 1)
    return self._tree(tree, logp_BGV, inp, u_BT, sampling), state

  def _chain(self, logp_BGV, inp: DraftInput, u_BG, sampling) -> Proposal:
    b, g = logp_BGV.shape[:2]
    probs_BGV = process_logits(logp_BGV, sampling)
    drafts = draw(u_BG[:, :g].reshape(-1), probs_BGV.reshape(b * g, -1), sampling)
    tokens_BT = jnp.concatenate([inp.pending_B[:, None].astype(jnp.int32),
                                 drafts.reshape(b, g).astype(jnp.int32)], axis=1)
    return Proposal(tokens_BT=tokens_BT, valid_BKN=jnp.ones((b, 1, g), bool),
                    probs_BGV=probs_BGV)

  def _tree(self, tree: TokenTree, logp_BGV, inp: DraftInput, u_BT, sampling) -> Proposal:
    """A node at depth d: its children from slot d + 1's distribution (module doc)."""
    b, n = logp_BGV.shape[0], tree.size
    depths, kids = tree.depths, tree.children
    tokens = [inp.pending_B.astype(jnp.int32)] + [None] * (n - 1)
    valid = [jnp.ones((b,), bool)] * n
    probs = [None] * n
    for i in range(n):
      cs = [int(c) for c in kids[i] if c >= 0]
      if not cs:
        continue
      tok_BR, p_BRV, ok_BR = draw_children(
          logp_BGV[:, depths[i]], sampling, len(cs), None if u_BT is None else u_BT[:, cs],
          self.child_mode)
      for r, child in enumerate(cs):
        tokens[child] = tok_BR[:, r]
        valid[child] = ok_BR[:, r] & valid[i]   # a node's children only below a drafted node
        if p_BRV is not None:
          probs[child] = p_BRV[:, r]
    node_probs = None
    if probs[1] is not None:   # sampled children (T > 0)
      probs[0] = jnp.zeros_like(probs[1])
      node_probs = jnp.stack(probs, axis=1)
    return Proposal(tokens_BT=jnp.stack(tokens, axis=1), valid_BKN=None,
                    node_valid_BT=jnp.stack(valid, axis=1), node_probs_BTV=node_probs)

  def update(self, params, state: DFlashState, feedback: DraftFeedback) -> DFlashState:
    """The context of the call's root and accepted tokens (`target_hidden_BCX`), written from
    each row's old length; the length moves to the new pending token's position."""
    state = self._written(params, state, feedback.target_hidden_BCX, state.lengths_B)
    moved_B = feedback.count_B > 0
    return state.replace(lengths_B=jnp.where(moved_B, feedback.seq_len_B.astype(jnp.int32),
                                             state.lengths_B))


def load_dflash(directory: str, target, target_params, tree: Optional[TokenTree] = None,
                children: Optional[str] = None, *, strict: bool = False
                ) -> Tuple[DFlash, Dict[str, Any]]:
  """(drafter, draft params) of a trained draft (`<directory>` or its `final/`, as
  `specjax.training.dflash.train_dflash` writes it); `tree`, `children`: as `DFlash`'s;
  `strict`: as `restore_params`'s (refuse a draft saved without an integrity digest)."""
  d = final_dir(directory)
  params, config = restore_params(d, strict=strict)
  if not isinstance(config, DFlashConfig):
    raise ValueError(f"{d} holds a {type(config).__name__}, not a DFlash draft (DFlashConfig)")
  return DFlash(config, target, tree, children), {"head": params, "target": target_params}
