"""The Chen et al. reproduction: lossless code vocabulary, quality checks, and
the micro preset end to end on fixture data."""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from configs import chen_chinchilla as chen_config
from specjax.checkpoints.orbax_io import restore_model
from specjax.drafters import load_parallel_draft, read_agreement
from experiments.data import build_task
from experiments.data import code as code_lib
from experiments.data.code_vocab import code_sentences, round_trip_failures, train_code_sentencepiece
from experiments.programs import chen, chen_quality, notebooks
from specjax.tokenizers.sentencepiece import SentencePieceTokenizer

@pytest.fixture(scope="module")
def fixture_data(tmp_path_factory):
  """The data colab/chen_chinchilla.ipynb writes under SPECJAX_NOTEBOOK_WORKDIR
  = root (the notebook test then reuses the micro run)."""
  root = tmp_path_factory.mktemp("chen")
  samples = notebooks.write_sample_tasks(str(root / "specjax_nb_data"))
  return root, samples["code"], samples["summarize_chen"]


@pytest.fixture(scope="module")
def code_tokenizer(fixture_data):
  root, code_source, summ_source = fixture_data
  cache = str(root / "specjax_nb_data" / "cache")
  build_task("code_python", cache, source=code_source, show_progress=False)
  build_task("summarize_debian", cache, source=summ_source, show_progress=False)
  path = train_code_sentencepiece(cache, 400, max_sentences=2000)
  assert train_code_sentencepiece(cache, 400, max_sentences=2000) == path  # reused
  return SentencePieceTokenizer(path), cache


def test_code_sentences_concatenate_back():
  text = "def f(x):\n    return x\n\n\nclass A:\n\tpass\n" * 7
  chunks = list(code_sentences(text, lines_per_sentence=4))
  assert "".join(chunks) == text and all(c.count("\n") <= 4 for c in chunks)
  long_line = "x = '" + "é" * 5000 + "'\n"
  pieces = list(code_sentences(long_line, max_bytes=1000))
  assert "".join(pieces) == long_line and all(len(p.encode()) <= 1000 for p in pieces)


def test_code_vocab_round_trips_python_exactly(code_tokenizer):
  tok, _ = code_tokenizer
  problems = code_lib.read_humaneval()
  texts = [p["prompt"] for p in problems]
  texts += [p["prompt"] + p["canonical_solution"] for p in problems]
  texts += ["\tif x:\n\t\treturn  'a  b'\n", "  \n\n    \n", "naïve — 日本語 😀\r\n", ""]
  assert round_trip_failures(tok, texts) == []
  pieces = tok.processor.encode("def f():\n    return 1\n", out_type=str)
  assert "\n" in pieces and "\u2581" * 4 in pieces  # newline and indent are single pieces


def test_code_vocab_keeps_the_summary_space(code_tokenizer):
  tok, _ = code_tokenizer
  prompt = tok.encode("some text Summary:", add_eos=False)
  target = tok.encode(" python module", add_eos=False)
  assert tok.decode(prompt + target) == "some text Summary: python module"


def test_bootstrap_and_tests_are_sane():
  rng = np.random.default_rng(0)
  x = rng.normal(size=400)
  ci = chen_quality.bootstrap_mean(x, 500)
  assert ci["lo"] < x.mean() < ci["hi"] and ci["hi"] - ci["lo"] < 0.4
  assert chen_quality.paired_bootstrap_diff(x, x + 1.0, 200)["contains_zero"] is False
  assert chen_quality.paired_bootstrap_diff(x, x, 200)["contains_zero"] is True
  same = chen_quality.first_token_test(list(rng.integers(0, 4, 300)), list(rng.integers(0, 4, 300)))
  diff = chen_quality.first_token_test([0] * 150 + [1] * 150, [2] * 150 + [1] * 150)
  assert same["p_value"] > 0.001 and diff["p_value"] < 1e-6
  assert chen_quality.ks_test(rng.normal(size=200), rng.normal(3, 1, 200))["p_value"] < 1e-6
  assert chen_quality.truncate_completion("    return 1\ndef g():\n") == "    return 1"
  assert chen_quality.parses("def f():\n    return 1\n") and not chen_quality.parses("def f(:\n")


