"""Per-machine record of the tuned decode path (`DecoderConfig.matvec_max_rows`).

`specjax.tune_matvec_rows` measures whether a call on a few tokens is faster here as one
matrix-vector product per token or as one matrix-matrix product, and stores its choice, keyed by
the CPU, the JAX version, the model's shape and its parameter layout. A decoder whose config
leaves `matvec_max_rows` at None uses the stored choice, else one matrix-matrix product per call
(0): the default that never loses badly.

The file is `matvec_rows.json` of the per-machine store (`specjax.machine_store`), {key: rows};
an unreadable file is ignored (logged) and rewritten by the next tuning.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from specjax import machine_store
from specjax.machine_store import lookup_entry, machine_id, store_entry

__all__ = ["cache_path", "machine_id", "shape_key", "lookup", "store", "lookup_entry",
           "store_entry"]

MATVEC_FILE = "matvec_rows.json"


def cache_path(filename: str = MATVEC_FILE) -> str:
  """Where tuned choices are stored (`machine_store.cache_path`; `matvec_rows.json` by default)."""
  return machine_store.cache_path(filename)


def shape_key(config: Any, packed: bool) -> str:
  """The model's shape and parameter layout, as a key."""
  fields = ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim",
            "mlp_dim", "tie_embeddings", "dtype", "param_dtype")
  shape = ",".join(f"{f}={getattr(config, f)}" for f in fields)
  return f"{shape} | {'packed' if packed else 'standard'}"


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
