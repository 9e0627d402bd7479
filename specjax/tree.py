"""Token trees: the static topology of a tree of drafted tokens.

A tree of N nodes is given by its parents: node 0 is the row's pending token (the root, parent
-1), every other node's parent comes before it (`parents[i] < i`), so no node is its own
ancestor. The topology is static (one compilation per tree); the tokens, their proposal
distributions and which nodes a row uses (a per-row valid mask) are per-row data.

One target call runs all N nodes: node i at position committed length + depth(i), attending
to the committed cache, its ancestors and itself only (`layout()`: offsets = depths, mask =
ancestor mask). `verify.tree_verify` accepts a root path exactly; the accepted nodes' keys and
values are then moved into contiguous cache slots (`copy_slots`).

  tree = TokenTree.chain(4)                    # a chain
  tree = TokenTree.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafting import CallLayout
from specjax._checks import check_int
from specjax.sampling import SamplingConfig, process_logits, sample_from_uniform, top_k_over_vocab

__all__ = ["TokenTree", "dynamic_tree_arrays", "CHILD_MODES", "check_child_mode", "draw_children"]

CHILD_MODES = ("top_k", "iid", "without")


def check_child_mode(name: str, mode) -> str:
  """`mode` if it is one of `CHILD_MODES`, else a ValueError naming `name`."""
  if mode not in CHILD_MODES:
    raise ValueError(f"{name} must be one of {list(CHILD_MODES)}, got {mode!r}")
  return mode


@dataclasses.dataclass(frozen=True)
class TokenTree:
  """A static tree topology (see the module doc).

  Attributes:
    parents: parents[i] is node i's parent; parents[0] = -1 (the root).
  """

  parents: Tuple[int, ...]

  def __post_init__(self):
    try:
      parents = tuple(self.parents)
    except TypeError:
      raise TypeError(f"parents must be a sequence of ints, got {self.parents!r}") from None
    if not parents or parents[0] != -1:
      raise ValueError(f"parents[0] must be -1 (node 0 is the root: the pending token), got "
                       f"{list(parents)[:4]}")
    for i, p in enumerate(parents):
      check_int(f"parents[{i}]", p)
      if i == 0:
        continue
      if p == i:
        raise ValueError(f"node {i} is its own parent (parents[{i}] = {i})")
      if not 0 <= p < i:
        raise ValueError(f"parents must be topologically ordered (0 <= parents[i] < i); "
                         f"parents[{i}] = {p}")
    object.__setattr__(self, "parents", tuple(int(p) for p in parents))

  @classmethod
  def chain(cls, length: int) -> "TokenTree":
    """The root and `length` nodes in a line."""
    length = check_int("length", length, 1)
    return cls((-1,) + tuple(range(length)))

  @classmethod
  def from_paths(cls, paths: Iterable[Sequence[int]]) -> "TokenTree":
    """A tree from child-rank paths (Medusa's notation): (i1, i2, ...) is the root's i1-th
    child's i2-th child, ... Every prefix of a path must be a path too; nodes are numbered by
    depth, then path order."""
    paths = sorted({tuple(int(x) for x in p) for p in paths}, key=lambda p: (len(p), p))
    index = {(): 0}
    parents = [-1]
    for p in paths:
      if not p:
        continue
      if p[:-1] not in index:
        raise ValueError(f"path {p} has no parent path {p[:-1]} in the tree")
      index[p] = len(parents)
      parents.append(index[p[:-1]])
    tree = cls(tuple(parents))
    object.__setattr__(tree, "_paths", tuple(sorted(index, key=index.get)))
    return tree

  @property
  def size(self) -> int:
    """N, nodes including the root."""
    return len(self.parents)

  @property
  def depths(self) -> np.ndarray:
    """int `[N]`: edges from the root."""
    d = np.zeros((self.size,), np.int32)
    for i in range(1, self.size):
      d[i] = d[self.parents[i]] + 1
    return d

  @property
  def depth(self) -> int:
    """D, the longest root path's edges."""
    return int(self.depths.max())

  @property
  def children(self) -> np.ndarray:
    """int `[N, C]`: each node's children in index order (the order tried), padded with -1;
    C = the largest number of children (>= 1)."""
    kids = [[] for _ in range(self.size)]
    for i in range(1, self.size):
      kids[self.parents[i]].append(i)
    c = max(1, max(len(k) for k in kids))
    out = np.full((self.size, c), -1, np.int32)
    for i, k in enumerate(kids):
      out[i, :len(k)] = k
    return out

  @property
  def ancestor_mask(self) -> np.ndarray:
    """bool `[N, N]`: m[i, j] = node j is node i or one of its ancestors."""
    m = np.eye(self.size, dtype=bool)
    for i in range(1, self.size):
      m[i] |= m[self.parents[i]]
    return m

  def truncated(self, depth: int) -> "TokenTree":
    """The nodes at most `depth` (>= 1) deep, in order (`gamma="auto"`'s smaller trees)."""
    depth = check_int("depth", depth, 1)
    if depth >= self.depth:
      return self
    keep = [i for i, d in enumerate(self.depths) if d <= depth]
    new = {old: j for j, old in enumerate(keep)}
    return TokenTree(tuple(-1 if i == 0 else new[self.parents[i]] for i in keep))

  def paths(self) -> Tuple[Tuple[int, ...], ...]:
    """Each node's child-rank path (the root's is ())."""
    if hasattr(self, "_paths"):
      return self._paths
    kids = self.children
    out = [()]
    for i in range(1, self.size):
      p = self.parents[i]
      out.append(out[p] + (int(np.nonzero(kids[p] == i)[0][0]),))
    return tuple(out)

  def layout(self) -> CallLayout:
    """The target call over the tree's nodes (node i at call position i)."""
    leaves = [i for i in range(self.size) if i and not (np.asarray(self.parents) == i).any()]
    depth = max(self.depth, 1)
    chains = np.zeros((max(len(leaves), 1), depth), np.int32)
    for k, leaf in enumerate(leaves):
      path = []
      node = leaf
      while node:
        path.append(node)
        node = self.parents[node]
      path = path[::-1]
      chains[k, :len(path)] = path
      chains[k, len(path):] = path[-1]
    if not leaves:
      raise ValueError("a tree needs at least one node besides the root")
    return CallLayout(length=self.size, chains_KN=chains, offsets_T=self.depths,
                      mask_TT=self.ancestor_mask, parents_T=np.asarray(self.parents, np.int32))


def dynamic_tree_arrays(parents_BN: jax.Array, max_children: int
                        ) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """In-graph `TokenTree` arrays for per-row trees (EAGLE-2's dynamic tree).

  `parents_BN`: int32, row b's node n has parent `parents_BN[b, n]` (-1 for the root, node 0;
  parents before children). Returns `(depths_BN, ancestors_BNN, children_BNC)`, per row what
  `TokenTree.depths`, `.ancestor_mask` and `.children` (first `max_children`, -1 padded) give.
  """
  b, n = parents_BN.shape
  parents_BN = parents_BN.astype(jnp.int32)
  eye_NN = jnp.eye(n, dtype=bool)

  def add(i, anc_BNN):
    p_B = jnp.maximum(parents_BN[:, i], 0)
    row_BN = jnp.take_along_axis(anc_BNN, p_B[:, None, None], axis=1)[:, 0]
    row_BN = jnp.where((parents_BN[:, i] >= 0)[:, None], row_BN, False) | eye_NN[i][None]
    return anc_BNN.at[:, i].set(row_BN)

  anc_BNN = jax.lax.fori_loop(1, n, add, jnp.broadcast_to(eye_NN, (b, n, n)))
  depths_BN = jnp.sum(anc_BNN, axis=2).astype(jnp.int32) - 1
  idx_N = jnp.arange(n, dtype=jnp.int32)
  is_child_BNT = parents_BN[:, None, :] == idx_N[None, :, None]
  score_BNT = jnp.where(is_child_BNT, n - idx_N[None, None, :], 0)
  top_BNC, _ = jax.lax.top_k(score_BNT, max_children)
  children_BNC = jnp.where(top_BNC > 0, n - top_BNC, -1).astype(jnp.int32)
  return depths_BN, anc_BNN, children_BNC


def draw_children(logits_BV: jax.Array, sampling: SamplingConfig, count: int,
                  u_BR: Optional[jax.Array], mode: str
                  ) -> Tuple[jax.Array, Optional[jax.Array], jax.Array]:
  """The `count` children of one node, from a drafter's logits there.

  `mode`: "top_k": the `count` most likely tokens (deterministic, verified as one-hot
  proposals); "iid": each child drawn from the processed distribution p (`sampling`: the
  target's) with its own uniform `u_BR[:, r]`; "without": without replacement, child r from p
  with the earlier children removed, renormalised. At temperature 0 every mode takes top-k.

  Returns `(tokens_BR, probs_BRV, valid_BR)`: the children, the distribution each was drawn
  from given its earlier siblings (what `tree_verify` needs; None for top-k) and whether it
  exists (without replacement a child needs mass left: top-p may leave fewer tokens).
  """
  check_child_mode("mode", mode)
  b = logits_BV.shape[0]
  if mode == "top_k" or sampling.is_greedy:   # T = 0: the same decisions as one-hot proposals
    _, tok_BR = top_k_over_vocab(logits_BV, count)
    return tok_BR, None, jnp.ones((b, count), bool)
  p_BV = process_logits(logits_BV, sampling)
  toks, probs, valid = [], [], []
  q_BV = p_BV
  for r in range(count):
    mass_B = jnp.sum(q_BV, axis=-1)
    q_BV = q_BV / jnp.maximum(mass_B, 1e-30)[:, None]
    tok_B = sample_from_uniform(u_BR[:, r], q_BV)
    toks.append(tok_B.astype(jnp.int32))
    probs.append(q_BV)
    valid.append(mass_B > 0)
    if mode == "without":
      q_BV = jnp.where(jax.nn.one_hot(tok_B, q_BV.shape[-1], dtype=bool), 0.0, q_BV)
  return jnp.stack(toks, 1), jnp.stack(probs, 1), jnp.stack(valid, 1)
