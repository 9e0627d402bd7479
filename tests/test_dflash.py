"""DFlash-style block drafting (`specjax.drafters.DFlash`, `specjax.training.dflash`): one
draft call after a prefill and ragged commits (stale entries past a row's length written on
purpose) equals the training forward at the same anchor; greedy == plain greedy on ragged
batches ending by EOS and by length (chain and tree, a trained draft that is accepted); a row
alone equals that row in a batch and other prompts of the same shape compile nothing;
chi-square against the target's exact law with a negative control, chain and tree, at T = 1;
training raises every slot's agreement, records it for `read_agreement` and resumes exactly;
misuse named."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import specjax
from exact_helpers import (N_SAMPLES, assert_tree_drafter_exact, counts_t2_t4, exact_lm,
                           joint_t2_t4, optimized_codegen)
from reference import chi_square_pvalue
from specjax.adaptive import AdaptiveGamma
from specjax.checkpoints.heads import read_agreement
from specjax.drafters import DFlash, DFlashConfig, init_dflash, load_dflash
from specjax.drafting import DraftFeedback
from specjax.measure.compiles import TraceCounter
from specjax.models.dflash_head import shared_weights
from specjax.sampling import GREEDY, SamplingConfig
from specjax.training.dflash import (DFlashLoss, _states, anchor_positions, anchored_log_probs,
                                     slot_agreement, train_dflash)
from specjax.training.heads import DistillData
from specjax.tree import TokenTree
from test_exactness import residual_from_q_verify
from tiny import EOS, assert_rows_independent_and_no_retrace, ragged_prompts, target

BLOCK = 4
TREE = TokenTree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])


def _config(lm, layers=(0, 1), num_layers=2, block=BLOCK):
  return DFlashConfig(d_model=lm.config.d_model, vocab_size=lm.vocab_size, target_layers=layers,
                      num_layers=num_layers, block=block, num_heads=2, mlp_dim=64)


def _random_head(config, seed=3, scale=0.3):
  """Fresh params perturbed: no zero-initialised weights, every path live."""
  hp = init_dflash(config, jax.random.key(seed))
  leaves, tree = jax.tree_util.tree_flatten(hp)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return jax.tree_util.tree_unflatten(tree, [
      v + scale * jax.random.normal(k, v.shape) * (jnp.std(v) + 0.1)
      for v, k in zip(leaves, keys)])


def _train_cfg(**kw):
  c = ml_collections.ConfigDict(dict(steps=40, batch_size=8, learning_rate=1e-2, warmup_steps=2,
                                     checkpoint_every=20, log_every=20, seed=0,
                                     keep_checkpoints=2))
  c.update(kw)
  return c


@functools.lru_cache(maxsize=None)
def _distill():
  """(prompts, lengths, greedy output, DistillData): 16 ragged prompts and the target's 18
  greedy tokens after each, as training sequences."""
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=16, max_len=6, seed=5)
  gen = specjax.generate(lm, params, prompts, lengths, max_new_tokens=18, sampling=GREEDY)
  tokens = np.zeros((16, 24), np.int32)
  generated = np.zeros((16, 24), bool)
  for i, (p, m) in enumerate(zip(np.asarray(prompts), np.asarray(lengths))):
    tokens[i, :m] = p[:m]
    tokens[i, m:m + 18] = np.asarray(gen.tokens)[i]
    generated[i, m:m + 18] = True
  return prompts, lengths, gen, DistillData(tokens=tokens, generated=generated)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A draft trained on the target's own greedy continuations (40 steps), and its workdir."""
  lm, params = target()
  workdir = str(tmp_path_factory.mktemp("dflash") / "full")
  return train_dflash(lm, params, _config(lm), _distill()[3], None, _train_cfg(), workdir)


def _feedback(hidden_BCX, count_B, seq_len_B):
  b, c = hidden_BCX.shape[:2]
  z = jnp.zeros((b,), jnp.int32)
  return DraftFeedback(committed_BC=jnp.zeros((b, c), jnp.int32), count_B=count_B,
                       seq_len_B=seq_len_B, pending_B=z, target_argmax_BT=jnp.zeros((b, c),
                                                                                    jnp.int32),
                       chain_B=z, accepted_B=count_B - 1, target_hidden_BCX=hidden_BCX)


