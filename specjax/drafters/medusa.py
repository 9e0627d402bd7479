"""Medusa-1 heads (Cai et al. 2024) as a tree drafter, and their tree.

K extra heads read the target's final-normed state h at the last committed position t: head
k (k = 1..K) predicts token t+k+1 (the target's own LM head predicts t+1, the pending token):

  z_k = h + SiLU(h W_k + b_k);   logits_k = z_k U_k

with W_k = 0 at initialisation (a fresh head is the target's LM head) and U_k from the target's
LM head (trainable, or shared and frozen: `MedusaConfig.share_lm_head`); trained on the frozen
target (`training.heads`).

Drafting: the node of a static `TokenTree` at child-rank path (i_1, ..., i_d) gets the i_d-th
most likely token of head d; the heads do not see each other's choices, so the children are
deterministic (verified as one-hot proposals: exact). `choose_tree` picks the N nodes with the
largest expected acceptance (Medusa's greedy construction); `TokenTree.chain(K)` is chain
mode. h comes from the target call itself (`needs_hidden`), so the first iteration after the
prompt is a plain target step. Under `gamma="auto"` an iteration drafts the nodes at most γ deep.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.checkpoints.heads import load_medusa_heads
from specjax.drafting import (CallLayout, DraftFeedback, DraftInput, Drafter, Proposal,
                              check_head_params)
from specjax.models.medusa_head import MedusaConfig, head_logits, target_lm_head
from specjax.protocol import check_tree
from specjax.tree import TokenTree, check_child_mode, draw_children
from specjax._checks import check_int

__all__ = ["Medusa", "MedusaState", "choose_tree", "load_medusa"]


@struct.dataclass
class MedusaState:
  """hidden: `[B, E]` the target's state at the last committed position; ready: `[B]` whether
  it is there (False until the first target call)."""

  hidden: jax.Array
  ready: jax.Array


@dataclasses.dataclass(frozen=True)
class Medusa(Drafter):
  """The Medusa drafter: `config`, the `tree` it proposes, and (with `share_lm_head`) the
  target whose LM head the heads use. Params: {"heads": ..., "target": the target's if shared}.

  `children`: "top_k" (deterministic) or "iid" / "without" (drawn from head d's processed
  distribution, with or without replacement among siblings; `tree.draw_children`)."""

  config: MedusaConfig
  tree: TokenTree
  target: Any = None
  children: str = "top_k"

  uses_target_params = False
  needs_hidden = True
  # gamma="auto": nodes at most γ deep; γ = 0 a plain step, whose `update` still hands the
  # heads the target's state.
  adaptive = True

  def __post_init__(self):
    if self.tree.depth > self.config.num_heads:
      raise ValueError(f"the tree is {self.tree.depth} deep but there are "
                       f"{self.config.num_heads} heads (one per depth)")
    if self.config.share_lm_head and self.target is None:
      raise ValueError("share_lm_head needs the target (Medusa(config, tree, target=...))")
    check_child_mode("children", self.children)

  @property
  def deterministic(self) -> bool:
    return self.children == "top_k"

  @property
  def reads_target_lm_head(self) -> bool:
    return self.config.share_lm_head

  @property
  def fixed_gamma(self) -> int:
    return self.tree.depth

  @property
  def gamma_limit(self) -> int:
    return self.tree.depth

  def _tree(self, gamma: int) -> TokenTree:
    """The tree drafted at γ: its nodes at most γ deep."""
    return self.tree.truncated(gamma) if 0 < gamma < self.tree.depth else self.tree

  def check(self, target: Any, gamma: int) -> None:
    if self.config.vocab_size != target.vocab_size:
      raise ValueError(f"the heads' vocab_size ({self.config.vocab_size}) must equal the "
                       f"target's ({target.vocab_size})")
    width = getattr(target.config, "d_model", None)
    if width != self.config.d_model:
      raise ValueError(f"the heads read states of width {self.config.d_model}; the target's "
                       f"d_model is {width}")
    if not hasattr(target, "extend_with_hidden"):
      raise TypeError(f"Medusa needs the target's hidden states (extend_with_hidden); "
                      f"{type(target).__name__} has none")

  def layout(self, gamma: int) -> CallLayout:
    return self._tree(gamma).layout()

  def check_params(self, params: Any) -> None:
    check_head_params(params, ("heads", "target"), "load_medusa", self.target)
    c = self.config
    k, e = c.num_heads, c.d_model
    want = {"w": jax.ShapeDtypeStruct((k, e, e), jnp.float32),
            "b": jax.ShapeDtypeStruct((k, e), jnp.float32)}
    if not c.share_lm_head:
      want["lm_head"] = jax.ShapeDtypeStruct((k, e, c.vocab_size), jnp.float32)
    elif params["target"] is None:
      raise TypeError("draft_params['target'] must be the target's params: these heads share "
                      "its LM head (MedusaConfig.share_lm_head)")
    check_tree(want, params["heads"], "draft_params['heads']", "the Medusa heads (init_heads")

  def alloc(self, batch_size: int, prompt_len: int, cache_len: int, gamma: int) -> MedusaState:
    return MedusaState(hidden=jnp.zeros((batch_size, self.config.d_model), jnp.float32),
                       ready=jnp.zeros((batch_size,), bool))

  def start(self, params, state, prompts_BP, lengths_B, first_B, target_cache) -> MedusaState:
    return state.replace(ready=jnp.zeros_like(state.ready))

  def propose(self, params, state: MedusaState, inp: DraftInput, u_BT, sampling,
              gamma: int) -> Tuple[Proposal, MedusaState]:
    shared = None
    if self.config.share_lm_head:
      shared = target_lm_head(self.target, params["target"])
    logits_BKV = head_logits(self.config, params["heads"], state.hidden, shared)
    tree = self._tree(gamma)
    b, n = inp.pending_B.shape[0], tree.size
    depths, kids = tree.depths, tree.children
    tokens = [inp.pending_B.astype(jnp.int32)] + [None] * (n - 1)
    drawn = [jnp.ones((b,), bool)] * n
    probs = [None] * n
    for i in range(n):   # node i's children come from head depth(i) (Medusa-1: any parent)
      cs = [int(c) for c in kids[i] if c >= 0]
      if not cs:
        continue
      tok_BR, p_BRV, ok_BR = draw_children(
          logits_BKV[:, depths[i]], sampling, len(cs), None if u_BT is None else u_BT[:, cs],
          self.children)
      for r, child in enumerate(cs):
        tokens[child], drawn[child] = tok_BR[:, r], ok_BR[:, r]
        if p_BRV is not None:
          probs[child] = p_BRV[:, r]
    tokens_BT = jnp.stack(tokens, axis=1)
    valid = (jnp.stack(drawn, axis=1) & state.ready[:, None]).at[:, 0].set(True)
    node_probs = None
    if probs[1] is not None:   # sampled children (at T > 0)
      probs[0] = jnp.zeros_like(probs[1])
      node_probs = jnp.stack(probs, axis=1)
    return Proposal(tokens_BT=tokens_BT, valid_BKN=None, node_valid_BT=valid,
                    node_probs_BTV=node_probs), state

  def update(self, params, state: MedusaState, feedback: DraftFeedback) -> MedusaState:
    del params
    return MedusaState(hidden=feedback.target_hidden_BE.astype(jnp.float32),
                       ready=jnp.ones_like(state.ready))


def choose_tree(accuracy_KR: np.ndarray, num_nodes: int) -> Tuple[TokenTree, list]:
  """The tree of `num_nodes` nodes (root included) with the largest expected accepted length,
  from the heads' top-k accuracies (`accuracy_KR[k, r]`: how often head k+1's rank-r token was
  right). A path (i_1..i_d) is accepted with probability Π_j accuracy[j, i_j] (heads taken as
  independent); nodes are added greedily, each after its parent (Medusa's construction).
  Returns the tree and the expected value of each added node."""
  acc = np.asarray(accuracy_KR, np.float64)
  if acc.ndim != 2 or acc.size == 0:
    raise ValueError(f"accuracy_KR must be [heads, ranks], got shape {acc.shape}")
  num_nodes = check_int("num_nodes (the root and at least one node)", num_nodes, 2)
  k, r = acc.shape
  chosen = {(): 1.0}
  values = []
  while len(chosen) < num_nodes:
    best, best_v = None, -1.0
    for path, v in chosen.items():
      if len(path) >= k:
        continue
      for rank in range(r):
        child = path + (rank,)
        if child in chosen:
          continue
        cv = v * acc[len(path), rank]
        if cv > best_v:
          best, best_v = child, cv
        break  # ranks are tried in order: the first free rank is this parent's best
    if best is None:
      break
    chosen[best] = best_v
    values.append(best_v)
  return TokenTree.from_paths([p for p in chosen if p]), values


def load_medusa(directory: str, target, target_params, tree="chain") -> Tuple["Medusa", Dict]:
  """(drafter, draft params) from trained heads (`<directory>/final` of
  `experiments/train_drafter.py`). `tree`: "chain" (one node per head), an int N (`choose_tree`
  over the stored validation accuracies, N nodes with the root) or a `TokenTree`."""
  config, params, acc = load_medusa_heads(directory)
  if tree == "chain":
    tree = TokenTree.chain(config.num_heads)
  elif isinstance(tree, numbers.Integral) and not isinstance(tree, bool):
    if acc is None:
      raise ValueError(f"{directory} holds no accuracy.json: pass a TokenTree or 'chain'")
    tree, _ = choose_tree(acc, int(tree))
  elif not isinstance(tree, TokenTree):
    raise TypeError(f"tree must be 'chain', an int or a TokenTree, got {tree!r}")
  drafter = Medusa(config, tree, target if config.share_lm_head else None)
  return drafter, {"heads": params, "target": target_params if config.share_lm_head else None}
