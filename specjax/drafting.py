"""The drafter protocol: what `SpeculativeDecoder` needs from a source of drafts.

A drafter is a frozen (hashable) dataclass subclassing `Drafter` — a static argument of the jitted
loop — with pure methods over an explicit state pytree (a draft model's KV cache, a token history,
an n-gram pool, ...). One speculative iteration, for every row at once:

  1. `propose(params, state, inp, u_BG, sampling, gamma)` → `(Proposal, state)`: the target
     call's tokens (`[B, T]`, token 0 the pending token), which drafts are valid and, unless
     `deterministic`, the distributions they were drawn from;
  2. the target runs once on those T tokens (positions and mask fixed by `layout(gamma)`);
  3. the drafts are verified exactly (`specjax.verify`) and the accepted tokens committed;
  4. `update(params, state, feedback)` → state: the drafter sees what was committed.

Drafted tokens form K chains of n tokens (`CallLayout.chains_KN`), all rooted at the pending
token: a draft model proposes one chain (K = 1, n = γ), lookahead several n-gram candidates. A row
proposes fewer tokens by marking them invalid; a row with none runs a plain target step.

Exactness: model drafts carry their proposal distributions `[B, G, V]` and are verified by the
rejection rule; deterministic drafts as drafts from a one-hot proposal (accept d with probability
q(d); on rejection q with d removed, renormalised). Either way the output has exactly the target's
distribution, whatever the drafter proposes.

Shapes: B batch, G = γ, T tokens in the target call, K chains, N = n, V vocabulary.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Mapping, Optional, Tuple

import jax
import numpy as np
from flax import struct

from specjax.protocol import check_params

__all__ = ["Drafter", "Proposal", "CallLayout", "DraftInput", "DraftFeedback", "is_drafter",
           "chain_layout", "check_head_params"]


@dataclasses.dataclass(frozen=True)
class CallLayout:
  """The static shape of one target call (one compilation per layout).

  Attributes:
    length: T, tokens in the call (token 0 is the pending token).
    chains_KN: int numpy `[K, N]`, the call position (>= 1) of token j of chain k; each attends
      to the chain's tokens before it and to the pending token.
    offsets_T: int numpy `[T]`, each token's position relative to the pending token's (None:
      0..T-1, a plain causal block).
    mask_TT: bool numpy `[T, T]`, which new tokens each new token attends to (None: causal).
      Every token also attends to the committed cache.
    parents_T: int numpy `[T]`: a token tree (`specjax.tree.TokenTree`) whose nodes are the
      call's tokens, verified by `tree_verify`; None: chains / candidates.
    dynamic_tree: `(depth, max_children)` for a tree whose topology is per-row data (EAGLE-2:
      `Proposal.node_parents_BT`); positions and mask then come from the proposal, `chains_KN` is
      `[[1..depth]]` (it sizes the commit) and `offsets_T`, `mask_TT`, `parents_T` are None.
  """

  length: int
  chains_KN: Any
  offsets_T: Any = None
  mask_TT: Any = None
  parents_T: Any = None
  dynamic_tree: Optional[Tuple[int, int]] = None

  def __post_init__(self):
    chains = np.asarray(self.chains_KN)
    if chains.ndim != 2 or chains.size == 0:
      raise ValueError(f"chains_KN must be a non-empty [K, N] array, got shape {chains.shape}")
    if chains.min() < 1 or chains.max() >= self.length:
      raise ValueError(f"chain positions must lie in [1, {self.length}), got {chains.min()}.."
                       f"{chains.max()}")
    if self.dynamic_tree is not None:
      depth, kids = self.dynamic_tree
      if not 1 <= depth < self.length or kids < 1:
        raise ValueError(f"dynamic_tree must be (depth in [1, {self.length}), max_children >= "
                         f"1), got {self.dynamic_tree}")
      if any(a is not None for a in (self.offsets_T, self.mask_TT, self.parents_T)):
        raise ValueError("a dynamic tree's offsets, mask and parents come from the proposal")

  @classmethod
  def dynamic(cls, nodes: int, depth: int, max_children: int) -> "CallLayout":
    """A dynamic tree's call: `nodes` nodes (root included), <= `depth` deep, <= `max_children`."""
    return cls(length=nodes, chains_KN=np.arange(1, depth + 1)[None, :],
               dynamic_tree=(int(depth), int(max_children)))

  def __hash__(self):
    arrays = tuple(None if a is None else (np.asarray(a).shape, np.asarray(a).tobytes())
                   for a in (self.chains_KN, self.offsets_T, self.mask_TT, self.parents_T))
    return hash((self.length, self.dynamic_tree) + arrays)

  def __eq__(self, other):
    if not isinstance(other, CallLayout) or self.length != other.length:
      return False
    if self.dynamic_tree != other.dynamic_tree:
      return False
    for a, b in ((self.chains_KN, other.chains_KN), (self.offsets_T, other.offsets_T),
                 (self.mask_TT, other.mask_TT), (self.parents_T, other.parents_T)):
      if (a is None) != (b is None) or (a is not None and not np.array_equal(a, b)):
        return False
    return True

  @property
  def num_chains(self) -> int:
    return int(np.asarray(self.chains_KN).shape[0])

  @property
  def chain_len(self) -> int:
    return int(np.asarray(self.chains_KN).shape[1])

  @property
  def is_plain_chain(self) -> bool:
    """One causal contiguous chain after the pending token: accepted drafts' KV stay in place."""
    chains = np.asarray(self.chains_KN)
    t = self.length
    return (self.dynamic_tree is None and chains.shape[0] == 1 and t == chains.shape[1] + 1
            and np.array_equal(chains[0], np.arange(1, t))
            and (self.offsets_T is None or np.array_equal(self.offsets_T, np.arange(t)))
            and (self.mask_TT is None
                 or np.array_equal(self.mask_TT, np.tril(np.ones((t, t), bool)))))

  @property
  def is_tree(self) -> bool:
    return self.parents_T is not None or self.dynamic_tree is not None


