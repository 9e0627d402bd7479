"""EAGLE-1/2/3: the target's multi-layer features, the dynamic tree's arrays,
the head's incremental-vs-full parity (training-time test included), greedy
== AR for chains, static and dynamic trees, chi-square exactness with a
negative control, and training that learns and resumes exactly."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from exact_helpers import assert_tree_drafter_exact, exact_lm
from specjax.drafters.eagle import DynamicTree, Eagle
from specjax.models.eagle_head import (EagleConfig, fuse_features, init_eagle, pair_inputs, qkv,
                                       shared_weights)
from specjax.sampling import GREEDY, SamplingConfig
from specjax.training.eagle import (EagleLoss, _states, step_agreement, train_eagle,
                                   unrolled_outputs)
from specjax.training.heads import DistillData
from specjax.tree import TokenTree, dynamic_tree_arrays
from test_medusa import _train_cfg
from tiny import EOS, ragged_prompts, target

TREE = TokenTree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])


def _head(lm, version=1, seed=3, scale=1.0):
  layers = (0, 1) if version == 3 else ()
  config = EagleConfig(d_model=lm.config.d_model, vocab_size=lm.vocab_size, num_heads=2,
                       mlp_dim=64, feature_layers=layers)
  hp = init_eagle(config, jax.random.key(seed))
  keys = jax.random.split(jax.random.key(seed + 1), len(hp))
  hp = {k: v + scale * 0.3 * jax.random.normal(kk, v.shape) * (jnp.std(v) + 0.1)
        for (k, v), kk in zip(sorted(hp.items()), keys)}
  return config, hp


def test_target_returns_the_chosen_blocks_outputs():
  lm, params = target()
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 60, (2, 9)), jnp.int32)
  logits, h = lm.forward_with_hidden(params, tokens)
  logits2, taps = lm.forward_with_hidden(params, tokens, layers=(1, 0))
  np.testing.assert_allclose(logits, logits2, rtol=1e-6)
  e = lm.config.d_model
  assert taps.shape == (2, 9, 2 * e)
  # Block 1 is the last: its output, final-normed, is the final state.
  x = taps[..., :e]
  normed = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + lm.config.norm_eps)
  np.testing.assert_allclose(normed * params["final_norm"]["scale"], h, rtol=1e-4, atol=1e-5)
  assert not np.allclose(taps[..., e:], taps[..., :e])
  # Prefill + extend give the same states as the full forward.
  cache = lm.init_cache(2, 16)
  _, _, cache, hp = lm.prefill_with_hidden(params, tokens[:, :5], jnp.array([5, 5]), cache,
                                           layers=(1, 0))
  _, he, _ = lm.extend_with_hidden(params, tokens[:, 5:], cache, layers=(1, 0))
  np.testing.assert_allclose(jnp.concatenate([hp, he], 1), taps, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="block indices in"):
    lm.forward_with_hidden(params, tokens, layers=(2,))
  with pytest.raises(ValueError, match="distinct"):
    lm.forward_with_hidden(params, tokens, layers=(0, 0))


def prompt_state(lm, drafter, dp, prompts_BP, lengths_B, first_B, slots=24):
  """The head's state after the target's prefill of `prompts_BP` (pairs
  absorbed chunk by chunk, as `speculative_generate` does)."""
  b = prompts_BP.shape[0]

  def absorb(state, start, hidden_BCX):
    return drafter.absorb(dp, state, prompts_BP, lengths_B, start, hidden_BCX)
  _, _, _, state = lm.prefill_with_hidden(
      dp["target"], prompts_BP, lengths_B, lm.init_cache(b, slots),
      layers=drafter.hidden_layers, fold=(absorb, drafter.alloc(b, prompts_BP.shape[1], slots, 3)))
  return drafter.start(dp, state, prompts_BP, lengths_B, first_B, None)


@pytest.mark.parametrize("version", [1, 3])
def test_head_state_is_the_same_from_a_chunked_prefill(version):
  """The prompt's pairs absorbed chunk by chunk (first chunk, scanned chunks,
  a remainder) equal those of a one-call prefill: the head's keys and values
  of every valid slot, the last feature and the lengths, on ragged rows; and
  both equal the pairs written from the whole forward's features."""
  lm, params = target()
  config, hp = _head(lm, version=version)
  drafter = Eagle(config, TokenTree.chain(3), lm)
  dp = {"head": hp, "target": params}
  prompts = jnp.asarray(np.random.default_rng(2).integers(6, 60, (3, 13)), jnp.int32)
  lengths = jnp.array([13, 9, 4])
  first = jnp.array([7, 8, 9])
  whole = prompt_state(lm, drafter, dp, prompts, lengths, first)
  chunked_lm = specjax.DecoderLM(lm.config.replace(prefill_chunk=4))
  chunked = prompt_state(chunked_lm, Eagle(config, TokenTree.chain(3), chunked_lm), dp, prompts,
                         lengths, first)
  np.testing.assert_array_equal(whole.lengths_B, [12, 8, 3])
  np.testing.assert_array_equal(chunked.lengths_B, whole.lengths_B)
  np.testing.assert_array_equal(chunked.root_B, first)
  np.testing.assert_allclose(chunked.feat_BE, whole.feat_BE, rtol=1e-5, atol=1e-6)
  _, feats = lm.forward_with_hidden(params, prompts, layers=config.feature_layers)
  f = fuse_features(config, hp, feats)
  for b, n in enumerate(np.asarray(lengths)):
    np.testing.assert_allclose(whole.feat_BE[b], f[b, n - 1], rtol=1e-4, atol=1e-5)
    for buf in ("k_BSHD", "v_BSHD"):
      np.testing.assert_allclose(getattr(chunked, buf)[b, :n - 1], getattr(whole, buf)[b, :n - 1],
                                 rtol=1e-5, atol=1e-6)
  # The pairs themselves: slot t holds (f_t, x_{t+1}).
  emb, _ = shared_weights(lm, params)
  x = pair_inputs(config, hp, emb, f[:, :-1], prompts[:, 1:])
  _, k, _ = qkv(config, hp, x, jnp.broadcast_to(jnp.arange(12)[None], (3, 12)))
  np.testing.assert_allclose(whole.k_BSHD[0, :12], k[0], rtol=1e-4, atol=1e-5)


