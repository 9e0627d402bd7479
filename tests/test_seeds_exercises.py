"""The seeds' analysis exercises: each function on cases with known answers,
and `experiments/seeds_exercises.py` writing its files."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from specjax import theory
from experiments.programs import seeds
from specjax.measure.beta import alpha_vs_kl
from specjax.planning import draft_memory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _t(alpha, k):
  """Tokens per call, written out: 1 + α + ... + α^k."""
  return sum(alpha ** i for i in range(k + 1))


# -----------------------------------------------------------------------------
# 1. Tokens per call vs N.
# -----------------------------------------------------------------------------


def test_curve_known_values():
  r = theory.tokens_per_call_curve([0.0, 0.5, 1.0], n_max=6, cost_ratio=0.05)
  np.testing.assert_array_equal(r["n"], np.arange(1, 7))
  np.testing.assert_allclose(r["tokens"][0], 1.0)                     # α = 0: one token
  np.testing.assert_allclose(r["tokens"][2], np.arange(1, 7) + 1.0)   # α = 1: N + 1
  np.testing.assert_allclose(r["tokens"][1], [_t(0.5, n) for n in range(1, 7)])
  np.testing.assert_allclose(r["cost"], 1.0 + 0.05 * np.arange(1, 7))
  np.testing.assert_allclose(r["speedup"], r["tokens"] / r["cost"])
  np.testing.assert_allclose(r["tokens_limit"], [1.0, 2.0, np.inf])
  # α = 0.5, c = 0.05: 1.5/1.05, 1.75/1.1, 1.875/1.15, 1.9375/1.2 -> N* = 3.
  assert r["optimal_n"][1] == 3
  assert r["optimal_speedup"][1] == pytest.approx(1.875 / 1.15)
  assert r["optimal_tokens"][1] == pytest.approx(1.875)
  assert r["optimal_n"][0] == 1   # α = 0: one token whatever N, so the cheapest N
  assert r["optimal_n"][2] == 6   # α = 1 with c < 1: the longest draft


def test_curve_matches_optimal_gamma_and_free_drafts():
  alphas = [0.5, 0.7, 0.85]
  for c in (0.01, 0.05, 0.2):
    r = theory.tokens_per_call_curve(alphas, 32, c, 0.0)
    np.testing.assert_array_equal(r["optimal_n"], theory.optimal_gamma(alphas, c, 32))
  # Free drafts and verification: longer is always better.
  r = theory.tokens_per_call_curve(alphas, 12, 0.0, 0.0)
  np.testing.assert_array_equal(r["optimal_n"], [12, 12, 12])
  # A fixed verify overhead divides every speedup by 1 + ε (c = 0): same N*.
  r1 = theory.tokens_per_call_curve(alphas, 12, 0.05, 0.0)
  r2 = theory.tokens_per_call_curve(alphas, 12, 0.0, 0.2)
  np.testing.assert_allclose(r2["speedup"], r2["tokens"] / 1.2)
  assert list(r1["optimal_n"]) == [3, 6, 10]  # the exercise's answer at c = 0.05


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(alphas=[0.5, 1.5]), ValueError, r"alphas must lie in \[0, 1\]"),
    (dict(alphas=[[0.5]]), ValueError, "alphas must be a scalar or a non-empty 1-D"),
    (dict(n_max=0), ValueError, "n_max must be an int >= 1"),
    (dict(cost_ratio=-0.1), ValueError, "cost_ratio must be >= 0"),
    (dict(verify_overhead=[0.1, 0.2]), ValueError, "verify_overhead must be a scalar"),
])
def test_curve_errors(kwargs, error, pattern):
  args = dict(alphas=[0.5], n_max=4)
  args.update(kwargs)
  with pytest.raises(error, match=pattern):
    theory.tokens_per_call_curve(**args)


# -----------------------------------------------------------------------------
# 2. The α a speedup needs.
# -----------------------------------------------------------------------------


def test_alpha_for_speedup_linear_by_hand():
  # (S (1 + ε) − 1) / K at K = 5, ε = 0.15.
  assert theory.alpha_for_speedup(2.0, 5, 0.15, model="linear") == pytest.approx(0.26)
  assert theory.alpha_for_speedup(3.0, 5, 0.15, model="linear") == pytest.approx(0.49)
  # Sensitivity: dα/dε = S / K exactly.
  eps = np.array([0.0, 0.1, 0.2])
  np.testing.assert_allclose(np.diff(theory.alpha_for_speedup(2.0, 5, eps, model="linear")),
                             [0.1 * 2 / 5] * 2)


def test_alpha_for_speedup_geometric_inverts_tokens():
  for s in (1.5, 2.0, 3.0):
    a = theory.alpha_for_speedup(s, 5, 0.15)
    assert _t(a, 5) == pytest.approx(s * 1.15, rel=1e-12)
  assert theory.alpha_for_speedup(2.0, 5, 0.15) == pytest.approx(0.582139, abs=1e-6)
  assert theory.alpha_for_speedup(3.0, 5, 0.15) == pytest.approx(0.771056, abs=1e-6)
  # The geometric model needs more α than the linear rule.
  assert theory.alpha_for_speedup(2.0, 5, 0.15) > theory.alpha_for_speedup(2.0, 5, 0.15,
                                                                           model="linear")
  # α = 1 gives (K + 1)/(1 + ε); past it: unreachable (NaN); below 1/(1 + ε): 0.
  assert theory.alpha_for_speedup(6 / 1.15, 5, 0.15) == pytest.approx(1.0)
  assert np.isnan(theory.alpha_for_speedup(6 / 1.15 + 0.01, 5, 0.15))
  assert np.isnan(theory.alpha_for_speedup(3.0, 5, 0.15 + 1.0, model="linear"))
  assert theory.alpha_for_speedup(0.5, 5, 0.15) == 0.0
  # A draft cost c adds K·c to the overhead.
  assert theory.alpha_for_speedup(2.0, 5, 0.05, cost_ratio=0.02) == pytest.approx(
      theory.alpha_for_speedup(2.0, 5, 0.15))
  # More overhead needs more α.
  alphas = theory.alpha_for_speedup(2.0, 5, np.linspace(0.0, 0.5, 6))
  assert np.all(np.diff(alphas) > 0)


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(model="cubic"), ValueError, "model must be one of"),
    (dict(k=0), ValueError, "k must be an integer >= 1"),
    (dict(speedup=0.0), ValueError, "speedup must be > 0"),
    (dict(overhead=-1.0), ValueError, "overhead must be >= 0"),
])
def test_alpha_for_speedup_errors(kwargs, error, pattern):
  args = dict(speedup=2.0, k=5)
  args.update(kwargs)
  with pytest.raises(error, match=pattern):
    theory.alpha_for_speedup(**args)


# -----------------------------------------------------------------------------
# 3. Traffic mix.
# -----------------------------------------------------------------------------


def test_traffic_mix_by_hand():
  t1, t2 = _t(0.7, 5), _t(0.4, 5)
  calls = theory.traffic_mix([0.7, 0.3], [0.7, 0.4], 5, overhead=0.15, share_of="calls")
  assert calls["tokens_per_call"] == pytest.approx(0.7 * t1 + 0.3 * t2)
  tokens = theory.traffic_mix([0.7, 0.3], [0.7, 0.4], 5, overhead=0.15)
  assert tokens["tokens_per_call"] == pytest.approx(1.0 / (0.7 / t1 + 0.3 / t2))
  w1, w2 = 0.7 / t1, 0.3 / t2
  assert tokens["call_shares"] == pytest.approx([w1 / (w1 + w2), w2 / (w1 + w2)])
  assert tokens["call_weighted_alpha"] == pytest.approx((0.7 * w1 + 0.4 * w2) / (w1 + w2))
  for r in (calls, tokens):
    assert r["mean_alpha"] == pytest.approx(0.61)
    assert r["class_tokens_per_call"] == pytest.approx([t1, t2])
    assert r["tokens_at_mean_alpha"] == pytest.approx(_t(0.61, 5))
    assert r["iteration_cost"] == pytest.approx(1.15)
    assert r["speedup"] == pytest.approx(r["tokens_per_call"] / 1.15)
    assert r["pays"] and r["meets_gate"] and r["classes_below_gate"] == [1]
    assert _t(r["breakeven_alpha"], 5) == pytest.approx(1.15)
  # Token shares weigh the slow class by its extra calls: below the call-share mix.
  assert tokens["tokens_per_call"] < tokens["tokens_at_mean_alpha"] < calls["tokens_per_call"]


def test_traffic_mix_edge_cases():
  one = theory.traffic_mix([1.0], [1.0], 4, overhead=0.0)
  assert one["tokens_per_call"] == 5.0 and one["speedup"] == 5.0
  # At the overhead where the break-even is 0.55, a mix at α 0.4 does not pay.
  eps = _t(0.55, 5) - 1.0
  low = theory.traffic_mix([0.5, 0.5], [0.4, 0.45], 5, overhead=eps)
  assert not low["pays"] and not low["meets_gate"]
  assert low["breakeven_alpha"] == pytest.approx(0.55)


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(shares=[0.7, 0.2]), ValueError, "shares must sum to 1"),
    (dict(shares=[1.0]), ValueError, "one entry per class"),
    (dict(alphas=[0.7, 1.4]), ValueError, r"alphas must lie in \[0, 1\]"),
    (dict(share_of="requests"), ValueError, "share_of must be one of"),
    (dict(k=2.0), TypeError, "k must be an int >= 1, got 2.0"),
])
def test_traffic_mix_errors(kwargs, error, pattern):
  args = dict(shares=[0.7, 0.3], alphas=[0.7, 0.4], k=5)
  args.update(kwargs)
  with pytest.raises(error, match=pattern):
    theory.traffic_mix(**args)


# -----------------------------------------------------------------------------
# 4. Memory.
# -----------------------------------------------------------------------------


TINY = dict(hidden=4, num_heads=2, num_kv_heads=1, head_dim=2, intermediate=8, vocab=10)


def test_classic_draft_memory_by_hand():
  # Embedding 10*4; per layer q 16, k 8, v 8, o 16, MLP 3*4*8 = 96, norms 8:
  # 152 per layer, 2 layers; the final norm 4.
  m = draft_memory.classic_draft_memory(num_layers=2, **TINY)
  assert m["params"] == 40 + 2 * 152 + 4 == 348
  assert m["weight_bytes"] == 2 * 348
  assert m["kv_bytes_per_token"] == 2 * 2 * 1 * 2 * 2  # K and V, 2 layers, 1 head of 2, bf16
  assert draft_memory.classic_draft_memory(num_layers=2, tied_embeddings=False, **TINY)["params"] \
      == 348 + 40
  assert draft_memory.classic_draft_memory(num_layers=2, bytes_per_param=4, **TINY)[
      "kv_bytes_per_token"] == 32


def test_eagle3_head_memory_by_hand():
  # fc 3*4*4 = 48; q reads 2*4: 8*4 = 32, k 8*2 = 16, v 16; o 16; MLP 96; 4 norms 16.
  m = draft_memory.eagle3_head_memory(**TINY)
  assert m["params"] == 48 + 32 + 16 + 16 + 16 + 96 + 16 == 240
  assert m["kv_bytes_per_token"] == 2 * 1 * 1 * 2 * 2  # one layer
  assert draft_memory.eagle3_head_memory(draft_vocab=6, **TINY)["params"] == 240 + 24
  plain = draft_memory.eagle3_head_memory(fused_layers=1, attention_input_factor=1, **TINY)
  assert plain["params"] == 16 + 16 + 8 + 8 + 16 + 96 + 16


def test_llama_shapes():
  one_b = draft_memory.classic_draft_memory(**{k: v for k, v in seeds.LLAMA_3_2_1B.items()})
  assert one_b["params"] == 1_235_814_400  # Llama-3.2-1B's published count
  seventy = draft_memory.classic_draft_memory(**seeds.LLAMA_3_3_70B)
  assert seventy["params"] == 70_553_706_496  # Llama-3.3-70B's
  assert seventy["kv_bytes_per_token"] == 2 * 80 * 8 * 128 * 2
  r = seeds.memory_exercise()
  assert r["eagle3_draft_vocab_32k"]["kv_bytes_per_token"] == 4096
  assert one_b["kv_bytes_per_token"] == 32768
  assert r["ratios_to_classic"]["eagle3_draft_vocab_32k"]["kv_bytes_per_token"] == 0.125


@pytest.mark.parametrize("fn, kwargs, error, pattern", [
    (draft_memory.classic_draft_memory, dict(num_layers=2, num_kv_heads=3), ValueError,
     "num_heads must be a multiple of num_kv_heads"),
    (draft_memory.classic_draft_memory, dict(num_layers=0), ValueError, "num_layers must be an"),
    (draft_memory.classic_draft_memory, dict(num_layers=2, tied_embeddings="yes"), TypeError,
     "tied_embeddings must be a bool"),
    (draft_memory.eagle3_head_memory, dict(draft_vocab=11), ValueError, r"draft_vocab must lie in"),
    (draft_memory.eagle3_head_memory, dict(bytes_per_param=0), ValueError,
     "bytes_per_param must be a finite number > 0"),
])
def test_memory_errors(fn, kwargs, error, pattern):
  args = dict(TINY)
  args.update(kwargs)
  with pytest.raises(error, match=pattern):
    fn(**args)


# -----------------------------------------------------------------------------
# 5. α against KL.
# -----------------------------------------------------------------------------


def test_alpha_vs_kl_by_hand():
  # p = (1/2, 1/2), q = (1/4, 3/4) at T = 1.
  r = alpha_vs_kl(np.log([0.5, 0.5]), np.log([0.25, 0.75]), [1.0])
  assert r["alpha"][0] == pytest.approx(0.25 + 0.5)
  assert r["kl_pq"][0] == pytest.approx(0.5 * np.log(2.0) + 0.5 * np.log(0.5 / 0.75))
  assert r["kl_qp"][0] == pytest.approx(0.25 * np.log(0.5) + 0.75 * np.log(1.5))
  # At T = 0.5 both square and renormalise: q ∝ (1, 9).
  r = alpha_vs_kl(np.log([0.5, 0.5]), np.log([0.25, 0.75]), [0.5])
  assert r["alpha"][0] == pytest.approx(0.1 + 0.5)


def test_alpha_is_one_exactly_when_kl_is_zero():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(5, 7))
  same = alpha_vs_kl(logits, logits, [0.3, 1.0, 3.0])
  np.testing.assert_allclose(same["alpha"], 1.0)
  np.testing.assert_allclose(same["kl_pq"], 0.0, atol=1e-12)
  np.testing.assert_allclose(same["kl_qp"], 0.0, atol=1e-12)
  other = alpha_vs_kl(logits, logits + rng.normal(size=(5, 7)), [0.3, 1.0, 3.0])
  assert np.all(other["alpha"] < 1.0) and np.all(other["kl_pq"] > 0)
  # Pinsker: 1 − α = TV <= sqrt(KL/2), either direction.
  for kl in (other["kl_pq"], other["kl_qp"]):
    assert np.all(other["alpha"] >= 1.0 - np.sqrt(kl / 2.0))
  # Very high temperature: both near uniform.
  assert alpha_vs_kl(logits, -logits, [1e4])["alpha"][0] == pytest.approx(1.0, abs=1e-3)


def test_alpha_vs_kl_broadcast_weights_and_masks():
  rng = np.random.default_rng(1)
  unigram, bigram = rng.normal(size=6), rng.normal(size=(3, 6))
  w = np.array([1.0, 2.0, 1.0])
  r = alpha_vs_kl(unigram, bigram, [0.7], weights=w)
  rows = [alpha_vs_kl(unigram, bigram[i], [0.7]) for i in range(3)]
  assert r["alpha"][0] == pytest.approx(sum(w[i] * rows[i]["alpha"][0] for i in range(3)) / 4)
  assert r["kl_pq"][0] == pytest.approx(sum(w[i] * rows[i]["kl_pq"][0] for i in range(3)) / 4)
  # A token the draft masks but the target can emit: KL(q‖p) is infinite.
  masked = alpha_vs_kl(np.array([0.0, -np.inf]), np.array([0.0, 0.0]), [1.0])
  assert masked["alpha"][0] == pytest.approx(0.5)
  assert masked["kl_pq"][0] == pytest.approx(np.log(2.0)) and np.isinf(masked["kl_qp"][0])


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(temperatures=[0.0]), ValueError, "temperatures must be finite and > 0"),
    (dict(temperatures=[]), ValueError, "temperatures must be one or more"),
    (dict(q_logits=np.zeros((2, 4))), ValueError, "must broadcast together"),
    (dict(weights=[1.0]), ValueError, "weights must have the contexts' shape"),
    (dict(weights=[0.0, 0.0]), ValueError, "not all 0"),
    (dict(p_logits=np.full((2, 3), np.nan)), ValueError, "p_logits must be finite or -inf"),
    (dict(q_logits="logits"), TypeError, "q_logits must be an array of real logits"),
])
def test_alpha_vs_kl_errors(kwargs, error, pattern):
  args = dict(p_logits=np.zeros((2, 3)), q_logits=np.zeros((2, 3)), temperatures=[1.0])
  args.update(kwargs)
  with pytest.raises(error, match=pattern):
    alpha_vs_kl(**args)


# -----------------------------------------------------------------------------
# The script.
# -----------------------------------------------------------------------------


def test_script_writes_the_results(tmp_path):
  out = tmp_path / "seeds"
  r = subprocess.run([sys.executable, os.path.join(REPO, "experiments", "seeds_exercises.py"),
                      "--quick", f"--out_dir={out}"], cwd=REPO, capture_output=True, text=True,
                     timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  names = sorted(os.listdir(out))
  assert names == sorted(["exercises.json", "exercises.md", *seeds.PLOTS.values()])
  for png in seeds.PLOTS.values():
    with open(out / png, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n", png
  with open(out / "exercises.json", encoding="utf-8") as f:
    d = json.load(f)
  assert d["setting"] == "quick"
  assert d["tokens_per_call_vs_n"]["optimal_n"] == [3, 6, 10]
  assert d["alpha_for_speedup"]["models"]["linear"]["alpha"]["2x"] == pytest.approx(0.26)
  mix = d["traffic_mix"]["scenarios"]["batch1/tokens"]
  assert mix["mean_alpha"] == pytest.approx(0.61) and mix["pays"] is True
  assert d["eagle3_memory"]["classic_llama_3_2_1b"]["params"] == 1_235_814_400
  kl = d["alpha_vs_kl"]
  assert kl["temperatures"] == [0.1, 0.5, 1.0, 2.0]
  for draft in kl["drafts"].values():
    assert len(draft["alpha"]) == 4 and draft["pinsker_holds"] is True
    assert all(0.0 < a < 1.0 for a in draft["alpha"])
  q = kl["quality_sweep"]
  assert q["alpha"][-1] == pytest.approx(1.0) and q["kl_pq"][-1] == pytest.approx(0.0, abs=1e-9)
  text = (out / "exercises.md").read_text(encoding="utf-8")
  for n in range(1, 6):
    assert f"## {n}." in text
  assert text in r.stdout  # the script prints the report
