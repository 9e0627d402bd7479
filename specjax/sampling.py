"""Logits → processed probabilities, and sampling from them.

The speculative accept/reject rule is exact only when the draft's and the target's
distributions are processed the *same* way (temperature, top-k, top-p) before they are
compared (vLLM PR 10198, transformers issue 47932 are that bug), so `process_logits` is the
single place where that happens; both models go through it.

Shapes: any leading dims `[...]`, vocabulary last (`V`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from specjax._checks import check_int, check_probability, check_real
from specjax.parallel.rules import on_mesh

__all__ = ["SamplingConfig", "process_logits", "sample_tokens", "sample_from_uniform",
           "row_uniforms", "draw", "argmax_first", "greedy", "GREEDY", "vocab_shards",
           "top_k_over_vocab", "gather_over_vocab"]


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How logits become a distribution to sample from.

  Attributes:
    temperature: softmax temperature; 0 means greedy (a one-hot on the argmax, so speculative
      greedy equals plain greedy).
    top_k: keep only the k most likely tokens (ties at the k-th value kept); 0 disables.
    top_p: nucleus sampling, keep the smallest set of most likely tokens whose mass reaches
      top_p; 1.0 disables. Must lie in (0, 1].

  Order (as in transformers): temperature, top-k, top-p, renormalising after each filter.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    # Checked, and normalised so that equal configs hash equal (they are jit-static).
    object.__setattr__(self, "temperature", check_real("temperature", self.temperature, 0.0,
                                                       note=" (0 = greedy)"))
    object.__setattr__(self, "top_k", check_int("top_k", self.top_k, 0, note=" (0 disables)"))
    object.__setattr__(self, "top_p", check_probability("top_p", self.top_p, lo_open=True,
                                                        note=" (1 disables)"))

  @property
  def is_greedy(self) -> bool:
    """True when temperature is 0: argmax decoding."""
    return self.temperature == 0.0


GREEDY = SamplingConfig(temperature=0.0)


def greedy() -> SamplingConfig:
  """The greedy sampling config (temperature 0)."""
  return GREEDY


def argmax_first(x: jax.Array, axis: int = -1) -> jax.Array:
  """int32 index of the maximum along `axis`, the first one on ties: exactly `jnp.argmax` (a
  NaN counts as the maximum, the first NaN wins).

  Two plain reductions (a max, then a min over the indices that reach it) instead of
  `jnp.argmax`'s (value, index) pair reduction, which XLA:CPU runs as a slow scalar loop.
  """
  if not -x.ndim <= axis < x.ndim:
    raise ValueError(f"axis must be in [{-x.ndim}, {x.ndim}) for an array of shape "
                     f"{tuple(x.shape)}, got {axis}")
  axis = axis % x.ndim
  m = jnp.max(x, axis=axis, keepdims=True)
  idx = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis)
  hit = (x == m) | jnp.isnan(x) if jnp.issubdtype(x.dtype, jnp.inexact) else x == m
  return jnp.min(jnp.where(hit, idx, x.shape[axis]), axis=axis)


def vocab_shards(vocab: int) -> int:
  """The pieces a vocabulary of `vocab` tokens is split into when traced under a mesh
  (`jax.set_mesh`, as decoding is when the params are split): the size of its `model` axis
  where it divides `vocab`, else 1 (also outside a mesh). Static: the mesh's shape only.

  The sampler's passes over the vocabulary follow these pieces, so over logits split by the
  vocab-parallel LM head each device works on its own slice and only per-row scalars cross
  devices."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or "model" not in mesh.axis_names:
    return 1
  m = mesh.shape["model"]
  return m if m > 1 and vocab % m == 0 else 1


def top_k_over_vocab(x: jax.Array, k: int, shards: Optional[int] = None):
  """`jax.lax.top_k(x, k)` over the last (vocabulary) axis, as (values, int32 indices), per
  vocabulary piece (`shards`, default `vocab_shards`) and merged: each piece keeps its top k,
  then the top k of those `shards * k` candidates. The same values and indices as one `top_k`,
  ties included (lower index first: candidates are ordered by piece); a split vocabulary is
  never gathered."""
  v = x.shape[-1]
  m = vocab_shards(v) if shards is None else shards
  if m == 1 or v % m or k > v // m:
    vals, idx = jax.lax.top_k(x, k)
    return vals, idx.astype(jnp.int32)
  w = v // m
  vals, idx = jax.lax.top_k(x.reshape(x.shape[:-1] + (m, w)), k)           # [..., M, k]
  idx = idx + (jnp.arange(m, dtype=idx.dtype) * w)[:, None]
  rows = _rows_whole(x.ndim + 1)   # the M x k candidates of a row whole on every device
  vals, idx = on_mesh(vals, rows), on_mesh(idx, rows)
  lead = x.shape[:-1]
  best, pick = jax.lax.top_k(vals.reshape(lead + (m * k,)), k)
  return best, jnp.take_along_axis(idx.reshape(lead + (m * k,)), pick, axis=-1).astype(jnp.int32)


