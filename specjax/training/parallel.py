"""PARD's training objective: a draft LM that also fills mask slots.

PARD (Parallel Draft, arXiv 2504.18583) turns a small autoregressive LM into a drafter that
proposes γ tokens in **one** forward pass: after the real tokens x_0..x_t it reads γ - 1 mask
tokens at positions t + 1 .. t + γ - 1, and mask slot j predicts x_{t+1+j}. Nothing reads the
target, so one trained draft serves every target of a family (`drafters.ParallelDraft`).

Training (`ParallelObjective`): every position of a row is an anchor at once. The row's L real
tokens are followed by `slots` groups of L mask tokens, group j's token for anchor t at
position t + j, attending to the real tokens at positions <= t and to its own anchor's mask
tokens of groups <= j (one forward over L·(slots + 1) tokens, `parallel_inputs`). Real tokens
attend causally, so slot 0 is the ordinary LM loss. Loss: the slots' cross-entropies against
the data, slot j weighted `decay^j`, normalised (DFlash's position-decayed loss, arXiv
2602.06036: a slot only counts when the earlier ones are accepted). As in PARD it trains on
data, not a target's outputs (what keeps it target-independent); PARD's conditional token
dropping is not done: every anchor is kept.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax._checks import check_int, check_real
from specjax.models.decoder import DecoderLM

__all__ = ["ParallelObjective", "parallel_inputs", "parallel_logits", "slot_targets"]


@dataclasses.dataclass(frozen=True)
class ParallelObjective:
  """PARD's objective (see the module doc).

  Attributes:
    slots: mask slots trained (a draft of γ tokens needs γ - 1); >= 1.
    mask_id: the mask token's id in the draft's vocabulary (a reserved token; specjax's
      SentencePiece vocabularies use the pad id 0, never an input at a real position).
    decay: slot j's loss weight is decay^j (slot 0, the LM loss, weighs 1).
  """

  slots: int
  mask_id: int = 0
  decay: float = 0.8

  def __post_init__(self):
    check_int("slots", self.slots, 1)
    check_int("mask_id", self.mask_id, 0)
    check_real("decay", self.decay, 0.0, 1.0, lo_open=True)

  def check(self, model: Any) -> None:
    """Raises naming the problem when `model` cannot take the objective."""
    if not isinstance(model, DecoderLM):
      raise TypeError(f"the parallel (PARD) objective trains a decoder-only DecoderLM, got "
                      f"{type(model).__name__}")
    if self.mask_id >= model.vocab_size:
      raise ValueError(f"parallel mask_id ({self.mask_id}) must be a token of the draft's "
                       f"vocabulary (< vocab_size {model.vocab_size})")

  @property
  def weights(self) -> np.ndarray:
    """float32 `[slots + 1]`: each slot's loss weight, summing to 1."""
    w = self.decay ** np.arange(self.slots + 1, dtype=np.float64)
    return (w / w.sum()).astype(np.float32)


@functools.lru_cache(maxsize=16)
def _layout(length: int, slots: int) -> Tuple[np.ndarray, np.ndarray]:
  """(positions `[T]`, mask `[T, T]`) of a row of `length` real tokens and `slots` mask groups,
  T = length · (slots + 1); token j·L + t is anchor t's slot j (j = 0: the real token t)."""
  k = slots + 1
  t = np.tile(np.arange(length), k)                     # anchor of each token
  j = np.repeat(np.arange(k), length)                   # slot of each token
  pos = t + j
  real_key = (j == 0)[None, :] & (t[None, :] <= t[:, None])
  own_slot = (j[None, :] >= 1) & (t[None, :] == t[:, None]) & (j[None, :] <= j[:, None])
  return pos.astype(np.int32), real_key | own_slot


def parallel_inputs(tokens_BL: jax.Array, slots: int, mask_id: int
                    ) -> Tuple[jax.Array, jax.Array, np.ndarray]:
  """The expanded row (module doc): tokens `[B, T]`, positions `[B, T]` (int32) and the
  attention mask `[T, T]` (static numpy), T = L · (slots + 1)."""
  b, length = tokens_BL.shape
  pos_T, mask_TT = _layout(int(length), int(slots))
  masks = jnp.full((b, length * slots), mask_id, tokens_BL.dtype)
  tokens_BT = jnp.concatenate([tokens_BL, masks], axis=1)
  return tokens_BT, jnp.broadcast_to(jnp.asarray(pos_T)[None], (b, pos_T.size)), mask_TT


def parallel_logits(model: Any, params: Any, tokens_BL: jax.Array, slots: int,
                    mask_id: int) -> jax.Array:
  """float32 logits `[B, slots + 1, L, V]`: `[:, j, t]` is anchor t's slot j (slot 0:
  `model.forward`'s next-token logits)."""
  b, length = tokens_BL.shape
  tokens_BT, pos_BT, mask_TT = parallel_inputs(tokens_BL, slots, mask_id)
  logits_BTV = model.forward(params, tokens_BT, positions_BT=pos_BT, mask_TT=jnp.asarray(mask_TT))
  return logits_BTV.reshape(b, slots + 1, length, -1)


def slot_targets(targets_BL: jax.Array, mask_BL: jax.Array, slot: int
                 ) -> Tuple[jax.Array, jax.Array]:
  """(targets, loss mask) `[B, L]` of mask slot `slot` (>= 1): anchor t is scored against
  targets_BL[t + slot] where mask_BL[t + slot] is set (none within `slot` of the row's end)."""
  pad = ((0, 0), (0, slot))
  return jnp.pad(targets_BL[:, slot:], pad), jnp.pad(mask_BL[:, slot:], pad)
