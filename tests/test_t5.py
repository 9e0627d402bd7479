"""T5 in specjax alone: config, protocol, incremental-vs-full parity, exact
speculative decoding (greedy tokens and sampled distributions), orbax IO.

Parity against transformers lives in test_t5_hf.py.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import SamplingConfig
from specjax.checkpoints import restore_params, save_params
from specjax.models.t5 import T5, T5_CONFIGS, T5Cache, T5Config, t5_config
from specjax.sampling import sample_tokens
from specjax.verify import rejection_verify

from exact_helpers import optimized_codegen
from reference import chi_square_pvalue, processed_probs
from t5_helpers import (B, P, ROW_LENGTHS, S, SPEC_N, T, extend_with_hidden, prefill,
                        ragged_inputs, random_params, spec_setup, tiny_config)

GREEDY = SamplingConfig(temperature=0.0)


# --- config -----------------------------------------------------------------

PUBLISHED = {  # name: (d_model, d_kv, num_heads, d_ff, layers, feed_forward, tied)
    "t5-small": (512, 64, 8, 2048, 6, "relu", True),
    "t5-base": (768, 64, 12, 3072, 12, "relu", True),
    "t5-large": (1024, 64, 16, 4096, 24, "relu", True),
    "t5-3b": (1024, 128, 32, 16384, 24, "relu", True),
    "t5-11b": (1024, 128, 128, 65536, 24, "relu", True),
    "t5-v1_1-small": (512, 64, 6, 1024, 8, "gated-gelu", False),
    "t5-v1_1-base": (768, 64, 12, 2048, 12, "gated-gelu", False),
    "t5-v1_1-large": (1024, 64, 16, 2816, 24, "gated-gelu", False),
    "t5-v1_1-xl": (2048, 64, 32, 5120, 24, "gated-gelu", False),
    "t5-v1_1-xxl": (4096, 64, 64, 10240, 24, "gated-gelu", False),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_shapes(name):
  c = T5_CONFIGS[name]
  assert c == t5_config(name)
  d, kv, h, ff, layers, act, tied = PUBLISHED[name]
  assert (c.d_model, c.d_kv, c.num_heads, c.d_ff, c.num_layers, c.num_decoder_layers) == (
      d, kv, h, ff, layers, layers)
  assert (c.feed_forward, c.tie_word_embeddings, c.vocab_size) == (act, tied, 32128)
  assert (c.relative_attention_num_buckets, c.relative_attention_max_distance) == (32, 128)
  assert (c.pad_id, c.eos_id, c.decoder_start_id) == (0, 1, 0)


def test_param_counts():
  # Published totals (transformers' num_parameters): 60.5M and 77.0M.
  assert t5_config("t5-small").num_params() == 60_506_624
  assert t5_config("t5-v1_1-small").num_params() == 76_961_152
  for cfg in (t5_config("t5-tiny"), t5_config("t5-v1_1-tiny"), tiny_config("1.0"),
              tiny_config("1.1")):
    shapes = jax.eval_shape(T5(cfg).init, jax.random.PRNGKey(0))
    assert sum(x.size for x in jax.tree.leaves(shapes)) == cfg.num_params()


def test_init_is_random_and_deterministic():
  model = T5(_chi_config(2))  # Compiled once for this test and the chi-square tests.
  a, b = model.init(jax.random.PRNGKey(0)), model.init(jax.random.PRNGKey(0))
  jax.tree.map(np.testing.assert_array_equal, a, b)
  c = model.init(jax.random.PRNGKey(1))
  assert not np.array_equal(a["shared"]["embedding"], c["shared"]["embedding"])
  np.testing.assert_array_equal(a["encoder"]["final_norm"]["scale"], 1.0)


@pytest.mark.parametrize("field, value", [
    ("vocab_size", 0), ("d_model", -1), ("d_kv", 0), ("num_heads", 0), ("d_ff", 0),
    ("num_layers", 0), ("num_decoder_layers", 0), ("relative_attention_num_buckets", 2),
    ("relative_attention_num_buckets", 7), ("relative_attention_max_distance", 4),
    ("feed_forward", "gated-silu"), ("layer_norm_epsilon", 0.0), ("pad_id", 200),
    ("eos_id", -1), ("decoder_start_id", 128), ("dtype", "float64"), ("param_dtype", "int8"),
])
def test_config_validation_names_field(field, value):
  with pytest.raises(ValueError, match=field):
    t5_config("t5-tiny", **{field: value})


@pytest.mark.parametrize("field, value", [("d_model", 32.0), ("num_heads", True),
                                          ("tie_word_embeddings", 1)])
def test_config_type_errors_name_field(field, value):
  with pytest.raises(TypeError, match=field):
    t5_config("t5-tiny", **{field: value})


def test_unknown_config_name():
  with pytest.raises(ValueError, match="t5-huge"):
    t5_config("t5-huge")


def test_num_decoder_layers_defaults_to_num_layers():
  c = T5Config(vocab_size=16, d_model=8, d_kv=4, num_heads=2, d_ff=8, num_layers=3)
  assert c.num_decoder_layers == 3
  assert c == T5Config(**dataclasses.asdict(c))
  hash(T5(c))


# --- protocol and parity inside specjax ---------------------------------------

@pytest.fixture(scope="module", params=["1.0", "1.1"])
def tiny_model(request):
  model = T5(tiny_config(request.param))
  return model, random_params(model, 3)


def test_init_matches_protocol_shapes(tiny_model):
  model, params = tiny_model
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  assert jax.tree.structure(shapes) == jax.tree.structure(params)
  assert "lm_head" in params if not model.config.tie_word_embeddings else "lm_head" not in params


def test_prefill_follows_protocol(tiny_model):
  model, params = tiny_model
  c = model.config
  assert model.prefill_positions(17) == 1
  assert isinstance(model, specjax.protocol.LanguageModel)
  inputs, lengths = ragged_inputs(np.random.default_rng(0), ROW_LENGTHS, P, c.vocab_size)
  cache = model.init_cache(B, S, P)
  assert isinstance(cache, T5Cache) and cache.max_len == S and cache.encoder_len == P
  L, H, D = c.num_decoder_layers, c.num_heads, c.d_kv
  assert len(cache.k) == len(cache.v) == len(cache.cross_k) == len(cache.cross_v) == L
  assert cache.k[0].shape == (B, H, D, S) and cache.v[0].shape == (B, H, S, D)
  assert cache.cross_k[0].shape == (B, H, D, P) and cache.cross_v[0].shape == (B, H, P, D)
  logits, last, cache = prefill(model, params, jnp.asarray(inputs), jnp.asarray(lengths), cache)
  assert logits.shape == (B, c.vocab_size) and logits.dtype == jnp.float32
  np.testing.assert_array_equal(last, [c.decoder_start_id] * B)
  np.testing.assert_array_equal(cache.lengths, [1] * B)
  np.testing.assert_array_equal(cache.encoder_lengths, lengths)
  dec = np.full((B, T), c.decoder_start_id, np.int32)
  full = model.forward(params, inputs, lengths, dec)
  np.testing.assert_allclose(logits, full[:, 0], atol=1e-5)
  # Shorter encoder inputs are padded to the cache's room; longer ones refused.
  fitted = model._fit_inputs(jnp.asarray(inputs[:, :6]), cache)
  assert fitted.shape == (B, P) and (np.asarray(fitted[:, 6:]) == c.pad_id).all()
  with pytest.raises(ValueError, match="encoder"):
    model.prefill(params, jnp.zeros((B, P + 1), jnp.int32), jnp.asarray(lengths), cache)


def test_encoder_padding_is_masked(tiny_model):
  model, params = tiny_model
  rng = np.random.default_rng(1)
  clean, lengths = ragged_inputs(rng, ROW_LENGTHS, P, model.vocab_size)
  dirty = clean.copy()
  pad = np.arange(P)[None] >= lengths[:, None]
  dirty[pad] = rng.integers(2, model.vocab_size, pad.sum())
  dec = rng.integers(2, model.vocab_size, (B, T)).astype(np.int32)
  a = np.asarray(model.forward(params, clean, lengths, dec))
  b = np.asarray(model.forward(params, dirty, lengths, dec))
  np.testing.assert_allclose(a, b, atol=1e-5)
  # Rows do not see each other: permuting the batch permutes the logits.
  perm = np.array([2, 0, 3, 1])
  c = np.asarray(model.forward(params, clean[perm], lengths[perm], dec[perm]))
  np.testing.assert_allclose(c, a[perm], atol=1e-5)


def test_incremental_matches_full_with_ragged_rows(tiny_model):
  """Rows at different decoder lengths, stale garbage past each row's length:
  extend's logits equal the full forward's at each row's absolute positions."""
  model, params = tiny_model
  v = model.vocab_size
  rng = np.random.default_rng(2)
  inputs, lengths = ragged_inputs(rng, ROW_LENGTHS, P, v)
  dec = rng.integers(2, v, (B, T)).astype(np.int32)
  dec[:, 0] = model.config.decoder_start_id
  full = np.asarray(model.forward(params, inputs, lengths, dec))

  cache = model.init_cache(B, S, P)
  logits, _, cache = prefill(model, params, jnp.asarray(inputs), jnp.asarray(lengths), cache)
  np.testing.assert_allclose(logits, full[:, 0], atol=1e-5)
  # Write 6 tokens per row (two calls): true ones up to each row's eventual
  # rollback point, garbage after it.
  keep = np.array([7, 2, 1, 4])
  first = dec[:, 1:7].copy()
  for b in range(B):
    first[b, keep[b] - 1:] = rng.integers(2, v, 6 - keep[b] + 1)
  for half in (first[:, :3], first[:, 3:]):
    _, _, cache = extend_with_hidden(model, params, jnp.asarray(half), cache)
  np.testing.assert_array_equal(cache.lengths, [7] * B)
  # Roll back per row (lengths only) and continue with the true tokens.
  cache = cache.replace(lengths=jnp.asarray(keep, jnp.int32))
  for step in (3, 1, 3):
    before = np.asarray(cache.lengths)
    chunk = np.stack([dec[b, before[b]:before[b] + step] for b in range(B)])
    logits, h, cache = extend_with_hidden(model, params, jnp.asarray(chunk), cache)
    want = np.stack([full[b, before[b]:before[b] + step] for b in range(B)])
    np.testing.assert_allclose(logits, want, atol=2e-5)
    np.testing.assert_array_equal(cache.lengths, before + step)
    assert h.shape == (B, step, model.config.d_model)


