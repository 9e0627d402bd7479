"""bfloat16 weights and activations, for `DecoderLM` and `T5`.

What bf16 must keep: float32 logits, caches in the compute dtype, weights in
the parameter dtype, logits close to the float32 model's on the same
weights, and greedy speculative decoding equal to greedy autoregressive
decoding token for token.

Tolerances are relative to the largest |logit| of the float32 reference
(about 4-6 for these random models); the values measured on CPU are noted
next to each. bf16 rounds every activation to 8 significant bits (relative
error 2^-9), so a 2-layer model's logits move by about 1% of their scale;
the bounds allow 2-3x that. They catch gross errors (checked by breaking the
code on purpose: keys / values or cross-attention keys / values cached in
float8, T5's relative-position bias truncated), not bf16 rounding put in the
wrong place: on models this small, attention scores, a softmax, layer norms
or rotary angles computed in bf16 move the logits no more than bf16 itself
does (measured). Those are tested on the layers instead, with inputs where
bf16 there does show (`test_attention_scores_and_softmax_are_float32`,
`test_rotary_angles_are_float32`).

Greedy equality: the two decoders reach a token by different computations
(one token per call against γ + 1 per call, keys and values written by
different calls), which in bf16 differ by about 1% of the logits' scale, not
by float32 rounding. Where the target's two best logits lie closer than that,
either may win in either decoder (with 11 other prompt seeds per model, 9
rows of 66 parted so, each where the two tokens' full-forward logits were
0-2 bf16 spacings apart). The tokens must therefore be equal, except that a
row may part from the reference where its token is a near tie of the
reference's: within `2 * INCREMENTAL_RTOL * scale` (twice the asserted bound
on how far a decoding step's logits are from the full forward's) of the best
full-forward logit. With the seeds below no row parts on the CPU, so every
token is compared.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.drafters.eagle import Eagle
from specjax.models import cast_params, layers
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.models.eagle_head import EagleConfig, init_eagle
from specjax.models.t5 import T5, T5Config, t5_config
from specjax.sampling import GREEDY
from specjax.tree import TokenTree

BF16 = jnp.bfloat16
V = 256
B = 3

# bf16 (weights and compute) against float32 on the same weights, full forward:
# max |Δ| / max |logits|. Measured (CPU): decoder MHA 0.0087, decoder GQA
# (tied) 0.0133, T5 v1.0 0.0044, T5 v1.1 0.0082; float32 weights with bf16
# compute: the same (the weights below are bf16-representable).
LOGITS_RTOL = 3e-2
# The same, root mean square of Δ over that of the logits: measured 0.0056-0.0090.
LOGITS_RMS_RTOL = 2e-2
# Decoding one token per call against the full forward, both bf16: max |Δ| /
# max |logits|, measured 0.0135 (decoder); T5 0.008-0.010, chunks of 4 or 5
# tokens the same.
INCREMENTAL_RTOL = 3e-2

_DECODER = dict(vocab_size=V, d_model=64, num_layers=2, num_heads=4, head_dim=16, mlp_dim=128)
_T5 = dict(vocab_size=V, d_model=64, d_kv=16, num_heads=4, d_ff=128, num_layers=2,
           relative_attention_num_buckets=8, relative_attention_max_distance=16)


def _config(kind: str, dtype: str = "float32", param_dtype: str = "float32"):
  """The test models: a decoder with multi-head attention and an untied head,
  one with grouped-query attention (2 query heads per kv head) and tied
  embeddings, and T5 v1.0 (relu, tied, scaled) and v1.1 (gated-gelu, lm_head)."""
  kw = dict(dtype=dtype, param_dtype=param_dtype)
  if kind == "decoder-mha":
    return decoder_config("tiny", **_DECODER, num_kv_heads=4, **kw)
  if kind == "decoder-gqa":
    return decoder_config("tiny", **_DECODER, num_kv_heads=2, tie_embeddings=True, **kw)
  if kind == "t5-v1.0":
    return t5_config("t5-tiny", **_T5, **kw)
  if kind == "t5-v1.1":
    return t5_config("t5-v1_1-tiny", **_T5, **kw)
  raise ValueError(kind)


def _model(kind: str, dtype: str = "float32", param_dtype: str = "float32"):
  config = _config(kind, dtype, param_dtype)
  return T5(config) if kind.startswith("t5") else DecoderLM(config)


def _init_std(path, shape, config) -> float:
  """The standard deviation the models' own initialisers use for a leaf."""
  name = path[-1]
  if name == "kernel":  # fan-in: all axes but the output ones ([H, D, E] for o)
    fan_in = shape[0] * shape[1] if path[-2] == "o" else shape[0]
    if path[-2] == "q" and isinstance(config, T5Config):  # T5 folds 1/sqrt(D) into q
      fan_in *= config.d_kv
    return fan_in ** -0.5
  if name == "relpos_bias":
    return config.d_model ** -0.5
  if name == "embedding" and getattr(config, "tie_embeddings", False):
    return config.d_model ** -0.5
  return 1.0  # embeddings


