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
from typing import Optional

import jax
import jax.numpy as jnp
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
  """int32 index of the maximum along `axis`, the first one on ties: exactly
  `jnp.argmax` (a NaN counts as the maximum, the first NaN wins).

  Two plain reductions (a max, then a min over the indices that reach it)
  instead of `jnp.argmax`'s (value, index) pair reduction, which XLA:CPU
  runs as a scalar loop several times slower (benchmarks/README.md), and a
  greedy decoding iteration takes several (the draft's tokens, the target's
  call, the verification).
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
  """The pieces a vocabulary of `vocab` tokens is split into when traced under a
  mesh (`jax.set_mesh`: what `specjax.generate` / `speculative_generate` and
  `specjax.aot` trace decoding under when the params are split): the size of
  its `model` axis where it divides `vocab`, else 1 (also outside a mesh).

  The sampler's passes over the vocabulary (`sample_from_uniform`,
  `top_k_over_vocab`, `gather_over_vocab`) take a shape that follows these
  pieces, so that over logits left split by the vocab-parallel LM head
  (`specjax.parallel.rules.whole_vocab`) each device works on its own slice and
  only per-row scalars cross devices. A static choice: it depends on the mesh's
  shape, never on a value."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or "model" not in mesh.axis_names:
    return 1
  m = mesh.shape["model"]
  return m if m > 1 and vocab % m == 0 else 1


