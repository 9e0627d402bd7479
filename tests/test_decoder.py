"""The decoder-only LM on its own: incremental decoding vs a full forward,
per-row rollback, config validation, parameter counts, orbax round trip."""

import dataclasses
import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.checkpoints import restore_params, save_params
from specjax.models.decoder import DECODER_CONFIGS, DecoderConfig, DecoderLM, decoder_config

TOL = 1e-5

# Tiny fp32 configs covering multi-head + tied embeddings, and grouped-query
# (2 query heads per kv head, head_dim != d_model / num_heads) + untied. Two
# configs, not three: XLA compiles dominate this file's runtime on CPU.
CONFIGS = {
    "mha-tied": decoder_config("tiny", num_kv_heads=4, tie_embeddings=True, rope_theta=500.0),
    "gqa": decoder_config("tiny", num_kv_heads=2, head_dim=16, norm_eps=1e-5),
}


# Jitted entry points (the model is a hashable static argument): one compile
# per (config, shape) instead of eager op-by-op dispatch.
_forward = jax.jit(lambda lm, params, toks: lm.forward(params, toks), static_argnums=0)
_prefill = jax.jit(lambda lm, params, prompts, lengths, cache: lm.prefill(params, prompts, lengths,
                                                                          cache), static_argnums=0)
_extend = jax.jit(lambda lm, params, toks, cache: lm.extend(params, toks, cache), static_argnums=0)


@functools.lru_cache(maxsize=None)
def _model(name):
  """The model and random params drawn with numpy (shapes from an abstract
  `init`: compiling the real initialisers costs seconds on CPU)."""
  lm = DecoderLM(CONFIGS[name])
  shapes = jax.eval_shape(lm.init, jax.random.PRNGKey(0))
  rng = np.random.default_rng(sorted(CONFIGS).index(name))

  def draw(path, s):
    leaf = path[-1].key
    if leaf == "scale":  # norm scales around 1
      x = 1.0 + 0.2 * rng.standard_normal(s.shape)
    elif leaf == "embedding":  # logits of order 1-10 with tied embeddings
      x = 0.5 * rng.standard_normal(s.shape)
    else:  # kernels: fan-in scaled
      fan_in = int(np.prod(s.shape[:-1])) if path[-2].key == "o" else s.shape[0]
      x = rng.standard_normal(s.shape) / np.sqrt(fan_in)
    return jnp.asarray(x, s.dtype)

  return lm, jax.tree_util.tree_map_with_path(draw, shapes)


SLOTS = 16  # cache slots, also the padded length of the full forward (one compile)
PROMPT_LEN = 7


def _full_logits(lm, params, seqs):
  """One causal forward over right-padded true sequences; `[B, SLOTS, V]`
  (padding sits after each row's tokens, so it cannot affect them)."""
  n = SLOTS
  toks = np.zeros((len(seqs), n), np.int32)
  for b, s in enumerate(seqs):
    toks[b, : len(s)] = s
  return np.asarray(_forward(lm, params, jnp.asarray(toks)))


def _prompts(rng, lengths, vocab):
  p = PROMPT_LEN
  prompts = rng.integers(1, vocab, size=(len(lengths), p)).astype(np.int32)
  for b, n in enumerate(lengths):
    prompts[b, n:] = 0  # right padding, later overwritten in the cache
  return prompts


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_prefill_and_extend_match_full_forward(name):
  lm, params = _model(name)
  rng = np.random.default_rng(0)
  lengths = [5, 2, 7]
  prompts = _prompts(rng, lengths, lm.vocab_size)
  cache = lm.init_cache(3, SLOTS, PROMPT_LEN)
  logits_BV, last_B, cache = _prefill(lm, params, jnp.asarray(prompts),
                                        jnp.asarray(lengths, jnp.int32), cache)
  np.testing.assert_array_equal(np.asarray(cache.lengths), lengths)
  np.testing.assert_array_equal(np.asarray(last_B), [prompts[b, n - 1] for b, n in enumerate(lengths)])

  seqs = [list(prompts[b, :n]) for b, n in enumerate(lengths)]
  got = [(np.asarray(logits_BV), list(lengths))]  # (logits, row positions of its first column)
  for t in (1, 3, 1, 3):
    new = rng.integers(1, lm.vocab_size, size=(3, t)).astype(np.int32)
    start = [len(s) for s in seqs]
    logits_BTV, cache = _extend(lm, params, jnp.asarray(new), cache)
    assert logits_BTV.shape == (3, t, lm.vocab_size)
    got.append((np.asarray(logits_BTV), start))
    for b in range(3):
      seqs[b].extend(new[b])
    np.testing.assert_array_equal(np.asarray(cache.lengths), [len(s) for s in seqs])

  full = _full_logits(lm, params, seqs)
  # Prefill logits: the next-token logits at each row's last prompt position.
  np.testing.assert_allclose(got[0][0], full[np.arange(3), np.array(lengths) - 1], atol=TOL, rtol=0)
  worst = 0.0
  for logits_BTV, start in got[1:]:
    for b in range(3):
      ref = full[b, start[b]: start[b] + logits_BTV.shape[1]]
      worst = max(worst, float(np.abs(logits_BTV[b] - ref).max()))
  assert worst <= TOL, f"{name}: incremental vs full max abs diff {worst}"


