"""The peers benchmark (`benchmarks/peers_bench.py`): the streamer, loop
prediction and overhead arithmetic on rigged clocks, the model-call loops,
α = E[β], the goals, and the smoke run (tiny random models; keys and greedy
agreement, never timings)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench_helpers import run_script as _run
from experiments.programs import peers as bp
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.models.t5 import T5


def test_timing_streamer_skips_the_prompt_and_counts_tokens():
  torch = pytest.importorskip("torch")
  s = bp.TimingStreamer()
  s.put(torch.zeros((2, 7)))   # the prompt: skipped
  s.put(torch.zeros((2,)))     # one token per row (greedy)
  s.put(torch.zeros((2,)))
  assert [e[1].tolist() for e in s.events] == [[1, 1], [2, 2]]
  s = bp.TimingStreamer()
  s.put(torch.zeros((1, 1)))   # T5's decoder start token
  s.put(torch.zeros((1,)))
  s.put(torch.zeros((1, 4)))   # an assisted iteration: 3 accepted + 1
  assert [e[1].tolist() for e in s.events] == [[1], [5]]
  assert s.puts == 3


def test_loop_prediction_hand_computed():
  t_target = {1: 2.0, 4: 5.0}
  t_draft = {1: 0.5, 2: 0.75}
  pred = bp.loop_prediction(max_new=9, gamma=3, iterations=[3, 4], t_target=t_target,
                            t_draft=t_draft, prefill_target_s=1.0, prefill_draft_s=0.25)
  # AR: 2 requests × (1 + 8 × 2). SP iteration: 0.75 + 2 × 0.5 + 5 = 6.75.
  assert pred["ar_predicted_s"] == pytest.approx(34.0)
  assert pred["iteration_predicted_s"] == pytest.approx(6.75)
  assert pred["sp_predicted_s"] == pytest.approx(2 * 1.25 + 7 * 6.75)
  assert pred["predicted_speedup"] == pytest.approx(34.0 / (2.5 + 47.25))


def test_token_agreement():
  ref = np.array([[1, 2, 3], [4, 5, 6]])
  assert bp.token_agreement(ref.copy(), ref)["identical"]
  other = np.array([[1, 2, 3], [4, 9, 6]])
  a = bp.token_agreement(other, ref)
  assert (a["identical_rows"], a["first_mismatch"], a["identical"]) == (1, 1, False)


def test_peers_t5_pair_every_system_follows_greedy(tmp_path):
  """The T5 pair as the peers suite builds it (tiny random init, exported to
  transformers): transformers greedy, assisted and prompt-lookup generation
  give specjax's greedy tokens (the suite's smoke below runs the decoder
  pair through everything else; the suite's code is shared by both kinds)."""
  from experiments.programs import peers as bp
  pair = bp.load_pair(bp.fallback_spec("t5", "t5", size="tiny"))
  rng = np.random.default_rng(3)
  prompts = rng.integers(2, pair.target.vocab_size, (2, 8)).astype(np.int32)
  lengths = np.array([8, 5], np.int32)
  prompts[1, 5:] = 0
  row_groups = bp.groups(1, 2)  # one request at a time (assisted generation's limit)
  runners = [bp.specjax_runner(pair, prompts, lengths, row_groups, 0, 8, 8 + 1)]
  hf = bp.HFPair(pair, str(tmp_path / "hf"))
  runners += [bp.hf_runner(hf, prompts, lengths, row_groups, mode, g, 8)
              for mode, g in (("greedy", None), ("assisted", 2), ("lookup", 2))]
  ref = np.asarray(runners[0].fn()[0])
  assert ref.shape == (2, 8) and len(set(ref.ravel().tolist())) > 2
  for r in runners[1:]:
    np.testing.assert_array_equal(np.asarray(r.fn()[0]), ref, err_msg=r.system)


