"""Rotary position frequencies, with the context-extension rules of today's checkpoints.

A rotary embedding is fixed by its inverse frequencies (`[D / 2]`) and a factor on cos / sin.
The rules that set them from a config do not depend on the sequence, so the frequencies are
computed once, on the host, as transformers computes them:

* ``default``: ``theta ** -(2i / D)``.
* ``linear`` (position interpolation): the default divided by ``factor``.
* ``llama3`` (Llama 3.1 / 3.2 / 3.3): wavelengths longer than
  ``original_max_position_embeddings / low_freq_factor`` divided by ``factor``, shorter than
  ``... / high_freq_factor`` kept, smoothly interpolated in between.
* ``yarn``: a ramp between interpolated and extrapolated frequencies over the correction range
  set by ``beta_fast`` / ``beta_slow``, and an attention factor on cos / sin
  (``0.1 ln(factor) + 1`` unless given).

``dynamic`` (NTK) and ``longrope`` change the frequencies with the current sequence length, so
keys cached at one length would be rotated differently from the queries at another; they are
refused by name, as is any other rule. A config carries its rule as a canonical tuple of
``(key, value)`` pairs (`canonical_scaling`): hashable, JSON-friendly, and equal however the
checkpoint spelled it.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Tuple

import numpy as np

__all__ = ["SUPPORTED_ROPE_TYPES", "REFUSED_ROPE_TYPES", "canonical_scaling", "scaling_dict",
           "rope_frequencies"]

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
REFUSED_ROPE_TYPES = ("dynamic", "longrope")

# Keys each rule reads (beyond rope_type); others are dropped from the canonical form (e.g.
# the rope_theta transformers 5 stores there).
_KEYS = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
             "beta_slow", "mscale", "mscale_all_dim", "truncate"),
}
_REQUIRED = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
}

Scaling = Optional[Tuple[Tuple[str, Any], ...]]


def canonical_scaling(scaling: Any) -> Scaling:
  """A rope-scaling rule (a transformers config's dict, or a specjax config's (key, value)
  pairs) → the canonical sorted tuple of pairs, or None for plain rotary positions.

  Raises ValueError naming a refused or unknown rule, or the key a rule needs and lacks.
  """
  if scaling is None:
    return None
  if isinstance(scaling, Mapping):
    items = dict(scaling)
  else:
    try:
      items = {str(k): v for k, v in scaling}
    except (TypeError, ValueError):
      raise TypeError(f"rope_scaling must be a dict or (key, value) pairs, got {scaling!r}") from None
  rope_type = items.get("rope_type", items.get("type", "default"))
  if rope_type in REFUSED_ROPE_TYPES:
    raise ValueError(
        f"unsupported rotary scaling rope_type {rope_type!r}: its frequencies change with the "
        f"current sequence length, which a static KV cache cannot follow; supported: "
        f"{', '.join(SUPPORTED_ROPE_TYPES)}")
  if rope_type not in SUPPORTED_ROPE_TYPES:
    raise ValueError(f"unsupported rotary scaling rope_type {rope_type!r}; supported: "
                     f"{', '.join(SUPPORTED_ROPE_TYPES)}")
  partial = items.get("partial_rotary_factor", 1.0)
  if partial not in (None, 1, 1.0):
    raise ValueError(f"unsupported rope partial_rotary_factor={partial!r}: specjax rotates "
                     "the full head dimension")
  if rope_type == "default":
    return None
  missing = [k for k in _REQUIRED[rope_type] if items.get(k) is None]
  if missing:
    raise ValueError(f"rope_type {rope_type!r} needs {', '.join(missing)}; got {items!r}")
  out = {"rope_type": rope_type}
  for key in _KEYS[rope_type]:
    if items.get(key) is not None:
      value = items[key]
      out[key] = bool(value) if key == "truncate" else (
          int(value) if key == "original_max_position_embeddings" else float(value))
  return tuple(sorted(out.items()))


def scaling_dict(scaling: Scaling) -> Optional[dict]:
  """The canonical tuple back to a dict (None stays None)."""
  return None if scaling is None else dict(scaling)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
  return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_frequencies(head_dim: int, theta: float, scaling: Scaling = None
                     ) -> Tuple[np.ndarray, float]:
  """`(inv_freq [head_dim / 2] float32, attention_factor)` for a rule."""
  d = int(head_dim)
  exponents = np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / np.float32(d)
  # float32 as transformers: base ** (arange / dim) in float, then 1 / that.
  pos_freqs = np.power(np.float32(theta), exponents, dtype=np.float32)
  inv_freq = (np.float32(1.0) / pos_freqs).astype(np.float32)
  rule = scaling_dict(canonical_scaling(scaling))
  if rule is None:
    return inv_freq, 1.0
  kind = rule["rope_type"]
  if kind == "linear":
    return (inv_freq / np.float32(rule["factor"])).astype(np.float32), 1.0
  if kind == "llama3":
    factor = np.float32(rule["factor"])
    low, high = rule["low_freq_factor"], rule["high_freq_factor"]
    old_len = rule["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = (np.float32(2 * math.pi) / inv_freq).astype(np.float32)
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq).astype(np.float32)
    smooth = ((old_len / wavelen - low) / (high - low)).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / factor + smooth * scaled).astype(np.float32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32), 1.0
  # yarn
  factor = rule["factor"]
  attention_factor = rule.get("attention_factor")
  if attention_factor is None:
    mscale, mscale_all = rule.get("mscale"), rule.get("mscale_all_dim")
    if mscale and mscale_all:
      attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
    else:
      attention_factor = _yarn_mscale(factor)
  beta_fast = rule.get("beta_fast") or 32.0
  beta_slow = rule.get("beta_slow") or 1.0
  old_len = rule["original_max_position_embeddings"]

  def correction_dim(rotations):
    return (d * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(theta))

  low, high = correction_dim(beta_fast), correction_dim(beta_slow)
  if rule.get("truncate", True):
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, d - 1)
  if low == high:
    high += 0.001
  ramp = np.clip((np.arange(d // 2, dtype=np.float32) - low) / (high - low), 0, 1)
  extrapolation = (1 - ramp).astype(np.float32)
  interpolated = (np.float32(1.0) / (np.float32(factor) * pos_freqs)).astype(np.float32)
  mixed = interpolated * (1 - extrapolation) + inv_freq * extrapolation
  return mixed.astype(np.float32), float(attention_factor)
