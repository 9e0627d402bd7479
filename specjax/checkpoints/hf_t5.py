"""T5 weights in transformers' format: import into `specjax.models.t5.T5`, export back.

* `import_hf_t5(path_or_state_dict, config=None) -> (params, config)`: a `model.safetensors` /
  sharded index / PyTorch `.bin` file or folder (local or a URL such as `gs://bucket/t5`:
  `streaming.open_tensors`), or an in-memory state dict (numpy arrays or torch tensors); without
  `config`, the `config.json` beside it.
* `export_hf_t5(params, config, directory)`: `model.safetensors` and a `config.json` that
  `transformers.T5ForConditionalGeneration.from_pretrained` loads offline.

The tensor mapping is `_entries` (torch Linear weights `[out, in]`, ours `[in..., out...]`:
`SelfAttention.q.weight [H*D, E]` ↔ `attn/q/kernel [E, H, D]`, `o.weight [E, H*D]` ↔
`o/kernel [H, D, E]`; `shared.weight [V, E]` ↔ `shared/embedding`; v1.1's `lm_head.weight`).
Accepted but not stored: `{en,de}coder.embed_tokens.weight` (copies of shared), v1.0's tied
`lm_head.weight` (must equal shared), and old checkpoints' unused
`decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight`.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import jax
import numpy as np

from specjax.checkpoints import streaming
from specjax.checkpoints.config_checks import (check_architectures, check_model_config,
                                               hf_bool, hf_int, hf_positive_real, with_source)
from specjax.checkpoints.hf_common import (
    check_state_dict, config_beside, make_directory, read_config_json, save_safetensors)
from specjax.atomic_io import as_path, atomic_write_json
from specjax.models.t5_config import T5Config
from specjax.parallel import sharding as sharding_lib

__all__ = ["import_hf_t5", "export_hf_t5", "t5_config_from_hf", "hf_config_from_t5",
           "hf_t5_shapes"]

_FF_FROM_HF = {"relu": "relu", "gated-gelu": "gated-gelu"}
# transformers classes holding T5's encoder-decoder with its LM head (T5WithLMHeadModel: the
# name in configs written before transformers 4).
_ARCHITECTURES = ("T5ForConditionalGeneration", "MT5ForConditionalGeneration",
                  "T5WithLMHeadModel")


def _special_id(hf: Mapping[str, Any], key: str, default: int) -> int:
  """`key` (an id, a non-empty list of ids: the first, or null: `default`) as an int >= 0."""
  value = hf.get(key)
  if isinstance(value, (list, tuple)):
    if not value:
      raise ValueError(f"config {key} must be an id, a non-empty list of ids or null, got []")
    value = value[0]
  return hf_int({key: value}, key, default, minimum=0)


def t5_config_from_hf(hf: Mapping[str, Any], **overrides) -> T5Config:
  """A transformers T5 `config.json` dict → `T5Config`.

  transformers 5 always writes `tie_word_embeddings: true` for T5 and keeps the v1.0 / v1.1
  difference in `scale_decoder_outputs`; older versions only have `tie_word_embeddings`. Both
  are understood.

  Raises:
    TypeError: `hf` is not a dict.
    ValueError: an unsupported model type, architecture or feed-forward kind, or a value out of
      its domain (sizes not ints >= 1, a `layer_norm_epsilon` that is not a finite number > 0,
      non-bool flags, negative or empty special ids), naming the field, the value and what is
      allowed.
  """
  if not isinstance(hf, Mapping):
    raise TypeError(f"hf must be a dict (a config.json), got {type(hf).__name__}")
  model_type = hf.get("model_type", "t5")
  if model_type not in ("t5", "mt5"):  # mT5 is T5 v1.1 with a larger vocabulary.
    raise ValueError(f"config.json model_type must be 't5' or 'mt5', got {model_type!r}")
  check_architectures(hf, _ARCHITECTURES, "T5")
  ff = hf.get("feed_forward_proj", "relu")
  if not isinstance(ff, str) or ff not in _FF_FROM_HF:
    raise ValueError(f"feed_forward_proj {ff!r} is not supported; expected one of "
                     f"{sorted(_FF_FROM_HF)}")
  tied = hf_bool(hf, "scale_decoder_outputs", hf_bool(hf, "tie_word_embeddings", True))
  pad = _special_id(hf, "pad_token_id", 0)
  eos = _special_id(hf, "eos_token_id", 1)
  start = _special_id(hf, "decoder_start_token_id", pad)
  num_layers = hf_int(hf, "num_layers", 6)
  fields = dict(
      vocab_size=hf_int(hf, "vocab_size", 32128), d_model=hf_int(hf, "d_model", 512),
      d_kv=hf_int(hf, "d_kv", 64), num_heads=hf_int(hf, "num_heads", 8),
      d_ff=hf_int(hf, "d_ff", 2048), num_layers=num_layers,
      num_decoder_layers=hf_int(hf, "num_decoder_layers", num_layers),
      relative_attention_num_buckets=hf_int(hf, "relative_attention_num_buckets", 32),
      relative_attention_max_distance=hf_int(hf, "relative_attention_max_distance", 128),
      feed_forward=_FF_FROM_HF[ff], tie_word_embeddings=tied,
      layer_norm_epsilon=hf_positive_real(hf, "layer_norm_epsilon", 1e-6),
      pad_id=pad, eos_id=eos, decoder_start_id=start)
  fields.update(overrides)
  return T5Config(**fields)


def hf_config_from_t5(config: T5Config) -> Dict[str, Any]:
  """`T5Config` → a transformers `config.json` dict (T5ForConditionalGeneration)."""
  c = config
  return {
      "architectures": ["T5ForConditionalGeneration"],
      "model_type": "t5",
      "vocab_size": c.vocab_size,
      "d_model": c.d_model,
      "d_kv": c.d_kv,
      "d_ff": c.d_ff,
      "num_layers": c.num_layers,
      "num_decoder_layers": c.num_decoder_layers,
      "num_heads": c.num_heads,
      "relative_attention_num_buckets": c.relative_attention_num_buckets,
      "relative_attention_max_distance": c.relative_attention_max_distance,
      "feed_forward_proj": c.feed_forward,
      "tie_word_embeddings": c.tie_word_embeddings,
      "scale_decoder_outputs": c.tie_word_embeddings,
      "is_encoder_decoder": True,
      "use_cache": True,
      "pad_token_id": c.pad_id,
      "eos_token_id": c.eos_id,
      "decoder_start_token_id": c.decoder_start_id,
      "layer_norm_epsilon": c.layer_norm_epsilon,
      "dropout_rate": 0.0,
      "initializer_factor": 1.0,
  }


# One entry per stored tensor: (transformers name, params path, to_hf, from_hf).
_Conv = Tuple[str, Tuple[str, ...], Callable[[np.ndarray], np.ndarray],
              Callable[[np.ndarray], np.ndarray]]


def _entries(c: T5Config) -> List[_Conv]:
  e, h, d = c.d_model, c.num_heads, c.d_kv
  ident = (lambda x: x, lambda x: x)
  dense = (lambda k: k.T, lambda w: w.T)
  qkv = (lambda k: k.reshape(e, h * d).T, lambda w: w.T.reshape(e, h, d))
  out = (lambda k: k.reshape(h * d, e).T, lambda w: w.T.reshape(h, d, e))
  entries: List[_Conv] = [("shared.weight", ("shared", "embedding"), *ident)]
  mlp_names = ("wi_0", "wi_1", "wo") if c.is_gated else ("wi", "wo")

  def attention(prefix, path):
    for p in "qkv":
      entries.append((f"{prefix}.{p}.weight", path + (p, "kernel"), *qkv))
    entries.append((f"{prefix}.o.weight", path + ("o", "kernel"), *out))

  def mlp(prefix, path):
    for m in mlp_names:
      entries.append((f"{prefix}.DenseReluDense.{m}.weight", path + ("mlp", m, "kernel"), *dense))
    entries.append((f"{prefix}.layer_norm.weight", path + ("mlp_norm", "scale"), *ident))

  for stack, n in (("encoder", c.num_layers), ("decoder", c.num_decoder_layers)):
    entries.append((f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                    (stack, "relpos_bias"), *ident))
    for i in range(n):
      hf, ours = f"{stack}.block.{i}.layer", (stack, f"layers_{i}")
      if stack == "encoder":
        attention(f"{hf}.0.SelfAttention", ours + ("attn",))
        entries.append((f"{hf}.0.layer_norm.weight", ours + ("attn_norm", "scale"), *ident))
        mlp(f"{hf}.1", ours)
      else:
        attention(f"{hf}.0.SelfAttention", ours + ("self_attn",))
        entries.append((f"{hf}.0.layer_norm.weight", ours + ("self_norm", "scale"), *ident))
        attention(f"{hf}.1.EncDecAttention", ours + ("cross_attn",))
        entries.append((f"{hf}.1.layer_norm.weight", ours + ("cross_norm", "scale"), *ident))
        mlp(f"{hf}.2", ours)
    entries.append((f"{stack}.final_layer_norm.weight", (stack, "final_norm", "scale"), *ident))
  if not c.tie_word_embeddings:
    entries.append(("lm_head.weight", ("lm_head", "kernel"), *dense))
  return entries


def hf_t5_shapes(config: T5Config) -> Dict[str, Tuple[int, ...]]:
  """transformers tensor name → shape, for every tensor `import_hf_t5` needs."""
  c = config
  e, v, f, a, nb = c.d_model, c.vocab_size, c.d_ff, c.inner_dim, c.relative_attention_num_buckets
  shapes: Dict[str, Tuple[int, ...]] = {}
  for name, _, _, _ in _entries(c):
    if name == "shared.weight" or name == "lm_head.weight":
      shapes[name] = (v, e)
    elif name.endswith("relative_attention_bias.weight"):
      shapes[name] = (nb, c.num_heads)
    elif name.endswith(("q.weight", "k.weight", "v.weight")):
      shapes[name] = (a, e)
    elif name.endswith(".o.weight"):
      shapes[name] = (e, a)
    elif name.endswith(("wi.weight", "wi_0.weight", "wi_1.weight")):
      shapes[name] = (f, e)
    elif name.endswith("wo.weight"):
      shapes[name] = (e, f)
    else:
      shapes[name] = (e,)
  return shapes


def _optional_shapes(c: T5Config) -> Dict[str, Tuple[int, ...]]:
  shapes = {"encoder.embed_tokens.weight": (c.vocab_size, c.d_model),
            "decoder.embed_tokens.weight": (c.vocab_size, c.d_model),
            "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight":
                (c.relative_attention_num_buckets, c.num_heads)}
  if c.tie_word_embeddings:
    shapes["lm_head.weight"] = (c.vocab_size, c.d_model)
  return shapes


def _get(tree: Mapping[str, Any], path: Tuple[str, ...]):
  for key in path:
    if key not in tree:
      raise ValueError(f"params lack {'/'.join(path)} (wrong config for these params?)")
    tree = tree[key]
  return tree


def _find_hf_config(path: str) -> Tuple[Optional[Dict[str, Any]], str]:
  """(the config.json object beside `path` or None, its path)."""
  candidate = config_beside(path)
  return (read_config_json(candidate) if as_path(candidate).exists() else None), candidate


def import_hf_t5(path_or_state_dict, config: Optional[T5Config] = None, *,
                 mesh: Optional[jax.sharding.Mesh] = None,
                 dtype: Optional[str] = None) -> Tuple[Any, T5Config]:
  """transformers-format T5 weights → `(params, config)` for `T5(config)`.

  Streamed like `import_hf_decoder`: tensors are memory-mapped, read one at a time and converted
  slice by slice to `dtype` (default `config.param_dtype`; given, it replaces `param_dtype` in the
  returned config); with `mesh`, each leaf goes straight into its `NamedSharding` (`param_spec`),
  each device's slice read on its own (`specjax.checkpoints.streaming`).

  Raises ValueError naming every missing, unexpected or mis-shaped tensor, a tensor stored as
  an integer or bool (file, tensor, both dtypes), an unsupported or out-of-domain config value
  (with the config.json path), a config.json that is not JSON, and a copy that must equal
  `shared.weight` but differs from it.
  """
  hf_config = None
  if isinstance(path_or_state_dict, Mapping):
    tensors = streaming.lazy_from_mapping(path_or_state_dict)
  else:
    path = os.fspath(path_or_state_dict)
    tensors = streaming.open_tensors(path)
    streaming.check_digest(tensors)   # a file specjax exported: a changed byte is named
    hf_config, config_path = _find_hf_config(path)
  if config is None:
    if hf_config is None:
      raise ValueError("config is required: pass a T5Config, or keep transformers' "
                       "config.json next to the weights")
    try:
      config = t5_config_from_hf(hf_config)
    except (TypeError, ValueError) as e:
      raise with_source(e, config_path) from e
  if not isinstance(config, T5Config):
    raise TypeError(f"config must be a T5Config, got {type(config).__name__}")
  check_model_config(config)
  if dtype is not None:
    config = config.replace(param_dtype=str(dtype))

  expected = hf_t5_shapes(config)
  optional = _optional_shapes(config)
  # transformers 5 ties a v1.1 head to shared (tie_word_embeddings: true) and may then save no
  # lm_head.weight: the head is shared's copy.
  head_from_shared = (not config.tie_word_embeddings and "lm_head.weight" not in tensors
                      and hf_config is not None and hf_config.get("tie_word_embeddings") is True)
  if head_from_shared and "shared.weight" in tensors:
    tensors = tensors.with_alias("lm_head.weight", "shared.weight")
  check_state_dict({**expected, **optional}, {k: tensors[k] for k in tensors}, optional=optional)
  streaming.check_float_tensors(tensors, list(tensors), config.param_dtype)
  for copy in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"):
    if copy in optional and copy in tensors and not streaming.tensors_equal(tensors, copy,
                                                                            "shared.weight"):
      raise ValueError(f"{copy} differs from shared.weight; this T5 layout ties them "
                       f"(tie_word_embeddings={config.tie_word_embeddings})")
  sharding_for = None
  if mesh is not None:
    sharding_for = lambda p, shape: jax.sharding.NamedSharding(
        mesh, sharding_lib.param_spec(p, shape, mesh))
  entries = [streaming.Entry(name, path, from_hf) for name, path, _, from_hf in _entries(config)]
  return streaming.place(entries, tensors, config.param_dtype, sharding_for), config


def export_hf_t5(params, config: T5Config, directory: str) -> None:
  """Writes `directory/model.safetensors` and `directory/config.json` in transformers'
  T5ForConditionalGeneration format (float32 tensors); `directory` may be a URL (`gs://...`)."""
  if not isinstance(config, T5Config):
    raise TypeError(f"config must be a T5Config, got {type(config).__name__}")
  directory = make_directory(directory)
  tensors = {}
  for name, path, to_hf, _ in _entries(config):
    value = np.asarray(jax.device_get(_get(params, path)), np.float32)
    tensors[name] = np.ascontiguousarray(to_hf(value))
  check_state_dict(hf_t5_shapes(config), tensors)
  # The tensors' digest in the file's metadata: `import_hf_t5` verifies it.
  save_safetensors(tensors, os.path.join(directory, "model.safetensors"),
                   metadata={"format": "pt",
                             streaming.DIGEST_KEY: streaming.tensors_digest(tensors.items())})
  atomic_write_json(os.path.join(directory, "config.json"), hf_config_from_t5(config), indent=2)