def test_calls_of_several_positions_materialise_the_residual_stream_per_block():
  """`layers.block_boundary`: one optimization barrier after each block of a
  call of T > 1 positions (a prefill, a verification call), none in a decode
  step — without them XLA's TPU compiler kept every block's all-reduced output
  live to the end of a prefill (results/tpu_aot/README.md)."""
  lm, params = _model(sorted(CONFIGS)[0])
  layers = lm.config.num_layers
  cache = lm.init_cache(2, SLOTS, PROMPT_LEN)

  def barriers(t):
    tokens = jnp.ones((2, t), jnp.int32)
    text = jax.jit(lm.extend).lower(params, tokens, cache).as_text()
    return text.count("optimization_barrier")
  assert barriers(4) == layers
  assert barriers(1) == 0
  text = jax.jit(lm.prefill).lower(params, jnp.ones((2, PROMPT_LEN), jnp.int32),
                                   jnp.array([3, 5]), cache).as_text()
  assert text.count("optimization_barrier") == layers


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_per_row_rollback(name):
  lm, params = _model(name)
  rng = np.random.default_rng(1)
  lengths = [4, 6, 3]
  prompts = _prompts(rng, lengths, lm.vocab_size)
  cache = lm.init_cache(3, SLOTS, PROMPT_LEN)
  _, _, cache = _prefill(lm, params, jnp.asarray(prompts), jnp.asarray(lengths, jnp.int32), cache)
  seqs = [list(prompts[b, :n]) for b, n in enumerate(lengths)]

  drafted = rng.integers(1, lm.vocab_size, size=(3, 3)).astype(np.int32)
  _, cache = _extend(lm, params, jnp.asarray(drafted), cache)
  keep = [1, 3, 0]  # row 0 keeps 1 of 3, row 1 all 3, row 2 none: stale slots stay behind
  for b in range(3):
    seqs[b].extend(drafted[b, : keep[b]])
  cache = cache.replace(lengths=jnp.asarray([len(s) for s in seqs], jnp.int32))

  start = [len(s) for s in seqs]
  new = rng.integers(1, lm.vocab_size, size=(3, 3)).astype(np.int32)
  logits_BTV, cache = _extend(lm, params, jnp.asarray(new), cache)
  for b in range(3):
    seqs[b].extend(new[b])
  start1 = [len(s) for s in seqs]
  one = rng.integers(1, lm.vocab_size, size=(3, 1)).astype(np.int32)
  logits_B1V, cache = _extend(lm, params, jnp.asarray(one), cache)
  for b in range(3):
    seqs[b].extend(one[b])
  np.testing.assert_array_equal(np.asarray(cache.lengths), [len(s) for s in seqs])

  full = _full_logits(lm, params, seqs)
  for b in range(3):
    np.testing.assert_allclose(np.asarray(logits_BTV[b]), full[b, start[b]: start[b] + 3],
                               atol=TOL, rtol=0)
    np.testing.assert_allclose(np.asarray(logits_B1V[b, 0]), full[b, start1[b]], atol=TOL, rtol=0)


# --------------------------------------------------------------------------- configs

_BASE = dict(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
             mlp_dim=64)


@pytest.mark.parametrize("changes, field", [
    (dict(num_kv_heads=3), "num_kv_heads"),
    (dict(head_dim=7), "head_dim"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(d_model=-1), "d_model"),
    (dict(num_layers=0), "num_layers"),
    (dict(num_heads=0), "num_heads"),
    (dict(mlp_dim=0), "mlp_dim"),
    (dict(dtype="int8"), "dtype"),
    (dict(param_dtype="float64"), "param_dtype"),
])
def test_config_validation_names_the_field(changes, field):
  with pytest.raises(ValueError, match=field):
    DecoderConfig(**{**_BASE, **changes})


