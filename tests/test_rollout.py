"""The rollout gate (`specjax.measure.gate`): latency statistics from hand-made
timestamps, the gate's verdict on rigged measurements, the plan files, a
measurement under a fake clock and the command line on the tiny pair."""

import json
import math
import os

import numpy as np
import pytest

import specjax
from specjax.cli import rollout as rollout_cli
from specjax.measure import gate as rollout
from specjax.measure import latency
from specjax.measure.latency import emission_times
from specjax.measure.timing import use_clock

# -----------------------------------------------------------------------------
# latency_stats on hand-made timestamps.
# -----------------------------------------------------------------------------


def test_latency_stats_by_hand():
  # Request A arrives at 0 and gets tokens at 10 ms, three at 20 ms (one
  # speculative call), and 50 ms; request B arrives at 5 ms: tokens at 25, 30.
  stats = latency.latency_stats([[0.010, 0.020, 0.020, 0.020, 0.050], [0.025, 0.030]],
                                arrivals=[0.0, 0.005])
  # TTFT 10 and 20 ms: median 15, P99 10 + 0.99 * 10.
  assert stats.ttft_ms == pytest.approx(15.0)
  assert stats.ttft_p99_ms == pytest.approx(19.9)
  # ITL per token, zeros counted: [10, 0, 0, 30] and [5] -> sorted [0, 0, 5, 10, 30].
  assert stats.itl_p50_ms == pytest.approx(5.0)
  assert stats.itl_p99_ms == pytest.approx(10.0 + 0.96 * 20.0)  # rank 0.99 * 4 = 3.96
  assert stats.itl_mean_ms == pytest.approx(9.0)
  # Call gaps (distinct times): [10, 30] and [5] -> sorted [5, 10, 30].
  assert stats.call_gap_p50_ms == pytest.approx(10.0)
  assert stats.call_gap_p99_ms == pytest.approx(10.0 + 0.98 * 20.0)
  # TPOT: (50 - 10) / 4 = 10 and 5 -> mean 7.5.
  assert stats.tpot_ms == pytest.approx(7.5)
  # 7 tokens from the first arrival (0) to the last token (50 ms).
  assert stats.tokens_per_s == pytest.approx(140.0)
  assert stats.tokens_per_emission == pytest.approx((5 / 3 + 1) / 2)
  assert (stats.num_requests, stats.num_tokens) == (2, 7)


def test_latency_stats_percentiles_of_a_known_series():
  # One request whose ITLs are 1, 2, ..., 100 ms: P50 50.5, P99 99.01.
  times = np.concatenate([[0.0], np.cumsum(np.arange(1, 101) / 1e3)])
  stats = latency.latency_stats([times.tolist()])
  assert stats.itl_p50_ms == pytest.approx(50.5)
  assert stats.itl_p99_ms == pytest.approx(99.01)
  assert stats.ttft_ms == 0.0  # arrivals default to 0


def test_latency_stats_round_trip():
  stats = latency.latency_stats([[0.1, 0.2, 0.2]])
  assert latency.LatencyStats.from_dict(json.loads(json.dumps(stats.to_dict()))) == stats
  with pytest.raises(ValueError, match="exactly the keys"):
    latency.LatencyStats.from_dict({"ttft_ms": 1.0})


@pytest.mark.parametrize("times, arrivals, error, pattern", [
    ([], None, ValueError, "at least one request"),
    ([[0.1]], None, ValueError, "two or more tokens"),
    ([[0.2, 0.1]], None, ValueError, r"token_times\[0\] must be non-decreasing"),
    ([[0.1, 0.2]], [0.5], ValueError, "before its arrival"),
    ([[0.1, 0.2]], [0.0, 0.0], ValueError, "one time per request"),
    ([[0.1, float("nan")]], None, ValueError, "finite"),
    ([[0.1, 0.2], []], None, ValueError, r"token_times\[1\] must hold at least one"),
    ("0.1", None, TypeError, "token_times must be a sequence"),
])
def test_latency_stats_errors(times, arrivals, error, pattern):
  with pytest.raises(error, match=pattern):
    latency.latency_stats(times, arrivals)


# -----------------------------------------------------------------------------
# The gate on rigged measurements.
# -----------------------------------------------------------------------------


