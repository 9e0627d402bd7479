"""gamma="auto" for the drafters with a state of their own beyond a draft
model's cache: EAGLE and Medusa heads over static trees (plain steps hand
the head the target's hidden state; γ picks the tree's depth; EAGLE's
confidence stop) and PARD (`ParallelDraft`: catch-up after plain steps). The drafts after any
sequence of γ (0 included) equal those of a drafter started afresh on the
committed tokens; greedy == AR on ragged batches ending by EOS and by
length; chi-square with a negative control; rows independent and no
retrace; misuse named."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from exact_helpers import (N_SAMPLES, broken_tree_verify, counts_t2_t4, exact_lm, joint_t2_t4,
                           optimized_codegen)
from reference import chi_square_pvalue
from specjax.adaptive import AdaptiveGamma
from specjax.drafters import Eagle, Medusa, ParallelDraft
from specjax.drafters.eagle import DynamicTree
from specjax.generation import SpeculativeDecoder, _draft_input, check_adaptive
from specjax.sampling import GREEDY, SamplingConfig
from specjax.tree import TokenTree
from test_adaptive import assert_auto_greedy
from test_eagle import TREE, _head
from test_medusa import TREE as MEDUSA_TREE
from test_medusa import _heads as _medusa_heads
from test_exactness import residual_from_q_verify
from tiny import (EOS, assert_rows_independent_and_no_retrace, noisy_draft, ragged_prompts,
                  target)

T1 = SamplingConfig(1.0)


def _drafter(name, lm=None, params=None):
  """(drafter, draft params, Γ) of each kind, over `lm` (default: tiny.target)."""
  if lm is None:
    lm, params = target()
  if name == "pard":
    if lm.vocab_size == target()[0].vocab_size:
      dm, dp = noisy_draft()
    else:   # a perturbed copy of the target (the exact model)
      leaves, tree = jax.tree_util.tree_flatten(params)
      keys = jax.random.split(jax.random.PRNGKey(4), len(leaves))
      dm, dp = lm, jax.tree_util.tree_unflatten(tree, [
          x + 0.5 * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    return ParallelDraft(dm, 0), dp, (0, 1, 2, 4)
  if name == "medusa_tree":   # sampled children at T > 0 (top-k at T = 0)
    config, dp = _medusa_heads(lm, params, k=3, scale=1.0)
    return Medusa(config, MEDUSA_TREE, children="without"), dp, (0, 1, 2, 3)
  version = 3 if name == "eagle3_tree" else 1
  config, hp = _head(lm, version)
  tree = {"eagle_chain": TokenTree.chain(4), "eagle3_tree": TREE,
          "eagle_stop": TokenTree.chain(4)}[name]
  stop = 0.2 if name == "eagle_stop" else 0.0
  gammas = (0, 1, 2, 3) if tree.depth == 3 else (0, 1, 2, 4)
  return Eagle(config, tree, lm, stop_below=stop), {"head": hp, "target": params}, gammas


@functools.lru_cache(maxsize=None)
def _jitted(dec, dp_is_none=False):
  del dp_is_none
  return (jax.jit(dec.init_state), jax.jit(lambda tp, dp, s, c: dec.step(tp, dp, s, c)),
          jax.jit(dec.catch_up))


@pytest.mark.parametrize("name", ["eagle_chain", "eagle3_tree", "pard"])
def test_drafts_after_any_gammas_equal_a_fresh_start(name):
  """Forced γ per iteration, plain steps among them; then the drafter's
  proposal (at T = 1: whole distributions) equals the proposal of the same
  drafter started afresh on each row's committed tokens (the target's and
  the drafter's prefill of them)."""
  lm, params = target()
  drafter, dp, gammas = _drafter(name)
  g = max(gammas)
  ad = AdaptiveGamma(gammas=gammas)
  dec = SpeculativeDecoder(lm, drafter, g, GREEDY, 40, adaptive=ad)
  init, step, catch_up = _jitted(dec)
  prompts, lengths = ragged_prompts(batch=3)
  b, p = prompts.shape
  slots = specjax.required_cache_len(lm, p + 40, 40, drafter.layout(g).length - 1)
  keys = jax.random.split(jax.random.key(0), b)
  state = init(params, dp, prompts, lengths, keys, lm.init_cache(b, slots, p),
               drafter.alloc(b, p, slots, g))
  costs = jnp.asarray([1.0, 1.1, 1.2, 1.3])
  for index in (0, 2, 0, 0, 3, 1, 0, 0, 0, 3, 2, 0, 1, 0, 0):
    state = state.replace(adapt=state.adapt.replace(
        branch=jnp.int32(index), limit_B=jnp.full((b,), gammas[index], jnp.int32)))
    state = step(params, dp, state, costs)
  assert not np.asarray(state.done).any()
  state = catch_up(dp, state)
  u = jax.random.uniform(jax.random.key(1), (b, drafter.layout(g).length))
  got, _ = drafter.propose(dp, state.draft_cache, _draft_input(state), u, T1, g)

  # Afresh: the committed tokens (the prompt, then the generated ones but the pending) as a prompt.
  seq = np.asarray(state.seq_len)
  out_len, toks = np.asarray(state.out_len), np.asarray(state.tokens)
  fresh_prompts = np.zeros((b, seq.max()), np.int32)
  for r in range(b):
    stream = np.concatenate([np.asarray(prompts)[r, :int(lengths[r])], toks[r, :out_len[r] - 1]])
    assert len(stream) == seq[r]
    fresh_prompts[r, :seq[r]] = stream
  fp = fresh_prompts.shape[1]
  fresh = init(params, dp, jnp.asarray(fresh_prompts), jnp.asarray(seq, jnp.int32), keys,
               lm.init_cache(b, slots, fp), drafter.alloc(b, fp, slots, g))
  np.testing.assert_array_equal(np.asarray(fresh.pending), np.asarray(state.pending))
  want, _ = drafter.propose(dp, fresh.draft_cache, _draft_input(fresh), u, T1, g)
  np.testing.assert_array_equal(np.asarray(got.tokens_BT), np.asarray(want.tokens_BT))
  probs = ("probs_BGV", "node_valid_BT") if name == "pard" else ("node_probs_BTV",
                                                                 "node_valid_BT")
  for field in probs:
    a, w = getattr(got, field), getattr(want, field)
    if a is not None:
      np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(w, np.float32),
                                 rtol=1e-4, atol=1e-5)
  # One target call per iteration (and the prefill); draft calls only where γ > 0.
  assert (np.asarray(state.stats.target_calls) == 16).all()
  assert (np.asarray(state.stats.accepted_hist)[:, 0] >= 8).all()
  if name != "eagle3_tree":   # chains: a call per draft (EAGLE), one per iteration (PARD),
    per = {0: 0, 1: 1, 2: 2 if name == "eagle_chain" else 1, 3: 4 if name == "eagle_chain" else 1}
    want = sum(per[i] for i in (0, 2, 0, 0, 3, 1, 0, 0, 0, 3, 2, 0, 1, 0, 0))
    # PARD's prefill and its 3 catch-ups (after 2-3 plain steps) are counted too.
    np.testing.assert_array_equal(state.stats.draft_calls, want + (4 if name == "pard" else 0))