@functools.lru_cache(maxsize=None)
def _weights(kind: str):
  """Random float32 weights, distributed as the models' initialisers make
  them (layer-norm scales 1 + noise), drawn with numpy (the models' jitted
  init costs seconds of compilation per config) and rounded to bf16 once, so
  that every dtype combination below computes with the very same weights."""
  model = _model(kind)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)

  def fill(path, leaf):
    path = tuple(k.key for k in path)
    x = rng.standard_normal(leaf.shape).astype(np.float32)
    if path[-1] == "scale":
      return 1.0 + 0.1 * x
    return x * np.float32(_init_std(path, leaf.shape, model.config))

  params = jax.tree_util.tree_map_with_path(fill, shapes)
  return cast_params(cast_params(params, BF16), jnp.float32)


@functools.lru_cache(maxsize=None)
def _reference_logits(kind: str):
  """The float32 model's full-forward logits on `_weights(kind)`."""
  return _forward(kind, _model(kind), _weights(kind))


# Jitted once per model (static, hashable) and shape, shared by the tests:
# every decoder forward below is [B, DEC_LEN] tokens, every T5 one [B, ENC_LEN]
# encoder and [B, SPEC_N] decoder tokens.
SPEC_N = 16  # tokens generated per row; T5's decoder length
ENC_LEN = 10  # T5's encoder inputs
PROMPT_LEN = 8  # the decoder's padded prompts
DEC_LEN = PROMPT_LEN + SPEC_N


@functools.partial(jax.jit, static_argnums=0)
def _decoder_forward(model, params, tokens_BT):
  return model.forward(params, tokens_BT)


@functools.partial(jax.jit, static_argnums=0)
def _extend(model, params, tokens_BT, cache):
  return model.extend(params, tokens_BT, cache)


def _dtypes(tree):
  return {jnp.dtype(x.dtype) for x in jax.tree_util.tree_leaves(tree)}


def _ragged(rng, lengths, width):
  """Right-padded token rows `[B, width]` (ids in [2, V)) and their lengths."""
  lengths = np.asarray(lengths, np.int32)
  tokens = rng.integers(2, V, size=(len(lengths), width)).astype(np.int32)
  tokens[np.arange(width)[None, :] >= lengths[:, None]] = 0
  return jnp.asarray(tokens), jnp.asarray(lengths)


def _inputs(kind: str, seed: int):
  """Fixed random inputs: decoder tokens `[B, DEC_LEN]`; or T5's ragged encoder
  inputs `[B, ENC_LEN]`, their lengths and decoder tokens `[B, SPEC_N]` that
  start with the decoder start token."""
  rng = np.random.default_rng(seed)
  if kind.startswith("t5"):
    inputs, lengths = _ragged(rng, [10, 6, 3], ENC_LEN)
    dec = jnp.asarray(rng.integers(2, V, size=(B, SPEC_N)), jnp.int32).at[:, 0].set(0)
    return inputs, lengths, dec
  return (jnp.asarray(rng.integers(2, V, size=(B, DEC_LEN)), jnp.int32),)


