"""gamma="auto": γ chosen per iteration in-graph (`specjax.adaptive`), with
cost tables measured once per machine (`specjax.calibration`).

The rule on rigged acceptance histories; the draft model's cache kept in
step through plain (γ = 0) iterations; greedy output equal to the target's
on ragged batches ending by EOS and by length, for every adaptive drafter
and both modes; per-row mode independent of the batch; chi-square exactness
of sampled output with a negative control; one compilation whatever the
costs; the cost table measured with a rigged clock, stored and reused; named
misuse errors; no cache copied inside the loop's segments.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from exact_helpers import N_SAMPLES, counts_t2_t4, exact_lm, joint_t2_t4
from reference import chi_square_pvalue
from specjax import adaptive, calibration
from specjax.adaptive import AdaptiveGamma, AdaptState
from specjax.drafters import LayerSkip, Lookahead, ModelDrafter, PromptLookup
from specjax.generation import SpeculativeDecoder
from specjax.measure.compiles import TraceCounter
from specjax.measure.timing import use_clock
from specjax.sampling import GREEDY, SamplingConfig
from tiny import EOS, noisy_draft, ragged_prompts, small_draft, target

COSTS = (1.0, 1.2, 1.4, 1.8, 2.6)  # relative iteration costs of Γ = (0, 1, 2, 4, 8)


# ------------------------------------------------------------------ the rule

def _run_rule(cfg, outcomes, costs=COSTS, room=None):
  """Feeds one row's (valid, accepted) outcomes through observe / choose;
  returns the γ chosen before each iteration and after the last."""
  st = AdaptState.zeros(1, len(outcomes) + 1)
  active = jnp.ones((1,), bool)
  room_B = None if room is None else jnp.full((1,), room, jnp.int32)
  chosen = []
  for i, (valid, acc) in enumerate(outcomes):
    branch, limit = adaptive.choose(cfg, st, jnp.asarray(costs), active, room_B)
    chosen.append(int(limit[0]) if int(limit[0]) else cfg.gammas[int(branch)])
    st = st.replace(branch=branch, limit_B=limit)
    st = adaptive.observe(cfg, st, jnp.asarray([acc]), jnp.asarray([valid]), active,
                          jnp.asarray(i))
  branch, limit = adaptive.choose(cfg, st, jnp.asarray(costs), active, room_B)
  chosen.append(cfg.gammas[int(branch)])
  return chosen


def test_gamma_rises_on_full_acceptance_and_falls_to_zero_on_failures():
  cfg = AdaptiveGamma()
  full = _run_rule(cfg, [(8, 8)] * 6)
  assert full[0] in (1, 2)          # the prior (α = 0.5) drafts a little
  assert full[-1] == 8 and full == sorted(full), full   # rises to max Γ and stays
  failing = _run_rule(cfg, [(8, 8)] * 4 + [(8, 0)] * 24)
  after = failing[4:]
  assert after[0] == 8 and after == sorted(after, reverse=True), failing
  assert after[-1] == 0, failing   # falls to a plain step
  # A row that stopped drafting observes nothing and drifts back to the prior.
  st = AdaptState.zeros(1, 2).replace(rejected_B2=jnp.asarray([[10.0, 10.0]]))
  active, costs = jnp.ones((1,), bool), jnp.asarray(COSTS)
  assert int(adaptive.choose(cfg, st, costs, active)[1][0]) == 0
  waited = 0
  while int(adaptive.choose(cfg, st, costs, active)[1][0]) == 0:
    st = adaptive.observe(cfg, st, jnp.zeros(1, jnp.int32), jnp.zeros(1, jnp.int32), active,
                          jnp.asarray(0))
    waited += 1
  assert 10 <= waited <= 90, waited   # tries again, but rarely


def test_expected_tokens_and_the_two_rates():
  k = jnp.asarray([[0, 1, 2, 4]])
  # One rate: Leviathan et al.'s (1 - α^(k+1)) / (1 - α).
  np.testing.assert_allclose(adaptive.expected_tokens(jnp.asarray([[0.6, 0.6]]), k)[0],
                             [(1 - 0.6 ** (j + 1)) / 0.4 for j in (0, 1, 2, 4)], rtol=1e-6)
  # Runs of acceptances: a rare first acceptance, then long runs.
  np.testing.assert_allclose(adaptive.expected_tokens(jnp.asarray([[0.4, 0.9]]), k)[0],
                             [1 + 0.4 * (1 - 0.9 ** j) / 0.1 for j in (0, 1, 2, 4)], rtol=1e-5)
  # Observed: an iteration with 5 valid drafts accepting 3 is a first acceptance,
  # 2 later acceptances and a later rejection; accepting 0 a first rejection.
  st = AdaptState.zeros(2, 2)
  st = adaptive.observe(AdaptiveGamma(), st, jnp.asarray([3, 0]), jnp.asarray([5, 4]),
                        jnp.ones(2, bool), jnp.asarray(0))
  assert np.asarray(st.accepted_B2).tolist() == [[1, 2], [0, 0]]
  assert np.asarray(st.rejected_B2).tolist() == [[0, 1], [1, 0]]


def test_costs_and_room_shape_the_choice():
  cfg = AdaptiveGamma()
  # Drafting that costs 10x a plain step never pays, whatever the acceptance.
  assert _run_rule(cfg, [(8, 8)] * 5, costs=(1, 10, 10, 10, 10))[-1] == 0
  # Free drafting: the longest call from the start.
  assert _run_rule(cfg, [(8, 8)] * 2, costs=(1, 1, 1, 1, 1))[0] == 8
  # A row that can offer 2 drafts (a short match) proposes at most 2.
  assert max(_run_rule(cfg, [(2, 2)] * 5, room=2)) <= 2


def test_batch_mode_follows_the_rows_that_pay_and_mutes_the_others():
  cfg = AdaptiveGamma()
  st = AdaptState.zeros(3, 2).replace(
      accepted_B2=jnp.asarray([[9.0, 40.0], [9.0, 40.0], [0.0, 0.0]]),
      rejected_B2=jnp.asarray([[0.0, 0.0], [0.0, 0.0], [9.0, 0.0]]))
  ones = jnp.ones((3,), bool)
  thr = AdaptiveGamma(batch_objective="throughput")
  branch, limit = adaptive.choose(thr, st, jnp.asarray(COSTS), ones)
  # The call verifies every row's drafts: the failing row sends its own too.
  assert thr.gammas[int(branch)] == 8 and limit.tolist() == [8, 8, 8]
  # "finish" (the default): the call lasts until its last row ends. A failing
  # row with as far to go as the others keeps the batch plain (drafts would
  # not end the call sooner) ...
  for left in (None, [50, 50, 50]):
    branch, limit = adaptive.choose(cfg, st, jnp.asarray(COSTS), ones,
                                    left_B=None if left is None else jnp.asarray(left))
    assert cfg.gammas[int(branch)] == 0 and limit.tolist() == [0, 0, 0], left
  # ... one that is nearly done does not (and sends its drafts along).
  branch, limit = adaptive.choose(cfg, st, jnp.asarray(COSTS), ones,
                                  left_B=jnp.asarray([50, 50, 1]))
  assert cfg.gammas[int(branch)] == 8 and limit.tolist() == [8, 8, 8]
  # A finished row does not count, whatever it had left.
  branch, _ = adaptive.choose(cfg, st, jnp.asarray(COSTS), jnp.asarray([True, True, False]),
                              left_B=jnp.asarray([50, 50, 50]))
  assert cfg.gammas[int(branch)] == 8
  # Rows that do not pay alone do not make the batch draft ...
  bad = st.replace(accepted_B2=jnp.zeros((3, 2)), rejected_B2=jnp.full((3, 2), 9.0))
  branch, limit = adaptive.choose(cfg, bad, jnp.asarray(COSTS), jnp.ones((3,), bool))
  assert cfg.gammas[int(branch)] == 0 and limit.tolist() == [0, 0, 0]
  # ... and a batch that drafts leaves for plain steps as soon as they score
  # better (no switch margin toward γ = 0), but enters drafting only by it.
  scores = lambda s: adaptive.expected_tokens(adaptive.estimated_alpha(cfg, s),
                                              jnp.asarray([[0, 1, 2, 4, 8]]))
  marginal = bad.replace(accepted_B2=jnp.full((3, 2), 1.0), rejected_B2=jnp.full((3, 2), 6.0),
                         slow_B2=jnp.asarray([[1.0, 10.0]] * 3))
  e = np.asarray(scores(marginal))[0] / np.asarray(COSTS)
  assert e[1:].max() < 1.0 < e[1:].max() * (1 + cfg.switch_margin)   # rigged: just below
  drafting = marginal.replace(branch=jnp.asarray(1, jnp.int32))
  assert int(adaptive.choose(cfg, drafting, jnp.asarray(COSTS), jnp.ones((3,), bool))[0]) == 0
  ahead = marginal.replace(accepted_B2=jnp.full((3, 2), 2.0), rejected_B2=jnp.full((3, 2), 6.0),
                          slow_B2=jnp.asarray([[2.0, 6.0]] * 3))
  e = np.asarray(scores(ahead))[0] / np.asarray(COSTS)
  assert 1.0 < e[1:].max() < 1 + cfg.switch_margin, e   # rigged: better, not by the margin
  assert int(adaptive.choose(cfg, ahead, jnp.asarray(COSTS), jnp.ones((3,), bool))[0]) == 0
  per_row = AdaptiveGamma(per_row=True)
  st = st.replace(accepted_B2=jnp.asarray([[9.0, 40.0], [1.0, 0.5], [0.0, 0.0]]),
                  rejected_B2=jnp.asarray([[0.0, 0.0], [1.0, 1.0], [9.0, 0.0]]))
  branch, limit = adaptive.choose(per_row, st, jnp.asarray(COSTS), jnp.ones((3,), bool))
  assert limit[0] == 8 and 0 < limit[1] < 8 and limit[2] == 0
  assert per_row.gammas[int(branch)] == 8  # the call holds the longest row's drafts
  # Finished rows do not count.
  branch, limit = adaptive.choose(cfg, st, jnp.asarray(COSTS), jnp.asarray([False, True, True]))
  assert limit[0] == 0


# ------------------------------------------- the loop: γ = 0 keeps drafts in step

def test_a_draft_model_stays_in_step_through_plain_iterations():
  """The target drafting for itself, greedy: every drafted token must be
  accepted, whatever sequence of γ (0 included) the iterations run."""
  lm, params = target()
  ad = AdaptiveGamma(gammas=(0, 1, 2, 4))
  dec = SpeculativeDecoder(lm, ModelDrafter(lm), 4, GREEDY, 40, adaptive=ad)
  prompts, lengths = ragged_prompts(batch=3)
  b, p = prompts.shape
  slots = specjax.required_cache_len(lm, p, 40, 4)
  keys = jax.random.split(jax.random.key(0), b)
  state = jax.jit(dec.init_state)(params, params, prompts, lengths, keys,
                                  lm.init_cache(b, slots, p), lm.init_cache(b, slots, p))
  step = jax.jit(lambda s, c: dec.step(params, params, s, c))
  costs = jnp.asarray([1.0, 1.1, 1.2, 1.3])
  for index in (0, 2, 0, 0, 3, 1, 0, 3, 2, 0, 1):
    g = ad.gammas[index]
    state = state.replace(adapt=state.adapt.replace(branch=jnp.int32(index),
                                                    limit_B=jnp.full((b,), g, jnp.int32)))
    before = np.asarray(state.stats.accepted)
    calls = np.asarray(state.stats.target_calls)
    state = step(state, costs)
    assert (np.asarray(state.stats.target_calls) == calls + 1).all()
    accepted = np.asarray(state.stats.accepted) - before
    assert (accepted == g).all(), (index, accepted)
  ref = specjax.generate(lm, params, prompts, lengths, max_new_tokens=40, sampling=GREEDY)
  n = np.asarray(state.out_len)
  for r in range(b):
    assert (np.asarray(state.tokens)[r, :n[r]] == np.asarray(ref.tokens)[r, :n[r]]).all()


# ------------------------------------------------------------ greedy identity

def _drafters():
  lm, _ = target()
  return {"draft_model": (noisy_draft()[0], noisy_draft()[1]),
          "small_draft": small_draft(),
          "prompt_lookup": (PromptLookup(max_ngram=3), None),
          "layer_skip": (LayerSkip(lm, (0,)), None)}


@pytest.mark.parametrize("name,per_row", [
    ("draft_model", False), ("small_draft", True), ("prompt_lookup", True),
    ("layer_skip", False)])
def test_greedy_equals_the_target_greedy(name, per_row):
  for out in assert_auto_greedy(*_drafters()[name], per_row):
    trace = np.asarray(out.stats.gamma_trace)
    calls = np.asarray(out.stats.target_calls)
    if per_row:   # [B, I]: each row's valid drafts per iteration (the prefill is a target call)
      assert set(trace[trace >= 0]) <= set(range(9))   # a lookup may find fewer than its γ
      assert trace.shape == (calls.shape[0], 24)
      np.testing.assert_array_equal((trace >= 0).sum(axis=1), calls - 1)
    else:
      assert set(trace[trace >= 0]) <= {0, 1, 2, 4, 8}
      assert int((trace >= 0).sum()) == int(calls.max()) - 1


def assert_auto_greedy(draft, dp, per_row):
  """gamma="auto" greedy on a ragged batch (rows ending by EOS and by
  length, prompts that repeat so lookups match) equals the target's greedy
  output, under a cost table that drafts and one that mostly does not;
  returns both outputs."""
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=8, max_len=12, seed=4)
  prompts = np.asarray(prompts).copy()
  prompts[:, 6:12] = prompts[:, :6]  # repeats, so lookups match
  prompts = jnp.asarray(prompts)
  ref = specjax.generate(lm, params, prompts, lengths, max_new_tokens=24, sampling=GREEDY,
                         eos_id=EOS)
  lens = np.asarray(ref.lengths)
  assert (lens < 24).any() and (lens == 24).any(), lens
  outs = []
  for costs in ((1.0, 1.05, 1.1, 1.2, 1.4), (1.0, 1.6, 1.6, 1.7, 1.8)):
    out = specjax.speculative_generate(lm, params, draft, dp, prompts, lengths,
                                       max_new_tokens=24, sampling=GREEDY, eos_id=EOS,
                                       gamma=AdaptiveGamma(per_row=per_row), gamma_costs=costs)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), lens)
    outs.append(out)
  return outs


def test_per_row_mode_rows_are_independent_of_the_batch():
  lm, params = target()
  dm, dp = noisy_draft()
  prompts, lengths = ragged_prompts(batch=6, max_len=8, seed=9)
  keys = jax.random.split(jax.random.key(3), 6)
  kw = dict(max_new_tokens=12, sampling=SamplingConfig(1.0), gamma_costs=COSTS[:3],
            gamma=AdaptiveGamma(gammas=(0, 1, 2), per_row=True))
  batch = specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, key=keys, **kw)
  for r in (0, 3):
    alone = specjax.speculative_generate(lm, params, dm, dp, prompts[r:r + 1],
                                         lengths[r:r + 1], key=keys[r:r + 1], **kw)
    np.testing.assert_array_equal(np.asarray(alone.tokens)[0], np.asarray(batch.tokens)[r])


# ------------------------------------------------------------------ exactness

PROMPT = [3, 1, 4, 3, 1]
EXACT_COSTS = (1.0, 1.25, 1.6)  # Γ = (0, 1, 2): choices change with acceptance


@pytest.mark.parametrize("name,cfg,per_row", [
    ("layer_skip", SamplingConfig(0.7, top_p=0.9), False),
    ("prompt_lookup", SamplingConfig(1.0), True),
    ("carried", SamplingConfig(1.0, top_k=6), True)], ids=str)
def test_sampling_is_exact_and_the_control_is_caught(name, cfg, per_row):
  from test_exactness import residual_from_q_verify
  from test_drafters import _broken_candidates
  lm, params = exact_lm()
  joint = joint_t2_t4(lm, params, PROMPT, cfg)
  drafter = PromptLookup(max_ngram=2) if name == "prompt_lookup" else LayerSkip(lm, (1,))
  ad = AdaptiveGamma(gammas=(0, 1, 2), per_row=per_row)
  costs, carried = EXACT_COSTS, None
  if name == "carried":
    # A series' first call: every row probes once where the prior does not
    # pay, then drafts on only if its probe was accepted.
    ad = AdaptiveGamma(gammas=(0, 1, 2), per_row=True, explore_steps=1)
    costs, carried = (1.0, 1.55, 1.9), specjax.Acceptance.fresh()
  prompts = jnp.asarray(np.tile(np.array(PROMPT, np.int32), (N_SAMPLES, 1)))
  lengths = jnp.full((N_SAMPLES,), len(PROMPT), jnp.int32)
  keys = jax.random.split(jax.random.key(5), N_SAMPLES)
  need = specjax.required_cache_len(lm, len(PROMPT), 4, 2)

  def sample(**broken):
    dec = SpeculativeDecoder(lm, drafter, 2, cfg, 4, adaptive=ad, **broken)
    return dec.run(params, params, prompts, lengths, keys, lm.init_cache(N_SAMPLES, need),
                   drafter.alloc(N_SAMPLES, len(PROMPT), need, 2), gamma_costs=costs,
                   acceptance=carried)

  out = sample()
  drafted = np.asarray(out.stats.drafted)
  accepted = int(np.asarray(out.stats.accepted).sum())
  assert 0 < accepted < drafted.sum()
  # Rows drafted different amounts.
  assert len(set(drafted.tolist())) >= (3 if per_row and name != "carried" else 2)
  assert chi_square_pvalue(counts_t2_t4(np.asarray(out.tokens), lm.vocab_size), joint) > 1e-3
  if name == "carried":   # the probe, then rows that stop and rows that go on
    # Per row ([B, I]): every row's first iteration is its probe of one draft.
    assert (np.asarray(out.stats.gamma_trace)[:, 0] == 1).all()
    assert 1 in drafted and drafted.max() >= 2, sorted(set(drafted.tolist()))
  def broken_rule(keys_B, drafts_BG, p_BGV, q_BG1V, num_valid_B=None):
    # Takes num_valid_B (a per-row decoder refuses a rule that cannot be told), wrong anyway.
    del num_valid_B
    return residual_from_q_verify(keys_B, drafts_BG, p_BGV, q_BG1V)
  broken = (dict(candidates_fn=_broken_candidates) if name == "prompt_lookup"
            else dict(verify_fn=broken_rule))
  bad = sample(**broken)
  assert chi_square_pvalue(counts_t2_t4(np.asarray(bad.tokens), lm.vocab_size), joint) < 1e-6


# ------------------------------------------------------- compilation and costs

def test_one_compilation_whatever_the_costs():
  lm, params = target()
  dm, dp = small_draft()
  prompts, lengths = ragged_prompts(batch=4)
  kw = dict(max_new_tokens=12, sampling=GREEDY, gamma="auto")
  for costs in (COSTS, NO_PAY):   # the loop's program, and plain decoding's
    specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, gamma_costs=costs, **kw)
  with TraceCounter() as traces:
    for costs in ((1, 2, 3, 4, 5), (5, 4, 3, 2, 1), (1.0, 1.6, 1.6, 1.7, 1.8)):
      specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, gamma_costs=costs, **kw)
  assert traces.decode_loops == 0, traces.counts


class _RiggedClock:
  t = 0.0

  def __call__(self):
    return self.t


def test_branch_costs_are_measured_from_the_clock():
  clock = _RiggedClock()
  per_iter = {0: 0.010, 1: 0.013, 2: 0.020}
  iters = {0: 30, 1: 22, 2: 15}

  def run_branch(i):
    clock.t += 0.5 + iters[i] * per_iter[i]   # the base (prefill) plus the iterations
    return iters[i]

  def run_base():
    clock.t += 0.5

  with use_clock(clock):
    got = calibration.measure_branch_seconds(run_branch, run_base, 3, repeats=3)
  np.testing.assert_allclose(got, [per_iter[i] for i in range(3)], rtol=1e-9)


def test_the_cost_table_is_measured_once_stored_and_reused(monkeypatch):
  lm, params = target()
  dm, dp = small_draft()
  prompts, lengths = ragged_prompts(batch=2)
  kw = dict(max_new_tokens=10, sampling=GREEDY, gamma=AdaptiveGamma(gammas=(0, 1, 3)))
  measured = []
  real = calibration.calibrate_gamma_costs

  def counting(*a, **k):
    costs = real(*a, iterations=4, repeats=1, **{x: y for x, y in k.items()})
    measured.append(costs)
    return costs

  monkeypatch.setattr(calibration, "calibrate_gamma_costs", counting)
  first = specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, **kw)
  assert len(measured) == 1 and measured[0].measured
  assert all(s > 0 for s in measured[0].seconds) and len(measured[0].seconds) == 3
  second = specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, **kw)
  assert len(measured) == 1   # read back, not measured again
  np.testing.assert_array_equal(np.asarray(first.tokens), np.asarray(second.tokens))
  key = calibration.gamma_costs_key(lm, ModelDrafter(dm), kw["gamma"], 2,
                                    specjax.required_cache_len(lm, prompts.shape[1], 10, 3),
                                    GREEDY)
  stored = calibration.lookup_gamma_costs(key, kw["gamma"])
  assert stored is not None and stored.seconds == measured[0].seconds
  # Another batch bucket is another table.
  slots = specjax.required_cache_len(lm, prompts.shape[1], 10, 3)
  assert calibration.gamma_costs_key(lm, ModelDrafter(dm), kw["gamma"], 4, slots, GREEDY) != key
  assert calibration.lookup_gamma_costs(calibration.gamma_costs_key(
      lm, ModelDrafter(dm), kw["gamma"], 4, slots, GREEDY), kw["gamma"]) is None
  # A day later the stored table is stale: the next process measures it again.
  stored_at = calibration._wall()
  monkeypatch.setattr(calibration, "_wall", lambda: stored_at + calibration.MAX_AGE_S - 600)
  assert calibration.lookup_gamma_costs(key, kw["gamma"]) is not None
  monkeypatch.setattr(calibration, "_wall", lambda: stored_at + calibration.MAX_AGE_S + 60)
  assert calibration.lookup_gamma_costs(key, kw["gamma"]) is None
  monkeypatch.setattr(calibration, "_RESOLVED", {})   # a new process
  specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, **kw)
  assert len(measured) == 2 and measured[1].measured
  # A table stored without its time (before tables carried one) is measured again.
  from specjax.models import matvec_cache
  matvec_cache.store_entry(calibration.COSTS_FILE, key, {"gammas": [0, 1, 3],
                                                         "seconds": [1.0, 1.2, 1.5]})
  assert calibration.lookup_gamma_costs(key, kw["gamma"]) is None


# ------------------------------------------------------------------ misuse

def test_misuse_is_named():
  lm, params = target()
  dm, dp = small_draft()
  prompts, lengths = ragged_prompts(batch=2)
  for bad, match in (((), "non-empty"), ((0,), "at least one"), ((1, 1), "distinct"),
                     ((-1, 2), "gammas\\[0\\]"), ("0,1,2", "non-empty sequence")):
    with pytest.raises((ValueError, TypeError), match=match):
      AdaptiveGamma(gammas=bad)
  with pytest.raises(ValueError, match="decay"):
    AdaptiveGamma(decay=1.0)
  with pytest.raises(ValueError, match="prior_alpha"):
    AdaptiveGamma(prior_alpha=0.0)
  with pytest.raises(ValueError,
                     match="switch_margin must be a finite number in \\[0, 10\\), got -0.1"):
    AdaptiveGamma(switch_margin=-0.1)
  for bad in (1.0, -0.01):
    with pytest.raises(ValueError, match="retry_budget must be a finite number in \\[0, 1\\)"):
      AdaptiveGamma(retry_budget=bad)
  with pytest.raises(ValueError, match="batch_objective must be one of .*'finish'.*got 'fast'"):
    AdaptiveGamma(batch_objective="fast")
  kw = dict(max_new_tokens=8, sampling=GREEDY)
  with pytest.raises(ValueError, match="gamma must be an int >= 1, 'auto'"):
    specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, gamma="fast", **kw)
  with pytest.raises(ValueError, match="gamma_costs is for gamma='auto'"):
    specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, gamma=3,
                                 gamma_costs=COSTS, **kw)
  with pytest.raises(ValueError, match="5 positive finite numbers"):
    specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, gamma="auto",
                                 gamma_costs=(1, 2, 3), **kw)
  with pytest.raises(ValueError, match="5 positive finite numbers"):
    specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, gamma="auto",
                                 gamma_costs=(1, 2, 0, 3, 4), **kw)
  with pytest.raises(ValueError, match="Lookahead fixes its own call"):
    specjax.speculative_generate(lm, params, Lookahead(), None, prompts, lengths, gamma="auto",
                                 gamma_costs=COSTS, **kw)
  with pytest.raises(ValueError, match="needs gamma_costs"):
    SpeculativeDecoder(lm, ModelDrafter(dm), 8, GREEDY, 8, adaptive=AdaptiveGamma()).run(
        params, dp, prompts, lengths, None, None, None)
  with pytest.raises(ValueError, match="must be max"):
    SpeculativeDecoder(lm, ModelDrafter(dm), 4, GREEDY, 8, adaptive=AdaptiveGamma())


def test_gammas_beyond_the_output_are_dropped():
  """Γ values above max(1, max_new_tokens - 1) could never commit their
  drafts: the loop runs with the rest (and sizes its caches for them)."""
  assert AdaptiveGamma().limited_to(3).gammas == (0, 1, 2)
  assert AdaptiveGamma(gammas=(4, 8)).limited_to(2).gammas == (2,)
  lm, params = target()
  dm, dp = small_draft()
  prompts, lengths = ragged_prompts(batch=2)
  out = specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, max_new_tokens=4,
                                     sampling=GREEDY, gamma="auto", gamma_costs=COSTS)
  assert out.stats.accepted_hist.shape == (2, 3)
  assert out.draft_cache.max_len == specjax.required_cache_len(lm, prompts.shape[1], 4, 2)


def test_a_block_of_plain_steps_decays_as_its_steps_would():
  cfg = AdaptiveGamma()
  st = AdaptState.zeros(2, 12).replace(accepted_B2=jnp.asarray([[3.0, 1.0], [0.5, 2.0]]),
                                       rejected_B2=jnp.asarray([[1.0, 0.0], [4.0, 1.0]]))
  one_by_one = st
  zero = jnp.zeros(2, jnp.int32)
  for i in range(3, 8):
    one_by_one = adaptive.observe(cfg, one_by_one, zero, zero, jnp.ones(2, bool), jnp.asarray(i))
  block = adaptive.idle_block(cfg, st, jnp.asarray(3), jnp.asarray(8))
  np.testing.assert_allclose(block.accepted_B2, one_by_one.accepted_B2, rtol=1e-6)
  np.testing.assert_allclose(block.rejected_B2, one_by_one.rejected_B2, rtol=1e-6)
  assert np.asarray(block.trace_I).tolist() == [-1] * 3 + [0] * 5 + [-1] * 4


# ------------------------------------------------- where drafting cannot pay

NO_PAY = (1.0, 3.0, 3.5, 4.0, 5.0)  # at the prior's α = 0.5 no γ > 0 pays


def test_prior_may_draft_agrees_with_the_loop_rule():
  rng = np.random.default_rng(0)
  for cfg in (AdaptiveGamma(), AdaptiveGamma(prior_alpha=0.8),
              AdaptiveGamma(prior_weight=0.0), AdaptiveGamma(gammas=(1, 2, 4))):
    for _ in range(60):
      costs = tuple(np.sort(rng.uniform(0.5, 4.0, len(cfg.gammas))).tolist())
      if rng.random() < 0.2:
        costs = costs[::-1]     # a γ > 0 cheapest: the loop never settles at 0
      st = AdaptState.zeros(3, 4)
      in_graph = bool(adaptive.may_draft(cfg, st, jnp.asarray(costs), jnp.ones(3, bool)))
      assert adaptive.prior_may_draft(cfg, costs) == in_graph, (cfg, costs)
  assert not adaptive.prior_may_draft(AdaptiveGamma(), NO_PAY)
  assert adaptive.prior_may_draft(AdaptiveGamma(), COSTS)


def test_may_draft_bounds_what_idle_decay_can_reach():
  cfg = AdaptiveGamma(per_row=True)
  active = jnp.ones(2, bool)
  good = AdaptState.zeros(2, 4).replace(accepted_B2=jnp.asarray([[0.0, 0.0], [30.0, 30.0]]))
  bad = AdaptState.zeros(2, 4).replace(rejected_B2=jnp.full((2, 2), 30.0))
  # A row that accepts everything may still pay where the prior does not ...
  assert bool(adaptive.may_draft(cfg, good, jnp.asarray(NO_PAY), active))
  # ... unless it finished.
  assert not bool(adaptive.may_draft(cfg, good, jnp.asarray(NO_PAY), jnp.asarray([True, False])))
  # Rows that fail drift back to the prior, which does not pay here, but does with COSTS.
  assert not bool(adaptive.may_draft(cfg, bad, jnp.asarray(NO_PAY), active))
  assert bool(adaptive.may_draft(cfg, bad, jnp.asarray(COSTS), active))
  # A batch-wide γ must pay for the whole batch's call, by the switch margin.
  batch = AdaptiveGamma()
  assert not bool(adaptive.may_draft(batch, good, jnp.asarray(NO_PAY), active))
  both = good.replace(accepted_B2=jnp.full((2, 2), 30.0))
  assert bool(adaptive.may_draft(batch, both, jnp.asarray(NO_PAY), active))
  # A series' row may still probe: when its evidence idles away before the end, or
  # while it is probing.
  carried = AdaptState.zeros(2, 4, start=specjax.Acceptance(
      np.asarray([1.0, 0.0], np.float32), np.zeros(2, np.float32)))
  assert not bool(adaptive.may_draft(batch, carried, jnp.asarray(NO_PAY), active, 290))
  assert bool(adaptive.may_draft(batch, carried, jnp.asarray(NO_PAY), active, 310))
  probing = carried.replace(probe_B=jnp.asarray([0, 2], jnp.int32))
  assert bool(adaptive.may_draft(batch, probing, jnp.asarray(NO_PAY), active, 5))


def test_where_drafting_cannot_pay_auto_is_plain_decoding():
  lm, params = target()
  dm, dp = small_draft()
  prompts, lengths = ragged_prompts(batch=4, seed=5)
  keys = jax.random.split(jax.random.key(7), 4)
  kw = dict(max_new_tokens=10, sampling=SamplingConfig(1.0), eos_id=EOS, key=keys)
  ref = specjax.generate(lm, params, prompts, lengths, **kw)
  out = specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, gamma="auto",
                                     gamma_costs=NO_PAY, **kw)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  calls = np.asarray(out.stats.target_calls)
  np.testing.assert_array_equal(calls, np.asarray(ref.stats.target_calls))
  hist = np.asarray(out.stats.accepted_hist)
  assert hist.shape == (4, 9) and (hist[:, 0] == calls - 1).all() and (hist[:, 1:] == 0).all()
  trace = np.asarray(out.stats.gamma_trace)
  assert trace.shape == (10,) and (trace[trace >= 0] == 0).all()
  assert int((trace >= 0).sum()) == calls.max() - 1 and (trace[calls.max() - 1:] == -1).all()
  assert int(np.asarray(out.stats.draft_calls).sum()) == 0
  # The loop itself, given the same costs, runs plain steps to the end (greedy:
  # the same tokens) and never drafts.
  need = specjax.required_cache_len(lm, prompts.shape[1], 10, 2)
  dec = SpeculativeDecoder(lm, ModelDrafter(dm), 2, GREEDY, 10, EOS,
                           adaptive=AdaptiveGamma(gammas=(0, 1, 2)))
  loop = dec.run(params, dp, prompts, lengths, keys, lm.init_cache(4, need),
                 dm.init_cache(4, need), gamma_costs=NO_PAY[:3])
  greedy = specjax.generate(lm, params, prompts, lengths, max_new_tokens=10, sampling=GREEDY,
                            eos_id=EOS)
  np.testing.assert_array_equal(np.asarray(loop.tokens), np.asarray(greedy.tokens))
  assert (np.asarray(loop.stats.gamma_trace) <= 0).all()
  assert int(np.asarray(loop.stats.draft_calls).sum()) == 0


# ------------------------------------------- what a previewing drafter shows

def test_a_previewed_draft_is_an_observation():
  cfg = AdaptiveGamma()
  st = AdaptState.zeros(5, 4).replace(peek_B=jnp.asarray([5, 5, -1, 7, 7]))
  active = jnp.ones(5, bool)
  valid = jnp.asarray([0, 0, 0, 2, 2])
  accepted = jnp.asarray([0, 0, 0, 2, 1])
  nxt = jnp.asarray([5, 6, 5, 7, 7])
  out = adaptive.observe(cfg, st, accepted, valid, active, jnp.asarray(0), nxt)
  np.testing.assert_array_equal(np.asarray(out.accepted_B2),
                                [[1, 0], [0, 0], [0, 0], [1, 2], [1, 0]])
  np.testing.assert_array_equal(np.asarray(out.rejected_B2),
                                [[0, 0], [1, 0], [0, 0], [0, 0], [0, 1]])
  # Without the target's token nothing is learned from the preview.
  blind = adaptive.observe(cfg, st, accepted, valid, active, jnp.asarray(0))
  np.testing.assert_array_equal(np.asarray(blind.accepted_B2)[:3], 0)


def test_prompt_lookup_learns_from_plain_steps_where_the_prior_does_not_pay():
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=4, max_len=12, seed=4)
  costs = (1.0, 1.6, 1.8, 2.0, 2.6)   # at α = 0.5 no γ > 0 pays; at α = 0.9, γ >= 4 does
  assert not adaptive.prior_may_draft(AdaptiveGamma(), costs)
  kw = dict(max_new_tokens=40, sampling=GREEDY)
  ref = specjax.generate(lm, params, prompts, lengths, **kw)
  # Per row: a batch-wide γ drafts only where most rows pay for the call.
  out = specjax.speculative_generate(lm, params, PromptLookup(max_ngram=3), None, prompts,
                                     lengths, gamma=AdaptiveGamma(per_row=True),
                                     gamma_costs=costs, **kw)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  trace = np.asarray(out.stats.gamma_trace)
  # Greedy text from a small random model repeats itself: the plain steps see the
  # copies accepted, and the rule starts drafting, up to the matched room.
  # Per row ([B, I]): each row's own drafts, as many as its lookup matched.
  assert (trace[:, 0] == 0).all() and (trace >= 3).any(), trace
  assert int(np.asarray(out.stats.accepted).sum()) > 0


# ------------------------------------------------- an estimate carried across calls

def test_rows_without_evidence_probe_only_in_a_series():
  costs = jnp.asarray(NO_PAY)
  active = jnp.ones((3,), bool)
  cfg = AdaptiveGamma(explore_steps=2)
  start = specjax.Acceptance(np.asarray([5e-5, 0.0], np.float32), np.zeros(2, np.float32))
  # One call on its own never probes where the prior does not pay ...
  branch, limit = adaptive.choose(cfg, AdaptState.zeros(3, 4), costs, active)
  assert int(branch) == 0 and (np.asarray(limit) == 0).all()
  # ... a series' rows without evidence do, at the smallest γ > 0, ...
  st = AdaptState.zeros(3, 4, start=start)
  branch, limit = adaptive.choose(cfg, st, costs, active)
  assert cfg.gammas[int(branch)] == 1 and (np.asarray(limit) == 1).all()
  # ... for explore_steps drafting iterations, whatever they observe ...
  for i in range(2):
    st = adaptive.observe(cfg, st.replace(branch=branch, limit_B=limit), jnp.zeros(3, int),
                          jnp.ones(3, int), active, jnp.asarray(i))
    branch, limit = adaptive.choose(cfg, st, costs, active)
    assert cfg.gammas[int(branch)] == (1 if i == 0 else 0), i
  # ... and a row with evidence does not (per row: only the fresh row drafts).
  mixed = AdaptState.zeros(3, 4, start=start).replace(
      rejected_B2=jnp.asarray([[0.0, 0.0], [3.0, 0.0], [2e-4, 0.0]]))
  _, limit = adaptive.choose(AdaptiveGamma(per_row=True), mixed, costs, active)
  np.testing.assert_array_equal(np.asarray(limit), [1, 0, 0])
  # A probe needs room: a prompt-lookup row without a match cannot.
  _, limit = adaptive.choose(cfg, AdaptState.zeros(3, 4, start=start), costs, active,
                             jnp.asarray([0, 0, 3]))
  np.testing.assert_array_equal(np.asarray(limit), [0, 0, 1])


def test_what_a_series_carries_between_calls():
  cfg = AdaptiveGamma()
  fresh = specjax.Acceptance.fresh()
  assert adaptive.probe_due(cfg, fresh, 1)
  one = specjax.Acceptance(np.asarray([1.0, 2.0], np.float32), np.zeros(2, np.float32))
  # 0.97^32 = 0.38 of one observation is left after a 32-token call; 0.97^310 = 8e-5.
  assert not adaptive.probe_due(cfg, one, 32) and adaptive.probe_due(cfg, one, 310)
  assert not adaptive.probe_due(cfg, one, 290)
  idled = adaptive.after_idle(cfg, one, jnp.asarray([10, 30]))
  d = (0.97 ** 10 + 0.97 ** 30) / 2
  np.testing.assert_allclose(np.asarray(idled.accepted_2), [d, 2 * d], rtol=1e-5)
  st = AdaptState.zeros(2, 3, start=one).replace(
      rejected_B2=jnp.asarray([[1.0, 0.0], [3.0, 2.0]]))
  pooled = st.pooled()
  np.testing.assert_allclose(np.asarray(pooled.rejected_2), [2.0, 1.0])
  np.testing.assert_allclose(np.asarray(pooled.accepted_2), [1.0, 2.0])


def test_a_series_learns_a_pair_the_prior_undervalues():
  """Costs at which the prior (α = 0.5) never drafts: a call on its own runs
  plain decoding; a series probes, finds a draft that is always right (the
  target itself) and climbs to max Γ; a draft that is mostly wrong is
  dropped after its probe, later calls run plain decoding's program, and
  the estimate idles. Greedy tokens equal the target's throughout."""
  lm, params = target()
  dm, dp = small_draft()
  prompts, lengths = ragged_prompts(batch=4, seed=5)
  costs = (1.0, 1.6, 1.8, 2.2, 3.0)
  assert not adaptive.prior_may_draft(AdaptiveGamma(), costs)
  kw = dict(max_new_tokens=12, sampling=GREEDY, eos_id=EOS, gamma_costs=costs)
  ref = np.asarray(specjax.generate(lm, params, prompts, lengths, max_new_tokens=12,
                                    sampling=GREEDY, eos_id=EOS).tokens)
  alone = specjax.speculative_generate(lm, params, lm, params, prompts, lengths, gamma="auto",
                                       **kw)
  assert (np.asarray(alone.stats.gamma_trace) <= 0).all()
  acc, traces = specjax.Acceptance.fresh(), []
  for _ in range(4):
    out = specjax.speculative_generate(lm, params, lm, params, prompts, lengths, gamma="auto",
                                       acceptance=acc, **kw)
    np.testing.assert_array_equal(np.asarray(out.tokens), ref)
    acc, trace = out.stats.acceptance, np.asarray(out.stats.gamma_trace)
    traces.append(trace[trace >= 0].tolist())
  # The probe drafts one token; once it is accepted, the later drafts' rate
  # starts from the first's (one rate) and the call climbs at once.
  assert traces[0][0] == 1 and max(traces[0]) >= 4, traces
  assert max(traces[-1]) == 8 and min(traces[-1]) >= 4, traces
  assert float(np.asarray(acc.rejected_2).sum()) == 0
  acc = specjax.Acceptance.fresh()
  for call in range(3):
    out = specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, gamma="auto",
                                       acceptance=acc, **kw)
    np.testing.assert_array_equal(np.asarray(out.tokens), ref)
    drafted = int(np.asarray(out.stats.draft_calls).sum())
    if call == 0:
      assert drafted > 0 and float(np.asarray(out.stats.acceptance.rejected_2)[0]) > 1
    else:   # plain decoding's program: no draft cache, the estimate idled
      assert drafted == 0 and out.draft_cache is None
      steps = np.asarray(out.stats.target_calls) - 1
      np.testing.assert_allclose(np.asarray(out.stats.acceptance.rejected_2),
                                 np.asarray(acc.rejected_2) * np.mean(0.97 ** steps),
                                 rtol=1e-5)
    acc = out.stats.acceptance