@pytest.mark.parametrize("name,per_row", [("eagle_chain", False), ("eagle3_tree", True),
                                          ("eagle_stop", False), ("pard", True),
                                          ("medusa_tree", False)])
def test_greedy_equals_the_target_greedy(name, per_row):
  drafter, dp, _ = _drafter(name)
  for out in assert_auto_greedy(drafter, dp, per_row):
    trace = np.asarray(out.stats.gamma_trace)
    # Γ = (0, 1, 2, 4, 8) capped at what the drafter drafts: a tree's depth.
    top = {"eagle3_tree": 3, "medusa_tree": 3, "pard": 8}.get(name, 4)
    assert set(trace[trace >= 0]) <= {0, 1, 2, 4, 8, top}
    assert out.stats.accepted_hist.shape[1] == top + 1


def test_rows_independent_and_no_retrace():
  lm, params = target()
  for name in ("eagle_chain", "pard"):
    drafter, dp, _ = _drafter(name)
    assert_rows_independent_and_no_retrace(
        lm, params, drafter, dp, max_new_tokens=12, sampling=T1, eos_id=EOS,
        gamma=AdaptiveGamma(gammas=(0, 1, 2), per_row=True), gamma_costs=(1.0, 1.2, 1.3))


@pytest.mark.parametrize("name,cfg", [("eagle_stop", T1), ("eagle3_tree", T1),
                                      ("medusa_tree", SamplingConfig(0.7, top_p=0.9)),
                                      ("pard", SamplingConfig(0.7, top_p=0.9))], ids=str)