def _forward(kind: str, model, params, seed: int = 1):
  """Full-forward float32 logits `[B, T, V]` of `_inputs(kind, seed)`."""
  if kind.startswith("t5"):
    return model.forward(params, *_inputs(kind, seed))
  return _decoder_forward(model, params, *_inputs(kind, seed))


def _rel_errors(got, want):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  scale = np.abs(want).max()
  return (np.abs(got - want).max() / scale,
          np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)))


# --- logits -----------------------------------------------------------------


@pytest.mark.parametrize("kind, param_dtype", [
    ("decoder-mha", "bfloat16"), ("decoder-gqa", "bfloat16"), ("decoder-gqa", "float32"),
    ("t5-v1.0", "bfloat16"), ("t5-v1.1", "bfloat16"), ("t5-v1.1", "float32")])
def test_bf16_logits_close_to_float32(kind, param_dtype):
  """bf16 compute with bf16 weights (or float32 weights cast per layer):
  float32 logits within LOGITS_RTOL of the float32 model's."""
  weights = _weights(kind)
  want = _reference_logits(kind)
  model = _model(kind, "bfloat16", param_dtype)
  params = cast_params(weights, param_dtype)
  assert _dtypes(params) == {jnp.dtype(param_dtype)}
  got = _forward(kind, model, params)
  assert got.dtype == jnp.float32 and got.shape == want.shape
  assert np.isfinite(np.asarray(got)).all()
  max_err, rms_err = _rel_errors(got, want)
  assert max_err <= LOGITS_RTOL, (kind, max_err)
  assert rms_err <= LOGITS_RMS_RTOL, (kind, rms_err)
  # Not float32 in disguise: the bf16 model does round.
  assert max_err > 1e-4, (kind, max_err)


# --- layers: where bf16 rounding must not happen ------------------------------


def _attention_inputs():
  """Queries / keys / values (bf16-representable) whose scores share an offset
  of 64 (q[..., 0] = 32, k[..., 0] = 8, scale 1/4) on top of O(1) spreads, as
  large common terms of real models do: rounded to bf16 (spacing 0.5 at 64),
  the scores' softmax moves by ~10%; in float32 it does not."""
  rng = np.random.default_rng(3)
  b, t, h, k, d, s = 2, 3, 4, 2, 16, 8
  normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  q, new_k, new_v = normal(b, t, h, d), normal(b, t, k, d), normal(b, t, k, d)
  k_cache, v_cache = normal(b, k, d, s), normal(b, k, s, d)
  q[..., 0], new_k[..., 0], k_cache[:, :, 0, :] = 32.0, 8.0, 8.0
  arrays = [jnp.asarray(x).astype(BF16) for x in (q, new_k, new_v, k_cache, v_cache)]
  return arrays, jnp.asarray([5, 2], jnp.int32), d ** -0.5


def test_attention_scores_and_softmax_are_float32():
  """bf16 queries, keys and values: the attention output is within bf16
  rounding of the float32 computation on the same inputs (measured max
  |Δ| / max |out| 0.0052 cached, 0.0021 prefill, 0.0025 `attend`); scores or
  a softmax in bf16 give 0.06-0.12."""
  arrays, lengths, scale = _attention_inputs()
  mask = jnp.ones((2, 3, 8), bool)

  @jax.jit
  def outputs(q, new_k, new_v, k_cache, v_cache):
    cached = layers.attend_cached(q, new_k, new_v, k_cache, v_cache, lengths, scale=scale)
    empty = layers.attend_cached(q, new_k, new_v, k_cache, v_cache, lengths, scale=scale,
                                 empty=True)
    return {"cached": cached[0], "empty": empty[0],
            "attend": layers.attend(q, k_cache, v_cache, mask, scale=scale),
            "written": cached[1:]}

  got, want = outputs(*arrays), outputs(*(x.astype(jnp.float32) for x in arrays))
  for name in ("cached", "empty", "attend"):
    assert got[name].dtype == BF16, name
    max_err, _ = _rel_errors(got[name].astype(jnp.float32), want[name])
    assert max_err <= 1.5e-2, (name, max_err)
  # The new keys / values go to the bf16 cache as they are (they are bf16).
  for x, y in zip(got["written"], want["written"]):
    assert x.dtype == BF16
    np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y))


