"""The drafter families benchmark (`benchmarks/drafters_bench.py`,
`experiments/families.py`): the smoke run's report, goals and resume, and the
config's options."""

import dataclasses
import json
import os

import numpy as np
import pytest

from bench_helpers import run_script as _run


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
           "lookahead", "suffix", "suffix + job corpus", "Medusa chain", "Medusa tree 6",
           "EAGLE-2", "EAGLE-3", "PARD chain"}
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
        if r["drafter"] in ("EAGLE-2", "EAGLE-3", "classic draft", "PARD chain"):  # own state
          assert r["memory"]["params"] > 0 and r["memory"]["state_bytes_per_row"] > 0, r
        if r["drafter"] == "prompt lookup":
          assert r["memory"]["params"] == 0
  goals = {g["goal"]: g["status"] for g in results["goals"]}
  assert goals["one compilation per (drafter, γ, bucket): no trace while timing"] == "PASS"
  assert goals["every drafter exact: greedy output identical to AR"] == "PASS"
  assert "## Goals" in md and "Spec-Bench" in md and "| lookahead |" in md
  assert "## In Spec-Bench's layout" in md and "| EAGLE-2 | " in md
  assert (tmp_path / "drafters_smoke.png").stat().st_size > 0


def test_families_config_maps_to_the_benchmark_options(tmp_path):
  """configs/families.py → FamilyOptions: every preset loads, a learned
  drafter whose directory is missing is left out (not an error later)."""
  from configs import families as fam_config
  from experiments.programs import families
  for preset in ("quick", "full", "block", "pard", "auto_heads", "lookup", "sampled_full",
                 "auto_full", "smoke"):
    fam_config.get_config(preset)
  rerun = families.options(fam_config.get_config("auto_full"))
  assert rerun.auto and rerun.chen_dir == "runs/chen_full" and not rerun.medusa_dir
  assert {n for n in rerun.only if n.endswith(" auto")} == {
      f"{n} auto" for n in rerun.only if not n.endswith(" auto")}   # each beside its fixed γ
  heads = families.options(fam_config.get_config("auto_heads"))
  assert heads.auto and heads.auto_series and heads.eagle_stop == 0.3
  assert "EAGLE-1 chain auto stop series" in heads.only
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


def test_a_series_row_passes_the_estimate_it_is_given(monkeypatch):
  """families._run: a "series" entry decodes with gamma="auto" and the
  carried estimate (a fresh one when the cell has none yet); other entries
  pass no estimate."""
  import specjax
  from experiments.programs import families
  seen = []

  class _Out:
    class tokens:
      @staticmethod
      def block_until_ready():
        return None

  def fake(*args, gamma=None, acceptance="absent", **kw):
    seen.append((gamma, acceptance))
    return _Out()

  monkeypatch.setattr(specjax, "speculative_generate", fake)
  carried = specjax.Acceptance(np.ones(2, np.float32), np.zeros(2, np.float32))
  entry = ("drafter", None, families.SERIES)
  families._run(None, None, entry, None, None, None, None, 4)
  families._run(None, None, entry, None, None, None, None, 4, carried)
  families._run(None, None, ("drafter", None, "auto"), None, None, None, None, 4, carried)
  assert seen[0][0] == "auto" and seen[0][1].evidence() == 0.0      # a fresh estimate
  assert seen[1] == ("auto", carried)
  assert seen[2] == ("auto", "absent")
  # A recorded agreement's prior: greedy, for every drafter; sampled, for drafts
  # drawn from a distribution, the default prior for deterministic ones (top-k).
  from specjax.adaptive import AdaptiveGamma
  from specjax.drafters.eagle import Eagle, EagleConfig
  from specjax.tree import TokenTree
  target = specjax.DecoderLM(specjax.decoder_config("tiny"))
  cfg = EagleConfig(target.config.d_model, target.vocab_size, num_heads=2)
  drawn = Eagle(cfg, TokenTree.chain(2), target)
  top_k = Eagle(cfg, TokenTree.chain(2), target, "top_k")
  assert not drawn.deterministic and top_k.deterministic
  prior = AdaptiveGamma(prior_alpha=0.8)
  for d, sampling, want in ((drawn, specjax.GREEDY, prior), (top_k, specjax.GREEDY, prior),
                            (drawn, specjax.SamplingConfig(1.0), prior),
                            (top_k, specjax.SamplingConfig(1.0), "auto"),
                            ("model", specjax.SamplingConfig(1.0), prior)):
    families._run(None, None, (d, None, prior), None, None, None, sampling, 4)
    assert seen[-1] == (want, "absent"), (d, sampling)


def test_an_auto_row_of_a_trained_head_starts_from_its_agreement():
  """families.auto_gamma: a recorded agreement's first entry is the prior
  (clipped), without one (or with agreement_prior off) plain "auto"; the
  row's buffers are sized for its Γ."""
  from specjax.adaptive import AdaptiveGamma
  from experiments.programs import families
  opts = families.FamilyOptions(chen_dir="c", data_cache="d", work_dir="w")
  g = families.auto_gamma(opts, (0.79, 0.6))
  assert isinstance(g, AdaptiveGamma) and g.prior_alpha == 0.79
  assert g.gammas == AdaptiveGamma().gammas and families._room(g) == 8
  assert families.auto_gamma(opts, (0.999,)).prior_alpha == 0.95
  assert families.auto_gamma(opts, (0.0,)).prior_alpha == 0.05
  assert families.auto_gamma(opts, None) == "auto"
  off = dataclasses.replace(opts, agreement_prior=False)
  assert families.auto_gamma(off, (0.79,)) == "auto"
