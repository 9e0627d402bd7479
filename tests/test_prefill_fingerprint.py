"""A prefill belongs to its call (issue 71, item 4): `specjax.prefill` records what it was made
from (`Prefill.origin`) and a call with other prompts, lengths, target, sampling or key, or one
needing more tokens, refuses it naming each difference; padding is not part of the prompts, a
copy keeps the record and every prefill of a shape runs one compiled program. Table models
(`BigramLM`): their loops compile in about a second."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.generation import autoregressive_loop
from specjax.models.ngram import BigramLM, UnigramLM
from tiny import VOCAB

SAMPLED = specjax.SamplingConfig(1.0)


@pytest.fixture(scope="module")
def made():
  lm = BigramLM(VOCAB)
  params = {"logits": jnp.asarray(np.random.default_rng(0).normal(0, 2, (VOCAB, VOCAB)),
                                  jnp.float32)}
  prompts = np.random.default_rng(1).integers(6, VOCAB, (4, 5)).astype(np.int32)
  lengths = np.array([5, 3, 4, 2], np.int32)
  keys = jax.random.split(jax.random.key(3), 4)
  pre = specjax.prefill(lm, params, prompts, lengths, max_new_tokens=6, sampling=SAMPLED,
                        key=keys)
  return lm, params, prompts, lengths, keys, pre


def _copy(pre):
  return jax.tree.map(jnp.copy, pre)


def test_a_matching_call_decodes_from_it_exactly_and_compiles_once(made):
  lm, params, prompts, lengths, keys, pre = made
  kw = dict(max_new_tokens=6, sampling=SAMPLED, key=keys)
  ref = specjax.generate(lm, params, prompts, lengths, **kw)
  padded = prompts.copy()
  padded[3, 2:] = 63      # past row 3's length: padding, not part of the prompt
  before = autoregressive_loop._cache_size()
  for p in (prompts, padded):
    out = specjax.generate(lm, params, p, lengths, prefilled=_copy(pre), **kw)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
  assert autoregressive_loop._cache_size() - before <= 1   # the origin is not traced
  assert _copy(pre).origin == pre.origin


@pytest.mark.parametrize("change, want", [
    ("prompts", r"prompts differ in row 2 \(their ids within the lengths\)"),
    ("lengths", r"prompt_lengths differ in row 1 \(row 1: 2, the prefill's 3\)"),
    ("sampling", r"sampling is .*temperature=0.5.*, the prefill's .*temperature=1.0"),
    ("key", r"key differs in rows 0, 1, 2, 3 \(the first token was drawn with the prefill's"),
    ("target", r"it was made with another target \(BigramLM\), not this UnigramLM"),
])
def test_a_call_it_was_not_made_for_is_refused_by_name(made, change, want):
  lm, params, prompts, lengths, keys, pre = made
  kw = dict(max_new_tokens=6, sampling=SAMPLED, key=keys)
  prompts, lengths = prompts.copy(), lengths.copy()
  if change == "prompts":
    prompts[2, 0] = (prompts[2, 0] + 1) % VOCAB
  elif change == "lengths":
    lengths[1] = 2
  elif change == "sampling":
    kw["sampling"] = specjax.SamplingConfig(0.5)
  elif change == "key":
    kw["key"] = jax.random.key(4)
  elif change == "target":
    lm, params = UnigramLM(VOCAB), {"logits": params["logits"][0]}
  with pytest.raises(ValueError, match=r"prefilled is not a prefill of this call .*" + want):
    specjax.generate(lm, params, prompts, lengths, prefilled=_copy(pre), **kw)


def test_more_tokens_than_it_was_sized_for_are_named(made):
  lm, params, prompts, lengths, keys, pre = made
  with pytest.raises(ValueError, match=r"prefilled was made with max_new_tokens=6, gamma=0"):
    specjax.speculative_generate(lm, params, lm, params, prompts, lengths, max_new_tokens=6,
                                 gamma=2, sampling=SAMPLED, key=keys, prefilled=_copy(pre))
  with pytest.raises(ValueError, match=r"prompts differ in row 0"):
    other = prompts.copy()
    other[0, 4] = (other[0, 4] + 1) % VOCAB
    specjax.speculative_generate(lm, params, lm, params, other, lengths, max_new_tokens=4,
                                 gamma=1, sampling=SAMPLED, key=keys, prefilled=_copy(pre))


def test_greedy_prefills_ignore_the_key(made):
  lm, params, prompts, lengths, _, _ = made
  pre = specjax.prefill(lm, params, prompts, lengths, max_new_tokens=4, sampling=specjax.GREEDY)
  ref = specjax.generate(lm, params, prompts, lengths, max_new_tokens=4, sampling=specjax.GREEDY)
  out = specjax.generate(lm, params, prompts, lengths, max_new_tokens=4, key=jax.random.key(9),
                         sampling=specjax.GREEDY, prefilled=pre)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