def chain_layout(gamma: int) -> CallLayout:
  """The classic layout: [pending, d_1..d_γ], causal."""
  return CallLayout(length=gamma + 1, chains_KN=np.arange(1, gamma + 1)[None, :])


@struct.dataclass
class DraftInput:
  """What a drafter may read of the decoding state (per row, `[B]`).

  seq_len_B: committed positions in the target's cache (the pending token goes to seq_len_B);
  pending_B: the last committed token, not yet fed to the target; prev_B: the token at
  seq_len_B - 1; done_B: rows that finished; step: the iteration (scalar).
  """

  seq_len_B: jax.Array
  pending_B: jax.Array
  prev_B: jax.Array
  done_B: jax.Array
  step: jax.Array


@struct.dataclass
class Proposal:
  """One iteration's drafts.

  Attributes:
    tokens_BT: int32 `[B, T]`, the target call's tokens; `[:, 0]` is the pending token, the
      chains' tokens at `layout.chains_KN`.
    valid_BKN: bool `[B, K, N]`, which drafted tokens a row proposes (a prefix of each chain).
    probs_BGV: `[B, G, V]` float32 distributions the single chain (K = 1, N = G) was drawn from,
      after the target's temperature / top-k / top-p; None for deterministic drafters.
    node_valid_BT, node_probs_BTV: for a token tree (`layout.is_tree`): which nodes a row
      proposes (the root always) and the distribution each node's token was drawn from given the
      siblings tried before it (None: deterministic); `valid_BKN` is then unused (may be None).
    node_parents_BT: int32 `[B, T]`, each row's own tree (dynamic-tree layout): node t's parent
      (-1 for the root, parents before children); children are tried in index order.
  """

  tokens_BT: jax.Array
  valid_BKN: jax.Array
  probs_BGV: Optional[jax.Array] = None
  node_valid_BT: Optional[jax.Array] = None
  node_probs_BTV: Optional[jax.Array] = None
  node_parents_BT: Optional[jax.Array] = None