def test_rotary_angles_are_float32():
  """At positions in the thousands a bf16 angle is off by radians (spacing 8
  at 2048); the rotation of bf16 inputs must equal the float32 one up to the
  output's rounding (measured max |Δ| / max |x| 0.002)."""
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.standard_normal((2, 3, 4, 16)), BF16)
  positions = jnp.asarray([[0, 1, 7], [1000, 2047, 4093]], jnp.int32)
  got = layers.apply_rope(x, positions, 10000.0)
  want = layers.apply_rope(x.astype(jnp.float32), positions, 10000.0)
  assert got.dtype == BF16
  assert _rel_errors(got.astype(jnp.float32), want)[0] <= 1e-2


# --- decoding -----------------------------------------------------------------


def _bf16(kind: str):
  """The bf16 model (weights and compute) and its weights."""
  return _model(kind, "bfloat16", "bfloat16"), cast_params(_weights(kind), BF16)


def _draft_weights(params, seed: int, noise: float):
  """The target's weights plus noise: drafts that are often, not always, right."""
  rng = np.random.default_rng(seed)

  def perturb(x):
    x32 = np.asarray(x, np.float32)
    return jnp.asarray(x32 + noise * x32.std() * rng.standard_normal(x.shape), x.dtype)

  return jax.tree_util.tree_map(perturb, params)


def test_decoder_incremental_matches_full_forward_in_bf16():
  """From an empty cache, one token per call: every step's logits within
  INCREMENTAL_RTOL of the bf16 full forward's (measured 0.0135)."""
  model, params = _bf16("decoder-gqa")
  (tokens,) = _inputs("decoder-gqa", 5)
  want = _forward("decoder-gqa", model, params, 5)
  cache = model.init_cache(B, DEC_LEN)
  got = []
  for i in range(DEC_LEN):
    logits, cache = _extend(model, params, tokens[:, i:i + 1], cache)
    assert logits.dtype == jnp.float32
    got.append(np.asarray(logits[:, 0]))
  assert cache.k[0].dtype == BF16 and cache.v[-1].dtype == BF16
  max_err, _ = _rel_errors(np.stack(got, axis=1), want)
  assert max_err <= INCREMENTAL_RTOL, max_err


# Prompt seeds (with the drafts' noise seed 7): on the CPU no row parts from
# the autoregressive tokens with these, so every token is compared.
GREEDY_SEEDS = {"decoder-gqa": 8, "t5-v1.1": 16}


@functools.lru_cache(maxsize=None)
def _greedy_runs(kind: str, seed: int):
  """Greedy autoregressive and speculative decoding, bf16 target and draft
  (the target's weights plus noise), ragged prompts: (model, params,
  draft params, prompts, lengths, autoregressive output, speculative output)."""
  model, params = _bf16(kind)
  draft_params = _draft_weights(params, 7, 0.1)
  rng = np.random.default_rng(seed)
  if kind.startswith("t5"):
    prompts, lengths = _ragged(rng, [10, 6, 3], ENC_LEN)
    gamma = 4
  else:
    prompts, lengths = _ragged(rng, [8, 5, 2], PROMPT_LEN)
    gamma = 3
  ref = specjax.generate(model, params, prompts, lengths, max_new_tokens=SPEC_N,
                         sampling=GREEDY)
  spec = specjax.speculative_generate(model, params, model, draft_params, prompts, lengths,
                                      max_new_tokens=SPEC_N, gamma=gamma, sampling=GREEDY)
  return model, params, draft_params, prompts, lengths, ref, spec


