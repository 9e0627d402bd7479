"""The drafter families behind one protocol: prompt lookup, layer skip,
windowed KV, lookahead (and the draft model as a drafter).

Every drafter: greedy output equals the target's greedy output on a ragged
batch that ends by EOS and by max length; sampling with per-row keys makes
each row its own run; the sampled tokens have exactly the target's
distribution (chi-square on >= 50k samples of a tiny transformer whose next
token depends on its whole cached prefix, with a broken verifier that must
be caught); one compilation per prompt bucket; misuse is a named error.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from exact_helpers import (N_SAMPLES, counts_t2_t4, decode_copies, exact_lm, joint_t2_t4,
                           optimized_codegen)
from reference import chi_square_pvalue
from specjax import drafters
from specjax.drafters import Lookahead, PromptLookup, WindowedKV, LayerSkip
from specjax.measure.compiles import TraceCounter
from specjax.measure.layers import choose_layers
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.sampling import GREEDY, SamplingConfig, sample_from_uniform, row_uniforms
from specjax.verify import candidates_verify
from tiny import EOS, ragged_prompts, small_draft, target

MAX_NEW = 24


def _drafter(name, lm=None):
  lm = lm or target()[0]
  return {
      "prompt_lookup": lambda: (PromptLookup(max_ngram=3, min_ngram=1), 4),
      "layer_skip": lambda: (LayerSkip(lm, (0,)), 3),
      "windowed_kv": lambda: (WindowedKV.of(lm, window=4, sinks=2, gamma=3), 3),
      "lookahead": lambda: (Lookahead(window=3, ngram=3, candidates=3, pool_size=16), None),
  }[name]()


NAMES = ["prompt_lookup", "layer_skip", "windowed_kv", "lookahead"]


def _repetitive_ragged(batch=8, seed=4):
  """Ragged prompts that repeat their own first half (so lookups match)."""
  prompts, lengths = ragged_prompts(batch=batch, max_len=12, seed=seed)
  prompts = np.asarray(prompts).copy()
  for b in range(batch):
    n = int(lengths[b])
    half = max(n // 2, 1)
    prompts[b, half:n] = prompts[b, :n - half]
  return jnp.asarray(prompts), lengths


@pytest.fixture(scope="module")
def greedy_reference():
  lm, params = target()
  prompts, lengths = _repetitive_ragged()
  out = specjax.generate(lm, params, prompts, lengths, max_new_tokens=MAX_NEW, sampling=GREEDY,
                         eos_id=EOS)
  lens = np.asarray(out.lengths)
  assert (lens < MAX_NEW).any() and (lens == MAX_NEW).any(), lens  # EOS rows and max rows
  return prompts, lengths, out


@pytest.mark.parametrize("name", NAMES)
def test_greedy_equals_the_target_greedy(greedy_reference, name):
  prompts, lengths, ref = greedy_reference
  lm, params = target()
  drafter, gamma = _drafter(name)
  out = specjax.speculative_generate(lm, params, drafter, None, prompts, lengths,
                                     max_new_tokens=MAX_NEW, gamma=gamma, sampling=GREEDY,
                                     eos_id=EOS)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  hist = np.asarray(out.stats.accepted_hist)
  np.testing.assert_array_equal(hist.sum(1), np.asarray(out.stats.target_calls) - 1)
  assert int(np.asarray(out.stats.accepted).sum()) > 0, f"{name} never accepted a draft"


def test_the_draft_model_as_a_drafter_gives_the_same_results(greedy_reference):
  prompts, lengths, _ = greedy_reference
  lm, params = target()
  draft, dp = small_draft()
  kw = dict(max_new_tokens=MAX_NEW, gamma=3, sampling=SamplingConfig(0.8), eos_id=EOS,
            key=jax.random.split(jax.random.key(3), prompts.shape[0]))
  a = specjax.speculative_generate(lm, params, draft, dp, prompts, lengths, **kw)
  b = specjax.speculative_generate(lm, params, drafters.ModelDrafter(draft), dp, prompts,
                                   lengths, **kw)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.stats.accepted, b.stats.accepted)


@pytest.mark.parametrize("name", NAMES)
def test_rows_are_independent_of_the_batch(name):
  lm, params = target()
  prompts, lengths = _repetitive_ragged(batch=4, seed=9)
  drafter, gamma = _drafter(name)
  keys = jax.random.split(jax.random.key(11), 4)
  kw = dict(max_new_tokens=16, gamma=gamma, sampling=SamplingConfig(1.0), eos_id=EOS)
  full = specjax.speculative_generate(lm, params, drafter, None, prompts, lengths, key=keys, **kw)
  for r in (0, 2):
    alone = specjax.speculative_generate(lm, params, drafter, None, prompts[r:r + 1],
                                         lengths[r:r + 1], key=keys[r:r + 1], **kw)
    np.testing.assert_array_equal(alone.tokens[0], full.tokens[r])


def test_prompt_lookup_finds_the_most_recent_longest_match():
  d = PromptLookup(max_ngram=2, min_ngram=1)
  hist = jnp.asarray([[7, 8, 9, 1, 7, 8, 3, 4, 7, 8],      # "7 8" occurs at 0 and 4: take 4
                      [1, 2, 3, 4, 5, 6, 0, 0, 0, 0],      # "6" never occurred before: none
                      [5, 1, 5, 2, 5, 0, 0, 0, 0, 0]], jnp.int32)  # bigram "2 5" none; "5" at 2
  state = drafters.LookupState(history=hist, length=jnp.asarray([10, 6, 5], jnp.int32))
  start, count = d.match(state, gamma=4)
  np.testing.assert_array_equal(start, [6, 0, 3])       # continuation after the match
  np.testing.assert_array_equal(count, [4, 0, 2])       # row 2: only "2 5" remains
  inp = drafters.DraftInput(seq_len_B=jnp.zeros(3, jnp.int32), pending_B=hist[:, 0] * 0 + 1,
                            prev_B=jnp.zeros(3, jnp.int32), done_B=jnp.zeros(3, bool),
                            step=jnp.int32(0))
  prop, _ = d.propose(None, state, inp, None, None, 4)
  np.testing.assert_array_equal(prop.tokens_BT[0, 1:], [3, 4, 7, 8])
  np.testing.assert_array_equal(prop.valid_BKN[:, 0].sum(1), [4, 0, 2])


def test_lookahead_layout_is_a_causal_sequence_per_column():
  lay = Lookahead(window=3, ngram=4, candidates=2).layout(3)
  assert lay.length == 1 + 3 * 3 + 2 * 3 and lay.chains_KN.shape == (2, 3)
  mask, off = lay.mask_TT, lay.offsets_T
  for t in range(lay.length):
    seen = np.nonzero(mask[t])[0]
    # What a token sees is one causal sequence: offsets 0, 1, ..., its own.
    assert sorted(off[seen].tolist()) == list(range(off[t] + 1)), t
  # Verification tokens never see the lookahead branch, and vice versa.
  la = set(range(1, 10))
  for t in lay.chains_KN.ravel():
    assert not (set(np.nonzero(mask[t])[0]) & la)
  for t in la:
    assert not (set(np.nonzero(mask[t])[0]) & set(lay.chains_KN.ravel().tolist()))


def test_windowed_draft_reads_only_sinks_and_window():
  lm, params = target()
  d = WindowedKV.of(lm, window=3, sinks=2, gamma=2)
  ring = d.model
  prompts = jnp.asarray(np.arange(10, 20, dtype=np.int32)[None])
  tc = lm.init_cache(1, 32, 10)
  _, _, tc = lm.prefill(params, prompts, jnp.asarray([10]), tc)
  cache = d.start(params, d.alloc(1, 10, 32, 2), prompts, jnp.asarray([10]), None, tc)
  valid = np.asarray(ring.valid(cache))[0]
  held = sorted(np.asarray(cache.slot_pos)[0][valid].tolist())
  assert held == [0, 1, 7, 8, 9]  # 2 sinks + the last 3 positions
  # The copied keys are the target's own at those positions.
  slot7 = int(np.nonzero(np.asarray(cache.slot_pos)[0] == 7)[0][0])
  np.testing.assert_array_equal(np.asarray(cache.k[0])[0, :, :, slot7],
                                np.asarray(tc.k[0])[0, :, :, 7])


def test_choose_layers_drops_layers_by_alpha():
  lm = DecoderLM(decoder_config("tiny", vocab_size=64, num_layers=3))
  params = lm.init(jax.random.PRNGKey(0))
  prompts, lengths = ragged_prompts(batch=4, seed=1)
  lines = []
  res = choose_layers(lm, params, prompts, lengths, 1, max_new_tokens=8,
                               log=lines.append)
  assert len(res["layers"]) == 1 and len(res["steps"]) == 2 and len(lines) == 2
  first = res["steps"][0]
  assert first["alpha"] == max(first["candidates"].values())
  assert 0.0 <= res["alpha"] <= 1.0


def test_no_retrace_across_prompts_of_one_bucket():
  lm, params = target()
  for name in NAMES:
    drafter, gamma = _drafter(name)
    # The settings of test_rows_are_independent_of_the_batch: its programs serve the first call.
    kw = dict(max_new_tokens=16, gamma=gamma, sampling=SamplingConfig(1.0), eos_id=EOS)
    p1, l1 = _repetitive_ragged(batch=4, seed=20)
    p2, l2 = _repetitive_ragged(batch=4, seed=21)
    specjax.speculative_generate(lm, params, drafter, None, p1, l1, key=jax.random.key(0), **kw)
    with TraceCounter() as traces:
      specjax.speculative_generate(lm, params, drafter, None, p2, l2, key=jax.random.key(1),
                                   **kw)
    assert traces.decode_loops == 0, (name, traces.counts)


def test_misuse_is_named():
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=2)
  kw = dict(max_new_tokens=4, sampling=GREEDY)
  with pytest.raises(ValueError, match="min_ngram"):
    PromptLookup(max_ngram=1, min_ngram=2)
  with pytest.raises(ValueError, match="max_ngram must be an int >= 1, got 0"):
    PromptLookup(max_ngram=0)
  with pytest.raises(ValueError, match="empty subset"):
    LayerSkip(lm, ())
  with pytest.raises(ValueError, match=r"indices in \[0, 2\)"):
    LayerSkip(lm, (0, 5))
  with pytest.raises(ValueError, match="strictly increasing"):
    LayerSkip(lm, (1, 0))
  with pytest.raises(TypeError, match="DecoderLM"):
    LayerSkip(specjax.UnigramLM(8), (0,))
  with pytest.raises(ValueError, match=r"window \(40\) \+ sinks \(4\) must be smaller than the "
                     r"target's cache"):
    specjax.speculative_generate(lm, params, WindowedKV.of(lm, window=40, gamma=2), None, prompts,
                                 lengths, gamma=2, **kw)
  with pytest.raises(ValueError, match="gamma must be an int >= 1"):
    WindowedKV.of(lm, window=4, gamma=0)
  with pytest.raises(ValueError, match="ring slack"):
    specjax.speculative_generate(lm, params, WindowedKV.of(lm, window=4, gamma=2), None, prompts,
                                 lengths, gamma=5, **kw)
  with pytest.raises(ValueError, match="gamma must be an int >= 1"):
    specjax.speculative_generate(lm, params, PromptLookup(), None, prompts, lengths, gamma=0, **kw)
  with pytest.raises(ValueError, match="ngram must be an int >= 2"):
    Lookahead(ngram=1)
  other = DecoderLM(decoder_config("tiny", vocab_size=32))
  with pytest.raises(ValueError, match="vocab_size"):
    specjax.speculative_generate(lm, params, other, other.init(jax.random.PRNGKey(0)), prompts,
                                 lengths, gamma=2, **kw)
  with pytest.raises(TypeError, match="draft must be a draft model .* or a drafter"):
    specjax.speculative_generate(lm, params, object(), None, prompts, lengths, gamma=2, **kw)
  with pytest.raises(TypeError, match="model must follow specjax.protocol.LanguageModel"):
    specjax.generate(PromptLookup(), None, prompts, lengths, **kw)
  with pytest.raises(TypeError, match="target must follow"):
    specjax.speculative_generate(PromptLookup(), None, lm, params, prompts, lengths, **kw)
  with pytest.raises(ValueError, match="draft_cache is for a draft model"):
    specjax.speculative_generate(lm, params, PromptLookup(), None, prompts, lengths, gamma=2,
                                 draft_cache=lm.init_cache(2, 40), **kw)


# ------------------------------------------------------------------ exactness

PROMPT = [3, 1, 4, 3, 1]
CONFIGS = [SamplingConfig(1.0), SamplingConfig(0.7, top_p=0.9)]


def _broken_candidates(keys, cands, valid, q_root, q_nodes):
  """Broken on purpose: after a rejection it samples from the target's
  distribution at the node, not from the residual with the rejected tokens removed."""
  chain, accepted, nxt = candidates_verify(keys, cands, valid, q_root, q_nodes)
  node = jnp.take_along_axis(q_nodes, chain[:, None, None, None], axis=1)[:, 0]
  at = jnp.take_along_axis(node, jnp.maximum(accepted - 1, 0)[:, None, None], axis=1)[:, 0]
  q_here = jnp.where((accepted > 0)[:, None], at, q_root)
  chain_len = jnp.take_along_axis(jnp.sum(valid, axis=2), chain[:, None], axis=1)[:, 0]
  rejected = accepted < chain_len  # the chain's next token was tried and rejected
  u = row_uniforms(jax.vmap(lambda k: jax.random.fold_in(k, 99))(keys), 1)[:, 0]
  return chain, accepted, jnp.where(rejected, sample_from_uniform(u, q_here), nxt)


def _sample(lm, params, drafter, gamma, cfg, broken=False):
  if not broken or not drafter.deterministic:
    from test_exactness import residual_from_q_verify
    prompts = jnp.asarray(np.tile(np.array(PROMPT, np.int32), (N_SAMPLES, 1)))
    lengths = jnp.full((N_SAMPLES,), len(PROMPT), jnp.int32)
    with optimized_codegen():
      out = specjax.speculative_generate(lm, params, drafter, None, prompts, lengths,
                                         max_new_tokens=4, gamma=gamma, sampling=cfg,
                                         key=jax.random.key(5),
                                         verify_fn=residual_from_q_verify if broken else
                                         specjax.rejection_verify)
  else:
    out = decode_copies(lm, params, drafter, params, PROMPT, cfg, 5, gamma=gamma,
                        candidates_fn=_broken_candidates)
  return counts_t2_t4(np.asarray(out.tokens), lm.vocab_size), out


# One setting per drafter, both settings covered by each kind: drafts drawn
# from a distribution (layer skip filtered by temperature / top-p exactly as the
# target, windowed KV unfiltered) and deterministic drafts (one-hot proposals).
EXACT_CASES = [("layer_skip", CONFIGS[1]), ("windowed_kv", CONFIGS[0]),
               ("prompt_lookup", CONFIGS[0]), ("lookahead", CONFIGS[1])]


@pytest.mark.parametrize("name,cfg", EXACT_CASES, ids=lambda x: str(x))
def test_sampling_is_exact_and_the_control_is_caught(name, cfg):
  lm, params = exact_lm()
  joint = joint_t2_t4(lm, params, PROMPT, cfg)
  drafter, gamma = _drafter(name, lm)
  if name == "layer_skip":
    drafter = LayerSkip(lm, (1,))
  counts, out = _sample(lm, params, drafter, gamma, cfg)
  accepted = int(np.asarray(out.stats.accepted).sum())
  drafted = int(np.asarray(out.stats.drafted).sum())
  assert 0 < accepted < drafted, (accepted, drafted)  # acceptances and rejections both occur
  pvalue = chi_square_pvalue(counts, joint)
  assert pvalue > 1e-3, pvalue
  broken, _ = _sample(lm, params, drafter, gamma, cfg, broken=True)
  assert chi_square_pvalue(broken, joint) < 1e-6