def test_carried_estimate_misuse_is_named():
  lm, params = target()
  dm, dp = small_draft()
  prompts, lengths = ragged_prompts(batch=2)
  kw = dict(max_new_tokens=8, sampling=GREEDY)
  with pytest.raises(ValueError, match="acceptance is for gamma='auto'"):
    specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, gamma=3,
                                 acceptance=specjax.Acceptance.fresh(), **kw)
  with pytest.raises(TypeError, match="acceptance must be a specjax.Acceptance"):
    specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, gamma="auto",
                                 gamma_costs=COSTS, acceptance=(1.0, 0.0), **kw)
  bad = specjax.Acceptance(np.asarray([1.0, -1.0]), np.zeros(2))
  with pytest.raises(ValueError, match="acceptance.accepted_2 must be 2 finite counts >= 0"):
    specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, gamma="auto",
                                 gamma_costs=COSTS, acceptance=bad, **kw)
  with pytest.raises(ValueError, match="explore_steps"):
    AdaptiveGamma(explore_steps=0)


def test_a_row_that_only_drafted_one_token_learns_longer_drafts_pay():
  """The later drafts' rate starts from the first draft's (one rate): after
  first drafts that were all accepted at γ = 1, a longer γ is chosen where
  the costs reward it (the EAGLE-1 chain's measured costs on the Chen quick
  pair, relative); with a fixed prior of 0.5 for it, γ = 1 would stay best."""
  cfg = AdaptiveGamma()
  costs = (1.0, 1.65, 2.13, 2.93, 3.26)
  chosen = _run_rule(cfg, [(1, 1)] * 6, costs=costs)
  assert chosen[-1] == 8, chosen
  alpha = np.asarray(adaptive.estimated_alpha(cfg, _observed(cfg, [(1, 1)] * 6)))
  assert alpha[0, 0] > 0.8 and alpha[0, 1] == pytest.approx(
      (0.0 + alpha[0, 0] * cfg.prior_weight) / cfg.prior_weight, rel=1e-5)
  # Later drafts that fail pull the second rate down (and γ with it).
  assert _run_rule(cfg, [(8, 1)] * 8, costs=costs)[-1] <= 2