def top_k_over_vocab(x: jax.Array, k: int, shards: Optional[int] = None):
  """`jax.lax.top_k(x, k)` over the last (vocabulary) axis, as (values, int32
  indices), computed per vocabulary piece (`vocab_shards`) and merged: each of
  the `shards` contiguous pieces keeps its own top k, and the top k of those
  `shards * k` candidates is taken. The same values and indices as one
  `top_k`, ties included (a lower index first: within a piece by `top_k`'s own
  rule, across pieces because candidates are ordered by piece); a split
  vocabulary then never has to be gathered. `shards`: default `vocab_shards`."""
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

  On one vocabulary piece (`vocab_shards` = 1) a gather; over a split
  vocabulary a masked sum instead (one pass over each device's own slice and
  a per-row all-reduce, where a gather over the split axis would have XLA move
  the rows). The same values: the sum adds one entry to zeros."""
  m = vocab_shards(probs_XV.shape[-1]) if shards is None else shards
  if m == 1:
    return jnp.take_along_axis(probs_XV, tokens_X[..., None], axis=-1)[..., 0]
  hit = jax.lax.broadcasted_iota(jnp.int32, probs_XV.shape, probs_XV.ndim - 1) \
      == tokens_X[..., None]
  out = jnp.sum(jnp.where(hit, probs_XV, jnp.zeros((), probs_XV.dtype)), axis=-1)
  return on_mesh(out, _rows_whole(out.ndim))


def _rows_whole(ndim: int) -> str:
  """The `on_mesh` suffix of a per-row array whose every axis but the rows is
  whole on each device: what the sampler pins its per-row results to over a
  split vocabulary (XLA's propagation would otherwise spread the rows of such
  small arrays over the `model` axis and gather them again at each use)."""
  return "B" + "_" * (ndim - 1)


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
    kth = top_k_over_vocab(logits, config.top_k)[0][..., -1:]
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
  return on_mesh(jax.vmap(lambda k: jax.random.uniform(k, (n,), jnp.float32))(keys_B), "B_")


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


def sample_from_uniform(u_B: jax.Array, probs_BV: jax.Array,
                        shards: Optional[int] = None) -> jax.Array:
  """Inverse-CDF draw of one token per row from a uniform `u_B[b]` in [0, 1).

  The method of `torch.multinomial`, done in two levels — blocks of 128
  tokens, then within the chosen block — so it costs O(V) and one random
  number instead of V Gumbel draws (on XLA:CPU `jax.random.categorical`
  costs more than a small draft's forward pass at real vocabularies:
  `benchmarks/sampling_bench.py`). Callers that need several draws per step take all their
  uniforms from one PRNG call (each PRNG call is a loop of its own on CPU).
  Tokens with zero probability are never drawn; probabilities are resolved to
  the uniform's 2^-23 grid. A row with no mass at all gives V − 1 (an id the
  models can embed; callers mark such draws invalid).

  Over a vocabulary split into `shards` pieces (default `vocab_shards`: the
  mesh's `model` axis when traced under one) a level is added in front: the
  piece, from the pieces' masses, then the two levels inside each piece, so a
  device only passes over its own slice; the law is the same (each token's
  probability is its piece's mass times its share of it), the token for a
  given uniform may differ where float rounding of the partial sums moves a
  boundary past it.

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
    # On the mesh: one piece per device of `model` (its slice of the vocabulary),
    # one all-gather of the pieces' masses and one all-reduce of the token.
    rows = "data" if "data" in mesh.axis_names and b % mesh.shape["data"] == 0 else None
    return jax.shard_map(_draw_own_piece, mesh=mesh,
                         in_specs=(P(rows), P(rows, "model")), out_specs=P(rows),
                         check_vma=False)(u_B, probs_BV)
  return _draw_over_pieces(u_B, probs_BV, m)


def _draw_over_pieces(u_B: jax.Array, probs_BV: jax.Array, m: int) -> jax.Array:
  """The draw over m vocabulary pieces held together (off a mesh): the
  per-device draw `_draw_own_piece`, mapped over the pieces as the `model` axis."""
  b, v = probs_BV.shape
  per_piece = jax.vmap(_draw_own_piece, in_axes=(None, 1),
                       axis_name="model")(u_B, probs_BV.reshape(b, m, v // m))
  return per_piece[0]   # the all-reduced token: the same on every piece


def _draw_own_piece(u_B: jax.Array, probs_BW: jax.Array) -> jax.Array:
  """The draw over vocabulary pieces on one device of the `model` axis, holding
  piece `axis_index("model")` of the vocabulary (`[B, W]`): the pieces' masses
  gathered, the piece chosen from them, every piece drawing with what the target
  leaves after the pieces before it (the partial sums `_choose` compared, so the
  chosen piece's share is >= 0), and the chosen piece's token summed over the axis."""
  me = jax.lax.axis_index("model")
  mass_BM = jax.lax.all_gather(jnp.sum(probs_BW, axis=-1), "model", axis=1)   # [B, M]
  target_B = u_B * jnp.cumsum(mass_BM, axis=-1)[:, -1]
  piece_B, _, excl_BM = _choose(mass_BM, target_B)
  local_B = _inverse_cdf(probs_BW, target_X=target_B - excl_BM[:, me])
  mine_B = jnp.where(piece_B == me, me * probs_BW.shape[1] + local_B, 0)
  return jax.lax.psum(mine_B, "model").astype(jnp.int32)


def _choose(mass_XN: jax.Array, target_X: jax.Array):
  """The first of N consecutive bins whose cumulative mass exceeds `target_X`
  (a bin with mass: the clamp only guards float rounding of the target up to
  the total), the mass before it, and the mass before every bin: `(bin_X,
  before_X, excl_XN)`."""
  n = mass_XN.shape[-1]
  cdf_XN = jnp.cumsum(mass_XN, axis=-1)
  last_X = n - 1 - jnp.argmax((mass_XN > 0)[..., ::-1], axis=-1)
  bin_X = jnp.minimum(jnp.sum(cdf_XN <= target_X[..., None], axis=-1), last_X)
  # Mass before the bin, as the previous cumulative sum itself (<= target by
  # the choice of bin), so zero-probability tokens are never picked.
  excl_XN = jnp.concatenate([jnp.zeros_like(cdf_XN[..., :1]), cdf_XN[..., :-1]], axis=-1)
  before_X = jnp.take_along_axis(excl_XN, bin_X[..., None], axis=-1)[..., 0]
  return bin_X, before_X, excl_XN


def _inverse_cdf(probs_XV: jax.Array, u_X=None, target_X=None) -> jax.Array:
  """The two-level draw of `sample_from_uniform` over the last axis, for any
  leading axes: from a uniform `u_X` (the target is u times the row's mass) or
  from a `target_X` mass directly. Returns int32 indices `[...]`."""
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
  # A row with no mass names no token; keep its index inside the vocabulary (V − 1),
  # where the block padding would otherwise put it: a drafter's empty child (top-p
  # leaving fewer tokens than children) is still fed to the target, and an id past the
  # embedding table turns the whole call, and the cache, into NaN.
  return jnp.minimum(blk_X * _BLOCK + j_X, v - 1).astype(jnp.int32)


def draw(u_B: jax.Array, probs_BV: jax.Array, sampling: SamplingConfig) -> jax.Array:
  """One token per row: the argmax for greedy (the one-hot's only token; no
  random numbers are then computed at all), else an inverse-CDF draw."""
  if sampling.is_greedy:
    return argmax_first(probs_BV)
  return sample_from_uniform(u_B, probs_BV)
