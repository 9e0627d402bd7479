"""A tree drafter for the tests: children drawn from a fixed table of draft
logits indexed by the parent's token, i.i.d., without replacement, or the
parent's top-k (deterministic). The target under test reads its whole prefix
from its cache; the draft need not."""

import dataclasses
from typing import Any, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafting import CallLayout, Drafter, Proposal
from specjax.sampling import process_logits, sample_from_uniform
from specjax.tree import TokenTree

MODES = ("iid", "without", "deterministic")


@dataclasses.dataclass(frozen=True)
class TableTree(Drafter):
  tree: TokenTree
  mode: str = "iid"
  # Valid nodes per row: row b uses nodes < node_limit[b % len] (dynamic trees).
  node_limit: Tuple[int, ...] = ()

  uses_target_params = False

  @property
  def deterministic(self) -> bool:
    return self.mode == "deterministic"

  @property
  def fixed_gamma(self) -> int:
    return self.tree.depth

  def check(self, target, gamma):
    pass

  def layout(self, gamma) -> CallLayout:
    return self.tree.layout()

  def alloc(self, batch_size, prompt_len, cache_len, gamma):
    return jnp.zeros((batch_size,), jnp.int32)

  def start(self, params, state, prompts, lengths, first, target_cache):
    return state

  def propose(self, params, state, inp, u_BT, sampling, gamma) -> Tuple[Proposal, Any]:
    table = params["logits"]
    b = inp.pending_B.shape[0]
    n = self.tree.size
    kids = self.tree.children
    tokens = [inp.pending_B.astype(jnp.int32)]
    probs = [jnp.zeros((b, table.shape[1]), jnp.float32)]
    for i in range(1, n):
      parent = self.tree.parents[i]
      rank = int(np.nonzero(kids[parent] == i)[0][0])
      p = process_logits(table[tokens[parent]], sampling)
      if self.mode == "deterministic":
        tok = jax.lax.top_k(p, rank + 1)[1][:, rank].astype(jnp.int32)
        q = p
      else:
        q = p
        if self.mode == "without":
          for sib in kids[parent][:rank]:
            q = jnp.where(jax.nn.one_hot(tokens[sib], q.shape[1], dtype=bool), 0.0, q)
          q = q / jnp.sum(q, axis=1, keepdims=True)
        tok = (jnp.argmax(q, axis=1).astype(jnp.int32) if sampling.is_greedy
               else sample_from_uniform(u_BT[:, i], q))
      tokens.append(tok)
      probs.append(q)
    tokens_BT = jnp.stack(tokens, axis=1)
    valid = jnp.ones((b, n), bool)
    if self.node_limit:
      lim = jnp.asarray(np.resize(np.asarray(self.node_limit), b))
      valid = jnp.arange(n)[None] < lim[:, None]
    return Proposal(tokens_BT=tokens_BT, valid_BKN=None, node_valid_BT=valid,
                    node_probs_BTV=None if self.deterministic else jnp.stack(probs, axis=1)), state

  def update(self, params, state, feedback):
    return state
