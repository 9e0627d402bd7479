"""transformers Llama-family checkpoints ↔ specjax `DecoderLM` params.

Reads (and writes) the decoder families that share Llama's block (pre-norm RMSNorm, "rotate
half" rotary positions, SwiGLU MLP, MHA or GQA with query head h reading kv head h // (H // K),
scaling head_dim ** -0.5):

  model_type   what differs                                      DecoderConfig
  llama        Llama 2 / 3.x; rope_type "llama3" (3.1+), tied   rope_scaling,
               embeddings (3.2-1B / 3B)                          tie_embeddings
  mistral      sliding-window attention                          sliding_window
  qwen2        q / k / v biases (Qwen2, Qwen2.5), tied or not    qkv_bias
  qwen3        RMSNorm of every q / k head (q_norm, k_norm),     qk_norm, head_dim
               head_dim independent of hidden / heads

Rotary scaling "default", "linear", "llama3" and "yarn" is supported (`specjax.models.rope`);
"dynamic" and "longrope" change with the sequence length and are refused by name, as are
per-layer sliding windows, output-projection or MLP biases and activations other than SiLU
(naming the config key). The q/k projections need NO permutation (that exists only between
Meta's original interleaved-rotary weights and the transformers layout).

Tensor mapping (torch `nn.Linear` weights are `[out, in]`, flax kernels `[in..., out...]`; "L."
is `model.layers.{i}.` → `layer_{i}/`); every conversion is a reshape / transpose view, so a
memory-mapped tensor is read only where a device's slice needs it (`checkpoints.streaming`):

  model.embed_tokens.weight [V, E]           → embed/embedding [V, E]
  L.input_layernorm.weight [E]               → attn_norm/scale (post_attention_: mlp_norm)
  L.self_attn.q_proj.weight [H*D, E]         → q/kernel [E, H, D] (k, v: [K*D, E] → [E, K, D])
  L.self_attn.{q,k,v}_proj.bias              → {q,k,v}/bias [H | K, D]
  L.self_attn.{q,k}_norm.weight [D]          → {q,k}_norm/scale
  L.self_attn.o_proj.weight [E, H*D]         → o/kernel [H, D, E]
  L.mlp.{gate,up}_proj.weight [F, E]         → {gate,up}/kernel [E, F]
  L.mlp.down_proj.weight [E, F]              → down/kernel [F, E]
  model.norm.weight [E]                      → final_norm/scale
  lm_head.weight [V, E]                      → lm_head/kernel [E, V] (untied only; tied, it is
                                               optional and must equal the embedding)

Known non-parameter buffers (`IGNORED_BUFFERS`, e.g. rotary `inv_freq`) are dropped; any other
unknown tensor is an error.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any, Dict, List, Mapping, Optional, Tuple

import jax
import numpy as np

from specjax.atomic_io import as_path, atomic_write_json
from specjax.checkpoints import streaming
from specjax.checkpoints.config_checks import (check_architectures, check_model_config,
                                               hf_bool, hf_int, hf_positive_real, positive_real,
                                               with_source)
from specjax.checkpoints.hf_common import (check_state_dict, config_beside, make_directory,
                                           read_config_json, save_safetensors)
from specjax.models import decoder_layout, rope
from specjax.models.decoder import DecoderConfig
from specjax.parallel import sharding as sharding_lib

__all__ = [
    "decoder_config_from_hf", "hf_config_from_decoder", "import_hf_decoder", "import_hf_llama",
    "export_hf_decoder", "export_hf_llama", "hf_llama_shapes", "IGNORED_BUFFERS",
    "HF_DECODER_TYPES",
]

HF_DECODER_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                  "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# Non-parameter buffers of some transformers state dicts (rotary inverse frequencies, per layer
# or once), recomputed from the config and dropped on import. Full-match regexes.
IGNORED_BUFFERS: Tuple[str, ...] = (
    r"model\.rotary_emb\.(inv_freq|original_inv_freq)",
    r"model\.layers\.\d+\.self_attn\.rotary_emb\.(inv_freq|original_inv_freq)",
)
_IGNORED_RE = re.compile("|".join(f"(?:{p})" for p in IGNORED_BUFFERS))

_SUPPORTED_ACTS = ("silu", "swish")  # transformers maps both to SiLU.


# --------------------------------------------------------------------------- config


def _rope_from_hf(hf: Mapping[str, Any]) -> Tuple[float, Any]:
  """(rope_theta, canonical scaling rule) from a config dict of any transformers version
  (`rope_parameters` in 5.x, `rope_scaling` + `rope_theta` before); unsupported rules raise."""
  theta = hf.get("rope_theta")
  scaling = None
  for key in ("rope_parameters", "rope_scaling"):
    params = hf.get(key)
    if params is None:
      continue
    if not isinstance(params, Mapping):
      raise ValueError(f"config {key} must be a dict or null, got {params!r}")
    params = dict(params)
    if params.get("rope_theta") is not None:
      top = hf.get("rope_theta")
      if top is not None and positive_real("rope_theta", top) != positive_real(
          f"{key}.rope_theta", params["rope_theta"]):
        raise ValueError(f"config rope_theta ({top!r}) and {key}.rope_theta "
                         f"({params['rope_theta']!r}) disagree: transformers < 5 reads the "
                         f"first, 5.x the second; make them equal")
      theta = params["rope_theta"]
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in ("llama3", "yarn") and params.get("original_max_position_embeddings") is None:
      params["original_max_position_embeddings"] = hf.get(
          "original_max_position_embeddings", hf.get("max_position_embeddings"))
    if kind == "yarn" and params.get("factor") is None and params.get(
        "original_max_position_embeddings"):
      original = hf_int(params, "original_max_position_embeddings")
      params["factor"] = hf_int(hf, "max_position_embeddings") / original
    try:
      rule = rope.canonical_scaling(params)
    except ValueError as err:
      raise ValueError(f"config {key}: {err}") from None
    if rule is not None:
      scaling = rule
  return positive_real("rope_theta", 10000.0 if theta is None else theta), scaling


def _sliding_window_from_hf(hf: Mapping[str, Any], model_type: str) -> Optional[int]:
  window = hf.get("sliding_window")
  if model_type == "mistral":
    return hf_int(hf, "sliding_window", None)
  if model_type in ("qwen2", "qwen3"):
    if not hf_bool(hf, "use_sliding_window", False) or window is None:
      return None
    window = hf_int(hf, "sliding_window")
    n = hf_int(hf, "num_hidden_layers")
    first_sliding = hf_int(hf, "max_window_layers", n, minimum=0)
    types = hf.get("layer_types") or [
        "sliding_attention" if i >= first_sliding else "full_attention" for i in range(n)]
    if all(t == "full_attention" for t in types):
      return None
    if all(t == "sliding_attention" for t in types):
      return int(window)
    raise ValueError(
        "unsupported config use_sliding_window=true with a mix of sliding and full layers "
        f"(max_window_layers={hf.get('max_window_layers')!r} / layer_types): specjax applies "
        "one window to every layer")
  if window is not None and hf.get("use_sliding_window", True):
    raise ValueError(f"unsupported config sliding_window={window!r} for model_type "
                     f"{model_type!r}")
  return None


def _check_architectures(hf: Mapping[str, Any]) -> None:
  """`architectures` (when given) names causal-LM classes of the decoder families: another class
  (a classifier, an encoder, another family's model) has other tensors or other numerics."""
  check_architectures(hf, sorted(set(_ARCHITECTURES.values())), "decoder")


def decoder_config_from_hf(hf_config: Mapping[str, Any], **overrides) -> DecoderConfig:
  """A `DecoderConfig` from the config.json dict of a Llama, Mistral, Qwen2 / 2.5 or Qwen3 model.

  `overrides` replace fields of the result (e.g. `dtype="bfloat16"`). Features specjax does not
  implement (output or MLP biases, activations other than SiLU, sequence-dependent rotary
  scaling, per-layer sliding windows) raise a ValueError naming the config key.
  """
  if not isinstance(hf_config, Mapping):
    raise TypeError(f"hf_config must be a dict (a config.json), got {type(hf_config).__name__}")
  hf = dict(hf_config)
  model_type = hf.get("model_type", "llama")
  if model_type not in HF_DECODER_TYPES:
    raise ValueError(f"config model_type is {model_type!r}; the decoder importer reads "
                     f"{', '.join(repr(t) for t in HF_DECODER_TYPES)} checkpoints")
  _check_architectures(hf)
  # Llama's and Qwen3's attention_bias also biases o_proj; Qwen2 always has q/k/v biases only.
  for key in ("attention_bias", "mlp_bias"):
    if hf.get(key):
      raise ValueError(f"unsupported config {key}=true: the specjax decoder has biases only "
                       "on the q / k / v projections (Qwen2's layout)")
  act = hf.get("hidden_act", "silu")
  if act not in _SUPPORTED_ACTS:
    raise ValueError(f"unsupported config hidden_act={act!r}: the specjax decoder's MLP "
                     "is SwiGLU (hidden_act 'silu')")
  sizes = {key: hf_int(hf, key) for key in ("vocab_size", "hidden_size", "num_hidden_layers",
                                             "num_attention_heads", "intermediate_size")}
  hidden, heads = sizes["hidden_size"], sizes["num_attention_heads"]
  kv_heads = hf_int(hf, "num_key_value_heads", heads)
  if heads % kv_heads:
    raise ValueError(f"config num_key_value_heads must divide num_attention_heads ({heads}), got "
                     f"{kv_heads} (the DecoderConfig's num_kv_heads: each kv head serves a "
                     "whole group of query heads)")
  head_dim = hf_int(hf, "head_dim", None)
  if head_dim is None:
    if hidden % heads:
      raise ValueError(f"config has no head_dim and hidden_size ({hidden}) is not a multiple "
                       f"of num_attention_heads ({heads})")
    head_dim = hidden // heads
  if head_dim % 2:
    raise ValueError(f"config head_dim must be even (rotary positions rotate pairs), got "
                     f"{head_dim}" + ("" if hf.get("head_dim") is not None else
                                      f" (hidden_size {hidden} / num_attention_heads {heads})"))
  theta, scaling = _rope_from_hf(hf)
  default_eps = 1e-5 if model_type == "mistral" else 1e-6
  fields = dict(
      vocab_size=sizes["vocab_size"],
      d_model=hidden,
      num_layers=sizes["num_hidden_layers"],
      num_heads=heads,
      num_kv_heads=kv_heads,
      head_dim=head_dim,
      mlp_dim=sizes["intermediate_size"],
      tie_embeddings=hf_bool(hf, "tie_word_embeddings", False),
      rope_theta=theta,
      rope_scaling=scaling,
      norm_eps=hf_positive_real(hf, "rms_norm_eps", default_eps),
      qkv_bias=model_type == "qwen2",
      qk_norm=model_type == "qwen3",
      sliding_window=_sliding_window_from_hf(hf, model_type),
  )
  fields.update(overrides)
  return DecoderConfig(**fields)


def _model_type_for(config: DecoderConfig) -> str:
  if config.qk_norm:
    if config.qkv_bias:
      raise ValueError("no transformers family has both q/k/v biases and q/k norms")
    return "qwen3"
  if config.qkv_bias:
    return "qwen2"
  if config.sliding_window is not None:
    return "mistral"
  return "llama"


def hf_config_from_decoder(config: DecoderConfig, *, max_position_embeddings: int = 4096,
                           bos_token_id: Optional[int] = None,
                           eos_token_id: Optional[int] = None,
                           pad_token_id: Optional[int] = None,
                           model_type: Optional[str] = None) -> Dict[str, Any]:
  """A transformers config dict (config.json) describing `config`.

  `model_type` (default: the family the config's features need: qwen3 for q/k norms, qwen2 for
  q/k/v biases, mistral for a sliding window, else llama) picks the transformers class; weights
  are float32. specjax has no maximum length and no tokenizer, so `max_position_embeddings` and
  the special token ids are arguments (ids default to null: generation stops at max length).
  """
  if not isinstance(config, DecoderConfig):
    raise TypeError(f"config must be a DecoderConfig, got {type(config).__name__}")
  needed = _model_type_for(config)
  model_type = needed if model_type is None else model_type
  if model_type not in HF_DECODER_TYPES:
    raise ValueError(f"model_type must be one of {HF_DECODER_TYPES}, got {model_type!r}")
  if model_type != needed and not (needed == "llama" and model_type == "mistral"):
    raise ValueError(f"model_type {model_type!r} cannot hold this config: it needs {needed!r}")
  if model_type != "qwen3" and config.d_model % config.num_heads:
    raise ValueError(
        f"transformers' {model_type} config requires d_model ({config.d_model}) to be a multiple "
        f"of num_heads ({config.num_heads}); this config cannot be exported")
  rope_parameters = {"rope_type": "default", "rope_theta": float(config.rope_theta)}
  if config.rope_scaling is not None:
    rope_parameters.update(rope.scaling_dict(config.rope_scaling))
  out = {
      "architectures": [_ARCHITECTURES[model_type]],
      "model_type": model_type,
      "vocab_size": config.vocab_size,
      "hidden_size": config.d_model,
      "intermediate_size": config.mlp_dim,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.head_dim,
      "hidden_act": "silu",
      "max_position_embeddings": int(max_position_embeddings),
      "rms_norm_eps": float(config.norm_eps),
      "rope_theta": float(config.rope_theta),  # read by transformers < 5
      "rope_parameters": rope_parameters,
      "tie_word_embeddings": bool(config.tie_embeddings),
      "attention_dropout": 0.0,
      "use_cache": True,
      "bos_token_id": bos_token_id,
      "eos_token_id": eos_token_id,
      "pad_token_id": pad_token_id,
      "dtype": "float32",
  }
  if config.rope_scaling is not None:  # transformers < 5 reads rope_scaling
    out["rope_scaling"] = rope.scaling_dict(config.rope_scaling)
  if model_type in ("llama", "qwen3"):
    out["attention_bias"] = False
  if model_type == "llama":
    out.update(mlp_bias=False, pretraining_tp=1)
  if model_type == "mistral":
    out["sliding_window"] = config.sliding_window
  if model_type in ("qwen2", "qwen3"):  # one window for every layer, or none
    w = config.sliding_window
    out.update(use_sliding_window=w is not None, sliding_window=w,
               max_window_layers=0 if w is not None else config.num_layers)
  return out


# --------------------------------------------------------------------------- tensors


def _entries(c: DecoderConfig) -> List[Tuple[streaming.Entry, Tuple[int, ...], Any]]:
  """(entry, transformers shape, to_hf) of every stored tensor (lm_head only when untied). Each
  entry's view maps `[out, in]` to the params layout by reshapes and transposes only; `to_hf` is
  its inverse (for the export)."""
  e, f, v = c.d_model, c.mlp_dim, c.vocab_size
  h, k, d = c.num_heads, c.num_kv_heads, c.head_dim
  ident = (lambda x: x, lambda x: x)
  dense = (lambda x: x.T, lambda x: x.T)                       # [out, in] ↔ [in, out]
  heads = lambda n: (lambda x: x.reshape(n, d, e).transpose(2, 0, 1),   # [n*D, E] → [E, n, D]
                     lambda x: x.transpose(1, 2, 0).reshape(n * d, e))
  out_proj = (lambda x: x.reshape(e, h, d).transpose(1, 2, 0),           # [E, H*D] → [H, D, E]
              lambda x: x.transpose(2, 0, 1).reshape(e, h * d))
  bias = lambda n: (lambda x: x.reshape(n, d), lambda x: x.reshape(n * d))  # [n*D] ↔ [n, D]

  def E(name, path, conv, shape):
    return streaming.Entry(name, path, conv[0]), shape, conv[1]
  out = [E("model.embed_tokens.weight", ("embed", "embedding"), ident, (v, e))]
  for i in range(c.num_layers):
    p, l = f"model.layers.{i}.", f"layer_{i}"
    out += [
        E(p + "input_layernorm.weight", (l, "attn_norm", "scale"), ident, (e,)),
        E(p + "self_attn.q_proj.weight", (l, "q", "kernel"), heads(h), (h * d, e)),
        E(p + "self_attn.k_proj.weight", (l, "k", "kernel"), heads(k), (k * d, e)),
        E(p + "self_attn.v_proj.weight", (l, "v", "kernel"), heads(k), (k * d, e)),
    ]
    if c.qkv_bias:
      out += [E(p + f"self_attn.{n}_proj.bias", (l, n, "bias"), bias(m), (m * d,))
              for n, m in (("q", h), ("k", k), ("v", k))]
    if c.qk_norm:
      out += [E(p + f"self_attn.{n}_norm.weight", (l, f"{n}_norm", "scale"), ident, (d,))
              for n in ("q", "k")]
    out += [
        E(p + "self_attn.o_proj.weight", (l, "o", "kernel"), out_proj, (e, h * d)),
        E(p + "post_attention_layernorm.weight", (l, "mlp_norm", "scale"), ident, (e,)),
        E(p + "mlp.gate_proj.weight", (l, "gate", "kernel"), dense, (f, e)),
        E(p + "mlp.up_proj.weight", (l, "up", "kernel"), dense, (f, e)),
        E(p + "mlp.down_proj.weight", (l, "down", "kernel"), dense, (e, f)),
    ]
  out.append(E("model.norm.weight", ("final_norm", "scale"), ident, (e,)))
  if not c.tie_embeddings:
    out.append(E("lm_head.weight", ("lm_head", "kernel"), dense, (v, e)))
  return out


def hf_llama_shapes(config: DecoderConfig) -> Dict[str, Tuple[int, ...]]:
  """The transformers tensor names and shapes of a model with this config (lm_head.weight
  included even when tied; it is then optional)."""
  shapes = {entry.name: shape for entry, shape, _ in _entries(config)}
  shapes["lm_head.weight"] = (config.vocab_size, config.d_model)
  return shapes


def _flatten(tree: Any, prefix: Tuple[str, ...] = ()) -> Dict[Tuple[str, ...], Any]:
  if isinstance(tree, Mapping):
    out: Dict[Tuple[str, ...], Any] = {}
    for key, sub in tree.items():
      out.update(_flatten(sub, prefix + (str(key),)))
    return out
  return {prefix: tree}


def _params_to_hf(params: Mapping[str, Any], c: DecoderConfig) -> Dict[str, np.ndarray]:
  if decoder_layout.is_packed(params):  # the packed decode layout: same weights
    params = decoder_layout.unpack_params(params, c)
  flat = {"/".join(k): v for k, v in _flatten(params).items()}
  entries = _entries(c)
  expected = {"/".join(entry.path): tuple(entry.view(np.empty(shape, np.int8)).shape)
              for entry, shape, _ in entries}
  try:
    check_state_dict(expected, {k: v if hasattr(v, "shape") else np.asarray(v)
                                for k, v in flat.items()})
  except ValueError as err:
    detail = str(err).split(" — ", 1)[-1]
    raise ValueError(f"params do not match the config — {detail}") from None
  out = {}
  for entry, _, to_hf in entries:
    value = np.asarray(jax.device_get(flat["/".join(entry.path)]), np.float32)
    out[entry.name] = np.ascontiguousarray(to_hf(value), np.float32)
  return out


def import_hf_decoder(path_or_state_dict: Any, config: Optional[DecoderConfig] = None, *,
                      mesh: Optional[jax.sharding.Mesh] = None,
                      dtype: Optional[str] = None) -> Tuple[Dict[str, Any], DecoderConfig]:
  """transformers Llama / Mistral / Qwen2 / Qwen3 weights → `(params, config)` for `DecoderLM`.

  Tensors are read one at a time from memory maps and converted to the parameter dtype slice by
  slice (`specjax.checkpoints.streaming`): the host never holds a float32 copy of the model.

  Args:
    path_or_state_dict: a checkpoint directory, a `.safetensors` file, a sharded
      `model.safetensors.index.json`, a PyTorch `.bin`/`.pt` state dict (read with
      `torch.load(weights_only=True, mmap=True)`; the `[torch]` extra), or an in-memory mapping
      name → tensor. Paths may be URLs (`gs://bucket/llama`, through `etils.epath`; tensors are
      fetched one at a time: `specjax.checkpoints.streaming`).
    config: the `DecoderConfig`; None reads the `config.json` beside the weights (required for
      an in-memory state dict).
    mesh: place every parameter directly into its `NamedSharding` on this mesh
      (`specjax.parallel.sharding.param_spec`); each device's slice is read on its own, and each
      process reads only its addressable slices. None: the default device.
    dtype: the parameter dtype ("float32", "bfloat16", "float16"); given, it replaces
      `param_dtype` in the returned config (the compute dtype is `config.dtype`).

  Returns:
    params in the parameter dtype, and the config.

  Raises:
    ValueError: naming every missing, unexpected or mis-shaped tensor; a tensor stored as an
      integer or bool (file, tensor, both dtypes); the unsupported config feature or
      out-of-domain config value (with the config.json path); a config.json that is not JSON.
    streaming.MissingTorchError: for a PyTorch pickle without torch.
  """
  if isinstance(path_or_state_dict, Mapping):
    tensors = streaming.lazy_from_mapping(path_or_state_dict)
    if config is None:
      raise ValueError("config is required when importing an in-memory state dict "
                       "(there is no config.json to read)")
  else:
    path = os.fspath(path_or_state_dict)
    if config is None:
      config_path = config_beside(path)
      if not as_path(config_path).exists():
        raise FileNotFoundError(f"no config.json beside {path}; pass config= explicitly")
      hf_config = read_config_json(config_path)
      try:
        config = decoder_config_from_hf(hf_config)
      except (TypeError, ValueError) as e:
        raise with_source(e, config_path) from e
    tensors = streaming.open_tensors(path)
    streaming.check_digest(tensors)   # a file specjax exported: a changed byte is named
  if not isinstance(config, DecoderConfig):
    raise TypeError(f"config must be a DecoderConfig, got {type(config).__name__}")
  check_model_config(config)
  if dtype is not None:
    config = config.replace(param_dtype=str(dtype))
  tensors = tensors.without([k for k in tensors if _IGNORED_RE.fullmatch(k)])
  optional = ("lm_head.weight",) if config.tie_embeddings else ()
  check_state_dict(hf_llama_shapes(config), {k: tensors[k] for k in tensors}, optional=optional)
  streaming.check_float_tensors(tensors, list(tensors), config.param_dtype)
  if config.tie_embeddings and "lm_head.weight" in tensors:
    if not streaming.tensors_equal(tensors, "lm_head.weight", "model.embed_tokens.weight"):
      raise ValueError("config ties the embeddings (tie_word_embeddings) but the checkpoint's "
                       "lm_head.weight differs from model.embed_tokens.weight")
  sharding_for = None
  if mesh is not None:
    sharding_for = lambda path, shape: jax.sharding.NamedSharding(
        mesh, sharding_lib.param_spec(path, shape, mesh))
  params = streaming.place([entry for entry, _, _ in _entries(config)], tensors,
                           config.param_dtype, sharding_for)
  return params, config


def export_hf_decoder(params: Mapping[str, Any], config: DecoderConfig, directory: str,
                      **hf_config_kwargs) -> None:
  """Writes `directory/model.safetensors` (float32) and `directory/config.json` that
  transformers' `AutoModelForCausalLM.from_pretrained(directory)` loads offline (`directory`
  may be a URL, `gs://...`).

  `hf_config_kwargs` go to `hf_config_from_decoder` (max_position_embeddings, bos/eos/pad_token_id,
  model_type). Tied embeddings write no lm_head.weight (transformers ties it on load). `params`
  may be in either layout (standard or packed, `DecoderLM.pack_params`)."""
  hf_config = hf_config_from_decoder(config, **hf_config_kwargs)
  tensors = _params_to_hf(params, config)
  optional = ("lm_head.weight",) if config.tie_embeddings else ()
  check_state_dict(hf_llama_shapes(config), tensors, optional=optional)
  directory = make_directory(directory)
  # The tensors' digest in the file's metadata: `import_hf_decoder` verifies it.
  save_safetensors(tensors, os.path.join(directory, "model.safetensors"),
                   metadata={"format": "pt",
                             streaming.DIGEST_KEY: streaming.tensors_digest(tensors.items())})
  atomic_write_json(os.path.join(directory, "config.json"), hf_config, indent=2)


def import_hf_llama(*args, **kwargs):
  """Deprecated name of `import_hf_decoder` (it reads every decoder family)."""
  warnings.warn("import_hf_llama is deprecated: use specjax.import_hf_decoder",
                DeprecationWarning, stacklevel=2)
  return import_hf_decoder(*args, **kwargs)


def export_hf_llama(*args, **kwargs):
  """Deprecated name of `export_hf_decoder` (it writes every decoder family)."""
  warnings.warn("export_hf_llama is deprecated: use specjax.export_hf_decoder",
                DeprecationWarning, stacklevel=2)
  return export_hf_decoder(*args, **kwargs)
