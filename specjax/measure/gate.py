"""The rollout gate for a drafter: measure first, then turn speculation on.

As vLLM / SGLang EAGLE-3 deployments do: measure the plain target's TTFT, ITL P50 / P99 and
tokens/s at the production batch, then α and the same with the drafter; gate on α >= 0.55 and a
P99 ITL within a margin of the baseline's (rejected drafts make a tail: mean ITL falls while P99
can rise):

  m = measure(target, tp, draft, dp, prompts, batch_size=8, ...)
  verdict = gate(m.baseline, m.candidate, m.alpha, min_alpha=0.55, p99_margin=0.10)
  write_plan(verdict, out_dir)                     # rollout.md + rollout.json

`python -m specjax.cli.rollout` runs them on a built-in tiny random pair.

`measure` runs static batches of `batch_size` rows on this process (a partial last batch padded
with uncounted copies; requests arrive when their batch starts), each decoder stepped from the
host (`specjax.streaming`, one sync per step in both arms, as a streaming server pays). The arms
alternate batch by batch (machine noise hits both alike), each on its own timeline, compilation
excluded. α is accepted / drafted over every speculative iteration of every request (vLLM's).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax._checks import check_int, check_prompts, check_real
from specjax.api import resolve_drafter
from specjax.atomic_io import atomic_write_json, atomic_write_text
from specjax.generation import AutoregressiveDecoder, DecodeStats, SpeculativeDecoder
from specjax.measure.latency import LatencyStats, emission_times, latency_stats
from specjax.measure.timing import now
from specjax.protocol import check_model, check_params, required_cache_len
from specjax.sampling import GREEDY, SamplingConfig
from specjax.streaming import stream

__all__ = ["Measurement", "measure", "Check", "Verdict", "gate", "write_plan", "VERDICTS",
           "ROLL_OUT", "HOLD_ALPHA", "HOLD_P99", "HOLD_THROUGHPUT"]

ROLL_OUT = "roll out"
HOLD_ALPHA = "hold: α below gate"
HOLD_P99 = "hold: P99 ITL regressed"
HOLD_THROUGHPUT = "hold: no throughput gain"
VERDICTS = (ROLL_OUT, HOLD_ALPHA, HOLD_P99, HOLD_THROUGHPUT)


# --- Measuring both arms ---


@dataclasses.dataclass(frozen=True)
class Measurement:
  """What `measure` returns.

  Attributes:
    baseline, candidate: `LatencyStats` of plain decoding and of the drafter.
    alpha: accepted / drafted over every speculative iteration (NaN if nothing was drafted).
    tokens_per_call: mean tokens per speculative iteration (accepted + 1).
    outputs_identical: greedy runs: whether both arms emitted the same tokens (exact
      speculative decoding must); None when sampling.
    context: the settings (batch, prompts, max_new_tokens, gamma, drafter, temperature).
    traces: per arm ("baseline", "candidate"): (arrivals, token_times) on the arm's timeline,
      the input of `latency_stats`.
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


def _batches(n: int, batch_size: int) -> List[np.ndarray]:
  """Row indices of each batch; a partial last batch repeats its rows."""
  out = []
  for s in range(0, n, batch_size):
    rows = np.arange(s, min(s + batch_size, n))
    out.append(np.resize(rows, batch_size))  # np.resize repeats the rows
  return out


