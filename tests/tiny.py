"""Tiny models and ragged prompts shared by the generation tests."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models.decoder import DecoderLM, decoder_config

VOCAB = 64
EOS = 5


@functools.lru_cache(maxsize=None)
def target():
  lm = DecoderLM(decoder_config("tiny", vocab_size=VOCAB, num_layers=2))
  return lm, lm.init(jax.random.PRNGKey(0))


@functools.lru_cache(maxsize=None)
def small_draft():
  """A different, smaller model: low acceptance."""
  lm = DecoderLM(decoder_config("tiny", vocab_size=VOCAB, num_layers=1, d_model=16,
                                num_heads=2, num_kv_heads=1, mlp_dim=32, tie_embeddings=True))
  return lm, lm.init(jax.random.PRNGKey(1))


@functools.lru_cache(maxsize=None)
def noisy_draft(scale=0.15):
  """The target's architecture with perturbed weights: high, varied acceptance."""
  lm, params = target()
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(7), len(leaves))
  noisy = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return lm, jax.tree_util.tree_unflatten(tree, noisy)


def ragged_prompts(batch=8, max_len=10, seed=2):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, max_len + 1, size=batch)
  lengths[0] = max_len
  prompts = rng.integers(6, VOCAB, size=(batch, max_len)).astype(np.int32)
  prompts[np.arange(max_len)[None] >= lengths[:, None]] = 0
  return jnp.asarray(prompts), jnp.asarray(lengths, jnp.int32)


def assert_rows_independent_and_no_retrace(lm, params, drafter, draft_params, **kw):
  """Row 2 of a sampled batch of 4 equals that row decoded alone with its key
  (rows independent of the batch); other prompts of the same shape run the
  compiled loop again (no retrace). `kw`: speculative_generate's options."""
  import specjax
  from specjax.measure.compiles import TraceCounter
  prompts, lengths = ragged_prompts(batch=4, seed=9)
  keys = jax.random.split(jax.random.key(11), 4)
  full = specjax.speculative_generate(lm, params, drafter, draft_params, prompts, lengths,
                                      key=keys, **kw)
  alone = specjax.speculative_generate(lm, params, drafter, draft_params, prompts[2:3],
                                       lengths[2:3], key=keys[2:3], **kw)
  np.testing.assert_array_equal(alone.tokens[0], full.tokens[2])
  p2, l2 = ragged_prompts(batch=4, seed=10)
  with TraceCounter() as traces:
    specjax.speculative_generate(lm, params, drafter, draft_params, p2, l2,
                                 key=jax.random.key(1), **kw)
  assert traces.decode_loops == 0, traces.counts
