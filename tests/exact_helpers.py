"""Shared by the chi-square exactness tests: the target's exact joint
distribution of generated tokens 2..4 (the model run on every continuation),
and a speculative run on many copies of one prompt."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from reference import processed_probs
from specjax.generation import SpeculativeDecoder
from specjax.models.decoder import DecoderLM, decoder_config

N_SAMPLES = 50_000
V_LM = 8


@functools.lru_cache(maxsize=None)
def exact_lm():
  """A 2-layer transformer over 8 tokens: its next token depends on the whole
  prefix it reads from its cache."""
  lm = DecoderLM(decoder_config("tiny", vocab_size=V_LM, num_layers=2, d_model=16, num_heads=2,
                                num_kv_heads=1, head_dim=8, mlp_dim=32))
  return lm, lm.init(jax.random.PRNGKey(0))


def joint_t2_t4(lm, params, prompt, cfg) -> np.ndarray:
  """Exact P(t2, t3, t4) `[V, V, V]` of the processed target after `prompt`
  (t1 marginalised): the model run on all V^3 continuations (t1, t2, t3)."""
  v = lm.vocab_size
  conts = np.array(list(itertools.product(range(v), repeat=3)), np.int32)
  seqs = np.concatenate([np.tile(prompt, (len(conts), 1)), conts], axis=1)
  logits = np.asarray(jax.jit(lm.forward)(params, jnp.asarray(seqs)))
  q = processed_probs(logits[:, len(prompt) - 1:], cfg.temperature, cfg.top_k, cfg.top_p)
  idx = np.arange(len(conts))
  t1, t2, t3 = conts.T
  full = (q[idx, 0, t1] * q[idx, 1, t2] * q[idx, 2, t3])[:, None] * q[:, 3]
  return full.reshape((v,) * 4).sum(axis=0)


def counts_t2_t4(tokens: np.ndarray, vocab: int) -> np.ndarray:
  counts = np.zeros((vocab,) * 3)
  np.add.at(counts, (tokens[:, 1], tokens[:, 2], tokens[:, 3]), 1)
  return counts


def decode_copies(lm, params, drafter, draft_params, prompt, cfg, seed, gamma=None,
                  **decoder_fields):
  """4 tokens after N_SAMPLES copies of `prompt`, through a `SpeculativeDecoder`
  built here (so a test can plant a broken rule in `decoder_fields`); γ:
  `gamma`, or the drafter's own."""
  g = gamma if gamma is not None else drafter.fixed_gamma
  need = specjax.required_cache_len(lm, len(prompt), 4, drafter.layout(g).length - 1)
  prompts = jnp.asarray(np.tile(np.asarray(prompt, np.int32), (N_SAMPLES, 1)))
  lengths = jnp.full((N_SAMPLES,), len(prompt), jnp.int32)
  keys = jax.random.split(jax.random.key(seed), N_SAMPLES)
  dec = SpeculativeDecoder(lm, drafter, g, cfg, 4, **decoder_fields)
  return dec.run(params, draft_params, prompts, lengths, keys, lm.init_cache(N_SAMPLES, need),
                 drafter.alloc(N_SAMPLES, len(prompt), need, g))
