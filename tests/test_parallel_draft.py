"""PARD (`ParallelDraft`, `specjax.training.parallel`): the training layout's
mask by hand; one drafter call equals the training forward (incremental vs
full, with committed tokens to catch up); training learns every slot and
resumes exactly; greedy == AR on ragged batches ending by EOS and by length
(a trained draft whose whole chains are accepted, and an untrained one);
rows independent of the batch and no retrace; chi-square with a negative
control at T = 1 and T = 0.7 / top-p 0.9; misuse named."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from exact_helpers import (N_SAMPLES, counts_t2_t4, exact_lm, joint_t2_t4,
                           optimized_codegen)
from reference import chi_square_pvalue
from specjax import training
from specjax.drafters import ParallelDraft, load_parallel_draft
from specjax.drafting import DraftInput
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.models.t5 import T5, T5Config
from specjax.sampling import GREEDY, SamplingConfig
from specjax.training.parallel import ParallelObjective, _layout, parallel_logits
from test_exactness import residual_from_q_verify
from tiny import (EOS, assert_rows_independent_and_no_retrace, noisy_draft, ragged_prompts,
                  target)

V_COUNT = 24


def _counting(rng, n):
  """start, start + step, ... over ids [3, V_COUNT): every slot is learnable."""
  s, step = rng.integers(3, V_COUNT), rng.integers(1, 3)
  return ((s - 3 + step * np.arange(n)) % (V_COUNT - 3) + 3).astype(np.int32)


def _config(steps, **kw):
  c = training.default_config()
  c.update(dict(steps=steps, batch_size=16, learning_rate=1e-2, warmup_steps=10,
                checkpoint_every=100, log_every=100, eval_every=0, eval_batches=0,
                parallel_slots=3, async_checkpointing=False), **kw)
  return c


@functools.lru_cache(maxsize=None)
def _counting_model():
  return DecoderLM(decoder_config("tiny", vocab_size=V_COUNT, num_layers=1, d_model=32,
                                  num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64))


def _source():
  rng = np.random.default_rng(0)
  return training.LMSource([training.Example(np.zeros(0, np.int32), _counting(rng, 17))
                            for _ in range(256)], seq_len=16)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A PARD draft trained 300 steps on counting sequences (~10 s), and the
  run's workdir."""
  workdir = str(tmp_path_factory.mktemp("pard") / "run")
  lm = _counting_model()
  return lm, training.train_model(lm, None, _source(), _config(300), workdir), workdir


def test_layout_mask_by_hand():
  pos, mask = _layout(3, 2)
  np.testing.assert_array_equal(pos, [0, 1, 2, 1, 2, 3, 2, 3, 4])
  want = np.zeros((9, 9), bool)
  for t in range(3):
    want[t, :t + 1] = True                      # real tokens: causal
    for j in (1, 2):                            # anchor t's slot j
      row = j * 3 + t
      want[row, :t + 1] = True                  # the real tokens up to the anchor
      want[row, [jj * 3 + t for jj in range(1, j + 1)]] = True   # its own earlier slots
  np.testing.assert_array_equal(mask, want)


def test_one_call_drafts_what_the_training_forward_predicts():
  """The drafter's call (a cache of 5 positions, two committed tokens to
  catch up, the pending token and masks) gives the training forward's
  slots 0..3 at that anchor; slot 0 is the LM's own next-token output."""
  lm, params = noisy_draft()
  x = jnp.asarray(np.random.default_rng(1).integers(6, 60, (1, 12)), jnp.int32)
  full = parallel_logits(lm, params, x, 3, 0)
  np.testing.assert_allclose(full[:, 0], lm.forward(params, x), rtol=1e-5, atol=1e-5)
  drafter = ParallelDraft(lm, mask_id=0)
  state = drafter.alloc(1, 12, 16, 4)
  _, _, cache = lm.prefill(params, x[:, :5], jnp.array([5]), state.cache)
  state = state.replace(cache=cache, unread_BG=jnp.pad(x[:, 5:7], ((0, 0), (0, 2))))
  inp = DraftInput(seq_len_B=jnp.array([7]), pending_B=x[:, 7], prev_B=x[:, 6],
                   done_B=jnp.array([False]), step=jnp.array(0))
  proposal, new = drafter.propose(params, state, inp, jnp.full((1, 4), 0.5), SamplingConfig(1.0),
                                  4)
  want = np.asarray(full[0, :, 7]).copy()
  want[:, 0] = -np.inf                                  # the mask token is never proposed
  np.testing.assert_allclose(proposal.probs_BGV[0], jax.nn.softmax(want, -1), rtol=2e-4,
                             atol=1e-6)
  assert int(new.cache.lengths[0]) == 8                 # through the pending token
  assert (np.asarray(proposal.tokens_BT[0, 1:]) != 0).all()


