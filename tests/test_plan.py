"""The plan step: `speculative_generate` = validate -> `SpeculativePlan` -> decode.

`plan_speculative` returns the plan of a call without running it; these tests check that the
plan states what the call runs (γ, Γ, cache sizes, plain or speculative) and that running the
plan's decoder gives the call's tokens.
"""

import jax
import numpy as np
import pytest

import specjax
from specjax import drafters
from specjax.adaptive import AdaptiveGamma
from specjax.sampling import SamplingConfig
from tiny import ragged_prompts, small_draft, target

N = 8


def _pair():
  (lm, params), (dm, dp) = target(), small_draft()
  return lm, params, dm, dp


def test_the_plan_of_a_fixed_gamma_call():
  lm, params, dm, dp = _pair()
  prompts, lengths = ragged_prompts(batch=3)
  plan = specjax.plan_speculative(lm, params, dm, dp, prompts, lengths, max_new_tokens=N,
                                  gamma=3, sampling=specjax.GREEDY)
  assert isinstance(plan, specjax.SpeculativePlan)
  assert isinstance(plan.drafter, drafters.ModelDrafter) and plan.drafter.owns_model
  assert (plan.gamma, plan.call_len, plan.adaptive, plan.plain) == (3, 4, None, False)
  assert (plan.batch_size, plan.prompt_len, plan.max_new_tokens) == (3, prompts.shape[1], N)
  assert plan.cache_len == specjax.required_cache_len(lm, prompts.shape[1], N, 3)
  assert plan.draft_cache_len == specjax.required_cache_len(dm, prompts.shape[1], N, 3)
  assert plan.gamma_costs is None and plan.mesh is None
  # A drafter on the target's weights owns no model: no cache of its own.
  skip = specjax.plan_speculative(lm, params, drafters.LayerSkip(lm, [0]), None, prompts,
                                  lengths, max_new_tokens=N, gamma=2,
                                  sampling=specjax.GREEDY)
  assert not skip.drafter.owns_model and skip.draft_cache_len is None
  # cache_len sizes both caches.
  big = specjax.plan_speculative(lm, params, dm, dp, prompts, lengths, max_new_tokens=N,
                                 gamma=3, cache_len=64, sampling=specjax.GREEDY)
  assert (big.cache_len, big.draft_cache_len) == (64, 64)


def test_the_plan_lowers_a_gamma_that_max_new_tokens_cannot_use():
  lm, params, dm, dp = _pair()
  prompts, lengths = ragged_prompts(batch=2)
  with pytest.warns(UserWarning, match="using gamma=2") as rec:
    plan = specjax.plan_speculative(lm, params, dm, dp, prompts, lengths, max_new_tokens=3,
                                    gamma=8, sampling=specjax.GREEDY)
  assert plan.gamma == 2 and plan.call_len == 3
  assert rec[0].filename == __file__   # the warning points at the caller


def test_the_plan_of_gamma_auto_is_plain_where_no_gamma_pays():
  lm, params, dm, dp = _pair()
  prompts, lengths = ragged_prompts(batch=2)
  rule = AdaptiveGamma(gammas=(0, 1, 2))
  costly = specjax.plan_speculative(lm, params, dm, dp, prompts, lengths, max_new_tokens=N,
                                    gamma=rule, gamma_costs=[1.0, 50.0, 80.0],
                                    sampling=specjax.GREEDY)
  assert costly.plain and costly.adaptive.gammas == (0, 1, 2) and costly.gamma == 2
  assert costly.gamma_costs == (1.0, 50.0, 80.0)
  # Plain decoding needs no room for drafts.
  assert costly.cache_len == specjax.required_cache_len(lm, prompts.shape[1], N, 0)
  cheap = specjax.plan_speculative(lm, params, dm, dp, prompts, lengths, max_new_tokens=N,
                                   gamma=rule, gamma_costs=[1.0, 1.01, 1.02],
                                   sampling=specjax.GREEDY)
  assert not cheap.plain
  assert cheap.cache_len == specjax.required_cache_len(lm, prompts.shape[1], N, 2)
  assert isinstance(costly.decoder(), specjax.AutoregressiveDecoder)
  assert isinstance(cheap.decoder(), specjax.SpeculativeDecoder)