def test_one_call_after_ragged_commits_equals_the_training_forward():
  """A chunked prefill (ragged prompts), then two commits of a different count per row whose rejected
  entries carry garbage features: the draft's block at each row's pending token equals the
  training forward's block at that anchor over the true sequence (its cache is rolled back per
  row, the stale entries masked and overwritten); a shorter block is the longer's prefix."""
  lm, params = target()
  config = _config(lm)
  hp = _random_head(config)
  assert config.num_params() == sum(int(np.size(v)) for v in jax.tree_util.tree_leaves(hp))
  dp = {"head": hp, "target": params}
  drafter = DFlash(config, lm)
  tokens = jnp.asarray(np.random.default_rng(1).integers(6, 60, (3, 16)), jnp.int32)
  _, hidden = jax.jit(lm.forward_with_hidden, static_argnums=2)(params, tokens,
                                                                config.target_layers)
  lengths = jnp.array([9, 5, 3], jnp.int32)
  chunked = specjax.DecoderLM(lm.config.replace(prefill_chunk=4))   # chunks of 4, 4 and 1

  @jax.jit
  def prefill(dp, prompts_BP, lengths_B):
    absorb = lambda state, start, hidden_BCX: drafter.absorb(dp, state, prompts_BP, lengths_B,
                                                             start, hidden_BCX)
    _, _, _, state = chunked.prefill_with_hidden(
        dp["target"], prompts_BP, lengths_B, chunked.init_cache(3, 24),
        layers=config.target_layers, fold=(absorb, drafter.alloc(3, 9, 24, 3)))
    return drafter.start(dp, state, prompts_BP, lengths_B, None, None)
  state = prefill(dp, tokens[:, :9], lengths)
  garbage = 5.0 * jax.random.normal(jax.random.key(0), (3, 4, hidden.shape[-1]))
  update = jax.jit(drafter.update)
  block = jax.jit(drafter.block_log_probs, static_argnums=3)
  seq = lengths
  for count in (jnp.array([2, 1, 4]), jnp.array([1, 3, 2])):
    at = seq[:, None] + jnp.arange(4)[None]
    true = jnp.take_along_axis(hidden, jnp.minimum(at, 15)[:, :, None], axis=1)
    h = jnp.where((jnp.arange(4)[None] < count[:, None])[:, :, None], true, garbage)
    seq = seq + count
    state = update(dp, state, _feedback(h, count, seq))
  np.testing.assert_array_equal(state.lengths_B, [12, 9, 9])
  anchor = tokens[jnp.arange(3), seq]
  got = block(dp, state, anchor, BLOCK)
  forward = jax.jit(anchored_log_probs, static_argnums=0)
  want = forward(config, hp, shared_weights(lm, params), hidden, tokens, seq[:, None])[:, 0]
  np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(block(dp, state, anchor, 2), got[:, :1],
                             rtol=1e-5, atol=1e-6)
  assert not np.allclose(got[:, 0], got[:, 1], atol=1e-3)   # the slots differ
  # Each layer reads the context: without it (a fresh state of the same lengths) the draft
  # changes.
  blank = drafter.alloc(3, 9, 24, 3).replace(lengths_B=state.lengths_B)
  assert not np.allclose(block(dp, blank, anchor, BLOCK), got, atol=1e-3)


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_greedy_equals_plain_greedy(trained, tree):
  """The trained draft (loaded from its workdir) on ragged prompts, rows ending by EOS and by
  length: token for token plain greedy decoding; one draft call per iteration; its drafts are
  accepted (an untrained draft's almost never are); other prompts of the same shape run the
  compiled loop again (one compilation per block size)."""
  lm, params = target()
  prompts, lengths = _distill()[:2]
  ref = specjax.generate(lm, params, prompts, lengths, max_new_tokens=20, sampling=GREEDY,
                         eos_id=EOS)
  lens = np.asarray(ref.lengths)
  assert (lens < 20).any() and (lens == 20).any()   # rows end by EOS, and by length
  drafter, dp = load_dflash(trained["final"], lm, params, tree,
                            None if tree is None else "top_k")
  assert drafter.deterministic == (tree is not None)
  out = specjax.speculative_generate(lm, params, drafter, dp, prompts, lengths,
                                     max_new_tokens=20, gamma=BLOCK - 1 if tree is None else None,
                                     sampling=GREEDY, eos_id=EOS)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  # One draft call per iteration (the prefill is a target call too).
  np.testing.assert_array_equal(out.stats.draft_calls, np.asarray(out.stats.target_calls) - 1)
  assert out.acceptance_rate > 0.1, out.acceptance_rate
  with TraceCounter() as traces:
    specjax.speculative_generate(lm, params, drafter, dp, *ragged_prompts(16, 6, seed=6),
                                 max_new_tokens=20, gamma=BLOCK - 1 if tree is None else None,
                                 sampling=GREEDY, eos_id=EOS)
  assert traces.decode_loops == 0, traces.counts


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_auto_gamma_over_blocks_equals_plain_greedy(trained, tree):
  """`gamma="auto"` over Γ = (0, 1, 3) (blocks of 2 and 4 slots, plain steps), each row its own
  γ: plain greedy's tokens; rows take plain steps and draft again after them, accepted."""
  lm, params = target()
  prompts, lengths = _distill()[:2]
  ref = specjax.generate(lm, params, prompts, lengths, max_new_tokens=20, sampling=GREEDY,
                         eos_id=EOS)
  drafter, dp = load_dflash(trained["final"], lm, params, tree,
                            None if tree is None else "top_k")
  out = specjax.speculative_generate(
      lm, params, drafter, dp, prompts, lengths, max_new_tokens=20, sampling=GREEDY, eos_id=EOS,
      gamma=AdaptiveGamma(gammas=(0, 1, 3), per_row=True, prior_alpha=0.4),
      gamma_costs=(1.0, 1.3, 1.6))
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  drafts, iterations = (int(np.sum(out.stats.draft_calls)),
                        int(np.sum(out.stats.target_calls)) - len(prompts))
  assert 0 < drafts < iterations, (drafts, iterations)   # plain steps, and drafting after them
  assert out.acceptance_rate > 0.1, out.acceptance_rate


