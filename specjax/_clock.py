"""The one clock every specjax timing reads: `time.perf_counter`, or what `use_clock` installs.

Tests rig it, so a measurement's logic is tested exactly, whatever the machine's load.
`interleaved_rounds` is the one timer of calls compared with each other; `wall` the date a
result is stamped with."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable, Dict, Hashable, Iterator, List, Mapping, NamedTuple

import jax

__all__ = ["now", "use_clock", "wall", "interleaved_rounds", "Rounds"]

_CLOCKS = [time.perf_counter]


def now() -> float:
  """Seconds on the clock every specjax timing reads."""
  return _CLOCKS[-1]()


@contextlib.contextmanager
def use_clock(clock: Callable[[], float]) -> Iterator[None]:
  """Within the block, `now()` (and so every specjax timing) reads `clock`:

    class FakeClock:        # advanced by the code under test, never by load
      t = 0.0
      def __call__(self): return self.t
    with use_clock(fake): ...
  """
  if not callable(clock):
    raise TypeError(f"clock must be a callable returning seconds, got {clock!r}")
  _CLOCKS.append(clock)
  try:
    yield
  finally:
    _CLOCKS.pop()


def wall() -> float:
  """Seconds since the epoch: when a stored result was measured (durations read `now`)."""
  return time.time()


class Rounds(NamedTuple):
  """Per key: `seconds` of its call in each round (in round order) and `last`, what its last
  call returned."""

  seconds: Dict[Hashable, List[float]]
  last: Dict[Hashable, Any]

  def median(self, key: Hashable) -> float:
    """The median over the rounds of `key`'s seconds."""
    return statistics.median(self.seconds[key])


def interleaved_rounds(calls: Mapping[Hashable, Callable[[], Any]], rounds: int, *,
                       reverse: bool = False) -> Rounds:
  """Times every call of `calls` once per round, `rounds` rounds, on `now()`, outputs blocked on.

  Calls compared with each other are timed moments apart, so a slow spell hits them all, and no
  call always runs first or right after the same other one: round r runs them in `calls`' order
  rotated left by r; with `reverse`, in that order on even rounds and reversed on odd ones (two
  calls timed for a paired difference stay adjacent). Compilation is the caller's to exclude
  (call each once first). Only each call's last output is kept (outputs may hold caches)."""
  if not isinstance(calls, Mapping) or not calls:
    raise ValueError(f"calls must be a non-empty mapping {{key: call}}, got {calls!r}")
  if not all(callable(c) for c in calls.values()):
    raise TypeError(f"calls must map keys to callables taking no argument, got {calls!r}")
  if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
    raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
  keys = list(calls)
  out = Rounds({k: [] for k in keys}, {})
  for r in range(rounds):
    k0 = r % len(keys)
    order = (keys[::-1] if r % 2 else keys) if reverse else keys[k0:] + keys[:k0]
    for key in order:
      t0 = now()
      out.last[key] = jax.block_until_ready(calls[key]())
      out.seconds[key].append(now() - t0)
  return out