def _next_token_logits(kind, model, params, prompts, lengths, tokens_BN):
  """Full-forward logits `[B, N, V]`: [b, i] is the target's prediction of
  token i of row b after its prompt and tokens 0..i-1."""
  tokens_BN = np.asarray(tokens_BN)
  if kind.startswith("t5"):
    dec = np.concatenate([np.zeros((B, 1), np.int32), tokens_BN[:, :-1]], axis=1)
    return np.asarray(model.forward(params, prompts, lengths, dec))
  seq = np.zeros((B, DEC_LEN), np.int32)  # the prompt, then the tokens (causal: padding after)
  for b in range(B):
    n = int(lengths[b])
    seq[b, :n], seq[b, n:n + SPEC_N] = np.asarray(prompts[b, :n]), tokens_BN[b]
  full = np.asarray(_decoder_forward(model, params, jnp.asarray(seq)))
  return np.stack([full[b, int(lengths[b]) - 1:int(lengths[b]) - 1 + SPEC_N] for b in range(B)])


def _assert_greedy_equal(kind, model, params, prompts, lengths, ref_tokens, spec_tokens):
  """Speculative greedy == autoregressive greedy token for token, except that
  a row may part from the reference at a near tie (module docstring): where
  the speculative token is within `near` of the best full-forward logit, as
  the reference's is. Past a parting, each run must go on choosing, on its
  own prefix, tokens within `near` of the best logit (greedy but for ties).

  Returns the number of rows that parted."""
  ref_tokens, spec_tokens = np.asarray(ref_tokens), np.asarray(spec_tokens)
  ref_logits = _next_token_logits(kind, model, params, prompts, lengths, ref_tokens)
  spec_logits = _next_token_logits(kind, model, params, prompts, lengths, spec_tokens)
  near = 2 * INCREMENTAL_RTOL * np.abs(ref_logits).max()
  for name, logits, tokens in (("autoregressive", ref_logits, ref_tokens),
                               ("speculative", spec_logits, spec_tokens)):
    shortfall = logits.max(-1) - np.take_along_axis(logits, tokens[..., None], -1)[..., 0]
    assert (shortfall < near).all(), (
        f"{kind}: {name} tokens are not the target's argmax: (row, token) "
        f"{np.argwhere(shortfall >= near).tolist()} fall {shortfall.max():.4f} short "
        f"(>= {near:.4f})")
  parted = 0
  for b in range(B):
    differ = np.nonzero(ref_tokens[b] != spec_tokens[b])[0]
    if differ.size:
      i = int(differ[0])
      row = ref_logits[b, i]
      assert row.max() - row[spec_tokens[b, i]] < near, (
          f"{kind} row {b} parts from greedy at token {i}: {spec_tokens[b, i]} instead of "
          f"{ref_tokens[b, i]}, logits {row[spec_tokens[b, i]]:.4f} against {row.max():.4f}")
      parted += 1
  return parted


@pytest.mark.parametrize("kind", ["decoder-gqa", "t5-v1.1"])
def test_speculative_greedy_equals_autoregressive_in_bf16(kind):
  """Token for token (see the module docstring for near ties), with both
  accepted and rejected drafts (γ = 3 for the decoder, 4 for T5)."""
  model, params, _, prompts, lengths, ref, spec = _greedy_runs(kind, GREEDY_SEEDS[kind])
  assert ref.tokens.shape == spec.tokens.shape == (B, SPEC_N)
  np.testing.assert_array_equal(spec.lengths, ref.lengths)
  parted = _assert_greedy_equal(kind, model, params, prompts, lengths, ref.tokens, spec.tokens)
  # Near ties part a row in about 1 of 7 (module docstring): all B parting
  # (odds ~0.3%) is a sign of something else.
  assert parted < B, f"every row parted from greedy at a near tie ({kind})"
  assert 0.1 < spec.acceptance_rate < 0.95, spec.acceptance_rate