def test_bfloat16_runs_close_to_float32(tiny_model):
  model, params = tiny_model
  inputs, lengths = ragged_inputs(np.random.default_rng(5), ROW_LENGTHS, P, model.vocab_size)
  dec = np.zeros((B, T), np.int32)
  ref = model.forward(params, inputs, lengths, dec)
  bf = T5(model.config.replace(dtype="bfloat16")).forward(params, inputs, lengths, dec)
  assert bf.dtype == jnp.float32
  assert float(jnp.max(jnp.abs(bf - ref))) < 0.1 * float(jnp.max(jnp.abs(ref)))


# --- exact speculative decoding ---------------------------------------------------

def test_speculative_greedy_equals_autoregressive():
  """Ragged prompts, rows ending at different steps by EOS or by the length
  limit: speculative greedy == autoregressive greedy (the free greedy run cut
  after the first EOS) for every gamma."""
  st = spec_setup()
  n = SPEC_N
  assert st.by_eos.any() and (~st.by_eos).any(), st.greedy_lengths
  assert len(set(st.greedy_lengths[st.by_eos])) > 1  # EOS at different steps.
  rates = []
  for gamma in (1, 4):
    spec = specjax.speculative_generate(st.target, st.tp, st.draft, st.dp, st.inputs,
                                        st.lengths, max_new_tokens=n, gamma=gamma,
                                        sampling=GREEDY, eos_id=st.eos)
    np.testing.assert_array_equal(spec.lengths, st.greedy_lengths, err_msg=f"gamma={gamma}")
    np.testing.assert_array_equal(spec.tokens, st.greedy_tokens, err_msg=f"gamma={gamma}")
    rates.append(spec.acceptance_rate)
  # Both accepted and rejected drafts happened (else the test proves little).
  assert all(0.05 < r < 0.95 for r in rates), rates


