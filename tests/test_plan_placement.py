"""A plan's program on a mesh: lowered from the plan itself (`specjax.aot.programs.lower_plan`),
its weights placed in the formats the compiled program asks for (`place_weights`): run on this
machine's 8 CPU devices (same tokens as `speculative_generate`) and compiled for a TPU v5e:2x2
slice with no TPU."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import specjax
from specjax.aot import chips
from specjax.aot.programs import lower_plan, place_weights
from specjax.models.decoder import DecoderConfig, DecoderLM

pytestmark = pytest.mark.skipif(jax.device_count() < 4,
                                reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8")

_T = DecoderConfig(vocab_size=256, d_model=128, num_layers=2, num_heads=4, num_kv_heads=4,
                   head_dim=32, mlp_dim=256)
_D = DecoderConfig(vocab_size=256, d_model=64, num_layers=1, num_heads=2, num_kv_heads=2,
                   head_dim=32, mlp_dim=128, tie_embeddings=True)


@pytest.fixture(scope="module")
def pair():
  target, draft = DecoderLM(_T), DecoderLM(_D)
  rng = np.random.default_rng(0)
  prompts = jax.numpy.asarray(rng.integers(3, 256, (2, 6)), jax.numpy.int32)
  lengths = jax.numpy.asarray([6, 4], jax.numpy.int32)
  return (target, target.init(jax.random.PRNGKey(0)), draft, draft.init(jax.random.PRNGKey(1)),
          prompts, lengths)


def _plan(pair, **kw):
  target, tp, draft, dp, prompts, lengths = pair
  return specjax.plan_speculative(target, tp, draft, dp, prompts, lengths, max_new_tokens=6,
                                  gamma=3, sampling=specjax.GREEDY, **kw)


def test_the_plans_program_runs_with_weights_in_its_compiled_formats(pair):
  target, tp, draft, dp, prompts, lengths = pair
  mesh = Mesh(np.array(jax.devices()[:4]).reshape(1, 4), ("data", "model"))
  plan = _plan(pair)
  compiled = lower_plan(plan, mesh, param_layouts="auto").lowered.compile()
  placed_tp, placed_dp = place_weights(compiled, tp, dp)
  formats = compiled.input_formats[0]
  for leaf, fmt in zip(jax.tree_util.tree_leaves(placed_tp),
                       jax.tree_util.tree_leaves(formats[0])):
    assert leaf.format == fmt     # layout and sharding the program asked for
  assert any(len(leaf.sharding.device_set) == 4 for leaf in jax.tree_util.tree_leaves(placed_tp))
  caches = [jax.device_put(m.init_cache(2, n, prompts.shape[1]), f)
            for m, n, f in ((target, plan.cache_len, formats[5]),
                            (draft, plan.draft_cache_len, formats[6]))]
  keys = jax.random.key_data(jax.random.split(jax.random.key(0), 2))   # as abstract_rows
  rows = [jax.device_put(x, f) for x, f in zip((prompts, lengths, keys), formats[2:5])]
  out = compiled(placed_tp, placed_dp, *rows, *caches)
  want = specjax.speculative_generate(target, tp, draft, dp, prompts, lengths, max_new_tokens=6,
                                      gamma=3, sampling=specjax.GREEDY)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(want.tokens))


def test_the_plans_program_compiles_for_a_tpu_slice(pair):
  pytest.importorskip("libtpu")
  devices = chips.topology_devices("v5e:2x2")
  mesh = Mesh(np.array(devices).reshape(1, 4), ("data", "model"))
  plan = _plan(pair)
  low = lower_plan(plan, mesh, param_layouts="auto")
  compiled = low.lowered.compile()
  tp_formats = jax.tree_util.tree_leaves(compiled.input_formats[0][0])
  assert tp_formats and all(f.layout is not None for f in tp_formats)
  assert low.tokens_per_call == plan.call_len == 4
  # An adaptive plan's program (Γ and its cost table as an argument) lowers for the slice too.
  target, tp, draft, dp, prompts, lengths = pair
  auto = specjax.plan_speculative(target, tp, draft, dp, prompts, lengths, max_new_tokens=6,
                                  gamma="auto", gamma_costs=[1.0, 1.01, 1.02, 1.03, 1.04],
                                  sampling=specjax.GREEDY)
  assert not auto.plain
  assert lower_plan(auto, mesh).lowered.compile().input_formats[0][8] is not None


def test_a_plain_plan_is_named(pair):
  plan = _plan(pair).__class__(**{**_plan(pair).__dict__, "plain": True})
  with pytest.raises(ValueError, match="plain"):
    lower_plan(plan, Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model")))