def test_gamma_auto_is_capped_at_the_drafters_limit_in_the_plan():
  lm, params, _, _ = _pair()
  prompts, lengths = ragged_prompts(batch=2)
  lookup = drafters.PromptLookup()
  plan = specjax.plan_speculative(lm, params, lookup, None, prompts, lengths, max_new_tokens=4,
                                  gamma="auto", gamma_costs=[1.0, 1.1, 1.2, 1.4, 1.8],
                                  sampling=specjax.GREEDY)
  # Γ {0, 1, 2, 4, 8} limited to the max(1, N - 1) = 3 drafts N = 4 tokens can use.
  assert max(plan.adaptive.gammas) <= 3 and plan.gamma == max(plan.adaptive.gammas)


def test_running_the_plan_gives_the_calls_tokens():
  lm, params, dm, dp = _pair()
  prompts, lengths = ragged_prompts(batch=3)
  kw = dict(max_new_tokens=N, gamma=2, sampling=SamplingConfig(1.0))
  keys = jax.random.split(jax.random.key(3), 3)
  out = specjax.speculative_generate(lm, params, dm, dp, prompts, lengths, key=keys, **kw)
  plan = specjax.plan_speculative(lm, params, dm, dp, prompts, lengths, key=keys, **kw)
  tcache = lm.init_cache(3, plan.cache_len, plan.prompt_len)
  dcache = dm.init_cache(3, plan.draft_cache_len, plan.prompt_len)
  again = plan.decoder().run(params, dp, prompts, lengths, keys, tcache, dcache)
  np.testing.assert_array_equal(np.asarray(again.tokens), np.asarray(out.tokens))
  # Equal arguments, equal plans (the same compiled program).
  assert plan == specjax.plan_speculative(lm, params, dm, dp, prompts, lengths, key=keys, **kw)


@pytest.mark.parametrize("kw, err, match", [
    (dict(gamma="fast"), ValueError, "gamma must be an int >= 1, 'auto'"),
    (dict(gamma=0), ValueError, "gamma"),
    (dict(gamma=2, gamma_costs=[1.0, 2.0]), ValueError, "gamma_costs is for gamma='auto'"),
    (dict(gamma=2, acceptance=specjax.Acceptance.fresh()), ValueError,
     "acceptance is for gamma='auto'"),
    (dict(gamma=2, verify_fn=3), TypeError, "verify_fn must be callable"),
])
def test_the_plan_refuses_what_the_call_refuses(kw, err, match):
  lm, params, dm, dp = _pair()
  prompts, lengths = ragged_prompts(batch=2)
  for fn in (specjax.plan_speculative, specjax.speculative_generate):
    with pytest.raises(err, match=match):
      fn(lm, params, dm, dp, prompts, lengths, max_new_tokens=N, sampling=specjax.GREEDY,
         **kw)


def test_a_draft_cache_is_refused_for_a_drafter_without_a_model():
  lm, params, dm, _ = _pair()
  prompts, lengths = ragged_prompts(batch=2)
  with pytest.raises(ValueError, match="draft_cache is for a draft model; LayerSkip"):
    specjax.plan_speculative(lm, params, drafters.LayerSkip(lm, [0]), None, prompts, lengths,
                             max_new_tokens=N, gamma=2, draft_cache=dm.init_cache(2, 40),
                             sampling=specjax.GREEDY)


def test_something_that_is_neither_model_nor_drafter_is_named():
  lm, params, _, _ = _pair()
  prompts, lengths = ragged_prompts(batch=2)
  with pytest.raises(TypeError, match="draft must be a draft model .* got str: .*lacks"):
    specjax.plan_speculative(lm, params, "eagle", None, prompts, lengths, max_new_tokens=N,
                             sampling=specjax.GREEDY)