class _WordTok:
  """A rigged tokenizer: ids index a word list, EOS = 0."""
  eos_id = 0

  def __init__(self, words):
    self.words = ["</s>"] + list(words)

  def decode(self, ids):
    return " ".join(self.words[i] for i in ids)


def test_trivial_baselines_on_rigged_samples():
  assert chen_quality.lead_words("a b  c d", 2) == "a b" and chen_quality.lead_words("a", 0) == ""
  assert chen_quality.unigram_entropy([[3, 3], [5, 5]]) == pytest.approx(np.log(2))
  assert chen_quality.unigram_entropy([[7] * 9]) == pytest.approx(0.0)
  assert chen_quality.unigram_entropy([]) is None
  scores, n = chen_quality.lead_baseline(["red fox jumps high today"] * 2, ["red fox jumps"] * 2)
  assert n == 3 and scores == pytest.approx([1.0, 1.0])
  from ml_collections import ConfigDict
  ev = ConfigDict(dict(bootstrap=50, humaneval_harness="off", harness_min_parse=0.5,
                       harness_timeout_s=1.0))
  tok = _WordTok(["red", "fox", "jumps", "blue", "cat"])
  recs = [{"inputs": "red fox jumps over it", "targets": "red fox jumps"}] * 4
  ar = [[4, 5, 0, 1], [4, 5, 0, 1], [1, 2, 3, 0], [4, 5, 0, 2]]   # "blue cat" x3, the lead once
  q = chen_quality.compare_samples("xsum", tok, recs, ar, ar, ev)
  assert q["rouge2_lead"]["mean"] == pytest.approx(1.0) and q["rouge2_lead"]["words"] == 3
  assert q["rouge2_ar"]["mean"] == pytest.approx(0.25)
  assert q["rouge2_ar_minus_lead"]["mean"] == pytest.approx(-0.75)
  code = _WordTok(["pass", "(", "return"])
  he = [{"inputs": 'def f():\n    """Doc."""\n', "task_id": "t"}] * 2
  q = chen_quality.compare_samples("humaneval", code, he, [[2], [2]], [[2], [2]], ev)
  assert q["parse_empty"]["mean"] == 1.0 and q["parse_ar"]["mean"] == 0.0


def test_unigram_baselines_read_the_validation_splits(code_tokenizer):
  tok, cache = code_tokenizer
  cfg = chen_config.get_config("micro")
  cfg.data.cache_dir = cache
  out = chen.unigram_baselines(cfg, tok)
  assert set(out) == {"code", "summarize"}
  for v in out.values():   # nats per token: above 0, below a uniform draw over the vocabulary
    assert v is None or 0.0 < v < np.log(tok.vocab_size)
  assert any(v is not None for v in out.values())


def test_report_states_quality_against_the_trivial_baselines():
  from experiments.programs import chen_report
  ci = lambda m, lo, hi: {"mean": m, "lo": lo, "hi": hi, "n": 32}
  results = {
      "models": {"target": {"train": {"eval_ce": {"code": 2.0, "summarize": 5.5}}}},
      "baselines": {"unigram_ce": {"code": 4.0, "summarize": 5.0}},
      "settings": {
          "xsum_nucleus": {"quality": {"rouge2_ar": ci(0.02, 0.01, 0.03),
                                       "rouge2_lead": dict(ci(0.12, 0.08, 0.16), words=6),
                                       "rouge2_ar_minus_lead": ci(-0.10, -0.14, -0.06)}},
          "xsum_greedy": {"quality": {"rouge2_ar": ci(0.2, 0.15, 0.25),
                                      "rouge2_lead": dict(ci(0.12, 0.08, 0.16), words=6),
                                      "rouge2_ar_minus_lead": ci(0.08, 0.02, 0.14)}},
          "humaneval_nucleus": {"quality": {"parse_ar": ci(0.3, 0.2, 0.4),
                                            "parse_empty": ci(1.0, 1.0, 1.0)}}}}
  lines = chen_report.baseline_lines(results)
  assert len(lines) == 4
  assert "code 2.000 vs 4.000 nats (perplexity 7 vs 55: below it)" in lines[0]
  assert "synopsis 5.500 vs 5.000 nats (perplexity 245 vs 148: not below it)" in lines[0]
  assert lines[1].startswith("- xsum_nucleus: ROUGE-2 AR 0.020 [0.010, 0.030] vs the lead 6 words")
  assert "**below** the trivial baseline" in lines[1]
  assert "**above** the trivial baseline" in lines[2]
  assert "empty completion (the prompt alone) 1.00 [1.00, 1.00]" in lines[3]
  assert chen_report.baseline_lines({"settings": {}}) == []   # an older results.json


