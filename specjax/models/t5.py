"""T5 encoder-decoder (v1.0 and v1.1) with static self- and cross-attention caches.

Architecture (Raffel et al. 2020, as transformers' `T5ForConditionalGeneration`): a shared
input embedding, no absolute positions, pre-norm blocks with scale-only layer norm
(`layers.RMSNorm`), a learned relative position bias per stack (bidirectional buckets in the
encoder, causal in the decoder) added to the scores of every layer of that stack, no 1/sqrt(D)
score scaling (folded into the initialisation), self-attention + cross-attention + feed-forward
in each decoder block, a final layer norm per stack, no dropout. v1.0: relu feed-forward, logits
= (h * d_model**-0.5) @ shared.T; v1.1: gated-gelu (tanh) feed-forward, separate lm_head.

`T5` follows `specjax.protocol.LanguageModel`: the prompt goes to the encoder (once, in
`prefill`) and the decoder stream starts with `decoder_start_id` at position 0, so
`prefill_positions(P) == 1`.

Parameter tree (kernels `[in..., out...]`; `specjax.checkpoints.hf_t5` maps transformers' names):

  shared/embedding [V, E]; {encoder,decoder}/relpos_bias [NB, H] (used by all layers)
  encoder/layers_{i}/attn_norm/scale [E], attn/{q,k,v}/kernel [E, H, D], attn/o/kernel [H, D, E]
  encoder/layers_{i}/mlp_norm/scale [E], mlp/{wi | wi_0, wi_1}/kernel [E, F], mlp/wo/kernel [F, E]
  decoder/layers_{i}/self_norm, self_attn/{q,k,v,o}, cross_norm, cross_attn/{q,k,v,o},
    mlp_norm, mlp/...
  {encoder,decoder}/final_norm/scale [E]; lm_head/kernel [E, V] (v1.1 only)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Dict, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from specjax.models.layers import (RMSNorm, accumulate_f32_dot, attend, attend_cached,
                                   block_boundary, copy_slots, kv_specs, replace_layer,
                                   to_cache_layout, zero_arrays)
from specjax.parallel.rules import whole_vocab
from specjax.models.padding import mask_padding
from specjax.models.t5_config import FEED_FORWARDS, T5_CONFIGS, T5Config, t5_config
from specjax._checks import check_int

__all__ = [
    "T5", "T5Cache", "T5Config", "T5Module", "T5_CONFIGS", "t5_config", "FEED_FORWARDS",
    "relative_position_bucket",
]


@struct.dataclass
class T5Cache:
  """Static-shape decoder cache of a T5 model, with a length per row.

  Attributes:
    k, v: decoder self-attention keys and values, tuples of L buffers `[B, H, D, S]` and
      `[B, H, S, D]` (the layout of `layers.KVCache`).
    cross_k, cross_v: cross-attention keys and values, tuples of L buffers `[B, H, D, P]` and
      `[B, H, P, D]`, projected from the encoder output once, at prefill.
    encoder_lengths: int32 `[B]`, valid encoder positions of each row (cross-attention hides
      the padding past them).
    lengths: int32 `[B]`, valid decoder positions of each row; slots at or past it are masked
      and overwritten later (rollback = lowering it).

  Batch (axis 0) and heads (axis 1) of every buffer are the axes to shard over a mesh.
  """

  k: Tuple[jax.Array, ...]
  v: Tuple[jax.Array, ...]
  cross_k: Tuple[jax.Array, ...]
  cross_v: Tuple[jax.Array, ...]
  encoder_lengths: jax.Array
  lengths: jax.Array

  @property
  def max_len(self) -> int:
    """Number of decoder slots S (static)."""
    return self.v[0].shape[2]

  @property
  def encoder_len(self) -> int:
    """Number of encoder positions P held for cross-attention (static)."""
    return self.cross_v[0].shape[2]

  @property
  def batch_size(self) -> int:
    return self.k[0].shape[0]

  @classmethod
  def zeros(cls, num_layers: int, batch_size: int, max_len: int, encoder_len: int,
            num_heads: int, head_dim: int, dtype=jnp.float32) -> "T5Cache":
    n = num_layers
    arrays = zero_arrays(*kv_specs(n, batch_size, max_len, num_heads, head_dim, dtype),
                         *kv_specs(n, batch_size, encoder_len, num_heads, head_dim, dtype),
                         ((batch_size,), jnp.int32), ((batch_size,), jnp.int32))
    k, v, cross_k, cross_v = (tuple(arrays[i * n:(i + 1) * n]) for i in range(4))
    return cls(k=k, v=v, cross_k=cross_k, cross_v=cross_v, encoder_lengths=arrays[-2],
               lengths=arrays[-1])


def relative_position_bucket(relative_position: jax.Array, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> jax.Array:
  """T5's bucket of `key_position - query_position` (int array, any shape).

  Half of the buckets (per direction when bidirectional) hold exact small distances, the rest
  logarithmically wider bins up to `max_distance`; farther distances share the last bucket.
  Causal: future keys fall into bucket 0. The float32 arithmetic follows transformers' order of
  operations so bin edges agree.
  """
  rel = relative_position.astype(jnp.int32)
  buckets = jnp.zeros_like(rel)
  if bidirectional:
    num_buckets //= 2
    buckets = jnp.where(rel > 0, num_buckets, 0).astype(jnp.int32)
    dist = jnp.abs(rel)
  else:
    dist = -jnp.minimum(rel, 0)
  max_exact = num_buckets // 2
  is_small = dist < max_exact
  scaled = (jnp.log(jnp.maximum(dist, 1).astype(jnp.float32) / max_exact)
            / math.log(max_distance / max_exact) * (num_buckets - max_exact))
  large = jnp.minimum(max_exact + scaled.astype(jnp.int32), num_buckets - 1)
  return buckets + jnp.where(is_small, dist, large)


def _dtype(name: str):
  return jnp.dtype(name)


def _dense(features, config: T5Config, stddev_fan_in_scale: float = 1.0, axis=-1):
  return nn.DenseGeneral(
      features, axis=axis, use_bias=False, dtype=_dtype(config.dtype),
      param_dtype=_dtype(config.param_dtype), dot_general=accumulate_f32_dot,
      kernel_init=nn.initializers.variance_scaling(stddev_fan_in_scale, "fan_in", "normal"))


def _norm(config: T5Config) -> RMSNorm:
  return RMSNorm(config.layer_norm_epsilon, _dtype(config.dtype), _dtype(config.param_dtype))


class _Attention(nn.Module):
  """The four projections of one attention layer (attention itself is `attend`)."""

  config: T5Config

  def setup(self):
    c = self.config
    heads = (c.num_heads, c.d_kv)
    self.q = _dense(heads, c, 1.0 / c.d_kv)  # T5 folds 1/sqrt(D) into q's init.
    self.k = _dense(heads, c)
    self.v = _dense(heads, c)
    self.o = _dense(c.d_model, c, axis=(-2, -1))

  def kv(self, x_BSE: jax.Array) -> Tuple[jax.Array, jax.Array]:
    return self.k(x_BSE), self.v(x_BSE)


class _MLP(nn.Module):
  config: T5Config

  def setup(self):
    c = self.config
    if c.is_gated:
      self.wi_0 = _dense(c.d_ff, c)
      self.wi_1 = _dense(c.d_ff, c)
    else:
      self.wi = _dense(c.d_ff, c)
    self.wo = _dense(c.d_model, c)

  def __call__(self, x_BTE: jax.Array) -> jax.Array:
    if self.config.is_gated:
      h = nn.gelu(self.wi_0(x_BTE), approximate=True) * self.wi_1(x_BTE)
    else:
      h = nn.relu(self.wi(x_BTE))
    return self.wo(h)


class _EncoderLayer(nn.Module):
  config: T5Config

  def setup(self):
    c = self.config
    self.attn_norm = _norm(c)
    self.attn = _Attention(c)
    self.mlp_norm = _norm(c)
    self.mlp = _MLP(c)

  def __call__(self, x_BPE, mask_BQP, bias_BHPP):
    h_BPE = self.attn_norm(x_BPE)
    k_BHDP, v_BHPD = to_cache_layout(*self.attn.kv(h_BPE))
    att_BPHD = attend(self.attn.q(h_BPE), k_BHDP, v_BHPD, mask_BQP, bias_BHPP)
    x_BPE = x_BPE + self.attn.o(att_BPHD)
    return x_BPE + self.mlp(self.mlp_norm(x_BPE))


class _DecoderLayer(nn.Module):
  config: T5Config

  def setup(self):
    c = self.config
    self.self_norm = _norm(c)
    self.self_attn = _Attention(c)
    self.cross_norm = _norm(c)
    self.cross_attn = _Attention(c)
    self.mlp_norm = _norm(c)
    self.mlp = _MLP(c)

  def cross_kv(self, enc_BPE: jax.Array) -> Tuple[jax.Array, jax.Array]:
    """Cross-attention keys `[B, H, D, P]` and values `[B, H, P, D]`."""
    return to_cache_layout(*self.cross_attn.kv(enc_BPE))

  def __call__(self, x_BTE, cache: T5Cache, layer: int, bias_BHTS, bias_new_1HTT,
               cross_mask_B1P, empty: bool, mask_TT=None):
    h_BTE = self.self_norm(x_BTE)
    k_BTHD, v_BTHD = self.self_attn.kv(h_BTE)
    att_BTHD, new_k, new_v = attend_cached(self.self_attn.q(h_BTE), k_BTHD, v_BTHD,
                                           cache.k[layer], cache.v[layer], cache.lengths,
                                           bias_BHTS, bias_new_1HTT, empty=empty,
                                           mask_TT=mask_TT)
    x_BTE = x_BTE + self.self_attn.o(att_BTHD)
    h_BTE = self.cross_norm(x_BTE)
    att_BTHD = attend(self.cross_attn.q(h_BTE), cache.cross_k[layer], cache.cross_v[layer],
                      cross_mask_B1P)
    x_BTE = x_BTE + self.cross_attn.o(att_BTHD)
    x_BTE = x_BTE + self.mlp(self.mlp_norm(x_BTE))
    return x_BTE, cache.replace(k=replace_layer(cache.k, layer, new_k),
                               v=replace_layer(cache.v, layer, new_v))


def _bias_init(config: T5Config):
  return nn.initializers.normal(config.d_model ** -0.5)


class _Encoder(nn.Module):
  config: T5Config

  def setup(self):
    c = self.config
    self.relpos_bias = self.param("relpos_bias", _bias_init(c),
                                  (c.relative_attention_num_buckets, c.num_heads),
                                  _dtype(c.param_dtype))
    self.layers = [_EncoderLayer(c) for _ in range(c.num_layers)]
    self.final_norm = _norm(c)

  def __call__(self, x_BPE: jax.Array, lengths_B: jax.Array) -> jax.Array:
    c = self.config
    b, p = x_BPE.shape[:2]
    pos_P = jnp.arange(p, dtype=jnp.int32)
    buckets_PP = relative_position_bucket(
        pos_P[None, :] - pos_P[:, None], True, c.relative_attention_num_buckets,
        c.relative_attention_max_distance)
    bias_HPP = jnp.transpose(jnp.take(self.relpos_bias, buckets_PP, axis=0), (2, 0, 1))
    bias_BHPP = jnp.broadcast_to(bias_HPP[None], (b,) + bias_HPP.shape)
    mask_B1P = (pos_P[None, :] < lengths_B[:, None])[:, None, :]
    for layer in self.layers:
      x_BPE = block_boundary(layer(x_BPE, mask_B1P, bias_BHPP))
    return self.final_norm(x_BPE)


class _Decoder(nn.Module):
  config: T5Config

  def setup(self):
    c = self.config
    self.relpos_bias = self.param("relpos_bias", _bias_init(c),
                                  (c.relative_attention_num_buckets, c.num_heads),
                                  _dtype(c.param_dtype))
    self.layers = [_DecoderLayer(c) for _ in range(c.num_decoder_layers)]
    self.final_norm = _norm(c)

  def cross_kv(self, enc_BPE: jax.Array) -> Tuple[jax.Array, jax.Array]:
    """Cross-attention K/V of every layer: tuples of `[B, H, D, P]` / `[B, H, P, D]`."""
    kvs = [layer.cross_kv(enc_BPE) for layer in self.layers]
    return tuple(k for k, _ in kvs), tuple(v for _, v in kvs)

  def __call__(self, x_BTE: jax.Array, cache: T5Cache, empty: bool = False,
               positions_BT=None, mask_TT=None) -> Tuple[jax.Array, T5Cache]:
    """`empty=True` (static): every row's decoder length is 0 (prefill, forward).
    `positions_BT` / `mask_TT`: see `T5.extend`."""
    c = self.config
    t, s = x_BTE.shape[1], cache.max_len
    explicit = positions_BT is not None
    pos_BT = positions_BT if explicit else (
        cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :])
    bucket = functools.partial(relative_position_bucket, bidirectional=False,
                               num_buckets=c.relative_attention_num_buckets,
                               max_distance=c.relative_attention_max_distance)
    # Bias from each row's absolute positions: key slot - query position (cached slots), and
    # key - query within the T new tokens.
    bias_BHTS = None
    if not empty:
      buckets_BTS = bucket(jnp.arange(s, dtype=jnp.int32)[None, None, :] - pos_BT[:, :, None])
      bias_BHTS = jnp.moveaxis(jnp.take(self.relpos_bias, buckets_BTS, axis=0), -1, 1)
    if explicit:  # key position - query position within the new tokens, per row
      buckets_1TT = bucket(pos_BT[:, None, :] - pos_BT[:, :, None])
    else:
      arange_t = jnp.arange(t, dtype=jnp.int32)
      buckets_1TT = bucket(arange_t[None, None, :] - arange_t[None, :, None])
    bias_new_1HTT = jnp.moveaxis(jnp.take(self.relpos_bias, buckets_1TT, axis=0), -1, 1)
    cross_mask_B1P = (jnp.arange(cache.encoder_len)[None, :]
                      < cache.encoder_lengths[:, None])[:, None, :]
    for i, layer in enumerate(self.layers):
      x_BTE, cache = layer(x_BTE, cache, i, bias_BHTS, bias_new_1HTT, cross_mask_B1P, empty,
                           mask_TT)
      x_BTE = block_boundary(x_BTE)
    cache = cache.replace(lengths=cache.lengths + t)
    return self.final_norm(x_BTE), cache


class T5Module(nn.Module):
  """The Flax module; the methods are applied by `T5` (`module.apply(..., method=)`)."""

  config: T5Config

  def setup(self):
    c = self.config
    self.shared = nn.Embed(c.vocab_size, c.d_model, dtype=_dtype(c.dtype),
                           param_dtype=_dtype(c.param_dtype),
                           embedding_init=nn.initializers.normal(1.0))
    self.encoder = _Encoder(c)
    self.decoder = _Decoder(c)
    if not c.tie_word_embeddings:
      self.lm_head = _dense(c.vocab_size, c)

  def encode(self, inputs_BP: jax.Array, lengths_B: jax.Array) -> jax.Array:
    """Right-padded encoder inputs → final-normed encoder states `[B, P, E]`."""
    inputs_BP = mask_padding(inputs_BP, lengths_B, self.config.pad_id)  # never read
    return self.encoder(self.shared(inputs_BP), lengths_B)

  def start(self, inputs_BP: jax.Array, lengths_B: jax.Array, cache: T5Cache) -> T5Cache:
    """Encodes, fills the cross-attention K/V; decoder lengths 0."""
    k, v = self.decoder.cross_kv(self.encode(inputs_BP, lengths_B))
    dtype = cache.cross_k[0].dtype
    return cache.replace(cross_k=tuple(x.astype(dtype) for x in k),
                         cross_v=tuple(x.astype(dtype) for x in v),
                         encoder_lengths=lengths_B, lengths=jnp.zeros_like(cache.lengths))

  def decode(self, tokens_BT: jax.Array, cache: T5Cache, empty: bool = False,
             positions_BT=None, mask_TT=None) -> Tuple[jax.Array, T5Cache]:
    """Decoder tokens at each row's length → final-normed states `[B, T, E]`, cache."""
    return self.decoder(self.shared(tokens_BT), cache, empty, positions_BT, mask_TT)

  def project(self, h_xE: jax.Array) -> jax.Array:
    """Decoder states `[..., E]` → float32 logits `[..., V]`."""
    c = self.config
    if c.tie_word_embeddings:
      logits = self.shared.attend(h_xE * (c.d_model ** -0.5))
    else:
      logits = self.lm_head(h_xE)
    return whole_vocab(logits.astype(jnp.float32))

  def prefill(self, inputs_BP, lengths_B, cache: T5Cache):
    cache = self.start(inputs_BP, lengths_B, cache)
    start_B1 = jnp.full((inputs_BP.shape[0], 1), self.config.decoder_start_id, jnp.int32)
    h_B1E, cache = self.decode(start_B1, cache, True)
    return self.project(h_B1E[:, 0]), cache

  def forward(self, inputs_BP, lengths_B, decoder_inputs_BT, cache: T5Cache):
    h_BTE, _ = self.decode(decoder_inputs_BT, self.start(inputs_BP, lengths_B, cache), True)
    return self.project(h_BTE)


