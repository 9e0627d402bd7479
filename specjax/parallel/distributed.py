"""Processes: one per host (`jax.distributed`); process 0 writes results and logs."""

from __future__ import annotations

from typing import Any

import jax

from specjax._checks import check_bool

__all__ = ["initialize_distributed", "is_main_process"]


def _distributed_initialized() -> bool:
  is_initialized = getattr(jax.distributed, "is_initialized", None)
  if is_initialized is not None:
    return bool(is_initialized())
  from jax._src import distributed  # older jax: no public query
  return distributed.global_state.client is not None


def initialize_distributed(enabled: bool, **kwargs: Any) -> bool:
  """`jax.distributed.initialize(**kwargs)` when `enabled` (one process per host; TPU pods and
  SLURM need no arguments). Idempotent; returns whether this call initialised it."""
  enabled = check_bool("enabled (config.distributed)", enabled)
  if not enabled or _distributed_initialized():
    return False
  jax.distributed.initialize(**kwargs)
  return True


def is_main_process() -> bool:
  """Whether this process writes results and logs progress (process 0)."""
  return jax.process_index() == 0
