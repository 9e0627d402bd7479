"""Per-machine record of the tuned decode path (`DecoderConfig.matvec_max_rows`).

`specjax.tune_matvec_rows` measures, on this machine, whether a call on a
few tokens is faster as one matrix-vector product per token or as one
matrix-matrix product, and stores its choice here, keyed by the CPU, the
JAX version, the model's shape and its parameter layout. A decoder whose
config leaves `matvec_max_rows` at None then uses the stored choice; with no
stored choice it uses one matrix-matrix product per call (0), the default
that never loses badly: measured per-token products cost 2-3x on one
development machine (32 MB L3) and won by at most 1.43x on another
(benchmarks/README.md).

The file is `$SPECJAX_CACHE_DIR/matvec_rows.json` (default
`~/.cache/specjax/`), a JSON object {key: rows}; an unreadable file is
ignored (logged) and rewritten by the next tuning.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
from typing import Any, Dict, Optional
from specjax import atomic_io

__all__ = ["cache_path", "machine_id", "shape_key", "lookup", "store", "lookup_entry",
           "store_entry"]

MATVEC_FILE = "matvec_rows.json"


def cache_path(filename: str = MATVEC_FILE) -> str:
  """Where tuned choices are stored (`$SPECJAX_CACHE_DIR` or ~/.cache/specjax):
  one JSON file per kind of choice (this module's: `matvec_rows.json`; the
  adaptive γ's cost tables: `gamma_costs.json`, `specjax.calibration`)."""
  root = os.environ.get("SPECJAX_CACHE_DIR") or os.path.join(
      os.path.expanduser("~"), ".cache", "specjax")
  return os.path.join(root, filename)


@functools.lru_cache(maxsize=1)
def machine_id() -> str:
  """The CPU model, its core count and the JAX version: what the choice
  depends on besides the model."""
  import jax  # pylint: disable=g-import-not-at-top
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  return f"{cpu} x{os.cpu_count()} | jax {jax.__version__}"


def shape_key(config: Any, packed: bool) -> str:
  """The model's shape and parameter layout, as a key."""
  fields = ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim",
            "mlp_dim", "tie_embeddings", "dtype", "param_dtype")
  shape = ",".join(f"{f}={getattr(config, f)}" for f in fields)
  return f"{shape} | {'packed' if packed else 'standard'}"


def _read(path: str) -> Dict[str, Any]:
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
    if not isinstance(data, dict):
      raise ValueError("not a JSON object")
    return {str(k): v for k, v in data.items()}
  except (OSError, ValueError, TypeError) as e:
    logging.warning("%s is unreadable (%s): its tuned choices are ignored (the next tuning "
                    "rewrites it)", path, e)
    return {}


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, mtime: float) -> Dict[str, Any]:
  del mtime  # Part of the cache key: a rewritten file is read again.
  return _read(path)


def lookup_entry(filename: str, key: str) -> Any:
  """The value stored under `key` (prefixed with this machine's id) in
  `filename` of the cache directory, or None."""
  path = cache_path(filename)
  try:
    mtime = os.path.getmtime(path)
  except OSError:
    return None
  return _read_cached(path, mtime).get(f"{machine_id()} | {key}")


def store_entry(filename: str, key: str, value: Any) -> str:
  """Records a JSON-able `value` under `key` for this machine (atomically);
  returns the path."""
  path = cache_path(filename)
  data = _read(path)
  data[f"{machine_id()} | {key}"] = value
  atomic_io.atomic_write_json(path, data)
  return path


def lookup(config: Any, packed: bool) -> Optional[int]:
  """The stored choice for this machine and model, or None."""
  rows = lookup_entry(MATVEC_FILE, shape_key(config, packed))
  try:
    return None if rows is None else int(rows)
  except (TypeError, ValueError):
    logging.warning("%s holds %r for this model, not a row count: ignored",
                    cache_path(), rows)
    return None


def store(config: Any, packed: bool, rows: int) -> str:
  """Records `rows` for this machine and model (atomically); returns the path."""
  return store_entry(MATVEC_FILE, shape_key(config, packed), int(rows))
