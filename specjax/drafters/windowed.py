"""Self-speculative drafting with a windowed KV cache (StreamingLLM, MagicDec, TriForce).

The draft is the target (its own weights, every layer) attending only to the first `sinks`
positions (attention sinks) and the last `window`, held in a small static ring buffer: a step
reads `sinks + window` KV slots per layer instead of the whole context, which pays where KV
reads dominate (MagicDec: large batch × context).

  drafter = WindowedKV(target, window=64, sinks=4)
  out = specjax.speculative_generate(target, tp, drafter, None, prompts, ...)

The ring holds `sinks + window + slack` slots (slack = γ + 1: one iteration's writes past the
committed length never overwrite a position the window still needs, so rolling back is still
setting the length). Each slot records its position; it is attended when that position is
committed and a sink or within the window. After the target's prefill the ring is copied from
the target's own cache (same weights, same keys and values). Drafting then works as a draft
model's (`ModelDrafter`); rotary positions are the tokens' absolute ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Tuple

import jax
import jax.numpy as jnp
from flax import struct

from specjax.drafters.model import ModelDrafter
from specjax.models.decoder import DecoderLM, DecoderModule
from specjax.models.layers import kv_specs, zero_arrays
from specjax._checks import check_int

__all__ = ["WindowCache", "WindowedLM", "WindowedKV"]


@struct.dataclass
class WindowCache:
  """Ring-buffer KV cache of `WindowedLM`.

  k / v: L buffers `[B, K, D, R]` / `[B, K, R, D]` (R = sinks + window + slack); lengths `[B]`:
  committed positions; slot_pos: int32 `[B, R]`, the position each slot holds (-1: none).
  """

  k: Tuple[jax.Array, ...]
  v: Tuple[jax.Array, ...]
  lengths: jax.Array
  slot_pos: jax.Array

  @property
  def max_len(self) -> int:
    return self.v[0].shape[2]


@dataclasses.dataclass(frozen=True)
class WindowedLM:
  """The target `DecoderLM` over a ring cache of `sinks + window + slack` slots, on the
  target's params (a `LanguageModel` whose prefill is `start_from`)."""

  target: DecoderLM
  window: int
  sinks: int
  slack: int

  def __post_init__(self):
    if not isinstance(self.target, DecoderLM):
      raise TypeError(f"a windowed-KV self-draft runs a DecoderLM's weights; target is a "
                      f"{type(self.target).__name__}")
    for name, low in (("window", 1), ("sinks", 0), ("slack", 1)):
      check_int(name, getattr(self, name), low)

  @property
  def vocab_size(self) -> int:
    return self.target.vocab_size

  @property
  def ring(self) -> int:
    """Ring slots after the sinks."""
    return self.window + self.slack

  @property
  def slots(self) -> int:
    return self.sinks + self.ring

  def slot_of(self, pos):
    """The ring slot of absolute position(s) `pos`."""
    return jnp.where(pos < self.sinks, pos, self.sinks + (pos - self.sinks) % self.ring)

  def init_cache(self, batch_size: int, max_len: int = 0, prompt_len: int = 0) -> WindowCache:
    del max_len, prompt_len  # The ring's size is fixed by the window.
    c = self.target.config
    *kv, slot_pos, lengths = zero_arrays(
        *kv_specs(c.num_layers, batch_size, self.slots, c.num_kv_heads, c.head_dim,
                  jnp.dtype(c.dtype)), ((batch_size, self.slots), jnp.int32),
        ((batch_size,), jnp.int32))
    return WindowCache(k=tuple(kv[:c.num_layers]), v=tuple(kv[c.num_layers:]),
                       lengths=lengths, slot_pos=slot_pos - 1)

  def prefill_positions(self, prompt_len: int) -> int:
    return prompt_len

  def valid(self, cache: WindowCache) -> jax.Array:
    """bool `[B, R]`: slots holding a committed sink or window position."""
    pos, length = cache.slot_pos, cache.lengths[:, None]
    return (pos >= 0) & (pos < length) & ((pos < self.sinks) | (pos >= length - self.window))

  def start_from(self, target_cache, cache: WindowCache) -> WindowCache:
    """The ring filled from the target's prefilled `KVCache` (slots = positions): each row's
    sinks and last `window` positions."""
    length_B = target_cache.lengths.astype(jnp.int32)
    r = jnp.arange(self.slots)[None, :]
    # Ring slot r >= sinks holds the latest position p < length with slot(p) == r.
    latest = length_B[:, None] - 1 - jnp.mod(length_B[:, None] - 1 - r, self.ring)
    pos_BR = jnp.where(r < self.sinks, r, latest)
    keep = (pos_BR >= 0) & (pos_BR < length_B[:, None]) & (
        (pos_BR < self.sinks) | (pos_BR >= length_B[:, None] - self.window))
    src_BR = jnp.clip(pos_BR, 0, target_cache.max_len - 1)
    ks = tuple(jnp.take_along_axis(k, src_BR[:, None, None, :], axis=3) for k in target_cache.k)
    vs = tuple(jnp.take_along_axis(v, src_BR[:, None, :, None], axis=2) for v in target_cache.v)
    return WindowCache(k=ks, v=vs, lengths=length_B, slot_pos=jnp.where(keep, pos_BR, -1))

  def prefill(self, params, prompts_BP, prompt_lengths_B, cache):
    raise NotImplementedError("WindowedLM starts from the target's prefilled cache "
                              "(WindowedKV.start); use it through the WindowedKV drafter")

  def extend(self, params, tokens_BT: jax.Array, cache: WindowCache):
    """As `DecoderLM.extend` (absolute positions lengths + 0..T-1), over the ring."""
    t = tokens_BT.shape[1]
    pos_BT = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    slots_BT = self.slot_of(pos_BT)
    module = DecoderModule(self.target.config)
    h_BTE, new = module.apply({"params": params}, tokens_BT, cache, False, pos_BT, None,
                              self.valid(cache), slots_BT)
    logits = module.apply({"params": params}, h_BTE, method=DecoderModule.project)
    b = tokens_BT.shape[0]
    rows_BT = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
    slot_pos = cache.slot_pos.at[rows_BT, slots_BT].set(pos_BT, unique_indices=True)
    return logits, new.replace(slot_pos=slot_pos)