def test_peers_bench_smoke(tmp_path):
  pytest.importorskip("transformers")
  _run(["benchmarks/peers_bench.py", "--smoke", "--pairs=decoder", f"--out_dir={tmp_path}"])
  results = json.loads((tmp_path / "peers_smoke.json").read_text())
  md = (tmp_path / "peers_smoke.md").read_text()
  assert set(results) == {"meta", "pairs", "goals", "provenance"}
  assert set(results["pairs"]) == {"decoder"}
  for name, p in results["pairs"].items():
    assert not p["trained"] and "random init" in p["source"]
    systems = {r["system"] for r in p["rows"]}
    mp = {"specjax autoregressive, model-parallel ×2", "specjax speculative, model-parallel ×2"}
    assert systems == {"specjax autoregressive", "specjax speculative", "transformers greedy",
                       "transformers assisted", "transformers prompt lookup"} | mp
    for r in p["rows"]:
      latency = ("ttft_ms", "itl_p50_ms", "itl_p99_ms") if r.get("devices", 1) == 1 else ()
      for key in ("tokens_per_s", "agreement") + latency:
        assert key in r, (name, r["system"], key)
      # Greedy: every system's tokens equal specjax autoregressive's.
      assert r["agreement"]["identical"], (name, r["system"], r["gamma"], r["agreement"])
      if r["framework"] == "specjax" and r["devices"] == 1:
        assert r["stream_identical"] and r["compile_s"] >= 0
      if r["framework"] == "specjax" and r["devices"] > 1:  # Split target, replicated draft.
        assert r["devices"] == 2 and r["vs_one_device"] > 0 and "stream_identical" not in r
      if r["system"] == "specjax speculative":
        for key in ("loop_overhead", "predicted_speedup", "measured_speedup", "verify_cost", "c",
                    "acceptance_rate"):
          assert np.isfinite(r[key]), key
    assert any("only supported for batch_size = 1" in n for n in p["notes"])
    assert p["ratios"][0]["ar_vs_hf_greedy"] > 0
    growth = p["growth"]["rows"]
    assert {r["sweep"] for r in growth} == {"length", "buffer"}
    assert all(r["ms_per_token"] > 0 for r in growth)
    assert f"## Pair `{name}`" in md
  # Decoder pairs run with matvec_max_rows measured on this machine (T5: no such option).
  tuned = results["pairs"]["decoder"]["matvec_tuning"]
  assert set(tuned) == {"target", "draft"} and all(t["rows"] in (0, 2) for t in tuned.values())
  assert results["pairs"]["decoder"]["spec"]["target_matvec_rows"] == tuned["target"]["rows"]
  assert "(tuned on this machine by `specjax.tune_matvec_rows`" in md
  mem = [r["memory"] for r in results["pairs"]["decoder"]["rows"] if "memory" in r]
  assert mem and "error" not in mem[0] and mem[0]["peak_with_load_mb"] > 0
  statuses = {g["status"] for g in results["goals"]}
  assert statuses <= {"PASS", "FAIL", "n/a", "pending"} and "pending" in statuses
  for heading in ("## Goals", "### Every configuration", "### Ratios (tokens/s)",
                  "### Cost growth", "### Peak memory", "### Loop overhead, paired rounds",
                  "α = E[β]: the share of the target's greedy positions"):
    assert heading in md
  for name, p in results["pairs"].items():
    assert 0.0 <= p["batches"][0]["alpha"] <= 1.0  # E[β] over the AR tokens, per batch
    po = p["batches"][0]["paired_overhead"]
    assert po["batch"] == 1 and len(po["rounds"]) == 1 and np.isfinite(po["loop_overhead"])
    assert np.isfinite(po["logic_overhead"]) and np.isfinite(po["composition_overhead"])
  mp_goals = [g for g in results["goals"] if "model-parallel ×2" in g["goal"]]
  # The smoke asks for 2 CPU devices (peers_bench.py sets the count before jax starts).
  assert len(mp_goals) == 2 and all(g["status"] in ("PASS", "FAIL") for g in mp_goals)
  assert "### Every core on the target: model-parallel rows" in md
  # The report re-rendered from the JSON (--render) is the run's report, byte for byte.
  (tmp_path / "peers_smoke.md").unlink()
  _run(["benchmarks/peers_bench.py", f"--render={tmp_path / 'peers_smoke.json'}"])
  assert (tmp_path / "peers_smoke.md").read_text() == md
  assert json.loads((tmp_path / "peers_smoke.json").read_text())["goals"] == results["goals"]
  overhead_goals = [g for g in results["goals"] if "loop overhead" in g["goal"]]
  assert overhead_goals and all("paired rounds" in g["detail"] and "decoding logic" in g["detail"]
                                for g in overhead_goals)