def _stream(tokens_per_call, gap_s, calls=20, requests=4):
  """Requests emitting `tokens_per_call` tokens every `gap_s` seconds."""
  times = [[gap_s * (c + 1)] * tokens_per_call for c in range(calls)]
  flat = [t for call in times for t in call]
  return latency.latency_stats([flat] * requests)


BASE = _stream(1, 0.010)           # plain decoding: a token every 10 ms
FAST = _stream(3, 0.0105)          # 3 tokens per 10.5 ms: +5 % P99, ~2.9x tokens/s
SLOW_TAIL = _stream(3, 0.012)      # +20 % P99, still faster
SAME = _stream(1, 0.010)           # no gain at all
WORSE = _stream(1, 0.020)          # slower everywhere


@pytest.mark.parametrize("candidate, alpha, verdict, failing", [
    (FAST, 0.7, rollout.ROLL_OUT, []),
    (FAST, 0.5, rollout.HOLD_ALPHA, ["alpha"]),
    (SLOW_TAIL, 0.7, rollout.HOLD_P99, ["itl_p99_ms"]),
    (SAME, 0.7, rollout.HOLD_THROUGHPUT, ["tokens_per_s"]),
    (WORSE, 0.3, rollout.HOLD_ALPHA, ["alpha", "itl_p99_ms", "tokens_per_s"]),
    (SLOW_TAIL, 0.55, rollout.HOLD_P99, ["itl_p99_ms"]),  # α exactly at the gate passes
    (FAST, float("nan"), rollout.HOLD_ALPHA, ["alpha"]),
])
def test_gate_verdicts(candidate, alpha, verdict, failing):
  v = rollout.gate(BASE, candidate, alpha)
  assert v.verdict == verdict
  assert v.roll_out == (verdict == rollout.ROLL_OUT)
  assert [c.name for c in v.checks if not c.passed] == failing
  assert len(v.reasons) == len(failing)


def test_gate_thresholds_and_settings():
  v = rollout.gate(BASE, FAST, 0.7, min_alpha=0.8)
  assert v.verdict == rollout.HOLD_ALPHA and "below the gate 0.80" in v.reasons[0]
  # A tighter margin turns FAST's +5 % P99 into a regression.
  assert rollout.gate(BASE, FAST, 0.7, p99_margin=0.01).verdict == rollout.HOLD_P99
  # Requiring a 5x throughput gain holds FAST (about 2.9x).
  assert rollout.gate(BASE, FAST, 0.7, min_throughput_gain=4.0).verdict == \
      rollout.HOLD_THROUGHPUT
  checks = {c.name: c for c in rollout.gate(BASE, FAST, 0.7).checks}
  assert checks["itl_p99_ms"].threshold == pytest.approx(BASE.itl_p99_ms * 1.1)
  assert checks["tokens_per_s"].threshold == pytest.approx(BASE.tokens_per_s)
  assert set(rollout.VERDICTS) == {rollout.ROLL_OUT, rollout.HOLD_ALPHA, rollout.HOLD_P99,
                                   rollout.HOLD_THROUGHPUT}


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(alpha=1.5), ValueError, r"alpha must be a finite number in \[0, 1\], got 1.5"),
    (dict(alpha="0.7"), TypeError, "alpha must be a real number"),
    (dict(min_alpha=-0.1), ValueError, r"min_alpha must be a finite number in \[0, 1\]"),
    (dict(p99_margin=-0.5), ValueError, "p99_margin must be a finite number >= 0"),
    (dict(min_throughput_gain=True), TypeError, "min_throughput_gain must be a real"),
    (dict(baseline={"ttft_ms": 1}), TypeError, "baseline must be a LatencyStats"),
    (dict(context=[1]), TypeError, "context must be a dict"),
])
def test_gate_errors(kwargs, error, pattern):
  args = dict(baseline=BASE, candidate=FAST, alpha=0.7)
  args.update(kwargs)
  with pytest.raises(error, match=pattern):
    rollout.gate(args.pop("baseline"), args.pop("candidate"), args.pop("alpha"), **args)


# -----------------------------------------------------------------------------
# The plan files.
# -----------------------------------------------------------------------------


