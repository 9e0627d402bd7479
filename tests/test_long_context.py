"""Long contexts: chunked prefill, decoding from one prefill, the cost model."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import theory
from specjax.drafters import PromptLookup, WindowedKV
from experiments.programs import long_context as lc
from experiments.programs import long_context_measure as lcm
from specjax.measure import timing
from specjax.models.decoder import DecoderLM, decoder_config

GREEDY = specjax.GREEDY
T1 = specjax.SamplingConfig(temperature=1.0)


@pytest.fixture(scope="module")
def lm():
  model = DecoderLM(decoder_config("tiny", matvec_max_rows=0))
  return model, model.init(jax.random.PRNGKey(3))


def _prompts(b=3, p=37, vocab=64, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.integers(1, vocab, size=(b, p)).astype(np.int32)
  x[:, 20:30] = x[:, 5:15]  # a repeat, so that prompt lookup finds drafts
  lengths = np.array([p, p - 9, 21][:b], np.int32)
  for r, n in enumerate(lengths):
    x[r, n:] = 0
  return jnp.asarray(x), jnp.asarray(lengths)


@pytest.mark.parametrize("chunk", [8, 16, 36])
def test_chunked_prefill_equals_one_call(lm, chunk):
  model, params = lm
  chunked = DecoderLM(model.config.replace(prefill_chunk=chunk))
  x, n = _prompts()
  ref = model.prefill(params, x, n, model.init_cache(3, 48))
  got = chunked.prefill(params, x, n, chunked.init_cache(3, 48))
  np.testing.assert_allclose(got[0], ref[0], atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(got[1], ref[1])
  np.testing.assert_array_equal(got[2].lengths, n)
  for a, b in zip(got[2].k, ref[2].k):  # [B, K, D, S]: every written slot (< P)
    np.testing.assert_allclose(a[..., :37], b[..., :37], atol=1e-5, rtol=1e-5)
  for a, b in zip(got[2].v, ref[2].v):  # [B, K, S, D]
    np.testing.assert_allclose(a[:, :, :37], b[:, :, :37], atol=1e-5, rtol=1e-5)


def test_prefill_chunk_is_checked():
  with pytest.raises(ValueError, match="prefill_chunk must be an int >= 1"):
    decoder_config("tiny", prefill_chunk=0)
  with pytest.raises(TypeError, match="prefill_chunk must be an int"):
    decoder_config("tiny", prefill_chunk=2.5)


def _copy(tree):
  return jax.tree_util.tree_map(jnp.copy, tree)


@pytest.mark.parametrize("sampling", [GREEDY, T1], ids=["greedy", "t1"])
def test_generate_from_a_prefill_equals_generate(lm, sampling):
  model, params = lm
  model = DecoderLM(model.config.replace(prefill_chunk=16))
  x, n = _prompts()
  key = jax.random.key(7)
  ref = specjax.generate(model, params, x, n, max_new_tokens=12, sampling=sampling, key=key)
  pre = specjax.prefill(model, params, x, n, max_new_tokens=12, sampling=sampling, key=key)
  assert isinstance(pre, specjax.Prefill)
  for _ in range(2):  # a copy each time: the decoder donates what it is given
    got = specjax.generate(model, params, x, n, max_new_tokens=12, sampling=sampling, key=key,
                           prefilled=_copy(pre))
    np.testing.assert_array_equal(got.tokens, ref.tokens)


def test_speculative_from_one_prefill_equals_greedy(lm):
  model, params = lm
  x, n = _prompts()
  draft = DecoderLM(decoder_config("tiny", num_layers=1, matvec_max_rows=0))
  dp = draft.init(jax.random.PRNGKey(9))
  ref = specjax.generate(model, params, x, n, max_new_tokens=14, sampling=GREEDY)
  pre = specjax.prefill(model, params, x, n, max_new_tokens=14, gamma=3, sampling=GREEDY)
  drafts = {"lookup": (PromptLookup(max_ngram=3, min_ngram=1), None),
            "window": (WindowedKV.of(model, window=6, sinks=2, gamma=3), None),
            "small": (draft, dp)}
  for name, (d, p) in drafts.items():
    out = specjax.speculative_generate(model, params, d, p, x, n, max_new_tokens=14, gamma=3,
                                       sampling=GREEDY, prefilled=_copy(pre))
    np.testing.assert_array_equal(out.tokens, ref.tokens, err_msg=name)


def test_prefilled_errors(lm):
  model, params = lm
  x, n = _prompts()
  pre = specjax.prefill(model, params, x, n, max_new_tokens=4, sampling=GREEDY)
  with pytest.raises(TypeError, match="prefilled must be a specjax.Prefill"):
    specjax.generate(model, params, x, n, max_new_tokens=4, sampling=GREEDY, prefilled=pre.cache)
  with pytest.raises(ValueError, match="not both"):
    specjax.generate(model, params, x, n, max_new_tokens=4, sampling=GREEDY,
                     prefilled=_copy(pre), cache=model.init_cache(3, 64))
  with pytest.raises(ValueError, match="prefilled.cache has"):
    specjax.generate(model, params, x, n, max_new_tokens=9, sampling=GREEDY,
                     prefilled=_copy(pre))
  with pytest.raises(ValueError, match="prefilled.cache has"):  # γ needs more slots
    specjax.speculative_generate(model, params, PromptLookup(max_ngram=2), None, x, n,
                                 max_new_tokens=4, gamma=3, sampling=GREEDY,
                                 prefilled=_copy(pre))


def test_cache_step_times_checks_room_and_returns_every_t(lm):
  model, params = lm
  with pytest.raises(ValueError, match="exceeds cache_len"):
    timing.cache_step_times(model, params, 2, 20, 18, (1, 5))
  out = timing.cache_step_times(model, params, 2, 24, 18, (1, 5), steps=2, repeats=1)
  assert set(out) == {1, 5} and all(v >= 1e-7 for v in out.values())


def test_cache_step_times_reads_the_injected_clock(lm):
  model, params = lm

  class Clock:  # every reading advances 1 s: each timed call lasts 1 s, whatever its n
    t = 0.0

    def __call__(self):
      self.t += 1.0
      return self.t

  with timing.use_clock(Clock()):
    out = timing.cache_step_times(model, params, 1, 12, 4, (1, 2), steps=2, repeats=1)
  assert out == {1: 1e-7, 2: 1e-7}  # equal time at n and 2n: no cost per call, floored


def test_cost_model_by_hand():
  c = decoder_config("tiny")  # 2 layers, 2 kv heads x 8
  assert lcm.kv_bytes_per_position(c) == 2 * 2 * 2 * 8 * 4
  assert lcm.step_bytes(c, batch=3, context=10) == 4 * c.num_params() + 3 * 10 * 256
  # The speedup the grid predicts: α = 0.5, γ = 2: 1 + 0.5 + 0.25 = 1.75 tokens per
  # iteration; cost 2 · 0.1 + 1.2 = 1.4 steps.
  tokens = theory.expected_tokens_per_call(0.5, 2)
  assert theory.walltime_improvement_from_tokens(tokens, 2, 0.1, 1.2) == pytest.approx(1.75 / 1.4)
  with pytest.raises(ValueError, match="verify_cost"):
    theory.walltime_improvement_from_tokens(tokens, 2, 0.1, 0.0)


def test_package_streams_concatenate_sorted_files_under_headers():
  records = [{"path": "pkg/b.py", "inputs": "B\n"}, {"path": "pkg/a.py", "inputs": "A\n\n"},
             {"path": "other/c.py", "inputs": "C"}, {"path": "top.py", "inputs": "T"}]
  out = lc.package_streams(records, ["pkg", "missing"])
  assert out == {"pkg": "# file: pkg/a.py\nA\n\n# file: pkg/b.py\nB\n\n"}


def test_repo_prompts_are_windows_followed_by_a_continuation():
  streams = {"a": np.arange(0, 60), "b": np.arange(1000, 1030), "short": np.arange(5)}
  out = lcm.repo_prompts(streams, context=10, n=5, continuation=5)
  assert out.shape == (5, 10) and out.dtype == np.int32
  # Round-robin over the long-enough packages (a, b), each row a contiguous window.
  assert [int(r[0]) // 1000 for r in out] == [0, 1, 0, 1, 0]
  for r in out:
    assert np.all(np.diff(r) == 1)
    src = streams["a"] if r[0] < 1000 else streams["b"]
    assert r[-1] + 5 <= src[-1]  # a continuation of >= 5 tokens follows
  assert len({tuple(r) for r in out}) == 5  # distinct windows
  with pytest.raises(ValueError, match="no held-out package has context"):
    lcm.repo_prompts(streams, context=70, n=2, continuation=5)


TRAIN_FILES = ("colorsys.py", "bisect.py", "keyword.py", "fnmatch.py", "stat.py", "glob.py",
               "shlex.py", "textwrap.py")


def _small_stdlib(root):
  """A small copy of the standard library: a few modules to train on and
  the `json` package (held out)."""
  import os
  import shutil
  from experiments.data import code as code_lib
  code_dir = root / "code"
  shutil.copytree(os.path.join(code_lib.stdlib_dir(), "json"), code_dir / "json",
                  ignore=shutil.ignore_patterns("__pycache__"))
  for name in TRAIN_FILES:
    shutil.copy(os.path.join(code_lib.stdlib_dir(), name), code_dir / name)
  return f"dir:{code_dir}"


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory):
  """The micro preset end to end on a small copy of the standard library
  (a few modules to train on, the `json` package held out)."""
  from configs import long_context as lc_config
  root = tmp_path_factory.mktemp("long_context")
  cfg = lc_config.get_config("micro")
  cfg.workdir = str(root / "run")
  cfg.data.cache_dir = str(root / "data")
  cfg.data.code_source = _small_stdlib(root)
  cfg.results_dir = str(root / "results")
  return cfg, lc.run(cfg)


def test_micro_run_measures_every_cell_exactly(micro_run):
  cfg, res = micro_run
  cells = res["cells"]
  assert {(c["context"], c["batch"], c["setting"]) for c in cells} == {
      (s, b, st) for s in cfg.eval.contexts for b in cfg.eval.batches for st in cfg.eval.settings
      if st == "greedy" or b in cfg.eval.sampled_batches}
  assert {c["setting"] for c in cells} == {"greedy", "t1"}
  for c in cells:
    for d in cfg.eval.drafts:
      s = c["summary"][d]
      assert 0.0 <= s["alpha"] <= 1.0
      assert 1.0 <= s["tokens_per_iteration"] <= cfg.eval.gamma + 1
      assert s["speedup"] > 0 and s["tokens_per_call"] >= 1.0 - 1e-9
      if c["setting"] == "greedy":
        assert s["identical"] == 1.0, (c["context"], c["batch"], d)
    comp = c["components"]
    assert {"step_s", "verify_s", "window_s", "small_s"} <= set(comp)
    v = c["summary"]["window@1"]  # the variant: the self-draft again at γ = 1
    assert 1.0 <= v["tokens_per_iteration"] <= 2.0 and v["predicted"] > 0
    if c["setting"] == "greedy":
      assert v["identical"] == 1.0
    a = c["summary"]["lookup@auto"]  # prompt lookup again with gamma="auto"
    assert a["predicted"] is None and 0.0 <= a["alpha"] <= 1.0 and a["speedup"] > 0
    assert set(a["gamma_counts"]) <= {"0", "1", "2", "4", "8"}
    # Every row ran one γ per iteration: per row at least one, at most all new tokens.
    rows = int(math.ceil(max(c["batch"], cfg.eval.min_rows) / c["batch"])) * c["batch"]
    assert rows <= sum(a["gamma_counts"].values()) <= rows * cfg.eval.max_new_tokens
    assert 1.0 <= a["tokens_per_iteration"] <= 9.0
    if c["setting"] == "greedy":
      assert a["identical"] == 1.0
  import os
  for name in ("results.json", "results.md", "speedup_surface.png"):
    assert os.path.exists(os.path.join(cfg.results_dir, name)), name
  md = open(os.path.join(cfg.results_dir, "results.md")).read()
  assert "Crossover" in md and "MagicDec" in md and "NOT IDENTICAL" not in md
  assert "windowed-KV self-draft γ=1" in md
  assert "prompt lookup γ=auto" in md and '## `gamma="auto"`' in md


def test_micro_run_resumes_without_measuring_again(micro_run, monkeypatch):
  cfg, first = micro_run
  from experiments.programs import long_context_measure as lcm

  def fail(*a, **k):
    raise AssertionError("a stored cell was measured again")
  monkeypatch.setattr(lcm, "measure_cell", fail)
  monkeypatch.setattr(lcm, "component_times", fail)
  again = lc.run(cfg)  # models, cells and components all come from the workdir
  assert [c["summary"] for c in again["cells"]] == [c["summary"] for c in first["cells"]]


def test_variants_are_checked():
  from experiments.programs.long_context_report import is_auto, label, parse_variant
  assert parse_variant("window@2") == ("window", 2)
  assert parse_variant("small@auto") == ("small", "auto")
  assert is_auto("small@auto") and not is_auto("small@2") and not is_auto("small")
  assert label("window@2") == "windowed-KV self-draft γ=2" and label("small") == "classic small draft"
  for bad in ("window", "window@0", "nope@2", "window@x", "nope@auto", "window@Auto"):
    with pytest.raises(ValueError, match="<draft>@<gamma>"):
      parse_variant(bad)


def test_auto_is_compared_with_the_same_drafts_best_fixed_gamma():
  from experiments.programs.long_context_report import auto_lines, best_fixed, render
  s = lambda speedup, **kw: dict(alpha=0.5, tokens_per_call=1.5, speedup=speedup,
                                 speedup_end_to_end=1.0, identical=1.0, predicted=1.1, **kw)
  auto = lambda speedup: s(speedup, gamma_counts={"0": 3, "4": 1}) | {"predicted": None}
  cells = [{"context": 512, "batch": 1, "setting": "greedy", "step_mb": 1.0,
            "components": {"step_s": 1e-3, "verify_s": 2e-3},
            "summary": {"lookup": s(1.2), "lookup@2": s(1.5), "window": s(3.0),
                        "lookup@auto": auto(1.44)}},
           {"context": 1024, "batch": 1, "setting": "greedy", "step_mb": 1.0,
            "components": {"step_s": 1e-3, "verify_s": 2e-3},
            "summary": {"lookup": s(0.8), "window": s(0.5), "lookup@auto": auto(0.96)}}]
  # Only the same draft's fixed entries count (the window draft's 3.0x is another draft).
  assert best_fixed(cells[0]["summary"], "lookup@auto") == ("lookup@2", 1.5)
  assert best_fixed(cells[1]["summary"], "lookup@auto") == ("lookup", 0.8)
  res = {"cells": cells, "auto": ["lookup@auto"], "variants": ["lookup@2"], "auto_gammas": [0, 4]}
  (line,) = [x for x in auto_lines(res) if x.startswith("- ")]
  # vs AR 1.44 / 0.96 (median 1.20, one cell >= 0.97); vs best fixed 0.96 / 1.20.
  assert "0.96–1.44× AR over 2 cells (median 1.20; ≥ 0.97× in 1)" in line, line
  assert "0.96–1.20× the draft's best fixed γ (median 1.08; ≥ 0.95× in 2, above it in 1)" in line
  md = render(dict(res, gamma=4, drafts=["lookup", "window"], hardware="cpu", command="x",
                   target_params=1e6, weights_mb=4.0, kv_bytes_per_position=100,
                   max_new_tokens=8, window=16, sinks=2, settings=["greedy"]))
  assert "**1.44x** (γ 0: 75%, 4: 25%; 1.00)" in md
  # The goal counts only entries with a prediction (auto has none): 1.2 / 1.1 is within 15%.
  assert "Measured within 15% of the components' prediction: 1 of 5" in md


def test_crossover_is_the_context_from_which_speculation_stays_ahead():
  from experiments.programs.long_context_report import crossovers
  cell = lambda ctx, b, s: {"context": ctx, "batch": b, "setting": "greedy",
                            "summary": {"window": {"speedup": s}}}
  cells = [cell(512, 1, 0.8), cell(1024, 1, 1.1), cell(2048, 1, 0.9), cell(4096, 1, 1.3),
           cell(512, 16, 1.2), cell(1024, 16, 1.4), cell(512, 4, 0.7)]
  assert crossovers(cells, "window", "greedy") == {1: 4096, 4: None, 16: 512}


def test_the_demo_compares_prompt_lookup_fixed_and_auto_on_code(tmp_path):
  """The demo (`experiments/demo.py`, tiny preset) on the small standard
  library copy: trains, decodes, checks every output against plain greedy
  decoding, reports what auto chose; a rerun reuses the trained target."""
  from configs import demo as demo_config
  from experiments.programs import demo
  cfg = demo_config.get_config("tiny")
  cfg.workdir = str(tmp_path / "run")
  cfg.data.cache_dir = str(tmp_path / "data")
  cfg.data.code_source = _small_stdlib(tmp_path)
  res = demo.run(cfg)
  for name in ("lookup", "lookup_auto"):
    r = res["drafters"][name]
    assert r["greedy_outputs_identical"], name
    assert r["tokens_per_target_call"] >= 1.0 and np.isfinite(r["speedup"]) and r["speedup"] > 0
  chosen = res["drafters"]["lookup_auto"]["gamma_chosen"]
  assert set(chosen) <= {"0", "1", "2", "4", "8"} and sum(chosen.values()) > 0
  assert (tmp_path / "run" / "demo.json").exists()
  with pytest.raises(ValueError, match="config.drafters"):
    cfg.drafters = "eagle"
    demo.run(cfg)