def test_step_times_side_by_side_takes_params_per_model():
  """Per-name params (the same weights in two layouts) time both; a wrong
  tree for a model would fail inside its loop."""
  from specjax.measure.timing import step_times_side_by_side
  from specjax.models.decoder import DecoderLM, decoder_config
  lm = DecoderLM(decoder_config("tiny"))
  params = lm.init(jax.random.PRNGKey(0))
  sec = step_times_side_by_side({"a": lm, "b": lm}, {"a": params, "b": lm.pack_params(params)},
                                1, 16, 4, 1, steps=2, repeats=2)
  assert set(sec) == {"a", "b"} and all(len(v) == 2 for v in sec.values())


class FakeClock:
  """The clock `specjax.measure.timing.use_clock` injects: time moves only when
  the code under test advances it, never with the machine's load."""

  def __init__(self):
    self.t = 0.0

  def __call__(self) -> float:
    return self.t

  def advance(self, seconds: float) -> None:
    self.t += seconds


def test_interleaved_rounds_rotates_the_order_and_reads_the_clock():
  from specjax.measure.timing import interleaved_rounds, use_clock
  clock, ran = FakeClock(), []

  def call(key, seconds):
    def run():
      ran.append(key)
      clock.advance(seconds)
      return f"{key}{len(ran)}"
    return run
  with use_clock(clock):
    out = interleaved_rounds({"a": call("a", 1.0), "b": call("b", 2.0), "c": call("c", 4.0)}, 3)
  assert "".join(ran) == "abc" + "bca" + "cab"   # each round rotated left by one
  assert out.seconds == {"a": [1.0] * 3, "b": [2.0] * 3, "c": [4.0] * 3}
  assert out.median("c") == 4.0 and out.last == {"c": "c7", "a": "a8", "b": "b9"}
  ran.clear()
  with use_clock(clock):
    interleaved_rounds({"a": call("a", 1.0), "b": call("b", 1.0)}, 4, reverse=True)
  assert "".join(ran) == "ab" + "ba" + "ab" + "ba"
  with pytest.raises(ValueError, match="rounds"):
    interleaved_rounds({"a": call("a", 1.0)}, 0)
  with pytest.raises(ValueError, match="calls"):
    interleaved_rounds({}, 1)
  with pytest.raises(TypeError, match="calls"):
    interleaved_rounds({"a": 3}, 1)


class _ClockedModel:
  """A tiny decoder whose prefill advances a fake clock by `prefill_s` and
  whose extend advances it by `step_s` per call (host callbacks inside the
  jitted loop, fed from the logits so XLA keeps them and runs them in order)."""

  def __init__(self, model, clock, prefill_s, step_s):
    self._model, self._clock = model, clock
    self._prefill_s, self._step_s = prefill_s, step_s

  def __getattr__(self, name):
    return getattr(self._model, name)

  def _tick(self, logits, seconds):
    def advance(x):
      self._clock.advance(seconds)
      return np.zeros((), np.float32)
    return jax.pure_callback(advance, jax.ShapeDtypeStruct((), jnp.float32), logits.sum())

  def prefill(self, params, prompts, lengths, cache):
    logits, last, cache = self._model.prefill(params, prompts, lengths, cache)
    return logits + self._tick(logits, self._prefill_s), last, cache

  def extend(self, params, tokens, cache):
    logits, cache = self._model.extend(params, tokens, cache)
    return logits + self._tick(logits, self._step_s), cache