def test_eagle_on_a_bf16_target_keeps_a_bf16_head_cache_and_greedy_output():
  """An EAGLE head beside a bf16 target stores its keys and values in bf16 (half
  of what each head call reads; computed in float32), and greedy speculative
  decoding still gives the target's greedy tokens (near ties as above)."""
  kind = "decoder-gqa"
  model, params, _, prompts, lengths, ref, _ = _greedy_runs(kind, GREEDY_SEEDS[kind])
  c = model.config
  config = EagleConfig(d_model=c.d_model, vocab_size=c.vocab_size, num_heads=2, mlp_dim=64)
  drafter = Eagle(config, TokenTree.chain(3), model)
  spec = specjax.speculative_generate(
      model, params, drafter, {"head": init_eagle(config, jax.random.key(3)), "target": params},
      prompts, lengths, max_new_tokens=SPEC_N, sampling=GREEDY)
  state = spec.draft_cache
  assert {x.dtype for x in (state.k_BSHD, state.v_BSHD)} == {jnp.dtype(BF16)}
  assert np.abs(np.asarray(state.k_BSHD, np.float32)).max() > 0   # written, not just allocated
  np.testing.assert_array_equal(spec.lengths, ref.lengths)
  parted = _assert_greedy_equal(kind, model, params, prompts, lengths, ref.tokens, spec.tokens)
  assert parted < B


@pytest.mark.parametrize("kind", ["decoder-gqa", "t5-v1.1"])
def test_caches_and_params_stay_bf16(kind):
  """After decoding: caches in the compute dtype (bf16), weights untouched in
  theirs; with float32 weights and bf16 compute, bf16 caches, float32 weights."""
  _, params, draft_params, _, _, ref, spec = _greedy_runs(kind, GREEDY_SEEDS[kind])
  for cache in (ref.target_cache, spec.target_cache, spec.draft_cache):
    buffers = cache.k + cache.v + (cache.cross_k + cache.cross_v if kind.startswith("t5") else ())
    assert {x.dtype for x in buffers} == {jnp.dtype(BF16)}
    assert cache.lengths.dtype == jnp.int32
  for tree in (params, draft_params):
    assert _dtypes(tree) == {jnp.dtype(BF16)}
    leaves = jax.tree_util.tree_leaves(tree)
    assert all(np.isfinite(np.asarray(x, np.float32)).all() for x in leaves)
  mixed = _model(kind, "bfloat16", "float32")
  shapes = jax.eval_shape(mixed.init, jax.random.PRNGKey(0))
  assert _dtypes(shapes) == {jnp.dtype(jnp.float32)}
  cache = (mixed.init_cache(1, 4, 4) if kind.startswith("t5") else mixed.init_cache(1, 4))
  assert {x.dtype for x in cache.k + cache.v} == {jnp.dtype(BF16)}


# --- cast_params --------------------------------------------------------------


def test_cast_params():
  weights = _weights("decoder-gqa")
  bf = cast_params(weights, "bfloat16")
  assert _dtypes(bf) == {jnp.dtype(BF16)}
  assert jax.tree_util.tree_structure(bf) == jax.tree_util.tree_structure(weights)
  back = cast_params(bf, jnp.float32)  # exact: the weights are bf16-representable
  jax.tree_util.tree_map(np.testing.assert_array_equal, back, weights)
  assert cast_params(bf, BF16)["final_norm"]["scale"] is bf["final_norm"]["scale"]
  model = DecoderLM(_config("decoder-gqa", "bfloat16", "bfloat16"))
  packed = cast_params(model.pack_params(back), model.config.param_dtype)
  assert _dtypes(packed) == {jnp.dtype(BF16)}
  mixed = {"w": np.ones((2,), np.float32), "step": np.int32(3), "ids": jnp.arange(3)}
  out = cast_params(mixed, "float16")
  assert isinstance(out["w"], np.ndarray) and out["w"].dtype == np.float16
  assert out["step"].dtype == np.int32 and out["ids"].dtype == jnp.int32
  with pytest.raises(TypeError, match="floating"):
    cast_params(mixed, "int8")