def gather_over_vocab(probs_XV: jax.Array, tokens_X: jax.Array,
                      shards: Optional[int] = None) -> jax.Array:
  """`probs_XV[..., tokens_X]` → `[...]`: each row's value at its token.

  On one vocabulary piece a gather; over a split vocabulary a masked sum (a pass over each
  device's slice and a per-row all-reduce, not a gather moving the rows). The same values."""
  m = vocab_shards(probs_XV.shape[-1]) if shards is None else shards
  if m == 1:
    return jnp.take_along_axis(probs_XV, tokens_X[..., None], axis=-1)[..., 0]
  hit = jax.lax.broadcasted_iota(jnp.int32, probs_XV.shape, probs_XV.ndim - 1) \
      == tokens_X[..., None]
  out = jnp.sum(jnp.where(hit, probs_XV, jnp.zeros((), probs_XV.dtype)), axis=-1)
  return on_mesh(out, _rows_whole(out.ndim))


def _rows_whole(ndim: int) -> str:
  """The `on_mesh` suffix of a per-row array whole on each device but for the rows: the
  sampler's per-row results over a split vocabulary (else XLA spreads such small arrays over
  `model` and gathers them again at each use)."""
  return "B" + "_" * (ndim - 1)


def process_logits(logits: jax.Array, config: SamplingConfig) -> jax.Array:
  """Turns logits `[..., V]` into the processed float32 distribution `[..., V]`.

  Greedy configs give a one-hot on the argmax (first index on ties), so the rejection rule
  reduces to "accept iff the draft is the target's argmax", the residual to that argmax.

  At any finite T > 0 the result is softmax(logits / T) after top-k and top-p, computed
  without a numeric cliff: top-k on the raw logits (the same set: dividing by T > 0 keeps the
  order), then exp((logits - max) / T), each row's largest logit giving exactly exp(0) = 1, so
  the row's mass is >= 1 and never 0 / 0 however small T is. Where 1 / T is beyond float32
  (T below its smallest normal number) the limit itself: uniform over the argmax ties (one-hot
  on the argmax without ties, greedy's token). A row of logits that is not finite (a NaN, +inf,
  or no finite value) gives a row of NaN (`stats.nonfinite` counts it).
  """
  if not isinstance(config, SamplingConfig):
    raise TypeError(f"config must be a SamplingConfig, got {type(config).__name__}")
  logits = logits.astype(jnp.float32)
  vocab = logits.shape[-1]
  if config.is_greedy:
    return jax.nn.one_hot(argmax_first(logits), vocab, dtype=jnp.float32)
  # One buffer read by the max and the subtraction: XLA may otherwise recompute the logits in
  # each fusion (contracting a multiply into the subtraction as an FMA), leaving the largest
  # logit a rounding error away from 0, which 1 / T then blows up (0 / 0 or inf / inf).
  logits = jax.lax.optimization_barrier(logits)
  if 0 < config.top_k < vocab:
    kth = top_k_over_vocab(logits, config.top_k)[0][..., -1:]
    logits = jnp.where(logits >= kth, logits, -jnp.inf)
  z = logits - jnp.max(logits, axis=-1, keepdims=True)  # <= 0, exactly 0 at the max (NaN: bad)
  if config.temperature >= _F32_TINY:
    scaled = z / jnp.float32(config.temperature)        # <= 0; -inf where it overflows
  else:
    scaled = jnp.where(z < 0, -jnp.inf, z)              # the T -> 0 limit (z / T overflows)
  weights = jnp.exp(scaled)                             # in [0, 1], 1 at the argmax ties
  probs = weights / jnp.sum(weights, axis=-1, keepdims=True)
  if config.top_p < 1.0:
    probs = _nucleus(probs, config.top_p)
  return probs


_F32_TINY = float(np.finfo(np.float32).tiny)   # the smallest normal float32: 1 / T stays finite


_UNROLL_MIN_VOCAB = 1024