@dataclasses.dataclass(frozen=True)
class WindowedKV(ModelDrafter):
  """The windowed-KV self-draft (module doc): a `ModelDrafter` over `WindowedLM`, started from
  the target's cache. Build it with `WindowedKV.of(target, window, sinks, gamma)`; the ring's
  slack must be at least γ + 1 (checked when decoding)."""

  @classmethod
  def of(cls, target: DecoderLM, window: int, sinks: int = 4, gamma: int = 8) -> "WindowedKV":
    """The drafter for up to `gamma` drafts per iteration."""
    gamma = check_int("gamma", gamma, 1)
    return cls(WindowedLM(target, window, sinks, gamma + 1), uses_target_params=True)

  def check(self, target: Any, gamma: int) -> None:
    lm = self.model
    if lm.target != target:
      raise ValueError("a WindowedKV drafter must be built on the target it drafts for "
                       "(WindowedKV.of(target, ...))")
    if gamma + 1 > lm.slack:
      raise ValueError(f"gamma ({gamma}) needs a ring slack of at least gamma + 1 = {gamma + 1}; "
                       f"this drafter was built for gamma <= {lm.slack - 1} "
                       f"(WindowedKV.of(..., gamma={gamma}))")

  def check_cache(self, cache_len: int) -> None:
    lm = self.model
    if lm.window + lm.sinks >= cache_len:
      raise ValueError(f"window ({lm.window}) + sinks ({lm.sinks}) must be smaller than the "
                       f"target's cache ({cache_len} slots): a window that holds the whole "
                       "context reads as much as the target")

  def alloc(self, batch_size: int, prompt_len: int, cache_len: int, gamma: int) -> WindowCache:
    self.check_cache(cache_len)
    return self.model.init_cache(batch_size)

  def start(self, params, state, prompts_BP, lengths_B, first_B, target_cache) -> WindowCache:
    del params, prompts_BP, lengths_B, first_B
    return self.model.start_from(target_cache, state)