def _observed(cfg, outcomes):
  st = AdaptState.zeros(1, len(outcomes) + 1)
  for i, (valid, acc) in enumerate(outcomes):
    st = adaptive.observe(cfg, st, jnp.asarray([acc]), jnp.asarray([valid]), jnp.ones(1, bool),
                          jnp.asarray(i))
  return st


def test_a_row_that_dipped_drifts_back_to_its_long_run_rate():
  """A row whose long-run first-draft rate is high (the slow counts) but
  whose last drafts failed stops drafting, then, idling, drifts back to the
  long-run rate and drafts again; the same recent failures without that
  history drift to the prior, which does not pay at these costs (the
  EAGLE-1 chain's on the Chen quick pair, relative)."""
  cfg = AdaptiveGamma(per_row=True)
  costs = jnp.asarray([1.0, 1.65, 2.13, 2.93, 3.26])
  active = jnp.ones(2, bool)
  st = AdaptState.zeros(2, 400).replace(
      rejected_B2=jnp.asarray([[3.0, 0.0], [3.0, 0.0]]),
      slow_B2=jnp.asarray([[45.0, 3.0], [0.0, 3.0]]))
  assert (np.asarray(adaptive.choose(cfg, st, costs, active)[1]) == 0).all()
  assert bool(adaptive.may_draft(cfg, st, costs, active))
  drafts_at = [None, None]
  for step in range(1, 300):
    st = adaptive.idle_block(cfg, st, jnp.asarray(step - 1), jnp.asarray(step))
    limit = np.asarray(adaptive.choose(cfg, st, costs, active)[1])
    for r in (0, 1):
      if limit[r] and drafts_at[r] is None:
        drafts_at[r] = step
  assert drafts_at[0] is not None and drafts_at[0] < 60, drafts_at
  assert drafts_at[1] is None, drafts_at
  assert not bool(adaptive.may_draft(cfg, st.replace(slow_B2=st.slow_B2.at[0].set(0.0)),
                                     costs, active))