@pytest.mark.parametrize("candidate, alpha", [(FAST, 0.7), (SLOW_TAIL, float("nan"))])
def test_write_plan(tmp_path, candidate, alpha):
  v = rollout.gate(BASE, candidate, alpha, context={"batch_size": 4, "drafter": "EAGLE-3"})
  md, js = rollout.write_plan(v, str(tmp_path / "plan"))
  assert sorted(os.listdir(tmp_path / "plan")) == ["rollout.json", "rollout.md"]  # no temp files
  with open(js, encoding="utf-8") as f:
    d = json.load(f)
  assert d["verdict"] == v.verdict and d["roll_out"] == v.roll_out
  assert latency.LatencyStats.from_dict(d["candidate"]) == candidate
  assert [c["name"] for c in d["checks"]] == ["alpha", "itl_p99_ms", "tokens_per_s"]
  assert d["context"] == {"batch_size": 4, "drafter": "EAGLE-3"}
  assert (d["alpha"] is None) == math.isnan(alpha)
  with open(md, encoding="utf-8") as f:
    text = f.read()
  assert v.verdict in text and "Rollback trigger" in text and "EAGLE-3" in text
  for stage in ("shadow", "5 %", "50 %", "100 %"):
    assert stage in text
  assert f"{BASE.itl_p99_ms * 1.1:.3f} ms" in text  # the P99 limit the trigger uses
  assert ("Decision: start stage 1" in text) == v.roll_out
  # Rewriting replaces both files.
  v2 = rollout.gate(BASE, WORSE, 0.1)
  rollout.write_plan(v2, str(tmp_path / "plan"))
  with open(js, encoding="utf-8") as f:
    assert json.load(f)["verdict"] == rollout.HOLD_ALPHA


def test_write_plan_errors(tmp_path):
  with pytest.raises(TypeError, match="verdict must be a Verdict"):
    rollout.write_plan({"verdict": "roll out"}, str(tmp_path))


# -----------------------------------------------------------------------------
# measure: a fake clock, the tiny pair, the command line.
# -----------------------------------------------------------------------------


class TickClock:
  """Advances 1 ms each time it is read: every step of either arm costs 1 ms."""

  def __init__(self):
    self.t = 0.0

  def __call__(self):
    self.t += 1e-3
    return self.t


def _prompts(n=3, p=8):
  return np.random.default_rng(0).integers(2, 64, size=(n, p)).astype(np.int32)


def test_measure_with_a_fake_clock():
  # The target drafts for itself: greedy α = 1, every iteration commits
  # γ + 1 = 4 tokens, so 9 tokens take the prefill and 2 steps (plain: 8).
  target, tp, _, _ = rollout_cli.tiny_pair("noisy")
  with use_clock(TickClock()):
    m = rollout.measure(target, tp, target, tp, _prompts(), batch_size=2, max_new_tokens=9,
                        gamma=3)
  assert m.alpha == 1.0 and m.tokens_per_call == 4.0 and m.outputs_identical
  b, c = m.baseline, m.candidate
  assert (b.num_requests, b.num_tokens) == (3, 27)  # the padded 4th row is not counted
  assert b.ttft_ms == pytest.approx(1.0) and c.ttft_ms == pytest.approx(1.0)
  assert b.itl_p50_ms == pytest.approx(1.0) and b.itl_p99_ms == pytest.approx(1.0)
  assert c.itl_p50_ms == 0.0 and c.itl_p99_ms == pytest.approx(1.0)  # [1, 0, 0, 0] x 2
  assert c.itl_mean_ms == pytest.approx(0.25) and c.call_gap_p99_ms == pytest.approx(1.0)
  # Two batches of 9 ms (plain) or 3 ms (speculative) each.
  assert b.tokens_per_s == pytest.approx(27 / 0.018)
  assert c.tokens_per_s == pytest.approx(27 / 0.006)
  assert c.tokens_per_emission == pytest.approx(9 / 3)
  assert rollout.gate(b, c, m.alpha).verdict == rollout.ROLL_OUT
  arrivals, times = m.traces["candidate"]
  assert arrivals == pytest.approx([0.0, 0.0, 0.003])  # batch 2 starts when batch 1 ends
  assert times[2] == pytest.approx([0.004] + [0.005] * 4 + [0.006] * 4)
  # The host-stepped baseline is exactly specjax.generate's greedy output.
  ref = specjax.generate(target, tp, _prompts(), max_new_tokens=9, sampling=specjax.GREEDY)
  assert m.outputs["baseline"] == np.asarray(ref.tokens).tolist()
  assert m.outputs["candidate"] == m.outputs["baseline"]


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(batch_size=4), ValueError, "batch_size must be at most the number of prompts"),
    (dict(batch_size=0), ValueError, "batch_size must be an int >= 1"),
    (dict(gamma=2.0), TypeError, "gamma must be an int"),
    (dict(prompts=np.zeros((3,), np.int32)), ValueError, "prompts must be 2-D"),
    (dict(prompts=np.zeros((3, 8), np.float32)), TypeError, "integer token ids"),
    (dict(prompt_lengths=np.array([9, 1, 1])), ValueError, r"prompt_lengths must lie in"),
    (dict(draft="eagle"), TypeError, "draft must be a draft model"),
])
def test_measure_errors(kwargs, error, pattern):
  target, tp, _, _ = rollout_cli.tiny_pair("noisy")
  args = dict(draft=target, prompts=_prompts(), prompt_lengths=None, batch_size=2, gamma=3)
  args.update(kwargs)
  with pytest.raises(error, match=pattern):
    rollout.measure(target, tp, args.pop("draft"), tp, args.pop("prompts"),
                    args.pop("prompt_lengths"), max_new_tokens=9, **args)