# --- chi-square exactness on a vocabulary of 8, first 4 tokens ---------------------

CHI_V = 8
CHI_N = 50_000
CHI_STEPS = 4  # With gamma = 2 the 4th token can be the bonus token.


def _chi_config(layers):
  return T5Config(vocab_size=CHI_V, d_model=16, d_kv=8, num_heads=2, d_ff=32, num_layers=1,
                  num_decoder_layers=layers, relative_attention_num_buckets=4,
                  relative_attention_max_distance=8, feed_forward="gated-gelu",
                  tie_word_embeddings=False)


def _chi_model(seed, layers):
  model = T5(_chi_config(layers))
  params = model.init(jax.random.PRNGKey(seed))
  # A peakier head than the default init: distributions far from uniform.
  params = dict(params, lm_head={"kernel": params["lm_head"]["kernel"] * 2.5})
  return model, params


@pytest.fixture(scope="module")
def chi_pair():
  target, tp = _chi_model(20, 2)
  draft, dp = _chi_model(21, 1)
  prompt = np.array([[3, 5, 2, 7, 0]], np.int32)
  return target, tp, draft, dp, prompt, np.array([4], np.int32)


def _exact_joint(model, params, prompt, lengths, sampling_kw, steps=CHI_STEPS):
  """The target's exact distribution of its first `steps` tokens, by running
  it on every decoder prefix."""
  v = CHI_V
  prefixes = np.array(np.meshgrid(*[np.arange(v)] * (steps - 1), indexing="ij")).reshape(
      steps - 1, -1).T
  dec = np.concatenate([np.zeros((len(prefixes), 1), np.int32), prefixes], 1).astype(np.int32)
  k = len(dec)
  logits = np.asarray(model.forward(params, np.repeat(prompt, k, 0), np.repeat(lengths, k),
                                    dec))
  probs = processed_probs(logits, **sampling_kw)  # [V^(steps-1), steps, V]
  joint = np.ones([v] * steps)
  for i in range(steps):
    # P(t_{i+1} | t_1..t_i) depends on the first i prefix tokens only.
    p_i = probs[:, i].reshape([v] * (steps - 1) + [v])
    index = tuple([slice(None)] * i + [0] * (steps - 1 - i))
    shape = [v] * (i + 1) + [1] * (steps - 1 - i)
    joint = joint * p_i[index].reshape(shape)
  return joint


