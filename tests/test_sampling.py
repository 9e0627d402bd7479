"""Sampling configs and logit processing against an independent numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reference import processed_probs
from specjax.sampling import GREEDY, SamplingConfig, argmax_first, process_logits, sample_tokens

CONFIGS = [
    SamplingConfig(1.0),
    SamplingConfig(0.7),
    SamplingConfig(1.3, top_k=3),
    SamplingConfig(1.0, top_p=0.9),
    SamplingConfig(0.7, top_p=0.9),
    SamplingConfig(0.8, top_k=5, top_p=0.5),
    SamplingConfig(1.0, top_k=1),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_process_logits_matches_reference(cfg):
  logits = np.random.default_rng(0).normal(size=(4, 3, 17)) * 2.0
  got = np.asarray(process_logits(jnp.asarray(logits, jnp.float32), cfg))
  want = processed_probs(logits, cfg.temperature, cfg.top_k, cfg.top_p)
  np.testing.assert_allclose(got, want, atol=2e-6)
  np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("vocab", [1023, 1024])
def test_top_p_rolled_and_unrolled_bisection_match_reference(vocab):
  """The bisection runs as a rolled loop below 1024 tokens and unrolled from
  1024 on (compile time vs. run time): both keep exactly the reference's set."""
  from specjax import sampling
  assert (vocab >= sampling._UNROLL_MIN_VOCAB) == (vocab == 1024)
  logits = np.random.default_rng(vocab).normal(size=(3, 2, vocab)) * 3.0
  for top_p in (0.3, 0.9):
    got = np.asarray(process_logits(jnp.asarray(logits, jnp.float32), SamplingConfig(top_p=top_p)))
    want = processed_probs(logits, 1.0, 0, top_p)
    np.testing.assert_array_equal(got > 0, want > 0)
    np.testing.assert_allclose(got, want, atol=2e-6)


def test_top_p_keeps_smallest_prefix_reaching_mass():
  probs = np.array([0.5, 0.3, 0.15, 0.05])
  got = np.asarray(process_logits(jnp.log(jnp.asarray(probs, jnp.float32)), SamplingConfig(top_p=0.8)))
  # 0.5 + 0.3 reaches 0.8: exactly the first two survive, renormalised.
  np.testing.assert_allclose(got, [0.625, 0.375, 0.0, 0.0], atol=1e-6)
  got = np.asarray(process_logits(jnp.log(jnp.asarray(probs, jnp.float32)), SamplingConfig(top_p=0.81)))
  np.testing.assert_allclose(got, np.array([0.5, 0.3, 0.15, 0]) / 0.95, atol=1e-6)


def test_top_k_hand_case():
  got = np.asarray(process_logits(jnp.array([0.0, 2.0, 1.0, -1.0]), SamplingConfig(top_k=2)))
  e = np.exp([2.0, 1.0])
  np.testing.assert_allclose(got, [0, e[0] / e.sum(), e[1] / e.sum(), 0], atol=1e-6)


def test_greedy_is_one_hot_argmax_first_on_ties():
  logits = jnp.array([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 2.0, 0.0]])
  got = np.asarray(process_logits(logits, GREEDY))
  np.testing.assert_array_equal(got, [[0, 1, 0, 0], [1, 0, 0, 0]])
  keys = jax.random.split(jax.random.key(0), 2)
  np.testing.assert_array_equal(sample_tokens(keys, jnp.asarray(got)), [1, 0])


def test_sample_tokens_frequencies():
  probs = jnp.array([0.1, 0.6, 0.3, 0.0])
  keys = jax.random.split(jax.random.key(3), 20000)
  toks = np.asarray(sample_tokens(keys, jnp.broadcast_to(probs, (20000, 4))))
  freq = np.bincount(toks, minlength=4) / toks.size
  np.testing.assert_allclose(freq, probs, atol=0.015)
  assert freq[3] == 0


