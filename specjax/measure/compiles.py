"""Counting what JAX traces: proof that a timed region compiled nothing.

`TraceCounter` listens to `jax.monitoring`: every function JAX traces for compilation reports a
"/jax/core/compile/jaxpr_trace_duration" event carrying its name. A second call with inputs of
the same shapes must trace neither decode loop (`DECODE_LOOPS`).

  with TraceCounter() as traces:
    specjax.speculative_generate(...)
  assert traces.decode_loops == 0
"""

from __future__ import annotations

import collections
from typing import Any

from jax import monitoring

__all__ = ["TraceCounter", "DECODE_LOOPS"]

_TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
DECODE_LOOPS = ("autoregressive_loop", "speculative_loop")


class TraceCounter:
  """Counts traces by function name (`counts`, a Counter) while active (`with`, or start / stop)."""

  def __init__(self):
    self.counts: collections.Counter = collections.Counter()
    self._active = False

  def _listen(self, event: str, duration_secs: float, **kwargs: Any) -> None:
    del duration_secs
    if self._active and event == _TRACE_EVENT:
      self.counts[kwargs.get("fun_name", "?")] += 1

  def start(self) -> "TraceCounter":
    if not self._active:
      self._active = True
      monitoring.register_event_duration_secs_listener(self._listen)
    return self

  def stop(self) -> None:
    if self._active:
      self._active = False
      monitoring.unregister_event_duration_listener(self._listen)

  def __enter__(self) -> "TraceCounter":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()

  @property
  def total(self) -> int:
    """Every trace counted."""
    return sum(self.counts.values())

  @property
  def decode_loops(self) -> int:
    """Traces of the decode loops (`DECODE_LOOPS`)."""
    return sum(self.counts[name] for name in DECODE_LOOPS)