def test_training_learns_every_slot_and_resumes_exactly(trained, tmp_path):
  lm, params, workdir = trained
  x = jnp.asarray(np.stack([_counting(np.random.default_rng(s), 17) for s in range(50, 58)]))
  init = lm.init(jax.random.PRNGKey(0))

  def accuracy(p):
    logits = parallel_logits(lm, p, x[:, :16], 3, 0)
    return [float((logits[:, j, :16 - j].argmax(-1) == x[:, 1 + j:]).mean()) for j in range(4)]

  before, after = accuracy(init), accuracy(params)
  assert min(after) > 0.85 and all(a > b + 0.5 for a, b in zip(after, before)), (before, after)
  # Stopped at step 6 and resumed, a short run ends where an uninterrupted one does.
  src, cfg, run = _source(), _config(10, checkpoint_every=3), str(tmp_path / "r")
  training.train_model(lm, None, src, cfg, run, stop_at_step=6)
  resumed = training.train_model(lm, None, src, cfg, run)
  straight = training.train_model(lm, None, src, cfg, str(tmp_path / "s"))
  for a, b in zip(jax.tree_util.tree_leaves(resumed), jax.tree_util.tree_leaves(straight)):
    np.testing.assert_array_equal(a, b)
  # A run with other slots is another trajectory: resuming it is an error naming the field.
  with pytest.raises(Exception, match="parallel_slots"):
    training.train_model(lm, None, src, _config(10, checkpoint_every=3, parallel_slots=2), run)


def test_a_trained_draft_is_accepted_whole_and_greedy_equals_autoregressive(trained):
  """The trained counting draft drafting for itself: whole chains accepted
  (the catch-up of γ drafts per call exercised), one draft call per
  iteration, tokens those of plain greedy decoding; loaded from the run's
  workdir with its mask id and slots."""
  lm, params, workdir = trained
  drafter, loaded = load_parallel_draft(workdir)
  assert drafter == ParallelDraft(lm, 0, 3)
  for a, b in zip(jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(params)):
    np.testing.assert_array_equal(a, b)
  rng = np.random.default_rng(3)
  prompts = jnp.asarray(np.stack([_counting(rng, 6) for _ in range(4)]))
  ref = specjax.generate(lm, params, prompts, max_new_tokens=20, sampling=GREEDY)
  out = specjax.speculative_generate(lm, params, drafter, loaded, prompts,
                                     max_new_tokens=20, gamma=4, sampling=GREEDY)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  hist = np.asarray(out.stats.accepted_hist).sum(0)
  assert hist[4] >= 8, hist
  # One draft call per iteration (the target's count includes its prefill).
  np.testing.assert_array_equal(out.stats.draft_calls, np.asarray(out.stats.target_calls) - 1)


def test_greedy_equals_autoregressive_on_ragged_rows():
  lm, params = target()
  dlm, dp = noisy_draft()
  prompts, lengths = ragged_prompts(batch=8)
  ref = specjax.generate(lm, params, prompts, lengths, max_new_tokens=20, sampling=GREEDY,
                         eos_id=EOS)
  lens = np.asarray(ref.lengths)
  assert (lens < 20).any() and (lens == 20).any()   # rows end by EOS, and by length
  out = specjax.speculative_generate(lm, params, ParallelDraft(dlm, 1), dp, prompts, lengths,
                                     max_new_tokens=20, gamma=3, sampling=GREEDY, eos_id=EOS)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  assert out.acceptance_rate > 0.2


def test_rows_are_independent_of_the_batch_and_no_retrace():
  lm, params = target()
  dlm, dp = noisy_draft()
  assert_rows_independent_and_no_retrace(lm, params, ParallelDraft(dlm, 1), dp,
                                         max_new_tokens=12, gamma=3,
                                         sampling=SamplingConfig(1.0), eos_id=EOS)


