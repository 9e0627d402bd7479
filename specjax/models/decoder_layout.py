"""The packed decode layout of a decoder LM's parameters.

The standard tree (`specjax.models.decoder`) keeps one kernel per projection, as training,
checkpoints and the transformers export want them. A decode step at small batch is a chain of
matrix-vector products, which on XLA:CPU read a kernel faster the longer its contiguous rows
are, so the packed layout holds the same weights in fewer, wider kernels, per layer:

  qkv/kernel     [E, K, G + 2, D]  q heads of kv head j (G = H / K of them), then k, then v
  qkv/bias       [K, G + 2, D]     the q / k / v biases in the same order (with `qkv_bias`)
  gate_up/kernel [E, F, 2]         gate and up of each hidden unit side by side
  down_t/kernel  [E, F]            down, transposed (rows of F, not of E)

Everything else (norms, `o`, embeddings, `lm_head`) is unchanged. Both layouts give the same
values up to float rounding; `DecoderLM` takes either. Shard after packing:
`specjax.parallel.sharding` splits `qkv` over kv heads, `gate_up` and `down_t` over hidden units.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

__all__ = ["is_packed", "pack_params", "unpack_params"]

_STANDARD = ("q", "k", "v", "gate", "up", "down")
_PACKED = ("qkv", "gate_up", "down_t")


def _xp(x):
  """numpy for host arrays (packing before placement never holds two device copies), else jnp."""
  return np if isinstance(x, np.ndarray) else jnp


def _transpose(x_2d):
  """A 2-D kernel transposed, stored row-major (a copy)."""
  return np.ascontiguousarray(x_2d.T) if isinstance(x_2d, np.ndarray) else jnp.transpose(x_2d)


def _layers(params: Mapping[str, Any], config) -> list:
  if not isinstance(params, Mapping):
    raise TypeError(f"params must be a mapping (a params tree), got {type(params).__name__}")
  names = [f"layer_{i}" for i in range(config.num_layers)]
  missing = [n for n in names if n not in params]
  if missing:
    raise ValueError(f"params lack {missing[:3]}: not a tree of this config "
                     f"({config.num_layers} layers)")
  return names


def is_packed(params: Mapping[str, Any]) -> bool:
  """Whether `params` (a decoder LM's tree) is in the packed decode layout."""
  layer = params.get("layer_0", {}) if isinstance(params, Mapping) else {}
  return "qkv" in layer


def _convert(params: Mapping[str, Any], config, to_packed: bool, convert_layer) -> dict:
  """Checks the tree's layout, then `convert_layer(layer, e, h, k, d, g)` on a copy of every
  layer's dict (it pops the old kernels and sets the new)."""
  names = _layers(params, config)
  if is_packed(params) == to_packed:
    raise ValueError("params are already in the packed decode layout" if to_packed
                     else "params are not in the packed decode layout")
  kind, needed = ("standard", _STANDARD) if to_packed else ("packed", _PACKED)
  e, h, k, d = config.d_model, config.num_heads, config.num_kv_heads, config.head_dim
  out = dict(params)
  for name in names:
    layer = dict(params[name])
    absent = [n for n in needed if n not in layer]
    if absent:
      raise ValueError(f"{name} lacks the {kind} kernels {absent}")
    convert_layer(layer, e, h, k, d, h // k)
    out[name] = layer
  return out


def _pack_layer(layer, e, h, k, d, g) -> None:
  q = layer["q"]["kernel"]
  xp = _xp(q)
  q = q.reshape(e, k, g, d)
  qd, kd, vd = layer.pop("q"), layer.pop("k"), layer.pop("v")
  kk, v = kd["kernel"], vd["kernel"]
  layer["qkv"] = {"kernel": xp.concatenate([q, kk[:, :, None], v[:, :, None]], axis=2)}
  if "bias" in qd:
    layer["qkv"]["bias"] = xp.concatenate(
        [qd["bias"].reshape(k, g, d), kd["bias"][:, None], vd["bias"][:, None]], axis=1)
  layer["gate_up"] = {"kernel": xp.stack([layer.pop("gate")["kernel"],
                                          layer.pop("up")["kernel"]], axis=-1)}
  layer["down_t"] = {"kernel": _transpose(layer.pop("down")["kernel"])}


def _unpack_layer(layer, e, h, k, d, g) -> None:
  packed = layer.pop("qkv")
  qkv = packed["kernel"]
  layer["q"] = {"kernel": qkv[:, :, :g].reshape(e, h, d)}
  layer["k"] = {"kernel": qkv[:, :, g]}
  layer["v"] = {"kernel": qkv[:, :, g + 1]}
  if "bias" in packed:
    b = packed["bias"]
    layer["q"]["bias"] = b[:, :g].reshape(h, d)
    layer["k"]["bias"], layer["v"]["bias"] = b[:, g], b[:, g + 1]
  gu = layer.pop("gate_up")["kernel"]
  layer["gate"], layer["up"] = {"kernel": gu[..., 0]}, {"kernel": gu[..., 1]}
  layer["down"] = {"kernel": _transpose(layer.pop("down_t")["kernel"])}


def pack_params(params: Mapping[str, Any], config) -> dict:
  """The standard tree → the packed decode layout (new arrays; `params` unmodified). Host
  (numpy) leaves give host arrays: pack a restored checkpoint before placing it, so the device
  never holds both layouts. Raises `ValueError` on a tree that is already packed."""
  return _convert(params, config, True, _pack_layer)


def unpack_params(params: Mapping[str, Any], config) -> dict:
  """The packed decode layout → the standard tree (exact: the same numbers).
  Raises `ValueError` on a tree that is not packed."""
  return _convert(params, config, False, _unpack_layer)
