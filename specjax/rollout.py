"""The rollout gate for a drafter: measure first, then turn speculation on.

The seeds' EAGLE-3 rollout plan (specjax BRIEF): deploy the target plainly
and measure its baseline at the production batch (TTFT, ITL P50 / P99,
tokens/s); enable the drafter and measure α and the same latencies; gate:
α >= 0.55 (below it speculation loses at high concurrency) and P99 ITL no
worse than the baseline's by more than a margin (rejected drafts make a
two-pass tail: mean ITL falls while P99 can rise). This module does each
step:

  stats = latency_stats(token_times, arrivals)     # from emission times
  m = measure(target, tp, draft, dp, prompts, batch_size=8, ...)
  verdict = gate(m.baseline, m.candidate, m.alpha, min_alpha=0.55, p99_margin=0.10)
  write_plan(verdict, out_dir)                     # rollout.md + rollout.json

and `python -m specjax.rollout` runs them on a built-in tiny random pair.

Latency definitions (`latency_stats`). A request arrives at `arrival` and
its tokens are emitted at `token_times` (one entry per token). Speculative
decoding emits several tokens per target call, so they share a timestamp:

  * TTFT: first emission − arrival (median and P99 over requests);
  * ITL (inter-token latency): per token, time since the previous token of
    the same request — tokens emitted together get ITL 0 and the zeros are
    counted (a stream client sees them at once). P50 / P99 / mean over all
    tokens of all requests. With speculation the P50 is often 0 and the P99
    is the slow tail of whole iterations: exactly what the gate watches;
  * call gap: time between successive distinct emission times (stream
    chunks; one per target call) — the stall a reader of the stream sees.
    For plain decoding it equals the ITL;
  * TPOT: per request (last − first emission) / (tokens − 1), averaged;
  * tokens/s: all tokens over the span from the first arrival to the last
    emission.

Percentiles are numpy's linear interpolation between order statistics.

How `measure` times (no serving stack: static batches on this process). The
prompts run in batches of `batch_size` rows (a partial last batch is padded
with copies of its rows, which are not counted); every request of a batch
arrives when the batch starts. Each decoder (`AutoregressiveDecoder`,
`SpeculativeDecoder`) is driven from the host one jitted step at a time, the
step's output lengths fetched after each step and stamped with `now()` (the
clock of `specjax.bench.timing`; `use_clock` injects a fake one in tests).
The per-step fetch adds one host sync to every step of both arms — it is
what a streaming server pays too. The baseline and the candidate alternate
batch by batch (machine noise hits both alike) and each arm's batches are
laid end to end on its own timeline. Compilation is excluded (the first
batch runs once untimed). α is accepted / drafted summed over every
speculative iteration of every request (vLLM's accepted tokens per request
over the draft length, the seeds' definition); the mean tokens per target
call comes with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import numbers
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.api import required_cache_len, resolve_drafter
from specjax.atomic_io import atomic_write_json, atomic_write_text
from specjax.bench.timing import now
from specjax.drafters import ModelDrafter
from specjax.generation import AutoregressiveDecoder, SpeculativeDecoder
from specjax.protocol import check_model
from specjax.sampling import GREEDY, SamplingConfig

__all__ = ["LatencyStats", "latency_stats", "Measurement", "measure", "Check", "Verdict", "gate",
           "write_plan", "VERDICTS", "ROLL_OUT", "HOLD_ALPHA", "HOLD_P99", "HOLD_THROUGHPUT",
           "tiny_pair", "main"]

ROLL_OUT = "roll out"
HOLD_ALPHA = "hold: α below gate"
HOLD_P99 = "hold: P99 ITL regressed"
HOLD_THROUGHPUT = "hold: no throughput gain"
VERDICTS = (ROLL_OUT, HOLD_ALPHA, HOLD_P99, HOLD_THROUGHPUT)


# -----------------------------------------------------------------------------
# Latency statistics.
# -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LatencyStats:
  """Latencies of a set of requests (milliseconds; see the module doc).

  Attributes:
    ttft_ms, ttft_p99_ms: time to first token, median and P99 over requests.
    itl_p50_ms, itl_p99_ms, itl_mean_ms: per-token inter-token latency over
      every token after each request's first (tokens emitted together: 0).
    call_gap_p50_ms, call_gap_p99_ms: time between a request's successive
      distinct emission times.
    tpot_ms: mean over requests of (last − first emission) / (tokens − 1)
      (requests of one token left out).
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
    token_times: one sequence per request: the time each of its tokens was
      emitted, non-decreasing, at least one token; tokens emitted together
      (one speculative call) repeat the same time.
    arrivals: each request's arrival time (seconds, <= its first token);
      default 0.0 for every request.

  Returns:
    The `LatencyStats` (definitions in the module doc). Raises ValueError
    when no request has two tokens (no inter-token latency exists).
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