def measure(target, target_params, draft, draft_params, prompts, prompt_lengths=None, *,
            batch_size: int, max_new_tokens: int, gamma: Optional[int] = None,
            sampling: SamplingConfig = GREEDY, seed: int = 0, eos_id: Optional[int] = None,
            pad_id: int = 0) -> Measurement:
  """Baseline and candidate latencies, and α, of a drafter at one batch size: every prompt
  through plain decoding and through speculative decoding with `draft` (method: the module doc).

  Args:
    target, target_params: the model served.
    draft, draft_params: a draft model or a drafter, as for `specjax.speculative_generate`.
    prompts: int `[num_prompts, P]` right-padded prompts.
    prompt_lengths: int `[num_prompts]` in [1, P]; default all P.
    batch_size: requests decoded together, 1..num_prompts.
    max_new_tokens: tokens per request, >= 1 (>= 2 for an ITL).
    gamma: drafts per iteration, >= 1; None: 4, or the γ of a drafter that fixes its own
      (which refuses any other γ).
    sampling: a `SamplingConfig`; default greedy.
    seed: the PRNG seed of sampled runs (both arms use the same keys).
    eos_id, pad_id: as in `specjax.generate`.

  Returns: a `Measurement`.
  """
  check_model(target, "target")
  batch_size = check_int("batch_size", batch_size, 1)
  max_new = check_int("max_new_tokens", max_new_tokens, 1)
  if gamma is not None:
    gamma = check_int("gamma", gamma, 1)
  seed = check_int("seed", seed, 0)
  if not isinstance(sampling, SamplingConfig):
    raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
  check_params(target, target_params, "target_params")
  prompts_np, lengths_np = (np.asarray(a) for a in check_prompts(prompts, prompt_lengths,
                                                                 target.vocab_size))
  n, p = prompts_np.shape
  if batch_size > n:
    raise ValueError(f"batch_size must be at most the number of prompts ({n}), got "
                     f"{batch_size}: pass at least batch_size prompts")
  drafter, draft_params, gamma = resolve_drafter(target, target_params, draft, draft_params,
                                                 gamma)
  ar = AutoregressiveDecoder(target, sampling, max_new, eos_id, pad_id)
  sp = SpeculativeDecoder(target, drafter, gamma, sampling, max_new, eos_id, pad_id)
  call_len = drafter.layout(gamma).length
  separate_draft = drafter.owns_model
  base_key = jax.random.key(seed)

  def inputs(i, rows):
    keys = jax.random.split(jax.random.fold_in(base_key, i), batch_size)
    return jnp.asarray(prompts_np[rows]), jnp.asarray(lengths_np[rows]), keys

  def run_ar(i, rows):
    pr, ln, keys = inputs(i, rows)
    cache = target.init_cache(batch_size, required_cache_len(target, p, max_new), p)
    return stream(ar, target_params, pr, ln, keys, cache, clock=now)

  def run_sp(i, rows):
    pr, ln, keys = inputs(i, rows)
    t_cache = target.init_cache(batch_size,
                                required_cache_len(target, p, max_new, call_len - 1), p)
    if separate_draft:
      d_cache = drafter.model.init_cache(
          batch_size, required_cache_len(drafter.model, p, max_new, gamma), p)
    else:
      d_cache = drafter.alloc(batch_size, p, t_cache.max_len, gamma)
    return stream(sp, target_params, pr, ln, keys, t_cache, draft_params=draft_params,
                  draft_cache=d_cache, clock=now)

  batches = _batches(n, batch_size)
  run_ar(0, batches[0])  # compile both arms (untimed)
  run_sp(0, batches[0])
  arms = {"baseline": ([], [], 0.0), "candidate": ([], [], 0.0)}
  outputs = {"baseline": {}, "candidate": {}}
  drafted, hist = 0, 0
  for i, rows in enumerate(batches):
    real = len(set(rows.tolist()))  # padded rows are copies at the end
    for arm, fn in (("baseline", run_ar), ("candidate", run_sp)):
      res = fn(i, rows)
      start, times, state = res.start, emission_times(res.events), res.state
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
        drafted += int(np.sum(st.drafted[:real]))
        hist = hist + np.sum(st.accepted_hist[:real], axis=0)
  stats = {arm: latency_stats(t, a) for arm, (a, t, _) in arms.items()}
  measured = DecodeStats.from_histogram(hist, drafted)   # the candidate's real rows
  identical = (outputs["baseline"] == outputs["candidate"]) if sampling.is_greedy else None
  context = {"batch_size": batch_size, "num_prompts": n, "prompt_len": p,
             "max_new_tokens": max_new, "gamma": gamma, "temperature": sampling.temperature,
             "drafter": (type(drafter.model).__name__ + " draft model" if separate_draft
                         else type(drafter).__name__),
             "target": type(target).__name__}
  return Measurement(baseline=stats["baseline"], candidate=stats["candidate"],
                     alpha=measured.alpha(), tokens_per_call=measured.tokens_per_iteration,
                     outputs_identical=identical,
                     context=context,
                     traces={arm: (a, t) for arm, (a, t, _) in arms.items()},
                     outputs={arm: [o[i] for i in range(n)] for arm, o in outputs.items()})


# --- The gate ---


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
    verdict: one of `VERDICTS`: "roll out", or the first failing check (α, P99 ITL, throughput).
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


def gate(baseline: LatencyStats, candidate: LatencyStats, alpha: float, *,
         min_alpha: float = 0.55, p99_margin: float = 0.10, min_throughput_gain: float = 0.0,
         context: Optional[Dict[str, Any]] = None) -> Verdict:
  """Applies the rollout gate to a baseline and a candidate measurement.

  Checks, in order (the verdict names the first that fails, else ROLL_OUT; `reasons` lists all):

    1. α >= min_alpha (else HOLD_ALPHA); a NaN α (nothing drafted) fails;
    2. candidate P99 ITL <= baseline P99 ITL · (1 + p99_margin) (else HOLD_P99);
    3. candidate tokens/s > baseline tokens/s · (1 + min_throughput_gain) (else HOLD_THROUGHPUT):
       a drafter that gains nothing is not worth its memory and complexity.

  Args:
    baseline, candidate: `LatencyStats` of plain decoding and the drafter.
    alpha: the measured acceptance rate, in [0, 1] or NaN.
    min_alpha: the α gate, in [0, 1].
    p99_margin: the allowed relative P99 ITL regression, >= 0.
    min_throughput_gain: the relative tokens/s gain required, >= 0 (0: any gain).
    context: free-form settings recorded in the verdict (JSON-ready).

  Returns: a `Verdict`.
  """
  for name, s in (("baseline", baseline), ("candidate", candidate)):
    if not isinstance(s, LatencyStats):
      raise TypeError(f"{name} must be a LatencyStats, got {type(s).__name__}")
  alpha = check_real("alpha", alpha, 0.0, 1.0, allow_nan=True)
  min_alpha = check_real("min_alpha", min_alpha, 0.0, 1.0)
  p99_margin = check_real("p99_margin", p99_margin, 0.0)
  min_gain = check_real("min_throughput_gain", min_throughput_gain, 0.0)
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


# --- The plan ---


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
  """Writes `rollout.md` (the staged plan) and `rollout.json` (`Verdict.to_dict`) into `out_dir`
  atomically; returns their paths."""
  if not isinstance(verdict, Verdict):
    raise TypeError(f"verdict must be a Verdict (from gate), got {type(verdict).__name__}")
  if not isinstance(out_dir, (str, os.PathLike)):
    raise TypeError(f"out_dir must be a path, got {out_dir!r}")
  md = os.path.join(out_dir, "rollout.md")
  js = os.path.join(out_dir, "rollout.json")
  atomic_write_text(md, _plan_markdown(verdict))
  atomic_write_json(js, verdict.to_dict(), ensure_ascii=False)
  return md, js