def test_sampling_is_exact_and_the_control_is_caught(name, cfg):
  """Tokens 2..4 of a prompt's 50k copies against the target's exact law,
  with choices that change with acceptance (Γ = (0, 1, 2)); the broken rule
  (a tree's rejected node resampled from the target, a chain's residual
  from q) is caught."""
  lm, params = exact_lm()
  drafter, dp, _ = _drafter(name, lm, params)
  prompt = [3, 1, 4, 3, 1]
  joint = joint_t2_t4(lm, params, prompt, cfg)
  # Medusa's first iteration drafts nothing (no hidden state yet), which leaves it two
  # iterations in 4 tokens: per-row choices and cheaper drafting make them differ.
  ad = AdaptiveGamma(gammas=(0, 1, 2), per_row=name == "medusa_tree")
  costs = (1.0, 1.15, 1.3) if name == "medusa_tree" else (1.0, 1.25, 1.6)
  prompts = jnp.asarray(np.tile(np.array(prompt, np.int32), (N_SAMPLES, 1)))
  lengths = jnp.full((N_SAMPLES,), len(prompt), jnp.int32)
  keys = jax.random.split(jax.random.key(5), N_SAMPLES)
  need = specjax.required_cache_len(lm, len(prompt), 4, drafter.layout(2).length - 1)
  broken = (dict(verify_fn=residual_from_q_verify) if name == "pard"
            else dict(tree_fn=broken_tree_verify))
  pvalues = {}
  for kind, fields in (("exact", {}), ("broken", broken)):
    dec = SpeculativeDecoder(lm, drafter, 2, cfg, 4, adaptive=ad, **fields)
    with optimized_codegen():
      out = dec.run(params, dp, prompts, lengths, keys, lm.init_cache(N_SAMPLES, need),
                    drafter.alloc(N_SAMPLES, len(prompt), need, 2), gamma_costs=costs)
    pvalues[kind] = chi_square_pvalue(counts_t2_t4(np.asarray(out.tokens), lm.vocab_size), joint)
    if kind == "exact":
      drafted = np.asarray(out.stats.drafted)
      assert 0 < int(np.asarray(out.stats.accepted).sum()) < drafted.sum()
      assert len(set(drafted.tolist())) >= 2   # rows drafted different amounts
  assert pvalues["exact"] > 1e-3 and pvalues["broken"] < 1e-6, pvalues