def _sample_joint(target, tp, draft, dp, prompt, lengths, sampling, seed, verify_fn=None):
  kw = {} if verify_fn is None else {"verify_fn": verify_fn}
  with optimized_codegen():
    out = specjax.speculative_generate(
        target, tp, draft, dp, np.repeat(prompt, CHI_N, 0), np.repeat(lengths, CHI_N),
        max_new_tokens=CHI_STEPS, gamma=2, sampling=sampling, key=jax.random.key(seed), **kw)
  tokens = np.asarray(out.tokens)
  assert (np.asarray(out.lengths) == CHI_STEPS).all()
  cells = np.ravel_multi_index(tuple(tokens.T), (CHI_V,) * CHI_STEPS)
  return np.bincount(cells, minlength=CHI_V ** CHI_STEPS), out


def _q_residual_verify(keys_B, drafts_BG, p_BGV, q_BG1V):
  """Broken on purpose: after a rejection, samples from q instead of
  norm(max(0, q - p))."""
  n_B, next_B = rejection_verify(keys_B, drafts_BG, p_BGV, q_BG1V)
  q_BV = jnp.take_along_axis(q_BG1V, n_B[:, None, None], axis=1)[:, 0]
  wrong_B = sample_tokens(jax.vmap(lambda k: jax.random.fold_in(k, 99))(keys_B), q_BV)
  return n_B, jnp.where(n_B < drafts_BG.shape[1], wrong_B, next_B)


