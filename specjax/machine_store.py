"""The per-machine store: choices and measurements that hold for this machine only
(`models.matvec_cache`, `calibration`'s cost tables).

One JSON file per kind of entry in `$SPECJAX_CACHE_DIR` (default `~/.cache/specjax/`), an
object {"<machine id> | <key>": value}: an entry from another CPU or JAX version is never read
back. Files are written atomically; an unreadable one is ignored (logged) and rewritten by the
next store.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
from typing import Any, Dict

from specjax import atomic_io

__all__ = ["cache_path", "machine_id", "lookup_entry", "store_entry"]


def cache_path(filename: str) -> str:
  """Where entries of `filename` are stored (`$SPECJAX_CACHE_DIR` or ~/.cache/specjax)."""
  root = os.environ.get("SPECJAX_CACHE_DIR") or os.path.join(
      os.path.expanduser("~"), ".cache", "specjax")
  return os.path.join(root, filename)


@functools.lru_cache(maxsize=1)
def machine_id() -> str:
  """The CPU model, its core count and the JAX version: what a stored choice also depends on."""
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
    logging.warning("%s is unreadable (%s): its entries are ignored (the next store rewrites "
                    "it)", path, e)
    return {}


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, mtime: float) -> Dict[str, Any]:
  del mtime  # Part of the cache key: a rewritten file is read again.
  return _read(path)


def lookup_entry(filename: str, key: str) -> Any:
  """The value stored under `key` for this machine in `filename` of the cache dir, or None."""
  path = cache_path(filename)
  try:
    mtime = os.path.getmtime(path)
  except OSError:
    return None
  return _read_cached(path, mtime).get(f"{machine_id()} | {key}")


def store_entry(filename: str, key: str, value: Any) -> str:
  """Records a JSON-able `value` under `key` for this machine (atomically); returns the path."""
  path = cache_path(filename)
  data = _read(path)
  data[f"{machine_id()} | {key}"] = value
  atomic_io.atomic_write_json(path, data)
  return path