def test_chunked_prefill_never_holds_the_prompts_features_whole():
  """The head absorbs the prompt chunk by chunk inside the target's prefill:
  what the compiled prefill allocates stays well below the `[B, P, X]`
  features (an EAGLE-3 head at 32 rows x 32k: 25 GB), which the states
  returned whole (no fold) take."""
  b, p, x = 4, 2048, 256
  lm = specjax.DecoderLM(specjax.decoder_config(
      "tiny", vocab_size=64, num_layers=2, d_model=128, num_heads=2, num_kv_heads=1,
      mlp_dim=128, prefill_chunk=16))
  config = EagleConfig(d_model=128, vocab_size=64, num_heads=2, mlp_dim=64,
                       feature_layers=(0, 1))
  drafter = Eagle(config, TokenTree.chain(3), lm)
  dp = {"head": init_eagle(config, jax.random.key(3)), "target": lm.init(jax.random.key(0))}
  prompts, lengths = jnp.ones((b, p), jnp.int32), jnp.full((b,), p)
  cache, state = lm.init_cache(b, p + 32), drafter.alloc(b, p, p + 32, 3)

  def folded(dp, cache, state):
    def absorb(st, start, hidden_BCX):
      return drafter.absorb(dp, st, prompts, lengths, start, hidden_BCX)
    return lm.prefill_with_hidden(dp["target"], prompts, lengths, cache, layers=(0, 1),
                                  fold=(absorb, state))[2:]

  def whole(dp, cache, state):
    return lm.prefill_with_hidden(dp["target"], prompts, lengths, cache, layers=(0, 1))[2:]

  def temps(f):
    """Bytes the program allocates beyond its donated inputs: temporaries and
    outputs that do not reuse an input's buffer."""
    m = jax.jit(f, donate_argnums=(1, 2)).lower(dp, cache, state).compile().memory_analysis()
    return m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
  features = b * p * x * 4
  assert temps(whole) > features  # the control: the states returned whole
  assert temps(folded) < features / 2


