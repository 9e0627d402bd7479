"""orbax save/restore of model parameters together with their config.

Layout of a saved model directory:

  <dir>/params/   orbax StandardCheckpointer tree of the params
  <dir>/config.json  {"class": "specjax.models.decoder.DecoderConfig", "fields": {...}}

`restore_params(dir, expected_config)` checks the stored config against the
one the caller expects and raises a ValueError naming the first differing
field (a checkpoint of another size never loads silently).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any, Optional, Tuple

import jax
import numpy as np

from specjax.checkpoints.hf_common import read_json, write_json

__all__ = ["save_params", "restore_params", "config_to_dict", "config_from_dict"]


def config_to_dict(config: Any) -> dict:
  """A frozen config dataclass → {"class": qualified name, "fields": {...}}."""
  if not dataclasses.is_dataclass(config) or isinstance(config, type):
    raise TypeError(f"config must be a config dataclass instance, got {type(config).__name__}")
  cls = type(config)
  return {"class": f"{cls.__module__}.{cls.__qualname__}", "fields": dataclasses.asdict(config)}


def config_from_dict(d: dict) -> Any:
  """Inverse of `config_to_dict` (only classes from the specjax package)."""
  qualname = d.get("class", "")
  module_name, _, cls_name = qualname.rpartition(".")
  if not module_name.startswith("specjax."):
    raise ValueError(f"refusing to build config class {qualname!r}: not a specjax config")
  cls = getattr(importlib.import_module(module_name), cls_name)
  fields = {f.name for f in dataclasses.fields(cls)}
  removed = set(getattr(cls, "REMOVED_FIELDS", ()))  # compute-only fields of earlier versions
  unknown = sorted(set(d["fields"]) - fields - removed)
  if unknown:
    raise ValueError(f"stored config has fields {unknown} unknown to {qualname}")
  return cls(**{k: v for k, v in d["fields"].items() if k not in removed})


def _check_same(expected: Any, stored: Any) -> None:
  if type(expected) is not type(stored):
    raise ValueError(f"checkpoint holds a {type(stored).__name__}, expected a "
                     f"{type(expected).__name__}")
  for f in dataclasses.fields(expected):
    if f.metadata.get("compute_only"):  # e.g. DecoderConfig.matvec_max_rows
      continue
    a, b = getattr(expected, f.name), getattr(stored, f.name)
    if a != b:
      raise ValueError(f"checkpoint config field {f.name!r} is {b!r}, expected {a!r}")


def save_params(directory: str, params: Any, config: Any, *, force: bool = True) -> None:
  """Saves `params` with orbax and `config` as JSON under `directory`.
  Checkpoints hold the standard layout: a decoder tree in the packed decode
  layout (`DecoderLM.pack_params`) is unpacked first."""
  from specjax.models import decoder, decoder_layout
  if isinstance(config, decoder.DecoderConfig) and decoder_layout.is_packed(params):
    params = decoder_layout.unpack_params(params, config)
  import orbax.checkpoint as ocp
  directory = os.path.abspath(os.fspath(directory))
  os.makedirs(directory, exist_ok=True)
  params = jax.tree_util.tree_map(np.asarray, params)
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(os.path.join(directory, "params"), params, force=force)
  write_json(config_to_dict(config), os.path.join(directory, "config.json"))


def restore_params(directory: str, expected_config: Optional[Any] = None) -> Tuple[Any, Any]:
  """Restores `(params, config)`; with `expected_config`, a mismatch is an error."""
  import orbax.checkpoint as ocp
  directory = os.path.abspath(os.fspath(directory))
  config_path = os.path.join(directory, "config.json")
  if not os.path.exists(config_path):
    raise FileNotFoundError(f"{directory} is not a specjax model checkpoint (no config.json)")
  config = config_from_dict(read_json(config_path))
  if expected_config is not None:
    _check_same(expected_config, config)
    # Compute-only fields (how calls run, not what the weights are) follow the caller.
    config = dataclasses.replace(config, **{
        f.name: getattr(expected_config, f.name) for f in dataclasses.fields(config)
        if f.metadata.get("compute_only")})
  with ocp.StandardCheckpointer() as ckpt:
    params = ckpt.restore(os.path.join(directory, "params"))
  return params, config