@functools.lru_cache(maxsize=32)
def _expected_params(model: "T5"):
  return jax.eval_shape(model.init, jax.random.PRNGKey(0))


@dataclasses.dataclass(frozen=True)
class T5:
  """A T5 model following `specjax.protocol.LanguageModel`.

  Example:
    >>> t5 = T5(t5_config("t5-tiny"))
    >>> params = t5.init(jax.random.PRNGKey(0))
    >>> out = specjax.generate(t5, params, prompts_BP, lengths_B, max_new_tokens=16,
    ...                        sampling=specjax.GREEDY, eos_id=t5.config.eos_id)
  """

  config: T5Config

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def module(self) -> T5Module:
    return T5Module(self.config)

  def init(self, key: jax.Array) -> Dict[str, Any]:
    """Random parameters (the `params` collection); jitted."""
    return _init(self, key)

  def expected_params(self, params=None) -> Dict[str, Any]:
    """The parameter tree as `jax.ShapeDtypeStruct`s (what `protocol.check_params` compares)."""
    return _expected_params(self)

  def init_cache(self, batch_size: int, max_len: int, prompt_len: int) -> T5Cache:
    """An empty cache: `max_len` decoder slots, `prompt_len` encoder positions."""
    for name, value in (("batch_size", batch_size), ("max_len", max_len),
                        ("prompt_len", prompt_len)):
      check_int(name, value, 1)
    c = self.config
    return T5Cache.zeros(c.num_decoder_layers, int(batch_size), int(max_len), int(prompt_len),
                         c.num_heads, c.d_kv, _dtype(c.dtype))

  def prefill_positions(self, prompt_len: int) -> int:
    """The decoder start token: one slot, whatever the prompt length."""
    return 1

  def _fit_inputs(self, inputs_BP: jax.Array, cache: T5Cache) -> jax.Array:
    p, room = inputs_BP.shape[1], cache.encoder_len
    if p > room:
      raise ValueError(f"encoder inputs of length {p} exceed the cache's {room} encoder "
                       "positions (init_cache's prompt_len)")
    if p < room:  # Extra positions are padding, masked by the encoder lengths.
      inputs_BP = jnp.pad(inputs_BP, ((0, 0), (0, room - p)), constant_values=self.config.pad_id)
    return inputs_BP.astype(jnp.int32)

  def encode(self, params, inputs_BP: jax.Array, input_lengths_B: jax.Array) -> jax.Array:
    """Final-normed encoder states `[B, P, E]` of right-padded inputs; jitted."""
    return _encode(self, params, jnp.asarray(inputs_BP, jnp.int32),
                   jnp.asarray(input_lengths_B, jnp.int32))

  def prefill(self, params, prompts_BP: jax.Array, prompt_lengths_B: jax.Array,
              cache: T5Cache) -> Tuple[jax.Array, jax.Array, T5Cache]:
    """Encodes the prompts (once), fills the cross K/V, runs the decoder start token at position
    0. Returns next-token logits `[B, V]`, the start token per row and the cache (lengths 1)."""
    prompts_BP = self._fit_inputs(prompts_BP, cache)
    lengths_B = prompt_lengths_B.astype(jnp.int32)
    logits_BV, cache = self.module.apply({"params": params}, prompts_BP, lengths_B, cache,
                                         method=T5Module.prefill)
    last_B = jnp.full(lengths_B.shape, self.config.decoder_start_id, jnp.int32)
    return logits_BV, last_B, cache

  def extend_with_hidden(self, params, tokens_BT: jax.Array, cache: T5Cache,
                         positions_BT: Optional[jax.Array] = None,
                         mask_TT: Optional[jax.Array] = None
                         ) -> Tuple[jax.Array, jax.Array, T5Cache]:
    """`extend`, also returning the final-normed decoder states `[B, T, E]` (before v1.0's
    output scaling)."""
    module = self.module
    h_BTE, cache = module.apply({"params": params}, tokens_BT.astype(jnp.int32), cache, False,
                                positions_BT, mask_TT, method=T5Module.decode)
    logits = module.apply({"params": params}, h_BTE, method=T5Module.project)
    return logits, h_BTE, cache

  def extend(self, params, tokens_BT: jax.Array, cache: T5Cache,
             positions_BT: Optional[jax.Array] = None,
             mask_TT: Optional[jax.Array] = None) -> Tuple[jax.Array, T5Cache]:
    """Writes decoder tokens at slots lengths + 0..T-1 of each row; returns logits `[B, T, V]`
    and the cache (lengths + T). As `DecoderLM.extend`: `positions_BT` the tokens' positions
    for the relative bias (default: their slots); `mask_TT` (bool `[T, T]` or `[B, T, T]`)
    which new tokens each attends to (default: causal)."""
    logits, _, cache = self.extend_with_hidden(params, tokens_BT, cache, positions_BT, mask_TT)
    return logits, cache

  def copy_slots(self, cache: T5Cache, src_BN: jax.Array, dst_B: jax.Array) -> T5Cache:
    """The cache with row b's self-attention slots `src_BN[b, i]` copied to `dst_B[b] + i` in
    every decoder layer (cross-attention unchanged)."""
    ks, vs = zip(*(copy_slots(k, v, src_BN, dst_B) for k, v in zip(cache.k, cache.v)))
    return cache.replace(k=tuple(ks), v=tuple(vs))

  def forward(self, params, inputs_BP: jax.Array, input_lengths_B: jax.Array,
              decoder_inputs_BT: jax.Array) -> jax.Array:
    """Teacher-forced forward without a persistent cache, jitted: the decoder inputs start at
    position 0 (usually with `decoder_start_id`). Logits `[B, T, V]`."""
    return _forward(self, params, jnp.asarray(inputs_BP, jnp.int32),
                    jnp.asarray(input_lengths_B, jnp.int32),
                    jnp.asarray(decoder_inputs_BT, jnp.int32))


# Jitted with the (hashable) model static: one compilation per config and shape.
@functools.partial(jax.jit, static_argnums=0)
def _init(model: T5, key: jax.Array):
  cache = model.init_cache(1, 2, 2)
  variables = model.module.init(key, jnp.zeros((1, 2), jnp.int32), jnp.full((1,), 2, jnp.int32),
                                jnp.zeros((1, 2), jnp.int32), cache, method=T5Module.forward)
  return variables["params"]


@functools.partial(jax.jit, static_argnums=0)
def _encode(model: T5, params, inputs_BP, lengths_B):
  return model.module.apply({"params": params}, inputs_BP, lengths_B, method=T5Module.encode)


@functools.partial(jax.jit, static_argnums=0)
def _forward(model: T5, params, inputs_BP, lengths_B, decoder_inputs_BT):
  (b, p), t = inputs_BP.shape, decoder_inputs_BT.shape[1]
  return model.module.apply({"params": params}, inputs_BP, lengths_B, decoder_inputs_BT,
                            model.init_cache(b, t, p), method=T5Module.forward)