def test_may_draft_bounds_every_later_choice():
  """Random estimates and costs: where plain steps (idle decay) ever lead
  `choose` to draft, `may_draft` said so before the first of them."""
  rng = np.random.default_rng(3)
  for cfg in (AdaptiveGamma(per_row=True), AdaptiveGamma()):
    for _ in range(12):
      st = AdaptState.zeros(3, 200).replace(
          accepted_B2=jnp.asarray(rng.uniform(0, 6, (3, 2)), jnp.float32),
          rejected_B2=jnp.asarray(rng.uniform(0, 6, (3, 2)), jnp.float32),
          slow_B2=jnp.asarray(rng.uniform(0, 40, (3, 2)), jnp.float32))
      costs = jnp.asarray(np.sort(rng.uniform(1.0, 4.0, 5)), jnp.float32)
      active = jnp.ones(3, bool)
      said = bool(adaptive.may_draft(cfg, st, costs, active))
      ever = False
      for step in range(0, 150, 3):
        later = adaptive.idle_block(cfg, st, jnp.asarray(0), jnp.asarray(step))
        ever |= bool(np.asarray(adaptive.choose(cfg, later, costs, active)[1]).any())
      assert said or not ever, (cfg.per_row, st, costs)


def test_the_long_run_rate_is_carried_between_calls():
  cfg = AdaptiveGamma()
  carried = specjax.Acceptance(np.asarray([0.2, 0.0], np.float32), np.asarray([0.3, 0.0],
                               np.float32), np.asarray([40.0, 5.0], np.float32))
  st = AdaptState.zeros(2, 3, start=carried)
  np.testing.assert_allclose(np.asarray(st.slow_B2), [[40.0, 5.0]] * 2)
  m = cfg.prior_weight   # the prior's 0.5 as m pseudo-trials
  assert float(adaptive.long_run_alpha(cfg, st)[0, 0]) == pytest.approx((40 + 0.5 * m) / (45 + m))
  np.testing.assert_allclose(np.asarray(st.pooled().long_run_2), [40.0, 5.0])
  idled = adaptive.after_idle(cfg, carried, jnp.asarray([10, 10]))
  np.testing.assert_allclose(np.asarray(idled.long_run_2), np.asarray([40.0, 5.0]) * 0.995 ** 10,
                             rtol=1e-5)
  np.testing.assert_allclose(np.asarray(idled.accepted_2), [0.2 * 0.97 ** 10, 0.0], rtol=1e-5)
  # Without a long-run record (an estimate from an older call): its first drafts' counts.
  old = adaptive.check_acceptance(specjax.Acceptance(np.asarray([2.0, 1.0], np.float32),
                                                     np.asarray([1.0, 0.0], np.float32)))
  np.testing.assert_allclose(old.long_run_2, [2.0, 1.0])
  with pytest.raises(ValueError, match="acceptance.long_run_2 must be 2 finite counts"):
    adaptive.check_acceptance(specjax.Acceptance(np.zeros(2, np.float32), np.zeros(2, np.float32),
                                                 np.asarray([1.0, -1.0], np.float32)))
  with pytest.raises(ValueError, match="slow_idle_decay"):
    AdaptiveGamma(slow_idle_decay=1.0)


