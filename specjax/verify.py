"""The speculative accept/reject rules (Leviathan et al. 2023, Chen et al. 2023).

Drafts sampled from a proposal distribution p (a draft model) are verified by the rejection rule
(`rejection_verify`). Deterministic drafts (prompt lookup, n-gram candidates) stay exact as the
same rule with p one-hot on the draft: accept d with probability q(d), on rejection draw from q
with d removed, renormalised (`candidates_verify`, also for several candidate chains sharing a
root; `tree_verify` for token trees). With a greedy target every rule reduces to "keep drafts
while they equal the target's argmax" (`greedy_verify`, `greedy_candidates_verify`).

A verifier is a pure function

  verify_fn(keys_B, drafts_BG, draft_probs_BGV, target_probs_BG1V)
      -> (num_accepted_B, next_token_B)

where draft_probs_BGV[b, i] is the draft distribution p_{i+1} that drafts_BG[b, i] was sampled
from and target_probs_BG1V[b, i] the target distribution q_{i+1} at the same position (one more
at the end, after all G drafts), both *processed* (`specjax.sampling`). It returns how many
leading drafts row b keeps (0..G) and the token that follows them: the residual sample after a
rejection, or the bonus token when all G are kept; `speculative_generate(verify_fn=)` takes any.
"""

from __future__ import annotations

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from specjax.sampling import argmax_first, gather_over_vocab, row_uniforms, sample_from_uniform

__all__ = ["rejection_verify", "greedy_verify", "gather_probs", "candidates_verify",
           "greedy_candidates_verify", "tree_verify"]


def gather_probs(probs_BXV: jax.Array, tokens_BX: jax.Array) -> jax.Array:
  """probs_BXV[b, x, tokens_BX[b, x]] → `[B, X]` (a masked sum over a split vocabulary)."""
  return gather_over_vocab(probs_BXV, tokens_BX)


def rejection_verify(keys_B: jax.Array, drafts_BG: jax.Array, draft_probs_BGV: jax.Array,
                     target_probs_BG1V: jax.Array,
                     num_valid_B: Optional[jax.Array] = None) -> Tuple[jax.Array, jax.Array]:
  """Exact speculative sampling.

  Draft i is accepted with probability min(1, q_i(d_i) / p_i(d_i)), left to right; at the first
  rejection j the next token is drawn from norm(max(0, q_j − p_j)); if all G are accepted, from
  q_{G+1}. The output then has exactly the target's distribution. `num_valid_B` (default: all G):
  row b proposes only its first num_valid_B[b] drafts; the others count as rejected with p = 0
  there (0 valid: a plain sample from q_1).
  """
  b, g = drafts_BG.shape
  # One PRNG call per row: G acceptance uniforms and the residual draw's.
  u_BG1 = row_uniforms(keys_B, g + 1)
  u_BG = u_BG1[:, :g]
  p_BG = gather_probs(draft_probs_BGV, drafts_BG)
  q_BG = gather_probs(target_probs_BG1V[:, :g], drafts_BG)
  # u < q/p without dividing (p > 0 for a token sampled from p).
  accept_BG = u_BG * p_BG < q_BG
  valid_BG = _valid(num_valid_B, b, g)
  accept_BG = accept_BG & valid_BG
  num_accepted_B = jnp.sum(jnp.cumprod(accept_BG.astype(jnp.int32), axis=1), axis=1)

  idx = num_accepted_B[:, None, None]
  q_BV = jnp.take_along_axis(target_probs_BG1V, idx, axis=1)[:, 0]
  # p at the first rejection: 0 after all G drafts and at an invalid draft (gathered from the
  # row's own position, not from a copy of p extended by zeros).
  p_BV = jnp.take_along_axis(draft_probs_BGV, jnp.minimum(idx, g - 1), axis=1)[:, 0]
  rejected_valid_B = jnp.take_along_axis(jnp.pad(valid_BG, ((0, 0), (0, 1))),
                                         num_accepted_B[:, None], axis=1)[:, 0]
  p_BV = jnp.where(rejected_valid_B[:, None], p_BV, 0.0)
  residual_BV = jnp.maximum(q_BV - p_BV, 0.0)
  mass_B1 = jnp.sum(residual_BV, axis=-1, keepdims=True)
  dist_BV = jnp.where(mass_B1 > 0, residual_BV / jnp.where(mass_B1 > 0, mass_B1, 1.0), q_BV)
  # The uniform after the row's own valid drafts: a row's draws do not depend on how many drafts
  # the call holds beyond its own (`specjax.adaptive`).
  next_B = sample_from_uniform(_after_valid(u_BG1, num_valid_B, g), dist_BV)
  return num_accepted_B.astype(jnp.int32), next_B