# -----------------------------------------------------------------------------
# Measuring both arms.
# -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Measurement:
  """What `measure` returns.

  Attributes:
    baseline, candidate: `LatencyStats` of plain decoding and of the drafter.
    alpha: accepted / drafted over every speculative iteration (NaN if
      nothing was drafted).
    tokens_per_call: mean tokens per speculative iteration (accepted + 1).
    outputs_identical: greedy runs: whether both arms emitted the same
      tokens (exact speculative decoding must); None when sampling.
    context: the settings (batch, prompts, max_new_tokens, gamma, drafter,
      temperature).
    traces: per arm ("baseline", "candidate"): (arrivals, token_times) on
      the arm's timeline, the input of `latency_stats`.
    outputs: per arm, each prompt's generated tokens (a list per prompt).
  """

  baseline: LatencyStats
  candidate: LatencyStats
  alpha: float
  tokens_per_call: float
  outputs_identical: Optional[bool]
  context: Dict[str, Any]
  traces: Dict[str, Tuple[List[float], List[List[float]]]] = dataclasses.field(repr=False)
  outputs: Dict[str, List[List[int]]] = dataclasses.field(repr=False, default_factory=dict)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(5,))
def _ar_init(dec, params, prompts, lengths, keys, cache):
  return dec.init_state(params, prompts, lengths, keys, cache)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(2,))
def _ar_step(dec, params, state):
  return dec.step(params, state)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(6, 7))
def _sp_init(dec, target_params, draft_params, prompts, lengths, keys, target_cache,
             draft_cache):
  return dec.init_state(target_params, draft_params, prompts, lengths, keys, target_cache,
                        draft_cache)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(3,))
def _sp_step(dec, target_params, draft_params, state):
  return dec.step(target_params, draft_params, state)


def _stream(init, step, max_steps: int):
  """Runs `init()` then `step(state)` until every row is done, stamping each
  row's new tokens with `now()` after each call. Returns (start, per-row
  token times, final state)."""
  start = now()
  state = init()
  lens, done = jax.device_get((state.out_len, state.done))
  t = now()
  times = [[t] * int(n) for n in lens]
  steps = 0
  while not np.all(done) and steps < max_steps:
    state = step(state)
    new, done = jax.device_get((state.out_len, state.done))
    t = now()
    for row, (a, b) in enumerate(zip(lens, new)):
      times[row].extend([t] * int(b - a))
    lens, steps = new, steps + 1
  return start, times, state


