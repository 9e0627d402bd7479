"""The benchmark suites: stream/latency arithmetic, loop prediction, roofline
bytes against hand counts, and the smoke modes of both scripts (tiny random
models; they check keys and greedy agreement, never timings)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.experiments import peers as bp
from specjax.measure import roofline
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.models.t5 import T5, t5_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def test_step_bytes_decoder_hand_computed():
  # tiny: V 64, E 32, 2 layers, 4 query heads, 2 kv heads, D 8, F 64, untied, float32.
  model = DecoderLM(decoder_config("tiny"))
  b = roofline.step_bytes(model, batch=2, tokens=3, context=5, cache_len=16)
  per_layer = 32 * 4 * 8 * 2 + 32 * 2 * 8 * 2 + 3 * 32 * 64 + 2 * 32  # q,o; k,v; mlp; norms
  weights = 2 * per_layer + 32 + 32 * 64 + 2 * 3 * 32  # + final norm, lm_head, gathered rows
  assert b["weights"] == 4 * weights == 4 * 20832
  slot = 2 * 2 * 2 * 2 * 8 * 4  # K and V × layers × rows × kv heads × D × float32
  assert b["kv_read"] == slot * (5 + 3)
  assert b["kv_read_buffer"] == slot * 16
  assert b["kv_write"] == slot * 3
  assert b["total"] == b["weights"] + slot * 11
  assert b["total_buffer"] == b["weights"] + slot * 19
  # Tied: the embedding is read whole as the output layer, no lm_head.
  tied = DecoderLM(decoder_config("tiny", tie_embeddings=True))
  assert roofline.step_bytes(tied, 2, 3, 5, 16)["weights"] == 4 * (2 * per_layer + 32 + 64 * 32)


def test_step_bytes_t5_hand_computed():
  # t5-v1_1-tiny in bfloat16: V 128, E 32, H 4 × D 8, F 64 (gated), 2 + 2 layers, 8 buckets.
  model = T5(t5_config("t5-v1_1-tiny", dtype="bfloat16", param_dtype="bfloat16"))
  b = roofline.step_bytes(model, batch=1, tokens=4, context=1, cache_len=32, encoder_len=10)
  layer = 2 * 4 * 32 * 32 + 3 * 32 * 64 + 3 * 32  # self + cross attention, gated MLP, 3 norms
  weights = 2 * layer + 8 * 4 + 32 + 32 * 128 + 4 * 32  # relpos, final norm, lm_head, 4 rows
  assert b["weights"] == 2 * weights  # the encoder is never read by a decoder step
  slot = 2 * 2 * 1 * 4 * 8 * 2
  cross = 2 * 2 * 1 * 10 * 4 * 8 * 2
  assert b["kv_read"] == slot * 5 + cross
  assert b["kv_read_buffer"] == slot * 32 + cross
  assert b["kv_write"] == slot * 4
  assert roofline.roofline_s(b["total"], 1e9) == pytest.approx(b["total"] / 1e9)


def test_random_params_match_the_model():
  model = DecoderLM(decoder_config("tiny", dtype="bfloat16", param_dtype="bfloat16"))
  shapes = roofline.param_shapes(model)
  params = roofline.random_params(model, jax.random.PRNGKey(0), shapes)
  for p, s in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(shapes)):
    assert p.shape == s.shape and p.dtype == s.dtype
  assert float(params["final_norm"]["scale"].astype(np.float32).min()) == 1.0
  assert np.isfinite(np.asarray(model.forward(params, np.ones((1, 4), np.int32)))).all()


def _run(args, timeout=900):
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # No 8 fake devices for the scripts.
  res = subprocess.run([sys.executable] + args, cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=timeout)
  assert res.returncode == 0, res.stderr[-3000:]
  return res


def test_peers_t5_pair_every_system_follows_greedy(tmp_path):
  """The T5 pair as the peers suite builds it (tiny random init, exported to
  transformers): transformers greedy, assisted and prompt-lookup generation
  give specjax's greedy tokens (the suite's smoke below runs the decoder
  pair through everything else; the suite's code is shared by both kinds)."""
  from specjax.experiments import peers as bp
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
  assert set(results) == {"meta", "pairs", "goals"}
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


