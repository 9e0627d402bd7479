"""Medusa heads: the tree built from head accuracies, the drafter (exact,
greedy == AR, a tree or a chain), and training with exact resume."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import specjax
from exact_helpers import assert_tree_drafter_exact, exact_lm
from specjax.drafters.medusa import Medusa, choose_tree
from specjax.models.medusa_head import MedusaConfig, head_logits, init_heads
from specjax.sampling import GREEDY, SamplingConfig
from specjax.training.heads import DistillData, train_medusa
from specjax.tree import TokenTree
from tiny import EOS, ragged_prompts, target


def test_choose_tree_takes_the_best_expected_nodes():
  acc = np.array([[0.6, 0.2, 0.1], [0.4, 0.2, 0.1]])
  tree, values = choose_tree(acc, 4)
  assert set(tree.paths()[1:]) == {(0,), (0, 0), (1,)}
  np.testing.assert_allclose(values, [0.6, 0.24, 0.2])
  tree, values = choose_tree(acc, 6)  # then (0, 1) 0.12 and (2,) 0.1
  assert set(tree.paths()[1:]) == {(0,), (0, 0), (1,), (0, 1), (2,)}
  assert tree.depth == 2
  with pytest.raises(ValueError, match="num_nodes"):
    choose_tree(acc, 1)
  with pytest.raises(ValueError, match="accuracy_KR"):
    choose_tree(np.zeros((3,)), 4)


def _heads(lm, params, k=3, seed=0, scale=0.5):
  config = MedusaConfig(num_heads=k, d_model=lm.config.d_model, vocab_size=lm.vocab_size)
  heads = init_heads(config, lm, params)
  keys = jax.random.split(jax.random.PRNGKey(seed), 2)
  heads["w"] = scale * jax.random.normal(keys[0], heads["w"].shape)
  heads["b"] = 0.1 * jax.random.normal(keys[1], heads["b"].shape)
  return config, {"heads": heads, "target": None}


TREE = TokenTree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])


@pytest.mark.parametrize("tree,children", [(TokenTree.chain(3), "top_k"), (TREE, "iid")],
                         ids=["chain", "sampled_tree"])
def test_medusa_greedy_equals_autoregressive(tree, children):
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=8)
  ref = specjax.generate(lm, params, prompts, lengths, max_new_tokens=20, sampling=GREEDY,
                         eos_id=EOS)
  config, dp = _heads(lm, params)
  out = specjax.speculative_generate(lm, params, Medusa(config, tree, children=children), dp,
                                     prompts, lengths, max_new_tokens=20, sampling=GREEDY,
                                     eos_id=EOS)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  assert np.asarray(out.stats.accepted_hist).shape == (8, tree.depth + 1)
  # The first iteration after the prompt has no hidden state yet: it drafts nothing.
  state = Medusa(config, tree).alloc(2, 4, 32, 3)
  prop, _ = Medusa(config, tree).propose(dp, state, specjax.drafters.DraftInput(
      seq_len_B=jnp.zeros(2, jnp.int32), pending_B=jnp.ones(2, jnp.int32),
      prev_B=jnp.zeros(2, jnp.int32), done_B=jnp.zeros(2, bool), step=jnp.int32(0)), None,
      GREEDY, 3)
  assert np.asarray(prop.node_valid_BT).sum() == 2  # the roots only


def test_medusa_with_the_target_as_its_own_head_accepts():
  """Heads that are the target's LM head (fresh init) guess t+1 for t+2:
  wrong, but the shared-head path and state plumbing run; and heads
  computed from the target's own next-token at depth 1 are exact."""
  lm, params = target()
  config = MedusaConfig(num_heads=2, d_model=lm.config.d_model, vocab_size=lm.vocab_size,
                        share_lm_head=True)
  heads = init_heads(config, lm, params)
  assert "lm_head" not in heads
  prompts, lengths = ragged_prompts(batch=4)
  d = Medusa(config, TokenTree.chain(2), target=lm)
  out = specjax.speculative_generate(lm, params, d, {"heads": heads, "target": params}, prompts,
                                     lengths, max_new_tokens=12, sampling=GREEDY)
  ref = specjax.generate(lm, params, prompts, lengths, max_new_tokens=12, sampling=GREEDY)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  h = jnp.ones((2, lm.config.d_model))
  np.testing.assert_allclose(head_logits(config, heads, h, params["lm_head"]["kernel"])[:, 0],
                             h @ params["lm_head"]["kernel"], rtol=1e-5)