def _after_valid(u_BX: jax.Array, num_valid_B: Optional[jax.Array], g: int) -> jax.Array:
  """`[B]` the uniform at index num_valid_B[b] (g when None)."""
  if num_valid_B is None:
    return u_BX[:, g]
  idx_B = jnp.clip(num_valid_B, 0, g).astype(jnp.int32)
  return jnp.take_along_axis(u_BX, idx_B[:, None], axis=1)[:, 0]


def _valid(num_valid_B: Optional[jax.Array], b: int, g: int) -> jax.Array:
  if num_valid_B is None:
    return jnp.ones((b, g), bool)
  return jnp.arange(g)[None, :] < num_valid_B[:, None]


def greedy_verify(keys_B: jax.Array, drafts_BG: jax.Array, draft_probs_BGV: jax.Array,
                  target_probs_BG1V: jax.Array,
                  num_valid_B: Optional[jax.Array] = None) -> Tuple[jax.Array, jax.Array]:
  """`rejection_verify` specialised to greedy (one-hot) distributions.

  Keeps drafts while they equal the target's argmax, then emits the target's argmax: exactly the
  rejection rule with one-hot p and q, without random numbers (keys_B and draft_probs_BGV are
  unused). The decoder uses it at temperature 0 with the default verifier.
  """
  del keys_B, draft_probs_BGV
  b, g = drafts_BG.shape
  best_BG1 = argmax_first(target_probs_BG1V)
  match_BG = ((drafts_BG == best_BG1[:, :g]) & _valid(num_valid_B, b, g)).astype(jnp.int32)
  num_accepted_B = jnp.sum(jnp.cumprod(match_BG, axis=1), axis=1).astype(jnp.int32)
  next_B = jnp.take_along_axis(best_BG1, num_accepted_B[:, None], axis=1)[:, 0]
  return num_accepted_B, next_B


