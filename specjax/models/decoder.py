"""Chinchilla-style decoder-only language model with a static KV cache.

Pre-norm transformer: RMSNorm, rotary positions, SwiGLU MLP, multi-head or grouped-query
attention, tied or untied embeddings, no biases. `DecoderLM` follows `protocol.LanguageModel`.

Parameter tree (all kernels `[in..., out...]`):

  embed/embedding [V, E]
  layer_{i}/attn_norm/scale [E]
  layer_{i}/{q [E, H, D], k [E, K, D], v [E, K, D], o [H, D, E]}/kernel
  layer_{i}/{q [H, D], k [K, D], v [K, D]}/bias            (qkv_bias: Qwen2)
  layer_{i}/{q_norm, k_norm}/scale [D]                      (qk_norm: Qwen3)
  layer_{i}/mlp_norm/scale [E]
  layer_{i}/{gate [E, F], up [E, F], down [F, E]}/kernel
  final_norm/scale [E]
  lm_head/kernel [E, V]        (absent when embeddings are tied)

That is the standard layout (training, checkpoints, transformers export). `DecoderLM.pack_params`
gives the packed decode layout of the same weights (`qkv`, `gate_up`, `down_t` in place of the
six projection kernels; `models.decoder_layout`), faster to decode on CPU; every method takes
either.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, ClassVar, Dict, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specjax.models import decoder_layout, matvec_cache, rope
from specjax.models.attention_kernel import KERNELS
from specjax.models.layers import (KVCache, RMSNorm, apply_rope, attend_cached, block_boundary,
                                   contract, copy_slots, replace_layer)
from specjax.models.padding import mask_padding
from specjax.parallel.rules import whole_vocab
from specjax._checks import check_bool, check_int, check_optional_int, check_real

__all__ = ["DecoderConfig", "DecoderLM", "DECODER_CONFIGS", "decoder_config"]

_DTYPES = ("float32", "bfloat16", "float16")


def _check_positive_int(name: str, value: Any) -> None:
  check_int(name, value, 1)


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
  """Shape and numerics of a decoder-only LM (frozen, hashable).

  Attributes:
    vocab_size, d_model, num_layers, num_heads, head_dim: V, E, L, H (query heads), D.
    num_kv_heads: K key/value heads (K == H: multi-head; K < H: grouped-query; divides H).
    mlp_dim: F, the SwiGLU hidden width.
    tie_embeddings: output projection = embedding transposed.
    rope_theta: rotary base, a finite number > 0.
    rope_scaling: a context-extension rule of the rotary frequencies (`models.rope`: linear,
      llama3, yarn), as a dict or its canonical (key, value) pairs; None: plain rotary.
    qkv_bias: q, k and v projections carry biases (Qwen2 / Qwen2.5).
    qk_norm: RMSNorm over the head dimension of every query and key head before the rotary
      embedding (Qwen3), one scale `[D]` each for q and k.
    sliding_window: a token attends only to the last `sliding_window` positions, itself
      included (Mistral); None: the whole context.
    norm_eps: RMSNorm epsilon, a finite number > 0.
    dtype: compute dtype name; param_dtype: parameter dtype name.
    matvec_max_rows: how a call on N = B * T tokens computes each projection: 1 < N <= this,
      one matrix-vector product per token, back to back on the same kernel; otherwise one
      matrix-matrix product (`measure.tuning`). None (default): on CPU the choice
      `specjax.tune_matvec_rows` stored for this machine, else 0; 0 on other backends; 0: off.
    prefill_chunk: a prefill of P > prefill_chunk positions runs as ceil(P / prefill_chunk)
      calls, each attending to the cache the earlier ones wrote (compute only; the same values
      up to float rounding): attention scores take `B·H·chunk·P` floats instead of `B·H·P²`.
      None: one call.
    attention_kernel: "xla" (default, any backend) or "pallas": on a TPU, attention over the
      cache in one fused kernel that keeps its scores on chip (`models.attention_kernel`; the
      same values up to float rounding; where `attention_kernel.fits` the cache and no sliding
      window applies, else XLA's); "pallas_interpret": that kernel interpreted (tests).
  """

  vocab_size: int
  d_model: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  tie_embeddings: bool = False
  rope_theta: float = 10000.0
  norm_eps: float = 1e-6
  rope_scaling: Optional[Tuple[Tuple[str, Any], ...]] = None
  qkv_bias: bool = False
  qk_norm: bool = False
  sliding_window: Optional[int] = None
  dtype: str = "float32"
  param_dtype: str = "float32"
  # How calls compute, not what the weights are: checkpoints restore across values.
  matvec_max_rows: Optional[int] = dataclasses.field(default=None,
                                                     metadata={"compute_only": True})
  prefill_chunk: Optional[int] = dataclasses.field(default=None,
                                                   metadata={"compute_only": True})
  attention_kernel: str = dataclasses.field(default="xla", metadata={"compute_only": True})
  # Compute-only fields of earlier versions, ignored when a stored config holds them.
  REMOVED_FIELDS: ClassVar[Tuple[str, ...]] = ("fused_projections",)

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "mlp_dim"):
      _check_positive_int(name, getattr(self, name))
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})")
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for rotary positions, got {self.head_dim}")
    # Out of these domains the first call's logits are NaN (a broken checkpoint, it would seem).
    check_real("rope_theta", self.rope_theta, 0.0, lo_open=True)
    check_real("norm_eps", self.norm_eps, 0.0, lo_open=True)
    object.__setattr__(self, "rope_scaling", rope.canonical_scaling(self.rope_scaling))
    w = self.sliding_window
    if w is not None:
      _check_positive_int("sliding_window", w)
    for name in ("qkv_bias", "qk_norm", "tie_embeddings"):
      check_bool(name, getattr(self, name))
    check_optional_int("matvec_max_rows", self.matvec_max_rows, 0)  # 0: off, None: auto
    if self.prefill_chunk is not None:
      _check_positive_int("prefill_chunk", self.prefill_chunk)
    if self.attention_kernel not in KERNELS:
      raise ValueError(f"attention_kernel must be one of {KERNELS}, got "
                       f"{self.attention_kernel!r}")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"{name} must be one of {_DTYPES}, got {getattr(self, name)!r}")

  def num_params(self) -> int:
    """Exact parameter count."""
    e, f, v = self.d_model, self.mlp_dim, self.vocab_size
    attn = e * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
    if self.qkv_bias:
      attn += self.head_dim * (self.num_heads + 2 * self.num_kv_heads)
    if self.qk_norm:
      attn += 2 * self.head_dim
    per_layer = attn + 3 * e * f + 2 * e
    head = 0 if self.tie_embeddings else e * v
    return v * e + self.num_layers * per_layer + e + head

  def replace(self, **changes) -> "DecoderConfig":
    return dataclasses.replace(self, **changes)


def _cfg(**kw) -> DecoderConfig:
  return DecoderConfig(**kw)


# Named shapes. Chinchilla-70B (Hoffmann et al. 2022) with SwiGLU: F = 22016 (~2/3 * 4 * E) keeps
# its MLP's FLOPs. The 4B draft follows Chen et al. 2023: few, wide layers (latency ~ depth).
DECODER_CONFIGS: Dict[str, DecoderConfig] = {
    "chinchilla-70b": _cfg(vocab_size=32000, d_model=8192, num_layers=80, num_heads=64,
                           num_kv_heads=64, head_dim=128, mlp_dim=22016),
    "chinchilla-4b-draft": _cfg(vocab_size=32000, d_model=6144, num_layers=8, num_heads=48,
                                num_kv_heads=48, head_dim=128, mlp_dim=16384),
    "llama-7b-like": _cfg(vocab_size=32000, d_model=4096, num_layers=32, num_heads=32,
                          num_kv_heads=32, head_dim=128, mlp_dim=11008),
    "draft-0.5b-like": _cfg(vocab_size=32000, d_model=1024, num_layers=24, num_heads=16,
                            num_kv_heads=16, head_dim=64, mlp_dim=2816),
    # Llama 3.x shapes (Meta's published configs; rotary scaling left out: shapes only).
    "llama-3.1-70b": _cfg(vocab_size=128256, d_model=8192, num_layers=80, num_heads=64,
                          num_kv_heads=8, head_dim=128, mlp_dim=28672, rope_theta=500000.0,
                          norm_eps=1e-5),
    "llama-3.1-8b": _cfg(vocab_size=128256, d_model=4096, num_layers=32, num_heads=32,
                         num_kv_heads=8, head_dim=128, mlp_dim=14336, rope_theta=500000.0,
                         norm_eps=1e-5),
    "llama-3.2-1b": _cfg(vocab_size=128256, d_model=2048, num_layers=16, num_heads=32,
                         num_kv_heads=8, head_dim=64, mlp_dim=8192, rope_theta=500000.0,
                         norm_eps=1e-5, tie_embeddings=True),
    # Small CPU sizes.
    "cpu-target-27m": _cfg(vocab_size=8192, d_model=512, num_layers=6, num_heads=8,
                           num_kv_heads=8, head_dim=64, mlp_dim=1536),
    "cpu-draft-1m": _cfg(vocab_size=8192, d_model=64, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=16, mlp_dim=192, tie_embeddings=True),
    "tiny": _cfg(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=8, mlp_dim=64),
}


def decoder_config(name: str, **overrides) -> DecoderConfig:
  """A named config, optionally with fields replaced (e.g. vocab_size=...)."""
  if name not in DECODER_CONFIGS:
    raise ValueError(f"unknown decoder config {name!r}; known: {sorted(DECODER_CONFIGS)}")
  fields = [f.name for f in dataclasses.fields(DecoderConfig)]
  unknown = sorted(set(overrides) - set(fields))
  if unknown:
    raise TypeError(f"decoder_config({name!r}): {unknown[0]} is not a DecoderConfig field; "
                    f"the fields: {', '.join(fields)}")
  return DECODER_CONFIGS[name].replace(**overrides)


def _dense(features, name, config, axis=-1, use_bias=False):
  return nn.DenseGeneral(
      features, axis=axis, use_bias=use_bias, name=name, dtype=jnp.dtype(config.dtype),
      param_dtype=jnp.dtype(config.param_dtype),
      kernel_init=nn.initializers.variance_scaling(1.0, "fan_in", "normal"))


def matvec_rows(config: DecoderConfig, packed: bool = False) -> int:
  """`config.matvec_max_rows` resolved. None: on CPU, the choice `specjax.tune_matvec_rows`
  stored for this machine, shape and layout (`models.matvec_cache`), else 0; 0 elsewhere."""
  if config.matvec_max_rows is not None:
    return config.matvec_max_rows
  if jax.default_backend() != "cpu":
    return 0
  tuned = matvec_cache.lookup(config, packed)
  return 0 if tuned is None else tuned


def _declare_block_params(c: DecoderConfig, dtype) -> None:
  """Creates the standard kernels of a block (init only), named as in the tree."""
  e = jnp.zeros((1, c.d_model), dtype)
  for name, shape in (("q", (c.num_heads, c.head_dim)), ("k", (c.num_kv_heads, c.head_dim)),
                      ("v", (c.num_kv_heads, c.head_dim))):
    _dense(shape, name, c, use_bias=c.qkv_bias)(e)
  for name in ("gate", "up"):
    _dense((c.mlp_dim,), name, c)(e)
  _dense(c.d_model, "o", c, axis=(-2, -1))(jnp.zeros((1, c.num_heads, c.head_dim), dtype))
  _dense(c.d_model, "down", c)(jnp.zeros((1, c.mlp_dim), dtype))


class _Block(nn.Module):
  config: DecoderConfig

  @nn.compact
  def __call__(self, x_BTE, positions_BT, cache: KVCache, layer: int, empty: bool,
               mask_TT=None, valid_BS=None, write_slots_BT=None):
    c = self.config
    dtype = jnp.dtype(c.dtype)
    norm = lambda name: RMSNorm(c.norm_eps, dtype, jnp.dtype(c.param_dtype), name=name)
    if self.is_initializing():
      _declare_block_params(c, dtype)
    variables = self.variables["params"]
    p = {k: v["kernel"] for k, v in variables.items() if "kernel" in v}
    bias = lambda n: variables[n]["bias"].astype(dtype) if "bias" in variables[n] else 0
    mm = functools.partial(contract, max_matvec_rows=matvec_rows(c, "qkv" in p), dtype=dtype)
    b, t = x_BTE.shape[:2]
    h_BTE = norm("attn_norm")(x_BTE)
    if "qkv" in p:  # packed: [E, K, G + 2, D], each kv head after its query group
      g = c.num_heads // c.num_kv_heads
      qkv = mm(h_BTE, p["qkv"], (0,)) + bias("qkv")
      q_BTHD = qkv[:, :, :, :g].reshape(b, t, c.num_heads, c.head_dim)
      k_BTKD, v_BTKD = qkv[:, :, :, g], qkv[:, :, :, g + 1]
    else:
      q_BTHD, k_BTKD, v_BTKD = (mm(h_BTE, p[n], (0,)) + bias(n) for n in ("q", "k", "v"))
    if c.qk_norm:
      q_BTHD, k_BTKD = norm("q_norm")(q_BTHD), norm("k_norm")(k_BTKD)
    q_BTHD = apply_rope(q_BTHD, positions_BT, c.rope_theta, c.rope_scaling)
    k_BTKD = apply_rope(k_BTKD, positions_BT, c.rope_theta, c.rope_scaling)
    att_BTHD, new_k, new_v = attend_cached(q_BTHD, k_BTKD, v_BTKD, cache.k[layer], cache.v[layer],
                                           cache.lengths, scale=c.head_dim ** -0.5, empty=empty,
                                           mask_TT=mask_TT, valid_BS=valid_BS,
                                           write_slots_BT=write_slots_BT,
                                           positions_BT=positions_BT, window=c.sliding_window,
                                           kernel=c.attention_kernel)
    x_BTE = x_BTE + mm(att_BTHD, p["o"], (0, 1))
    h_BTE = norm("mlp_norm")(x_BTE)
    if "gate_up" in p:  # packed: [E, F, 2]
      gu_BTF2 = mm(h_BTE, p["gate_up"], (0,))
      gate, up = gu_BTF2[..., 0], gu_BTF2[..., 1]
    else:
      gate, up = mm(h_BTE, p["gate"], (0,)), mm(h_BTE, p["up"], (0,))
    act_BTF = nn.silu(gate) * up
    if "down_t" in p:  # packed: [E, F]
      x_BTE = x_BTE + mm(act_BTF, p["down_t"], (1,))
    else:
      x_BTE = x_BTE + mm(act_BTF, p["down"], (0,))
    return x_BTE, cache.replace(k=replace_layer(cache.k, layer, new_k),
                               v=replace_layer(cache.v, layer, new_v))


class DecoderModule(nn.Module):
  """The Flax module. `__call__` returns final-normed hidden states and the cache."""

  config: DecoderConfig

  def setup(self):
    c = self.config
    self.embed = nn.Embed(c.vocab_size, c.d_model, dtype=jnp.dtype(c.dtype),
                          param_dtype=jnp.dtype(c.param_dtype),
                          # Tied: the embedding is also the output layer, so keep
                          # initial logits O(1) (std d^-0.5 against unit-RMS states).
                          embedding_init=nn.initializers.normal(
                              c.d_model ** -0.5 if c.tie_embeddings else 1.0))
    self.layers = [_Block(c, name=f"layer_{i}") for i in range(c.num_layers)]
    self.final_norm = RMSNorm(c.norm_eps, jnp.dtype(c.dtype), jnp.dtype(c.param_dtype))
    if not c.tie_embeddings:
      self.lm_head = _dense(c.vocab_size, "lm_head", c)

  def __call__(self, tokens_BT: jax.Array, cache: KVCache, empty: bool = False,
               positions_BT=None, mask_TT=None, valid_BS=None,
               write_slots_BT=None, taps: Tuple[int, ...] = ()):
    """`empty=True` (static): every row's length is 0 (prefill, full forward). `positions_BT` /
    `mask_TT`: see `DecoderLM.extend`. `valid_BS` / `write_slots_BT`: a ring-buffer cache
    (`layers.attend_cached`). Returns (final-normed states `[B, T, E]`, cache); with `taps`
    (static block indices) also the residual streams after those blocks, concatenated
    `[B, T, len(taps) * E]` (EAGLE-3's low / middle / high features)."""
    t = tokens_BT.shape[1]
    if positions_BT is None:
      positions_BT = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    x_BTE = self.embed(tokens_BT)
    tapped = {}
    for i, block in enumerate(self.layers):
      x_BTE, cache = block(x_BTE, positions_BT, cache, i, empty, mask_TT, valid_BS,
                           write_slots_BT)
      x_BTE = block_boundary(x_BTE)
      if i in taps:
        tapped[i] = x_BTE
    cache = cache.replace(lengths=cache.lengths + t)
    if taps:
      return self.final_norm(x_BTE), cache, jnp.concatenate([tapped[i] for i in taps], axis=-1)
    return self.final_norm(x_BTE), cache

  def init_all(self, tokens_BT: jax.Array, cache: KVCache) -> jax.Array:
    """Touches every parameter (used by `DecoderLM.init`)."""
    h_BTE, _ = self(tokens_BT, cache)
    return self.project(h_BTE)

  def project(self, h_xE: jax.Array) -> jax.Array:
    """Hidden states `[..., E]` → float32 logits `[..., V]` (whole vocabulary on every device)."""
    c = self.config
    if self.is_initializing():
      logits = self.embed.attend(h_xE) if c.tie_embeddings else self.lm_head(h_xE)
      return whole_vocab(logits.astype(jnp.float32))
    params = self.variables["params"]
    packed = "qkv" in params.get("layer_0", {})
    mm = functools.partial(contract, max_matvec_rows=matvec_rows(c, packed),
                           dtype=jnp.dtype(c.dtype))
    if c.tie_embeddings:  # the embedding [V, E] read as an [out, in] kernel
      logits = mm(h_xE, params["embed"]["embedding"], (1,))
    else:
      logits = mm(h_xE, params["lm_head"]["kernel"], (0,))
    return whole_vocab(logits.astype(jnp.float32))


@functools.lru_cache(maxsize=32)
def _expected_params(model: "DecoderLM", packed: bool):
  init = (lambda k: model.pack_params(model.init(k))) if packed else model.init
  return jax.eval_shape(init, jax.random.PRNGKey(0))


@dataclasses.dataclass(frozen=True)
class DecoderLM:
  """A decoder-only LM following `specjax.protocol.LanguageModel`.

  Example:
    >>> lm = DecoderLM(decoder_config("tiny"))
    >>> params = lm.init(jax.random.PRNGKey(0))
    >>> cache = lm.init_cache(batch_size=2, max_len=32, prompt_len=8)
  """

  config: DecoderConfig

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def module(self) -> DecoderModule:
    return DecoderModule(self.config)

  def init(self, key: jax.Array) -> Dict[str, Any]:
    """Random parameters (the `params` collection)."""
    cache = self.init_cache(1, 2, 2)
    variables = self.module.init(key, jnp.zeros((1, 2), jnp.int32), cache,
                                 method=DecoderModule.init_all)
    return variables["params"]

  def expected_params(self, params=None) -> Dict[str, Any]:
    """The parameter tree as `jax.ShapeDtypeStruct`s in `params`' layout (standard or packed):
    what `protocol.check_params` compares a call's params to."""
    return _expected_params(self, params is not None and decoder_layout.is_packed(params))

  def pack_params(self, params) -> Dict[str, Any]:
    """The same weights in the packed decode layout (`models.decoder_layout`). Pack once, after
    restoring and before sharding; checkpoints and the transformers export take the standard
    tree (`unpack_params`)."""
    return decoder_layout.pack_params(params, self.config)

  def unpack_params(self, params) -> Dict[str, Any]:
    """The packed decode layout back to the standard tree (exact)."""
    return decoder_layout.unpack_params(params, self.config)

  def repeat_kv_heads(self, params, repeats: int) -> Tuple["DecoderLM", Dict[str, Any]]:
    """The same model with every key/value head stored `repeats` times.

    Returns (a `DecoderLM` with `num_kv_heads * repeats` kv heads, its params): kv head j is a
    copy of head `j // repeats`, and query head h reads kv head `h // (H / (K * repeats))` = a
    copy of `h // (H / K)`, so the outputs are exactly the original's. Splits the KV cache over
    a model axis larger than K (`parallel.sharding.fit_to_mesh`). Takes either layout."""
    check_int("repeats", repeats, 1)
    c = self.config
    if c.num_heads % (c.num_kv_heads * repeats):
      raise ValueError(f"repeats={repeats} gives {c.num_kv_heads * repeats} kv heads, which "
                       f"must divide num_heads ({c.num_heads})")
    model = DecoderLM(c.replace(num_kv_heads=c.num_kv_heads * repeats))
    if repeats == 1:
      return model, params
    packed = decoder_layout.is_packed(params)
    tree = self.unpack_params(params) if packed else params
    out = dict(tree)
    for i in range(c.num_layers):
      layer = dict(out[f"layer_{i}"])
      for name in ("k", "v"):
        sub = dict(layer[name])
        sub["kernel"] = jnp.repeat(sub["kernel"], repeats, axis=1)    # [E, K, D]
        if "bias" in sub:
          sub["bias"] = jnp.repeat(sub["bias"], repeats, axis=0)      # [K, D]
        layer[name] = sub
      out[f"layer_{i}"] = layer
    return model, (model.pack_params(out) if packed else out)

  def init_cache(self, batch_size: int, max_len: int, prompt_len: int = 0) -> KVCache:
    """An empty `KVCache` with `max_len` slots (prompt_len is unused)."""
    _check_positive_int("batch_size", batch_size)
    _check_positive_int("max_len", max_len)
    c = self.config
    return KVCache.zeros(c.num_layers, batch_size, max_len, c.num_kv_heads, c.head_dim,
                         jnp.dtype(c.dtype))

  def prefill_positions(self, prompt_len: int) -> int:
    return prompt_len

  def check_layers(self, layers: Optional[Sequence[int]]) -> Tuple[int, ...]:
    """`layers` (block indices whose outputs a caller reads) as a tuple of distinct ints in
    [0, num_layers); None / () → ()."""
    if layers is None:
      return ()
    n = self.config.num_layers
    out = tuple(layers)
    for i in out:
      if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < n:
        raise ValueError(f"layers must be block indices in [0, {n}), got {list(out)}")
    if len(set(out)) != len(out):
      raise ValueError(f"layers must be distinct, got {list(out)}")
    return tuple(int(i) for i in out)

  def _hidden(self, params, tokens_BT, cache, empty, positions_BT, mask_TT, layers):
    """(final-normed states, states to return: those or the chosen blocks' outputs, cache)."""
    taps = self.check_layers(layers)
    out = self.module.apply({"params": params}, tokens_BT, cache, empty, positions_BT, mask_TT,
                            taps=taps)
    if taps:
      return out[0], out[2], out[1]
    return out[0], out[0], out[1]

  def extend_with_hidden(self, params, tokens_BT: jax.Array, cache: KVCache,
                         positions_BT: Optional[jax.Array] = None,
                         mask_TT: Optional[jax.Array] = None,
                         layers: Optional[Sequence[int]] = None
                         ) -> Tuple[jax.Array, jax.Array, KVCache]:
    """Like `extend`, also returning hidden states: final-normed `[B, T, E]`, or (`layers`:
    block indices) the residual streams after those blocks, `[B, T, len(layers) * E]`."""
    h_BTE, hidden, cache = self._hidden(params, tokens_BT, cache, False, positions_BT, mask_TT,
                                        layers)
    logits = self.module.apply({"params": params}, h_BTE, method=DecoderModule.project)
    return logits, hidden, cache

  def extend(self, params, tokens_BT: jax.Array, cache: KVCache,
             positions_BT: Optional[jax.Array] = None,
             mask_TT: Optional[jax.Array] = None) -> Tuple[jax.Array, KVCache]:
    """Writes `tokens_BT` at slots lengths + 0..T-1 of each row; returns logits `[B, T, V]` and
    the cache (lengths + T).

    `positions_BT` (int32): rotary positions (default: the slots, lengths + 0..T-1). `mask_TT`
    (bool `[T, T]` or `[B, T, T]`): which of the T new tokens each attends to (default:
    causal); every token attends to the row's cached slots `< lengths`. Token trees and
    lookahead branches use both."""
    logits, _, cache = self.extend_with_hidden(params, tokens_BT, cache, positions_BT, mask_TT)
    return logits, cache

  def copy_slots(self, cache: KVCache, src_BN: jax.Array, dst_B: jax.Array) -> KVCache:
    """The cache with row b's slots `src_BN[b, i]` copied to `dst_B[b] + i` in every layer
    (committing accepted tokens written elsewhere in the call); lengths unchanged."""
    ks, vs = zip(*(copy_slots(k, v, src_BN, dst_B) for k, v in zip(cache.k, cache.v)))
    return cache.replace(k=tuple(ks), v=tuple(vs))

  def prefill(self, params, prompts_BP: jax.Array, prompt_lengths_B: jax.Array,
              cache: KVCache) -> Tuple[jax.Array, jax.Array, KVCache]:
    """Fills the cache with right-padded prompts; next-token logits `[B, V]` (no states kept)."""
    return self.prefill_with_hidden(params, prompts_BP, prompt_lengths_B, cache,
                                    fold=(lambda acc, start, x_BCX: acc, ()))[:3]

  def prefill_with_hidden(self, params, prompts_BP: jax.Array, prompt_lengths_B: jax.Array,
                          cache: KVCache, layers: Optional[Sequence[int]] = None,
                          fold: Optional[Tuple[Callable[[Any, Any, jax.Array], Any], Any]] = None
                          ) -> Tuple[jax.Array, jax.Array, KVCache, Any]:
    """`prefill`, also returning the prompts' hidden states `[B, P, X]` (as
    `extend_with_hidden` gives them: final-normed, or the `layers`' outputs).

    `fold` = (fn, init): instead of the states, return what `fn(acc, start, x_BCX)` makes of
    them chunk by chunk (`config.prefill_chunk`; `start` the chunk's first position, an int or
    a traced int32), starting from `init`: the `[B, P, X]` states are never whole in memory."""
    p = prompts_BP.shape[1]
    prompts_BP = mask_padding(prompts_BP, prompt_lengths_B)   # padding is never read
    if p > cache.max_len:
      raise ValueError(f"prompts length {p} exceeds the cache's {cache.max_len} slots")
    chunk = min(self.config.prefill_chunk or p, p)
    last_B = prompt_lengths_B.astype(jnp.int32) - 1

    def piece(start, cache, h_last_BE, tokens_BC):
      """One chunk at positions start..: the cache, the final-normed state `[B, E]` at each
      row's last prompt position if it lies in the chunk, the states to return."""
      cache = cache.replace(lengths=jnp.full_like(cache.lengths, start))
      h_BCE, x_BCX, cache = self._hidden(params, tokens_BC, cache,
                                         isinstance(start, int) and start == 0, None, None,
                                         layers)
      at_B = last_B - start
      inside_B = (at_B >= 0) & (at_B < h_BCE.shape[1])
      h_BE = jnp.take_along_axis(h_BCE, jnp.clip(at_B, 0, h_BCE.shape[1] - 1)[:, None, None],
                                 axis=1)[:, 0]
      h_last_BE = h_BE if h_last_BE is None else jnp.where(inside_B[:, None], h_BE, h_last_BE)
      return cache, h_last_BE, x_BCX
    # Chunks after the first run in one `lax.scan` (unrolled ones can exhaust the TPU compiler).
    full = p // chunk
    cache, h_BE, x_BCX = piece(0, cache, None, prompts_BP[:, :chunk])
    if fold is None:  # the states themselves: each chunk written into a [B, P, X] buffer
      fold = (lambda buf, start, x: jax.lax.dynamic_update_slice_in_dim(buf, x, start, axis=1),
              jnp.zeros(prompts_BP.shape[:2] + x_BCX.shape[2:], x_BCX.dtype))
    fold_fn, acc = fold
    acc = fold_fn(acc, 0, x_BCX)
    if full > 1:
      def body(carry, start):
        cache, h_BE, acc = carry
        tokens_BC = jax.lax.dynamic_slice_in_dim(prompts_BP, start, chunk, axis=1)
        cache, h_BE, x_BCX = piece(start, cache, h_BE, tokens_BC)
        return (cache, h_BE, fold_fn(acc, start, x_BCX)), None
      (cache, h_BE, acc), _ = jax.lax.scan(body, (cache, h_BE, acc),
                                           jnp.arange(1, full, dtype=jnp.int32) * chunk)
    if p % chunk:
      cache, h_BE, x_BCX = piece(full * chunk, cache, h_BE, prompts_BP[:, full * chunk:])
      acc = fold_fn(acc, full * chunk, x_BCX)
    logits_BV = self.module.apply({"params": params}, h_BE, method=DecoderModule.project)
    last_token_B = jnp.take_along_axis(prompts_BP, last_B[:, None], axis=1)[:, 0]
    return logits_BV, last_token_B.astype(jnp.int32), cache.replace(
        lengths=prompt_lengths_B.astype(jnp.int32)), acc

  def forward(self, params, tokens_BT: jax.Array, positions_BT: Optional[jax.Array] = None,
              mask_TT: Optional[jax.Array] = None) -> jax.Array:
    """Full forward without a persistent cache: logits `[B, T, V]` (causal; `positions_BT` /
    `mask_TT` as in `extend`, e.g. PARD's mask slots)."""
    return self.forward_with_hidden(params, tokens_BT, positions_BT=positions_BT,
                                    mask_TT=mask_TT)[0]

  def forward_with_hidden(self, params, tokens_BT: jax.Array,
                          layers: Optional[Sequence[int]] = None,
                          positions_BT: Optional[jax.Array] = None,
                          mask_TT: Optional[jax.Array] = None
                          ) -> Tuple[jax.Array, jax.Array]:
    """Full forward (causal, or as `positions_BT` / `mask_TT` say): logits `[B, T, V]` and the
    final-normed hidden states `[B, T, E]`, or with `layers` the chosen blocks' outputs
    `[B, T, len(layers) * E]`."""
    b, t = tokens_BT.shape
    h_BTE, hidden, _ = self._hidden(params, tokens_BT, self.init_cache(b, t), True,
                                    positions_BT, mask_TT, layers)
    return self.module.apply({"params": params}, h_BTE, method=DecoderModule.project), hidden
