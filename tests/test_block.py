"""Block drafting (a DFlash-style EAGLE head with `EagleConfig.block`): one head
call drafts every depth; drafting equals the training forward; greedy == AR
on ragged batches ending by EOS and by length (chain and tree); rows
independent of the batch; chi-square with a negative control at T = 1 and
T = 0.7 / top-p 0.9; no retrace; training learns and resumes exactly;
misuse named."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from exact_helpers import assert_tree_drafter_exact, exact_lm
from specjax.drafters.eagle import DynamicTree, Eagle
from specjax.models.eagle_head import EagleConfig, fuse_features, head_logits, init_eagle, \
    shared_weights
from specjax.sampling import GREEDY, SamplingConfig
from specjax.training.eagle import (EagleLoss, _states, step_agreement, train_eagle,
                                   unrolled_outputs)
from specjax.training.heads import DistillData
from specjax.tree import TokenTree
from test_eagle import greedy_distill_data, prompt_state
from test_medusa import _train_cfg
from tiny import EOS, assert_rows_independent_and_no_retrace, ragged_prompts, target

TREE = TokenTree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])


def _block_head(lm, block=3, layers=(0, 1), seed=3, num_layers=1):
  config = EagleConfig(d_model=lm.config.d_model, vocab_size=lm.vocab_size, num_heads=2,
                       mlp_dim=64, feature_layers=layers, block=block, num_layers=num_layers)
  hp = init_eagle(config, jax.random.key(seed))
  leaves, tree = jax.tree_util.tree_flatten(hp)   # perturbed: no zero-initialised weights
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  hp = jax.tree_util.tree_unflatten(tree, [
      v + 0.3 * jax.random.normal(kk, v.shape) * (jnp.std(v) + 0.1)
      for v, kk in zip(leaves, keys)])
  return config, hp


def test_one_call_drafts_what_the_training_forward_predicts():
  """Incremental vs full: the drafter's block call (the head's cache from
  the prompt, the root pair and two mask slots) gives the training
  forward's slot-1..3 logits at the same base position, in one call — with
  two layers (the context entering each; one layer: the training test's
  head, drafting the same tokens as greedy decoding)."""
  lm, params = target()
  config, hp = _block_head(lm, num_layers=2)
  assert config.num_params() == sum(int(np.size(v)) for v in jax.tree_util.tree_leaves(hp))
  tokens = jnp.asarray(np.random.default_rng(1).integers(6, 60, (1, 12)), jnp.int32)
  _, feats = lm.forward_with_hidden(params, tokens, layers=config.feature_layers)
  emb, lm_head = shared_weights(lm, params)
  outs = unrolled_outputs(config, hp, emb, fuse_features(config, hp, feats), tokens, 3)
  drafter = Eagle(config, TokenTree.chain(3), lm)
  assert drafter.calls_per_iteration(3) == 1
  dp = {"head": hp, "target": params}
  t = 6
  state = prompt_state(lm, drafter, dp, tokens[:, :t + 1], jnp.array([t + 1]), tokens[:, t + 1])
  logp = drafter._block(dp, state, tokens[:, t + 1], 3)
  for j in range(3):
    want = jax.nn.log_softmax(head_logits(config, hp, lm_head, outs[j][0, t]))
    np.testing.assert_allclose(logp[0, j], want, rtol=2e-4, atol=2e-5)
  # The mask slots read neither the drafted tokens nor the tokens after the root.
  assert not np.allclose(outs[1][0, t], outs[1][0, t - 1])
  # A shorter block is the longer one's prefix (causal within the block).
  np.testing.assert_allclose(drafter._block(dp, state, tokens[:, t + 1], 2), logp[:, :2],
                             rtol=1e-5, atol=1e-6)


def test_block_greedy_equals_autoregressive():
  """A 2-layer block head's tree (a chain of a 1-layer head: the training
  test); rows ending by EOS and by length."""
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=8)
  config, hp = _block_head(lm, num_layers=2)
  drafter = Eagle(config, TREE, lm, "top_k")
  ref = specjax.generate(lm, params, prompts, lengths, max_new_tokens=20, sampling=GREEDY,
                         eos_id=EOS)
  lens = np.asarray(ref.lengths)
  assert (lens < 20).any() and (lens == 20).any()   # rows end by EOS, and by length
  out = specjax.speculative_generate(lm, params, drafter, {"head": hp, "target": params},
                                     prompts, lengths, max_new_tokens=20, sampling=GREEDY,
                                     eos_id=EOS)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  assert (np.asarray(out.stats.draft_calls) <= np.asarray(out.stats.target_calls)).all()


def test_rows_are_independent_of_the_batch_and_no_retrace():
  lm, params = target()
  config, hp = _block_head(lm)
  assert_rows_independent_and_no_retrace(lm, params, Eagle(config, TREE, lm),
                                         {"head": hp, "target": params}, max_new_tokens=12,
                                         sampling=SamplingConfig(1.0), eos_id=EOS)


@pytest.mark.parametrize("children,cfg", [("iid", SamplingConfig(1.0)),
                                          ("without", SamplingConfig(0.7, top_p=0.9))], ids=str)
def test_block_sampling_is_exact_and_the_control_is_caught(children, cfg):
  lm, params = exact_lm()
  config, hp = _block_head(lm, layers=())
  drafter = Eagle(config, TokenTree.from_paths([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]), lm,
                  children)
  assert_tree_drafter_exact(lm, params, drafter, {"head": hp, "target": params}, [3, 1, 4], cfg,
                            3)


def test_block_misuse_is_named(tmp_path):
  lm, params = target()
  config, hp = _block_head(lm, block=2)
  with pytest.raises(ValueError, match="block must be an int >= 0, got -1"):
    EagleConfig(d_model=32, vocab_size=64, block=-1)
  with pytest.raises(ValueError, match="num_layers=2 needs a block head"):
    EagleConfig(d_model=32, vocab_size=64, num_layers=2)
  with pytest.raises(ValueError, match="drafts a static TokenTree in one call"):
    Eagle(config, DynamicTree(top_k=2, depth=2, nodes=4), lm)
  with pytest.raises(ValueError, match=r"tree depth 3 exceeds the block head's 2 slots"):
    Eagle(config, TokenTree.chain(3), lm)
  data = DistillData(tokens=np.ones((2, 8), np.int32), generated=np.ones((2, 8), bool))
  with pytest.raises(ValueError, match=r"loss.unroll \(3\) exceeds the block head's 2 slots"):
    train_eagle(lm, params, config, data, None, _train_cfg(steps=2), str(tmp_path),
                loss=EagleLoss.for_config(config, unroll=3))
  plain = EagleConfig(d_model=32, vocab_size=lm.vocab_size)
  with pytest.raises(ValueError, match="draft_params"):   # a block head's params, no mask
    specjax.speculative_generate(lm, params, Eagle(config, TokenTree.chain(2), lm),
                                 {"head": init_eagle(plain, jax.random.key(0)), "target": params},
                                 *ragged_prompts(batch=2), max_new_tokens=4, sampling=GREEDY)


def test_block_training_learns_and_resumes_exactly(tmp_path):
  """On the target's own greedy continuations the block head learns every
  slot; a killed run resumes to the same weights; the trained head drafts
  (greedy output unchanged, one head call per iteration) and accepts."""
  lm, params = target()
  prompts, lengths, gen, data = greedy_distill_data(lm, params)
  tokens = data.tokens
  config, _ = _block_head(lm, block=3, layers=(0, 1))
  loss = EagleLoss.for_config(config)
  assert (loss.unroll, loss.feature_weight, loss.noise) == (3, 0.0, 0.0)
  cfg = _train_cfg(steps=40, learning_rate=1e-2)
  feats, final = _states(lm, params, config, tokens)
  before = step_agreement(config, loss, init_eagle(config, jax.random.key(0)),
                          shared_weights(lm, params), feats, final, data)
  full = train_eagle(lm, params, config, data, None, cfg, str(tmp_path / "a"))
  assert full["final"] and full["agreement"].shape == (3,)
  assert (full["agreement"] > before + 0.1).all(), (before, full["agreement"])
  half = train_eagle(lm, params, config, data, None, cfg, str(tmp_path / "b"), stop_at_step=20)
  assert half["final"] is None
  resumed = train_eagle(lm, params, config, data, None, cfg, str(tmp_path / "b"))
  for a, b in zip(jax.tree_util.tree_leaves(full["params"]),
                  jax.tree_util.tree_leaves(resumed["params"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  drafter, dp = specjax.drafters.load_eagle(full["final"], lm, params, TokenTree.chain(3))
  assert drafter.config == config
  out = specjax.speculative_generate(lm, params, drafter, dp, prompts, lengths,
                                     max_new_tokens=18, sampling=GREEDY)
  np.testing.assert_array_equal(out.tokens, gen.tokens)
  calls = np.asarray(out.stats.target_calls).sum()
  assert np.asarray(out.stats.draft_calls).sum() <= calls
  tau = float(np.asarray(out.stats.accepted).sum() / calls)
  assert tau > 0.5, tau
  # What the slots learned is the block's, not a plain head's: the same weights without
  # the block field do not load as a block drafter.
  assert dataclasses.replace(config, block=0) != drafter.config
