"""The one clock every specjax timing reads (`specjax.measure.timing`,
`specjax.calibration`): `time.perf_counter`, or what `use_clock` installs —
tests rig it, so the logic of a measurement is tested exactly and never
depends on how busy the machine is."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

__all__ = ["now", "use_clock"]

_CLOCKS = [time.perf_counter]


def now() -> float:
  """Seconds on the clock every specjax timing reads (`time.perf_counter`,
  or the clock `use_clock` installed)."""
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
