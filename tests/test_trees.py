"""Token trees: topology, exact batched verification (greedy and recursive
rejection sampling with i.i.d., without-replacement and deterministic
children), compaction of the accepted path, single-chain equivalence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from exact_helpers import assert_tree_drafter_exact, exact_lm

from specjax.generation import SpeculativeDecoder
from specjax.measure.compiles import TraceCounter
from specjax.sampling import GREEDY, SamplingConfig
from specjax.tree import TokenTree
from specjax.verify import rejection_verify, tree_verify
from tiny import EOS, ragged_prompts, target
from tree_drafters import MODES, TableTree

TREE = TokenTree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)])


def _table(vocab, seed=0, scale=2.0):
  return {"logits": jnp.asarray(np.random.default_rng(seed).normal(size=(vocab, vocab)) * scale,
                                jnp.float32)}


def test_topology():
  t = TREE
  assert t.size == 9 and t.depth == 3
  assert t.parents == (-1, 0, 0, 0, 1, 1, 2, 4, 5)
  np.testing.assert_array_equal(t.depths, [0, 1, 1, 1, 2, 2, 2, 3, 3])
  np.testing.assert_array_equal(t.children[0], [1, 2, 3])
  np.testing.assert_array_equal(t.children[1], [4, 5, -1])
  m = t.ancestor_mask
  assert m[7].tolist() == [True, True, False, False, True, False, False, True, False]
  assert t.paths()[7] == (0, 0, 0)
  lay = t.layout()
  assert lay.is_tree and not lay.is_plain_chain and lay.chain_len == 3
  chain = TokenTree.chain(3)
  assert chain.parents == (-1, 0, 1, 2) and chain.layout().is_plain_chain
  with pytest.raises(ValueError, match="topologically ordered"):
    TokenTree((-1, 2, 0))
  with pytest.raises(ValueError, match="its own parent"):
    TokenTree((-1, 1))
  with pytest.raises(ValueError, match=r"parents\[0\] must be -1"):
    TokenTree((0, 0))
  with pytest.raises(ValueError, match="no parent path"):
    TokenTree.from_paths([(0, 1)])
  with pytest.raises(ValueError, match="at least one node"):
    TokenTree((-1,)).layout()


def test_a_chain_tree_is_the_chain_rule():
  """Same drafts, distributions and keys: tree_verify on a chain makes the
  rejection rule's decisions, token for token."""
  b, g, v = 256, 4, 6
  rng = np.random.default_rng(0)
  p = jax.nn.softmax(jnp.asarray(rng.normal(size=(b, g, v)), jnp.float32), -1)
  q = jax.nn.softmax(jnp.asarray(rng.normal(size=(b, g + 1, v)), jnp.float32), -1)
  keys = jax.random.split(jax.random.key(0), b)
  drafts = jax.vmap(lambda k, pp: jax.random.categorical(k, jnp.log(pp)))(keys, p).astype(jnp.int32)
  n_ref, next_ref = rejection_verify(keys, drafts, p, q)
  tree = TokenTree.chain(g)
  tokens = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), drafts], axis=1)
  probs = jnp.concatenate([jnp.zeros((b, 1, v)), p], axis=1)
  path, n, nxt = tree_verify(keys, tokens, jnp.ones((b, g + 1), bool), q,
                             jnp.asarray(tree.children), g, probs)
  np.testing.assert_array_equal(n, n_ref)
  np.testing.assert_array_equal(nxt, next_ref)
  np.testing.assert_array_equal(path, np.where(np.arange(g)[None] < np.asarray(n)[:, None],
                                               np.arange(1, g + 1)[None], 0))
  assert 0 < int((n == 0).sum()) and 0 < int((n == g).sum())
  # Per-row children tables (a dynamic tree's `[B, N, C]`) make the same decisions as the
  # static `[N, C]` one: C read from the last axis (read as N, a rejected sampled child
  # was tried again, biasing the output).
  rows = jnp.broadcast_to(jnp.asarray(tree.children), (b,) + tree.children.shape)
  path2, n2, nxt2 = tree_verify(keys, tokens, jnp.ones((b, g + 1), bool), q, rows, g, probs)
  np.testing.assert_array_equal(n2, n_ref)
  np.testing.assert_array_equal(nxt2, next_ref)
  np.testing.assert_array_equal(path2, path)