def test_step_times_exclude_the_prefill():
  """The prefill's cost must cancel out of the per-step time, and every one of
  the `steps` calls must count. (A separately timed prefill whose result is
  unused is dead code to XLA: subtracting it left prefill / steps inside
  every step time.) On a rigged clock — prefill 1000 s, a call 1 ms — the
  answer is exactly 1 ms per call, however busy the machine."""
  from specjax.measure.timing import step_times, use_clock
  lm = DecoderLM(decoder_config("tiny", vocab_size=64, num_layers=1))
  params = lm.init(jax.random.PRNGKey(0))
  clock = FakeClock()
  model = _ClockedModel(lm, clock, prefill_s=1000.0, step_s=1e-3)
  with use_clock(clock):
    out = step_times(model, params, 1, 16, 4, [1, 3], steps=4, repeats=3)
  assert set(out) == {1, 3}
  for t, sec in out.items():
    assert sec == pytest.approx(1e-3, rel=1e-9), (t, sec)  # Counting the prefill: 250 s.
  # A call that costs nothing on the clock reads as the 0.1 µs floor, never 0.
  with use_clock(FakeClock()):
    assert step_times(lm, params, 1, 16, 4, [1], steps=2, repeats=1) == {1: 1e-7}
  with pytest.raises(ValueError, match="steps"):
    step_times(lm, params, 1, 16, 4, [1], steps=0)
  with pytest.raises(TypeError, match="clock"):
    with use_clock(3.0):
      pass


def test_step_times_side_by_side_rejects_no_models():
  from specjax.measure.timing import step_times_side_by_side
  with pytest.raises(ValueError, match="models"):
    step_times_side_by_side({}, {}, 1, 16, 4, 1)


def test_step_timer_measures_in_rounds():
  from specjax.measure.timing import StepTimer
  lm = DecoderLM(decoder_config("tiny", vocab_size=64, num_layers=1))
  params = lm.init(jax.random.PRNGKey(0))
  timer = StepTimer(lm, params, 1, 16, 4, [1, 3], steps=4)
  for repeats in (1, 3):
    out = timer.measure(repeats)
    assert set(out) == {1, 3} and all(len(v) == repeats for v in out.values())
  with pytest.raises(ValueError, match="token_counts"):
    StepTimer(lm, params, 1, 16, 4, [])
  with pytest.raises(ValueError, match="repeats"):
    timer.measure(0)


class _RiggedTimer:
  """Stands in for `StepTimer`: per T, a fixed number of seconds per call."""

  def __init__(self, seconds):
    self.seconds = seconds

  def measure(self, repeats=1):
    return {t: [v] * repeats for t, v in self.seconds.items()}


def _rigged_overhead_world(monkeypatch, clock, sp_extra_s=0.0, sp_calls_extra_s=0.0):
  """`paired_loop_overhead`'s inputs on a fake clock, every cost chosen:
  target steps 2 ms (T=1) / 3 ms (T=3), draft 0.5 / 0.6 ms (T=1 / 2),
  prefills 10 ms + 1 ms; γ = 2, 8 new tokens, the speculative request runs 4
  iterations. The AR loop costs exactly its components (24 ms); the
  speculative one 27.4 ms + `sp_extra_s` (its model calls alone 27.4 ms +
  `sp_calls_extra_s`)."""
  target, draft = object(), object()
  pair = bp.Pair(spec=None, target=target, tp="tp", draft=draft, dp="dp")
  timers = {target: {1: 2e-3, 3: 3e-3}, draft: {1: 0.5e-3, 2: 0.6e-3}}
  monkeypatch.setattr(bp, "StepTimer", lambda model, *a, **k: _RiggedTimer(timers[model]))
  prefill_s = {target: 10e-3, draft: 1e-3}
  monkeypatch.setattr(bp, "_prefill_call",
                      lambda model, *a, **k: lambda: clock.advance(prefill_s[model]))
  calls_s = {0: 24e-3, 2: 27.4e-3 + sp_calls_extra_s}
  monkeypatch.setattr(bp, "_call_loops",
                      lambda *a, **k: lambda g, iterations: clock.advance(calls_s[g]))

  def runner(gamma, seconds):
    def fn():
      clock.advance(seconds)
      return None, {"iterations": [4]}
    return bp.Runner("rigged", 1, gamma, fn)
  ar, sp = runner(0, 24e-3), runner(2, 27.4e-3 + sp_extra_s)
  prompts, lengths = np.ones((1, 8), np.int32), np.full((1,), 8, np.int32)
  return pair, ar, sp, prompts, lengths