@pytest.mark.parametrize(
    "kwargs, exc, needle",
    [
        (dict(temperature=-0.1), ValueError, "temperature"),
        (dict(temperature=float("nan")), ValueError, "temperature"),
        (dict(temperature="1"), TypeError, "temperature"),
        (dict(top_k=-1), ValueError, "top_k"),
        (dict(top_k=2.5), TypeError, "top_k"),
        (dict(top_p=0.0), ValueError, "top_p"),
        (dict(top_p=1.5), ValueError, "top_p"),
        (dict(top_p=None), TypeError, "top_p"),
    ],
)
def test_config_validation(kwargs, exc, needle):
  with pytest.raises(exc, match=needle):
    SamplingConfig(**kwargs)


def test_configs_are_hashable_and_normalised():
  assert SamplingConfig(1, 0, 1) == SamplingConfig(1.0, 0, 1.0)
  assert hash(SamplingConfig(1, 0, 1)) == hash(SamplingConfig(1.0, 0, 1.0))
  assert GREEDY.is_greedy and not SamplingConfig(0.5).is_greedy


def test_sample_tokens_many_blocks_and_zero_mass_regions():
  """Vocabulary over several 128-token blocks, whole zero blocks, zeros at
  block edges: frequencies match and zero-probability tokens never appear."""
  v = 700
  rng = np.random.default_rng(5)
  probs = rng.random(v) * (rng.random(v) < 0.05)
  probs[128:384] = 0.0           # two empty blocks
  probs[127] = probs[384] = 0.0  # zeros at block edges
  probs[0] = probs[699] = 0.3    # mass in the first and the ragged last block
  probs = probs / probs.sum()
  n = 40000
  keys = jax.random.split(jax.random.key(11), n)
  toks = np.asarray(sample_tokens(keys, jnp.broadcast_to(jnp.asarray(probs, jnp.float32), (n, v))))
  counts = np.bincount(toks, minlength=v)
  assert counts[probs == 0].sum() == 0
  support = probs > 0
  from scipy import stats
  chi2 = stats.chisquare(counts[support], probs[support] * n)
  assert chi2.pvalue > 1e-4, chi2


def test_sample_tokens_rows_are_independent_of_batch():
  probs = jax.nn.softmax(jax.random.normal(jax.random.key(2), (6, 300)), axis=-1)
  keys = jax.random.split(jax.random.key(4), 6)
  whole = np.asarray(sample_tokens(keys, probs))
  single = [int(sample_tokens(keys[i:i + 1], probs[i:i + 1])[0]) for i in range(6)]
  np.testing.assert_array_equal(whole, single)


def test_sample_from_uniform_rejects_bad_shapes():
  from specjax.sampling import sample_from_uniform
  with pytest.raises(ValueError, match="probs_BV"):
    sample_from_uniform(jnp.zeros((2,)), jnp.ones((2, 3, 4)))
  with pytest.raises(ValueError, match="u_B"):
    sample_from_uniform(jnp.zeros((3,)), jnp.ones((2, 4)))


def test_argmax_first_is_numpys_argmax_on_ties_infs_and_nans():
  # Hand cases: ties take the first index, an all -inf row gives 0, a NaN wins
  # (the first NaN), integer inputs work; then random rows with many ties.
  x = np.array([[1., 3., 3., 0.], [-np.inf] * 4, [0., np.nan, 5., np.nan], [2., 2., 2., 2.]],
               np.float32)
  np.testing.assert_array_equal(np.asarray(argmax_first(jnp.asarray(x))), [1, 0, 1, 0])
  np.testing.assert_array_equal(np.asarray(argmax_first(jnp.asarray([[1, 5, 5], [2, 2, 1]]))),
                                [1, 0])
  rng = np.random.default_rng(0)
  r = rng.integers(0, 4, size=(3, 5, 37)).astype(np.float32)  # few values: many ties
  for axis in (0, 1, 2, -1):
    got = np.asarray(argmax_first(jnp.asarray(r), axis=axis))
    np.testing.assert_array_equal(got, np.argmax(r, axis=axis))
    assert got.dtype == np.int32
  for bad in (3, -4):  # never wrapped around silently
    with pytest.raises(ValueError, match=rf"axis must be in \[-3, 3\).*got {bad}"):
      argmax_first(jnp.asarray(r), axis=bad)