def candidates_verify(keys_B: jax.Array, cands_BKN: jax.Array, valid_BKN: jax.Array,
                      q_root_BV: jax.Array, q_BKNV: jax.Array
                      ) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """Exact verification of K deterministic candidate chains sharing a root.

  Args:
    keys_B: one PRNG key per row.
    cands_BKN: int32 candidate tokens; chain k's token j follows its tokens 0..j-1 and the root
      (the pending token).
    valid_BKN: bool, which candidate tokens exist (a prefix of each chain).
    q_root_BV: the target's processed distribution after the root.
    q_BKNV: the target's processed distribution after chain k's tokens 0..j.

  Recursive rejection sampling with one-hot proposals: at depth j the residual r starts as the
  target's distribution after the accepted prefix; the candidates still consistent with that
  prefix are tried in order: token x is accepted with probability r(x), else r ← r with x
  removed, renormalised (a repeated token has no mass left and is rejected without effect). A
  rejected depth ends with a draw from r, a fully accepted chain with a draw from the target's
  distribution after it: the emitted tokens have exactly the target's distribution.

  Returns `(chain_B, accepted_B, next_B)`: the chain holding the accepted tokens (its first
  `accepted_B`), and the token that follows them.
  """
  b, k, n = cands_BKN.shape
  u_BX = row_uniforms(keys_B, k * n + 1)
  r_BV = q_root_BV.astype(jnp.float32)
  alive_BK = valid_BKN[:, :, 0]
  stopped_B = jnp.zeros((b,), bool)
  accepted_B = jnp.zeros((b,), jnp.int32)
  chain_B = jnp.zeros((b,), jnp.int32)
  for j in range(n):
    hit_B = jnp.zeros((b,), bool)
    x_acc_B = jnp.zeros((b,), jnp.int32)
    k_acc_B = jnp.zeros((b,), jnp.int32)
    for c in range(k):
      x_B = cands_BKN[:, c, j]
      trial_B = alive_BK[:, c] & valid_BKN[:, c, j] & ~hit_B & ~stopped_B
      r_x = gather_probs(r_BV, x_B)
      ok_B = trial_B & (u_BX[:, j * k + c] < r_x)
      hit_B = hit_B | ok_B
      x_acc_B = jnp.where(ok_B, x_B, x_acc_B)
      k_acc_B = jnp.where(ok_B, c, k_acc_B)
      # Rejected: remove x from the residual and renormalise.
      zeroed_BV = jnp.where(jax.nn.one_hot(x_B, r_BV.shape[1], dtype=bool), 0.0, r_BV)
      mass_B1 = jnp.sum(zeroed_BV, axis=1, keepdims=True)
      renorm_BV = jnp.where(mass_B1 > 0, zeroed_BV / jnp.where(mass_B1 > 0, mass_B1, 1.0), r_BV)
      r_BV = jnp.where((trial_B & ~ok_B)[:, None], renorm_BV, r_BV)
    # Accepted at depth j: continue below the accepted token.
    q_next_BV = jnp.take_along_axis(q_BKNV[:, :, j], k_acc_B[:, None, None], axis=1)[:, 0]
    r_BV = jnp.where(hit_B[:, None], q_next_BV.astype(jnp.float32), r_BV)
    accepted_B = accepted_B + hit_B.astype(jnp.int32)
    chain_B = jnp.where(hit_B, k_acc_B, chain_B)
    alive_BK = alive_BK & (cands_BKN[:, :, j] == x_acc_B[:, None])
    stopped_B = stopped_B | ~hit_B
  # One chain: the uniform after the row's own valid tokens (as rejection_verify).
  u_next_B = (_after_valid(u_BX, jnp.sum(valid_BKN[:, 0], axis=1), n) if k == 1
              else u_BX[:, k * n])
  next_B = sample_from_uniform(u_next_B, r_BV)
  return chain_B, accepted_B, next_B


def greedy_candidates_verify(cands_BKN: jax.Array, valid_BKN: jax.Array,
                             best_root_B: jax.Array, best_BKN: jax.Array
                             ) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """`candidates_verify` for a greedy target, from argmaxes alone: the (first) candidate with the
  longest prefix equal to the target's argmax path, and the argmax after it. `best_root_B`: the
  argmax after the root; `best_BKN`: after chain k's tokens 0..j."""
  b, k, n = cands_BKN.shape
  parent_BKN = jnp.concatenate(
      [jnp.broadcast_to(best_root_B[:, None, None], (b, k, 1)), best_BKN[:, :, :-1]], axis=2)
  match_BKN = (cands_BKN == parent_BKN) & valid_BKN
  depth_BK = jnp.sum(jnp.cumprod(match_BKN.astype(jnp.int32), axis=2), axis=2)
  chain_B = jnp.argmax(depth_BK, axis=1).astype(jnp.int32)
  accepted_B = jnp.max(depth_BK, axis=1).astype(jnp.int32)
  after_BN1 = jnp.concatenate([best_root_B[:, None],
                               jnp.take_along_axis(best_BKN, chain_B[:, None, None], axis=1)[:, 0]],
                              axis=1)
  next_B = jnp.take_along_axis(after_BN1, accepted_B[:, None], axis=1)[:, 0]
  return chain_B, accepted_B, next_B


