"""Logits → processed probabilities, and sampling from them.

The speculative accept/reject rule is exact only when the draft's and the
target's distributions are processed the *same* way (temperature, top-k,
top-p) before they are compared (BRIEF §1). `process_logits` is therefore the
single place where that processing happens; both models go through it.

Shapes: any leading dims `[...]`, vocabulary last (`V`).
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp

__all__ = ["SamplingConfig", "process_logits", "sample_tokens", "greedy", "GREEDY"]


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How logits become a distribution to sample from.

  Attributes:
    temperature: softmax temperature; 0 means greedy (the distribution is a
      one-hot on the argmax, so speculative greedy equals plain greedy).
    top_k: keep only the k most likely tokens (ties at the k-th value are
      kept); 0 disables.
    top_p: nucleus sampling, keep the smallest set of most likely tokens whose
      mass reaches top_p; 1.0 disables. Must lie in (0, 1].

  Processing order (as in transformers): temperature, then top-k, then top-p,
  renormalising after each filter.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    t, k, p = self.temperature, self.top_k, self.top_p
    if isinstance(t, bool) or not isinstance(t, numbers.Real):
      raise TypeError(f"temperature must be a real number, got {t!r}")
    if not t >= 0 or t != t or t == float("inf"):
      raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {t!r}")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
      raise TypeError(f"top_k must be an int (0 disables), got {k!r}")
    if k < 0:
      raise ValueError(f"top_k must be >= 0 (0 disables), got {k!r}")
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
      raise TypeError(f"top_p must be a real number in (0, 1], got {p!r}")
    if not 0.0 < p <= 1.0:
      raise ValueError(f"top_p must lie in (0, 1] (1 disables), got {p!r}")
    # Normalise types so equal configs hash equal (they are jit-static).
    object.__setattr__(self, "temperature", float(t))
    object.__setattr__(self, "top_k", int(k))
    object.__setattr__(self, "top_p", float(p))

  @property
  def is_greedy(self) -> bool:
    """True when temperature is 0: argmax decoding."""
    return self.temperature == 0.0


GREEDY = SamplingConfig(temperature=0.0)


def greedy() -> SamplingConfig:
  """The greedy sampling config (temperature 0)."""
  return GREEDY


def process_logits(logits: jax.Array, config: SamplingConfig) -> jax.Array:
  """Turns logits `[..., V]` into the processed float32 distribution `[..., V]`.

  Greedy configs give a one-hot on the argmax (first index on ties), so the
  generic rejection rule reduces to "accept iff the draft token is the
  target's argmax" and the residual to the target's argmax.
  """
  if not isinstance(config, SamplingConfig):
    raise TypeError(f"config must be a SamplingConfig, got {type(config).__name__}")
  logits = logits.astype(jnp.float32)
  vocab = logits.shape[-1]
  if config.is_greedy:
    return jax.nn.one_hot(jnp.argmax(logits, axis=-1), vocab, dtype=jnp.float32)
  logits = logits / config.temperature
  if 0 < config.top_k < vocab:
    kth = jax.lax.top_k(logits, config.top_k)[0][..., -1:]
    logits = jnp.where(logits >= kth, logits, -jnp.inf)
  probs = jax.nn.softmax(logits, axis=-1)
  if config.top_p < 1.0:
    sorted_probs = jnp.flip(jnp.sort(probs, axis=-1), axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    keep_sorted = mass_before < config.top_p
    # The smallest kept probability; every token at least that likely stays.
    threshold = jnp.min(jnp.where(keep_sorted, sorted_probs, jnp.inf), axis=-1, keepdims=True)
    probs = jnp.where(probs >= threshold, probs, 0.0)
    probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
  return probs


def sample_tokens(keys_B: jax.Array, probs_BV: jax.Array) -> jax.Array:
  """Draws one token per row, row b with its own key `keys_B[b]`.

  Args:
    keys_B: typed PRNG keys `[B]`.
    probs_BV: probabilities `[B, V]` (zeros allowed; rows must have mass).

  Returns:
    int32 tokens `[B]`.
  """
  logp_BV = jnp.log(probs_BV)
  return jax.vmap(lambda k, lp: jax.random.categorical(k, lp))(keys_B, logp_BV).astype(jnp.int32)