def test_roofline_summary_goals_hand_computed():
  """c, verify cost, the prediction at α = 0.7 and both GPU goals from hand-made rows:
  target t(1) = 10 ms, t(4) = 12 ms; draft t(1) = 1 ms, t(2) = 1.5 ms; γ = 3. The draft
  iteration is 1.5 + 2·1 = 3.5 ms; 1 + 0.7 + 0.49 + 0.343 = 2.533 tokens → 25.33 / 15.5."""
  def rows(batch, x_roof=1.1):
    row = lambda role, model, t, ms: dict(family="decoder", model=model, role=role, batch=batch,
                                          T=t, step_ms=ms, x_roofline=x_roof,
                                          roofline_buffer_ms=ms / x_roof)
    return [row("target", "big", 1, 10.0), row("target", "big", 4, 12.0),
            row("draft", "d", 1, 1.0), row("draft", "d", 2, 1.5)]
  summary, goals = roofline.summarize(rows(8), [3])
  (s,) = summary
  assert s["c"] == pytest.approx(0.1) and s["verify_cost"] == pytest.approx(1.2)
  assert s["predicted_speedup"]["0.7"] == pytest.approx(2.533 * 10 / 15.5)
  assert [g["status"] for g in goals] == ["PASS", "PASS"]
  assert "batch 8 when α = 0.7" in goals[1]["goal"] and goals[1]["detail"].startswith("1.63×")
  _, goals = roofline.summarize(rows(8, x_roof=1.4), [3], batch_goal=(8, 0.7, 1.7))
  assert [g["status"] for g in goals] == ["FAIL", "FAIL"]  # 1.4× its roofline; 1.63 < 1.7
  _, goals = roofline.summarize(rows(1), [3])
  assert len(goals) == 1  # the batch goal only for rows at batch 8


def test_gpu_roofline_cpu_smoke(tmp_path):
  out = tmp_path / "roofline.json"
  res = _run(["benchmarks/gpu_roofline.py", "--cpu_smoke", f"--out={out}"])
  result = json.loads(out.read_text())
  assert result["meta"]["cpu_smoke"] and result["meta"]["platform"] == "cpu"
  assert result["bandwidth"]["bandwidth"] > 0
  targets = {(r["family"], r["T"]) for r in result["rows"] if r["role"] == "target"}
  assert targets == {("t5", 1), ("t5", 4), ("decoder", 1), ("decoder", 4)}
  for r in result["rows"]:
    assert r["step_ms"] > 0 and r["roofline_buffer_ms"] > 0 and r["x_roofline"] > 0
  assert {s["family"] for s in result["summary"]} == {"t5", "decoder"}
  assert len(result["goals"]) == 2 and "x roof" in res.stdout
  layouts = {(r["family"], r["layout"]) for r in result["rows"]}
  assert layouts == {("t5", "standard"), ("decoder", "packed")}  # decoders packed by default


def test_sampling_bench_smoke(tmp_path):
  _run(["benchmarks/sampling_bench.py", "--quick", "--iters=5", "--repeats=1",
        f"--out_dir={tmp_path}"])
  result = json.loads((tmp_path / "sampling.json").read_text())
  (row,) = result["rows"]
  assert row["shape"] == [1, 2048] and row["top_p_same_kept_set"]
  for key in ("draw_categorical_us", "draw_specjax_us", "top_p_sort_us", "top_p_specjax_us"):
    assert row[key] > 0, key
  assert "| [1, 2048] |" in (tmp_path / "sampling.md").read_text()


def test_projections_bench_smoke(tmp_path):
  _run(["benchmarks/projections_bench.py", "--quick", f"--out_dir={tmp_path}"])
  result = json.loads((tmp_path / "projections.json").read_text())
  assert result["meta"]["greedy_tokens_identical"]
  rows = {r["what"]: r for r in result["rows"]}
  # --quick: the two multi-token cells and the batched loop (compile-bound here).
  assert set(rows) == {"step_times B=1 T=3", "step_times B=4 T=3",
                       "generate B=8, ms per step (N=8, P=8)"}
  assert result["meta"]["tuned_matvec_max_rows"] in (0, 2, 3)  # tune_matvec_rows ran
  assert rows["step_times B=1 T=3"]["path"].startswith("one product per token")
  assert rows["step_times B=4 T=3"]["path"] == "one 12-row product (every variant)"
  for row in rows.values():  # tiny model: times near the noise floor, only finite
    values = [row[f"{k}_{x}"] for k in ("packed", "tuned", "standard", "matmul")
              for x in ("ms", "speedup")]
    assert np.isfinite(values).all(), row
    assert row["matmul_speedup"] == 1.0  # the baseline against itself
  assert "| step_times B=1 T=3 |" in (tmp_path / "projections.md").read_text()


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
  from specjax.experiments import peers_suite
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
  from specjax.experiments import peers_suite

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
  from specjax.experiments import peers_suite
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



