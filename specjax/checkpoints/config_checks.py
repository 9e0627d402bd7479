"""Config values checked when a checkpoint is loaded: what the models would misread is refused here,
by field, value and allowed range.

A model config whose numbers are out of their domain does not fail where it is read: a
`rope_theta` of 0 or -1e4 or an `rms_norm_eps` of NaN gives NaN logits on the first call, which
the sampling checks then report as a broken or overflowed checkpoint. The loaders check each
value as they read it instead:

* `hf_field` reads one field of a transformers `config.json` dict (an int >= 1, a finite real
  > 0, a bool ...), raising a ValueError `config <field> must be <allowed>, got <value>`;
* `check_model_config(config, where)` checks the real-valued fields of a specjax config
  dataclass (`rope_theta`, `norm_eps`, ...; `DecoderConfig` and `T5Config` refuse them on
  construction too, with the same rule) again, naming `where` (the file or directory it came
  from).
"""

from __future__ import annotations

import numbers
from typing import Any, Mapping, Optional

import numpy as np

from specjax._checks import check_real

__all__ = ["check_architectures",
           "REQUIRED", "hf_int", "hf_positive_real", "hf_bool", "positive_real",
           "check_model_config", "with_source"]


class _Required:
  def __repr__(self) -> str:
    return "REQUIRED"


# The default of a field that must be present.
REQUIRED = _Required()

# Real-valued config fields that must be finite and > 0, by name, in any specjax config class.
POSITIVE_REAL_FIELDS = ("rope_theta", "norm_eps", "layer_norm_epsilon")


def _given(hf: Mapping[str, Any], key: str, default: Any) -> bool:
  """Whether field `key` holds a value (not absent, not null); absent with a REQUIRED default is
  a ValueError."""
  if hf.get(key) is not None:
    return True
  if default is REQUIRED:
    raise ValueError(f"config lacks {key} (required)")
  return False


def hf_int(hf: Mapping[str, Any], key: str, default: Any = REQUIRED, minimum: int = 1) -> Any:
  """Field `key` of a config dict as an int >= `minimum` (`default` when absent or null; REQUIRED:
  absent is an error). Floats (even 4096.0), bools and strings are refused."""
  if not _given(hf, key, default):
    return default
  value = hf[key]
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
    raise ValueError(f"config {key} must be an int >= {minimum}, got {value!r}")
  return int(value)


def positive_real(key: str, value: Any) -> float:
  """`value` as a finite float > 0 (bools and strings refused), a ValueError naming `key`: the
  rule of `specjax._checks.check_real` (which the config classes apply to their own fields), as
  a ValueError for a config file's values of the wrong type too."""
  try:
    return check_real(f"config {key}", value, 0.0, lo_open=True)
  except TypeError as e:
    raise ValueError(str(e)) from None


def hf_positive_real(hf: Mapping[str, Any], key: str, default: Any = REQUIRED) -> float:
  """Field `key` of a config dict as a finite float > 0 (`default` when absent or null)."""
  return positive_real(key, hf[key] if _given(hf, key, default) else default)


def hf_bool(hf: Mapping[str, Any], key: str, default: bool) -> bool:
  """Field `key` of a config dict as a bool (`default` when absent or null); "false" or 0 are
  refused, not read as truthy / falsy."""
  if not _given(hf, key, default):
    return default
  value = hf[key]
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"config {key} must be true or false, got {value!r}")
  return bool(value)


def check_model_config(config: Any, where: Optional[str] = None) -> Any:
  """`config` (a specjax config dataclass) when its `POSITIVE_REAL_FIELDS` are finite and > 0;
  else a ValueError naming the field, the value, what is allowed and `where`."""
  for key in POSITIVE_REAL_FIELDS:
    if hasattr(config, key):
      try:
        positive_real(key, getattr(config, key))
      except ValueError as e:
        raise ValueError(f"{where}: {e}" if where else str(e)) from None
  return config


def with_source(error: BaseException, source: str) -> BaseException:
  """A ValueError (TypeError for a TypeError) whose message starts with `source`, for
  `raise with_source(e, path) from e`."""
  cls = TypeError if isinstance(error, TypeError) else ValueError
  return cls(f"{source}: {error}")


def check_architectures(hf: Mapping[str, Any], allowed, importer: str) -> None:
  """`architectures` (when given) is a list of class names, each one of `allowed` (the classes
  `importer`, e.g. "decoder" or "T5", reads); ValueError naming the first other class."""
  names = hf.get("architectures")
  if names is None:
    return
  allowed = list(allowed)
  if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
    raise ValueError(f"config architectures must be a list of class names, got {names!r}")
  unknown = [n for n in names if n not in allowed]
  if unknown:
    raise ValueError(f"config architectures names {unknown[0]!r}, not a model class the "
                     f"{importer} importer reads; allowed: {', '.join(allowed)}")