@pytest.mark.parametrize("cfg", [SamplingConfig(1.0), SamplingConfig(0.7, top_p=0.9)], ids=str)
def test_sampling_is_exact_and_the_control_is_caught(cfg):
  """Tokens 2..4 after a prompt, γ = 3 (drafts 2 and 3 from mask slots),
  against the target's exact law; the mask id 0 is a token the target
  emits. The broken rule (after a rejection, sample from the draft's q)
  is caught."""
  lm, params = exact_lm()
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(4), len(leaves))
  dp = jax.tree_util.tree_unflatten(tree, [
      x + 0.5 * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
  prompt = [3, 1, 4]
  joint = joint_t2_t4(lm, params, prompt, cfg)
  prompts = np.tile(np.array(prompt, np.int32), (N_SAMPLES, 1))
  pvalues = {}
  for name, fn in (("exact", specjax.verify.rejection_verify), ("broken", residual_from_q_verify)):
    with optimized_codegen():
      out = specjax.speculative_generate(lm, params, ParallelDraft(lm, 0), dp, prompts,
                                         max_new_tokens=4, gamma=3, sampling=cfg,
                                         key=jax.random.key(5), verify_fn=fn)
    pvalues[name] = chi_square_pvalue(counts_t2_t4(np.asarray(out.tokens), lm.vocab_size),
                                      joint)
    if name == "exact":
      hist = np.asarray(out.stats.accepted_hist).sum(0)
      assert hist[0] > 0 and hist[2:].sum() > 0, hist   # rejections, and mask slots accepted
  assert pvalues["exact"] > 1e-3 and pvalues["broken"] < 1e-6, pvalues


def test_misuse_is_named(tmp_path):
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=2)
  with pytest.raises(ValueError, match=r"mask_id \(64\) must be a token of the draft's vocab"):
    specjax.speculative_generate(lm, params, ParallelDraft(lm, 64), params, prompts, lengths,
                                 max_new_tokens=4, gamma=2, sampling=GREEDY)
  with pytest.raises(ValueError, match="mask_id must be an int >= 0, got -1"):
    ParallelDraft(lm, -1)
  with pytest.raises(ValueError, match="draft vocab_size"):
    specjax.speculative_generate(lm, params, ParallelDraft(_counting_model(), 0),
                                 _counting_model().init(jax.random.PRNGKey(0)), prompts,
                                 lengths, max_new_tokens=4, gamma=2, sampling=GREEDY)
  with pytest.raises(ValueError, match="draft_params"):
    specjax.speculative_generate(lm, params, ParallelDraft(lm, 0), {"x": 1}, prompts, lengths,
                                 max_new_tokens=4, gamma=2, sampling=GREEDY)
  with pytest.raises(ValueError, match="slots must be an int >= 1, got 0"):
    ParallelObjective(0)
  with pytest.raises(ValueError, match=r"decay must be a finite number in \(0, 1\], got 0.0"):
    ParallelObjective(2, decay=0.0)
  with pytest.raises(ValueError, match=r"parallel mask_id \(99\) must be a token"):
    training.train_model(_counting_model(), None, _source(),
                         _config(2, parallel_mask_id=99, warmup_steps=1), str(tmp_path / "a"))
  with pytest.raises(ValueError, match="config.parallel_slots must be an int >= 0, got -1"):
    training.validate_config(_config(2, parallel_slots=-1, warmup_steps=1))
  with pytest.raises(ValueError, match=r"gamma \(5\) needs 4 mask slots; this PARD draft was "
                     r"trained with 3 \(gamma <= 4\)"):
    specjax.speculative_generate(lm, params, ParallelDraft(lm, 0, 3), params, prompts, lengths,
                                 max_new_tokens=4, gamma=5, sampling=GREEDY)
  plain = str(tmp_path / "plain")
  training.train_model(_counting_model(), None, _source(),
                       _config(2, parallel_slots=0, warmup_steps=1), plain)
  with pytest.raises(ValueError, match="trained without mask slots"):
    load_parallel_draft(plain)
  t5 = T5(T5Config(vocab_size=32, d_model=16, d_ff=32, num_heads=2, d_kv=8, num_layers=1))
  with pytest.raises(TypeError, match="trains a decoder-only DecoderLM, got T5"):
    ParallelObjective(2).check(t5)