def tree_verify(keys_B: jax.Array, tokens_BN: jax.Array, valid_BN: jax.Array,
                q_BNV: jax.Array, children_NC: jax.Array, depth: int,
                p_BNV: Optional[jax.Array] = None, greedy: bool = False
                ) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """Exact verification of a token tree (recursive rejection sampling).

  Args:
    keys_B: one PRNG key per row (unused when `greedy`).
    tokens_BN: int32 node tokens; node 0 is the root (the pending token).
    valid_BN: bool, which nodes a row proposes (an invalid node's subtree is never reached).
    q_BNV: the target's processed distribution after each node's path.
    children_NC: int32 static table: node n's children in the order they are tried, padded with
      -1 (`TokenTree.children`); or `[B, N, C]`, each row's own tree (dynamic trees:
      `specjax.tree.dynamic_tree_arrays`).
    depth: the tree's depth D (edges on the longest root path).
    p_BNV: the distribution each node's token was drawn from *given the siblings tried before
      it* (i.i.d. children: the draft's distribution at the parent; without replacement: that
      distribution renormalised over the not-yet-drawn tokens); None: deterministic children
      (top-k, n-gram), a one-hot proposal each.
    greedy: the target's distributions are one-hot (temperature 0): the same decisions without
      random numbers.

  At the current node with residual r (first: q at the node), the children are tried in order:
  child x is accepted with probability min(1, r(x) / p_x(x)); on rejection r ←
  norm(max(r − p_x, 0)) (one-hot p: r with x removed, renormalised). An accepted child becomes
  the current node (r ← q there); when every child is rejected the next token is drawn from r,
  after an accepted leaf from q at it. Each step is the single-draft lemma applied to the
  residual, so every emitted token has the target's distribution.

  Returns `(path_BD, accepted_B, next_B)`: the accepted nodes in root-to-leaf order
  (`path_BD[b, :accepted_B[b]]`; 0 past them), how many, and the token that follows.
  """
  if greedy:
    return _greedy_tree_walk(tokens_BN, valid_BN, argmax_first(q_BNV), children_NC, depth)
  b, n = tokens_BN.shape
  c = children_NC.shape[-1]   # [N, C] or per row [B, N, C]
  u_BX = row_uniforms(keys_B, depth * c + 1)
  r_BV = q_BNV[:, 0].astype(jnp.float32)
  cur_B = jnp.zeros((b,), jnp.int32)
  stopped_B = jnp.zeros((b,), bool)
  accepted_B = jnp.zeros((b,), jnp.int32)
  path = []
  v = r_BV.shape[1]
  for d in range(depth):
    hit_B = jnp.zeros((b,), bool)
    acc_B = jnp.zeros((b,), jnp.int32)
    kids_BC = _children_of(children_NC, cur_B)
    for k in range(c):
      child_B = kids_BC[:, k]
      safe_B = jnp.maximum(child_B, 0)
      trial_B = (child_B >= 0) & jnp.take_along_axis(valid_BN, safe_B[:, None], axis=1)[:, 0] \
          & ~hit_B & ~stopped_B
      x_B = jnp.take_along_axis(tokens_BN, safe_B[:, None], axis=1)[:, 0]
      r_x = gather_probs(r_BV, x_B)
      if p_BNV is None:
        ok_B = trial_B & (u_BX[:, d * c + k] < r_x)
        rejected_BV = jnp.where(jax.nn.one_hot(x_B, v, dtype=bool), 0.0, r_BV)
      else:
        p_child_BV = jnp.take_along_axis(p_BNV, safe_B[:, None, None], axis=1)[:, 0]
        p_x = gather_probs(p_child_BV, x_B)
        ok_B = trial_B & (u_BX[:, d * c + k] * p_x < r_x)
        rejected_BV = jnp.maximum(r_BV - p_child_BV.astype(jnp.float32), 0.0)
      mass_B1 = jnp.sum(rejected_BV, axis=1, keepdims=True)
      rejected_BV = jnp.where(mass_B1 > 0, rejected_BV / jnp.where(mass_B1 > 0, mass_B1, 1.0),
                              r_BV)
      r_BV = jnp.where((trial_B & ~ok_B)[:, None], rejected_BV, r_BV)
      hit_B = hit_B | ok_B
      acc_B = jnp.where(ok_B, child_B, acc_B)
    q_next_BV = jnp.take_along_axis(q_BNV, acc_B[:, None, None], axis=1)[:, 0]
    r_BV = jnp.where(hit_B[:, None], q_next_BV.astype(jnp.float32), r_BV)
    cur_B = jnp.where(hit_B, acc_B, cur_B)
    accepted_B = accepted_B + hit_B.astype(jnp.int32)
    path.append(jnp.where(hit_B, acc_B, 0))
    stopped_B = stopped_B | ~hit_B
  next_B = sample_from_uniform(u_BX[:, depth * c], r_BV)
  path_BD = jnp.stack(path, axis=1) if path else jnp.zeros((b, 0), jnp.int32)
  return path_BD.astype(jnp.int32), accepted_B, next_B