def test_dynamic_tree_arrays_match_the_static_tree():
  trees = [TREE, TokenTree.chain(4), TokenTree.from_paths([(0,), (1,), (1, 0), (1, 1)])]
  n = max(t.size for t in trees)
  parents = np.full((len(trees), n), 0, np.int32)
  for b, t in enumerate(trees):  # pad with children of the root
    parents[b, :t.size] = t.parents
  depths, anc, kids = dynamic_tree_arrays(jnp.asarray(parents), 3)
  for b, t in enumerate(trees):
    m = t.size
    np.testing.assert_array_equal(np.asarray(depths)[b, :m], t.depths)
    np.testing.assert_array_equal(np.asarray(anc)[b, :m, :m], t.ancestor_mask)
    c = t.children.shape[1]
    got = np.asarray(kids)[b, :m]
    got = np.where(got >= m, -1, got)  # padding nodes hang below the root
    np.testing.assert_array_equal(got[:, :c], t.children)


def test_head_drafting_equals_the_unrolled_training_forward():
  """Incremental vs full: the drafter's level calls (the head's cache from
  the prompt, the ancestors in the side buffer) give the training forward's
  step-1..3 outputs at the same base position (EAGLE-3, fused features)."""
  lm, params = target()
  config, hp = _head(lm, version=3)
  tokens = jnp.asarray(np.random.default_rng(1).integers(6, 60, (1, 12)), jnp.int32)
  _, feats = lm.forward_with_hidden(params, tokens, layers=config.feature_layers)
  emb, _ = shared_weights(lm, params)
  f = fuse_features(config, hp, feats)
  outs = unrolled_outputs(config, hp, emb, f, tokens, 3)
  drafter = Eagle(config, TokenTree.chain(3), lm)
  dp = {"head": hp, "target": params}
  t = 6  # the prompt is tokens[:t + 1]; the root pair is (f_t, x_{t+1})
  state = prompt_state(lm, drafter, dp, tokens[:, :t + 1], jnp.array([t + 1]), tokens[:, t + 1])
  assert int(state.lengths_B[0]) == t
  side_k, side_v = drafter._side(1, 4)
  feat, anc = state.feat_BE[:, None], np.zeros((1, 1, 4), bool)
  for j in range(3):
    anc = anc.copy()
    anc[0, 0, j] = True
    out, _, side_k, side_v = drafter._level(dp, state, feat, tokens[:, t + 1 + j][:, None],
                                            side_k, side_v, depth=j, slots=np.array([j]),
                                            anc_BTM=jnp.asarray(anc))
    np.testing.assert_allclose(out[0, 0], outs[j][0, t], rtol=2e-4, atol=2e-5)
    feat = out


@pytest.mark.parametrize("version,tree,children", [
    (1, TokenTree.chain(3), None),
    (1, DynamicTree(top_k=3, depth=3, nodes=7), None),
    (3, DynamicTree(top_k=2, depth=4, nodes=6), None)],
    ids=["chain_default_children", "dynamic", "eagle3"])   # static trees: tests/test_block.py
def test_eagle_greedy_equals_autoregressive(version, tree, children):
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=8)
  ref = specjax.generate(lm, params, prompts, lengths, max_new_tokens=20, sampling=GREEDY,
                         eos_id=EOS)
  config, hp = _head(lm, version)
  out = specjax.speculative_generate(lm, params, Eagle(config, tree, lm, children),
                                     {"head": hp, "target": params}, prompts, lengths,
                                     max_new_tokens=20, sampling=GREEDY, eos_id=EOS)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  assert np.asarray(out.stats.accepted_hist).shape == (8, tree.depth + 1)
  assert int(np.asarray(out.stats.target_calls).sum()) > 0


