"""transformers Llama-format checkpoints ↔ specjax `DecoderLM` params.

The specjax decoder (`specjax.models.decoder`) is architecturally a Llama:
pre-norm RMSNorm, rotary positions in the "rotate half" layout with the
frequencies duplicated over both halves (as `transformers`'
`LlamaRotaryEmbedding` / `rotate_half`), SwiGLU MLP, MHA or GQA where query
head h reads kv head h // (H // K) (as `repeat_kv`), no biases, scaling
head_dim ** -0.5. The q/k projections therefore need NO permutation (that
permutation exists only between Meta's original interleaved-rotary weights and
the transformers layout); tests/test_llama_hf.py checks logit parity.

Tensor mapping (torch `nn.Linear` weights are `[out, in]`; flax kernels are
`[in..., out...]`):

  model.embed_tokens.weight [V, E]                  → embed/embedding [V, E]
  model.layers.{i}.input_layernorm.weight [E]       → layer_{i}/attn_norm/scale
  model.layers.{i}.self_attn.q_proj.weight [H*D, E] → layer_{i}/q/kernel [E, H, D]
  model.layers.{i}.self_attn.k_proj.weight [K*D, E] → layer_{i}/k/kernel [E, K, D]
  model.layers.{i}.self_attn.v_proj.weight [K*D, E] → layer_{i}/v/kernel [E, K, D]
  model.layers.{i}.self_attn.o_proj.weight [E, H*D] → layer_{i}/o/kernel [H, D, E]
  model.layers.{i}.post_attention_layernorm.weight  → layer_{i}/mlp_norm/scale
  model.layers.{i}.mlp.gate_proj.weight [F, E]      → layer_{i}/gate/kernel [E, F]
  model.layers.{i}.mlp.up_proj.weight [F, E]        → layer_{i}/up/kernel [E, F]
  model.layers.{i}.mlp.down_proj.weight [E, F]      → layer_{i}/down/kernel [F, E]
  model.norm.weight [E]                             → final_norm/scale
  lm_head.weight [V, E]                             → lm_head/kernel [E, V]
      (untied only; with tied embeddings it is optional and, when present,
      must equal the embedding)

Known non-parameter buffers that some checkpoints carry (`IGNORED_BUFFERS`,
e.g. rotary `inv_freq`) are dropped; any other unknown tensor is an error.

Public API: `decoder_config_from_hf`, `hf_config_from_decoder`,
`import_hf_llama`, `export_hf_llama`, `hf_llama_shapes`, `IGNORED_BUFFERS`.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Mapping, Optional, Tuple

import jax.numpy as jnp
import numpy as np

from specjax.checkpoints.hf_common import (check_state_dict, load_state_dict, read_json,
                                           save_safetensors, write_json)
from specjax.models import decoder_layout
from specjax.models.decoder import DecoderConfig

__all__ = [
    "decoder_config_from_hf", "hf_config_from_decoder", "import_hf_llama", "export_hf_llama",
    "hf_llama_shapes", "IGNORED_BUFFERS",
]

# Non-parameter buffers found in some transformers Llama state dicts (older
# versions saved the rotary inverse frequencies, per layer or once). They are
# recomputed from the config, so they are dropped on import. Full-match regexes.
IGNORED_BUFFERS: Tuple[str, ...] = (
    r"model\.rotary_emb\.(inv_freq|original_inv_freq)",
    r"model\.layers\.\d+\.self_attn\.rotary_emb\.(inv_freq|original_inv_freq)",
)
_IGNORED_RE = re.compile("|".join(f"(?:{p})" for p in IGNORED_BUFFERS))

_SUPPORTED_ROPE_TYPES = (None, "default")
_SUPPORTED_ACTS = ("silu", "swish")  # transformers maps both to SiLU.


# --------------------------------------------------------------------------- config


def _rope_theta_from_hf(hf: Mapping[str, Any]) -> float:
  """rope_theta from a config dict of any transformers version; rejects scaling."""
  theta = hf.get("rope_theta")
  for key in ("rope_parameters", "rope_scaling"):
    rope = hf.get(key)
    if rope is None:
      continue
    if not isinstance(rope, Mapping):
      raise ValueError(f"config {key} must be a dict or null, got {rope!r}")
    rope_type = rope.get("rope_type", rope.get("type"))
    if rope_type not in _SUPPORTED_ROPE_TYPES:
      raise ValueError(
          f"unsupported rotary scaling in config {key}: rope_type {rope_type!r}; specjax "
          f"supports only plain rotary positions (rope_type 'default' or none)")
    partial = rope.get("partial_rotary_factor", 1.0)
    if partial not in (None, 1, 1.0):
      raise ValueError(f"unsupported config {key}.partial_rotary_factor={partial!r}; "
                       "specjax rotates the full head dimension")
    if rope.get("rope_theta") is not None:
      theta = rope["rope_theta"]
  return float(10000.0 if theta is None else theta)


def decoder_config_from_hf(hf_config: Mapping[str, Any], **overrides) -> DecoderConfig:
  """A `DecoderConfig` from a transformers `LlamaConfig` dict (its config.json).

  `overrides` replace fields of the result (e.g. `dtype="bfloat16"`). Llama
  features that specjax does not implement (biases, activations other than
  SiLU, rotary scaling) raise a ValueError naming the config key.
  """
  if not isinstance(hf_config, Mapping):
    raise TypeError(f"hf_config must be a dict (a config.json), got {type(hf_config).__name__}")
  hf = dict(hf_config)
  model_type = hf.get("model_type", "llama")
  if model_type != "llama":
    raise ValueError(f"config model_type is {model_type!r}; import_hf_llama reads only "
                     "'llama' checkpoints")
  for key in ("attention_bias", "mlp_bias"):
    if hf.get(key):
      raise ValueError(f"unsupported config {key}=true: the specjax decoder has no biases")
  act = hf.get("hidden_act", "silu")
  if act not in _SUPPORTED_ACTS:
    raise ValueError(f"unsupported config hidden_act={act!r}: the specjax decoder's MLP "
                     "is SwiGLU (hidden_act 'silu')")
  for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "intermediate_size"):
    if hf.get(key) is None:
      raise ValueError(f"config lacks {key}")
  hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
  kv_heads = hf.get("num_key_value_heads")
  if kv_heads is None:
    kv_heads = heads
  head_dim = hf.get("head_dim")
  if head_dim is None:
    if not isinstance(hidden, int) or not isinstance(heads, int) or heads <= 0 or hidden % heads:
      raise ValueError(f"config has no head_dim and hidden_size ({hidden}) is not a multiple "
                       f"of num_attention_heads ({heads})")
    head_dim = hidden // heads
  fields = dict(
      vocab_size=hf["vocab_size"],
      d_model=hidden,
      num_layers=hf["num_hidden_layers"],
      num_heads=heads,
      num_kv_heads=kv_heads,
      head_dim=head_dim,
      mlp_dim=hf["intermediate_size"],
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      rope_theta=_rope_theta_from_hf(hf),
      norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
  )
  fields.update(overrides)
  return DecoderConfig(**fields)


def hf_config_from_decoder(config: DecoderConfig, *, max_position_embeddings: int = 4096,
                           bos_token_id: Optional[int] = None,
                           eos_token_id: Optional[int] = None,
                           pad_token_id: Optional[int] = None) -> Dict[str, Any]:
  """A transformers `LlamaConfig` dict (config.json) describing `config`.

  The weights are exported in float32. specjax has no maximum length and no
  tokenizer, so `max_position_embeddings` and the special token ids are
  arguments (the ids default to null: generation stops only at max length).
  """
  if not isinstance(config, DecoderConfig):
    raise TypeError(f"config must be a DecoderConfig, got {type(config).__name__}")
  if config.d_model % config.num_heads:
    raise ValueError(
        f"transformers' LlamaConfig requires d_model ({config.d_model}) to be a multiple of "
        f"num_heads ({config.num_heads}); this config cannot be exported")
  return {
      "architectures": ["LlamaForCausalLM"],
      "model_type": "llama",
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
      "rope_parameters": {"rope_type": "default", "rope_theta": float(config.rope_theta)},
      "tie_word_embeddings": bool(config.tie_embeddings),
      "attention_bias": False,
      "attention_dropout": 0.0,
      "mlp_bias": False,
      "pretraining_tp": 1,
      "use_cache": True,
      "bos_token_id": bos_token_id,
      "eos_token_id": eos_token_id,
      "pad_token_id": pad_token_id,
      "dtype": "float32",
  }


# --------------------------------------------------------------------------- tensors


def hf_llama_shapes(config: DecoderConfig) -> Dict[str, Tuple[int, ...]]:
  """The transformers tensor names and shapes of a model with this config
  (lm_head.weight included even when tied; it is then optional)."""
  c = config
  e, f, v = c.d_model, c.mlp_dim, c.vocab_size
  hd, kd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
  shapes: Dict[str, Tuple[int, ...]] = {"model.embed_tokens.weight": (v, e)}
  for i in range(c.num_layers):
    p = f"model.layers.{i}."
    shapes.update({
        p + "input_layernorm.weight": (e,),
        p + "self_attn.q_proj.weight": (hd, e),
        p + "self_attn.k_proj.weight": (kd, e),
        p + "self_attn.v_proj.weight": (kd, e),
        p + "self_attn.o_proj.weight": (e, hd),
        p + "post_attention_layernorm.weight": (e,),
        p + "mlp.gate_proj.weight": (f, e),
        p + "mlp.up_proj.weight": (f, e),
        p + "mlp.down_proj.weight": (e, f),
    })
  shapes["model.norm.weight"] = (e,)
  shapes["lm_head.weight"] = (v, e)
  return shapes


def _to_numpy_f32(x: Any) -> np.ndarray:
  if hasattr(x, "detach"):  # a torch tensor
    import torch
    return x.detach().to("cpu", torch.float32).numpy()
  return np.asarray(x, np.float32)


def _hf_to_params(t: Mapping[str, np.ndarray], c: DecoderConfig) -> Dict[str, Any]:
  e, h, k, d = c.d_model, c.num_heads, c.num_kv_heads, c.head_dim
  dtype = jnp.dtype(c.param_dtype)
  arr = lambda x: jnp.asarray(np.ascontiguousarray(x), dtype)
  params: Dict[str, Any] = {"embed": {"embedding": arr(t["model.embed_tokens.weight"])}}
  for i in range(c.num_layers):
    p = f"model.layers.{i}."
    params[f"layer_{i}"] = {
        "attn_norm": {"scale": arr(t[p + "input_layernorm.weight"])},
        "q": {"kernel": arr(t[p + "self_attn.q_proj.weight"].T.reshape(e, h, d))},
        "k": {"kernel": arr(t[p + "self_attn.k_proj.weight"].T.reshape(e, k, d))},
        "v": {"kernel": arr(t[p + "self_attn.v_proj.weight"].T.reshape(e, k, d))},
        "o": {"kernel": arr(t[p + "self_attn.o_proj.weight"].T.reshape(h, d, e))},
        "mlp_norm": {"scale": arr(t[p + "post_attention_layernorm.weight"])},
        "gate": {"kernel": arr(t[p + "mlp.gate_proj.weight"].T)},
        "up": {"kernel": arr(t[p + "mlp.up_proj.weight"].T)},
        "down": {"kernel": arr(t[p + "mlp.down_proj.weight"].T)},
    }
  params["final_norm"] = {"scale": arr(t["model.norm.weight"])}
  if not c.tie_embeddings:
    params["lm_head"] = {"kernel": arr(t["lm_head.weight"].T)}
  return params


def _param_shapes(c: DecoderConfig) -> Dict[Tuple[str, ...], Tuple[int, ...]]:
  """Path → shape of every leaf of the `DecoderLM` params tree."""
  e, f, v = c.d_model, c.mlp_dim, c.vocab_size
  h, k, d = c.num_heads, c.num_kv_heads, c.head_dim
  shapes: Dict[Tuple[str, ...], Tuple[int, ...]] = {("embed", "embedding"): (v, e)}
  for i in range(c.num_layers):
    l = f"layer_{i}"
    shapes.update({
        (l, "attn_norm", "scale"): (e,), (l, "q", "kernel"): (e, h, d),
        (l, "k", "kernel"): (e, k, d), (l, "v", "kernel"): (e, k, d),
        (l, "o", "kernel"): (h, d, e), (l, "mlp_norm", "scale"): (e,),
        (l, "gate", "kernel"): (e, f), (l, "up", "kernel"): (e, f),
        (l, "down", "kernel"): (f, e),
    })
  shapes[("final_norm", "scale")] = (e,)
  if not c.tie_embeddings:
    shapes[("lm_head", "kernel")] = (e, v)
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
  expected = {"/".join(k): s for k, s in _param_shapes(c).items()}
  try:
    check_state_dict(expected, {k: v if hasattr(v, "shape") else np.asarray(v)
                                for k, v in flat.items()})
  except ValueError as err:
    detail = str(err).split(" — ", 1)[-1]
    raise ValueError(f"params do not match the config — {detail}") from None
  p32 = {k: np.asarray(v, np.float32) for k, v in flat.items()}
  e, hd = c.d_model, c.num_heads * c.head_dim
  t_ = lambda name, rows: p32[name].reshape(rows, -1).T  # flax [in..., out...] → torch [out, in]
  t: Dict[str, np.ndarray] = {"model.embed_tokens.weight": p32["embed/embedding"]}
  for i in range(c.num_layers):
    p, l = f"model.layers.{i}.", f"layer_{i}/"
    t[p + "input_layernorm.weight"] = p32[l + "attn_norm/scale"]
    t[p + "self_attn.q_proj.weight"] = t_(l + "q/kernel", e)
    t[p + "self_attn.k_proj.weight"] = t_(l + "k/kernel", e)
    t[p + "self_attn.v_proj.weight"] = t_(l + "v/kernel", e)
    t[p + "self_attn.o_proj.weight"] = t_(l + "o/kernel", hd)
    t[p + "post_attention_layernorm.weight"] = p32[l + "mlp_norm/scale"]
    t[p + "mlp.gate_proj.weight"] = t_(l + "gate/kernel", e)
    t[p + "mlp.up_proj.weight"] = t_(l + "up/kernel", e)
    t[p + "mlp.down_proj.weight"] = t_(l + "down/kernel", c.mlp_dim)
  t["model.norm.weight"] = p32["final_norm/scale"]
  if not c.tie_embeddings:
    t["lm_head.weight"] = p32["lm_head/kernel"].T
  return {k: np.ascontiguousarray(v, np.float32) for k, v in t.items()}


def _config_path_for(path: str) -> str:
  folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
  return os.path.join(folder, "config.json")


def import_hf_llama(path_or_state_dict: Any, config: Optional[DecoderConfig] = None
                    ) -> Tuple[Dict[str, Any], DecoderConfig]:
  """transformers Llama-format weights → `(params, config)` for `DecoderLM`.

  Args:
    path_or_state_dict: a checkpoint directory, a `.safetensors` file, a
      sharded `model.safetensors.index.json`, a PyTorch `.bin`/`.pt` state
      dict (read with `torch.load(weights_only=True)`), or an in-memory
      mapping name → tensor (torch tensors or arrays, e.g. `model.state_dict()`).
    config: the `DecoderConfig`; None reads the `config.json` beside the
      weights (required for an in-memory state dict).

  Returns:
    params in `config.param_dtype`, and the config.

  Raises:
    ValueError naming every missing, unexpected or mis-shaped tensor, or the
    unsupported config feature.
  """
  if isinstance(path_or_state_dict, Mapping):
    tensors = {str(k): _to_numpy_f32(v) for k, v in path_or_state_dict.items()}
    if config is None:
      raise ValueError("config is required when importing an in-memory state dict "
                       "(there is no config.json to read)")
  else:
    path = os.fspath(path_or_state_dict)
    if config is None:
      config_path = _config_path_for(path)
      if not os.path.exists(config_path):
        raise FileNotFoundError(f"no config.json beside {path}; pass config= explicitly")
      config = decoder_config_from_hf(read_json(config_path))
    tensors = load_state_dict(path)
  if not isinstance(config, DecoderConfig):
    raise TypeError(f"config must be a DecoderConfig, got {type(config).__name__}")
  tensors = {k: v for k, v in tensors.items() if not _IGNORED_RE.fullmatch(k)}
  optional = ("lm_head.weight",) if config.tie_embeddings else ()
  check_state_dict(hf_llama_shapes(config), tensors, optional=optional)
  if config.tie_embeddings and "lm_head.weight" in tensors:
    if not np.array_equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]):
      raise ValueError("config ties the embeddings (tie_word_embeddings) but the checkpoint's "
                       "lm_head.weight differs from model.embed_tokens.weight")
  return _hf_to_params(tensors, config), config


def export_hf_llama(params: Mapping[str, Any], config: DecoderConfig, directory: str,
                    **hf_config_kwargs) -> None:
  """Writes `directory/model.safetensors` (float32) and `directory/config.json`
  so that `transformers.LlamaForCausalLM.from_pretrained(directory)` loads
  the model offline. `hf_config_kwargs` go to `hf_config_from_decoder`
  (max_position_embeddings, bos/eos/pad_token_id). With tied embeddings
  lm_head.weight is not written (transformers ties it on load). `params`
  may be in either layout (standard or packed, `DecoderLM.pack_params`)."""
  hf_config = hf_config_from_decoder(config, **hf_config_kwargs)
  tensors = _params_to_hf(params, config)
  optional = ("lm_head.weight",) if config.tie_embeddings else ()
  check_state_dict(hf_llama_shapes(config), tensors, optional=optional)
  directory = os.fspath(directory)
  os.makedirs(directory, exist_ok=True)
  save_safetensors(tensors, os.path.join(directory, "model.safetensors"),
                   metadata={"format": "pt"})
  write_json(hf_config, os.path.join(directory, "config.json"))