def _check_int(name: str, value: Any, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(f"{name} must be an int >= {minimum}, got {value!r} "
                    f"({type(value).__name__})")
  if value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
  return int(value)


def _check_prompts(prompts, prompt_lengths) -> Tuple[np.ndarray, np.ndarray]:
  p = np.asarray(prompts)
  if p.ndim != 2 or p.shape[0] < 1 or p.shape[1] < 1:
    raise ValueError(f"prompts must be 2-D [num_prompts, prompt_len] with both >= 1, got shape "
                     f"{p.shape}")
  if p.dtype.kind not in "iu":
    raise TypeError(f"prompts must hold integer token ids, got dtype {p.dtype}")
  if prompt_lengths is None:
    lengths = np.full((p.shape[0],), p.shape[1], np.int32)
  else:
    lengths = np.asarray(prompt_lengths)
    if lengths.shape != (p.shape[0],) or lengths.dtype.kind not in "iu":
      raise ValueError(f"prompt_lengths must be integers of shape ({p.shape[0]},) (one per "
                       f"prompt), got dtype {lengths.dtype} shape {lengths.shape}")
    if np.any((lengths < 1) | (lengths > p.shape[1])):
      raise ValueError(f"prompt_lengths must lie in [1, {p.shape[1]}] (the padded prompt "
                       f"length), got {lengths.tolist()!r}")
  return p.astype(np.int32), lengths.astype(np.int32)


def _batches(n: int, batch_size: int) -> List[np.ndarray]:
  """Row indices of each batch; a partial last batch repeats its rows."""
  out = []
  for s in range(0, n, batch_size):
    rows = np.arange(s, min(s + batch_size, n))
    out.append(np.resize(rows, batch_size))  # np.resize repeats the rows
  return out


def measure(target, target_params, draft, draft_params, prompts, prompt_lengths=None, *,
            batch_size: int, max_new_tokens: int, gamma: int = 4,
            sampling: SamplingConfig = GREEDY, seed: int = 0, eos_id: Optional[int] = None,
            pad_id: int = 0) -> Measurement:
  """Baseline and candidate latencies, and α, of a drafter at one batch size.

  Runs every prompt through plain decoding (the baseline: the target alone)
  and through speculative decoding with `draft` (the candidate), batch by
  batch and alternating the two (method in the module doc).

  Args:
    target, target_params: the model served.
    draft, draft_params: a draft model (a `LanguageModel` with the target's
      vocabulary) or a drafter (`specjax.drafters`), as for
      `specjax.speculative_generate` (draft_params None for drafters that
      need none or run on the target's weights).
    prompts: int `[num_prompts, P]` right-padded prompts.
    prompt_lengths: int `[num_prompts]` in [1, P]; default all P.
    batch_size: requests decoded together, 1..num_prompts.
    max_new_tokens: tokens per request, >= 1 (>= 2 for an ITL).
    gamma: drafts per iteration, >= 1 (a drafter with a fixed γ keeps its).
    sampling: a `SamplingConfig`; default greedy.
    seed: the PRNG seed of sampled runs (both arms use the same keys).
    eos_id, pad_id: as in `specjax.generate`.

  Returns:
    A `Measurement`.
  """
  check_model(target, "target")
  batch_size = _check_int("batch_size", batch_size, 1)
  max_new = _check_int("max_new_tokens", max_new_tokens, 1)
  gamma = _check_int("gamma", gamma, 1)
  seed = _check_int("seed", seed, 0)
  if not isinstance(sampling, SamplingConfig):
    raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
  prompts_np, lengths_np = _check_prompts(prompts, prompt_lengths)
  n, p = prompts_np.shape
  if batch_size > n:
    raise ValueError(f"batch_size must be at most the number of prompts ({n}), got "
                     f"{batch_size}: pass at least batch_size prompts")
  drafter, draft_params, gamma = resolve_drafter(target, target_params, draft, draft_params,
                                                 gamma)
  ar = AutoregressiveDecoder(target, sampling, max_new, eos_id, pad_id)
  sp = SpeculativeDecoder(target, drafter, gamma, sampling, max_new, eos_id, pad_id)
  call_len = drafter.layout(gamma).length
  separate_draft = isinstance(drafter, ModelDrafter) and not drafter.shares_target_params
  base_key = jax.random.key(seed)

  def inputs(i, rows):
    keys = jax.random.split(jax.random.fold_in(base_key, i), batch_size)
    return jnp.asarray(prompts_np[rows]), jnp.asarray(lengths_np[rows]), keys

  def run_ar(i, rows):
    pr, ln, keys = inputs(i, rows)
    cache = target.init_cache(batch_size, required_cache_len(target, p, max_new), p)
    return _stream(lambda: _ar_init(ar, target_params, pr, ln, keys, cache),
                   lambda s: _ar_step(ar, target_params, s), max_new)

  def run_sp(i, rows):
    pr, ln, keys = inputs(i, rows)
    t_cache = target.init_cache(batch_size,
                                required_cache_len(target, p, max_new, call_len - 1), p)
    if separate_draft:
      d_cache = drafter.model.init_cache(
          batch_size, required_cache_len(drafter.model, p, max_new, gamma), p)
    else:
      d_cache = drafter.alloc(batch_size, p, t_cache.max_len, gamma)
    return _stream(lambda: _sp_init(sp, target_params, draft_params, pr, ln, keys, t_cache,
                                    d_cache),
                   lambda s: _sp_step(sp, target_params, draft_params, s), max_new)

  batches = _batches(n, batch_size)
  run_ar(0, batches[0])  # compile both arms (untimed)
  run_sp(0, batches[0])
  arms = {"baseline": ([], [], 0.0), "candidate": ([], [], 0.0)}
  outputs = {"baseline": {}, "candidate": {}}
  accepted = drafted = 0
  hist = None
  for i, rows in enumerate(batches):
    real = len(set(rows.tolist()))  # padded rows are copies at the end
    for arm, fn in (("baseline", run_ar), ("candidate", run_sp)):
      start, times, state = fn(i, rows)
      arrivals, all_times, offset = arms[arm]
      end = start
      for r in range(real):
        arrivals.append(offset)
        all_times.append([offset + t - start for t in times[r]])
        end = max(end, times[r][-1])
      lens = np.asarray(state.out_len)
      toks = np.asarray(state.tokens)
      for r in range(real):
        outputs[arm][int(rows[r])] = toks[r, :lens[r]].tolist()
      arms[arm] = (arrivals, all_times, offset + (end - start))
      if arm == "candidate":
        st = jax.device_get(state.stats)
        accepted += int(np.sum(st.accepted[:real]))
        drafted += int(np.sum(st.drafted[:real]))
        h = np.sum(st.accepted_hist[:real], axis=0)
        hist = h if hist is None else hist + h
  stats = {arm: latency_stats(t, a) for arm, (a, t, _) in arms.items()}
  iters = int(hist.sum()) if hist is not None else 0
  tokens_per_call = (float(np.sum(hist * (np.arange(hist.size) + 1))) / iters if iters
                     else float("nan"))
  identical = (outputs["baseline"] == outputs["candidate"]) if sampling.is_greedy else None
  context = {"batch_size": batch_size, "num_prompts": n, "prompt_len": p,
             "max_new_tokens": max_new, "gamma": gamma, "temperature": sampling.temperature,
             "drafter": (type(drafter.model).__name__ + " draft model" if separate_draft
                         else type(drafter).__name__),
             "target": type(target).__name__}
  return Measurement(baseline=stats["baseline"], candidate=stats["candidate"],
                     alpha=accepted / drafted if drafted else float("nan"),
                     tokens_per_call=tokens_per_call, outputs_identical=identical,
                     context=context,
                     traces={arm: (a, t) for arm, (a, t, _) in arms.items()},
                     outputs={arm: [o[i] for i in range(n)] for arm, o in outputs.items()})


# -----------------------------------------------------------------------------
# The gate.
# -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Check:
  """One condition of the gate: `value` against `threshold` by `rule`."""

  name: str
  value: float
  threshold: float
  rule: str
  passed: bool


@dataclasses.dataclass(frozen=True)
class Verdict:
  """The gate's decision and everything it was based on.

  Attributes:
    verdict: one of `VERDICTS`: "roll out", or the first failing check in
      the order α, P99 ITL, throughput.
    roll_out: whether every check passed.
    reasons: one sentence per failing check (empty when rolling out).
    checks: every `Check`, in order.
    alpha, baseline, candidate: the measurements gated.
    min_alpha, p99_margin, min_throughput_gain: the gate's settings.
    context: the measurement's settings (free-form, JSON-ready).
  """

  verdict: str
  roll_out: bool
  reasons: Tuple[str, ...]
  checks: Tuple[Check, ...]
  alpha: float
  baseline: LatencyStats
  candidate: LatencyStats
  min_alpha: float
  p99_margin: float
  min_throughput_gain: float
  context: Dict[str, Any] = dataclasses.field(default_factory=dict)

  def to_dict(self) -> Dict[str, Any]:
    """A JSON-ready dict (NaN α becomes None)."""
    d = dataclasses.asdict(self)
    d["reasons"] = list(self.reasons)
    d["checks"] = [dataclasses.asdict(c) for c in self.checks]
    if not math.isfinite(self.alpha):
      d["alpha"] = None
    for c in d["checks"]:
      for k in ("value", "threshold"):
        if not math.isfinite(c[k]):
          c[k] = None
    return d


def _check_real(name: str, value: Any, lo: float, hi: float = math.inf,
                allow_nan: bool = False) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
  v = float(value)
  if math.isnan(v) and allow_nan:
    return v
  if not (lo <= v <= hi):
    bound = f"[{lo:g}, {hi:g}]" if math.isfinite(hi) else f">= {lo:g}"
    raise ValueError(f"{name} must be {'in ' if math.isfinite(hi) else ''}{bound}, got {value!r}")
  return v


def gate(baseline: LatencyStats, candidate: LatencyStats, alpha: float, *,
         min_alpha: float = 0.55, p99_margin: float = 0.10, min_throughput_gain: float = 0.0,
         context: Optional[Dict[str, Any]] = None) -> Verdict:
  """Applies the rollout gate to a baseline and a candidate measurement.

  Checks, in order (the verdict names the first that fails; `reasons`
  lists all):

    1. α >= min_alpha (else HOLD_ALPHA): below ~0.55 speculation loses time
       at production concurrency; a NaN α (nothing drafted) fails;
    2. candidate P99 ITL <= baseline P99 ITL · (1 + p99_margin) (else
       HOLD_P99): the tail that rejected drafts make;
    3. candidate tokens/s > baseline tokens/s · (1 + min_throughput_gain)
       (else HOLD_THROUGHPUT): a drafter that gains nothing is not worth
       its memory and complexity.

  All pass: ROLL_OUT.

  Args:
    baseline, candidate: `LatencyStats` of plain decoding and the drafter.
    alpha: the measured acceptance rate, in [0, 1] or NaN.
    min_alpha: the α gate, in [0, 1].
    p99_margin: the allowed relative P99 ITL regression, >= 0.
    min_throughput_gain: the relative tokens/s gain required, >= 0 (0: any
      gain).
    context: free-form settings recorded in the verdict (JSON-ready).

  Returns:
    A `Verdict`.
  """
  for name, s in (("baseline", baseline), ("candidate", candidate)):
    if not isinstance(s, LatencyStats):
      raise TypeError(f"{name} must be a LatencyStats, got {type(s).__name__}")
  alpha = _check_real("alpha", alpha, 0.0, 1.0, allow_nan=True)
  min_alpha = _check_real("min_alpha", min_alpha, 0.0, 1.0)
  p99_margin = _check_real("p99_margin", p99_margin, 0.0)
  min_gain = _check_real("min_throughput_gain", min_throughput_gain, 0.0)
  if context is not None and not isinstance(context, dict):
    raise TypeError(f"context must be a dict or None, got {type(context).__name__}")
  p99_limit = baseline.itl_p99_ms * (1.0 + p99_margin)
  tps_floor = baseline.tokens_per_s * (1.0 + min_gain)
  checks = (
      Check("alpha", alpha, min_alpha, "alpha >= min_alpha",
            bool(not math.isnan(alpha) and alpha >= min_alpha)),
      Check("itl_p99_ms", candidate.itl_p99_ms, p99_limit,
            "candidate P99 ITL <= baseline P99 ITL * (1 + p99_margin)",
            bool(candidate.itl_p99_ms <= p99_limit)),
      Check("tokens_per_s", candidate.tokens_per_s, tps_floor,
            "candidate tokens/s > baseline tokens/s * (1 + min_throughput_gain)",
            bool(candidate.tokens_per_s > tps_floor)),
  )
  messages = {
      "alpha": (HOLD_ALPHA, "α not measured (nothing was drafted)" if math.isnan(alpha) else
                f"α = {alpha:.3f} is below the gate {min_alpha:.2f}"),
      "itl_p99_ms": (HOLD_P99, f"P99 ITL {candidate.itl_p99_ms:.3f} ms exceeds the baseline's "
                               f"{baseline.itl_p99_ms:.3f} ms by more than "
                               f"{p99_margin:.0%} (limit {p99_limit:.3f} ms)"),
      "tokens_per_s": (HOLD_THROUGHPUT, f"{candidate.tokens_per_s:.1f} tokens/s is not above "
                                        f"the baseline's {baseline.tokens_per_s:.1f} × "
                                        f"{1 + min_gain:g} = {tps_floor:.1f}"),
  }
  failed = [c for c in checks if not c.passed]
  return Verdict(verdict=messages[failed[0].name][0] if failed else ROLL_OUT,
                 roll_out=not failed, reasons=tuple(messages[c.name][1] for c in failed),
                 checks=checks, alpha=alpha, baseline=baseline, candidate=candidate,
                 min_alpha=min_alpha, p99_margin=p99_margin, min_throughput_gain=min_gain,
                 context=dict(context or {}))


# -----------------------------------------------------------------------------
# The plan.
# -----------------------------------------------------------------------------


_REMEDIES = {
    HOLD_ALPHA: "train a drafter for this traffic (an EAGLE-3 head on in-domain data), or "
                "enable speculation only for the traffic classes whose α passes; a shorter "
                "draft (lower γ) wastes less on rejections but does not raise α",
    HOLD_P99: "lower γ (shorter iterations, a smaller rejected-draft tail), cap the batch or "
              "concurrency that speculation runs at, or use a cheaper drafter; re-measure at "
              "the production batch",
    HOLD_THROUGHPUT: "at this batch verification is not free: lower γ, enable speculation "
                     "only below a batch-size threshold, or keep plain decoding",
}


def _plan_markdown(v: Verdict) -> str:
  b, c, ctx = v.baseline, v.candidate, v.context
  p99_limit = b.itl_p99_ms * (1 + v.p99_margin)
  tps_floor = b.tokens_per_s * (1 + v.min_throughput_gain)
  alpha = "not measured" if math.isnan(v.alpha) else f"{v.alpha:.3f}"
  setting = ", ".join(f"{k} {val}" for k, val in ctx.items()) or "not recorded"
  lines = [f"# Rollout plan: {ctx.get('drafter', 'drafter')} — **{v.verdict}**", "",
           f"Measured: {setting}.", "",
           "## Measurements", "",
           "| metric | baseline | candidate | change |", "|---|---|---|---|"]
  for label, key, unit in (("TTFT P50", "ttft_ms", "ms"), ("TTFT P99", "ttft_p99_ms", "ms"),
                           ("ITL P50", "itl_p50_ms", "ms"), ("ITL P99", "itl_p99_ms", "ms"),
                           ("ITL mean", "itl_mean_ms", "ms"),
                           ("call gap P99", "call_gap_p99_ms", "ms"), ("TPOT", "tpot_ms", "ms"),
                           ("throughput", "tokens_per_s", "tokens/s"),
                           ("tokens per emission", "tokens_per_emission", "")):
    x, y = getattr(b, key), getattr(c, key)
    change = f"{(y / x - 1):+.1%}" if x else "—"
    lines.append(f"| {label} | {x:.3f} {unit} | {y:.3f} {unit} | {change} |")
  lines += ["", f"α (accepted / drafted) = **{alpha}**.", "", "## Gate", "",
            "| check | value | threshold | rule | result |", "|---|---|---|---|---|"]
  for ch in v.checks:
    val = "—" if not math.isfinite(ch.value) else f"{ch.value:.3f}"
    lines.append(f"| {ch.name} | {val} | {ch.threshold:.3f} | {ch.rule} | "
                 f"{'pass' if ch.passed else '**fail**'} |")
  lines += ["", f"Verdict: **{v.verdict}**."]
  if v.reasons:
    lines += [""] + [f"- {r}" for r in v.reasons]
  trigger = (f"α (rolling, per traffic class) < {v.min_alpha:.2f}, or P99 ITL > "
             f"{p99_limit:.3f} ms (baseline {b.itl_p99_ms:.3f} ms + {v.p99_margin:.0%}), or "
             f"throughput ≤ {tps_floor:.1f} tokens/s at the measured batch")
  lines += ["", "## Stages", "",
            "Every stage holds for at least one full traffic cycle and moves on only if the "
            "gate still passes on that stage's live numbers.", "",
            "| stage | traffic | what to watch | go on when |", "|---|---|---|---|",
            "| 0. baseline | 0 % (flag off) | TTFT, ITL P50/P99, tokens/s at the production "
            f"batch | done: P99 ITL {b.itl_p99_ms:.3f} ms, {b.tokens_per_s:.1f} tokens/s |",
            "| 1. shadow | mirrored copy, outputs discarded | α per traffic class (accepted / "
            f"drafted) | α ≥ {v.min_alpha:.2f} on every class that will be enabled |",
            f"| 2. canary | 5 % | α, P99 ITL, tokens/s vs the 95 % on baseline | α ≥ "
            f"{v.min_alpha:.2f}, P99 ITL ≤ {p99_limit:.3f} ms, tokens/s > {tps_floor:.1f} |",
            "| 3. half | 50 % | the same, at full concurrency | the same |",
            "| 4. full | 100 % | the same; alerts on the rollback trigger | — |", "",
            f"**Rollback trigger** (any stage): {trigger}. Action: turn the drafter off (the "
            "speculative config flag), fall back to plain decoding, and re-measure."]
  if v.roll_out:
    lines += ["", "Decision: start stage 1 (shadow)."]
  else:
    lines += ["", "Decision: stay at stage 0 (flag off). Remedies:", ""]
    for ch in v.checks:
      if not ch.passed:
        verdict = {"alpha": HOLD_ALPHA, "itl_p99_ms": HOLD_P99,
                   "tokens_per_s": HOLD_THROUGHPUT}[ch.name]
        lines.append(f"- {verdict}: {_REMEDIES[verdict]}.")
  return "\n".join(lines) + "\n"


def write_plan(verdict: Verdict, out_dir: str) -> Tuple[str, str]:
  """Writes `rollout.md` (the staged plan) and `rollout.json` (the verdict,
  `Verdict.to_dict`) into `out_dir` atomically; returns their paths."""
  if not isinstance(verdict, Verdict):
    raise TypeError(f"verdict must be a Verdict (from gate), got {type(verdict).__name__}")
  if not isinstance(out_dir, (str, os.PathLike)):
    raise TypeError(f"out_dir must be a path, got {out_dir!r}")
  md = os.path.join(out_dir, "rollout.md")
  js = os.path.join(out_dir, "rollout.json")
  atomic_write_text(md, _plan_markdown(verdict))
  atomic_write_json(js, verdict.to_dict(), ensure_ascii=False)
  return md, js


# -----------------------------------------------------------------------------
# The command line: a built-in tiny random pair.
# -----------------------------------------------------------------------------


DRAFTERS = ("noisy", "small", "prompt_lookup")


@functools.lru_cache(maxsize=8)
def tiny_pair(drafter: str = "noisy", noise: float = 0.15, seed: int = 0, vocab_size: int = 64):
  """(target, target_params, draft, draft_params): a tiny random `DecoderLM`
  target (2 layers, width 32) and a drafter: "noisy" its own architecture
  with perturbed weights (high, varied α), "small" a smaller random model
  (low α), "prompt_lookup" `drafters.PromptLookup` (no weights)."""
  from specjax import drafters  # pylint: disable=g-import-not-at-top
  from specjax.models import decoder as dec_lib  # pylint: disable=g-import-not-at-top
  if drafter not in DRAFTERS:
    raise ValueError(f"drafter must be one of {DRAFTERS}, got {drafter!r}")
  target = dec_lib.DecoderLM(dec_lib.decoder_config("tiny", vocab_size=vocab_size, num_layers=2))
  key_t, key_d = jax.random.split(jax.random.key(seed))
  tp = jax.jit(target.init)(key_t)  # one compiled call: eager init is op-by-op slow
  if drafter == "prompt_lookup":
    return target, tp, drafters.PromptLookup(max_ngram=3), None
  if drafter == "small":
    draft = dec_lib.DecoderLM(dec_lib.decoder_config(
        "tiny", vocab_size=vocab_size, num_layers=1, d_model=16, num_heads=2, num_kv_heads=1,
        mlp_dim=32, tie_embeddings=True))
    return target, tp, draft, jax.jit(draft.init)(key_d)
  rng = np.random.default_rng(seed + 1)  # on the host: no compilation for a tiny tree
  noisy = jax.tree_util.tree_map(
      lambda x: jnp.asarray(np.asarray(x) + noise * np.std(np.asarray(x))
                            * rng.standard_normal(x.shape), x.dtype), tp)
  return target, tp, target, noisy


def _parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(prog="python -m specjax.rollout", description=(
      "Measure a baseline and a drafter on a built-in tiny random pair, gate, write the plan."))
  ap.add_argument("--batch", type=int, default=4, help="requests decoded together")
  ap.add_argument("--prompts", type=int, default=8, help="number of prompts")
  ap.add_argument("--prompt_len", type=int, default=16, help="tokens per prompt")
  ap.add_argument("--max_new", type=int, default=32, help="tokens generated per request")
  ap.add_argument("--gamma", type=int, default=4, help="drafts per iteration")
  ap.add_argument("--drafter", choices=DRAFTERS, default="noisy", help="built-in drafter")
  ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
  ap.add_argument("--min_alpha", type=float, default=0.55, help="the α gate")
  ap.add_argument("--p99_margin", type=float, default=0.10, help="allowed P99 ITL regression")
  ap.add_argument("--min_throughput_gain", type=float, default=0.0,
                  help="relative tokens/s gain required")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--out_dir", default=os.path.join("runs", "rollout"),
                  help="where rollout.md and rollout.json go")
  return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The CLI: tiny pair → `measure` → `gate` → `write_plan`; prints the verdict."""
  a = _parser().parse_args(argv)
  target, tp, draft, dp = tiny_pair(a.drafter, seed=a.seed)
  rng = np.random.default_rng(a.seed)
  half = rng.integers(2, target.vocab_size, size=(a.prompts, max(a.prompt_len // 2, 1)))
  prompts = np.concatenate([half, half], axis=1)[:, :a.prompt_len]  # repeats: lookup hits
  m = measure(target, tp, draft, dp, prompts, batch_size=a.batch, max_new_tokens=a.max_new,
              gamma=a.gamma, sampling=SamplingConfig(a.temperature), seed=a.seed)
  context = dict(m.context, drafter=f"{a.drafter} ({m.context['drafter']})",
                 tokens_per_call=round(m.tokens_per_call, 3),
                 outputs_identical=m.outputs_identical)
  v = gate(m.baseline, m.candidate, m.alpha, min_alpha=a.min_alpha, p99_margin=a.p99_margin,
           min_throughput_gain=a.min_throughput_gain, context=context)
  md, js = write_plan(v, a.out_dir)
  print(f"{v.verdict}: α {m.alpha:.3f}, P99 ITL {m.baseline.itl_p99_ms:.2f} → "
        f"{m.candidate.itl_p99_ms:.2f} ms, {m.baseline.tokens_per_s:.0f} → "
        f"{m.candidate.tokens_per_s:.0f} tokens/s; wrote {md} and {js}")
  for r in v.reasons:
    print(f"  - {r}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