def _children_of(children_NC: jax.Array, cur_B: jax.Array) -> jax.Array:
  """The current nodes' children `[B, C]` from a static `[N, C]` table or each row's own
  `[B, N, C]` (no gather whose indices mix an iota and constants: libtpu mis-shapes it)."""
  if children_NC.ndim == 2:
    return children_NC[cur_B]
  return jnp.take_along_axis(children_NC, cur_B[:, None, None], axis=1)[:, 0]


def _greedy_tree_walk(tokens_BN, valid_BN, best_BN, children_NC, depth: int):
  """`tree_verify` for one-hot target distributions, from their argmaxes `best_BN` alone.

  With q one-hot on best[cur], the residual stays that one-hot through every rejection (a child
  x != best has no mass to remove), and a child is accepted iff it is tried and its token is
  best[cur] (u · p(x) < q(x) = 1 for any p(x) <= 1, and q(x) = 0 otherwise): the first such
  child in order. The token after the path is best at its last node."""
  b = tokens_BN.shape[0]
  cur_B = jnp.zeros((b,), jnp.int32)
  accepted_B = jnp.zeros((b,), jnp.int32)
  path = []
  for _ in range(depth):   # a row that stopped stays put: its children fail again
    kids_BC = _children_of(children_NC, cur_B)
    safe_BC = jnp.maximum(kids_BC, 0)
    want_B = jnp.take_along_axis(best_BN, cur_B[:, None], axis=1)[:, 0]
    ok_BC = ((kids_BC >= 0) & jnp.take_along_axis(valid_BN, safe_BC, axis=1)
             & (jnp.take_along_axis(tokens_BN, safe_BC, axis=1) == want_B[:, None]))
    hit_B = jnp.any(ok_BC, axis=1)
    first_B = jnp.argmax(ok_BC, axis=1)   # the first child that matches
    acc_B = jnp.take_along_axis(safe_BC, first_B[:, None], axis=1)[:, 0]
    cur_B = jnp.where(hit_B, acc_B, cur_B)
    accepted_B = accepted_B + hit_B.astype(jnp.int32)
    path.append(jnp.where(hit_B, acc_B, 0))
  next_B = jnp.take_along_axis(best_BN, cur_B[:, None], axis=1)[:, 0]
  path_BD = jnp.stack(path, axis=1) if path else jnp.zeros((b, 0), jnp.int32)
  return path_BD.astype(jnp.int32), accepted_B, next_B.astype(jnp.int32)
