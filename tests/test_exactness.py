"""Speculative sampling has exactly the target's distribution.

The target's distribution over the first generated tokens is enumerated
exactly (table models: by formula; a tiny transformer: by running it on every
prefix) and compared with >= 50,000 speculative samples by chi-square. The
tokens compared come from the first speculative iterations and include
positions that follow a rejection. A verifier whose residual step samples from
q instead of norm(max(0, q - p)) must be caught (negative control).
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from exact_helpers import optimized_codegen
from reference import chi_square_pvalue, processed_probs
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.models.ngram import BigramLM
from specjax.sampling import SamplingConfig, sample_tokens
from specjax.verify import rejection_verify

N_SAMPLES = 50_000
CONFIGS = [SamplingConfig(1.0), SamplingConfig(0.7, top_p=0.9), SamplingConfig(1.0, top_k=3)]


def residual_from_q_verify(keys, drafts, p, q):
  """Broken on purpose: after a rejection it samples from q, not the residual."""
  n, _ = rejection_verify(keys, drafts, p, q)
  q_n = jnp.take_along_axis(q, n[:, None, None], axis=1)[:, 0]
  second = jax.vmap(lambda k: jax.random.split(k, 2)[1])(keys)
  return n, sample_tokens(second, q_n)


def _counts(tokens, cols, vocab):
  counts = np.zeros((vocab,) * len(cols))
  np.add.at(counts, tuple(tokens[:, c] for c in cols), 1)
  return counts


# ------------------------------------------------------------- bigram tables
V_TABLE = 6
_rng = np.random.default_rng(0)
TARGET_TABLE = _rng.normal(size=(V_TABLE, V_TABLE)) * 1.5
DRAFT_TABLE = TARGET_TABLE + _rng.normal(size=(V_TABLE, V_TABLE)) * 1.5
PROMPT_TOKEN = 2


def _bigram_run(cfg, verify_fn, seed):
  lm = BigramLM(V_TABLE)
  prompts = np.full((N_SAMPLES, 1), PROMPT_TOKEN, np.int32)
  out = specjax.speculative_generate(
      lm, {"logits": jnp.asarray(TARGET_TABLE, jnp.float32)}, lm,
      {"logits": jnp.asarray(DRAFT_TABLE, jnp.float32)}, prompts, max_new_tokens=4, gamma=2,
      sampling=cfg, key=jax.random.key(seed), verify_fn=verify_fn)
  return out


def _bigram_joint(cfg):
  """Exact P(t2, t3, t4) of the processed target chain (t1 marginalised)."""
  q = processed_probs(TARGET_TABLE, cfg.temperature, cfg.top_k, cfg.top_p)
  return np.einsum("a,ab,bc,cd->bcd", q[PROMPT_TOKEN], q, q, q)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_bigram_pair_is_exact(cfg):
  out = _bigram_run(cfg, rejection_verify, seed=1)
  tokens = np.asarray(out.tokens)
  # t2, t3 come from the first iteration (t3 after a rejection of d1 when it
  # happens, which it often does), t4 from the second.
  hist = np.asarray(out.stats.accepted_hist)[:, :]
  assert hist[:, 0].sum() > 0.2 * N_SAMPLES, "the test needs many rejections"
  pvalue = chi_square_pvalue(_counts(tokens, (1, 2, 3), V_TABLE), _bigram_joint(cfg))
  assert pvalue > 1e-3, pvalue


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_bigram_negative_control_is_detected(cfg):
  out = _bigram_run(cfg, residual_from_q_verify, seed=1)
  pvalue = chi_square_pvalue(_counts(np.asarray(out.tokens), (1, 2, 3), V_TABLE),
                             _bigram_joint(cfg))
  assert pvalue < 1e-6, pvalue


def test_first_token_after_rejection_has_target_conditional():
  """Among rows whose first draft was rejected, t2 must follow q(. | t1): the
  residual alone is not q, but mixing accepts and residuals is. Checks the
  conditional P(t2 | t1) for the most frequent t1."""
  cfg = SamplingConfig(1.0)
  out = _bigram_run(cfg, rejection_verify, seed=3)
  tokens = np.asarray(out.tokens)
  q = processed_probs(TARGET_TABLE, 1.0)
  t1 = np.bincount(tokens[:, 0], minlength=V_TABLE).argmax()
  rows = tokens[tokens[:, 0] == t1]
  pvalue = chi_square_pvalue(np.bincount(rows[:, 1], minlength=V_TABLE), q[t1])
  assert pvalue > 1e-3, pvalue


def test_invalid_drafts_count_as_rejected_with_no_proposal_mass():
  """`num_valid_B`: a row's drafts past its count are never accepted, and the
  token after its last valid draft is drawn from q there (p = 0): with every
  draft matching (accepted for sure), a row of k valid drafts keeps k and its
  next token follows q_{k+1} (chi-square), whatever lies past them."""
  n, g, v = 60000, 3, 6
  rng = np.random.default_rng(5)
  q_G1V = jax.nn.softmax(jnp.asarray(rng.normal(size=(g + 1, v)) * 1.5, jnp.float32), -1)
  drafts_G = jnp.argmax(q_G1V[:g], axis=-1).astype(jnp.int32)
  # p puts all its mass on each draft, q gives it most: accepted with prob q(d) < 1 ...
  p_GV = jax.nn.one_hot(drafts_G, v, dtype=jnp.float32)
  keys = jax.random.split(jax.random.key(11), n)
  q64 = np.asarray(q_G1V, np.float64)
  q64 /= q64.sum(-1, keepdims=True)
  for k in range(g + 1):
    num_valid = jnp.full((n,), k, jnp.int32)
    acc, nxt = rejection_verify(keys, jnp.broadcast_to(drafts_G, (n, g)),
                                jnp.broadcast_to(p_GV, (n, g, v)),
                                jnp.broadcast_to(q_G1V, (n, g + 1, v)), num_valid)
    acc, nxt = np.asarray(acc), np.asarray(nxt)
    assert acc.max() <= k and (k == 0 or acc.max() == k)
    # ... so rows that kept all k valid drafts drew their next token from q_{k+1}.
    rows = nxt[acc == k]
    pvalue = chi_square_pvalue(np.bincount(rows, minlength=v), q64[k])
    assert pvalue > 1e-3, (k, pvalue)
  # Negative control: the token after k accepted drafts is not q_k's law.
  wrong = chi_square_pvalue(np.bincount(rows, minlength=v), q64[g - 1])
  assert wrong < 1e-6, wrong


# ----------------------------------------------------- tiny transformer pair
V_LM = 8
PROMPT = [3, 1, 4]


def _lm_pair():
  target = DecoderLM(decoder_config("tiny", vocab_size=V_LM, num_layers=1, d_model=16,
                                    num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32))
  tp = target.init(jax.random.PRNGKey(0))
  leaves, tree = jax.tree_util.tree_flatten(tp)
  keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
  dp = jax.tree_util.tree_unflatten(tree, [
      x + 0.6 * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
  return target, tp, dp


def _lm_joint(target, params, cfg):
  """Exact P(t2, t3, t4): the target run on all V^3 continuations (t1, t2, t3)."""
  conts = np.array(list(itertools.product(range(V_LM), repeat=3)), np.int32)
  seqs = np.concatenate([np.tile(PROMPT, (len(conts), 1)), conts], axis=1)
  logits = np.asarray(jax.jit(target.forward)(params, jnp.asarray(seqs)))
  p = len(PROMPT)
  q = processed_probs(logits[:, p - 1:], cfg.temperature, cfg.top_k, cfg.top_p)
  t1, t2, t3 = conts.T
  joint_full = (q[:, 0, :][np.arange(len(conts)), t1] * q[:, 1][np.arange(len(conts)), t2]
                * q[:, 2][np.arange(len(conts)), t3])[:, None] * q[:, 3]
  # joint_full[(t1,t2,t3), t4] = P(t1,t2,t3,t4); sum over t1.
  return joint_full.reshape(V_LM, V_LM, V_LM, V_LM).sum(axis=0)


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=str)
def test_transformer_pair_is_exact_and_control_detected(cfg):
  target, tp, dp = _lm_pair()
  joint = _lm_joint(target, tp, cfg)
  prompts = np.tile(np.array(PROMPT, np.int32), (N_SAMPLES, 1))
  results = {}
  for name, fn in (("exact", rejection_verify), ("broken", residual_from_q_verify)):
    with optimized_codegen():
      out = specjax.speculative_generate(target, tp, target, dp, prompts, max_new_tokens=4,
                                         gamma=2, sampling=cfg, key=jax.random.key(5),
                                         verify_fn=fn)
    results[name] = chi_square_pvalue(_counts(np.asarray(out.tokens), (1, 2, 3), V_LM), joint)
    if name == "exact":
      assert 0.2 < out.acceptance_rate < 0.9, out.acceptance_rate
  assert results["exact"] > 1e-3, results
  assert results["broken"] < 1e-6, results


def test_greedy_verify_equals_rejection_rule_on_one_hot():
  """The decoder's temperature-0 shortcut makes the rejection rule's decisions."""
  from specjax.sampling import GREEDY, process_logits
  from specjax.verify import greedy_verify
  b, g, v = 64, 4, 6
  rng = np.random.default_rng(0)
  # Few distinct logits so that drafts often match the target's argmax (and ties occur).
  q = process_logits(jnp.asarray(rng.integers(0, 3, size=(b, g + 1, v)), jnp.float32), GREEDY)
  target_best = np.asarray(jnp.argmax(q, -1))
  drafts = np.where(rng.random((b, g)) < 0.7, target_best[:, :g], rng.integers(0, v, size=(b, g)))
  drafts = jnp.asarray(drafts, jnp.int32)
  p = jax.nn.one_hot(drafts, v)
  keys = jax.random.split(jax.random.key(0), b)
  n_ref, next_ref = rejection_verify(keys, drafts, p, q)
  n, nxt = greedy_verify(keys, drafts, p, q)
  np.testing.assert_array_equal(n, n_ref)
  np.testing.assert_array_equal(nxt, next_ref)
  assert 0 < int(jnp.sum(n == g)) < b and int(jnp.sum(n == 0)) > 0  # all cases occur
