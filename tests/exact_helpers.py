"""Shared by the chi-square exactness tests: the target's exact joint
distribution of generated tokens 2..4 (the model run on every continuation),
and a speculative run on many copies of one prompt."""

import contextlib
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from reference import chi_square_pvalue, processed_probs
from specjax.generation import SpeculativeDecoder
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.sampling import row_uniforms, sample_from_uniform
from specjax.verify import tree_verify

N_SAMPLES = 50_000
V_LM = 8


@contextlib.contextmanager
def optimized_codegen(level: int = 1):
  """Programs compiled inside: LLVM at -O`level`, not at the suite's -O0
  (tests/conftest.py). For the N_SAMPLES-row sampling runs, where running
  outweighs compiling: EAGLE-2's chi-square decoder compiled in 4.4 s and
  ran in 22 s at -O0, 8.6 s and 6.2 s at -O1 (-O3: 11.6 s and 6.2 s). Not
  where compiling dominates: test_adaptive's chi-square runs (γ = "auto")
  took 4-5 s longer each. The same HLO (codegen only, as the suite's
  flags); a program compiled before is reused as it is. JAX has no public
  per-process switch for a library's jits (`jax_optimization_level` is
  ignored by XLA:CPU), so this wraps the options every compilation starts
  from; without that hook, a no-op."""
  from jax._src import compiler
  base = getattr(compiler, "get_compile_options", None)
  if base is None:
    yield
    return

  def get_compile_options(*args, **kwargs):
    options = base(*args, **kwargs)
    options.executable_build_options.debug_options.xla_backend_optimization_level = level
    return options

  compiler.get_compile_options = get_compile_options
  try:
    yield
  finally:
    compiler.get_compile_options = base


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
  with optimized_codegen():
    return dec.run(params, draft_params, prompts, lengths, keys,
                   lm.init_cache(N_SAMPLES, need), drafter.alloc(N_SAMPLES, len(prompt), need, g))


def broken_tree_verify(keys, tokens, valid, q, children, depth, p=None, greedy=False):
  """Broken on purpose: after the children of a node are rejected it samples
  from the target's distribution at the node, not from the residual."""
  path, n, nxt = tree_verify(keys, tokens, valid, q, children, depth, p, greedy)
  node = jnp.where(n > 0, jnp.take_along_axis(path, jnp.maximum(n - 1, 0)[:, None], 1)[:, 0], 0)
  kids = children[node] if children.ndim == 2 else children[jnp.arange(node.shape[0]), node]
  tried = jnp.any((kids >= 0) & jnp.take_along_axis(valid, jnp.maximum(kids, 0), axis=1), axis=1)
  q_here = jnp.take_along_axis(q, node[:, None, None], axis=1)[:, 0]
  u = row_uniforms(jax.vmap(lambda k: jax.random.fold_in(k, 7))(keys), 1)[:, 0]
  return path, n, jnp.where(tried, sample_from_uniform(u, q_here), nxt)


def assert_tree_drafter_exact(lm, params, drafter, draft_params, prompt, cfg, seed):
  """Chi-square of tokens 2..4 against the target's exact joint law, for the
  tree verifier (p > 1e-3, after both acceptances and rejections) and for
  `broken_tree_verify` (p < 1e-6: the test can tell)."""
  joint = joint_t2_t4(lm, params, prompt, cfg)
  pvalues = {}
  for name, fn in (("exact", tree_verify), ("broken", broken_tree_verify)):
    out = decode_copies(lm, params, drafter, draft_params, prompt, cfg, seed, tree_fn=fn)
    pvalues[name] = chi_square_pvalue(counts_t2_t4(np.asarray(out.tokens), lm.vocab_size), joint)
    if name == "exact":
      hist = np.asarray(out.stats.accepted_hist).sum(0)
      assert hist[0] > 0 and hist[1:].sum() > 0, hist  # rejections and acceptances
  assert pvalues["exact"] > 1e-3 and pvalues["broken"] < 1e-6, pvalues