def test_medusa_misuse():
  lm, params = target()
  config = MedusaConfig(num_heads=2, d_model=lm.config.d_model, vocab_size=lm.vocab_size)
  with pytest.raises(ValueError, match="3 deep but there are 2 heads"):
    Medusa(config, TokenTree.chain(3))
  with pytest.raises(ValueError, match="share_lm_head needs the target"):
    Medusa(MedusaConfig(2, lm.config.d_model, lm.vocab_size, share_lm_head=True),
           TokenTree.chain(2))
  prompts, lengths = ragged_prompts(batch=2)
  wrong = Medusa(MedusaConfig(2, lm.config.d_model, 32), TokenTree.chain(2))
  with pytest.raises(ValueError, match="vocab_size"):
    specjax.speculative_generate(lm, params, wrong, {}, prompts, lengths, max_new_tokens=4,
                                 sampling=GREEDY)
  narrow = Medusa(MedusaConfig(2, 8, lm.vocab_size), TokenTree.chain(2))
  with pytest.raises(ValueError, match="width 8"):
    specjax.speculative_generate(lm, params, narrow, {}, prompts, lengths, max_new_tokens=4,
                                 sampling=GREEDY)
  with pytest.raises(ValueError, match="num_heads must be an int >= 1"):
    MedusaConfig(0, 8, 8)


@pytest.mark.parametrize("children,cfg", [("top_k", SamplingConfig(1.0)),
                                          ("without", SamplingConfig(1.0)),
                                          ("without", SamplingConfig(0.7, top_p=0.9))], ids=str)
def test_medusa_sampling_is_exact_and_the_control_is_caught(children, cfg):
  """At top-p 0.9 the heads' nucleus often holds fewer tokens than a node's
  children: the empty children must not poison the target's call."""
  lm, params = exact_lm()
  config, dp = _heads(lm, params, k=2, scale=1.0)
  drafter = Medusa(config, TokenTree.from_paths([(0,), (1,), (0, 0)]), children=children)
  assert_tree_drafter_exact(lm, params, drafter, dp, [3, 1, 4], cfg, 3)


def _train_cfg(**kw):
  c = ml_collections.ConfigDict(dict(steps=8, batch_size=4, learning_rate=3e-3, warmup_steps=1,
                                     checkpoint_every=4, log_every=4, seed=0,
                                     keep_checkpoints=3))
  c.update(kw)
  return c


def test_heads_training_learns_and_resumes_exactly(tmp_path):
  lm, params = target()
  config = MedusaConfig(num_heads=2, d_model=lm.config.d_model, vocab_size=lm.vocab_size)
  # A periodic stream: every head can learn its offset.
  base = np.tile(np.arange(10, 20, dtype=np.int32), 4)[None, :24]
  tokens = np.concatenate([np.roll(base, s, axis=1) for s in range(8)])
  data = DistillData(tokens=tokens, generated=np.ones_like(tokens, bool))
  full = train_medusa(lm, params, config, data, None, _train_cfg(steps=30), str(tmp_path / "a"))
  assert full["final"] and full["accuracy"].shape == (2, 10)
  assert full["accuracy"][:, 0].min() > 0.5, full["accuracy"]  # the pattern was learned
  half = train_medusa(lm, params, config, data, None, _train_cfg(steps=30), str(tmp_path / "b"),
                      stop_at_step=12)
  assert half["final"] is None
  resumed = train_medusa(lm, params, config, data, None, _train_cfg(steps=30),
                         str(tmp_path / "b"))
  for a, b in zip(jax.tree_util.tree_leaves(full["params"]),
                  jax.tree_util.tree_leaves(resumed["params"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(ValueError, match="learning_rate"):
    train_medusa(lm, params, config, data, None, _train_cfg(steps=30, learning_rate=1e-2),
                 str(tmp_path / "b"), stop_at_step=29)
