"""Padding is never read: any int32 past a row's length (negative, >= the vocabulary,
2**31 - 1, -2**31) gives exactly the tokens of clean zero padding, through the real loop (no
stub), for a decoder, a T5 pair, the n-gram tables and the drafters that read the prompt
(prompt lookup, suffix, a draft model). Tiny models, each call compiled once (the garbage call
reuses the clean call's program: the same shapes)."""

import jax
import numpy as np
import pytest

import specjax
import tiny
from specjax.drafters import ModelDrafter, PromptLookup, SuffixDraft
from specjax.models import T5, BigramLM, UnigramLM
from specjax.models.padding import mask_padding
from specjax.sampling import SamplingConfig
from t5_helpers import ragged_inputs, tiny_config

_EDGES = np.array([-1, -2**31, 2**31 - 1, tiny.VOCAB, 10**9], np.int64)


def _garbage(prompts, lengths, seed=0):
  """`prompts` with every position past a row's length a random int32 (the edges included)."""
  rng = np.random.default_rng(seed)
  out = np.array(prompts, np.int64)
  pad = np.arange(out.shape[1])[None] >= np.asarray(lengths)[:, None]
  junk = rng.integers(-2**31, 2**31, size=out.shape)
  junk.flat[:len(_EDGES)] = _EDGES
  out[pad] = junk[pad]
  assert pad.sum() >= len(_EDGES)
  return out.astype(np.int32)


@pytest.fixture(scope="module")
def decoder_prompts():
  prompts, lengths = tiny.ragged_prompts(batch=4, max_len=10, seed=5)
  return np.asarray(prompts), np.asarray(lengths)


def _same_tokens(call, prompts, lengths):
  clean = call(prompts, lengths)
  dirty = call(_garbage(prompts, lengths), lengths)
  np.testing.assert_array_equal(np.asarray(dirty.tokens), np.asarray(clean.tokens))
  np.testing.assert_array_equal(np.asarray(dirty.lengths), np.asarray(clean.lengths))
  assert int(np.asarray(dirty.stats.nonfinite).sum()) == 0
  return clean


def test_mask_padding_keeps_the_lengths_and_fills_the_rest():
  tokens = np.array([[3, 4, -7, 2**31 - 1], [5, 6, 7, 8]], np.int32)
  got = np.asarray(mask_padding(tokens, np.array([2, 4]), fill=1))
  np.testing.assert_array_equal(got, [[3, 4, 1, 1], [5, 6, 7, 8]])


def test_decoder_generate_sampled(decoder_prompts):
  lm, params = tiny.target()
  _same_tokens(lambda p, l: specjax.generate(
      lm, params, p, l, max_new_tokens=8, sampling=SamplingConfig(temperature=1.0),
      key=jax.random.key(1)), *decoder_prompts)


@pytest.mark.filterwarnings("ignore:SuffixDraft drafts 8 deep")   # its own γ, > max_new - 1
@pytest.mark.parametrize("drafter", ["model", "lookup", "suffix"])
def test_decoder_speculative_with_prompt_reading_drafters(decoder_prompts, drafter):
  lm, params = tiny.target()
  dlm, dparams = tiny.small_draft()
  draft = {"model": ModelDrafter(dlm), "lookup": PromptLookup(),
           "suffix": SuffixDraft()}[drafter]
  gamma = {} if drafter == "suffix" else {"gamma": 3}   # the suffix drafter fixes its own
  out = _same_tokens(lambda p, l: specjax.speculative_generate(
      lm, params, draft, dparams if drafter == "model" else None, p, l, max_new_tokens=8,
      sampling=specjax.GREEDY, **gamma), *decoder_prompts)
  ref = specjax.generate(lm, params, *decoder_prompts, max_new_tokens=8,
                         sampling=specjax.GREEDY)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


def test_t5_pair_speculative():
  target = T5(tiny_config("1.0"))
  draft = T5(tiny_config("1.0", num_layers=1, num_decoder_layers=1))
  tp, dp = target.init(jax.random.PRNGKey(0)), draft.init(jax.random.PRNGKey(1))
  prompts, lengths = ragged_inputs(np.random.default_rng(3), [7, 3, 5], 7, 96)
  _same_tokens(lambda p, l: specjax.speculative_generate(
      target, tp, draft, dp, p, l, max_new_tokens=6, gamma=2,
      sampling=SamplingConfig(temperature=1.0), key=jax.random.key(2)), prompts, lengths)


@pytest.mark.parametrize("cls", [UnigramLM, BigramLM])
def test_ngram_tables(decoder_prompts, cls):
  lm = cls(tiny.VOCAB)
  shape = lm.expected_params()["logits"].shape
  params = {"logits": jax.random.normal(jax.random.PRNGKey(2), shape)}
  _same_tokens(lambda p, l: specjax.generate(lm, params, p, l, max_new_tokens=5,
                                             sampling=specjax.GREEDY), *decoder_prompts)