def test_paired_loop_overhead_on_a_rigged_clock(monkeypatch):
  """The loop-overhead arithmetic, the round logic and the split into the
  decoding logic's and the composition's part, on a fake clock: a loop that
  costs exactly its components reads 0 overhead; 250 ms added to the
  speculative loop (outside its model calls) reads as exactly that, in the
  logic's part."""
  from specjax.measure.timing import use_clock
  clock = FakeClock()
  ar_pred, sp_pred = 10e-3 + 7 * 2e-3, 10e-3 + 1e-3 + 4 * (0.6e-3 + 0.5e-3 + 3e-3)
  with use_clock(clock):
    plain = bp.paired_loop_overhead(*_rigged_overhead_world(monkeypatch, clock), cache_len=18,
                                    max_new=8, rounds=1, min_loop_seconds=1e9, max_rounds=3)
  # One round asked, more until 1e9 s of loops: stopped by max_rounds.
  assert len(plain["rounds"]) == 3 and plain["gamma"] == 2 and plain["batch"] == 1
  assert plain["predicted_speedup"] == pytest.approx(ar_pred / sp_pred)
  assert plain["measured_speedup"] == pytest.approx(24e-3 / 27.4e-3)
  for key in ("loop_overhead", "ar_loop_overhead", "sp_loop_overhead", "logic_overhead",
              "composition_overhead"):
    assert plain[key] == pytest.approx(0.0, abs=1e-12), key
  assert plain["loop_seconds"] == pytest.approx(3 * (24e-3 + 27.4e-3))
  r = plain["rounds"][0]
  assert r["target_ms"] == {1: pytest.approx(2.0), 3: pytest.approx(3.0)}
  assert r["prefill_ms"] == {"target": pytest.approx(10.0), "draft": pytest.approx(1.0)}

  clock = FakeClock()
  with use_clock(clock):
    slowed = bp.paired_loop_overhead(*_rigged_overhead_world(monkeypatch, clock, 0.25),
                                     cache_len=18, max_new=8, rounds=1, min_loop_seconds=0.5)
  # Rounds continue until the loops' summed time reaches 0.5 s: two rounds of 0.3014 s.
  assert len(slowed["rounds"]) == 2
  assert slowed["loop_seconds"] == pytest.approx(2 * (24e-3 + 27.4e-3 + 0.25))
  sp_s = 27.4e-3 + 0.25
  assert slowed["sp_loop_overhead"] == pytest.approx(sp_s / sp_pred - 1)
  assert slowed["loop_overhead"] == pytest.approx((ar_pred / sp_pred) / (24e-3 / sp_s) - 1)
  # The model-call loops cost their components: all of it is the decoding logic's.
  assert slowed["composition_overhead"] == pytest.approx(0.0, abs=1e-12)
  assert slowed["logic_overhead"] == pytest.approx(slowed["loop_overhead"])
  assert slowed["sp_logic"] == pytest.approx(sp_s / 27.4e-3 - 1)
  for r in slowed["rounds"]:
    assert (1 + r["logic_overhead"]) * (1 + r["composition_overhead"]) == pytest.approx(
        1 + r["loop_overhead"])

  # Extra cost inside the model calls is the composition's part instead.
  clock = FakeClock()
  with use_clock(clock):
    composed = bp.paired_loop_overhead(*_rigged_overhead_world(monkeypatch, clock, 0.01, 0.01),
                                       cache_len=18, max_new=8, rounds=2)
  assert composed["logic_overhead"] == pytest.approx(0.0, abs=1e-12)
  assert composed["composition_overhead"] == pytest.approx(composed["loop_overhead"])
  assert composed["loop_overhead"] > 0.3

  world = _rigged_overhead_world(monkeypatch, clock)
  off = bp.paired_loop_overhead(*world, cache_len=18, max_new=8, rounds=1, model_calls=False)
  assert "logic_overhead" not in off and "sp_calls_s" not in off["rounds"][0]
  pair, ar, sp, prompts, lengths = world
  with pytest.raises(ValueError, match="rounds"):
    bp.paired_loop_overhead(pair, ar, sp, prompts, lengths, 18, 8, 0)
  with pytest.raises(ValueError, match="autoregressive"):
    bp.paired_loop_overhead(pair, sp, ar, prompts, lengths, 18, 8, 1)
  with pytest.raises(ValueError, match="max_rounds"):
    bp.paired_loop_overhead(pair, ar, sp, prompts, lengths, 18, 8, 3, max_rounds=2)
  with pytest.raises(ValueError, match="min_loop_seconds"):
    bp.paired_loop_overhead(pair, ar, sp, prompts, lengths, 18, 8, 1,
                            min_loop_seconds=float("nan"))


