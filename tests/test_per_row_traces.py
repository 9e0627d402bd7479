"""Per-row `gamma="auto"`: each row's own γ in `stats.gamma_trace`, and custom verify rules that
keep rows independent of their batch, through the real loop on bigram tables."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import AdaptiveGamma, BigramLM, GREEDY, SamplingConfig
from specjax.drafters import ModelDrafter
from specjax.protocol import required_cache_len
from specjax.verify import rejection_verify

V = 32
N = 20
GAMMAS = (0, 1, 2, 4)
COSTS = (1.0, 1.1, 1.2, 1.4)


@functools.lru_cache(maxsize=None)
def pair():
  """A bigram target and a draft that agrees with it on the first half of the vocabulary (each
  half cycles into itself) and disagrees on the second: prompts in the first half are accepted,
  prompts in the second rejected."""
  rng = np.random.default_rng(0)
  def table(agree):
    t = rng.normal(0.0, 0.3, (V, V)).astype(np.float32)
    for a in range(V):
      base = 0 if a < V // 2 else V // 2
      step = 1 if (agree or base == 0) else 7
      t[a, base + (a - base + step) % (V // 2)] += 4.0
      t[a, (V // 2 - base) + a % (V // 2)] -= 8.0   # never leave the half
    return {"logits": jnp.asarray(t)}
  return BigramLM(V), table(True), table(False)


PROMPTS = np.array([[1, 2, 3], [17, 18, 19], [4, 5, 6]], np.int32)
LENGTHS = np.array([3, 3, 2], np.int32)


def _auto(prompts, lengths, sampling=GREEDY, key=None):
  model, tp, dp = pair()
  return specjax.speculative_generate(
      model, tp, model, dp, prompts, lengths, max_new_tokens=N, sampling=sampling, key=key,
      gamma=AdaptiveGamma(gammas=GAMMAS, per_row=True), gamma_costs=COSTS)


def test_per_row_trace_holds_each_rows_own_gamma():
  out = _auto(PROMPTS, LENGTHS)
  trace = np.asarray(out.stats.gamma_trace)
  calls = np.asarray(out.stats.target_calls)
  assert trace.shape == (3, N) and trace.dtype == np.int32
  # Each row's iterations are its own: -1 once it finished (the prefill is a target call).
  np.testing.assert_array_equal((trace >= 0).sum(axis=1), calls - 1)
  # The accepted row drafts at the largest γ, the rejected one drops to plain steps; the call's
  # γ (the batch mode's record) would show 4 for both.
  ran = [t[t >= 0] for t in trace]
  assert ran[0].max() == 4 and ran[1].max() < 4 and (ran[1] == 0).any(), trace
  assert not np.array_equal(ran[0][:len(ran[1])], ran[1][:len(ran[0])])
  # Drafted tokens are the trace's sum (a model drafter drafts its row's valid drafts).
  np.testing.assert_array_equal(np.where(trace >= 0, trace, 0).sum(axis=1),
                                np.asarray(out.stats.drafted))
  model, tp, _ = pair()
  ref = specjax.generate(model, tp, PROMPTS, LENGTHS, max_new_tokens=N, sampling=GREEDY)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(temperature=1.0)])
def test_a_rows_trace_alone_equals_its_trace_in_the_batch(sampling):
  keys = jax.random.split(jax.random.key(3), len(PROMPTS))
  batch = _auto(PROMPTS, LENGTHS, sampling, keys)
  for r in range(len(PROMPTS)):
    alone = _auto(PROMPTS[r:r + 1], LENGTHS[r:r + 1], sampling, keys[r:r + 1])
    np.testing.assert_array_equal(np.asarray(alone.stats.gamma_trace)[0],
                                  np.asarray(batch.stats.gamma_trace)[r])
    np.testing.assert_array_equal(np.asarray(alone.tokens)[0], np.asarray(batch.tokens)[r])


def test_batch_mode_keeps_the_calls_trace():
  model, tp, dp = pair()
  out = specjax.speculative_generate(model, tp, model, dp, PROMPTS, LENGTHS, max_new_tokens=N,
                                     sampling=GREEDY, gamma=AdaptiveGamma(gammas=GAMMAS),
                                     gamma_costs=COSTS)
  trace = np.asarray(out.stats.gamma_trace)
  assert trace.shape == (N,)
  assert int((trace >= 0).sum()) == int(np.asarray(out.stats.target_calls).max()) - 1


def test_plain_program_reports_per_row_traces():
  # Costs where drafting never pays: generate's program runs, reported per row.
  model, tp, dp = pair()
  eos = 5
  out = specjax.speculative_generate(
      model, tp, model, dp, PROMPTS, LENGTHS, max_new_tokens=N, sampling=GREEDY, eos_id=eos,
      gamma=AdaptiveGamma(gammas=GAMMAS, per_row=True), gamma_costs=(1.0, 50.0, 60.0, 70.0))
  trace = np.asarray(out.stats.gamma_trace)
  lens = np.asarray(out.lengths)
  assert lens.min() < N   # a row stopped at EOS: its trace ends earlier
  np.testing.assert_array_equal(trace, np.where(np.arange(N)[None] < (lens - 1)[:, None], 0, -1))


# --- custom verify rules through a SpeculativeDecoder built directly ------------------------


def _keyword_rule(keys_B, drafts_BG, p_BGV, q_BG1V, num_valid_B=None):
  return rejection_verify(keys_B, drafts_BG, p_BGV, q_BG1V, num_valid_B=num_valid_B)


def _ignores_num_valid(keys_B, drafts_BG, p_BGV, q_BG1V, num_valid_B=None):
  del num_valid_B   # the negative control: verifies drafts the row did not propose
  return rejection_verify(keys_B, drafts_BG, p_BGV, q_BG1V)


def _four_arguments(keys_B, drafts_BG, p_BGV, q_BG1V):
  return rejection_verify(keys_B, drafts_BG, p_BGV, q_BG1V)


def _decoder(verify_fn, sampling):
  model, _, _ = pair()
  ad = AdaptiveGamma(gammas=GAMMAS, per_row=True)
  return specjax.SpeculativeDecoder(model, ModelDrafter(model), ad.max_gamma, sampling, N,
                                    verify_fn=verify_fn, adaptive=ad)


def _run(dec, prompts, lengths, keys):
  model, tp, dp = pair()
  b, p = prompts.shape
  slots = required_cache_len(model, p, N, dec.gamma)
  return dec.run(tp, dp, jnp.asarray(prompts), jnp.asarray(lengths), keys,
                 model.init_cache(b, slots, p), dec.drafter.alloc(b, p, slots, dec.gamma),
                 gamma_costs=COSTS)


def _rows_alone_vs_batch(dec, keys):
  batch = np.asarray(_run(dec, PROMPTS, LENGTHS, keys).tokens)
  alone = np.concatenate([np.asarray(_run(dec, PROMPTS[r:r + 1], LENGTHS[r:r + 1],
                                          keys[r:r + 1]).tokens) for r in range(len(PROMPTS))])
  return batch, alone


@pytest.mark.parametrize("rule", [_keyword_rule, lambda *a: rejection_verify(*a)],
                         ids=["keyword", "positional"])
def test_direct_decoder_custom_rule_keeps_rows_independent(rule):
  sampling = SamplingConfig(temperature=1.0)
  keys = jax.random.split(jax.random.key(1), len(PROMPTS))
  batch, alone = _rows_alone_vs_batch(_decoder(rule, sampling), keys)
  np.testing.assert_array_equal(batch, alone)
  # ... and gives the built-in rule's tokens (the same random numbers, the same decisions).
  builtin, _ = _rows_alone_vs_batch(_decoder(rejection_verify, sampling), keys)
  np.testing.assert_array_equal(batch, builtin)


def test_the_control_a_rule_ignoring_num_valid_depends_on_the_batch():
  # Row 1 plays plain steps while row 0 drafts 4: verifying drafts row 1 never proposed makes it
  # depend on the call's γ, i.e. on row 0. What the test above would catch.
  sampling = SamplingConfig(temperature=1.0)
  differs = 0
  for seed in range(3):
    keys = jax.random.split(jax.random.key(seed), len(PROMPTS))
    batch, alone = _rows_alone_vs_batch(_decoder(_ignores_num_valid, sampling), keys)
    differs += int((batch != alone).any(axis=1).sum())
  assert differs > 0


def test_direct_decoder_refuses_a_four_argument_rule_with_adaptive_gamma():
  with pytest.raises(ValueError, match="verify_fn=_four_arguments takes no num_valid_B"):
    _decoder(_four_arguments, SamplingConfig(temperature=1.0))
  # Without adaptive γ every row proposes all γ drafts: the four-argument rule is fine.
  model, _, _ = pair()
  specjax.SpeculativeDecoder(model, ModelDrafter(model), 4, SamplingConfig(), N,
                             verify_fn=_four_arguments)


def test_training_exports_its_errors():
  from specjax import training
  for name in ("NonFiniteTrainingError", "CheckpointWriteError", "ON_NONFINITE"):
    assert name in training.__all__ and hasattr(training, name)
  assert issubclass(training.NonFiniteTrainingError, FloatingPointError)
  assert issubclass(training.CheckpointWriteError, OSError)
