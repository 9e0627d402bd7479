"""Choosing the (data, model) mesh a run uses: the fewest model-axis devices that fit."""

from __future__ import annotations

import functools
from typing import Any, Optional, Tuple, Union

from specjax._checks import check_int
from specjax.planning.memory import mesh_pair, check_fits, memory_plan

__all__ = ["choose_mesh", "MeshChoice"]

MeshChoice = Union[str, Tuple[int, int]]


def _divisors(n: int) -> Tuple[int, ...]:
  return tuple(d for d in range(1, n + 1) if n % d == 0)


def _data_axis(batch_size: int, devices: int) -> int:
  """The largest divisor of `batch_size` that is <= `devices` (a data axis that does not
  divide the batch replicates it and the caches, gaining no memory)."""
  return max(d for d in _divisors(batch_size) if d <= devices)


def choose_mesh(target_config: Any, draft_config: Any = None, *, num_devices: int,
                batch_size: int, cache_len: int, capacity_bytes: Optional[int],
                mesh: MeshChoice = "auto", draft_sharded: bool = False,
                activation_tokens: Optional[int] = None,
                prompt_len: Optional[int] = None,
                logit_tokens: Optional[int] = None) -> Tuple[int, int]:
  """The (data, model) axis sizes to run on.

  mesh="auto": the fewest model-axis devices that fit. Model axis sizes are the divisors of
  `num_devices`, smallest first (kernels the size does not divide are replicated, as the plan
  accounts); data is the largest divisor of `batch_size` at most `num_devices // model`
  (leftover devices unused); the first whose `memory_plan` fits `capacity_bytes` wins. Capacity
  unknown (CPU): model = 1. When even the largest model axis does not fit, a ValueError names
  that mesh and the shortfall.

  mesh=(data, model): validated (ints >= 1, data * model <= num_devices) and, with a known
  capacity, checked with `check_fits`.
  """
  num_devices = check_int("num_devices", num_devices, 1)
  batch_size = check_int("batch_size", batch_size, 1)
  if capacity_bytes is not None:
    capacity_bytes = check_int("capacity_bytes", capacity_bytes, 1)
  plan = functools.partial(memory_plan, target_config, draft_config, batch_size=batch_size,
                           cache_len=cache_len, draft_sharded=draft_sharded,
                           activation_tokens=activation_tokens, prompt_len=prompt_len,
                           logit_tokens=logit_tokens)
  if isinstance(mesh, str):
    if mesh != "auto":
      raise ValueError(f"mesh must be 'auto' or a (data, model) pair of ints >= 1, got {mesh!r}")
    if capacity_bytes is None:
      plan(mesh_shape=(1, 1))  # validates the configs and sizes
      return _data_axis(batch_size, num_devices), 1
    last = None
    for model in _divisors(num_devices):
      last = plan(mesh_shape=(_data_axis(batch_size, num_devices // model), model))
      if last.per_device_bytes <= capacity_bytes:
        return last.mesh_shape
    try:
      check_fits(last, capacity_bytes)
    except ValueError as e:
      raise ValueError(f"no mesh of {num_devices} device(s) fits; with the largest model "
                       f"axis, {e}") from None
    raise AssertionError("unreachable: the last plan did not fit")
  data, model = mesh_pair(mesh, "mesh")
  if data * model > num_devices:
    raise ValueError(f"mesh data={data} x model={model} needs {data * model} devices, "
                     f"{num_devices} are available")
  check_fits(plan(mesh_shape=(data, model)), capacity_bytes)
  return data, model