@pytest.mark.parametrize("sampling_kw", [dict(temperature=1.0),
                                         dict(temperature=0.7, top_p=0.9)])
def test_speculative_sampling_matches_target_distribution(chi_pair, sampling_kw):
  target, tp, draft, dp, prompt, lengths = chi_pair
  joint = _exact_joint(target, tp, prompt, lengths, sampling_kw)
  draft_joint = _exact_joint(draft, dp, prompt, lengths, sampling_kw)
  assert 0.5 * np.abs(joint - draft_joint).sum() > 0.3  # The draft differs clearly.
  counts, out = _sample_joint(target, tp, draft, dp, prompt, lengths,
                              SamplingConfig(**sampling_kw), seed=7)
  assert 0.05 < out.acceptance_rate < 0.95
  p = chi_square_pvalue(counts, joint)
  print(f"\nchi-square p = {p:.3g} ({sampling_kw}, acceptance {out.acceptance_rate:.2f})")
  assert p > 1e-3, p


def test_chi_square_catches_wrong_residual(chi_pair):
  target, tp, draft, dp, prompt, lengths = chi_pair
  joint = _exact_joint(target, tp, prompt, lengths, dict(temperature=1.0))
  counts, _ = _sample_joint(target, tp, draft, dp, prompt, lengths,
                            SamplingConfig(temperature=1.0), seed=8,
                            verify_fn=_q_residual_verify)
  p = chi_square_pvalue(counts, joint)
  print(f"\nchi-square p = {p:.3g} with the q-residual sampler")
  assert p < 1e-6


# --- orbax ----------------------------------------------------------------------

def test_orbax_round_trip_and_config_check(tmp_path):
  cfg = tiny_config("1.1")
  params = random_params(T5(cfg), 5)
  save_params(tmp_path / "t5", params, cfg)
  restored, got = restore_params(tmp_path / "t5", cfg)
  assert got == cfg
  jax.tree.map(np.testing.assert_array_equal, params, restored)
  with pytest.raises(ValueError, match="d_ff"):
    restore_params(tmp_path / "t5", cfg.replace(d_ff=cfg.d_ff + 1))
  with pytest.raises(ValueError, match="tie_word_embeddings"):
    restore_params(tmp_path / "t5", cfg.replace(tie_word_embeddings=True))


def test_t5_from_section_decoder_depth():
  """A config section's optional num_decoder_layers gives the decoder its own depth (absent
  or 0: as deep as the encoder), and the model's parameters follow it."""
  import ml_collections
  from specjax.models.sections import t5_from_section
  shape = dict(d_model=16, d_kv=4, num_heads=2, d_ff=32, num_layers=1)
  same = t5_from_section(ml_collections.ConfigDict(shape), 64)
  zero = t5_from_section(ml_collections.ConfigDict(dict(shape, num_decoder_layers=0)), 64)
  deep = t5_from_section(ml_collections.ConfigDict(dict(shape, num_decoder_layers=3)), 64)
  assert (same.config.num_layers, same.config.num_decoder_layers) == (1, 1)
  assert zero.config.num_decoder_layers == 1
  assert (deep.config.num_layers, deep.config.num_decoder_layers) == (1, 3)
  params = deep.init(jax.random.key(0))
  decoder_layers = [k for k in params["decoder"] if k.startswith("layers_")]
  encoder_layers = [k for k in params["encoder"] if k.startswith("layers_")]
  assert (len(encoder_layers), len(decoder_layers)) == (1, 3)