@struct.dataclass
class DraftFeedback:
  """What the iteration committed (for `Drafter.update`).

  Attributes:
    committed_BC: int32 `[B, C]`, the tokens committed (the first `count_B[b]` of row b; C = N + 1).
    count_B: int32 `[B]` committed tokens (0 for rows already done).
    seq_len_B: committed positions after the commit (the new pending token is not cached yet).
    pending_B: the new pending token.
    target_argmax_BT: int32 `[B, T]`, the target's most likely next token after each token of
      the call (lookahead's Jacobi step reads it).
    chain_B, accepted_B: the chain the accepted tokens came from and how many were accepted.
    target_hidden_BE: with `needs_hidden`: the target's final hidden state at the last accepted
      token (the pending token's predecessor), else None.
    target_hidden_BCX: with `needs_hidden`: `[B, C, X]`, the target's hidden states
      (final-normed, or the drafter's `hidden_layers`) at the call's root, then at each accepted
      token in order (entry `accepted_B[b]` is the last accepted one).
  """

  committed_BC: jax.Array
  count_B: jax.Array
  seq_len_B: jax.Array
  pending_B: jax.Array
  target_argmax_BT: jax.Array
  chain_B: jax.Array
  accepted_B: jax.Array
  target_hidden_BE: Optional[jax.Array] = None
  target_hidden_BCX: Optional[jax.Array] = None


