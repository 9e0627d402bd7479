"""specjax.tune_matvec_rows: the threshold rule on hand-made speedups, the
measurement wiring with rigged timings, a real (tiny) run, the errors, and
the peers suite's use of it."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from experiments.programs import peers as bp
from experiments.programs import peers_suite
from specjax.measure import tuning
from specjax.measure.tuning import choose_matvec_rows
from specjax.models.decoder import DecoderLM, decoder_config


@pytest.mark.parametrize("speedups, margin, rows", [
    ({2: 1.10, 3: 1.02, 4: 0.87, 5: 0.86, 8: 0.68}, 1.0, 3),  # the 105 MB-L3 machine's shape
    ({2: 1.30, 3: 1.43, 5: 1.29, 8: 1.16}, 1.0, 8),            # per-token wins throughout
    ({2: 0.97, 3: 1.20, 8: 1.30}, 1.0, 0),                     # stops at the first loss
    ({2: 1.10, 3: 1.02, 4: 1.2}, 1.05, 2),                     # margin
    ({3: 1.2, 2: 1.1}, 1.0, 3),                                # order of the mapping ignored
    ({2: 1.1, 3: float("nan"), 4: 1.3}, 1.0, 2),               # NaN is no win
    ({2: 1.0}, 1.0, 0),                                        # a tie keeps one product
])
def test_choose_matvec_rows(speedups, margin, rows):
  assert choose_matvec_rows(speedups, margin) == rows


def test_choose_matvec_rows_errors():
  with pytest.raises(ValueError, match="speedups must hold"):
    choose_matvec_rows({})
  with pytest.raises(ValueError, match="margin must be > 0, got 0"):
    choose_matvec_rows({2: 1.1}, margin=0)


def test_tune_measures_each_row_count_and_picks_the_threshold(monkeypatch):
  """Rigged timings: the per-token path is 2x faster up to 4 rows, 2x slower
  above. The tuner must time batch 1, T = N with matvec_max_rows N against
  0, and choose 4."""
  calls = []

  def fake(models, params, batch_size, cache_len, prompt_len, tokens, steps, repeats):
    calls.append((batch_size, tokens, models["per_token"].config.matvec_max_rows,
                  models["matmul"].config.matvec_max_rows, cache_len, prompt_len, repeats))
    fast, slow = [1e-3] * repeats, [2e-3] * repeats
    return {"per_token": fast if tokens <= 4 else slow, "matmul": slow if tokens <= 4 else fast}

  monkeypatch.setattr(tuning, "step_times_side_by_side", fake)
  lm = DecoderLM(decoder_config("tiny"))
  lines = []
  choice = specjax.tune_matvec_rows(lm, None, row_counts=(8, 2, 4, 5), prompt_len=10,
                                    repeats=3, log=lines.append)
  assert choice.rows == 4 and choice.default_rows == 0  # CPU default: no stored choice
  assert [c[:4] for c in calls] == [(1, n, n, 0) for n in (2, 4, 5, 8)]
  assert all(c[4] == 18 and c[5] == 10 and c[6] == 3 for c in calls)  # cache P + max N
  assert choice.speedups == {2: 2.0, 4: 2.0, 5: 0.5, 8: 0.5}
  assert choice.per_token_ms[2] == pytest.approx(1.0) and choice.matmul_ms[8] == pytest.approx(1.0)
  assert len(lines) == 5 and "N=5" in lines[2]
  tuned = choice.apply(lm)
  assert tuned.config == lm.config.replace(matvec_max_rows=4)
  d = choice.to_dict()
  assert d["rows"] == 4 and d["speedups"]["5"] == 0.5
  # Stored for this machine and shape: the default config now decodes on it.
  from specjax.models import matvec_cache
  from specjax.models.decoder import matvec_rows
  assert choice.stored_at == matvec_cache.cache_path() and "stored in" in lines[-1]
  assert matvec_rows(lm.config) == 4 and matvec_rows(lm.config, packed=True) == 0
  assert matvec_rows(lm.config.replace(matvec_max_rows=2)) == 2  # an explicit value wins
  assert matvec_rows(decoder_config("tiny", d_model=64)) == 0   # another shape
  unsaved = specjax.tune_matvec_rows(lm, None, row_counts=(8,), prompt_len=10, repeats=1,
                                     save=False)
  assert unsaved.rows == 0 and unsaved.stored_at == "" and matvec_rows(lm.config) == 4
  with open(matvec_cache.cache_path(), "w") as f:
    f.write("{not json")
  assert matvec_rows(lm.config) == 0  # an unreadable file is ignored


def test_tune_on_a_tiny_model_and_the_tuned_model_computes_the_same():
  lm = DecoderLM(decoder_config("tiny"))
  params = lm.pack_params(lm.init(jax.random.PRNGKey(0)))
  choice = specjax.tune_matvec_rows(lm, params, row_counts=(2, 3), prompt_len=4, steps=2,
                                    repeats=2)
  assert choice.rows in (0, 2, 3)
  assert all(math.isfinite(v) and v > 0 for v in choice.speedups.values())
  assert set(choice.per_token_ms) == set(choice.matmul_ms) == {2, 3}
  # Either threshold computes the same logits (the path, not the values, changes).
  x = jnp.asarray(np.random.default_rng(0).integers(0, 64, size=(1, 3)), jnp.int32)
  for rows in (0, 3):
    other = specjax.measure.tuning.MatvecChoice(rows, {}, {}, {}, 8).apply(lm)
    np.testing.assert_allclose(other.forward(params, x), lm.forward(params, x), rtol=1e-5,
                               atol=1e-5)


def test_tune_errors():
  lm = DecoderLM(decoder_config("tiny"))
  with pytest.raises(TypeError, match="model must be a specjax DecoderLM.*UnigramLM"):
    specjax.tune_matvec_rows(specjax.UnigramLM(8), None)
  for bad in ((), (1, 2), (2, 2), (2.0,), (True,)):
    with pytest.raises(ValueError, match="row_counts must"):
      specjax.tune_matvec_rows(lm, None, row_counts=bad)
  with pytest.raises(ValueError, match="prompt_len must be an int >= 1, got 0"):
    specjax.tune_matvec_rows(lm, None, prompt_len=0)
  with pytest.raises(ValueError, match=r"cache_len must be an int >= .* = 72, got 70"):
    specjax.tune_matvec_rows(lm, None, prompt_len=64, cache_len=70)
  with pytest.raises(TypeError, match="model must be"):
    specjax.measure.tuning.MatvecChoice(2, {}, {}, {}, 8).apply(specjax.UnigramLM(8))


def test_peers_suite_matvec_rows_settings():
  with pytest.raises(ValueError, match="decoder_matvec_rows must be 'auto', None or an int"):
    peers_suite.SuiteConfig(decoder_matvec_rows=-1)
  with pytest.raises(ValueError, match="decoder_matvec_rows"):
    peers_suite.SuiteConfig(decoder_matvec_rows="fast")
  assert peers_suite.SuiteConfig().decoder_matvec_rows == "auto"
  cfg = peers_suite.SuiteConfig(decoder_matvec_rows=0, fallback_size="tiny")
  spec = peers_suite._pair_spec(cfg, "decoder")
  assert spec.target_matvec_rows == spec.draft_matvec_rows == 0
  assert peers_suite._pair_spec(cfg, "t5").target_matvec_rows is None
  pair = bp.load_pair(spec)  # the spec's rows reach both models (and a subprocess's rebuild)
  assert pair.target.config.matvec_max_rows == pair.draft.config.matvec_max_rows == 0
  default = bp.load_pair(peers_suite._pair_spec(
      peers_suite.SuiteConfig(decoder_matvec_rows=None, fallback_size="tiny"), "decoder"))
  assert default.target.config.matvec_max_rows is None


def test_peers_suite_tunes_both_models(monkeypatch):
  cfg = peers_suite.SuiteConfig(fallback_size="tiny", matvec_row_counts=(2, 3))
  pair = bp.load_pair(peers_suite._pair_spec(cfg, "decoder"))
  rigged = {"target": {2: 1.2, 3: 0.8}, "draft": {2: 0.9, 3: 1.5}}
  seen = []

  def fake(model, params, row_counts, prompt_len, repeats, log):
    role = "target" if model is pair.target else "draft"
    seen.append((role, row_counts, prompt_len))
    s = rigged[role]
    return tuning.MatvecChoice(choose_matvec_rows(s), s, s, s, 8)

  monkeypatch.setattr(specjax, "tune_matvec_rows", fake)
  tuned, record = peers_suite._tune_matvec_rows(pair, cfg, lambda line: None)
  assert seen == [("target", (2, 3), cfg.prompt_len), ("draft", (2, 3), cfg.prompt_len)]
  assert tuned.target.config.matvec_max_rows == 2 and tuned.draft.config.matvec_max_rows == 0
  assert (tuned.spec.target_matvec_rows, tuned.spec.draft_matvec_rows) == (2, 0)
  assert tuned.spec.note == pair.spec.note and tuned.tp is pair.tp
  assert record["target"]["rows"] == 2 and record["draft"]["speedups"]["3"] == 1.5
  note = peers_suite._layout_note({"kind": "decoder", "spec": dict(
      packed=True, target_matvec_rows=2, draft_matvec_rows=0), "matvec_tuning": record})
  assert "`matvec_max_rows` target 2, draft 0 (tuned" in note and "N=3 0.80×" in note