# ------------------------------------------------ retries after a row stopped

def _retry_gaps(cfg, first_draft_accepted, steps=120):
  """One row that drafted and stopped (its recent first drafts failed),
  stepped through choose / observe one iteration at a time; each retry's
  first draft accepted or not as `first_draft_accepted` says, in order.
  Returns the plain steps before each drafting iteration."""
  costs, active = jnp.asarray(COSTS), jnp.ones((1,), bool)
  st = AdaptState.zeros(1, steps, retries=True).replace(   # a long record of failures
      rejected_B2=jnp.asarray([[20.0, 0.0]]), slow_B2=jnp.asarray([[0.0, 40.0]]),
      idle_B=jnp.zeros((1,), jnp.int32))
  outcomes, gaps, waited = list(first_draft_accepted), [], 0
  for i in range(steps):
    branch, limit = adaptive.choose(cfg, st, costs, active)
    if waited == 0:
      said = int(adaptive.steps_to_retry(cfg, st, costs, active))
    if int(limit[0]) == 0:
      st = adaptive.observe(cfg, st.replace(branch=branch, limit_B=limit),
                            jnp.zeros(1, jnp.int32), jnp.zeros(1, jnp.int32), active,
                            jnp.asarray(i))
      waited += 1
      continue
    if not outcomes:
      break
    assert int(limit[0]) == 1, limit     # a retry drafts one token
    if gaps:   # the loop's plain segments end where steps_to_retry said
      assert said == waited, (said, waited)
    gaps.append(waited)
    waited = 0
    st = adaptive.observe(cfg, st.replace(branch=branch, limit_B=limit),
                          jnp.asarray([int(outcomes.pop(0))]), jnp.asarray([1]), active,
                          jnp.asarray(i))
  return gaps


