"""The cost benchmarks: step bytes and the roofline against hand counts, and
the smoke modes of the roofline, sampling, projections, verify-cost and
long-context-cost scripts (tiny models; keys and greedy agreement, never
timings); the adaptive rule's simulator against hand counts and its smoke
mode (no clock at all)."""

import functools
import json

import jax
import numpy as np
import pytest

from bench_helpers import run_script as _run
from specjax.measure import roofline
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.models.t5 import T5, t5_config


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
  # self attention (q, k, v, o), cross attention (q, o: its keys and values are cached by the
  # prefill, their kernels not read by a step), gated MLP, 3 norms
  layer = 6 * 32 * 32 + 3 * 32 * 64 + 3 * 32
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
  # --quick: one multi-token cell and the batched loop (compile-bound here).
  assert set(rows) == {"step_times B=1 T=3", "generate B=8, ms per step (N=8, P=8)"}
  assert result["meta"]["tuned_matvec_max_rows"] in (0, 2, 3)  # tune_matvec_rows ran
  assert rows["step_times B=1 T=3"]["path"].startswith("one product per token")
  for row in rows.values():  # tiny model: times near the noise floor, only finite
    values = [row[f"{k}_{x}"] for k in ("packed", "tuned", "standard", "matmul")
              for x in ("ms", "speedup")]
    assert np.isfinite(values).all(), row
    assert row["matmul_speedup"] == 1.0  # the baseline against itself
  assert "| step_times B=1 T=3 |" in (tmp_path / "projections.md").read_text()


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


def test_adaptive_cost_smoke(tmp_path):
  _run(["benchmarks/adaptive_cost.py", "--quick", f"--out_dir={tmp_path}"])
  result = json.loads((tmp_path / "adaptive_cost_quick.json").read_text())
  (rows,) = result["pairs"].values()
  assert set(rows) == {"autoregressive", "fixed γ=1", "fixed γ=4", "auto, always 0",
                       "auto, always 1", "auto, always 4", "prompt lookup, fixed γ=4",
                       "prompt lookup auto, always 0"}
  assert rows["autoregressive"]["x_ar_step"] == 1.0   # the baseline against itself
  # Greedy iterations are deterministic: the rigged auto runs as many as its fixed loop.
  assert rows["auto, always 0"]["iterations"] == rows["autoregressive"]["iterations"] == 63
  assert rows["prompt lookup auto, always 0"]["iterations"] == 63   # a plain step per token
  assert "x_its_fixed" in rows["prompt lookup auto, always 0"]
  assert rows["auto, always 4"]["iterations"] == rows["fixed γ=4"]["iterations"]
  assert rows["auto, always 1"]["iterations"] == rows["fixed γ=1"]["iterations"]
  for r in rows.values():
    assert np.isfinite(r["decode_ms_per_iteration"]) and r["call_ms_2_tokens"] > 0
  assert "| auto, always 4 |" in (tmp_path / "adaptive_cost_quick.md").read_text()


@functools.lru_cache(maxsize=1)
def _adaptive_rule_module():
  """benchmarks/adaptive_rule.py as a module (imported once: it defines absl flags)."""
  import importlib.util
  import os
  from bench_helpers import ROOT
  spec = importlib.util.spec_from_file_location(
      "adaptive_rule_bench", os.path.join(ROOT, "benchmarks", "adaptive_rule.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


@pytest.mark.parametrize("alpha, gamma, iterations", [
    (1.0, 4, 13),   # 12 iterations of 5 tokens, then the last 4
    (0.0, 4, 64),   # every draft rejected: one token per iteration
    (1.0, 0, 64)])  # plain steps
def test_adaptive_rule_simulation_hand_counted(alpha, gamma, iterations):
  mod = _adaptive_rule_module()
  rule = mod._Rule(mod.adaptive.AdaptiveGamma())
  costs = (1.0, 1.5, 2.0, 3.0, 5.0)
  r = mod.simulate([lambda pos: alpha] * 2, costs, gamma, rule, seed=0)
  assert r["trace"] == [gamma] * iterations
  assert r["time"] == pytest.approx(iterations * costs[rule.cfg.gammas.index(gamma)])


def test_adaptive_rule_smoke(tmp_path):
  _run(["benchmarks/adaptive_rule.py", "--quick", f"--out_dir={tmp_path}"])
  result = json.loads((tmp_path / "adaptive_rule_quick.json").read_text())
  failing, batch1 = result["cases"]
  assert failing["batch"] == 8 and batch1["batch"] == 1
  for r in (failing, batch1):
    assert r["speed"]["0"] == 1.0 and sum(r["gamma_share"].values()) == pytest.approx(1.0)
  # A row whose drafts fail holds a batch of 8 that waits for it: every fixed γ
  # loses, and the rule keeps (nearly) to plain steps.
  assert max(failing["speed"][g] for g in ("1", "2", "4", "8")) < 0.9
  assert failing["auto_vs_plain"] > 0.9 and failing["gamma_share"]["0"] > 0.6
  # α = 0.8 at batch 1: drafting pays, and the rule finds a γ near the best.
  assert batch1["speed"]["4"] > 1.3 and batch1["auto_vs_best_fixed"] > 0.9
  assert "| α = 0.8, batch 1 |" in (tmp_path / "adaptive_rule_quick.md").read_text()