def test_harness_runs_sandboxed_with_a_timeout():
  problems = code_lib.read_humaneval()[:2]
  probs = [{k: p[k] for k in ("task_id", "prompt", "test", "entry_point")} for p in problems]
  res = chen_quality.run_humaneval_harness(
      probs, [problems[0]["canonical_solution"], "    while True:\n        pass\n"], timeout_s=1.0)
  assert res == [True, False]


@pytest.fixture(scope="module")
def micro_run(fixture_data):
  root, code_source, summ_source = fixture_data
  cfg = chen_config.get_config("micro")
  cfg.workdir = str(root / "specjax_nb_chen_chinchilla")
  cfg.data.cache_dir = str(root / "specjax_nb_data" / "cache")
  cfg.data.code_source = code_source
  cfg.data.summarize_source = summ_source
  return cfg, chen.run(cfg)


def test_the_notebook_reruns_the_micro_run(micro_run, monkeypatch):
  """colab/chen_chinchilla.ipynb top to bottom: the same run, every stage reused."""
  from notebook_helpers import run_notebook
  cfg, _ = micro_run
  run_notebook("chen_chinchilla.ipynb", monkeypatch, os.path.dirname(cfg.workdir))


def test_micro_preset_end_to_end(micro_run):
  cfg, results = micro_run
  out = results["_out_dir"]
  for name in ("results.json", "results.md", "ms_per_token_vs_K.png", "acceptance_vs_K.png",
               "speedup_vs_batch.png"):
    assert os.path.getsize(os.path.join(out, name)) > 0, name
  with open(os.path.join(out, "results.json")) as f:
    stored = json.load(f)
  assert set(stored["settings"]) == {"xsum_nucleus", "xsum_greedy", "humaneval_nucleus"}
  for name, s in stored["settings"].items():
    assert [r["k"] for r in s["k_sweep"]] == list(cfg.eval.ks)
    for r in s["k_sweep"]:
      assert r["ms_per_token"] > 0 and r["speedup"] > 0
      if r["k"]:
        assert 0.0 <= r["acceptance_rate"] <= 1.0
        assert 1.0 <= r["tokens_per_iteration"] <= r["k"] + 1
    assert 0.0 <= s["alpha"]["alpha"] <= 1.0
    assert s["quality"]["num_samples"] == stored["tasks"][s["task"]]["num_prompts"]
    # Eos is ignored: every sample has exactly max_new_tokens tokens.
    assert s["cells"]["ar"]["tokens"] == cfg.eval.max_new_tokens * s["quality"]["num_samples"]
  greedy = stored["settings"]["xsum_greedy"]
  assert all(r["identical_fraction"] == 1.0 for r in greedy["k_sweep"] if r["k"])
  assert greedy["quality"]["rouge2_diff"]["mean"] == 0.0
  nucleus = stored["settings"]["xsum_nucleus"]["quality"]
  assert nucleus["target_logprob"]["outside_support_ar"] == 0.0
  # The trivial baselines beside the autoregressive quality.
  assert "rouge2_lead" in nucleus and "parse_empty" in stored["settings"]["humaneval_nucleus"][
      "quality"]
  assert set(stored["baselines"]["unigram_ce"]) == {"code", "summarize"}
  with open(os.path.join(out, "results.md")) as f:
    assert "## Quality against trivial baselines" in f.read()
  assert nucleus["target_logprob"]["outside_support_sp"] == 0.0  # exactness: inside the nucleus
  he = stored["settings"]["humaneval_nucleus"]["quality"]
  assert 0.0 <= he["parse_ar"]["mean"] <= 1.0 and he["harness"]["ran"] is False
  assert set(stored["batch"]) == set(cfg.eval.batch_settings)
  for res in stored["batch"].values():
    assert set(res) == {str(b) for b in cfg.eval.batch_sizes}
  assert stored["models"]["ratio"] > 1
  md = open(os.path.join(out, "results.md")).read()
  for heading in ("Table 1 layout", "K sweep", "speedup vs batch size", "## Findings",
                  "Quality is unchanged", "7.52 ms"):
    assert heading in md, heading