def _nucleus(probs: jax.Array, top_p: float) -> jax.Array:
  """Keeps the smallest set of most likely tokens whose mass reaches top_p.

  The kept set is {p >= t*}, t* the largest probability v whose upper mass
  M(v) = sum(p[p >= v]) still reaches top_p (ties at t* kept; the set that sorting and cutting
  at the first cumulative sum >= top_p gives). t* is found by bisection over the int32 bit
  patterns of the float32 probabilities (ordered like the floats for p >= 0): 31 O(V) passes
  instead of an O(V log V) sort. Exact: t* is a probability value, not an approximation.
  """
  bits = jax.lax.bitcast_convert_type(probs, jnp.int32)
  lo = jnp.zeros(probs.shape[:-1], jnp.int32)       # M(0) = 1 >= top_p
  hi = jnp.max(bits, axis=-1) + 1                   # M(> max) = 0 < top_p

  def halve(_, lo_hi):
    lo, hi = lo_hi
    mid = lo + (hi - lo) // 2
    ok = jnp.sum(jnp.where(bits >= mid[..., None], probs, 0.0), axis=-1) >= top_p
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

  # Unrolled for real vocabularies (a rolled loop copies the probabilities per pass on
  # XLA:CPU); rolled below _UNROLL_MIN_VOCAB, where unrolling mostly adds compile time.
  unroll = 31 if probs.shape[-1] >= _UNROLL_MIN_VOCAB else 1
  lo, _ = jax.lax.fori_loop(0, 31, halve, (lo, hi), unroll=unroll)
  kept = jnp.where(bits >= lo[..., None], probs, 0.0)
  return kept / jnp.sum(kept, axis=-1, keepdims=True)


_BLOCK = 128


def row_uniforms(keys_B: jax.Array, n: int) -> jax.Array:
  """`[B, n]` float32 uniforms in [0, 1), row b from `keys_B[b]`, in one PRNG call (each call
  is a loop of its own on XLA:CPU, so a step draws all it needs at once)."""
  return on_mesh(jax.vmap(lambda k: jax.random.uniform(k, (n,), jnp.float32))(keys_B), "B_")


def sample_tokens(keys_B: jax.Array, probs_BV: jax.Array) -> jax.Array:
  """Draws one token per row, row b with its own key `keys_B[b]`.

  One float32 uniform per row, then `sample_from_uniform`.

  Args:
    keys_B: typed PRNG keys `[B]`.
    probs_BV: probabilities `[B, V]` (zeros allowed; rows must have mass; need not sum to 1).

  Returns:
    int32 tokens `[B]`.
  """
  return sample_from_uniform(row_uniforms(keys_B, 1)[:, 0], probs_BV)


def sample_from_uniform(u_B: jax.Array, probs_BV: jax.Array,
                        shards: Optional[int] = None) -> jax.Array:
  """Inverse-CDF draw of one token per row from a uniform `u_B[b]` in [0, 1).

  The method of `torch.multinomial` in two levels (blocks of 128 tokens, then within the chosen
  block): O(V) and one random number instead of V Gumbel draws (`jax.random.categorical`).
  Zero-probability tokens are never drawn; probabilities are resolved to the uniform's 2^-23
  grid. A row with no mass gives V − 1 (an id the models can embed; callers mark it invalid).

  Over a vocabulary split into `shards` pieces a level is added in front (the piece, from the
  pieces' masses), so a device passes only over its own slice; the law is the same, though the
  token for a given uniform may differ where float rounding moves a boundary past it.

  Args:
    u_B: float32 uniforms `[B]` in [0, 1).
    probs_BV: probabilities `[B, V]` (as for `sample_tokens`).
    shards: vocabulary pieces (default: `vocab_shards(V)`); must divide V.

  Returns:
    int32 tokens `[B]`.
  """
  if jnp.ndim(probs_BV) != 2 or jnp.shape(u_B) != jnp.shape(probs_BV)[:1]:
    raise ValueError(f"probs_BV must be [B, V] and u_B [B]; got probs_BV shape "
                     f"{jnp.shape(probs_BV)} and u_B shape {jnp.shape(u_B)}")
  b, v = probs_BV.shape
  m = check_int("shards", vocab_shards(v) if shards is None else shards, 1)
  if v % m:
    raise ValueError(f"shards must be an int >= 1 dividing the vocabulary ({v}), got {m!r}")
  probs_BV = probs_BV.astype(jnp.float32)
  u_B = u_B.astype(jnp.float32)
  if m == 1:
    return _inverse_cdf(probs_BV, u_X=u_B)
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and mesh.shape.get("model", 1) == m:
    # One piece per `model` device: an all-gather of the masses, an all-reduce of the token.
    rows = "data" if "data" in mesh.axis_names and b % mesh.shape["data"] == 0 else None
    return jax.shard_map(_draw_own_piece, mesh=mesh,
                         in_specs=(P(rows), P(rows, "model")), out_specs=P(rows),
                         check_vma=False)(u_B, probs_BV)
  return _draw_over_pieces(u_B, probs_BV, m)


