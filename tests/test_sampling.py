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


@pytest.mark.parametrize("v,shards", [(8, 1), (300, 1), (256, 2)])
def test_a_row_without_mass_draws_an_id_inside_the_vocabulary(v, shards):
  """A drafter's empty child (top-p leaving fewer tokens than children) is
  drawn from zeros and still fed to the target: its id must be one the
  embedding holds (V − 1), not an index into the block padding."""
  from specjax.sampling import sample_from_uniform
  probs = jnp.zeros((3, v)).at[1, 5].set(1.0)
  toks = np.asarray(sample_from_uniform(jnp.asarray([0.0, 0.5, 0.999]), probs, shards))
  assert toks.tolist() == [v - 1, 5, v - 1]


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


# The sampler over a vocabulary split into pieces (`vocab_shards`: a mesh's `model` axis).

def _dyadic_probs(v, seed):
  """Probabilities that are multiples of 2^-12 with zero pieces, zero blocks and
  zeros at edges: every partial sum is exact in float32, so the draw over pieces
  and the two-level draw must pick the same token for every uniform."""
  rng = np.random.default_rng(seed)
  w = rng.integers(0, 4, size=v) * (rng.random(v) < 0.2)
  w[v // 4:v // 2] = 0            # a whole zero piece at 4 pieces
  w[0] = 0
  w[-1] = 3
  w[v // 2] = 5                    # mass at a piece's first token
  w = (w * (4096 // max(int(w.sum()), 1))).astype(np.float64)
  w[np.argmax(w)] += 4096 - w.sum()
  return (w / 4096).astype(np.float32)


@pytest.mark.parametrize("shards", [2, 4, 8])
def test_draw_over_vocab_pieces_equals_the_two_level_draw(shards):
  from specjax.sampling import sample_from_uniform
  v = 1024
  probs = jnp.asarray(np.stack([_dyadic_probs(v, s) for s in range(4)]))
  n = 4096
  u = (jnp.arange(n, dtype=jnp.float32) + 0.5) / n        # a grid over [0, 1)
  rows = jnp.repeat(probs, n, axis=0)
  uu = jnp.tile(u, 4)
  one = np.asarray(sample_from_uniform(uu, rows, shards=1))
  split = np.asarray(sample_from_uniform(uu, rows, shards=shards))
  np.testing.assert_array_equal(split, one)
  # and never a zero-probability token, including the grid's ends
  ends = jnp.asarray([0.0, np.nextafter(np.float32(1), np.float32(0))], jnp.float32)
  for r in range(4):
    got = np.asarray(sample_from_uniform(ends, jnp.broadcast_to(probs[r], (2, v)), shards=shards))
    assert (np.asarray(probs[r])[got] > 0).all(), got


def test_draw_over_vocab_pieces_has_the_law_and_a_negative_control():
  """Generic (non-dyadic) probabilities: chi-square over 40k draws through four
  pieces; the same counts against a distribution with two tokens' mass swapped
  are rejected."""
  from scipy import stats
  from specjax.sampling import row_uniforms, sample_from_uniform
  v = 512
  probs = np.array(jax.nn.softmax(2 * jax.random.normal(jax.random.key(8), (v,))), np.float64)
  probs[200:256] = 0.0
  probs = probs / probs.sum()
  n = 40000
  u = row_uniforms(jax.random.split(jax.random.key(9), 1), n)[0]
  rows = jnp.broadcast_to(jnp.asarray(probs, jnp.float32), (n, v))
  toks = np.asarray(sample_from_uniform(u, rows, shards=4))
  counts = np.bincount(toks, minlength=v)
  assert counts[probs == 0].sum() == 0
  keep = probs * n >= 5
  other = counts[~keep & (probs > 0)].sum()
  obs = np.append(counts[keep], other)
  exp = np.append(probs[keep], probs[~keep & (probs > 0)].sum()) * n
  assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-4
  top = np.argsort(probs)[::-1]
  wrong = probs.copy()
  wrong[top[0]], wrong[top[5]] = probs[top[5]], probs[top[0]]
  exp = np.append(wrong[keep], wrong[~keep & (wrong > 0)].sum()) * n
  assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue < 1e-6


def test_draw_over_vocab_pieces_rejects_pieces_that_do_not_divide():
  from specjax.sampling import sample_from_uniform
  with pytest.raises(ValueError, match="shards must be an int >= 1 dividing the vocabulary"):
    sample_from_uniform(jnp.zeros((2,)), jnp.ones((2, 100)), shards=3)


@pytest.mark.parametrize("shards", [1, 2, 4, 8])
def test_top_k_over_vocab_pieces_is_lax_top_k_ties_included(shards):
  from specjax.sampling import top_k_over_vocab
  x = jnp.round(2 * jax.random.normal(jax.random.key(3), (3, 5, 256))) / 2   # many ties
  x = x.at[0, 0].set(0.0)                                                  # all tied
  for k in (1, 7, 32):
    vals, idx = top_k_over_vocab(x, k, shards=shards)
    ref_vals, ref_idx = jax.lax.top_k(x, k)
    np.testing.assert_array_equal(vals, ref_vals)
    np.testing.assert_array_equal(idx, ref_idx)
    assert idx.dtype == jnp.int32
  # k above a piece's size: one top_k over the whole vocabulary
  np.testing.assert_array_equal(top_k_over_vocab(x, 200, shards=shards)[1],
                                jax.lax.top_k(x, 200)[1])


def test_gather_over_vocab_pieces_is_a_gather():
  from specjax.sampling import gather_over_vocab
  p = jax.random.uniform(jax.random.key(4), (3, 4, 64))
  t = jax.random.randint(jax.random.key(5), (3, 4), 0, 64)
  ref = np.take_along_axis(np.asarray(p), np.asarray(t)[..., None], -1)[..., 0]
  for shards in (1, 4):
    np.testing.assert_array_equal(gather_over_vocab(p, t, shards=shards), ref)


def test_vocab_shards_follow_the_mesh_model_axis():
  from specjax.sampling import vocab_shards
  assert vocab_shards(1024) == 1                                 # no mesh
  if len(jax.devices()) >= 4:
    mesh = jax.make_mesh((1, 4), ("data", "model"))
    with jax.set_mesh(mesh):
      assert vocab_shards(1024) == 4 and vocab_shards(1026) == 1