class Drafter(abc.ABC):
  """The base class of drafters (see the module doc): frozen, hashable dataclasses.

  Capabilities are declared here with their defaults and overridden by each drafter (class
  attributes or properties); the loop reads them, never probes for them:

  Attributes:
    deterministic: drafts come without proposal distributions (verified as one-hot proposals).
    uses_target_params: runs on the target's own weights (self-speculative):
      `speculative_generate(..., draft_params=None)` passes the target's.
    owns_model: a separate model with weights and a KV cache of its own (`model`): its cache is
      checked, allocated and placed like the target's (`draft_cache=`), and `specjax.aot`
      compiles it as a model of its own.
    needs_hidden: `update` reads the target's hidden states of the call (`DraftFeedback`).
    needs_prompt_hidden: reads the target's hidden states over the prompt, chunk by chunk during
      the target's prefill (`absorb`; the target must offer `prefill_with_hidden`), before `start`.
    hidden_layers: the target blocks whose outputs the hidden states are (None: final-normed).
    fixed_gamma: the γ the drafter always uses (None: the caller's).
    adaptive: γ may change between iterations, γ = 0 included (`gamma="auto"`): a chain drafter
      whose state does not depend on γ and that stays in step through plain target steps (by
      its `update`, or because it `catches_up`).
    catches_up: idle through plain target steps; before it drafts again the loop `feed`s it the
      missed tokens (calls of up to max Γ + 1 tokens), so a draft model costs nothing at γ = 0.
    offers_room: knows its drafts, whose number changes token by token, before drafting
      (`preview`; prompt lookup's matched continuation): an adaptive loop sizes each call by
      them, revisits its choice at every plain step, and counts whether the first draft it did
      not send equals the token committed in its place — a free observation of acceptance.
    splits_state: on a mesh, the weights are split over `model` like the target's and the state
      (`alloc`) laid out by its fields' shape suffixes — heads over `model`, rows over `data`
      (`sharding.state_spec`); False: only its rows over `data`.
    reads_target_lm_head: every call projects through the target's own output head (EAGLE,
      Medusa sharing it): weights read once per call but not owned (`specjax.aot` counts them).
    gamma_limit: the largest γ drafted (a static tree's depth, a PARD draft's trained slots + 1),
      or None: any. `gamma="auto"` caps Γ there.
  """

  deterministic: bool = False
  uses_target_params: bool = False
  owns_model: bool = False
  needs_hidden: bool = False
  needs_prompt_hidden: bool = False
  hidden_layers: Optional[Tuple[int, ...]] = None
  fixed_gamma: Optional[int] = None
  adaptive: bool = False
  catches_up: bool = False
  offers_room: bool = False
  splits_state: bool = False
  reads_target_lm_head: bool = False
  gamma_limit: Optional[int] = None

  def calls_per_iteration(self, gamma: int) -> int:
    """Drafter forward passes per iteration (for the statistics; default 0)."""
    del gamma
    return 0

  def check(self, target: Any, gamma: int) -> None:
    """Raises ValueError / TypeError naming what does not fit (vocabulary, γ, target kind)."""
    del target, gamma

  def check_params(self, params: Any) -> None:
    """Raises ValueError / TypeError naming `draft_params` when `params` (after self-drafters
    got the target's) do not fit the drafter. Default: nothing to check."""
    del params

  def refuse_params(self, params: Any) -> None:
    """`check_params` of a drafter that has no parameters: anything but None is a TypeError
    naming `draft_params` (it would be ignored)."""
    if params is not None:
      raise TypeError(f"draft_params must be None for {type(self).__name__}, which has no "
                      f"parameters (it would ignore them), got {type(params).__name__}")

  @abc.abstractmethod
  def layout(self, gamma: int) -> CallLayout:
    """The target call of one iteration (static)."""

  @abc.abstractmethod
  def alloc(self, batch_size: int, prompt_len: int, cache_len: int, gamma: int) -> Any:
    """Fresh state buffers (on the host; donated to the loop)."""

  @abc.abstractmethod
  def start(self, params: Any, state: Any, prompts_BP: jax.Array, lengths_B: jax.Array,
            first_B: jax.Array, target_cache: Any) -> Any:
    """The state after the prompts' prefill (in the loop's trace); `first_B` is the first
    generated token, `target_cache` the target's prefilled cache (`absorb`'s state, if any)."""

  def absorb(self, params: Any, state: Any, prompts_BP: jax.Array, lengths_B: jax.Array,
             start: Any, hidden_BCX: jax.Array) -> Any:
    """With `needs_prompt_hidden`: the state after reading the target's hidden states
    `hidden_BCX` of prompt positions start .. start + C - 1 (`start` an int or traced int32),
    once per prefill chunk in order — the prompt's `[B, P, X]` states are never held at once."""
    raise NotImplementedError(f"{type(self).__name__} declares needs_prompt_hidden but has no "
                              "absorb")

  @abc.abstractmethod
  def propose(self, params: Any, state: Any, inp: DraftInput, u_BG: Optional[jax.Array],
              sampling: Any, gamma: int) -> Tuple[Proposal, Any]:
    """Drafts for every row; a sampling drafter draws draft j with `u_BG[:, j]` (else None)."""

  @abc.abstractmethod
  def update(self, params: Any, state: Any, feedback: DraftFeedback) -> Any:
    """The state after the commit."""

  def feed(self, params: Any, state: Any, tokens_BT: jax.Array, start_B: jax.Array) -> Any:
    """With `catches_up`: the state after reading committed tokens `tokens_BT`, row b's at
    positions start_B[b] .. + T - 1 (what it holds past them may be overwritten)."""
    raise NotImplementedError(f"{type(self).__name__} declares catches_up but has no feed")

  def preview(self, params: Any, state: Any, inp: DraftInput, width: int
              ) -> Tuple[jax.Array, jax.Array]:
    """With `offers_room`: int32 (room_B, drafts_BW), the drafts each row would propose now (the
    first room_B[b] of `width` valid; a proposal of γ <= room_B[b] drafts is their prefix)."""
    raise NotImplementedError(f"{type(self).__name__} declares offers_room but has no preview")


def check_head_params(params: Any, keys: Tuple[str, ...], loader: str, target: Any) -> None:
  """Checks a draft head's params: a dict with exactly `keys` (as `loader` returns them), whose
  "target" entry, if any, is `target`'s tree (`protocol.check_params`). Named errors otherwise."""
  if not isinstance(params, Mapping) or set(params) != set(keys):
    got = sorted(params) if isinstance(params, Mapping) else type(params).__name__
    raise TypeError(f"draft_params must be a dict with keys {list(keys)} (what {loader} "
                    f"returns), got {got}")
  if target is not None and params.get("target") is not None:
    check_params(target, params["target"], "draft_params['target']")


def is_drafter(obj: Any) -> bool:
  """True for drafters (instances of `Drafter`), False for plain models."""
  return isinstance(obj, Drafter)