@pytest.mark.parametrize("changes, field", [
    (dict(d_model=32.0), "d_model"), (dict(num_layers=True), "num_layers"),
    (dict(head_dim="8"), "head_dim"), (dict(matvec_max_rows=1.5), "matvec_max_rows"),
])
def test_config_type_errors_name_the_field(changes, field):
  with pytest.raises(TypeError, match=field):
    DecoderConfig(**{**_BASE, **changes})


def test_named_configs():
  c = decoder_config("chinchilla-70b")
  assert (c.num_layers, c.d_model, c.num_heads, c.head_dim, c.vocab_size) == (80, 8192, 64, 128,
                                                                              32000)
  assert 60e9 < c.num_params() < 75e9
  assert decoder_config("tiny", vocab_size=100).vocab_size == 100
  for name, cfg in DECODER_CONFIGS.items():
    assert decoder_config(name) == cfg
    hash(cfg)
  with pytest.raises(ValueError, match="unknown decoder config 'nope'"):
    decoder_config("nope")
  with pytest.raises(dataclasses.FrozenInstanceError):
    c.num_layers = 1  # frozen: a jit static argument


@pytest.mark.parametrize("cfg", [
    decoder_config("tiny"),
    decoder_config("tiny", num_kv_heads=4, tie_embeddings=True),
    decoder_config("tiny", d_model=24, head_dim=10, num_heads=2, num_kv_heads=1, mlp_dim=40),
    decoder_config("cpu-draft-1m"),
    decoder_config("cpu-target-27m"),
], ids=["tiny", "tiny-tied-mha", "tiny-odd-sizes", "cpu-draft-1m", "cpu-target-27m"])
def test_num_params_counts_init_leaves(cfg):
  lm = DecoderLM(cfg)
  shapes = jax.eval_shape(lm.init, jax.random.PRNGKey(0))  # abstract: no allocation
  assert sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes)) == cfg.num_params()
  assert ("lm_head" in shapes) == (not cfg.tie_embeddings)


# ------------------------------------------------- packed layout, matrix-vector products


def _dot_count(fn, *args) -> int:
  """dot_general equations in fn's jaxpr, nested jaxprs included."""
  def count(jaxpr):
    n = 0
    for eqn in jaxpr.eqns:
      n += eqn.primitive.name == "dot_general"
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        n += count(sub)
    return n
  return count(jax.make_jaxpr(fn)(*args).jaxpr)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_packed_layout_and_matvec_rows_match_the_standard_matmuls(name):
  """Both layouts (standard, packed) × both matmul paths (one matrix-matrix
  product; one matrix-vector product per token) give the same logits and
  caches, step after step, at token counts below and above the matvec
  threshold (B * T = 2, 6, 10 with threshold 8); packing round-trips exactly."""
  standard, params = _model(name)
  packed = standard.pack_params(params)
  back = standard.unpack_params(packed)
  assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(params)
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(back)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert set(packed["layer_0"]) == {"attn_norm", "mlp_norm", "qkv", "o", "gate_up", "down_t"}
  gemm = DecoderLM(standard.config.replace(matvec_max_rows=0))
  rows = DecoderLM(standard.config.replace(matvec_max_rows=8))
  runs = [(gemm, params), (rows, params), (gemm, packed), (rows, packed)]
  rng = np.random.default_rng(3)
  prompts = jnp.asarray(rng.integers(1, standard.vocab_size, size=(2, PROMPT_LEN)), jnp.int32)
  lengths = jnp.asarray([PROMPT_LEN, 4], jnp.int32)
  caches = []
  for lm, p in runs:
    _, _, c = _prefill(lm, p, prompts, lengths, lm.init_cache(2, SLOTS, PROMPT_LEN))
    caches.append(c)
  for t in (1, 3, 5):
    toks = jnp.asarray(rng.integers(1, standard.vocab_size, size=(2, t)), jnp.int32)
    out = []
    for i, (lm, p) in enumerate(runs):
      logits, caches[i] = _extend(lm, p, toks, caches[i])
      out.append(np.asarray(logits))
    for i in range(1, len(runs)):
      np.testing.assert_allclose(out[i], out[0], atol=TOL, rtol=0)
      for a, b in zip(caches[i].k + caches[i].v, caches[0].k + caches[0].v):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=TOL, rtol=0)

  # The paths are taken: per layer, packed has 4 kernels (standard 7), and
  # the matvec path one product per token (N = 2 * T) up to the threshold.
  cache = caches[0]
  layers, head = standard.config.num_layers, 1
  dots = lambda lm, p, t: _dot_count(lambda x: lm.extend(p, x, cache), jnp.ones((2, t), jnp.int32))
  attention = dots(gemm, params, 1) - 7 * layers - head  # the attention's own contractions
  assert attention > 0
  assert dots(gemm, packed, 1) == attention + 4 * layers + head
  assert dots(rows, packed, 3) == dots(gemm, packed, 3) + 5 * (4 * layers + head)
  assert dots(rows, params, 3) == dots(gemm, params, 3) + 5 * (7 * layers + head)
  assert dots(rows, packed, 5) == dots(gemm, packed, 5)  # N = 10 > 8: one product