def test_the_greedy_walk_makes_the_rejection_rules_decisions():
  """One-hot target distributions: `greedy=True` (argmaxes only) gives what the
  generic rule gives with any keys, for one-hot and sampled proposals, static and
  per-row children tables, with repeated and invalid children."""
  b, v = 512, 5
  rng = np.random.default_rng(1)
  tree = TokenTree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 0, 0),
                               (0, 1, 0), (1, 0, 0)])
  n = tree.size
  tokens = jnp.asarray(rng.integers(0, v, size=(b, n)), jnp.int32)   # siblings may repeat
  valid = jnp.asarray(rng.random((b, n)) < 0.85)
  q = jax.nn.one_hot(jnp.asarray(rng.integers(0, v, size=(b, n))), v, dtype=jnp.float32)
  p = jax.nn.softmax(jnp.asarray(rng.normal(size=(b, n, v)) * 2, jnp.float32), -1)
  keys = jax.random.split(jax.random.key(3), b)
  for children in (jnp.asarray(tree.children),
                   jnp.broadcast_to(jnp.asarray(tree.children), (b,) + tree.children.shape)):
    for probs in (None, p):
      ref = tree_verify(keys, tokens, valid, q, children, tree.depth, probs)
      got = tree_verify(keys, tokens, valid, q, children, tree.depth, probs, greedy=True)
      for r, g in zip(ref, got):
        np.testing.assert_array_equal(g, r)
      assert {0, 1, 2, 3} <= set(np.asarray(ref[1]).tolist())   # every depth reached


@pytest.fixture(scope="module")
def greedy_ref():
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=8)
  out = specjax.generate(lm, params, prompts, lengths, max_new_tokens=20, sampling=GREEDY,
                         eos_id=EOS)
  lens = np.asarray(out.lengths)
  assert (lens < 20).any() and (lens == 20).any()
  return prompts, lengths, out


@pytest.mark.parametrize("mode", MODES)
def test_greedy_tree_equals_autoregressive(greedy_ref, mode):
  prompts, lengths, ref = greedy_ref
  lm, params = target()
  drafter = TableTree(TREE, mode, node_limit=(9, 4, 1, 7))
  # The target's own argmax table makes accepts likely on some rows.
  out = specjax.speculative_generate(lm, params, drafter, _table(lm.vocab_size, seed=3), prompts,
                                     lengths, max_new_tokens=20, sampling=GREEDY, eos_id=EOS)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  hist = np.asarray(out.stats.accepted_hist)
  assert hist.shape[1] == TREE.depth + 1
  np.testing.assert_array_equal(hist.sum(1), np.asarray(out.stats.target_calls) - 1)


def test_greedy_tree_t5_equals_autoregressive():
  from specjax.models.t5 import T5, t5_config
  t5 = T5(t5_config("t5-tiny", vocab_size=64))
  params = t5.init(jax.random.PRNGKey(0))
  prompts, lengths = ragged_prompts(batch=4)
  ref = specjax.generate(t5, params, prompts, lengths, max_new_tokens=12, sampling=GREEDY)
  for mode in ("deterministic", "iid"):
    out = specjax.speculative_generate(t5, params, TableTree(TREE, mode), _table(64, seed=5),
                                       prompts, lengths, max_new_tokens=12, sampling=GREEDY)
    np.testing.assert_array_equal(out.tokens, ref.tokens)


def test_rows_accept_different_depths_and_compaction_equals_a_fresh_prefill():
  """A self-drafting tree (the table is the target's own argmax after each
  token is not available; use a deterministic tree whose first branch is the
  target's greedy path by construction): rows accept different depths in one
  iteration, and the committed cache equals a prefill of the accepted
  sequence."""
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=4, seed=7)
  # A bigram table built from the target's own greedy choices on these prompts
  # makes the first branch right often and the others wrong.
  out = specjax.generate(lm, params, prompts, lengths, max_new_tokens=24, sampling=GREEDY)
  logits = np.full((lm.vocab_size, lm.vocab_size), -5.0, np.float32)
  toks = np.asarray(out.tokens)
  for row in toks:
    for a, b in zip(row[:-1], row[1:]):
      logits[a, b] = 5.0
  drafter = TableTree(TREE, "deterministic", node_limit=(9, 9, 4, 2))
  dec = SpeculativeDecoder(lm, drafter, TREE.depth, GREEDY, 24)
  need = specjax.required_cache_len(lm, prompts.shape[1], 24, TREE.size - 1)
  keys = jax.random.split(jax.random.key(0), 4)
  state = jax.jit(dec.init_state)(params, {"logits": jnp.asarray(logits)}, prompts, lengths, keys,
                                  lm.init_cache(4, need), drafter.alloc(4, 0, need, 3))
  step = jax.jit(dec.step)
  depths = set()
  for _ in range(6):
    before = np.asarray(state.stats.accepted)
    state = step(params, {"logits": jnp.asarray(logits)}, state)
    gained = np.asarray(state.stats.accepted) - before
    if len(set(gained.tolist())) > 1:
      depths.add(tuple(gained.tolist()))
  assert depths, "rows should accept different depths in some iteration"
  # The committed cache equals a fresh prefill of prompt + committed tokens.
  for b in range(4):
    n = int(state.out_len[b])
    stream = list(np.asarray(prompts[b, :lengths[b]])) + list(np.asarray(state.tokens[b, :n - 1]))
    fresh = lm.init_cache(1, need)
    _, _, fresh = lm.prefill(params, jnp.asarray([stream], jnp.int32), jnp.asarray([len(stream)]),
                             fresh)
    m = len(stream)
    assert int(state.seq_len[b]) == m
    np.testing.assert_allclose(np.stack(state.target_cache.k)[:, b, ..., :m],
                               np.stack(fresh.k)[:, 0, ..., :m], atol=1e-5)
    np.testing.assert_allclose(np.stack(state.target_cache.v)[:, b, :, :m],
                               np.stack(fresh.v)[:, 0, :, :m], atol=1e-5)