def _draw_over_pieces(u_B: jax.Array, probs_BV: jax.Array, m: int) -> jax.Array:
  """The draw over m vocabulary pieces held together (off a mesh): `_draw_own_piece` mapped
  over the pieces as the `model` axis."""
  b, v = probs_BV.shape
  per_piece = jax.vmap(_draw_own_piece, in_axes=(None, 1),
                       axis_name="model")(u_B, probs_BV.reshape(b, m, v // m))
  return per_piece[0]   # the all-reduced token: the same on every piece


def _draw_own_piece(u_B: jax.Array, probs_BW: jax.Array) -> jax.Array:
  """The draw on one device of the `model` axis, holding piece `axis_index("model")` (`[B, W]`):
  the pieces' masses gathered, the piece chosen, every piece drawing with the target left
  after the pieces before it (the partial sums `_choose` compared, so the chosen piece's share
  is >= 0), and the chosen piece's token summed over the axis."""
  me = jax.lax.axis_index("model")
  mass_BM = jax.lax.all_gather(jnp.sum(probs_BW, axis=-1), "model", axis=1)   # [B, M]
  target_B = u_B * jnp.cumsum(mass_BM, axis=-1)[:, -1]
  piece_B, _, excl_BM = _choose(mass_BM, target_B)
  local_B = _inverse_cdf(probs_BW, target_X=target_B - excl_BM[:, me])
  mine_B = jnp.where(piece_B == me, me * probs_BW.shape[1] + local_B, 0)
  return jax.lax.psum(mine_B, "model").astype(jnp.int32)


def _choose(mass_XN: jax.Array, target_X: jax.Array):
  """`(bin_X, before_X, excl_XN)`: the first of N bins whose cumulative mass exceeds
  `target_X` (a bin with mass: the clamp guards float rounding of the target up to the total),
  the mass before it, and the mass before every bin."""
  n = mass_XN.shape[-1]
  cdf_XN = jnp.cumsum(mass_XN, axis=-1)
  last_X = n - 1 - jnp.argmax((mass_XN > 0)[..., ::-1], axis=-1)
  bin_X = jnp.minimum(jnp.sum(cdf_XN <= target_X[..., None], axis=-1), last_X)
  # Mass before the bin as the previous cumulative sum itself (<= target by the choice of
  # bin), so zero-probability tokens are never picked.
  excl_XN = jnp.concatenate([jnp.zeros_like(cdf_XN[..., :1]), cdf_XN[..., :-1]], axis=-1)
  before_X = jnp.take_along_axis(excl_XN, bin_X[..., None], axis=-1)[..., 0]
  return bin_X, before_X, excl_XN


def _inverse_cdf(probs_XV: jax.Array, u_X=None, target_X=None) -> jax.Array:
  """The two-level draw of `sample_from_uniform` over the last axis: from a uniform `u_X` (the
  target is u times the row's mass) or a `target_X` mass. Returns int32 indices `[...]`."""
  lead, v = probs_XV.shape[:-1], probs_XV.shape[-1]
  n_blocks = -(-v // _BLOCK)
  pad = [(0, 0)] * len(lead) + [(0, n_blocks * _BLOCK - v)]
  blocks_XNK = jnp.pad(probs_XV, pad).reshape(lead + (n_blocks, _BLOCK))
  mass_XN = jnp.sum(blocks_XNK, axis=-1)
  if target_X is None:
    target_X = u_X * jnp.cumsum(mass_XN, axis=-1)[..., -1]
  blk_X, before_X, _ = _choose(mass_XN, target_X)
  row_XK = jnp.take_along_axis(blocks_XNK, blk_X[..., None, None], axis=-2)[..., 0, :]
  within_XK = before_X[..., None] + jnp.cumsum(row_XK, axis=-1)
  last_in_X = _BLOCK - 1 - jnp.argmax((row_XK > 0)[..., ::-1], axis=-1)
  j_X = jnp.minimum(jnp.sum(within_XK <= target_X[..., None], axis=-1), last_in_X)
  # A row with no mass gets V − 1, not an id in the block padding: a drafter's empty child is
  # still fed to the target, and an id past the embedding table turns the cache into NaN.
  return jnp.minimum(blk_X * _BLOCK + j_X, v - 1).astype(jnp.int32)


def draw(u_B: jax.Array, probs_BV: jax.Array, sampling: SamplingConfig) -> jax.Array:
  """One token per row: the argmax for greedy (no random numbers used), else an inverse-CDF
  draw."""
  if sampling.is_greedy:
    return argmax_first(probs_BV)
  return sample_from_uniform(u_B, probs_BV)
