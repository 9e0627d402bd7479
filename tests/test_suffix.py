"""Suffix drafting (`specjax.drafters.SuffixDraft`): the trie of continuations
built by hand on rigged histories (frequency order, pruning, the depth cap,
the corpus and the other rows searched), greedy output equal to plain greedy
on a ragged batch ending by EOS and by length (shared rows, per-row, with a
corpus, and on T5), rows independent of the batch, exact sampling at T = 1
and T = 0.7 / top-p 0.9 (chi-square on 50k samples) with a broken verifier
caught, one compilation across prompts and corpora, misuse named."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from exact_helpers import assert_tree_drafter_exact, exact_lm
from specjax.drafters import LookupState, SuffixCorpus, SuffixDraft, outputs_of
from specjax.measure.compiles import TraceCounter
from specjax.sampling import GREEDY, SamplingConfig
from test_drafters import _repetitive_ragged
from tiny import EOS, VOCAB, ragged_prompts, target

A, B_, C, X, Y, Z, Q = 10, 11, 12, 20, 21, 22, 23
# "a b c" occurred three times before the row's tail: followed by X Y a, X Z a, Q a b.
HISTORY = [A, B_, C, X, Y, A, B_, C, X, Z, A, B_, C, Q, A, B_, C]


def _tree(drafter, history_rows, corpus=None):
  width = max(len(h) for h in history_rows) + 4
  hist = np.zeros((len(history_rows), width), np.int32)
  for i, h in enumerate(history_rows):
    hist[i, :len(h)] = h
  state = LookupState(history=jnp.asarray(hist),
                      length=jnp.asarray([len(h) for h in history_rows], jnp.int32))
  hay, starts, match = drafter.match(corpus, state)
  tokens, parents, valid = drafter.tree(hay, starts, match)
  return np.asarray(tokens), np.asarray(parents), np.asarray(valid), np.asarray(match)


def test_the_trie_orders_children_by_how_often_they_followed():
  d = SuffixDraft(max_match=3, nodes=6, depth=3, max_children=2, occurrences=8, min_prob=0.0,
                  share_rows=False)
  tokens, parents, valid, match = _tree(d, [HISTORY])
  assert match[0] == 3
  # Depth 1: X (2 of 3 occurrences) before Q; depth 2: Q's a (most recent), X's Z, X's Y;
  # depth 3: the budget (6 nodes) keeps the most recent occurrence's b.
  np.testing.assert_array_equal(tokens[0], [X, Q, A, Z, Y, B_])
  np.testing.assert_array_equal(parents[0], [0, 0, 2, 1, 1, 3])
  assert valid.all()


def test_pruning_by_children_probability_and_match_length():
  one_child = SuffixDraft(max_match=3, nodes=6, depth=3, max_children=1, occurrences=8,
                          min_prob=0.0, share_rows=False)
  tokens, parents, valid, _ = _tree(one_child, [HISTORY])
  np.testing.assert_array_equal(valid[0], [1, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(tokens[0, :3], [X, Z, A])   # Q and Y lose to their siblings
  np.testing.assert_array_equal(parents[0, :3], [0, 1, 2])
  frequent = SuffixDraft(max_match=3, nodes=6, depth=3, min_prob=0.5, share_rows=False)
  tokens, _, valid, _ = _tree(frequent, [HISTORY])
  np.testing.assert_array_equal(valid[0], [1, 0, 0, 0, 0, 0])   # only X carries 2 of 3
  assert tokens[0, 0] == X
  # A one-token match (the tail "c" with max_match 1) and factor 1: one level only.
  short = SuffixDraft(max_match=1, nodes=6, depth=3, factor=1.0, min_prob=0.0, share_rows=False)
  tokens, parents, valid, match = _tree(short, [HISTORY])
  assert match[0] == 1
  np.testing.assert_array_equal(tokens[0, :2], [X, Q])
  np.testing.assert_array_equal(valid[0], [1, 1, 0, 0, 0, 0])


def test_the_corpus_and_the_other_rows_are_searched():
  lonely = [30, 31, 32, A, B_]   # "a b" never occurred earlier in this row
  d = SuffixDraft(max_match=2, nodes=3, depth=3, min_prob=0.0, share_rows=False)
  _, _, valid, _ = _tree(d, [lonely])
  assert not valid.any()
  corpus = SuffixCorpus.build([[A, B_, C, Y, Y]], size=16, vocab_size=VOCAB)
  tokens, parents, valid, match = _tree(d, [lonely], corpus)
  assert match[0] == 2
  np.testing.assert_array_equal(tokens[0], [C, Y, Y])
  np.testing.assert_array_equal(parents[0], [0, 1, 2])
  assert valid.all()
  shared = SuffixDraft(max_match=2, nodes=3, depth=3, min_prob=0.0, share_rows=True)
  tokens, _, valid, _ = _tree(shared, [lonely, [A, B_, Z, X]])
  np.testing.assert_array_equal(tokens[0, :2], [Z, X])     # row 1's continuation
  np.testing.assert_array_equal(valid[0], [1, 1, 0])         # X ends row 1's history
  # The corpus keeps its most recent tokens, documents separated by -1.
  small = SuffixCorpus.build([[1, 2, 3], [4, 5]], size=5, vocab_size=VOCAB)
  np.testing.assert_array_equal(small.tokens_C, [3, -1, 4, 5, -1])
  np.testing.assert_array_equal(small.add([[6]], vocab_size=VOCAB).tokens_C, [4, 5, -1, 6, -1])


@pytest.fixture(scope="module")
def greedy_reference():
  lm, params = target()
  prompts, lengths = _repetitive_ragged()
  out = specjax.generate(lm, params, prompts, lengths, max_new_tokens=24, sampling=GREEDY,
                         eos_id=EOS)
  lens = np.asarray(out.lengths)
  assert (lens < 24).any() and (lens == 24).any(), lens  # EOS rows and max rows
  return prompts, lengths, out


@pytest.mark.parametrize("share_rows,with_corpus", [(True, False), (False, True)])
def test_greedy_equals_the_target_greedy(greedy_reference, share_rows, with_corpus):
  prompts, lengths, ref = greedy_reference
  lm, params = target()
  corpus = (SuffixCorpus.build(outputs_of(ref)[::-1], size=256, vocab_size=VOCAB)
            if with_corpus else None)
  out = specjax.speculative_generate(lm, params, SuffixDraft(share_rows=share_rows), corpus,
                                     prompts, lengths, max_new_tokens=24, sampling=GREEDY,
                                     eos_id=EOS)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  calls = np.asarray(out.stats.target_calls)
  np.testing.assert_array_equal(np.asarray(out.stats.accepted_hist).sum(1), calls - 1)
  per_call = (np.asarray(ref.lengths) - 1).sum() / (calls - 1).sum()
  if with_corpus:  # the corpus holds the very outputs: long runs get accepted (5.2 measured)
    assert per_call >= 4.0, per_call
  else:
    assert int(np.asarray(out.stats.accepted).sum()) > 0


def test_greedy_t5_equals_autoregressive():
  from specjax.models.t5 import T5, t5_config
  t5 = T5(t5_config("t5-tiny", vocab_size=VOCAB))
  params = t5.init(jax.random.PRNGKey(0))
  prompts, lengths = _repetitive_ragged(batch=4)
  ref = specjax.generate(t5, params, prompts, lengths, max_new_tokens=12, sampling=GREEDY)
  out = specjax.speculative_generate(t5, params, SuffixDraft(nodes=8, depth=4), None, prompts,
                                     lengths, max_new_tokens=12, sampling=GREEDY)
  np.testing.assert_array_equal(out.tokens, ref.tokens)


SMALL = SuffixDraft(nodes=6, depth=3, occurrences=4, share_rows=False)


def test_rows_are_independent_of_the_batch_without_sharing():
  lm, params = target()
  prompts, lengths = _repetitive_ragged(batch=4, seed=9)
  keys = jax.random.split(jax.random.key(11), 4)
  kw = dict(max_new_tokens=12, sampling=SamplingConfig(1.0), eos_id=EOS)
  drafter = SMALL
  corpus = SuffixCorpus.build([[7, 8, 9]], size=64, vocab_size=VOCAB)  # the next test's program
  full = specjax.speculative_generate(lm, params, drafter, corpus, prompts, lengths, key=keys,
                                      **kw)
  for r in (2,):
    alone = specjax.speculative_generate(lm, params, drafter, corpus, prompts[r:r + 1],
                                         lengths[r:r + 1], key=keys[r:r + 1], **kw)
    np.testing.assert_array_equal(alone.tokens[0], full.tokens[r])
  # Sharing the rows changes which drafts a row sees, never the greedy tokens (tested above).


def test_no_retrace_across_prompts_and_corpora():
  lm, params = target()
  kw = dict(max_new_tokens=12, sampling=SamplingConfig(1.0), eos_id=EOS)
  drafter = SMALL
  p1, l1 = _repetitive_ragged(batch=4, seed=20)
  p2, l2 = _repetitive_ragged(batch=4, seed=21)
  c1 = SuffixCorpus.build([[7, 8, 9]], size=64, vocab_size=VOCAB)
  specjax.speculative_generate(lm, params, drafter, c1, p1, l1, key=jax.random.key(0), **kw)
  with TraceCounter() as traces:
    specjax.speculative_generate(lm, params, drafter, c1.add([[1, 2, 3, 4]], VOCAB), p2, l2,
                                 key=jax.random.key(1), **kw)
  assert traces.decode_loops == 0, traces.counts


def test_misuse_is_named():
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=2)
  kw = dict(max_new_tokens=4, sampling=GREEDY)
  with pytest.raises(ValueError, match=r"min_match \(3\) must be <= max_match \(2\)"):
    SuffixDraft(max_match=2, min_match=3)
  with pytest.raises(ValueError, match=r"depth \(9\) must be <= nodes \(4\)"):
    SuffixDraft(nodes=4, depth=9)
  with pytest.raises(ValueError, match="nodes .* exceeds the 8 candidates"):
    SuffixDraft(nodes=9, depth=4, occurrences=2)
  with pytest.raises(ValueError, match="factor must be a finite number > 0"):
    SuffixDraft(factor=0.0)
  with pytest.raises(ValueError, match=r"min_prob must be a finite number in \[0, 1\]"):
    SuffixDraft(min_prob=1.5)
  with pytest.raises(TypeError, match="share_rows must be a bool"):
    SuffixDraft(share_rows=1)
  with pytest.raises(TypeError, match="draft_params must be a SuffixCorpus"):
    specjax.speculative_generate(lm, params, SuffixDraft(), np.zeros(8, np.int32), prompts,
                                 lengths, **kw)
  with pytest.raises(ValueError, match=r"sequences\[1\] holds token 64, outside the vocabulary "
                     r"\[0, 64\)"):
    SuffixCorpus.build([[1, 2], [3, 64]], size=16, vocab_size=VOCAB)
  with pytest.raises(ValueError, match=r"sequences\[0\] must be a 1-D sequence"):
    SuffixCorpus.build([[[1, 2]]], size=16, vocab_size=VOCAB)
  with pytest.raises(ValueError, match="size must be an int >= 2"):
    SuffixCorpus.build([], size=1, vocab_size=VOCAB)
  with pytest.raises(ValueError, match="tokens_C holds -5"):
    specjax.speculative_generate(lm, params, SuffixDraft(),
                                 SuffixCorpus(tokens_C=jnp.asarray([1, -5], jnp.int32)), prompts,
                                 lengths, **kw)


# ------------------------------------------------------------------ exactness

PROMPT = [3, 1, 4, 3, 1]
# Several continuations of "3 1" and "1" (branches), and of what the samples go on with.
CORPUS = [[3, 1, 5, 2], [3, 1, 4, 4, 3, 1, 6], [1, 2, 2, 5], [4, 3, 1, 0, 7]]


@pytest.mark.parametrize("cfg", [SamplingConfig(1.0), SamplingConfig(0.7, top_p=0.9)], ids=str)
def test_sampling_is_exact_and_the_control_is_caught(cfg):
  lm, params = exact_lm()
  drafter = SuffixDraft(max_match=3, nodes=5, depth=3, max_children=3, occurrences=4,
                        min_prob=0.0, share_rows=False)
  corpus = SuffixCorpus.build(CORPUS, size=32, vocab_size=lm.vocab_size)
  assert_tree_drafter_exact(lm, params, drafter, corpus, PROMPT, cfg, 5)


# ------------------------------------------------------------------ the experiment

def test_edit_sessions_are_one_small_edit_apart():
  from experiments.programs.suffix import edit_sessions
  rng = np.random.default_rng(3)
  streams = {"a": rng.integers(0, 50, 600).astype(np.int32),
             "b": rng.integers(0, 50, 500).astype(np.int32)}
  reqs = edit_sessions(streams, sessions=2, turns=4, prompt_len=100, edit_max=5, seed=1)
  assert len(reqs) == 8 and all(r.shape == (100,) for r in reqs)
  for s in range(2):
    for t in range(1, 4):
      prev, cur = reqs[4 * s + t - 1], reqs[4 * s + t]
      diff = np.nonzero(prev != cur)[0]
      # One run of <= 5 rewritten tokens in the first 90% (a donor token may equal the old one).
      assert diff.size == 0 or (diff[-1] - diff[0] < 5 and diff[-1] < 90), diff
  assert not np.array_equal(reqs[0], reqs[4])   # sessions start from different files
  again = edit_sessions(streams, sessions=2, turns=4, prompt_len=100, edit_max=5, seed=1)
  assert all(np.array_equal(a, b) for a, b in zip(reqs, again))


def test_the_experiment_smoke_preset(tmp_path):
  from configs import suffix as suffix_config
  from experiments.programs import suffix
  cfg = suffix_config.get_config("smoke")
  cfg.workdir = str(tmp_path / "work")
  cfg.results_dir = str(tmp_path / "results")
  res = suffix.run(cfg)
  assert set(res["tasks"]) == {"code_edits", "summarize"}
  for task in res["tasks"].values():
    rows = task["rows"]
    assert set(rows) == {"prompt lookup γ=4", "suffix", "suffix + job corpus"}
    assert all(r["greedy_outputs_identical"] for r in rows.values())
    assert all(r["tokens_per_call"] >= 1.0 for r in rows.values())
    # The job corpus holds the earlier requests' outputs: it can only add matches here.
    assert rows["suffix + job corpus"]["tokens_per_call"] > rows["suffix"]["tokens_per_call"]
  saved = json.loads((tmp_path / "results" / "suffix.json").read_text())
  assert saved["tasks"]["code_edits"]["requests"] == 4
  assert "| suffix + job corpus |" in (tmp_path / "results" / "suffix.md").read_text()
  with pytest.raises(ValueError, match=r"config.tasks must name some of"):
    cfg.tasks = ["code_edits", "poetry"]
    suffix.run(cfg)