def test_overhead_fields_hand_computed():
  pred = {"predicted_speedup": 1.5, "ar_predicted_s": 3.0, "sp_predicted_s": 2.0}
  out = bp.overhead_fields(pred, ar_s=3.3, sp_s=2.75)
  assert out["measured_speedup"] == pytest.approx(1.2)
  assert out["loop_overhead"] == pytest.approx(0.25)      # 1.5 / 1.2 − 1
  assert out["ar_loop_overhead"] == pytest.approx(0.1)
  assert out["sp_loop_overhead"] == pytest.approx(0.375)


def test_call_loop_fields_hand_computed():
  pred = {"predicted_speedup": 1.5, "ar_predicted_s": 3.0, "sp_predicted_s": 2.0}
  out = bp.call_loop_fields(pred, ar_s=3.3, sp_s=2.75, ar_calls_s=3.15, sp_calls_s=2.5)
  assert out["calls_speedup"] == pytest.approx(1.26)
  assert out["logic_overhead"] == pytest.approx(1.26 / 1.2 - 1)       # 5%
  assert out["composition_overhead"] == pytest.approx(1.5 / 1.26 - 1)
  assert out["ar_logic"] == pytest.approx(3.3 / 3.15 - 1)
  assert out["sp_logic"] == pytest.approx(0.1)
  assert out["ar_composition"] == pytest.approx(0.05)
  assert out["sp_composition"] == pytest.approx(0.25)
  # The two parts multiply to the whole loop overhead.
  whole = bp.overhead_fields(pred, ar_s=3.3, sp_s=2.75)["loop_overhead"]
  assert (1 + out["logic_overhead"]) * (1 + out["composition_overhead"]) == pytest.approx(1 + whole)


def _t5_pair():
  from tests.t5_helpers import tiny_config
  target, draft = T5(tiny_config("1.1")), T5(tiny_config("1.0", num_decoder_layers=1))
  return target, target.init(jax.random.PRNGKey(3)), draft, draft.init(jax.random.PRNGKey(4))


def _decoder_pair():
  from tests import tiny
  (target, tp), (draft, dp) = tiny.target(), tiny.small_draft()
  return target, tp, draft, dp


