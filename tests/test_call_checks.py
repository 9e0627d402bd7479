"""A call's arguments are checked against each other and against the machine before anything is
computed (issue 71, items 6-8): a drafter that fixes its own γ refuses another; a drafter's
token ids beyond the target's vocabulary, ids and pads beyond int32 and caches or buffers
larger than the memory are named; `verify_fn` applies wherever it is accepted (every rule that
takes `num_valid_B` gets it) and is refused by name where it cannot apply.

The refusals raise before tracing; the decoding cases run table models (`BigramLM`), whose
loops compile in about a second.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import _checks
from specjax.adaptive import AdaptiveGamma
from specjax.drafters import (Lookahead, Medusa, MedusaConfig, PromptLookup, SuffixCorpus,
                              SuffixDraft)
from specjax.generation import SpeculativeDecoder, verify_takes_num_valid
from specjax.models.ngram import BigramLM
from specjax.tree import TokenTree
from specjax.verify import rejection_verify
from tiny import VOCAB, ragged_prompts, small_draft, target

GREEDY = specjax.GREEDY
MEMORY = _checks.MEMORY_LIMIT_ENV


@pytest.fixture(autouse=True)
def _no_stated_limit(monkeypatch):
  monkeypatch.delenv(MEMORY, raising=False)


def _tables(seed):
  rng = np.random.default_rng(seed)
  return {"logits": jnp.asarray(rng.normal(0, 2.0, (VOCAB, VOCAB)).astype(np.float32))}


@pytest.fixture(scope="module")
def bigram():
  """A bigram target and a bigram draft of other logits (low, varied acceptance)."""
  return BigramLM(VOCAB), _tables(0), _tables(1)


def _prompts(batch=4):
  rng = np.random.default_rng(3)
  p = rng.integers(6, VOCAB, size=(batch, 5)).astype(np.int32)
  return p, np.array([5, 3, 4, 2][:batch] + [5] * max(0, batch - 4), np.int32)


# ---------------------------------------------------------------- γ of a drafter that fixes its own
@pytest.mark.parametrize("drafter, fixed", [(Lookahead(), 3), (SuffixDraft(depth=8), 8)],
                         ids=["lookahead", "suffix"])
@pytest.mark.parametrize("gamma", [-5, 2, 9])
def test_a_contradicting_gamma_is_refused_by_name(drafter, fixed, gamma):
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=2)
  name = type(drafter).__name__
  with pytest.raises(ValueError, match=rf"gamma must be None \(omitted\) or {fixed} for {name}, "
                                       rf"which fixes its own γ = {fixed}, got gamma={gamma}"):
    specjax.speculative_generate(lm, params, drafter, None, prompts, lengths, max_new_tokens=12,
                                 gamma=gamma, sampling=GREEDY)
  with pytest.raises(TypeError, match=rf"gamma must be None \(omitted\) or {fixed}"):
    specjax.plan_speculative(lm, params, drafter, None, prompts, lengths, max_new_tokens=12,
                             gamma=2.0, sampling=GREEDY)
  for ok in (None, fixed):   # omitted, or the drafter's own: accepted
    kw = {} if ok is None else {"gamma": ok}
    plan = specjax.plan_speculative(lm, params, drafter, None, prompts, lengths,
                                    max_new_tokens=12, sampling=GREEDY, **kw)
    assert plan.gamma == fixed


def test_the_default_gamma_of_a_free_drafter_is_four():
  lm, params = target()
  draft, draft_params = small_draft()
  plan = specjax.plan_speculative(lm, params, draft, draft_params, *ragged_prompts(batch=2),
                                  max_new_tokens=12, sampling=GREEDY)
  assert plan.gamma == 4


# ---------------------------------------------------------------- ids beyond the vocabulary / int32
def test_a_suffix_corpus_beyond_the_targets_vocabulary_is_named():
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=2)
  corpus = SuffixCorpus.build([[7, 8, 9, 10], [11, VOCAB + 6, 12]], 32, vocab_size=VOCAB + 10)
  with pytest.raises(ValueError, match=rf"draft_params \(a SuffixCorpus\) must hold token ids in "
                                       rf"\[0, {VOCAB}\).*holds {VOCAB + 6} \(1 ids out of range\)"):
    specjax.speculative_generate(lm, params, SuffixDraft(), corpus, prompts, lengths,
                                 max_new_tokens=12, sampling=GREEDY)
  good = SuffixCorpus.build([[7, 8, 9, 10], [11, VOCAB - 1, 12]], 32, vocab_size=VOCAB)
  specjax.plan_speculative(lm, params, SuffixDraft(), good, prompts, lengths, max_new_tokens=12,
                           sampling=GREEDY)


@pytest.mark.parametrize("pad_id", [2**31, 2**40])
def test_pad_ids_beyond_int32_are_named(bigram, pad_id):
  lm, params, draft_params = bigram
  prompts, lengths = _prompts()
  want = rf"pad_id must be an int in \[0, 2147483647\] \(the output tokens are int32\), got {pad_id}"
  with pytest.raises(ValueError, match=want):
    specjax.generate(lm, params, prompts, lengths, max_new_tokens=4, sampling=GREEDY,
                     pad_id=pad_id)
  with pytest.raises(ValueError, match=want):
    specjax.speculative_generate(lm, params, lm, draft_params, prompts, lengths,
                                 max_new_tokens=4, gamma=2, sampling=GREEDY, pad_id=pad_id)


def test_ids_and_special_tokens_beyond_int32_are_named(bigram):
  lm, params, _ = bigram
  prompts, lengths = _prompts()
  wide = prompts.astype(np.int64)
  wide[1, 0] = 2**31 + 3   # would wrap to a valid-looking id as int32
  with pytest.raises(ValueError, match=r"row 1 position 0 holds 2147483651"):
    specjax.generate(lm, params, wide, lengths, max_new_tokens=4, sampling=GREEDY)
  with pytest.raises(ValueError, match=r"eos_id must lie in \[0, 64\).*got 4294967296"):
    specjax.generate(lm, params, prompts, lengths, max_new_tokens=4, sampling=GREEDY,
                     eos_id=2**32)
  # The largest int32 pad is fine (padding is never read; it fills the slots past a row).
  out = specjax.generate(lm, params, prompts, lengths, max_new_tokens=4, sampling=GREEDY,
                         pad_id=2**31 - 1, eos_id=int(np.argmax(np.asarray(params["logits"])[
                             int(prompts[0, 4])])))
  assert int(out.lengths[0]) == 1 and (np.asarray(out.tokens)[0, 1:] == 2**31 - 1).all()


# ---------------------------------------------------------------- memory before allocation
def test_caches_beyond_the_memory_are_refused_with_their_sizes():
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=4)
  huge = 2**31 - 1
  with pytest.raises(ValueError, match=r"generate needs .* [TG]B for its caches and buffers "
                                       rf"\(cache \(batch 4 x {huge} slots\) .*B; token buffers"
                                       r".*refused before allocating"):
    specjax.generate(lm, params, prompts, lengths, max_new_tokens=4, cache_len=huge,
                     sampling=GREEDY)
  with pytest.raises(ValueError, match=r"prefill needs .*cache \(batch 4 x \d+ slots\)"):
    specjax.prefill(lm, params, prompts, lengths, max_new_tokens=2**30, sampling=GREEDY)
  draft, draft_params = small_draft()
  with pytest.raises(ValueError, match=r"speculative_generate needs .*target cache \(batch 4 x "
                                       r"\d+ slots\) .*; draft cache \(batch 4 x \d+ slots\)"):
    specjax.speculative_generate(lm, params, draft, draft_params, prompts, lengths,
                                 max_new_tokens=2**30, gamma=2, sampling=GREEDY)
  with pytest.raises(ValueError, match=r"PromptLookup state"):
    specjax.plan_speculative(lm, params, PromptLookup(), None, prompts, lengths,
                             max_new_tokens=2**30, gamma=2, sampling=GREEDY)


def test_token_buffers_beyond_the_memory_are_refused(bigram):
  lm, params, _ = bigram   # a table model's cache holds only lengths: the buffers are the bytes
  prompts, lengths = _prompts()
  with pytest.raises(ValueError, match=r"generate needs .* for its caches and buffers \(cache .*; "
                                       r"token buffers \(batch 4 x 2147483000 tokens\) .*GB\)"):
    specjax.generate(lm, params, prompts, lengths, max_new_tokens=2147483000, sampling=GREEDY)


def test_a_stated_limit_is_kept_and_small_calls_run(bigram, monkeypatch):
  lm, params, _ = bigram
  prompts, lengths = _prompts()
  ref = specjax.generate(lm, params, prompts, lengths, max_new_tokens=4, sampling=GREEDY)
  monkeypatch.setenv(MEMORY, "100")
  with pytest.raises(ValueError, match=r"needs 160 B .*more than the 100 B available \(the "
                                       rf"stated limit, {MEMORY}\)"):
    specjax.generate(lm, params, prompts, lengths, max_new_tokens=4, sampling=GREEDY)
  monkeypatch.setenv(MEMORY, "1e6")
  out = specjax.generate(lm, params, prompts, lengths, max_new_tokens=4, sampling=GREEDY)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  monkeypatch.setenv(MEMORY, "lots")
  with pytest.raises(ValueError, match=rf"{MEMORY} must be a number of bytes >= 1, got 'lots'"):
    specjax.generate(lm, params, prompts, lengths, max_new_tokens=4, sampling=GREEDY)


class _Device:
  def __init__(self, i, stats, platform="gpu"):
    self.id, self.platform, self._stats = i, platform, stats

  def memory_stats(self):
    return self._stats


def test_device_memory_is_the_allocators_free_bytes():
  gpu = _Device(0, {"bytes_limit": 10**9, "bytes_in_use": 6 * 10**8})
  assert _checks.free_memory_bytes(gpu) == (4 * 10**8, "free on gpu device 0")
  parts = [("target cache (batch 1 x 9 slots)", 5 * 10**8)]
  with pytest.raises(ValueError, match=r"needs 500.0 MB .*more than the 400.0 MB available "
                                       r"\(free on gpu device 0\)"):
    _checks.check_memory("generate", parts, [gpu], "Lower it.")
  # Split over two devices: 250 MB each fits; over 4 of which one is full, it does not.
  _checks.check_memory("generate", parts, [gpu, _Device(1, gpu._stats)], "")
  full = _Device(3, {"bytes_limit": 10**9, "bytes_in_use": 10**9})
  with pytest.raises(ValueError, match=r"\(125.0 MB per device over 4 devices\), more than the "
                                       r"0 B available \(free on the emptiest of its 4 devices\)"):
    _checks.check_memory("generate", parts, [gpu, gpu, gpu, full], "")
  _checks.check_memory("generate", parts, [_Device(0, None)], "")   # nothing known: no check


# ---------------------------------------------------------------- verify_fn
def _custom(keys, drafts, p, q, num_valid_B=None):
  return rejection_verify(keys, drafts, p, q, num_valid_B)


def test_verify_fn_is_refused_where_it_cannot_apply():
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=2)
  for drafter, rule in ((PromptLookup(), "candidates_fn"), (SuffixDraft(), "tree_fn")):
    name = type(drafter).__name__
    with pytest.raises(ValueError, match=rf"verify_fn=_custom cannot apply to {name}: .*"
                                         rf"SpeculativeDecoder\({rule}=...\)"):
      specjax.speculative_generate(lm, params, drafter, None, prompts, lengths, max_new_tokens=12,
                                   verify_fn=_custom, sampling=GREEDY)
    # The default rule is accepted with every drafter.
    specjax.plan_speculative(lm, params, drafter, None, prompts, lengths, max_new_tokens=12,
                             sampling=GREEDY, **({"gamma": 2} if rule == "candidates_fn" else {}))
  medusa = Medusa(MedusaConfig(num_heads=2, d_model=lm.config.d_model, vocab_size=VOCAB),
                  TokenTree.chain(2), children="iid")
  with pytest.raises(ValueError, match=r"cannot apply to Medusa: its call holds a token tree.*"
                                       r"tree_fn"):
    SpeculativeDecoder(lm, medusa, 2, specjax.SamplingConfig(1.0), 8, verify_fn=_custom)


def test_verify_takes_num_valid_protocol():
  assert verify_takes_num_valid(rejection_verify) == "keyword"
  assert verify_takes_num_valid(_custom) == "keyword"
  assert verify_takes_num_valid(lambda *a: rejection_verify(*a)) == "positional"
  assert verify_takes_num_valid(lambda k, d, p, q, n=None: 0) == "positional"
  assert verify_takes_num_valid(lambda k, d, p, q: 0) is None


def test_custom_rules_get_num_valid_per_row_and_stay_exact(bigram):
  """Per-row gamma="auto": rows propose different numbers of drafts. A custom exact rule gets
  `num_valid_B` as the built-in does: the very same tokens; one that cannot take it is refused."""
  lm, params, draft_params = bigram
  prompts, lengths = _prompts()
  keys = jax.random.split(jax.random.key(4), 4)
  kw = dict(max_new_tokens=12, sampling=specjax.SamplingConfig(1.0), key=keys,
            gamma=AdaptiveGamma(gammas=(0, 1, 2, 4), per_row=True),
            gamma_costs=(1.0, 1.1, 1.2, 1.4), acceptance=specjax.Acceptance.fresh())
  ref = specjax.speculative_generate(lm, params, lm, draft_params, prompts, lengths, **kw)
  drafted = np.asarray(ref.stats.drafted)
  assert len(set(drafted.tolist())) > 1, drafted   # rows drafted differently
  out = specjax.speculative_generate(lm, params, lm, draft_params, prompts, lengths,
                                     verify_fn=lambda *a: rejection_verify(*a), **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.stats.accepted, ref.stats.accepted)
  with pytest.raises(ValueError, match=r"verify_fn=.*<lambda> takes no num_valid_B: with "
                                       r"gamma='auto'"):
    specjax.speculative_generate(lm, params, lm, draft_params, prompts, lengths,
                                 verify_fn=lambda k, d, p, q: rejection_verify(k, d, p, q), **kw)