def test_a_row_that_stopped_retries_with_a_doubling_wait():
  cfg = AdaptiveGamma()
  costs = jnp.asarray(COSTS)
  # (c(1) - c(0)) / (retry_budget · c(0)) = 0.2 / 0.05 plain steps.
  assert float(adaptive.retry_wait(cfg, costs)) == pytest.approx(4.0, rel=1e-5)
  assert float(adaptive.retry_wait(AdaptiveGamma(retry_budget=0.1), costs)) == pytest.approx(2.0)
  assert np.isinf(float(adaptive.retry_wait(AdaptiveGamma(retry_budget=0.0), costs)))
  assert np.isinf(float(adaptive.retry_wait(AdaptiveGamma(gammas=(1, 2)), costs[1:3])))
  # Rejected retries double the wait; an accepted one resets it.
  assert _retry_gaps(cfg, [False] * 4) == [4, 8, 16, 32]
  assert _retry_gaps(cfg, [False, False, True, False]) == [4, 8, 16, 4]
  assert _retry_gaps(AdaptiveGamma(retry_budget=0.1), [False] * 3) == [2, 4, 8]
  # Without a budget the row waits for the idle drift alone (far longer).
  assert _retry_gaps(AdaptiveGamma(retry_budget=0.0), [False], steps=40) == []
  # A row that has not drafted in this call (its prior never paid) does not retry,
  # nor does a state without retries (the rule's functions on their own).
  fresh = AdaptState.zeros(1, 4, retries=True)   # idle_B -1: not drafted yet
  assert int(adaptive.steps_to_retry(cfg, fresh, costs, jnp.ones((1,), bool))) >= 2 ** 30 - 1
  idle = AdaptState.zeros(1, 4).replace(idle_B=jnp.asarray([50], jnp.int32),
                                        rejected_B2=jnp.asarray([[9.0, 0.0]]))
  assert int(adaptive.choose(cfg, idle, costs, jnp.ones((1,), bool))[1][0]) == 0
  assert int(adaptive.choose(cfg, idle.replace(retries=True), costs,
                             jnp.ones((1,), bool))[1][0]) == 1


