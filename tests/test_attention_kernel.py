"""The fused cache-attention kernel (`specjax.models.attention_kernel`): its
partial softmax against a direct computation, a decoder using it against the
XLA path (through Pallas's interpreter on CPU), and misuse."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.models.attention_kernel import cached_attention
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.sampling import GREEDY
from tiny import EOS, ragged_prompts


def test_the_kernel_is_the_softmax_over_each_rows_slots():
  """Rows of 0 slots, part of a block, exactly one block, past a block and every
  slot: max, sum and the unnormalised output over slots < length."""
  rng = np.random.default_rng(0)
  b, kv, q, d, s = 6, 2, 10, 16, 384          # 3 blocks of 128 slots
  q_ = jnp.asarray(rng.normal(size=(b, kv, q, d)), jnp.float32)
  k_ = jnp.asarray(rng.normal(size=(b, kv, d, s)), jnp.float32)
  v_ = jnp.asarray(rng.normal(size=(b, kv, s, d)), jnp.float32)
  lengths = np.array([0, 1, 127, 128, 129, 384])
  acc, m, l = (np.asarray(x, np.float64)
               for x in cached_attention(q_, k_, v_, jnp.asarray(lengths), 0.3, interpret=True))
  x = np.einsum("bkqd,bkds->bkqs", np.asarray(q_, np.float64), np.asarray(k_, np.float64)) * 0.3
  for r, n in enumerate(lengths):
    if n == 0:
      assert (m[r] == np.finfo(np.float32).min).all() and (l[r] == 0).all()
      assert (acc[r] == 0).all()
      continue
    top = x[r, :, :, :n].max(-1)
    e = np.exp(x[r, :, :, :n] - top[..., None])
    np.testing.assert_allclose(m[r], top, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(l[r], e.sum(-1), rtol=1e-5)
    np.testing.assert_allclose(acc[r], np.einsum("kqs,ksd->kqd", e, np.asarray(v_[r])[:, :n]),
                               rtol=1e-5, atol=1e-5)


def test_a_decoder_on_the_kernel_decodes_as_on_xla():
  """Prefill, a 4-token verify-shaped call and greedy decoding (plain and
  speculative) give the XLA path's logits and tokens (heads of 128: the
  kernel's width)."""
  models = {k: DecoderLM(decoder_config("tiny", head_dim=128, attention_kernel=k))
            for k in ("xla", "pallas_interpret")}
  params = models["xla"].init(jax.random.PRNGKey(0))
  prompts, lengths = ragged_prompts(batch=3)
  ext = jnp.asarray(np.random.default_rng(1).integers(0, 64, (3, 4)), jnp.int32)
  logits = {}
  for name, lm in models.items():
    cache = lm.init_cache(3, 128)
    cache = lm.prefill(params, prompts, lengths, cache)[-1]
    logits[name], _ = lm.extend(params, ext, cache)
    calls = str(jax.make_jaxpr(lambda p, c, lm=lm: lm.extend(p, ext, c))(params, cache))
    assert ("pallas_call" in calls) == (name == "pallas_interpret")
  np.testing.assert_allclose(np.asarray(logits["pallas_interpret"]), np.asarray(logits["xla"]),
                             rtol=1e-5, atol=1e-5)
  outs = {name: specjax.generate(lm, params, prompts, lengths, max_new_tokens=12,
                                 sampling=GREEDY, eos_id=EOS)
          for name, lm in models.items()}
  np.testing.assert_array_equal(outs["pallas_interpret"].tokens, outs["xla"].tokens)
  lm = models["pallas_interpret"]
  spec = specjax.speculative_generate(lm, params, lm, params, prompts, lengths,
                                      max_new_tokens=12, gamma=3, sampling=GREEDY, eos_id=EOS)
  np.testing.assert_array_equal(spec.tokens, outs["xla"].tokens)


def test_narrow_heads_stay_on_xla():
  """Heads narrower than the TPU's 128 lanes keep XLA's attention (the kernel
  would need the cache copied into its layout)."""
  lm = DecoderLM(decoder_config("tiny", attention_kernel="pallas_interpret"))   # head_dim 8
  params = lm.init(jax.random.PRNGKey(0))
  cache = lm.init_cache(2, 128)
  calls = str(jax.make_jaxpr(lambda p, c: lm.extend(p, jnp.zeros((2, 3), jnp.int32), c))(
      params, cache))
  assert "pallas_call" not in calls


def test_misuse_is_named():
  with pytest.raises(ValueError, match="attention_kernel must be one of"):
    decoder_config("tiny", attention_kernel="cuda")
  z = jnp.zeros((1, 1, 4, 8))
  with pytest.raises(ValueError, match="multiple of 128 cache slots, got 100"):
    cached_attention(z, jnp.zeros((1, 1, 8, 100)), jnp.zeros((1, 1, 100, 8)),
                     jnp.zeros((1,), jnp.int32), 1.0, interpret=True)