def test_dynamic_tree_proposal_is_a_valid_per_row_tree():
  lm, params = target()
  config, hp = _head(lm)
  dt = DynamicTree(top_k=3, depth=3, nodes=8)
  drafter = Eagle(config, dt, lm)
  dp = {"head": hp, "target": params}
  state = drafter.alloc(4, 4, 32, 3).replace(
      lengths_B=jnp.array([3, 5, 0, 7]), feat_BE=jax.random.normal(jax.random.key(0), (4, 32)))
  inp = specjax.drafters.DraftInput(
      seq_len_B=jnp.array([4, 6, 1, 8]), pending_B=jnp.array([7, 9, 11, 13]),
      prev_B=jnp.zeros(4, jnp.int32), done_B=jnp.zeros(4, bool), step=jnp.int32(1))
  prop, _ = drafter.propose(dp, state, inp, None, GREEDY, 3)
  parents = np.asarray(prop.node_parents_BT)
  assert parents.shape == (4, 9) and (parents[:, 0] == -1).all()
  assert (parents[:, 1:] < np.arange(1, 9)[None]).all() and (parents[:, 1:] >= 0).all()
  assert np.asarray(prop.node_valid_BT).all()
  depths = np.asarray(dynamic_tree_arrays(jnp.asarray(parents), 3)[0])
  assert depths.max() <= 3 and (depths[:, 1:] >= 1).all()
  tokens = np.asarray(prop.tokens_BT)
  for b in range(4):  # siblings are distinct tokens; at most top_k children each
    for p in range(9):
      kids = tokens[b, 1:][parents[b, 1:] == p]
      assert len(set(kids.tolist())) == len(kids) <= 3


@pytest.mark.parametrize("children,expand,cfg", [(None, 1, SamplingConfig(1.0)),
                                                 ("iid", 0, SamplingConfig(0.7, top_p=0.9))],
                         ids=str)
def test_eagle2_sampling_is_exact_and_the_control_is_caught(children, expand, cfg):
  """EAGLE-2's sampled tree: children drawn without replacement, the best
  node of each level expanded, the last level cut to `nodes`; i.i.d.
  children, every node expanded. (Its top-k tree: one-hot proposals, as the
  other deterministic trees.)"""
  lm, params = exact_lm()
  config, hp = _head(lm)
  drafter = Eagle(config, DynamicTree(top_k=2, depth=3, nodes=5, expand=expand), lm, children)
  assert_tree_drafter_exact(lm, params, drafter, {"head": hp, "target": params}, [3, 1, 4],
                            cfg, 3)


def test_sampled_dynamic_tree_is_grown_by_path_probability():
  """At T > 0: the root's top_k drawn children, then each level's m best
  nodes (by the head's path log-probability) expanded with c children; all
  drawn children kept, siblings distinct without replacement."""
  lm, params = target()
  config, hp = _head(lm)
  assert DynamicTree(top_k=4, depth=3, nodes=11).sampled_expansion == (4, 1)   # the default
  dt = DynamicTree(top_k=4, depth=3, nodes=11, expand=2)
  assert dt.sampled_expansion == (2, 2)
  with pytest.raises(ValueError, match=r"expand \(3\) must divide top_k \(4\)"):
    DynamicTree(top_k=4, depth=3, nodes=11, expand=3)
  drafter = Eagle(config, dt, lm)
  assert drafter.child_mode == "without" and not drafter.deterministic
  dp = {"head": hp, "target": params}
  state = drafter.alloc(3, 4, 32, 3).replace(
      lengths_B=jnp.array([3, 5, 0]), feat_BE=jax.random.normal(jax.random.key(0), (3, 32)))
  inp = specjax.drafters.DraftInput(
      seq_len_B=jnp.array([4, 6, 1]), pending_B=jnp.array([7, 9, 11]),
      prev_B=jnp.zeros(3, jnp.int32), done_B=jnp.zeros(3, bool), step=jnp.int32(1))
  u = jax.random.uniform(jax.random.key(1), (3, 12))
  cfg = SamplingConfig(1.0)
  prop, _ = drafter.propose(dp, state, inp, u, cfg, 3)
  parents, tokens = np.asarray(prop.node_parents_BT), np.asarray(prop.tokens_BT)
  assert parents.shape == (3, 12) and np.asarray(prop.node_probs_BTV).shape == (3, 12, 64)
  np.testing.assert_array_equal(parents[:, :5], [[-1, 0, 0, 0, 0]] * 3)
  # Levels 2 and 3: two expanded nodes of the level above, two children each; the last
  # level cut to 11 nodes (its second expansion keeps one child).
  for b in range(3):
    lvl2, lvl3 = parents[b, 5:9], parents[b, 9:]
    assert lvl2[0] == lvl2[1] != lvl2[2] == lvl2[3] and set(lvl2) <= {1, 2, 3, 4}
    assert lvl3[0] == lvl3[1] != lvl3[2] and set(lvl3) <= {5, 6, 7, 8}
    for p in range(12):   # siblings distinct (drawn without replacement)
      kids = tokens[b][parents[b] == p]
      assert len(set(kids.tolist())) == len(kids)
  # The expanded nodes are the best by path log-probability under the head.
  _, logp, _, _ = drafter._level(
      dp, state, state.feat_BE[:, None], inp.pending_B[:, None], *drafter._side(3, 5), depth=0,
      slots=np.array([0]), anc_BTM=jnp.broadcast_to(np.eye(5, dtype=bool)[:1][None], (3, 1, 5)))
  lp1 = np.take_along_axis(np.asarray(logp[:, 0]), tokens[:, 1:5], axis=1)
  best = np.argsort(-lp1, axis=1)[:, :2] + 1
  np.testing.assert_array_equal(np.sort(parents[:, [5, 7]], 1), np.sort(best, 1))
  # At T = 0 the same drafter grows EAGLE-2's top-k tree.
  greedy, _ = drafter.propose(dp, state, inp, u, GREEDY, 3)
  top, _ = Eagle(config, dt, lm, "top_k").propose(dp, state, inp, None, GREEDY, 3)
  np.testing.assert_array_equal(greedy.tokens_BT, top.tokens_BT)
  np.testing.assert_array_equal(greedy.node_parents_BT, top.node_parents_BT)