def test_a_batch_retries_once_every_row_that_drafted_is_due():
  """Batch mode, "finish": a retry is the batch's drafting call, taken when
  the last row that drafted is due (a row that never drafted does not
  count); "throughput" and per-row mode: when any row is due."""
  costs, active = jnp.asarray(COSTS), jnp.ones((3,), bool)   # a wait of 4 plain steps
  st = AdaptState.zeros(3, 8, retries=True).replace(
      rejected_B2=jnp.full((3, 2), 20.0), slow_B2=jnp.asarray([[0.0, 40.0]] * 3))
  thr, per_row, cfg = (AdaptiveGamma(batch_objective="throughput"),
                       AdaptiveGamma(per_row=True), AdaptiveGamma())

  def drafts(c, idle):
    s = st.replace(idle_B=jnp.asarray(idle, jnp.int32))
    return (c.gammas[int(adaptive.choose(c, s, costs, active)[0])],
            int(adaptive.steps_to_retry(c, s, costs, active)))

  assert drafts(cfg, [9, 2, -1]) == (0, 2)   # row 1 is due in 2 steps; row 2 never drafted
  assert drafts(cfg, [9, 4, -1]) == (1, 0)
  assert drafts(cfg, [9, 4, 0]) == (0, 4)    # row 2 drafted just now: its wait counts
  assert drafts(thr, [9, 2, -1]) == (1, 0)
  assert drafts(per_row, [9, 2, -1]) == (1, 0)
  assert drafts(cfg, [-1, -1, -1])[1] >= 2 ** 30 - 1   # none drafted: no retry