def test_a_row_alone_equals_it_in_a_batch_and_no_retrace():
  """A sampled tree at T = 1 (the chain's compilation count: the greedy test)."""
  lm, params = target()
  config = _config(lm)
  assert_rows_independent_and_no_retrace(
      lm, params, DFlash(config, lm, TREE), {"head": _random_head(config), "target": params},
      max_new_tokens=12, sampling=SamplingConfig(1.0), eos_id=EOS)


def _exact_draft():
  lm, params = exact_lm()
  config = DFlashConfig(d_model=16, vocab_size=lm.vocab_size, target_layers=(0, 1),
                        num_layers=1, block=BLOCK, num_heads=2, mlp_dim=32)
  return lm, params, config, {"head": _random_head(config, scale=0.5), "target": params}


def test_chain_sampling_is_exact_and_the_control_is_caught():
  """Tokens 2..4 after a prompt at T = 1, γ = 3 (drafts 2 and 3 from mask slots), against the
  target's exact law; the broken rule (after a rejection, sample from the target's q, not the
  residual) is caught."""
  lm, params, config, dp = _exact_draft()
  prompt, cfg = [3, 1, 4], SamplingConfig(1.0)
  joint = joint_t2_t4(lm, params, prompt, cfg)
  prompts = np.tile(np.array(prompt, np.int32), (N_SAMPLES, 1))
  pvalues = {}
  for name, fn in (("exact", specjax.verify.rejection_verify), ("broken", residual_from_q_verify)):
    with optimized_codegen():
      out = specjax.speculative_generate(lm, params, DFlash(config, lm), dp, prompts,
                                         max_new_tokens=4, gamma=3, sampling=cfg,
                                         key=jax.random.key(5), verify_fn=fn)
    pvalues[name] = chi_square_pvalue(counts_t2_t4(np.asarray(out.tokens), lm.vocab_size),
                                      joint)
    if name == "exact":
      hist = np.asarray(out.stats.accepted_hist).sum(0)
      assert hist[0] > 0 and hist[2:].sum() > 0, hist   # rejections, and mask slots accepted
  assert pvalues["exact"] > 1e-3 and pvalues["broken"] < 1e-6, pvalues