def _drafter_job(cfg, preset: str, workdir):
  """experiments/train_drafter.py's config `preset` on the micro run's target."""
  from configs import train_drafter as td_config
  td = td_config.get_config(preset)
  td.target_dir = os.path.join(cfg.workdir, "target")
  td.workdir = str(workdir)
  td.data.cache_dir = cfg.data.cache_dir
  return td


def test_micro_run_trains_a_pard_draft(micro_run, tmp_path):
  """train.parallel: the draft fine-tuned with a mask slot into draft_parallel/,
  and train_drafter.py's pard job (3 slots, on the target's continuations):
  each loadable as a PARD drafter (slot count and mask id from its run) and
  exact: greedy tokens those of plain decoding."""
  from experiments.programs import drafter_training
  cfg, _ = micro_run
  td = _drafter_job(cfg, "pard_micro", tmp_path / "pard")
  out = drafter_training.run(td)
  assert "eval" in json.dumps(out["summary"]) and out["draft_params"] > 0
  # Its validation accuracies by depth, recorded as the heads' agreement is:
  # the next token's, then the three slots'.
  ev = out["summary"]["last_eval"]
  assert read_agreement(td.workdir) == (
      ev["eval_accuracy"], *(ev[f"eval_slot{j}_accuracy"] for j in (1, 2, 3)))
  assert read_agreement(os.path.join(cfg.workdir, "draft_parallel")) is None
  target, tp = restore_model(os.path.join(cfg.workdir, "target", "final"))
  prompts = jnp.asarray(np.random.default_rng(0).integers(3, target.vocab_size, (2, 6)),
                        jnp.int32)
  ref = specjax.generate(target, tp, prompts, max_new_tokens=6, sampling=specjax.GREEDY)
  for directory, slots in ((os.path.join(cfg.workdir, "draft_parallel"), 1), (td.workdir, 3)):
    pard, pp = load_parallel_draft(directory)
    assert (pard.slots, pard.mask_id) == (slots, 0)
    out = specjax.speculative_generate(target, tp, pard, pp, prompts, max_new_tokens=6,
                                       gamma=slots + 1, sampling=specjax.GREEDY)
    np.testing.assert_array_equal(out.tokens, ref.tokens)


def test_micro_prompts_keep_their_end(micro_run):
  cfg, _ = micro_run
  tok = SentencePieceTokenizer(chen.prepare_data(cfg))
  prompts, lengths, records, cut = chen.task_prompts(cfg, tok, "humaneval")
  assert prompts.shape == (cfg.eval.humaneval_prompts, cfg.eval.humaneval_prompt_len)
  assert cut == len(records)  # HumanEval prompts are longer than the micro bucket
  tail = tok.decode(prompts[0, :lengths[0]].tolist())
  assert records[0]["inputs"].endswith(tail)


def test_rerun_reuses_everything(micro_run):
  cfg, first = micro_run
  again = chen.run(cfg)
  for name in first["settings"]:
    assert again["settings"][name]["k_sweep"] == first["settings"][name]["k_sweep"]
  assert again["batch"] == first["batch"]


