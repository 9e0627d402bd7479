"""Decoding on a (data, model) mesh of 8 CPU devices equals single-device decoding."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.models.t5 import T5, t5_config
from specjax.parallel import sharding
from tiny import EOS, noisy_draft, ragged_prompts, target

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8,
                                reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8")


def test_param_specs_follow_megatron_layout():
  mesh = sharding.make_mesh(data=4, model=2)
  lm, params = target()
  sp = sharding.shard_params(params, mesh)
  assert sp["layer_0"]["q"]["kernel"].sharding.spec == jax.sharding.PartitionSpec(None, "model", None)
  assert sp["layer_0"]["o"]["kernel"].sharding.spec == jax.sharding.PartitionSpec("model", None, None)
  assert sp["layer_0"]["gate"]["kernel"].sharding.spec == jax.sharding.PartitionSpec(None, "model")
  assert sp["layer_0"]["down"]["kernel"].sharding.spec == jax.sharding.PartitionSpec("model", None)
  assert sp["final_norm"]["scale"].sharding.spec == jax.sharding.PartitionSpec(None)


def test_mesh_errors_are_clear():
  with pytest.raises(ValueError, match="needs 64 devices"):
    sharding.make_mesh(data=8, model=8)


def _run_sharded(tm, tp, dm, dp, prompts, lengths, mesh, **kw):
  b, p = prompts.shape
  g = kw["gamma"]
  g = g.max_gamma if isinstance(g, specjax.AdaptiveGamma) else g
  need = specjax.required_cache_len(tm, p, kw["max_new_tokens"], g)
  keys = jax.random.split(jax.random.key(3), b)
  sp, ln, ks = sharding.shard_batch(mesh, prompts, lengths, keys)
  return specjax.speculative_generate(
      tm, sharding.shard_params(tp, mesh), dm, sharding.shard_params(dp, mesh), sp, ln, key=ks,
      target_cache=sharding.sharded_cache(tm, mesh, b, need, p),
      draft_cache=sharding.sharded_cache(dm, mesh, b, need, p), **kw)


def test_sharded_decoder_speculative_equals_unsharded():
  mesh = sharding.make_mesh(data=4, model=2)
  lm, params = target()
  draft, draft_params = noisy_draft()
  prompts, lengths = ragged_prompts(batch=8)
  kw = dict(max_new_tokens=12, gamma=3, sampling=specjax.SamplingConfig(1.0), eos_id=EOS)
  keys = jax.random.split(jax.random.key(3), 8)
  ref = specjax.speculative_generate(lm, params, draft, draft_params, prompts, lengths, key=keys, **kw)
  out = _run_sharded(lm, params, draft, draft_params, prompts, lengths, mesh, **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.stats.accepted, ref.stats.accepted)
  for buf in out.target_cache.k + out.target_cache.v:
    spec = buf.sharding.spec
    assert spec[0] == "data" and spec[1] == "model", spec


def test_sharded_t5_greedy_equals_unsharded():
  mesh = sharding.make_mesh(data=4, model=2)
  t = T5(t5_config("t5-v1_1-tiny"))
  tp = t.init(jax.random.PRNGKey(0))
  prompts, lengths = ragged_prompts(batch=8)
  prompts = prompts % t.vocab_size
  kw = dict(max_new_tokens=8, gamma=2, sampling=specjax.GREEDY)
  ref = specjax.speculative_generate(t, tp, t, tp, prompts, lengths, **kw)
  out = _run_sharded(t, tp, t, tp, prompts, lengths, mesh, **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  # gamma="auto" on the mesh: its segments and choices over sharded caches.
  auto = _run_sharded(t, tp, t, tp, prompts, lengths, mesh, max_new_tokens=8,
                      sampling=specjax.GREEDY, gamma=specjax.AdaptiveGamma(gammas=(0, 1, 2)),
                      gamma_costs=(1.0, 1.05, 1.1))
  np.testing.assert_array_equal(auto.tokens, ref.tokens)
  assert (np.asarray(auto.stats.gamma_trace) > 0).any()


def _reference(data, model, batch, **kw):
  """(mesh, (lm, params), (draft, draft_params), prompts, lengths, single-device output)."""
  mesh = sharding.make_mesh(data=data, model=model)
  lm, params = target()
  draft, draft_params = noisy_draft()
  prompts, lengths = ragged_prompts(batch=batch)
  ref = specjax.speculative_generate(lm, params, draft, draft_params, prompts, lengths, **kw)
  return mesh, (lm, params), (draft, draft_params), prompts, lengths, ref


def test_split_target_with_replicated_draft_equals_unsharded():
  """The model-parallel benchmark layout: target over `model`, draft whole on every device."""
  kw = dict(max_new_tokens=12, gamma=3, sampling=specjax.GREEDY, eos_id=EOS)
  mesh, (lm, params), (draft, draft_params), prompts, lengths, ref = _reference(1, 2, 2, **kw)
  need = specjax.required_cache_len(lm, prompts.shape[1], 12, 3)
  dp = sharding.replicate(draft_params, mesh)
  for leaf in jax.tree_util.tree_leaves(dp):
    assert leaf.sharding.is_fully_replicated and len(leaf.sharding.device_set) == 2
  sp, ln = sharding.shard_batch(mesh, prompts, lengths)
  out = specjax.speculative_generate(
      lm, sharding.shard_params(params, mesh), draft, dp, sp, ln,
      target_cache=sharding.sharded_cache(lm, mesh, 2, need, prompts.shape[1]),
      draft_cache=sharding.replicate(draft.init_cache(2, need, prompts.shape[1]), mesh), **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.stats.accepted, ref.stats.accepted)
  assert out.target_cache.k[0].sharding.spec[1] == "model"
  assert out.draft_cache.k[0].sharding.is_fully_replicated


def test_packed_layout_shards_and_decodes_like_the_standard_one():
  """Packed params (`DecoderLM.pack_params`) split over `model` by kv heads /
  hidden units, and decode (sampled, data × model mesh) to the tokens of the
  standard params on one device."""
  mesh = sharding.make_mesh(data=4, model=2)
  lm, params = target()
  draft, draft_params = noisy_draft()
  packed = sharding.shard_params(lm.pack_params(params), mesh)
  layer = packed["layer_0"]
  P = jax.sharding.PartitionSpec
  assert layer["qkv"]["kernel"].sharding.spec == P(None, "model", None, None)
  assert layer["gate_up"]["kernel"].sharding.spec == P(None, "model", None)
  assert layer["down_t"]["kernel"].sharding.spec == P(None, "model")
  prompts, lengths = ragged_prompts(batch=8)
  kw = dict(max_new_tokens=12, gamma=3, sampling=specjax.SamplingConfig(1.0), eos_id=EOS)
  keys = jax.random.split(jax.random.key(3), 8)
  ref = specjax.speculative_generate(lm, params, draft, draft_params, prompts, lengths, key=keys, **kw)
  out = _run_sharded(lm, lm.pack_params(params), draft, draft.pack_params(draft_params), prompts,
                     lengths, mesh, **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.stats.accepted, ref.stats.accepted)


def test_replicate_needs_a_mesh():
  with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
    sharding.replicate({"w": np.ones(2)}, jax.devices()[0])


def test_embedding_and_lm_head_are_vocab_parallel():
  mesh = sharding.make_mesh(data=4, model=2)
  lm, params = target()
  sp = sharding.shard_params(params, mesh)
  P = jax.sharding.PartitionSpec
  assert sp["embed"]["embedding"].sharding.spec == P("model", None)
  if "lm_head" in sp:
    assert sp["lm_head"]["kernel"].sharding.spec == P(None, "model")
  # A vocabulary the axis does not divide stays whole.
  odd = sharding.param_spec(("embed", "embedding"), (63, 32), mesh)
  assert odd == P(None, None)


def test_kv_head_repeats_rule():
  assert sharding.kv_head_repeats(64, 8, 16) == 2      # Llama-3.1-70B on 16 chips
  assert sharding.kv_head_repeats(64, 8, 8) == 1       # divides already
  assert sharding.kv_head_repeats(64, 8, 1) == 1
  assert sharding.kv_head_repeats(32, 8, 64) == 1      # the axis exceeds the query heads
  assert sharding.kv_head_repeats(48, 8, 12) == 1      # 12 is not a multiple of 8


def test_repeated_kv_heads_split_the_cache_and_decode_exactly():
  """K = 2 kv heads on a model axis of 4: `fit_to_mesh` stores each twice, the cache
  splits (a quarter of the repeated cache, half the original, per device instead of all
  of it) and sampled speculative decoding equals the unsharded run token for token."""
  mesh = sharding.make_mesh(data=2, model=4)
  lm, params = target()
  assert lm.config.num_kv_heads == 2 and lm.config.num_heads % 4 == 0
  draft, draft_params = noisy_draft()
  prompts, lengths = ragged_prompts(batch=4)
  kw = dict(max_new_tokens=10, gamma=3, sampling=specjax.SamplingConfig(1.0), eos_id=EOS)
  keys = jax.random.split(jax.random.key(3), 4)  # the keys `_run_sharded` uses
  ref = specjax.speculative_generate(lm, params, draft, draft_params, prompts, lengths, key=keys,
                                     **kw)
  fm, fp = sharding.fit_to_mesh(lm, params, mesh)
  assert fm.config.num_kv_heads == 4
  # The unsharded repeated model is the same function.
  one = specjax.speculative_generate(fm, fp, draft, draft_params, prompts, lengths, key=keys,
                                     **kw)
  np.testing.assert_array_equal(one.tokens, ref.tokens)
  b, p = prompts.shape
  need = specjax.required_cache_len(lm, p, kw["max_new_tokens"], kw["gamma"])
  before = sharding.sharded_cache(lm, mesh, b, need, p).k[0]
  after = sharding.sharded_cache(fm, mesh, b, need, p).k[0]
  assert before.sharding.shard_shape(before.shape)[1] == 2      # whole: replicated
  assert after.sharding.shard_shape(after.shape)[1] == 1        # one head per device
  out = _run_sharded(fm, fp, draft, draft_params, prompts, lengths, mesh, **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.stats.accepted, ref.stats.accepted)
  with pytest.raises(ValueError, match="must divide num_heads"):
    lm.repeat_kv_heads(params, 3)


def test_caches_the_api_allocates_are_placed_like_the_params():
  """No caches passed: the target's is split like `cache_spec` lays it out (batch over
  data, kv heads over model) and a replicated draft's has its rows over data — neither
  is whole on every device — and the tokens equal the single-device run."""
  kw = dict(max_new_tokens=8, gamma=2, sampling=specjax.GREEDY, eos_id=EOS)
  mesh, (lm, params), (draft, draft_params), prompts, lengths, ref = _reference(4, 2, 8, **kw)
  sp, ln = sharding.shard_batch(mesh, prompts, lengths)
  out = specjax.speculative_generate(lm, sharding.shard_params(params, mesh), draft,
                                     sharding.replicate(draft_params, mesh), sp, ln, **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  P = jax.sharding.PartitionSpec
  k = out.target_cache.k[0]
  assert k.sharding.shard_shape(k.shape)[:2] == (k.shape[0] // 4, k.shape[1] // 2)
  d = out.draft_cache.k[0]
  assert d.sharding.shard_shape(d.shape)[0] == d.shape[0] // 4
  assert sharding.place_cache_like({"x": np.zeros(4)}, {"w": np.ones(2)})["x"].shape == (4,)
  assert sharding.params_mesh(params) is None
  assert P("data") == sharding.place_cache_like(
      lm.init_cache(8, 16), sharding.replicate(params, mesh)).lengths.sharding.spec


def test_a_split_eagle_head_and_gathered_logits_decode_exactly():
  """An EAGLE head split over `model` like its target (`EagleConfig.split`, the head's
  kernels laid out by `param_spec`, its cache by head: `Drafter.splits_state`) and the
  logits gathered once under the params' mesh (`sharding.decode_mesh`) give the
  single-device tokens, sampled at T = 1."""
  from specjax.drafters.eagle import Eagle
  from specjax.tree import TokenTree
  from test_eagle import _head
  mesh = sharding.make_mesh(data=2, model=2)
  lm, params = target()
  config, hp = _head(lm)
  prompts, lengths = ragged_prompts(batch=4)
  keys = jax.random.split(jax.random.key(5), 4)
  kw = dict(max_new_tokens=10, sampling=specjax.SamplingConfig(1.0), eos_id=EOS)
  ref = specjax.speculative_generate(lm, params, Eagle(config, TokenTree.chain(3), lm),
                                     {"head": hp, "target": params}, prompts, lengths,
                                     key=keys, **kw)
  split = dataclasses.replace(config, split=True)
  tp, shp = sharding.shard_params(params, mesh), sharding.shard_params(hp, mesh)
  P = jax.sharding.PartitionSpec
  col, row = P(None, "model"), P("model", None)
  assert shp["q"].sharding.spec == col and shp["o"].sharding.spec == row
  assert shp["fc"].sharding.spec == col and shp["down"].sharding.spec == row
  sp, ln, ks = sharding.shard_batch(mesh, prompts, lengths, keys)
  out = specjax.speculative_generate(lm, tp, Eagle(split, TokenTree.chain(3), lm),
                                     {"head": shp, "target": tp}, sp, ln, key=ks, **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.stats.accepted, ref.stats.accepted)
  k = out.draft_cache.k_BSHD   # [B, S, H, D]: rows over data, heads over model
  assert k.sharding.shard_shape(k.shape) == (k.shape[0] // 2, k.shape[1], k.shape[2] // 2,
                                             k.shape[3])
  assert sharding.suffix_spec("k_BSHD", (4, 16, 2, 8), mesh) == P("data", None, "model", None)
  assert sharding.suffix_spec("lengths", (4,), mesh) == P("data")


def test_logits_too_large_to_gather_stay_split_and_sample_exactly():
  """A verify call's logits above `rules.GATHER_MAX_BYTES` per device stay split over
  the vocabulary (16 rows per device x 5 positions x 16384 tokens: 5.2 MB), the draft
  steps' (1.0 MB) are gathered; the sampler then runs over vocabulary pieces
  (`sampling.vocab_shards`: top-k, top-p, the rejection rule's gathers, the draws) and
  gives the single-device tokens at T = 0.8 with top-k and top-p, and greedily."""
  from specjax.models.decoder import DecoderLM, decoder_config
  from specjax.parallel.rules import GATHER_MAX_BYTES
  vocab, batch, gamma = 16384, 32, 4
  assert 16 * (gamma + 1) * vocab * 4 > GATHER_MAX_BYTES >= 16 * vocab * 4
  lm = DecoderLM(decoder_config("tiny", vocab_size=vocab, num_layers=1))
  params = lm.init(jax.random.PRNGKey(0))
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(7), len(leaves))
  dparams = jax.tree_util.tree_unflatten(tree, [
      x + 0.15 * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, 11, size=batch)
  prompts = rng.integers(6, vocab, size=(batch, 10)).astype(np.int32)
  prompts[np.arange(10)[None] >= lengths[:, None]] = 0
  prompts, lengths = jnp.asarray(prompts), jnp.asarray(lengths, jnp.int32)
  mesh = sharding.make_mesh(data=2, model=4)
  for sampling in (specjax.SamplingConfig(0.8, top_k=50, top_p=0.9), specjax.GREEDY):
    kw = dict(max_new_tokens=8, gamma=gamma, sampling=sampling, eos_id=EOS)
    ref = specjax.speculative_generate(lm, params, lm, dparams, prompts, lengths,
                                       key=jax.random.split(jax.random.key(3), batch), **kw)
    out = _run_sharded(lm, params, lm, dparams, prompts, lengths, mesh, **kw)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.stats.accepted, ref.stats.accepted)
    assert 0 < int(np.sum(ref.stats.accepted)) < batch * 8, sampling   # drafts both pass and fail
