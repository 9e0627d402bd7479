"""How long compiled decoding programs live: the cache policy of a long-lived process.

Every distinct decoding program (one per decoder configuration and input shape) is compiled
once by `jax.jit` and kept for the next call of the same shape. On XLA:CPU a compiled program
holds hundreds of memory mappings and megabytes of host memory even for a tiny model, so a
notebook or sweep trying hundreds of shapes would pile them up until the process runs out of
mappings (`vm.max_map_count`) and crashes.

The policy: `specjax.generate`, `speculative_generate` and `prefill` keep at most
`max_compiled_programs()` decoding programs (default 64; `SPECJAX_MAX_COMPILED_PROGRAMS` or
`set_max_compiled_programs(n)` changes it, 0 = no limit). When a call leaves more compiled,
every compiled program of the process is released (`clear_compiled()`) and each shape compiles
again on its next call. jax.jit offers no per-entry eviction, so releasing all at once is the
bounded choice; programs in use stay valid (their outputs are already computed).
`clear_compiled()` is `jax.clear_caches()` plus returning freed host memory to the system
(glibc's `malloc_trim`, where there is one).
"""

from __future__ import annotations

import ctypes
import gc
import os
from typing import Callable, List

import jax

from specjax._checks import check_int, first_invalid_token
from specjax.generation import autoregressive_loop, run_prefill, speculative_loop

__all__ = ["clear_compiled", "compiled_programs", "max_compiled_programs",
           "set_max_compiled_programs", "register", "enforce_limit"]

_ENV = "SPECJAX_MAX_COMPILED_PROGRAMS"
_DEFAULT = 64
# The decoding loops, their prefill, and the token-id check of device prompts (one per shape).
_programs: List[Callable] = [run_prefill, autoregressive_loop, speculative_loop,
                            first_invalid_token]
_limit: List[int] = []  # set lazily from the environment


def register(fn: Callable) -> Callable:
  """Counts the compiled programs of jitted `fn` under the policy (a decorator)."""
  if not hasattr(fn, "_cache_size"):
    raise TypeError(f"fn must be a jax.jit-compiled function, got {fn!r}")
  if fn not in _programs:
    _programs.append(fn)
  return fn


def compiled_programs() -> int:
  """How many decoding programs are compiled and kept now."""
  return sum(fn._cache_size() for fn in _programs)  # pylint: disable=protected-access


def max_compiled_programs() -> int:
  """The limit (0: none)."""
  if not _limit:
    raw = os.environ.get(_ENV, str(_DEFAULT))
    try:
      value = int(raw)
    except ValueError:
      raise ValueError(f"{_ENV} must be an int >= 0, got {raw!r}") from None
    _limit.append(check_int(_ENV, value, 0))
  return _limit[0]


def set_max_compiled_programs(n: int) -> int:
  """Sets the limit (an int >= 0; 0: no limit); returns the previous one."""
  n = check_int("n", n, 0)
  previous = max_compiled_programs()
  _limit[0] = n
  return previous


def _trim_host_memory() -> None:
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):  # not glibc: the allocator keeps what it keeps
    pass


def clear_compiled() -> int:
  """Releases every compiled program of the process (any `jax.jit`'s) and returns freed host
  memory to the system. Returns how many decoding programs were released."""
  count = compiled_programs()
  jax.clear_caches()
  gc.collect()
  _trim_host_memory()
  return count


def enforce_limit() -> None:
  """Applies the policy after a call (see the module doc)."""
  limit = max_compiled_programs()
  if limit and compiled_programs() > limit:
    clear_compiled()
