"""Autoregressive and speculative generation with tiny decoder models."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax

from specjax.drafters import ModelDrafter
from specjax.generation import DecodeStats, SpeculativeDecoder
from specjax.measure.compiles import TraceCounter
from specjax.models.ngram import BigramLM
from specjax.sampling import GREEDY, SamplingConfig
from tiny import EOS, VOCAB, noisy_draft, ragged_prompts, small_draft, target

MAX_NEW = 24


@pytest.fixture(scope="module")
def greedy_reference():
  lm, params = target()
  prompts, lengths = ragged_prompts()
  out = specjax.generate(lm, params, prompts, lengths, max_new_tokens=MAX_NEW, sampling=GREEDY,
                         eos_id=EOS, pad_id=0)
  return prompts, lengths, out


def test_greedy_reference_has_eos_and_max_rows(greedy_reference):
  _, _, out = greedy_reference
  lengths = np.asarray(out.lengths)
  tokens = np.asarray(out.tokens)
  by_eos = lengths < MAX_NEW
  assert by_eos.any() and (~by_eos).any(), lengths
  assert len(set(lengths[by_eos])) > 1, "rows should end by EOS at different steps"
  for row, n in zip(tokens, lengths):
    if n < MAX_NEW:
      assert row[n - 1] == EOS and (row[n:] == 0).all()
    assert EOS not in row[: n - 1]


def test_autoregressive_greedy_matches_full_forward_argmax(greedy_reference):
  """The jitted loop agrees with a step-by-step argmax over full forwards."""
  prompts, lengths, out = greedy_reference
  lm, params = target()
  width = prompts.shape[1] + MAX_NEW
  forward = jax.jit(lm.forward)  # causal: padding after the sequence does not matter
  for b in (0, 3):
    seq = list(np.asarray(prompts[b, : lengths[b]]))
    for _ in range(int(out.lengths[b])):
      padded = np.zeros((1, width), np.int32)
      padded[0, : len(seq)] = seq
      logits = forward(params, jnp.asarray(padded))
      seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
    np.testing.assert_array_equal(seq[int(lengths[b]):], out.tokens[b, : out.lengths[b]])


@pytest.mark.parametrize("gamma", [1, 3, 7])
@pytest.mark.parametrize("draft_fn", [small_draft, noisy_draft], ids=["small", "noisy"])
def test_speculative_greedy_equals_autoregressive(greedy_reference, gamma, draft_fn):
  prompts, lengths, ref = greedy_reference
  lm, params = target()
  draft, draft_params = draft_fn()
  out = specjax.speculative_generate(lm, params, draft, draft_params, prompts, lengths,
                                     max_new_tokens=MAX_NEW, gamma=gamma, sampling=GREEDY,
                                     eos_id=EOS)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  stats = out.stats
  np.testing.assert_array_equal(stats.drafted, gamma * (stats.target_calls - 1))
  np.testing.assert_array_equal(np.asarray(stats.accepted_hist).sum(1), stats.target_calls - 1)
  if draft_fn is noisy_draft:
    assert out.acceptance_rate > 0.15
    # Rows accept different numbers of drafts.
    assert len(set(np.asarray(stats.accepted).tolist())) > 1


def test_self_draft_accepts_everything(greedy_reference):
  prompts, lengths, ref = greedy_reference
  lm, params = target()
  out = specjax.speculative_generate(lm, params, lm, params, prompts, lengths,
                                     max_new_tokens=MAX_NEW, gamma=4, sampling=GREEDY,
                                     eos_id=EOS)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  assert out.acceptance_rate == 1.0
  assert out.mean_tokens_per_iteration == 5.0


def _spec_decoder(draft, gamma, sampling, verify_fn=specjax.verify.rejection_verify,
                  max_new=MAX_NEW):
  lm, _ = target()
  return SpeculativeDecoder(lm, ModelDrafter(draft), gamma, sampling, max_new, None, 0, verify_fn)


def _init(dec, target_params, draft_params, prompts, lengths, keys, cache_len=64):
  b, p = prompts.shape
  return dec.init_state(target_params, draft_params, prompts, lengths, keys,
                        dec.target.init_cache(b, cache_len, p),
                        dec.drafter.model.init_cache(b, cache_len, p))


def test_decode_stats_summaries_by_hand():
  # Rows' histograms [3, 1, 2] and [1, 1, 0] (γ = 2): 8 iterations accepting 0 ×4, 1 ×2, 2 ×2.
  stats = DecodeStats.zeros(2, 2).replace(
      accepted_hist=jnp.array([[3, 1, 2], [1, 1, 0]]), accepted=jnp.array([5, 1]),
      drafted=jnp.array([10, 2]))
  assert stats.iterations == 8
  assert stats.tokens_per_iteration == pytest.approx((4 * 1 + 2 * 2 + 2 * 3) / 8)
  assert stats.alpha() == pytest.approx(6 / 12)       # accepted / drafted
  assert stats.alpha(2) == pytest.approx(6 / 16)      # accepted / (γ · iterations)
  np.testing.assert_allclose(stats.acceptance_by_position, [4 / 8, 2 / 8])
  # Stored totals read back the same way.
  back = DecodeStats.from_histogram([[3, 1, 2], [1, 1, 0]], drafted=[10, 2])
  assert (back.tokens_per_iteration, back.alpha(), back.alpha(2)) == (
      stats.tokens_per_iteration, stats.alpha(), stats.alpha(2))
  empty = DecodeStats.zeros(1, 3)
  assert np.isnan(empty.tokens_per_iteration) and np.isnan(empty.alpha())
  assert np.isnan(empty.acceptance_by_position).all() and empty.acceptance_by_position.shape == (3,)
  with pytest.raises(ValueError, match="gamma"):
    stats.alpha(0)
  with pytest.raises(ValueError, match="accepted_hist"):
    DecodeStats.from_histogram("x")


def test_rows_commit_different_counts_in_one_iteration():
  lm, params = target()
  draft, draft_params = noisy_draft()
  prompts, lengths = ragged_prompts(batch=16, seed=4)
  dec = _spec_decoder(draft, 4, SamplingConfig(1.0))
  keys = jax.random.split(jax.random.key(0), 16)
  state = _init(dec, params, draft_params, prompts, lengths, keys)
  after = jax.jit(dec.step)(params, draft_params, state)
  n = np.asarray(after.stats.accepted)
  assert len(set(n.tolist())) >= 3, n
  np.testing.assert_array_equal(after.out_len, 1 + n + 1)
  np.testing.assert_array_equal(after.seq_len, np.asarray(state.seq_len) + n + 1)


def test_per_row_keys_make_rows_independent_of_the_batch():
  lm, params = target()
  draft, draft_params = noisy_draft()
  prompts, lengths = ragged_prompts(batch=8, seed=5)
  keys = jax.random.split(jax.random.key(11), 8)
  cfg = SamplingConfig(1.0)
  batched = specjax.speculative_generate(lm, params, draft, draft_params, prompts, lengths,
                                         max_new_tokens=16, gamma=3, sampling=cfg, key=keys,
                                         eos_id=EOS)
  for b in range(8):
    # Alone: a batch of one row (its own length; padding past it is ignored).
    alone = specjax.speculative_generate(lm, params, draft, draft_params, prompts[b:b + 1],
                                         lengths[b:b + 1], max_new_tokens=16, gamma=3,
                                         sampling=cfg, key=keys[b:b + 1], eos_id=EOS)
    np.testing.assert_array_equal(alone.tokens[0], batched.tokens[b])
    np.testing.assert_array_equal(alone.stats.accepted_hist[0], batched.stats.accepted_hist[b])


def test_per_row_keys_autoregressive():
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=4, seed=6)
  keys = jax.random.split(jax.random.key(12), 4)
  batched = specjax.generate(lm, params, prompts, lengths, max_new_tokens=12,
                             sampling=SamplingConfig(0.9, top_k=20), key=keys)
  for b in range(4):
    alone = specjax.generate(lm, params, prompts[b:b + 1], lengths[b:b + 1], max_new_tokens=12,
                             sampling=SamplingConfig(0.9, top_k=20), key=keys[b:b + 1])
    np.testing.assert_array_equal(alone.tokens[0], batched.tokens[b])


def test_rollback_reads_exactly_prefix_accepted_and_resampled():
  """9 prompt tokens + the prefill token = a 10-token prefix; γ = 5 drafts;
  a rigged verifier rejects at draft 3 in row 0 (keeps 2) and at other
  places in other rows. Afterwards both caches must behave exactly like a
  fresh prefill of prefix + kept drafts, followed by the resampled token."""
  lm, params = target()
  draft, draft_params = small_draft()
  kept = jnp.array([2, 0, 5, 3], jnp.int32)

  def rigged_verify(keys, drafts, p, q):
    next_tok = (drafts[jnp.arange(drafts.shape[0]), jnp.minimum(kept, 4)] + 1) % VOCAB
    return kept, next_tok.astype(jnp.int32)

  rng = np.random.default_rng(0)
  prompts = jnp.asarray(rng.integers(6, VOCAB, size=(4, 9)), jnp.int32)
  lengths = jnp.full((4,), 9, jnp.int32)
  dec = _spec_decoder(draft, 5, SamplingConfig(1.0), rigged_verify)
  keys = jax.random.split(jax.random.key(1), 4)
  state = jax.jit(lambda tp, dp: _init(dec, tp, dp, prompts, lengths, keys, cache_len=32))(
      params, draft_params)
  np.testing.assert_array_equal(state.seq_len, 9)
  after = jax.jit(dec.step)(params, draft_params, state)
  lm_extend, lm_forward, lm_prefill = jax.jit(lm.extend), jax.jit(lm.forward), jax.jit(lm.prefill)
  d_extend, d_forward, d_prefill = (jax.jit(draft.extend), jax.jit(draft.forward),
                                    jax.jit(draft.prefill))
  np.testing.assert_array_equal(after.seq_len, 10 + kept)
  np.testing.assert_array_equal(after.out_len, 1 + kept + 1)

  for b in range(4):
    committed = np.asarray(after.tokens[b, : int(after.out_len[b])])
    resampled = committed[-1]
    stream = np.concatenate([np.asarray(prompts[b]), committed[:-1]])  # prefix + kept drafts
    assert len(stream) == 10 + int(kept[b]) and after.pending[b] == resampled
    full_seq = jnp.asarray([np.append(stream, resampled)], jnp.int32)
    # Target: the next iteration feeds the resampled token at seq_len.
    row_cache = jax.tree_util.tree_map(lambda x: x[b:b + 1], after.target_cache)
    row_cache = row_cache.replace(lengths=after.seq_len[b:b + 1])
    logits, _ = lm_extend(params, jnp.asarray([[resampled]], jnp.int32), row_cache)
    want = lm_forward(params, full_seq)[0, -1]
    np.testing.assert_allclose(logits[0, 0], want, atol=1e-5)
    # The target's valid slots equal a fresh prefill of the stream.
    fresh = lm.init_cache(1, 32)
    _, _, fresh = lm_prefill(params, jnp.asarray([stream], jnp.int32),
                             jnp.asarray([len(stream)]), fresh)
    n = len(stream)
    # (keys [B, K, D, S] and values [B, K, S, D] per layer)
    np.testing.assert_allclose(np.stack(after.target_cache.k)[:, b, ..., :n],
                               np.stack(fresh.k)[:, 0, ..., :n], atol=1e-5)
    np.testing.assert_allclose(np.stack(after.target_cache.v)[:, b, :, :n],
                               np.stack(fresh.v)[:, 0, :, :n], atol=1e-5)
    # Draft: it re-feeds [prev, pending] at seq_len - 1.
    d_cache = jax.tree_util.tree_map(lambda x: x[b:b + 1], after.draft_cache)
    d_cache = d_cache.replace(lengths=after.seq_len[b:b + 1] - 1)
    assert after.prev[b] == stream[-1]
    d_logits, _ = d_extend(draft_params, jnp.asarray([[stream[-1], resampled]], jnp.int32), d_cache)
    np.testing.assert_allclose(d_logits[0], d_forward(draft_params, full_seq)[0, -2:], atol=1e-5)
    d_fresh = draft.init_cache(1, 32)
    _, _, d_fresh = d_prefill(draft_params, jnp.asarray([stream], jnp.int32),
                                  jnp.asarray([n]), d_fresh)
    np.testing.assert_allclose(np.stack(after.draft_cache.k)[:, b, ..., : n - 1],
                               np.stack(d_fresh.k)[:, 0, ..., : n - 1], atol=1e-5)


def test_no_retrace_for_new_prompts_of_the_same_shape():
  lm, params = target()
  draft, draft_params = small_draft()
  kw = dict(max_new_tokens=8, gamma=2, sampling=SamplingConfig(0.8), eos_id=EOS)
  p1, l1 = ragged_prompts(batch=4, seed=20)
  p2, l2 = ragged_prompts(batch=4, seed=21)
  specjax.speculative_generate(lm, params, draft, draft_params, p1, l1, key=jax.random.key(0), **kw)
  with TraceCounter() as traces:
    out = specjax.speculative_generate(lm, params, draft, draft_params, p2, l2,
                                       key=jax.random.key(1), **kw)
  assert traces.decode_loops == 0, traces.counts
  assert out.tokens.shape == (4, 8)
  specjax.generate(lm, params, p1, l1, max_new_tokens=8, sampling=GREEDY)
  with TraceCounter() as traces:
    specjax.generate(lm, params, p2, l2, max_new_tokens=8, sampling=GREEDY)
  assert traces.decode_loops == 0, traces.counts
  with TraceCounter() as traces:  # a new static length traces: the counter sees it
    specjax.generate(lm, params, p2, l2, max_new_tokens=11, sampling=GREEDY)
  assert traces.counts["autoregressive_loop"] == 1


def test_donated_cache_is_returned_and_reusable():
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=4, seed=9)
  cache = lm.init_cache(4, 40, prompts.shape[1])
  out = specjax.generate(lm, params, prompts, lengths, max_new_tokens=8, sampling=GREEDY,
                         cache=cache)
  again = specjax.generate(lm, params, prompts, lengths, max_new_tokens=8, sampling=GREEDY,
                           cache=out.target_cache)
  np.testing.assert_array_equal(out.tokens, again.tokens)


def test_bigram_models_follow_the_protocol():
  v = 8
  table = jnp.asarray(np.random.default_rng(0).normal(size=(v, v)), jnp.float32)
  lm = BigramLM(v)
  out = specjax.generate(lm, {"logits": table}, jnp.array([[3]]), max_new_tokens=5,
                         sampling=GREEDY)
  seq, want = 3, []
  for _ in range(5):
    seq = int(jnp.argmax(table[seq]))
    want.append(seq)
  np.testing.assert_array_equal(out.tokens[0], want)


# ---------------------------------------------------------------- misuse
def _call(**overrides):
  lm, params = target()
  draft, draft_params = small_draft()
  prompts, lengths = ragged_prompts(batch=4, seed=3)
  kw = dict(target=lm, target_params=params, draft=draft, draft_params=draft_params,
            prompts=prompts, prompt_lengths=lengths, max_new_tokens=4, gamma=2,
            sampling=GREEDY)
  kw.update(overrides)
  return specjax.speculative_generate(**kw)


@pytest.mark.parametrize(
    "overrides, exc, needle",
    [
        (dict(draft=BigramLM(VOCAB + 1), draft_params={}), ValueError, "vocab_size"),
        (dict(gamma=0), ValueError, "gamma"),
        (dict(gamma=2.0), TypeError, "gamma"),
        (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
        (dict(max_new_tokens=-3), ValueError, "max_new_tokens"),
        (dict(prompt_lengths=jnp.array([0, 3, 3, 3])), ValueError, "prompt_lengths"),
        (dict(prompt_lengths=jnp.array([11, 3, 3, 3])), ValueError, "prompt_lengths"),
        (dict(prompt_lengths=jnp.array([3, 3, 3])), ValueError, "prompt_lengths"),
        (dict(prompts=jnp.zeros((4,), jnp.int32)), ValueError, "prompts"),
        (dict(prompts=jnp.zeros((4, 10), jnp.float32)), TypeError, "prompts"),
        (dict(cache_len=12), ValueError, "cache_len"),
        (dict(target_cache="built below"), ValueError, "target_cache"),
        (dict(draft_cache="built below"), ValueError, "draft_cache"),
        (dict(sampling=SamplingConfig(1.0)), ValueError, "key"),
        (dict(sampling=SamplingConfig(1.0), key=jax.random.split(jax.random.key(0), 3)),
         ValueError, "key"),
        (dict(eos_id=VOCAB), ValueError, "eos_id"),
        (dict(sampling=0.5), TypeError, "sampling"),
        (dict(draft=object()), TypeError, "draft"),
    ],
)
def test_misuse_is_a_clear_error(overrides, exc, needle):
  lm, _ = target()
  for name in ("target_cache", "draft_cache"):
    if overrides.get(name) == "built below":
      overrides[name] = lm.init_cache(4, 14, 10)  # 10 + 4 + 2 - 1 = 15 needed
  with pytest.raises(exc, match=needle):
    _call(**overrides)


def test_cache_batch_mismatch_is_a_clear_error():
  lm, _ = target()
  with pytest.raises(ValueError, match="target_cache has batch 3"):
    _call(target_cache=lm.init_cache(3, 64, 10))


def test_exact_minimum_cache_is_enough():
  """The computed minimum cache length really suffices (no clamped writes)."""
  lm, params = target()
  draft, draft_params = noisy_draft()
  prompts, lengths = ragged_prompts(batch=8)
  need = specjax.required_cache_len(lm, prompts.shape[1], MAX_NEW, 4)
  big = specjax.speculative_generate(lm, params, draft, draft_params, prompts, lengths,
                                     max_new_tokens=MAX_NEW, gamma=4, sampling=GREEDY,
                                     cache_len=need + 17)
  tight = specjax.speculative_generate(lm, params, draft, draft_params, prompts, lengths,
                                       max_new_tokens=MAX_NEW, gamma=4, sampling=GREEDY,
                                       cache_len=need)
  np.testing.assert_array_equal(big.tokens, tight.tokens)
  with pytest.raises(ValueError, match="cache_len"):
    specjax.speculative_generate(lm, params, draft, draft_params, prompts, lengths,
                                 max_new_tokens=MAX_NEW, gamma=4, sampling=GREEDY,
                                 cache_len=need - 1)


# ---------------------------------------------------------------- several EOS ids
def _chain_table(v=16):
  """Bigram logits: token i → i + 1 (mod v), by 35 nats."""
  t = np.full((v, v), -30.0, np.float32)
  t[np.arange(v), (np.arange(v) + 1) % v] = 5.0
  return {"logits": jnp.asarray(t)}


@pytest.mark.parametrize("eos", [(6, 11), [11, 6, 6], np.array([6, 11])],
                         ids=["tuple", "list-with-repeats", "array"])
def test_rows_stop_at_the_first_of_several_eos_ids(eos):
  lm, table = BigramLM(16), _chain_table()
  prompts = np.array([[1], [4], [9]], np.int32)
  want = [[2, 3, 4, 5, 6, 0, 0, 0], [5, 6, 0, 0, 0, 0, 0, 0], [10, 11, 0, 0, 0, 0, 0, 0]]
  out = specjax.generate(lm, table, prompts, max_new_tokens=8, sampling=GREEDY, eos_id=eos)
  np.testing.assert_array_equal(out.tokens, want)
  np.testing.assert_array_equal(out.lengths, [5, 2, 2])
  spec = specjax.speculative_generate(lm, table, lm, table, prompts, max_new_tokens=8, gamma=3,
                                      sampling=GREEDY, eos_id=eos)
  np.testing.assert_array_equal(spec.tokens, want)


@pytest.mark.parametrize("eos, exc, needle", [
    ((), ValueError, "non-empty sequence"), ("5", TypeError, "eos_id must be a token id"),
    (2.0, TypeError, "eos_id"), ([3, 99], ValueError, r"\[0, 16\).*got 99"),
    ([-1], ValueError, "eos_id must be an int >= 0")])
def test_bad_eos_ids_are_named(eos, exc, needle):
  with pytest.raises(exc, match=needle):
    specjax.generate(BigramLM(16), _chain_table(), np.array([[1]], np.int32), max_new_tokens=4,
                     sampling=GREEDY, eos_id=eos)
