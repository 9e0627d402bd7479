"""orbax save/restore of model parameters together with their config.

Layout of a saved model directory:

  <dir>/params/          orbax StandardCheckpointer tree of the params
  <dir>/config.json      {"class": "specjax.models.decoder.DecoderConfig", "fields": {...}}
  <dir>/integrity.json   every file's size under params/ and a digest of the values (`integrity`)

`restore_params(dir, expected_config)` checks the stored config against the expected one, the
files against their manifest and the restored values against their digest; every problem is a
`CheckpointError` naming the directory, what is wrong and what to do, never orbax's tensorstore
stack. A checkpoint of another size never loads silently; one without `integrity.json` loads
with an `UnverifiedCheckpointWarning` (`strict=True`: refused).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import warnings
from typing import Any, Mapping, Optional, Tuple

import jax
import numpy as np

from specjax.atomic_io import as_path, atomic_write_json
from specjax.checkpoints import config_checks, integrity
from specjax.checkpoints.integrity import CheckpointError, UnverifiedCheckpointWarning, first_line
from specjax.models import decoder, decoder_layout
from specjax.models.t5 import T5
from specjax.models.t5_config import T5Config

__all__ = ["save_params", "restore_params", "restore_model", "model_for_config", "config_to_dict",
           "config_from_dict", "CheckpointError", "UnverifiedCheckpointWarning", "read_config"]


def config_to_dict(config: Any) -> dict:
  """A frozen config dataclass → {"class": qualified name, "fields": {...}}."""
  if not dataclasses.is_dataclass(config) or isinstance(config, type):
    raise TypeError(f"config must be a config dataclass instance, got {type(config).__name__}")
  cls = type(config)
  return {"class": f"{cls.__module__}.{cls.__qualname__}", "fields": dataclasses.asdict(config)}


# Config classes that moved, by the name earlier versions stored.
_MOVED_CLASSES = {
    "specjax.drafters.medusa.MedusaConfig": "specjax.models.medusa_head.MedusaConfig",
    "specjax.drafters.eagle.EagleConfig": "specjax.models.eagle_head.EagleConfig",
}


def config_from_dict(d: dict) -> Any:
  """Inverse of `config_to_dict` (only config dataclasses of the specjax package).

  Raises:
    ValueError: `d` is not {"class": <qualified name>, "fields": {...}}, the class is not a
      specjax config dataclass (an unknown module or class is named, the import error is the
      `__cause__`), a field is unknown to it, or a value is out of its domain.
  """
  if not isinstance(d, Mapping):
    raise ValueError(f"a stored config must be a JSON object {{\"class\": ..., \"fields\": "
                     f"...}}, got {type(d).__name__}")
  qualname = d.get("class")
  if not isinstance(qualname, str) or not qualname:
    raise ValueError(f"a stored config must name its class (\"class\": \"specjax.models....\"), "
                     f"got {qualname!r}")
  qualname = _MOVED_CLASSES.get(qualname, qualname)
  module_name, _, cls_name = qualname.rpartition(".")
  if not module_name.startswith("specjax."):
    raise ValueError(f"refusing to build config class {qualname!r}: not a specjax config")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ValueError(f"config class {qualname!r} is unknown: there is no module {module_name} "
                     f"in this specjax ({first_line(e)}); saved by another version?") from e
  cls = getattr(module, cls_name, None)
  if cls is None:
    raise ValueError(f"config class {qualname!r} is unknown: {module_name} has no {cls_name}; "
                     "saved by another version?")
  if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
    raise ValueError(f"refusing to build {qualname!r}: not a config dataclass")
  stored = d.get("fields")
  if not isinstance(stored, Mapping):
    raise ValueError(f"a stored config must hold its \"fields\" as an object, got {stored!r:.80}")
  fields = {f.name for f in dataclasses.fields(cls)}
  removed = set(getattr(cls, "REMOVED_FIELDS", ()))  # compute-only fields of earlier versions
  unknown = sorted(set(stored) - fields - removed)
  if unknown:
    raise ValueError(f"stored config has fields {unknown} unknown to {qualname}")
  config = cls(**{k: v for k, v in stored.items() if k not in removed})
  return config_checks.check_model_config(config)


_MISMATCH_REMEDY = ("Load it with the config it was saved with, or give the new model "
                    "another directory.")


def _check_same(expected: Any, stored: Any, directory: str) -> None:
  if type(expected) is not type(stored):
    raise CheckpointError(directory, "config_mismatch",
                          f"it holds a {type(stored).__name__}, expected a "
                          f"{type(expected).__name__}", _MISMATCH_REMEDY)
  for f in dataclasses.fields(expected):
    if f.metadata.get("compute_only"):  # e.g. DecoderConfig.matvec_max_rows
      continue
    a, b = getattr(expected, f.name), getattr(stored, f.name)
    if a != b:
      raise CheckpointError(directory, "config_mismatch",
                            f"checkpoint config field {f.name!r} is {b!r}, expected {a!r}",
                            _MISMATCH_REMEDY)


def read_config(directory: str) -> Any:
  """The config stored in a model directory (CheckpointError: config.json absent or unreadable;
  FileNotFoundError: no such directory)."""
  path = as_path(directory)  # local or gs://...
  directory = str(path)
  if not path.is_dir():
    raise FileNotFoundError(f"{directory} does not exist (no specjax model checkpoint there)")
  path = path / "config.json"
  if not path.exists():
    raise CheckpointError(directory, "missing", "config.json is missing (an interrupted save, "
                          "or not a specjax model checkpoint)")
  try:
    stored = json.loads(path.read_text(encoding="utf-8"))
    return config_from_dict(stored)
  except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
    raise CheckpointError(directory, "unreadable",
                          f"config.json cannot be read ({path}: {first_line(e)})") from e


def save_params(directory: str, params: Any, config: Any, *, force: bool = True) -> None:
  """Saves `params` with orbax and `config` as JSON under `directory`, in the standard layout (a
  packed decoder tree, `DecoderLM.pack_params`, is unpacked first)."""
  if isinstance(config, decoder.DecoderConfig) and decoder_layout.is_packed(params):
    params = decoder_layout.unpack_params(params, config)
  import orbax.checkpoint as ocp
  path = as_path(directory)  # local or gs://... (orbax takes epath paths)
  directory = str(path)
  path.mkdir(parents=True, exist_ok=True)
  params = jax.tree_util.tree_map(np.asarray, params)
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(path / "params", params, force=force)
  # The manifest, then config.json: a directory with a config.json is complete.
  integrity.write_manifest(directory, integrity.params_digest(params))
  atomic_write_json(os.path.join(directory, "config.json"), config_to_dict(config), indent=2)


def restore_params(directory: str, expected_config: Optional[Any] = None, *,
                   verify: bool = True, strict: bool = False) -> Tuple[Any, Any]:
  """Restores `(params, config)`.

  With `expected_config`, a differing stored config is a CheckpointError ("config_mismatch")
  naming the first differing field. Files missing or of another size than saved, an unreadable
  config.json, orbax read errors and (with `verify`) values differing from the stored digest are
  CheckpointErrors too; a missing directory is a FileNotFoundError.

  A directory without `integrity.json` (saved before manifests, or copied without it), or whose
  manifest holds no digest, cannot be verified: a damaged byte would load as a wrong value. It
  loads with an `UnverifiedCheckpointWarning` (with `verify`), or, with `strict=True`, is
  refused: a CheckpointError ("missing") naming the file. Saving it again with `save_params`
  writes the manifest."""
  import orbax.checkpoint as ocp
  directory = str(as_path(directory))  # local (absolute) or gs://...
  config = read_config(directory)
  if expected_config is not None:
    _check_same(expected_config, config, directory)
    # Compute-only fields (how calls run, not what the weights are) follow the caller.
    config = dataclasses.replace(config, **{
        f.name: getattr(expected_config, f.name) for f in dataclasses.fields(config)
        if f.metadata.get("compute_only")})
  manifest = integrity.read_manifest(directory)
  if manifest is not None:
    integrity.check_files(directory, manifest)
  if manifest is None or not manifest.get("params_sha256"):
    problem = (f"{integrity.MANIFEST} is missing" if manifest is None else
               f"{integrity.MANIFEST} holds no params_sha256 digest")
    problem += ", so its values cannot be verified (a damaged byte would load as a wrong value)"
    if strict:
      raise CheckpointError(directory, "missing", problem,
                            "Load it with strict=False to accept it unverified, or save it "
                            "again with save_params (which writes the manifest).")
    if verify:
      warnings.warn(f"checkpoint {directory}: {problem}; loading it unverified (strict=True "
                    "refuses it; save_params writes the manifest)", UnverifiedCheckpointWarning,
                    stacklevel=2)
  params_dir = as_path(directory) / "params"
  if not params_dir.is_dir():
    raise CheckpointError(directory, "missing", "params/ is missing")
  try:
    with integrity.quiet_asyncio_errors(), ocp.StandardCheckpointer() as ckpt:
      params = ckpt.restore(params_dir)
  except Exception as e:  # pylint: disable=broad-except  (orbax / tensorstore errors)
    kind = "truncated" if "OUT_OF_RANGE" in str(e) or "byte range" in str(e) else "unreadable"
    raise CheckpointError(directory, kind, f"orbax cannot read params/ ({first_line(e)})") from None
  if verify and manifest is not None and manifest.get("params_sha256"):
    if integrity.params_digest(params) != manifest["params_sha256"]:
      raise CheckpointError(directory, "corrupt",
                            "the restored values differ from the digest stored at save time")
  return params, config


def model_for_config(config: Any) -> Any:
  """The model a stored config describes: a `T5` for a `T5Config`, else a `DecoderLM`."""
  return T5(config) if isinstance(config, T5Config) else decoder.DecoderLM(config)


def restore_model(directory: str, packed: bool = False, *,
                  strict: bool = False) -> Tuple[Any, Any]:
  """`(model, params)` from a saved model directory: a `DecoderLM` or a `T5` by the stored
  config, params on the default device; `packed`: a decoder's params in the packed decode
  layout (`DecoderLM.pack_params`), packed on the host before placement; `strict`: as in
  `restore_params` (refuse a directory without an integrity digest)."""
  params, config = restore_params(directory, strict=strict)
  model = model_for_config(config)
  if packed and isinstance(model, decoder.DecoderLM):
    params = model.pack_params(jax.tree_util.tree_map(np.asarray, params))
  return model, jax.tree_util.tree_map(jax.numpy.asarray, params)