def test_packing_host_arrays_stays_on_the_host():
  """numpy leaves pack with numpy (a restored checkpoint is packed before it
  is placed on a device): the same values as packing the device arrays."""
  lm, params = _model("gqa")
  host = lm.pack_params(jax.tree_util.tree_map(np.asarray, params))
  device = lm.pack_params(params)
  assert jax.tree_util.tree_structure(host) == jax.tree_util.tree_structure(device)
  for a, b in zip(jax.tree_util.tree_leaves(host), jax.tree_util.tree_leaves(device)):
    assert isinstance(a, np.ndarray) and a.flags.c_contiguous
    np.testing.assert_array_equal(a, np.asarray(b))
  back = lm.unpack_params(host)
  for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(params)):
    assert isinstance(a, np.ndarray)
    np.testing.assert_array_equal(a, np.asarray(b))


def test_packing_errors_are_clear():
  lm, params = _model("gqa")
  packed = lm.pack_params(params)
  with pytest.raises(ValueError, match="already in the packed"):
    lm.pack_params(packed)
  with pytest.raises(ValueError, match="not in the packed"):
    lm.unpack_params(params)
  with pytest.raises(ValueError, match="layer_1"):
    lm.pack_params({"layer_0": params["layer_0"]})
  with pytest.raises(TypeError, match="params must be a mapping"):
    lm.pack_params([1, 2])
  with pytest.raises(ValueError, match="matvec_max_rows must be an int >= 0"):
    lm.config.replace(matvec_max_rows=-1)
  with pytest.raises(TypeError, match="matvec_max_rows must be an int"):
    lm.config.replace(matvec_max_rows="8")
  from specjax.models.layers import contract
  with pytest.raises(ValueError, match="trailing axes"):
    contract(jnp.ones((2, 5)), jnp.ones((4, 3)), (0,))


# --------------------------------------------------------------------------- orbax


def test_orbax_round_trip_and_config_mismatch(tmp_path):
  lm, params = _model("gqa")
  save_params(str(tmp_path / "ckpt"), params, lm.config)
  restored, config = restore_params(str(tmp_path / "ckpt"), lm.config)
  assert config == lm.config
  assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(params)
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(restored)):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  _, config = restore_params(str(tmp_path / "ckpt"))  # no expectation: the stored config
  assert config == lm.config
  with pytest.raises(ValueError, match="num_layers"):
    restore_params(str(tmp_path / "ckpt"), lm.config.replace(num_layers=3))
  with pytest.raises(ValueError, match="tie_embeddings"):
    restore_params(str(tmp_path / "ckpt"), lm.config.replace(tie_embeddings=True))
  with pytest.raises(FileNotFoundError):
    restore_params(str(tmp_path / "nothing-here"))
  # A compute-only field is not part of the weights: it follows the caller.
  rows = lm.config.replace(matvec_max_rows=0)
  _, config = restore_params(str(tmp_path / "ckpt"), rows)
  assert config == rows
  # Packed params are saved in the standard layout.
  save_params(str(tmp_path / "packed"), lm.pack_params(params), lm.config)
  restored, _ = restore_params(str(tmp_path / "packed"), lm.config)
  assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(params)
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(restored)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_config_of_an_earlier_version_loads(tmp_path):
  """A stored config holding a removed compute-only field (fused_projections,
  replaced by the packed layout) loads; an unknown field is still an error."""
  from specjax.checkpoints.orbax_io import config_from_dict, config_to_dict
  lm, _ = _model("gqa")
  d = config_to_dict(lm.config)
  d["fields"]["fused_projections"] = True
  assert config_from_dict(d) == lm.config
  d["fields"]["no_such_field"] = 1
  with pytest.raises(ValueError, match="no_such_field"):
    config_from_dict(d)