def _wrong_draft():
  """The target with its output columns rotated: its argmax is always the
  target's minus one, so at T = 0 every first draft is rejected."""
  lm, params = target()
  return lm, dict(params, lm_head={"kernel": jnp.roll(params["lm_head"]["kernel"], -1, axis=1)})


@pytest.mark.parametrize("per_row", [False, True])
def test_the_loop_retries_a_failing_draft_on_schedule(per_row):
  lm, params = target()
  _, wrong = _wrong_draft()
  prompts, lengths = ragged_prompts(batch=2)
  kw = dict(max_new_tokens=64, sampling=GREEDY, gamma_costs=COSTS)
  ref = specjax.generate(lm, params, prompts, lengths, max_new_tokens=64, sampling=GREEDY)

  def runs(budget):
    out = specjax.speculative_generate(lm, params, lm, wrong, prompts, lengths, gamma=AdaptiveGamma(
        retry_budget=budget, per_row=per_row), **kw)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    assert int(np.asarray(out.stats.accepted).sum()) == 0   # the rig: every draft fails
    trace = np.asarray(out.stats.gamma_trace)
    trace = trace[trace >= 0]
    stop = int(np.argmax(trace == 0))
    assert stop > 0 and (trace[:stop] > 0).all()   # the prior drafts, then the row stops
    after = "".join("0" if g == 0 else "1" if g == 1 else "x" for g in trace[stop:])
    return [len(r) for r in after.split("1")], after

  zeros, after = runs(0.05)
  assert "x" not in after                     # each retry is one draft
  assert zeros[:3] == [4, 8, 16], after
  if not per_row:   # (per row, with no switch margin, the idle drift drafts again later)
    assert len(zeros) == 4 and zeros[-1] < 32, after
  zeros, after = runs(0.0)
  assert zeros[0] > 4, after                  # no budget: the idle drift alone, later
  if not per_row:
    assert after == "0" * len(after), after   # (batch mode: not within the call)
