"""Small temperatures have no numeric cliff: any finite T > 0 gives the exact law of the
processed distribution (softmax(logits / T), top-k, top-p) under jit, on the target's side, the
draft's and through the rejection rule; T so small that logits / T overflows gives its limit
(uniform over the argmax ties: greedy's token without ties). Chi-square as the other exactness
tests (`reference.chi_square_pvalue` against `reference.processed_probs`, float64), each with a
negative control."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import tiny
from reference import chi_square_pvalue, processed_probs
from specjax.drafters import ModelDrafter, PromptLookup
from specjax.generation import nonfinite_rows
from specjax.sampling import SamplingConfig, process_logits, sample_from_uniform
from specjax.verify import rejection_verify

N = 50_000
V = 8
TEMPS = (1e-3, 1e-9, 1e-30)


def _process(logits, cfg):
  return jax.jit(process_logits, static_argnums=1)(logits, cfg)


def _logits(seed: int, t: float) -> np.ndarray:
  """float32 logits `[V]` whose gaps are of the order of t: a law far from one-hot at T = t."""
  z = np.random.default_rng(seed).normal(size=V) * 1.5
  return (z * t).astype(np.float32)


@pytest.mark.parametrize("t", TEMPS + (1e-40, 5e-324, 1e30))
@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (3, 1.0), (0, 0.7)])
def test_processed_distribution_is_finite_and_the_reference_under_jit(t, top_k, top_p):
  cfg = SamplingConfig(temperature=t, top_k=top_k, top_p=top_p)
  rows = np.stack([_logits(0, max(t, 1e-30)), np.random.default_rng(1).normal(size=V) * 3,
                   np.array([2.0, 5.0, 5.0, -np.inf, 1.0, 5.0, 0.0, -1.0])]).astype(np.float32)
  got = np.asarray(_process(jnp.asarray(rows), cfg))
  assert np.isfinite(got).all(), got
  np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)
  if t >= 1e-38:   # the reference divides in float64 (a subnormal T is its limit below)
    want = processed_probs(rows.astype(np.float64), t, top_k, top_p)
    np.testing.assert_allclose(got, want, atol=2e-5)
  if t <= 1e-30:   # row 1: greedy's token; row 2: uniform over its three tied maxima
    assert got[1].argmax() == rows[1].argmax() and got[1].max() == 1.0
    np.testing.assert_array_equal(got[2] > 0, rows[2] == 5.0)
    np.testing.assert_allclose(got[2][rows[2] == 5.0], 1 / 3, rtol=1e-6)


@pytest.mark.parametrize("t", TEMPS)
def test_sampled_tokens_have_the_exact_law_and_a_negative_control(t):
  """Target side: jitted process_logits then the inverse-CDF draw, N rows; the control is the
  law of another row (p < 1e-6)."""
  cfg = SamplingConfig(temperature=t, top_k=6)
  logits = np.stack([_logits(2, t), _logits(3, t)])
  want = processed_probs(logits.astype(np.float64), t, 6)
  draw = jax.jit(lambda u, x: sample_from_uniform(u, process_logits(
      jnp.broadcast_to(x, (u.shape[0], V)), cfg)))
  u = jax.random.uniform(jax.random.key(int(-np.log10(t))), (N,))
  counts = np.bincount(np.asarray(draw(u, jnp.asarray(logits[0]))), minlength=V)
  assert chi_square_pvalue(counts, want[0]) > 1e-3
  assert chi_square_pvalue(counts, want[1]) < 1e-6


@pytest.mark.parametrize("t", TEMPS)
def test_rejection_rule_at_small_temperature_has_the_target_law(t):
  """Draft side and verify rule: drafts drawn from the processed draft p, verified against the
  processed target q by `rejection_verify` (γ = 1): the first token has law q exactly; the
  control (the draft's law p) is rejected."""
  cfg = SamplingConfig(temperature=t)
  p_logits, q_logits = _logits(4, t), _logits(5, t)
  q_want = processed_probs(q_logits[None].astype(np.float64), t)[0]
  p_want = processed_probs(p_logits[None].astype(np.float64), t)[0]

  @jax.jit
  def run(keys):
    p = process_logits(jnp.broadcast_to(p_logits, (N, V)), cfg)
    q = process_logits(jnp.broadcast_to(q_logits, (N, 2, V)), cfg)
    u = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, 1)))(keys)
    drafts = sample_from_uniform(u, p)
    n, nxt = rejection_verify(keys, drafts[:, None], p[:, None], q)
    return jnp.where(n > 0, drafts, nxt), n

  first, n = run(jax.random.split(jax.random.key(7), N))
  counts = np.bincount(np.asarray(first), minlength=V)
  n = np.asarray(n)
  assert 0 < n.sum() < N   # acceptances and rejections
  assert chi_square_pvalue(counts, q_want) > 1e-3
  assert chi_square_pvalue(counts, p_want) < 1e-6


def test_nonfinite_rows_counts_a_processed_distribution_that_is_not():
  logits = jnp.zeros((3, 2, V))
  probs = jnp.full((3, 2, V), 1 / V).at[1, 1, 3].set(jnp.nan).at[2, 0, 0].set(jnp.inf)
  np.testing.assert_array_equal(nonfinite_rows(logits), [0, 0, 0])
  np.testing.assert_array_equal(nonfinite_rows(logits, probs), [0, 1, 1])


@pytest.fixture(scope="module")
def greedy_run():
  lm, params = tiny.target()
  prompts, lengths = tiny.ragged_prompts(batch=4)
  ref = specjax.generate(lm, params, prompts, lengths, max_new_tokens=12,
                         sampling=specjax.GREEDY)
  return lm, params, prompts, lengths, np.asarray(ref.tokens)


def test_generate_at_1e_30_is_greedy(greedy_run):
  """Before: T = 1e-9 gave tokens neither greedy nor sampled; T = 1e-12 all 0."""
  lm, params, prompts, lengths, ref = greedy_run
  out = specjax.generate(lm, params, prompts, lengths, max_new_tokens=12,
                         sampling=SamplingConfig(temperature=1e-30), key=jax.random.key(3))
  np.testing.assert_array_equal(np.asarray(out.tokens), ref)
  assert int(np.asarray(out.stats.nonfinite).sum()) == 0


@pytest.mark.parametrize("drafter", ["model", "lookup"])
def test_speculative_generate_at_1e_30_is_greedy(greedy_run, drafter):
  lm, params, prompts, lengths, ref = greedy_run
  dlm, dparams = tiny.small_draft()
  draft = ModelDrafter(dlm) if drafter == "model" else PromptLookup()
  out = specjax.speculative_generate(
      lm, params, draft, dparams if drafter == "model" else None, prompts, lengths,
      max_new_tokens=12, gamma=3, sampling=SamplingConfig(temperature=1e-30),
      key=jax.random.key(4))
  np.testing.assert_array_equal(np.asarray(out.tokens), ref)
  assert int(np.asarray(out.stats.nonfinite).sum()) == 0
  assert int(np.asarray(out.stats.accepted).sum()) > 0