def test_tree_sampling_is_exact_and_the_control_is_caught():
  """A sampled tree (children without replacement, T = 1): tokens 2..4 against the target's
  exact law; the tree rule broken on purpose (after the children are rejected, sample from the
  target, not the residual) is caught."""
  lm, params, config, dp = _exact_draft()
  drafter = DFlash(config, lm, TokenTree.from_paths([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]))
  assert not drafter.deterministic and drafter.fixed_gamma == 3
  assert_tree_drafter_exact(lm, params, drafter, dp, [3, 1, 4], SamplingConfig(1.0), 3)


def test_training_raises_agreement_records_it_and_resumes_exactly(trained, tmp_path):
  """Every slot agrees with the target more than an untrained draft's; the recorded agreement
  (by slot) is what `read_agreement` reads; a run stopped halfway resumes to the same weights;
  anchors are drawn among generated tokens with a next token."""
  lm, params = target()
  data = _distill()[3]
  config = _config(lm)
  hidden, final = _states(lm, params, config, data.tokens)
  shared = shared_weights(lm, params)
  before = slot_agreement(config, init_dflash(config, jax.random.key(0)), shared, hidden, final,
                          data)
  after = trained["agreement"]
  assert after.shape == (BLOCK - 1,)
  assert after[0] > before[0] + 0.2 and (after > before).all(), (before, after)
  np.testing.assert_allclose(read_agreement(trained["final"]), after)
  np.testing.assert_allclose(slot_agreement(config, trained["params"], shared, hidden, final,
                                            data), after)
  cfg = _train_cfg()
  half = train_dflash(lm, params, config, data, None, cfg, str(tmp_path), stop_at_step=20)
  assert half["final"] is None and half["agreement"] is None
  resumed = train_dflash(lm, params, config, data, None, cfg, str(tmp_path))
  for a, b in zip(jax.tree_util.tree_leaves(trained["params"]),
                  jax.tree_util.tree_leaves(resumed["params"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(ValueError, match="anchors"):
    train_dflash(lm, params, config, data, None, cfg, str(tmp_path), loss=DFlashLoss(anchors=4))
  pos, ok = anchor_positions(data.generated, 6, np.random.default_rng(0))
  assert ok.all() and (pos >= 1).all()
  rows = np.arange(len(pos))[:, None]
  assert data.generated[rows, pos].all() and data.generated[rows, pos + 1].all()


def test_misuse_is_named():
  lm, params = target()
  config = _config(lm)
  with pytest.raises(ValueError, match=r"block must be an int in \[2, 16\], got 17"):
    _config(lm, block=17)
  with pytest.raises(ValueError, match="target_layers must name at least one"):
    _config(lm, layers=())
  with pytest.raises(ValueError, match=r"target_layers must be distinct, got \[1, 1\]"):
    _config(lm, layers=(1, 1))
  with pytest.raises(ValueError, match="tree depth 3 exceeds the 2 drafts of a block of 3"):
    DFlash(_config(lm, block=3), lm, TokenTree.chain(3))
  with pytest.raises(ValueError, match="children='top_k' applies to a tree"):
    DFlash(config, lm, None, "top_k")
  with pytest.raises(ValueError, match="children must be one of"):
    DFlash(config, lm, TREE, "best")
  with pytest.raises(TypeError, match="config must be a DFlashConfig"):
    DFlash(specjax.drafters.EagleConfig(d_model=32, vocab_size=64), lm)
  dp = {"head": _random_head(config), "target": params}
  prompts, lengths = ragged_prompts(batch=2)
  run = functools.partial(specjax.speculative_generate, lm, params, prompts=prompts,
                          prompt_lengths=lengths, max_new_tokens=4, sampling=GREEDY)
  with pytest.raises(ValueError, match=r"gamma must be in \[1, 3\] for a block of 4 slots"):
    run(draft=DFlash(config, lm), draft_params=dp, gamma=4, max_new_tokens=8)
  with pytest.raises(ValueError, match=r"layers must be block indices in \[0, 2\)"):
    run(draft=DFlash(_config(lm, layers=(0, 5)), lm), draft_params=dp, gamma=2)
  other = {"head": init_dflash(_config(lm, num_layers=1), jax.random.key(0)), "target": params}
  with pytest.raises(ValueError, match="draft_params"):
    run(draft=DFlash(config, lm), draft_params=other, gamma=2)