@pytest.mark.parametrize("make_pair", [_decoder_pair, _t5_pair], ids=["decoder", "t5"])
def test_model_call_loop_follows_greedy_decoding(make_pair):
  """The model-call loop makes the fused loops' calls at the right positions:
  after K iterations (one position each) the target's first argmax is greedy
  decoding's token K + 1, for the autoregressive loop and every γ, and (the
  decoder-only pair, whose prefix can be fed as a prompt) the drafts are the
  draft's own greedy continuation of the first K tokens — an off-by-one in
  a length, a wrong draft feed or a stale cache would change the tokens."""
  import specjax
  from specjax.measure.calls import model_call_loop
  target, tp, draft, dp = make_pair()
  rng = np.random.default_rng(5)
  plen, n_new = 7, 10
  prompts = jnp.asarray(rng.integers(2, target.vocab_size, size=(3, plen)), jnp.int32)
  lengths = jnp.array([7, 3, 5], jnp.int32)
  prompts = jnp.where(jnp.arange(plen)[None] < lengths[:, None], prompts, 0)
  ref = np.asarray(specjax.generate(target, tp, prompts, lengths, max_new_tokens=n_new,
                                    sampling=specjax.GREEDY).tokens)
  assert len({tuple(col) for col in ref.T}) > 3  # the tokens move: the check can fail
  for gamma in (0, 1, 3):
    run = model_call_loop(target, draft if gamma else None, gamma)
    cache_len = plen + n_new + gamma + 1
    for k in (0, 4, n_new - 1):
      tc = target.init_cache(3, cache_len, plen)
      dc = draft.init_cache(3, cache_len, plen) if gamma else None
      best, drafts, tc, dc = run(tp, dp, prompts, lengths, tc, dc, jnp.int32(k))
      assert best.shape == (3, gamma + 1) and drafts.shape == (3, gamma)
      np.testing.assert_array_equal(np.asarray(best[:, 0]), ref[:, k],
                                    err_msg=f"γ {gamma}, K {k}")
      if gamma and k and isinstance(target, DecoderLM):
        ext = np.zeros((3, plen + k), np.int32)
        for row, n in enumerate(np.asarray(lengths)):
          ext[row, :n + k] = np.concatenate([np.asarray(prompts[row, :n]), ref[row, :k]])
        want = specjax.generate(draft, dp, jnp.asarray(ext), lengths + k, max_new_tokens=gamma,
                                sampling=specjax.GREEDY).tokens
        np.testing.assert_array_equal(np.asarray(drafts), np.asarray(want),
                                      err_msg=f"drafts, γ {gamma}, K {k}")
  with pytest.raises(ValueError, match="gamma"):
    model_call_loop(target, draft, -1)
  with pytest.raises(ValueError, match="draft"):
    model_call_loop(target, None, 2)


@pytest.mark.parametrize("make_pair", [_decoder_pair, _t5_pair], ids=["decoder", "t5"])
def test_measured_alpha_is_the_argmax_agreement(make_pair):
  """The suite's α = E[β] at temperature 0: 1 for a draft that is the
  target; for a real draft, the share of the target's greedy positions where
  the draft's argmax on the same prefix agrees — checked for the decoder
  against a full (uncached) forward over prompt + tokens."""
  import types

  import specjax
  from experiments.programs import peers_suite
  target, tp, draft, dp = make_pair()
  rng = np.random.default_rng(1)
  plen, n_new = 6, 12
  prompts = jnp.asarray(rng.integers(2, target.vocab_size, size=(3, plen)), jnp.int32)
  lengths = jnp.full((3,), plen, jnp.int32)
  tokens = np.asarray(specjax.generate(target, tp, prompts, lengths, max_new_tokens=n_new,
                                       sampling=specjax.GREEDY).tokens)
  pair = lambda m, p: types.SimpleNamespace(target=target, tp=tp, draft=m, dp=p)
  assert peers_suite.measured_alpha(pair(target, tp), prompts, lengths, tokens) == 1.0
  alpha = peers_suite.measured_alpha(pair(draft, dp), prompts, lengths, tokens)
  assert 0.0 <= alpha < 1.0
  if isinstance(target, DecoderLM):
    seq = jnp.concatenate([prompts, jnp.asarray(tokens)], axis=1)
    pick = lambda m, p: np.argmax(np.asarray(m.forward(p, seq))[:, plen - 1:-1], axis=-1)
    assert pick(target, tp).tolist() == tokens.tolist()  # the reference is right
    assert alpha == pytest.approx(np.mean(pick(draft, dp) == tokens), abs=1e-9)


