"""The compiled decode loops update the KV caches in place and read them whole.

No output check can see a cache copied on every step, only the time it takes.
These tests read the compiled HLO of the generation loops and fail if any
top-level instruction of a `while` body other than an in-place write
(scatter / dynamic-update-slice), a bitcast or tuple plumbing produces a
cache-buffer-sized array: a copy, a transpose, or a slice of a stacked buffer.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.adaptive import AdaptiveGamma
from specjax.drafters import ModelDrafter
from specjax.generation import (AutoregressiveDecoder, SpeculativeDecoder, autoregressive_loop,
                                run_prefill, speculative_loop)
from specjax.measure.hlo import computations, while_bodies
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.models.t5 import T5, t5_config
from specjax.sampling import SamplingConfig
from specjax.verify import rejection_verify

# γ + 1 = 3 rows times the 2 query heads per kv head of "tiny" must not equal
# its head dim 8: attention scores [B, K, S, G*T] would look like a buffer.
BATCH, PROMPT, MAX_NEW, GAMMA = 3, 6, 12, 2
SLOTS = 41  # prime: no other array of the loop has this dimension
_PLUMBING = {"parameter", "get-tuple-element", "tuple", "bitcast", "scatter",
             "dynamic-update-slice", "while", "constant"}
_INSTR = re.compile(r"^\s+(?:ROOT )?%(\S+) = [a-z0-9]+\[([0-9,]*)\]\S* ([\w-]+)\(")


def cache_sized_ops(hlo: str, buffer_elems: int, skip_dispatch: bool = False):
  """Top-level ops of while bodies whose output has `buffer_elems` elements,
  a dimension of SLOTS, and that are not in-place writes or plumbing.
  `skip_dispatch`: leave out bodies that dispatch to a conditional (the
  adaptive loop's outer loop, which runs once per change of γ)."""
  comps, bodies = computations(hlo), while_bodies(hlo)
  assert bodies, "no while loop in the compiled program"
  if skip_dispatch:
    bodies = {b for b in bodies if not any(" conditional(" in line for line in comps[b])}
  bad = []
  for body in bodies:
    for line in comps[body]:
      m = _INSTR.match(line)
      if not m or not m.group(2):
        continue
      dims = [int(d) for d in m.group(2).split(",")]
      if SLOTS not in dims or int(np.prod(dims)) != buffer_elems:
        continue
      name, op = m.group(1), m.group(3)
      in_place = op == "fusion" and re.search(r"scatter|dynamic-update-slice", name)
      if op not in _PLUMBING and not in_place:
        bad.append(f"{name} = {op} [{m.group(2)}]")
  return bad


def _inputs():
  prompts = jnp.asarray(np.random.default_rng(0).integers(2, 60, (BATCH, PROMPT)), jnp.int32)
  lengths = jnp.asarray([PROMPT, 2, 4], jnp.int32)
  keys = jax.random.split(jax.random.key(0), BATCH)
  return prompts, lengths, keys


def _models(kind):
  if kind == "decoder":
    cfg = decoder_config("tiny", vocab_size=64, num_layers=3)
    target, draft = DecoderLM(cfg), DecoderLM(cfg.replace(num_layers=1))
    per_buffer = cfg.num_kv_heads * cfg.head_dim
  else:
    target = T5(t5_config("t5-tiny", vocab_size=64))
    draft = T5(target.config.replace(num_layers=1, num_decoder_layers=1))
    per_buffer = target.config.num_heads * target.config.d_kv
  return target, draft, BATCH * SLOTS * per_buffer


@pytest.mark.parametrize("kind", ["decoder", "t5"])
def test_generation_loops_never_copy_a_cache_buffer(kind):
  target, draft, elems = _models(kind)
  tp, dp = target.init(jax.random.PRNGKey(0)), draft.init(jax.random.PRNGKey(1))
  prompts, lengths, keys = _inputs()
  sampling = SamplingConfig(temperature=1.0)

  ar = AutoregressiveDecoder(target, sampling, MAX_NEW, None, 0)
  hlo = autoregressive_loop.lower(ar, tp, prompts, lengths, keys,
                                  target.init_cache(BATCH, SLOTS, PROMPT)).compile().as_text()
  assert cache_sized_ops(hlo, elems) == []

  sp = SpeculativeDecoder(target, ModelDrafter(draft), GAMMA, sampling, MAX_NEW, None, 0,
                          rejection_verify)
  hlo = speculative_loop.lower(sp, tp, dp, prompts, lengths, keys,
                               target.init_cache(BATCH, SLOTS, PROMPT),
                               draft.init_cache(BATCH, SLOTS, PROMPT)).compile().as_text()
  assert cache_sized_ops(hlo, elems) == []

  # gamma="auto": the segments' loops (one per γ) update the caches in place too.
  ad = SpeculativeDecoder(target, ModelDrafter(draft), GAMMA, sampling, MAX_NEW, None, 0,
                          rejection_verify, adaptive=AdaptiveGamma(gammas=(0, 1, GAMMA)))
  hlo = speculative_loop.lower(ad, tp, dp, prompts, lengths, keys,
                               target.init_cache(BATCH, SLOTS, PROMPT),
                               draft.init_cache(BATCH, SLOTS, PROMPT), None,
                               jnp.ones((3,))).compile().as_text()
  # The outer loop copies the caches into a segment (XLA copies what a
  # conditional's branch writes): once per change of γ, not per iteration.
  assert cache_sized_ops(hlo, elems)
  assert cache_sized_ops(hlo, elems, skip_dispatch=True) == []

  # Decoding from a shared prefill (specjax.prefill): the donated Prefill's cache too.
  pre = run_prefill(target, tp, sampling, prompts, lengths, keys,
                    target.init_cache(BATCH, SLOTS, PROMPT))
  hlo = autoregressive_loop.lower(ar, tp, prompts, lengths, keys, None, pre).compile().as_text()
  assert cache_sized_ops(hlo, elems) == []
  hlo = speculative_loop.lower(sp, tp, dp, prompts, lengths, keys, None,
                               draft.init_cache(BATCH, SLOTS, PROMPT), pre).compile().as_text()
  assert cache_sized_ops(hlo, elems) == []


def test_the_check_sees_a_copied_buffer():
  """Negative control: a loop that reads a buffer and writes it without the
  write depending on the read is compiled with copies of the buffer."""
  elems = BATCH * 4 * SLOTS * 8

  def body(i, carry):
    buf_BKSD, acc = carry
    q = jnp.full((BATCH, 4, 1, 8), i, jnp.float32)
    scores = jnp.einsum("bktd,bksd->bkts", q, buf_BKSD)
    buf_BKSD = buf_BKSD.at[:, :, i].set(q[:, :, 0] * 2)   # independent of the read
    return buf_BKSD, acc + scores.sum()

  run = jax.jit(lambda b: jax.lax.fori_loop(0, 5, body, (b, 0.0)), donate_argnums=0)
  hlo = run.lower(jnp.zeros((BATCH, 4, SLOTS, 8))).compile().as_text()
  assert cache_sized_ops(hlo, elems), "the check should flag the copies of this loop"


def test_fresh_caches_are_distinct_zero_buffers():
  """Caches come from one jitted call (`layers.zero_arrays`): every buffer must
  be its own zero array of the documented shape (buffers shared between
  fields or layers would break donation and in-place writes), also inside a
  trace."""
  from specjax.models.layers import zero_arrays
  lm = DecoderLM(decoder_config("tiny"))
  t5 = T5(t5_config("t5-tiny", vocab_size=64))
  for cache, fields in ((lm.init_cache(2, 9), ("k", "v")),
                        (t5.init_cache(2, 9, 5), ("k", "v", "cross_k", "cross_v"))):
    leaves = jax.tree_util.tree_leaves(cache)
    assert len({id(x) for x in leaves}) == len(leaves)
    assert len({x.unsafe_buffer_pointer() for x in leaves}) == len(leaves)
    for x in leaves:
      assert not np.asarray(x).any()
    assert cache.lengths.dtype == jnp.int32 and cache.lengths.shape == (2,)
    for name in fields:
      assert len(getattr(cache, name)) == 2  # one buffer per layer
  c = lm.init_cache(2, 9)
  kv = lm.config.num_kv_heads, lm.config.head_dim
  assert c.k[0].shape == (2, kv[0], kv[1], 9) and c.v[0].shape == (2, kv[0], 9, kv[1])
  traced = jax.jit(lambda: zero_arrays(((3, 4), jnp.float32), ((3,), jnp.int32)))()
  assert [x.shape for x in traced] == [(3, 4), (3,)] and traced[1].dtype == jnp.int32