def test_no_retrace_and_misuse():
  lm, params = target()
  drafter = TableTree(TREE, "iid")
  kw = dict(max_new_tokens=8, sampling=SamplingConfig(0.9))
  p1, l1 = ragged_prompts(batch=4, seed=1)
  p2, l2 = ragged_prompts(batch=4, seed=2)
  table = _table(lm.vocab_size)
  specjax.speculative_generate(lm, params, drafter, table, p1, l1, key=jax.random.key(0), **kw)
  with TraceCounter() as traces:
    specjax.speculative_generate(lm, params, drafter, table, p2, l2, key=jax.random.key(1), **kw)
  assert traces.decode_loops == 0, traces.counts
  with pytest.raises(ValueError, match=r"target call holds 9 tokens"):
    specjax.speculative_generate(lm, params, drafter, table, p1, l1, key=jax.random.key(0),
                                 cache_len=20, **kw)


# ------------------------------------------------------------------ exactness

PROMPT = [3, 1, 4]
SMALL_TREE = TokenTree.from_paths([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)])
CONFIGS = [SamplingConfig(1.0), SamplingConfig(0.7, top_p=0.9)]


# Children drawn from the draft's distribution (with replacement unfiltered,
# without replacement under temperature / top-p) and deterministic (top-k)
# children, one-hot proposals, filtered: each rule once, both settings covered.
TREE_CASES = [("iid", CONFIGS[0]), ("without", CONFIGS[1]), ("deterministic", CONFIGS[1])]


@pytest.mark.parametrize("mode,cfg", TREE_CASES, ids=lambda x: str(x))
def test_tree_sampling_is_exact_and_the_control_is_caught(mode, cfg):
  lm, params = exact_lm()
  assert_tree_drafter_exact(lm, params, TableTree(SMALL_TREE, mode),
                            _table(lm.vocab_size, seed=11, scale=1.0), PROMPT, cfg, 5)


def test_draw_children_gives_each_child_its_proposal():
  from specjax.tree import draw_children
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]], jnp.float32))
  u = jnp.asarray([[0.1, 0.1, 0.99]], jnp.float32)   # inverse CDF: token 0, then ...
  t1 = SamplingConfig(1.0)
  tok, probs, valid = draw_children(logits, t1, 3, u, "iid")
  np.testing.assert_array_equal(tok[0], [0, 0, 3])             # with replacement: 0 twice
  np.testing.assert_allclose(probs[0], np.tile([[0.5, 0.3, 0.15, 0.05]], (3, 1)), rtol=1e-5)
  tok, probs, valid = draw_children(logits, t1, 3, u, "without")
  np.testing.assert_array_equal(tok[0], [0, 1, 3])             # 0.1 of (0.6, 0.3, 0.1) → 1
  np.testing.assert_allclose(probs[0, 1], [0, 0.6, 0.3, 0.1], rtol=1e-5)
  np.testing.assert_allclose(probs[0, 2], [0, 0, 0.75, 0.25], rtol=1e-5)
  assert valid.all()
  nucleus = SamplingConfig(1.0, top_p=0.4)                       # one token left: one child
  _, _, valid = draw_children(logits, nucleus, 2, u[:, :2], "without")
  np.testing.assert_array_equal(valid[0], [True, False])
  tok, probs, _ = draw_children(logits, GREEDY, 2, None, "without")   # T = 0: the top-k
  np.testing.assert_array_equal(tok[0], [0, 1])
  assert probs is None
  tok, probs, _ = draw_children(logits, t1, 2, None, "top_k")
  np.testing.assert_array_equal(tok[0], [0, 1])
  assert probs is None
  with pytest.raises(ValueError, match=r"mode must be one of \['top_k', 'iid', 'without'\]"):
    draw_children(logits, t1, 2, u, "beam")