def _goal_results(alpha, measured):
  """A results dict with only what `goals` reads for the batch-8 goal."""
  sp = lambda g, c, v: dict(system="specjax speculative", framework="specjax", batch=8, gamma=g,
                            tokens_per_s=100.0 * g, acceptance_rate=0.5, c=c, verify_cost=v,
                            measured_speedup=measured, predicted_speedup=1.0,
                            loop_overhead=0.0, devices=1)
  rows = [sp(2, 0.05, 1.2), sp(5, 0.05, 3.0)]  # γ 5 is the faster row, γ 2 the better prediction
  return {"pairs": {"x": dict(rows=rows, ratios=[], trained=True, torch_threads=2,
                              batches=[dict(batch=8, alpha=alpha, paired_overhead=None)])}}


def test_batch_goal_gates_on_e_beta_and_projects_the_components():
  from experiments.programs import peers_suite

  def goal(alpha, measured):
    out = [g for g in peers_suite.goals(_goal_results(alpha, measured))
           if "at batch 8 when" in g["goal"]]
    assert len(out) == 1
    return out[0]["status"], out[0]["detail"]

  # γ 2: 1 + 0.7 + 0.49 = 2.19 tokens / (2·0.05 + 1.2) = 1.6846…; γ 5: 2.94117 / 3.25 = 0.905.
  # 1.5× at γ 2 needs 1.95 tokens: 1 + α + α² = 1.95 → α = 0.5954…; at γ 5: 4.875 → α > 0.9.
  status, detail = goal(None, 1.6)
  assert status == "n/a" and "not measured" in detail and "accepted / drafted 0.50" in detail
  assert "predict 1.68× at α = 0.7 (γ = 2" in detail and "needs α ≥ 0.60 (γ = 2)" in detail
  status, detail = goal(0.65, 1.6)
  assert status == "n/a" and "E[β] 0.65 < 0.7" in detail
  assert goal(0.75, 1.6)[0] == "PASS" and goal(0.75, 1.4)[0] == "FAIL"
  assert "at γ = 5, α = E[β] 0.75" in goal(0.75, 1.4)[1]  # the fastest γ is the measured one
  # No α reaches 1.5× when even γ + 1 tokens per call fall short.
  slow = _goal_results(0.9, 1.0)
  for r in slow["pairs"]["x"]["rows"]:
    r["verify_cost"] = 4.0
  assert "no α reaches 1.5× at the measured γ (2, 5)" in peers_suite.batch_goal_projection(
      slow["pairs"]["x"]["rows"])


def test_floor_step_seconds():
  from specjax.measure.timing import floor_step_seconds
  assert floor_step_seconds([3e-3, 1e-3, 2e-3]) == pytest.approx(2e-3)
  assert floor_step_seconds([-1e-4, 1e-9, -2e-5]) == 1e-7  # noise never reads as <= 0
  with pytest.raises(ValueError, match="seconds"):
    floor_step_seconds([])


def test_model_parallel_mesh_choices():
  from experiments.programs import peers_suite
  cfg = lambda k: peers_suite.SuiteConfig(model_parallel=k)
  assert peers_suite.model_parallel_mesh(cfg(1)) == (None, "")  # the default: off
  mesh, note = peers_suite.model_parallel_mesh(cfg(2))
  assert dict(mesh.shape) == {"data": 1, "model": 2} and note == ""
  n = len(jax.devices())
  mesh, note = peers_suite.model_parallel_mesh(cfg(0))  # every device
  assert mesh.shape["model"] == n
  mesh, note = peers_suite.model_parallel_mesh(cfg(n + 1))
  assert mesh is None and f"needs {n + 1} devices" in note and "device_count" in note
  with pytest.raises(ValueError, match="model_parallel must be an int >= 0.*-1"):
    peers_suite.model_parallel_mesh(cfg(-1))