@pytest.mark.parametrize("children,cfg", [("without", SamplingConfig(0.7, top_p=0.9))], ids=str)
def test_sampled_children_are_exact_and_the_control_is_caught(children, cfg):
  """A static tree's sampled children (i.i.d. at T = 1: the same drawing
  code under a block head's one call, tests/test_block.py)."""
  lm, params = exact_lm()
  config, hp = _head(lm)
  drafter = Eagle(config, TokenTree.from_paths([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]), lm,
                  children)
  assert_tree_drafter_exact(lm, params, drafter, {"head": hp, "target": params}, [3, 1, 4], cfg,
                            3)


def test_eagle_misuse():
  lm, params = target()
  config, hp = _head(lm)
  prompts, lengths = ragged_prompts(batch=2)
  with pytest.raises(TypeError, match="TokenTree or a DynamicTree"):
    Eagle(config, 3, lm)
  with pytest.raises(ValueError, match="needs the target"):
    Eagle(config, TokenTree.chain(2), None)
  with pytest.raises(ValueError, match=r"children must be one of \['top_k', 'iid', 'without'\]"):
    Eagle(config, TokenTree.chain(2), lm, "sampled")
  with pytest.raises(ValueError, match=r"draws top_k x depth = 4 nodes at T > 0, fewer than "
                                       r"nodes=5 \(use nodes <= 4, or children='top_k'\)"):
    Eagle(config, DynamicTree(top_k=2, depth=2, nodes=5), lm)
  Eagle(config, DynamicTree(top_k=2, depth=2, nodes=5), lm, "top_k")
  with pytest.raises(ValueError, match="exceeds the 6 candidates"):
    DynamicTree(top_k=2, depth=2, nodes=7)
  wrong = Eagle(EagleConfig(d_model=32, vocab_size=99), TokenTree.chain(2), lm)
  with pytest.raises(ValueError, match="vocab_size"):
    specjax.speculative_generate(lm, params, wrong, {"head": hp, "target": params}, prompts,
                                 lengths, max_new_tokens=4, sampling=GREEDY)
  deep = Eagle(EagleConfig(d_model=32, vocab_size=lm.vocab_size, feature_layers=(0, 5)),
               TokenTree.chain(2), lm)
  with pytest.raises(ValueError, match=r"block indices in \[0, 2\)"):
    specjax.speculative_generate(lm, params, deep, {"head": hp, "target": params}, prompts,
                                 lengths, max_new_tokens=4, sampling=GREEDY)
  pre = specjax.prefill(lm, params, prompts, lengths, max_new_tokens=4, gamma=2,
                        sampling=GREEDY)
  with pytest.raises(ValueError, match="shared prefill"):
    specjax.speculative_generate(lm, params, Eagle(config, TokenTree.chain(2), lm),
                                 {"head": hp, "target": params}, prompts, lengths,
                                 max_new_tokens=4, sampling=GREEDY, prefilled=pre)


