"""PARD: a draft model that proposes its whole chain in one forward pass.

PARD (Parallel Draft, arXiv 2504.18583) trains a small LM to also predict tokens several places
ahead from mask tokens (`specjax.training.parallel`). `ParallelDraft(model, mask_id)` drafts γ
tokens with **one** draft call, where `ModelDrafter` makes γ:

  [committed tokens the draft has not read, pending, mask × (γ - 1)]

The output at the pending token gives draft 1's distribution, the output at mask slot j draft
j + 1's; each draft is drawn from its own distribution with its own uniform. The draft never
reads the target (one trained draft serves every target with its vocabulary).

The draft's cache holds every committed position before the row's pending token. The drafted
tokens are not fed back, so the next call first re-feeds what was committed since (up to γ
accepted drafts, the last one the row's `prev`), then the new pending token: a static 2γ tokens
(n ≤ γ committed, the pending one, γ - 1 masks, padding nothing attends to), contiguous from the
cache's length, a plain causal block. Afterwards the cache's length is set just past the pending
token; the masks' and padding's keys and values beyond it are overwritten later.

Adaptive γ: the state is sized for G = max Γ; a call at γ <= G holds G + γ tokens. Through plain
target steps the draft reads nothing; before it drafts again the loop hands it what it missed
(`feed`), so a PARD draft costs nothing while γ = 0.

Exactness: draft j is drawn from q_j, a function of committed tokens only, and q_j is what the
verifier is given: the rejection rule is exact for any such proposal, whether or not q_j depends
on the earlier drafts. The mask token is never proposed (its logit is removed first).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
from flax import struct

from specjax._checks import check_int
from specjax.atomic_io import as_path
from specjax.checkpoints.heads import final_dir
from specjax.checkpoints.orbax_io import restore_model
from specjax.drafting import (CallLayout, DraftFeedback, DraftInput, Drafter, Proposal,
                              chain_layout)
from specjax.drafters.model import check_draft_model
from specjax.protocol import check_params
from specjax.sampling import SamplingConfig, draw, process_logits

__all__ = ["ParallelDraft", "ParallelState", "load_parallel_draft"]


@struct.dataclass
class ParallelState:
  """`ParallelDraft`'s state.

  cache: the draft's KV cache, holding each row's positions < its length;
  unread_BG: int32 `[B, G]`, committed tokens the cache has not read yet (row b's first
  `seq_len - cache.lengths[b]`, in order; the pending token is not among them).
  """

  cache: Any
  unread_BG: jax.Array


@dataclasses.dataclass(frozen=True)
class ParallelDraft(Drafter):
  """A PARD draft (see the module doc).

  Attributes:
    model: the draft, a `LanguageModel` with the target's vocabulary, trained with mask slots
      (`specjax.training.parallel`, `parallel_slots` ≥ γ - 1).
    mask_id: the mask token it was trained with.
    slots: the mask slots it was trained for (γ <= slots + 1, checked), or None: not checked
      (untrained slots draft poorly but exactly).
  """

  model: Any
  mask_id: int = 0
  slots: Optional[int] = None

  deterministic = False
  adaptive = True
  catches_up = True

  def __post_init__(self):
    check_int("mask_id", self.mask_id, 0)
    if self.slots is not None:
      check_int("slots", self.slots, 1)

  @property
  def gamma_limit(self) -> Optional[int]:
    return None if self.slots is None else self.slots + 1

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  def check(self, target: Any, gamma: int) -> None:
    check_draft_model(self.model, target)
    if self.mask_id >= self.model.vocab_size:
      raise ValueError(f"mask_id ({self.mask_id}) must be a token of the draft's vocabulary "
                       f"(< {self.model.vocab_size})")
    if self.slots is not None and gamma > self.slots + 1:
      raise ValueError(f"gamma ({gamma}) needs {gamma - 1} mask slots; this PARD draft was "
                       f"trained with {self.slots} (gamma <= {self.slots + 1})")

  def check_params(self, params: Any) -> None:
    check_params(self.model, params, "draft_params")

  def layout(self, gamma: int) -> CallLayout:
    return chain_layout(gamma)

  def alloc(self, batch_size: int, prompt_len: int, cache_len: int, gamma: int) -> ParallelState:
    # A call writes up to 2γ slots from the cache's length (<= the target's): γ more than the
    # target's call of γ + 1 (a `feed` of γ + 1 tokens stays within them).
    return ParallelState(cache=self.model.init_cache(batch_size, cache_len + gamma, prompt_len),
                         unread_BG=jnp.zeros((batch_size, gamma), jnp.int32))

  def start(self, params, state: ParallelState, prompts_BP, lengths_B, first_B,
            target_cache) -> ParallelState:
    del first_B, target_cache
    _, _, cache = self.model.prefill(params, prompts_BP, lengths_B, state.cache)
    return state.replace(cache=cache)

  def propose(self, params, state: ParallelState, inp: DraftInput, u_BG: jax.Array,
              sampling: SamplingConfig, gamma: int) -> Tuple[Proposal, ParallelState]:
    cache = state.cache
    room = state.unread_BG.shape[1]   # γ, or max Γ of an adaptive loop
    t = jnp.arange(room + gamma, dtype=jnp.int32)[None, :]
    n_B1 = jnp.clip(inp.seq_len_B - cache.lengths, 0, room)[:, None]
    unread_BT = jnp.take_along_axis(state.unread_BG, jnp.minimum(t, room - 1), axis=1)
    # The last unread position holds `prev` (an adaptive loop's plain step may have committed it
    # since the state was last written).
    tokens_BT = jnp.where(t < n_B1 - 1, unread_BT,
                          jnp.where(t == n_B1 - 1, inp.prev_B[:, None],
                                    jnp.where(t == n_B1, inp.pending_B[:, None], self.mask_id)))
    # Done rows may have run past their cache's length: start them at the committed length.
    cache = cache.replace(lengths=inp.seq_len_B - n_B1[:, 0])
    logits_BTV, cache = self.model.extend(params, tokens_BT, cache)
    at_BG = n_B1 + jnp.arange(gamma, dtype=jnp.int32)[None, :]
    logits_BGV = jnp.take_along_axis(logits_BTV, at_BG[:, :, None], axis=1)
    logits_BGV = logits_BGV.at[..., self.mask_id].set(-jnp.inf)
    probs_BGV = process_logits(logits_BGV, sampling)
    b = probs_BGV.shape[0]
    drafts_BG = draw(u_BG[:, :gamma].reshape(-1), probs_BGV.reshape(b * gamma, -1),
                     sampling).reshape(b, gamma)
    proposal = Proposal(tokens_BT=jnp.concatenate([inp.pending_B[:, None], drafts_BG], axis=1),
                        valid_BKN=jnp.ones((b, 1, gamma), bool), probs_BGV=probs_BGV)
    return proposal, state.replace(cache=cache.replace(lengths=inp.seq_len_B + 1))

  def update(self, params, state: ParallelState, feedback: DraftFeedback) -> ParallelState:
    """Keeps the accepted drafts (all committed tokens but the new pending one) for the next
    call to re-feed (plain steps do not call it: `feed` reads what they committed)."""
    del params
    g, c = state.unread_BG.shape[1], feedback.committed_BC.shape[1]
    unread_BG = jnp.pad(feedback.committed_BC[:, :g], ((0, 0), (0, max(0, g - c))))
    return state.replace(unread_BG=unread_BG.astype(jnp.int32))

  def feed(self, params, state: ParallelState, tokens_BT: jax.Array,
           start_B: jax.Array) -> ParallelState:
    """Reads committed tokens `tokens_BT` at stream positions start_B ..: one call of the row's
    unread tokens before start_B, then those. The last token fed is kept unread (the caller's
    tokens past a row's committed ones may be anything: the next call re-feeds or overwrites
    it)."""
    cache = state.cache
    g, t = state.unread_BG.shape[1], tokens_BT.shape[1]
    n_B1 = jnp.clip(start_B - cache.lengths, 0, g)[:, None]
    i_T = jnp.arange(g + t, dtype=jnp.int32)[None, :]
    unread_BT = jnp.take_along_axis(state.unread_BG, jnp.minimum(i_T, g - 1), axis=1)
    given_BT = jnp.take_along_axis(tokens_BT, jnp.clip(i_T - n_B1, 0, t - 1), axis=1)
    _, cache = self.model.extend(params, jnp.where(i_T < n_B1, unread_BT, given_BT),
                                 cache.replace(lengths=start_B - n_B1[:, 0]))
    unread_BG = state.unread_BG.at[:, 0].set(tokens_BT[:, -1].astype(jnp.int32))
    return state.replace(cache=cache.replace(lengths=start_B + t - 1), unread_BG=unread_BG)

  def calls_per_iteration(self, gamma: int) -> int:
    """One draft call per iteration, whatever γ (none at a plain step)."""
    return 1 if gamma else 0


def load_parallel_draft(directory: str) -> Tuple[ParallelDraft, Any]:
  """(drafter, params) of a draft trained with mask slots (`<dir>` or `<dir>/final` of
  `specjax.training.train_model` with `config.parallel_slots` > 0); the mask id and slot count
  come from the run's stored training fields."""
  d = final_dir(directory)
  model, params = restore_model(d)
  meta_path = as_path(d) / "train_meta.json"
  try:
    train = json.loads(meta_path.read_text())["train"]
  except (OSError, ValueError, KeyError) as e:
    raise ValueError(f"{meta_path}: no training record to read the mask token from ({e})") \
        from None
  slots = int(train.get("parallel_slots", 0))
  if slots < 1:
    raise ValueError(f"{d} holds a draft trained without mask slots (parallel_slots = 0): "
                     "train it with config.parallel_slots > 0 (specjax.training.parallel)")
  return ParallelDraft(model, int(train["parallel_mask_id"]), slots), params