def test_changed_settings_recompute_what_they_touch(micro_run, tmp_path):
  """A truncated chunk file is recomputed alone; a changed quality setting
  recomputes the quality stages only; impossible settings are refused."""
  cfg, first = micro_run
  run = tmp_path / "run"
  shutil.copytree(cfg.workdir, run)
  changed = chen_config.get_config("micro")
  changed.update_from_flattened_dict({"workdir": str(run), "data.cache_dir": cfg.data.cache_dir,
                                      "data.code_source": cfg.data.code_source,
                                      "data.summarize_source": cfg.data.summarize_source,
                                      "eval.bootstrap": cfg.eval.bootstrap + 1})
  chunk = run / "stages" / "xsum_greedy" / "k" / "chunk0" / "draft" / "g2.json"
  chunk.write_text(chunk.read_text()[:30])
  again = chen.run(changed)
  recomputed = again["stages"]["recomputed"]
  assert set(recomputed) == {"xsum_greedy/k/chunk0/draft/g2"} | {
      f"{name}/quality" for name in chen.SETTINGS}, recomputed
  assert recomputed["xsum_nucleus/quality"] == "bootstrap changed"
  for name in first["settings"]:  # The K sweeps' token statistics come back unchanged.
    for a, b in zip(first["settings"][name]["k_sweep"], again["settings"][name]["k_sweep"]):
      assert a.get("tokens_per_iteration") == b.get("tokens_per_iteration")
    assert again["settings"][name]["alpha"] == first["settings"][name]["alpha"]
  changed.eval.headline_k = 3
  with pytest.raises(ValueError, match="headline_k"):
    chen.run(changed)


def test_auto_cells_share_one_calibration(micro_run, tmp_path, monkeypatch):
  """Both gamma="auto" cells (each call on its own; the prompts as a series) in every setting,
  from one cost table calibrated once for the pair and stored with the results; the report
  has a row per setting and cell."""
  from specjax import calibration
  from experiments.programs import speed
  calls = []

  def calibrate(target, target_params, drafter, draft_params, adaptive, **kw):
    calls.append(kw)   # rigged: the costs' measurement is calibration's own tests' job
    return calibration.GammaCosts(adaptive.gammas, (1.0, 1.3, 1.5, 1.9, 2.7), measured=True,
                                  calibration_seconds=3.0)

  def no_calibration(*a, **kw):
    raise AssertionError("an auto cell calibrated on its own")
  monkeypatch.setattr(speed, "calibrate_gamma_costs", calibrate)
  monkeypatch.setattr(calibration, "calibrate_gamma_costs", no_calibration)
  cfg, _ = micro_run
  run = tmp_path / "run"
  shutil.copytree(cfg.workdir, run)
  changed = chen_config.get_config("micro")
  changed.update_from_flattened_dict({"workdir": str(run), "data.cache_dir": cfg.data.cache_dir,
                                      "data.code_source": cfg.data.code_source,
                                      "data.summarize_source": cfg.data.summarize_source,
                                      "eval.auto": True})
  changed.eval.auto_cells = ["auto", "auto_series"]
  again = chen.run(changed)
  assert len(calls) == 1 and calls[0]["sampling"].temperature == 1.0, calls
  assert again["calibration"]["draft"]["seconds"] == [1.0, 1.3, 1.5, 1.9, 2.7]
  calibrations = [p for p in (run / "stages").rglob("*.json") if "calibration" in p.parts]
  assert len(calibrations) == 1, calibrations
  report = (run / "results" / "results.md").read_text()
  for name in chen.SETTINGS:
    for cell in ("auto", "auto_series"):
      a = again["settings"][name][cell]
      assert sum(a["gamma_counts"].values()) > 0 and a["speedup"] > 0, (name, cell)
      assert f"| {name} | {cell} | **" in report
  changed.eval.auto_cells = ["auto", "every_call"]
  with pytest.raises(ValueError, match="auto_cells"):
    chen.run(changed)