def test_cli_on_the_tiny_pair(tmp_path, capsys):
  # Same shapes as the fake-clock test: the compiled steps are reused.
  out = tmp_path / "rollout"
  assert rollout_cli.main(["--batch", "2", "--prompts", "3", "--prompt_len", "8", "--max_new", "9",
                       "--gamma", "3", "--out_dir", str(out)]) == 0
  with open(out / "rollout.json", encoding="utf-8") as f:
    d = json.load(f)
  assert d["verdict"] in rollout.VERDICTS
  assert 0.0 <= d["alpha"] <= 1.0
  assert d["context"]["outputs_identical"] is True  # greedy speculative == greedy plain
  assert d["context"]["batch_size"] == 2 and d["context"]["gamma"] == 3
  assert d["baseline"]["num_tokens"] == d["candidate"]["num_tokens"] == 27
  printed = capsys.readouterr().out
  assert d["verdict"] in printed and str(out / "rollout.md") in printed
  assert (out / "rollout.md").read_text(encoding="utf-8").startswith("# Rollout plan")


def test_measure_with_a_drafter_without_weights():
  # Prompt lookup (no draft model, its own state from `alloc`) on prompts that
  # repeat a block: some drafts are accepted, and the greedy outputs agree.
  target, tp, lookup, _ = rollout_cli.tiny_pair("prompt_lookup")
  half = _prompts(2, 4)
  m = rollout.measure(target, tp, lookup, None, np.concatenate([half, half], axis=1),
                      batch_size=2, max_new_tokens=9, gamma=3)
  assert m.outputs_identical is True
  assert 0.0 <= m.alpha <= 1.0 and 1.0 <= m.tokens_per_call <= 4.0
  assert m.context["drafter"] == "PromptLookup"
  assert m.candidate.num_tokens == m.baseline.num_tokens == 18


def test_emission_times_of_a_stream_one_arrival_per_iteration():
  # Row 0 gets 1 token at prefill, then 3 and 1; row 1 gets 1, 1, 2.
  events = [(1.0, np.array([1, 1])), (1.5, np.array([4, 2])), (2.5, np.array([5, 4]))]
  times = emission_times(events)
  assert times == [[1.0, 1.5, 1.5, 1.5, 2.5], [1.0, 1.5, 2.5, 2.5]]
  s = latency.latency_stats(times, [0.25, 0.25])
  assert s.ttft_ms == pytest.approx(750)
  # Gaps: row 0 0.5, 0, 0, 1.0; row 1 0.5, 1.0, 0 -> median 0.5, mean 3/7.
  assert s.itl_p50_ms == pytest.approx(500)
  assert s.itl_mean_ms == pytest.approx(1e3 * 3.0 / 7)


def test_emission_times_rows_that_stop_early():
  # Row 1 stops after its first event (done rows commit nothing).
  events = [(1.0, np.array([1, 1])), (2.0, np.array([2, 1])), (4.0, np.array([3, 1]))]
  assert emission_times(events) == [[1.0, 2.0, 4.0], [1.0]]
  with pytest.raises(ValueError, match="same 2 rows"):
    emission_times([(1.0, np.array([1, 1])), (2.0, np.array([2, 1, 1]))])
  with pytest.raises(ValueError, match="at least one request with two or more tokens"):
    latency.latency_stats(emission_times([(1.0, np.array([1, 1]))]))
