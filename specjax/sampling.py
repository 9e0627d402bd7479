"""Logits → processed probabilities, and sampling from them.

The speculative accept/reject rule is exact only when the draft's and the
target's distributions are processed the *same* way (temperature, top-k,
top-p) before they are compared: processing only one side changes the
distribution sampled (vLLM PR 10198, transformers issue 47932 are that bug).
`process_logits` is therefore the single place where that processing
happens; both models go through it.

Shapes: any leading dims `[...]`, vocabulary last (`V`).
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp

__all__ = ["SamplingConfig", "process_logits", "sample_tokens", "sample_from_uniform",
           "row_uniforms", "draw", "argmax_first", "greedy", "GREEDY"]


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


def argmax_first(x: jax.Array, axis: int = -1) -> jax.Array:
  """int32 index of the maximum along `axis`, the first one on ties: exactly
  `jnp.argmax` (a NaN counts as the maximum, the first NaN wins).

  Two plain reductions (a max, then a min over the indices that reach it)
  instead of `jnp.argmax`'s (value, index) pair reduction, which XLA:CPU
  runs as a scalar loop: over 4096 logits 1.9 µs against 12 µs per row
  (3 × 4096: 6 against 25 µs), and a greedy decoding iteration takes
  several (the draft's tokens, the target's call, the verification).
  """
  if not -x.ndim <= axis < x.ndim:
    raise ValueError(f"axis must be in [{-x.ndim}, {x.ndim}) for an array of shape "
                     f"{tuple(x.shape)}, got {axis}")
  axis = axis % x.ndim
  m = jnp.max(x, axis=axis, keepdims=True)
  idx = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis)
  hit = (x == m) | jnp.isnan(x) if jnp.issubdtype(x.dtype, jnp.inexact) else x == m
  return jnp.min(jnp.where(hit, idx, x.shape[axis]), axis=axis)


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
    return jax.nn.one_hot(argmax_first(logits), vocab, dtype=jnp.float32)
  logits = logits / config.temperature
  if 0 < config.top_k < vocab:
    kth = jax.lax.top_k(logits, config.top_k)[0][..., -1:]
    logits = jnp.where(logits >= kth, logits, -jnp.inf)
  probs = jax.nn.softmax(logits, axis=-1)
  if config.top_p < 1.0:
    probs = _nucleus(probs, config.top_p)
  return probs


_UNROLL_MIN_VOCAB = 1024


def _nucleus(probs: jax.Array, top_p: float) -> jax.Array:
  """Keeps the smallest set of most likely tokens whose mass reaches top_p.

  The kept set is {p >= t*}, with t* the largest probability value v whose
  upper mass M(v) = sum(p[p >= v]) still reaches top_p (ties at t* are kept;
  the same set as sorting and cutting at the first cumulative sum >= top_p).
  t* is found by bisection over the int32 bit patterns of the float32
  probabilities (ordered like the floats for p >= 0): 31 O(V) passes instead
  of an O(V log V) sort, which on XLA:CPU costs milliseconds per row at
  V = 32k. Exact: the result is a probability value, not an approximation.
  """
  bits = jax.lax.bitcast_convert_type(probs, jnp.int32)
  lo = jnp.zeros(probs.shape[:-1], jnp.int32)       # M(0) = 1 >= top_p
  hi = jnp.max(bits, axis=-1) + 1                   # M(> max) = 0 < top_p

  def halve(_, lo_hi):
    lo, hi = lo_hi
    mid = lo + (hi - lo) // 2
    ok = jnp.sum(jnp.where(bits >= mid[..., None], probs, 0.0), axis=-1) >= top_p
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

  # Unrolled for real vocabularies: a rolled loop costs ~1 us of loop overhead
  # per pass and, for large [rows, V], a copy of the probabilities per pass on
  # XLA:CPU (V = 32k, 20 rows: 5.4 ms unrolled, 8.0 ms rolled). Rolled below
  # _UNROLL_MIN_VOCAB: there the 31 unrolled passes, repeated at every place a
  # program filters (each draft step, the verify), double the compile time of
  # a speculative loop (tiny decoder, V = 8: 15.6 s -> 7.1 s) for microseconds.
  unroll = 31 if probs.shape[-1] >= _UNROLL_MIN_VOCAB else 1
  lo, _ = jax.lax.fori_loop(0, 31, halve, (lo, hi), unroll=unroll)
  kept = jnp.where(bits >= lo[..., None], probs, 0.0)
  return kept / jnp.sum(kept, axis=-1, keepdims=True)


_BLOCK = 128


def row_uniforms(keys_B: jax.Array, n: int) -> jax.Array:
  """`[B, n]` float32 uniforms in [0, 1), row b from `keys_B[b]` in one PRNG
  call (each PRNG call is a loop of its own on XLA:CPU, so a decoding step
  draws all it needs at once)."""
  return jax.vmap(lambda k: jax.random.uniform(k, (n,), jnp.float32))(keys_B)


def sample_tokens(keys_B: jax.Array, probs_BV: jax.Array) -> jax.Array:
  """Draws one token per row, row b with its own key `keys_B[b]`.

  One float32 uniform per row (`jax.random.uniform(keys_B[b])`), then
  `sample_from_uniform`.

  Args:
    keys_B: typed PRNG keys `[B]`.
    probs_BV: probabilities `[B, V]` (zeros allowed; rows must have mass;
      need not sum exactly to 1).

  Returns:
    int32 tokens `[B]`.
  """
  return sample_from_uniform(row_uniforms(keys_B, 1)[:, 0], probs_BV)


def sample_from_uniform(u_B: jax.Array, probs_BV: jax.Array) -> jax.Array:
  """Inverse-CDF draw of one token per row from a uniform `u_B[b]` in [0, 1).

  The method of `torch.multinomial`, done in two levels — blocks of 128
  tokens, then within the chosen block — so it costs O(V) and one random
  number instead of V Gumbel draws (`jax.random.categorical` costs ~0.3 ms at
  V = 2k and ~7 ms at V = 32k per row on XLA:CPU, more than a small draft's
  forward pass). Callers that need several draws per step take all their
  uniforms from one PRNG call (each PRNG call is a loop of its own on CPU).
  Tokens with zero probability are never drawn; probabilities are resolved to
  the uniform's 2^-23 grid.

  Args:
    u_B: float32 uniforms `[B]` in [0, 1).
    probs_BV: probabilities `[B, V]` (as for `sample_tokens`).

  Returns:
    int32 tokens `[B]`.
  """
  if jnp.ndim(probs_BV) != 2 or jnp.shape(u_B) != jnp.shape(probs_BV)[:1]:
    raise ValueError(f"probs_BV must be [B, V] and u_B [B]; got probs_BV shape "
                     f"{jnp.shape(probs_BV)} and u_B shape {jnp.shape(u_B)}")
  b, v = probs_BV.shape
  probs_BV = probs_BV.astype(jnp.float32)
  u_B = u_B.astype(jnp.float32)
  n_blocks = -(-v // _BLOCK)
  blocks_BNK = jnp.pad(probs_BV, ((0, 0), (0, n_blocks * _BLOCK - v))).reshape(b, n_blocks, _BLOCK)
  mass_BN = jnp.sum(blocks_BNK, axis=-1)
  cdf_BN = jnp.cumsum(mass_BN, axis=-1)
  target_B = u_B * cdf_BN[:, -1]
  # First block whose cumulative mass exceeds the target (it has mass > 0);
  # the clamp only guards float rounding of u * total up to the total.
  has_mass_BN = mass_BN > 0
  last_block_B = n_blocks - 1 - jnp.argmax(has_mass_BN[:, ::-1], axis=-1)
  blk_B = jnp.minimum(jnp.sum(cdf_BN <= target_B[:, None], axis=-1), last_block_B)
  # Mass before the block, as the previous cumulative sum itself (<= target
  # by the choice of block), so zero-probability tokens are never picked.
  excl_BN = jnp.pad(cdf_BN[:, :-1], ((0, 0), (1, 0)))
  before_B = jnp.take_along_axis(excl_BN, blk_B[:, None], axis=1)[:, 0]
  row_BK = jnp.take_along_axis(blocks_BNK, blk_B[:, None, None], axis=1)[:, 0]
  within_BK = before_B[:, None] + jnp.cumsum(row_BK, axis=-1)
  last_in_B = _BLOCK - 1 - jnp.argmax((row_BK > 0)[:, ::-1], axis=-1)
  j_B = jnp.minimum(jnp.sum(within_BK <= target_B[:, None], axis=-1), last_in_B)
  return (blk_B * _BLOCK + j_B).astype(jnp.int32)


def draw(u_B: jax.Array, probs_BV: jax.Array, sampling: SamplingConfig) -> jax.Array:
  """One token per row: the argmax for greedy (the one-hot's only token; no
  random numbers are then computed at all), else an inverse-CDF draw."""
  if sampling.is_greedy:
    return argmax_first(probs_BV)
  return sample_from_uniform(u_B, probs_BV)
