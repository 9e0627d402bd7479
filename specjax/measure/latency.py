"""Latency statistics of streamed tokens: TTFT, inter-token latency, call gaps.

A request arrives at `arrival` and its tokens are emitted at `token_times` (one per token).
Speculative decoding emits several tokens per target call, so they share a timestamp:

  * TTFT: first emission − arrival (median and P99 over requests);
  * ITL (inter-token latency): per token, time since the request's previous token (0 for tokens
    emitted together, counted: a client sees them at once); P50 / P99 / mean over all tokens;
  * call gap: time between successive distinct emission times (one per target call), the stall
    a reader of the stream sees (plain decoding: the ITL);
  * TPOT: per request (last − first emission) / (tokens − 1), averaged;
  * tokens/s: all tokens over the span from the first arrival to the last emission.

Percentiles are numpy's linear interpolation. `emission_times` turns a stream's events
(`specjax.streaming.stream`, or a transformers streamer timestamping its puts) into the
per-token times `latency_stats` takes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["LatencyStats", "latency_stats", "emission_times"]


@dataclasses.dataclass(frozen=True)
class LatencyStats:
  """Latencies of a set of requests (milliseconds; see the module doc).

  Attributes:
    ttft_ms, ttft_p99_ms: time to first token, median and P99 over requests.
    itl_p50_ms, itl_p99_ms, itl_mean_ms: inter-token latency over every token after each
      request's first (tokens emitted together: 0).
    call_gap_p50_ms, call_gap_p99_ms: time between a request's successive distinct emissions.
    tpot_ms: mean over requests of (last − first emission) / (tokens − 1) (one-token requests
      left out).
    tokens_per_s: all tokens / (last emission − first arrival).
    tokens_per_emission: mean tokens per distinct emission time.
    num_requests, num_tokens: counts.
  """

  ttft_ms: float
  ttft_p99_ms: float
  itl_p50_ms: float
  itl_p99_ms: float
  itl_mean_ms: float
  call_gap_p50_ms: float
  call_gap_p99_ms: float
  tpot_ms: float
  tokens_per_s: float
  tokens_per_emission: float
  num_requests: int
  num_tokens: int

  def to_dict(self) -> Dict[str, Any]:
    """The fields as a JSON-ready dict."""
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: Dict[str, Any]) -> "LatencyStats":
    """The inverse of `to_dict` (unknown keys are an error)."""
    names = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(d, dict) or set(d) != names:
      raise ValueError(f"d must be a dict with exactly the keys {sorted(names)}, got "
                       f"{sorted(d) if isinstance(d, dict) else type(d).__name__}")
    return cls(**d)


def _percentile(values: np.ndarray, q: float) -> float:
  return float(np.percentile(values, q))  # linear interpolation (numpy's default)


def _check_times(name: str, values: Any, index: Optional[int] = None) -> np.ndarray:
  where = f"{name}[{index}]" if index is not None else name
  if isinstance(values, (str, bytes)):
    raise TypeError(f"{where} must be a sequence of seconds, got the string {values!r}")
  try:
    arr = np.asarray(values, dtype=np.float64)
  except (TypeError, ValueError):
    raise TypeError(f"{where} must be a sequence of real seconds, got {values!r}") from None
  if arr.ndim != 1:
    raise ValueError(f"{where} must be 1-D (one time per token), got shape {arr.shape}")
  if not np.isfinite(arr).all():
    raise ValueError(f"{where} must hold finite seconds, got {arr.tolist()!r}")
  return arr


def latency_stats(token_times: Sequence[Sequence[float]],
                  arrivals: Optional[Sequence[float]] = None) -> LatencyStats:
  """`LatencyStats` from per-request token emission times (seconds).

  Args:
    token_times: one sequence per request: the time each of its tokens was emitted,
      non-decreasing, at least one token; tokens of one speculative call repeat the same time.
    arrivals: each request's arrival time (seconds, <= its first token); default 0.0.

  Returns:
    The `LatencyStats` (definitions in the module doc).

  Raises:
    ValueError: when no request has two tokens (no inter-token latency exists).
  """
  if isinstance(token_times, (str, bytes)) or not isinstance(token_times, Sequence):
    raise TypeError(f"token_times must be a sequence of per-request sequences of seconds, got "
                    f"{type(token_times).__name__}")
  if len(token_times) == 0:
    raise ValueError("token_times must hold at least one request, got an empty sequence")
  times = [_check_times("token_times", t, i) for i, t in enumerate(token_times)]
  if arrivals is None:
    arr = np.zeros(len(times))
  else:
    arr = _check_times("arrivals", arrivals)
    if arr.shape[0] != len(times):
      raise ValueError(f"arrivals must hold one time per request ({len(times)}), got "
                       f"{arr.shape[0]}")
  ttft, itl, gaps, tpot, chunks = [], [], [], [], []
  for i, (t, a) in enumerate(zip(times, arr)):
    if t.size == 0:
      raise ValueError(f"token_times[{i}] must hold at least one token time, got none")
    if np.any(np.diff(t) < 0):
      raise ValueError(f"token_times[{i}] must be non-decreasing (emission order), got "
                       f"{t.tolist()!r}")
    if t[0] < a:
      raise ValueError(f"request {i} emits its first token at {t[0]!r} s, before its arrival "
                       f"{a!r} s")
    ttft.append(t[0] - a)
    distinct = np.unique(t)
    chunks.append(t.size / distinct.size)
    if t.size > 1:
      itl.extend(np.diff(t))
      gaps.extend(np.diff(distinct))
      tpot.append((t[-1] - t[0]) / (t.size - 1))
  if not itl:
    raise ValueError("latency_stats needs at least one request with two or more tokens "
                     "(inter-token latency), every request has one")
  ttft_a, itl_a = np.asarray(ttft), np.asarray(itl)
  gaps_a = np.asarray(gaps) if gaps else np.zeros(1)  # every token of every request at once
  num_tokens = int(sum(t.size for t in times))
  span = max(float(t[-1]) for t in times) - float(arr.min())
  return LatencyStats(
      ttft_ms=1e3 * _percentile(ttft_a, 50), ttft_p99_ms=1e3 * _percentile(ttft_a, 99),
      itl_p50_ms=1e3 * _percentile(itl_a, 50), itl_p99_ms=1e3 * _percentile(itl_a, 99),
      itl_mean_ms=1e3 * float(itl_a.mean()),
      call_gap_p50_ms=1e3 * _percentile(gaps_a, 50),
      call_gap_p99_ms=1e3 * _percentile(gaps_a, 99),
      tpot_ms=1e3 * float(np.mean(tpot)),
      tokens_per_s=num_tokens / span if span > 0 else math.inf,
      tokens_per_emission=float(np.mean(chunks)),
      num_requests=len(times), num_tokens=num_tokens)


def emission_times(events: Sequence[Tuple[float, Any]]) -> List[List[float]]:
  """Per-row token emission times from a stream's events.

  Args:
    events: `(time, cumulative tokens [B] delivered by then)`, in order (a row that stops adds
      nothing after).

  Returns:
    One list per row: each token's time (that of the event delivering it).
  """
  times: List[List[float]] = []
  prev = None
  for t, cum in events:
    cum = np.asarray(cum).reshape(-1)
    if prev is None:
      prev = np.zeros_like(cum)
      times = [[] for _ in range(cum.size)]
    if cum.shape != prev.shape:
      raise ValueError(f"every event must count the same {prev.size} rows, got shape "
                       f"{cum.shape}")
    for b in np.nonzero(cum > prev)[0]:
      times[b].extend([float(t)] * int(cum[b] - prev[b]))
    prev = cum
  return times