def greedy_distill_data(lm, params):
  """(prompts, lengths, greedy output, DistillData): 16 ragged prompts and
  the target's 18 greedy tokens after each, as training sequences."""
  prompts, lengths = ragged_prompts(batch=16, max_len=6, seed=5)
  gen = specjax.generate(lm, params, prompts, lengths, max_new_tokens=18, sampling=GREEDY)
  tokens = np.zeros((16, 24), np.int32)
  generated = np.zeros((16, 24), bool)
  for i, (p, m) in enumerate(zip(np.asarray(prompts), np.asarray(lengths))):
    tokens[i, :m] = p[:m]
    tokens[i, m:m + 18] = np.asarray(gen.tokens)[i]
    generated[i, m:m + 18] = True
  return prompts, lengths, gen, DistillData(tokens=tokens, generated=generated)


@pytest.mark.parametrize("version", [1, 3])
def test_eagle_training_learns_and_resumes_exactly(tmp_path, version):
  """On the target's own greedy continuations the head learns to agree with
  it; a killed run resumes to the same weights; other settings refuse."""
  lm, params = target()
  prompts, lengths, gen, data = greedy_distill_data(lm, params)
  tokens = data.tokens
  config, _ = _head(lm, version)
  loss = EagleLoss.for_version(version, unroll=2)
  cfg = _train_cfg(steps=40, learning_rate=1e-2)
  feats, final = _states(lm, params, config, tokens)
  before = step_agreement(config, dataclasses.replace(loss, unroll=3),
                          init_eagle(config, jax.random.key(0)), shared_weights(lm, params),
                          feats, final, data)
  full = train_eagle(lm, params, config, data, None, cfg, str(tmp_path / "a"), loss=loss)
  assert full["final"] and full["agreement"].shape == (3,)
  assert full["agreement"][0] > before[0] + 0.15, (before, full["agreement"])
  # The record a run leaves beside its head (e.g. a prior for gamma="auto").
  assert specjax.drafters.read_agreement(full["final"]) == tuple(full["agreement"].tolist())
  if version == 3:   # resuming is the shared loop's (a block head's resume: test_block)
    half = train_eagle(lm, params, config, data, None, cfg, str(tmp_path / "b"), loss=loss,
                       stop_at_step=20)
    assert half["final"] is None
    resumed = train_eagle(lm, params, config, data, None, cfg, str(tmp_path / "b"), loss=loss)
    for a, b in zip(jax.tree_util.tree_leaves(full["params"]),
                    jax.tree_util.tree_leaves(resumed["params"])):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="learning_rate"):
      train_eagle(lm, params, config, data, None, _train_cfg(steps=40, learning_rate=3e-2),
                  str(tmp_path / "b"), loss=loss, stop_at_step=39)
  # The trained head drafts: greedy output unchanged, and it accepts.
  drafter, dp = specjax.drafters.load_eagle(full["final"], lm, params,
                                            DynamicTree(top_k=2, depth=3, nodes=6))
  out = specjax.speculative_generate(lm, params, drafter, dp, prompts, lengths,
                                     max_new_tokens=18, sampling=GREEDY)
  np.testing.assert_array_equal(out.tokens, gen.tokens)
  tau = float(np.asarray(out.stats.accepted).sum() / np.asarray(out.stats.target_calls).sum())
  assert tau > 0.5, tau


def test_an_agreement_record_is_read_or_named(tmp_path):
  from specjax.drafters import read_agreement
  assert read_agreement(str(tmp_path)) is None   # no record: None
  (tmp_path / "final").mkdir()
  path = tmp_path / "final" / "agreement.json"
  path.write_text('{"agreement_by_step": [0.8, 0.5]}')
  assert read_agreement(str(tmp_path)) == (0.8, 0.5)
  for bad in ('{"agreement_by_step": [1.5]}', '{"agreement_by_step": []}', '{"acc": [0.5]}',
              '{"agreement_by_step": [0.8,'):
    path.write_text(bad)
    with pytest.raises(ValueError, match="agreement.json"):
      read_agreement(str(tmp_path))