def test_drafters_bench_smoke(tmp_path):
  """Every drafter family on tiny random models: the report's tables, goals
  and greedy agreement (no timing is asserted); a rerun resumes from the
  finished cells (an unreadable cell file is recomputed by `Stages`, tested with
  the experiments' stages)."""
  args = ["benchmarks/drafters_bench.py", "--smoke", f"--out_dir={tmp_path}",
          f"--work_dir={tmp_path / 'work'}"]
  _run(args)
  results = json.loads((tmp_path / "drafters_smoke.json").read_text())
  res = _run(args)  # resumes: every finished cell is reused as stored, nothing re-measured
  again = json.loads((tmp_path / "drafters_smoke.json").read_text())
  assert again["tasks"] == results["tasks"]
  assert "cell 1/2 summarize T=0 B=2 (reused" in res.stderr
  md = (tmp_path / "drafters_smoke.md").read_text()
  names = {"autoregressive", "classic draft", "prompt lookup", "layer skip", "windowed KV",
           "lookahead", "Medusa chain", "Medusa tree 6", "EAGLE-2", "EAGLE-3"}
  # The tasks' prompts share one shape: the second task's cell runs the first one's programs.
  assert set(results["tasks"]) == {"summarize", "code"}
  assert results["tasks"]["summarize"][0]["warmup_traces"] >= len(names)
  assert results["tasks"]["code"][0]["warmup_traces"] == 0
  for cells in results["tasks"].values():
    assert {(c["temperature"], c["batch"]) for c in cells} == {(0.0, 2)}
    for c in cells:
      assert {r["drafter"] for r in c["rows"]} == names
      for r in c["rows"]:
        assert r["tokens_per_call"] >= 1.0 and np.isfinite(r["speedup"])
        assert r["call_cost"] > 0 and r["call_tokens"] >= 1
        if c["temperature"] == 0 and r["drafter"] != "autoregressive":
          assert r["identical"] is True, (r["drafter"], c["batch"])
        if r["drafter"] in ("EAGLE-2", "EAGLE-3", "classic draft"):  # own weights and state
          assert r["memory"]["params"] > 0 and r["memory"]["state_bytes_per_row"] > 0, r
        if r["drafter"] == "prompt lookup":
          assert r["memory"]["params"] == 0
  goals = {g["goal"]: g["status"] for g in results["goals"]}
  assert goals["one compilation per (drafter, γ, bucket): no trace while timing"] == "PASS"
  assert goals["every drafter exact: greedy output identical to AR"] == "PASS"
  assert "## Goals" in md and "Spec-Bench" in md and "| lookahead |" in md
  assert "## In Spec-Bench's layout" in md and "| EAGLE-2 | " in md
  assert (tmp_path / "drafters_smoke.png").stat().st_size > 0


def test_verify_cost_quick(tmp_path):
  _run(["benchmarks/verify_cost.py", "--quick", f"--out_dir={tmp_path}"])
  results = json.loads((tmp_path / "verify_cost.json").read_text())
  assert {c["model"] for c in results["cells"]} == {"chen", "t5"}
  for c in results["cells"]:
    assert c["ratio"]["1"] == 1.0 and all(v > 0 for v in c["ms"].values())
  assert {(p["model"], p["tokens"]) for p in results["profile"]} == {
      ("chen", 1), ("chen", 5), ("t5", 1), ("t5", 6)}
  for p in results["profile"]:
    assert p["total_us"] > 0 and "projections (q/k/v/o, MLP)" in p["us_per_call"]
  assert {p["model"] for p in results["products"]} == {"chen", "t5"}
  md = (tmp_path / "verify_cost.md").read_text()
  assert "## Where a call's time goes" in md and "## The matrix products alone" in md


def test_long_context_cost_smoke(tmp_path):
  _run(["benchmarks/long_context_cost.py", "--quick", "--repeats=1", f"--out_dir={tmp_path}"])
  result = json.loads((tmp_path / "long_context_cost.json").read_text())
  assert [(r["batch"], r["context"]) for r in result["cells"]] == [(1, 64), (2, 64)]
  for r in result["cells"]:
    assert r["kv_mb"] == pytest.approx(r["batch"] * 64 * 2 * 2 * 2 * 8 * 4 / 1e6)  # tiny: L2 K2 D8
    for key in ("step_ms", "verify_ms", "window_step_ms", "draft_step_ms"):
      assert r[key] > 0, key
    assert set(r["window_predicted"]) == {"0.6", "0.8", "0.9"}
  names = [r["name"] for r in result["formulations"]["rows"]]
  assert len(names) == 5 and names[0].startswith("library")
  md = (tmp_path / "long_context_cost.md").read_text()
  assert "| 1 | 64 |" in md and "five ways" in md


def test_families_config_maps_to_the_benchmark_options(tmp_path):
  """configs/families.py → FamilyOptions: every preset loads, a learned
  drafter whose directory is missing is left out (not an error later)."""
  from configs import families as fam_config
  from specjax.experiments import families
  for preset in ("quick", "full", "smoke"):
    fam_config.get_config(preset)
  with pytest.raises(ValueError, match="unknown preset 'huge'"):
    fam_config.get_config("huge")
  cfg = fam_config.get_config("quick")
  cfg.workdir = str(tmp_path / "w")
  cfg.eagle_dir = str(tmp_path)            # exists
  cfg.medusa_dir = str(tmp_path / "none")  # does not
  cfg.eagle3_dir = str(tmp_path / "none3")  # (not the default: runs/ may hold one)
  opts = families.options(cfg)
  assert opts.eagle_dir == str(tmp_path) and opts.medusa_dir == "" and opts.eagle3_dir == ""
  assert opts.eagle_dynamic == (4, 4, 16) and opts.tasks == ("code", "summarize", "free_text")
  assert opts.out_dir == os.path.join(cfg.workdir, "results") and opts.name == "families"