def test_the_confidence_stop_drafts_below_confident_nodes_only():
  """A chain at T = 1: node d + 1 is drafted where the head's top
  probability at every node before it (read off the unstopped proposal's
  distributions) is >= stop_below; the tokens drafted are the same."""
  lm, params = target()
  drafter, dp, _ = _drafter("eagle_chain")
  prompts, lengths = ragged_prompts(batch=8)
  b, p = prompts.shape
  dec = SpeculativeDecoder(lm, drafter, 4, T1, 8)
  state = jax.jit(dec.init_state)(params, dp, prompts, lengths,
                                  jax.random.split(jax.random.key(2), b),
                                  lm.init_cache(b, 32, p), drafter.alloc(b, p, 32, 4))
  u = jax.random.uniform(jax.random.key(3), (b, 5))
  free, _ = drafter.propose(dp, state.draft_cache, _draft_input(state), u, T1, 4)
  conf_BD = np.asarray(free.node_probs_BTV)[:, 1:].max(axis=-1)   # at nodes 0..3
  assert np.asarray(free.node_valid_BT).all()
  stop = float(np.median(conf_BD))
  stopped = Eagle(drafter.config, drafter.tree, lm, stop_below=stop)
  got, _ = stopped.propose(dp, state.draft_cache, _draft_input(state), u, T1, 4)
  want = np.concatenate([np.ones((b, 1), bool), np.cumprod(conf_BD >= stop, axis=1) > 0], 1)
  np.testing.assert_array_equal(np.asarray(got.node_valid_BT), want)
  assert 0 < want[:, 1:].sum() < want[:, 1:].size
  np.testing.assert_array_equal(np.asarray(got.tokens_BT)[want], np.asarray(free.tokens_BT)[want])
  # Every row stopped before node 2: its level is skipped, nothing drafted past node 1.
  top = Eagle(drafter.config, drafter.tree, lm, stop_below=0.999)
  none, _ = top.propose(dp, state.draft_cache, _draft_input(state), u, T1, 4)
  assert not np.asarray(none.node_valid_BT)[:, 1:].any()


def test_gamma_picks_the_depth_of_a_static_tree():
  tree = TokenTree.from_paths([(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 1)])
  assert tree.truncated(1).parents == (-1, 0, 0)
  assert tree.truncated(2).parents == (-1, 0, 0, 1, 1, 2)
  assert tree.truncated(3) is tree
  lm, params = target()
  config, _ = _head(lm)
  eagle = Eagle(config, tree, lm)
  assert eagle.gamma_limit == 3 and eagle.layout(2).length == 6
  assert eagle.calls_per_iteration(2) == 2 and eagle.calls_per_iteration(0) == 0
  medusa = Medusa(_medusa_heads(lm, params)[0], tree)
  assert medusa.adaptive and medusa.gamma_limit == 3
  assert [medusa.layout(g).length for g in (1, 2, 3)] == [3, 6, 7]
  assert medusa.layout(3) == tree.layout()   # the fixed-γ call: the whole tree
  with pytest.raises(ValueError, match="depth must be an int >= 1, got 0"):
    tree.truncated(0)


def test_misuse_is_named():
  lm, params = target()
  config, hp = _head(lm)
  prompts, lengths = ragged_prompts(batch=2)
  kw = dict(max_new_tokens=8, sampling=GREEDY, gamma="auto", gamma_costs=(1, 2, 3, 4, 5))
  with pytest.raises(ValueError, match="Eagle fixes its own call \\(a dynamic tree"):
    specjax.speculative_generate(lm, params, Eagle(config, DynamicTree(2, 2, 4), lm, "top_k"),
                                 {"head": hp, "target": params}, prompts, lengths, **kw)
  with pytest.raises(ValueError, match="goes beyond the 3 drafts Eagle can make per iteration: "
                     "use γ <= 3"):
    check_adaptive(Eagle(config, TREE, lm), AdaptiveGamma(gammas=(0, 2, 4)))
  with pytest.raises(ValueError, match="goes beyond the 3 drafts Medusa can make per "
                     "iteration: use γ <= 3"):
    check_adaptive(Medusa(_medusa_heads(lm, params)[0], MEDUSA_TREE), AdaptiveGamma((0, 2, 4)))
  for bad in (1.0, -0.1, np.nan):
    with pytest.raises(ValueError, match="stop_below must be a probability in \\[0, 1\\)"):
      Eagle(config, TREE, lm, stop_below=bad)
  for bad in ("0.5", True):
    with pytest.raises(TypeError, match="stop_below must be a real number in \\[0, 1\\)"):
      Eagle(config, TREE, lm, stop_below=bad)
  # A PARD draft trained for 1 slot: Γ capped at γ = 2.
  dm, dp = noisy_draft()
  out = specjax.speculative_generate(lm, params, ParallelDraft(dm, 0, 1), dp, prompts, lengths,
                                     **kw)
  assert out.stats.accepted_hist.shape == (2, 3)