def test_medusa_heads_train_on_the_micro_target(micro_run, tmp_path):
  """experiments/train_drafter.py's job on the micro target: self-distilled
  data, heads, accuracies, trees; the trained heads draft exactly."""
  import jax.numpy as jnp
  import specjax
  from specjax.drafters import load_medusa
  from experiments.programs import drafter_training
  cfg, _ = micro_run
  td = _drafter_job(cfg, "medusa_micro", tmp_path / "medusa")
  out = drafter_training.run(td)
  assert os.path.exists(os.path.join(out["final"], "accuracy.json"))
  acc = np.asarray(out["topk_accuracy"])
  assert acc.shape == (td.medusa.num_heads, 10) and ((0 <= acc) & (acc <= 1)).all()
  assert set(out["trees"]) == {"4", "6", "chain"}
  assert "## Trees from these accuracies" in (tmp_path / "medusa" / "report.md").read_text()
  target, tp, _ = drafter_training.load_target(td.target_dir, cfg.data.cache_dir)
  prompts = jnp.asarray(np.random.default_rng(0).integers(3, target.vocab_size, (2, 8)),
                        jnp.int32)
  ref = specjax.generate(target, tp, prompts, max_new_tokens=8, sampling=specjax.GREEDY)
  for tree in ("chain", 4):
    d, dp = load_medusa(td.workdir, target, tp, tree)
    sp = specjax.speculative_generate(target, tp, d, dp, prompts, max_new_tokens=8,
                                      sampling=specjax.GREEDY)
    np.testing.assert_array_equal(sp.tokens, ref.tokens)
  td.results_dir = str(tmp_path / "results")
  again = drafter_training.run(td)  # a rerun reuses the data and the finished heads
  assert again["topk_accuracy"] == out["topk_accuracy"]
  assert json.loads((tmp_path / "results" / "trees.json").read_text())["trees"] == \
      json.loads(json.dumps(out["trees"]))
  assert (tmp_path / "results" / "report.md").read_text() == \
      (tmp_path / "medusa" / "report.md").read_text()


@pytest.mark.parametrize("kind", ["eagle3", "block"])
def test_eagle3_head_trains_on_the_micro_target(micro_run, tmp_path, kind):
  """experiments/train_drafter.py's EAGLE-3 job on the micro target: the
  fused-feature head trains with the training-time test, reports its
  agreement by depth, and drafts exactly as EAGLE-2's dynamic tree; the
  block job's head (3 slots) likewise, drafting a chain in one call."""
  import jax.numpy as jnp
  import specjax
  from specjax.drafters import DynamicTree, load_eagle
  from experiments.programs import drafter_training
  from specjax.tree import TokenTree
  cfg, _ = micro_run
  td = _drafter_job(cfg, f"{kind}_micro", tmp_path / kind)
  out = drafter_training.run(td)
  agree = out["agreement_by_step"]
  assert len(agree) == 3 and all(0 <= a <= 1 for a in agree)
  report = (tmp_path / kind / f"{kind}.md").read_text()
  assert "agreement with the target's argmax" in report
  target, tp, _ = drafter_training.load_target(td.target_dir, cfg.data.cache_dir)
  tree = DynamicTree(top_k=2, depth=2, nodes=4) if kind == "eagle3" else TokenTree.chain(3)
  d, dp = load_eagle(td.workdir, target, tp, tree)
  assert d.config.block == (3 if kind == "block" else 0)
  assert report.startswith("# block-3 head" if kind == "block" else "# EAGLE-3 head")
  assert d.config.feature_layers == drafter_training.eagle_feature_layers(
      target.config.num_layers)
  prompts = jnp.asarray(np.random.default_rng(0).integers(3, target.vocab_size, (2, 8)),
                        jnp.int32)
  ref = specjax.generate(target, tp, prompts, max_new_tokens=8, sampling=specjax.GREEDY)
  sp = specjax.speculative_generate(target, tp, d, dp, prompts, max_new_tokens=8,
                                    sampling=specjax.GREEDY)
  np.testing.assert_array_equal(sp.tokens, ref.tokens)
