"""Tests of specjax.training: batching, losses, distillation, exact resume, config checks."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import training as tr
from specjax.checkpoints.orbax_io import restore_params
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.training import batching
from specjax.training.steps import StepSpec, init_params

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "data")
VOCAB = 32
# One student shape for every training test: the jitted step compiles once per process.
STUDENT = DecoderLM(decoder_config("tiny", vocab_size=VOCAB, num_layers=1, d_model=32,
                                   num_heads=2, num_kv_heads=2, head_dim=16, mlp_dim=64))


def _config(**kw):
  """Shared by the tests so that they share one compiled step (the schedule is static)."""
  c = tr.default_config()
  c.steps = 24
  c.batch_size = 8
  c.learning_rate = 1e-2
  c.warmup_steps = 2
  c.checkpoint_every = 8
  c.log_every = 4
  c.eval_every = 0
  c.eval_batches = 0
  c.async_checkpointing = True
  for k, v in kw.items():
    c[k] = v
  return c


def _reverse_source(n=64, seq_len=16, seed=0, **kw):
  ex = tr.synthetic_examples("reverse", n, VOCAB, 2, 6, seed=seed)
  ex = [tr.Example(np.append(e.prompt, tr.EOS_ID), e.target) for e in ex]
  return tr.LMSource(ex, seq_len, **kw)


def _leaves_equal(a, b):
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  return len(la) == len(lb) and all(
      np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(np.asarray(x), np.asarray(y))
      for x, y in zip(la, lb))


# -----------------------------------------------------------------------------
# Batching.
# -----------------------------------------------------------------------------


def test_lm_rows_mask_exactly_the_target_and_pad():
  ex = [tr.Example(np.array([5, 6, 7]), np.array([8, 9, tr.EOS_ID])),
        tr.Example(np.array([], np.int32), np.array([10, 11, tr.EOS_ID]))]  # A document.
  src = tr.LMSource(ex, seq_len=8)
  rows = src.fixed_rows(np.arange(2))
  np.testing.assert_array_equal(rows["tokens"][0], [5, 6, 7, 8, 9, 0, 0, 0])
  np.testing.assert_array_equal(rows["targets"][0], [6, 7, 8, 9, 1, 0, 0, 0])
  # Scored: the predictions of 8, 9 and EOS — exactly the target tokens.
  np.testing.assert_array_equal(rows["loss_mask"][0], [0, 0, 1, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(rows["tokens"][1], [10, 11, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(rows["targets"][1], [11, 1, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(rows["loss_mask"][1], [1, 1, 0, 0, 0, 0, 0, 0])
  assert rows["tokens"].dtype == np.int32 and rows["loss_mask"].dtype == np.float32


def test_seq2seq_rows_shift_right_with_eos_and_mask():
  ex = [tr.Example(np.array([5, 6, tr.EOS_ID]), np.array([7, 8, 9, tr.EOS_ID]))]
  rows = tr.Seq2SeqSource(ex, input_len=5, target_len=6).fixed_rows(np.arange(1))
  np.testing.assert_array_equal(rows["inputs"][0], [5, 6, 1, 0, 0])
  assert rows["input_lengths"][0] == 3
  np.testing.assert_array_equal(rows["decoder_inputs"][0], [0, 7, 8, 9, 0, 0])
  np.testing.assert_array_equal(rows["targets"][0], [7, 8, 9, 1, 0, 0])
  np.testing.assert_array_equal(rows["loss_mask"][0], [1, 1, 1, 1, 0, 0])


def test_overlong_truncate_and_drop_are_counted():
  long_in = tr.Example(np.arange(2, 12), np.array([3, 4, tr.EOS_ID]))
  long_tg = tr.Example(np.array([5, tr.EOS_ID]), np.arange(2, 12))
  ok = tr.Example(np.array([5, tr.EOS_ID]), np.array([6, tr.EOS_ID]))
  src = tr.Seq2SeqSource([long_in, long_tg, ok], input_len=4, target_len=4)
  assert (src.stats.kept, src.stats.truncated_prompts, src.stats.truncated_targets,
          src.stats.dropped) == (3, 1, 1, 0)
  rows = src.fixed_rows(np.arange(3))
  np.testing.assert_array_equal(rows["inputs"][0], [2, 3, 4, tr.EOS_ID])  # EOS kept at the end.
  np.testing.assert_array_equal(rows["targets"][1], [2, 3, 4, 5])  # Cut, no false EOS.
  assert rows["loss_mask"][1].sum() == 4
  dropped = tr.Seq2SeqSource([long_in, long_tg, ok], 4, 4, overlong="drop")
  assert (dropped.stats.kept, dropped.stats.dropped) == (1, 2)
  # Decoder: the prompt is cut from the left, the target kept whole.
  lm = tr.LMSource([tr.Example(np.arange(2, 12), np.array([20, 21, tr.EOS_ID]))], seq_len=5)
  row = lm.fixed_rows(np.arange(1))
  np.testing.assert_array_equal(row["tokens"][0], [9, 10, 11, 20, 21])
  np.testing.assert_array_equal(row["targets"][0], [10, 11, 20, 21, tr.EOS_ID])
  np.testing.assert_array_equal(row["loss_mask"][0], [0, 0, 1, 1, 1])
  assert lm.stats.truncated_prompts == 1 and lm.stats.truncated_targets == 0
  with pytest.raises(ValueError, match="no examples left"):
    tr.LMSource([tr.Example(np.arange(2, 12), np.array([1]))], seq_len=4, overlong="drop")


def test_batches_are_a_pure_function_of_seed_and_step():
  a, b = _reverse_source(50), _reverse_source(50)
  for step in (0, 3, 7, 40):  # 40 * 8 rows: several epochs of 50 examples.
    x, y = a.batch(5, step, 8), b.batch(5, step, 8)
    assert all(np.array_equal(x[k], y[k]) for k in x)
  assert not np.array_equal(a.batch(5, 3, 8)["tokens"], a.batch(6, 3, 8)["tokens"])
  # Each epoch is a permutation: 50 rows from stream positions 0..49 are every example once.
  _, pos = tr.Mixture(a).assignment(5, 0, 50)
  order = a._orders.get(5, 0, 0)  # pylint: disable=protected-access
  assert sorted(order[pos].tolist()) == list(range(50))
  assert not np.array_equal(a._orders.get(5, 0, 0), a._orders.get(5, 0, 1))  # pylint: disable=protected-access


def test_mixture_weights_and_random_access():
  big = _reverse_source(40, seed=1)
  docs = tr.LMSource([tr.Example(np.zeros(0, np.int32), np.arange(2, 30) % VOCAB)] * 5, 16,
                     packing=True)
  mix = tr.Mixture([(big, 3.0), (docs, 1.0)])
  counts = np.zeros(2)
  for step in range(300):  # Crosses a block of 256 steps.
    src, _ = mix.assignment(9, step, 4)
    counts += np.bincount(src, minlength=2)
  assert abs(counts[0] / counts.sum() - 0.75) < 0.05
  # Step 290 computed by a fresh mixture (no history) equals the one above.
  fresh = tr.Mixture([(_reverse_source(40, seed=1), 3.0), (docs, 1.0)])
  for key, value in mix.batch(9, 290, 4).items():
    np.testing.assert_array_equal(value, fresh.batch(9, 290, 4)[key])
  # Stream positions of each source are consecutive: nothing skipped or repeated.
  seen = {0: [], 1: []}
  for step in range(300):
    src, pos = mix.assignment(9, step, 4)
    for s, p in zip(src, pos):
      seen[int(s)].append(int(p))
  assert all(seen[k] == list(range(len(seen[k]))) for k in seen)
  with pytest.raises(ValueError, match="one format"):
    tr.Mixture([(big, 1.0), (_reverse_source(10, seq_len=8), 1.0)])


def test_packing_predicts_every_token_once_per_epoch():
  docs = [tr.Example(np.zeros(0, np.int32), np.append(np.arange(2, 2 + n), tr.EOS_ID))
          for n in (3, 7, 4, 9, 5)]
  src = tr.LMSource(docs, seq_len=6, packing=True)
  total = sum(d.target.size for d in docs)
  assert src.num_items == (total - 1) // 6
  rows = src.stream_rows(3, 0, np.arange(src.num_items))
  # Windows of one epoch predict distinct stream positions; all but the tail are covered.
  assert int(rows["loss_mask"].sum()) == src.num_items * 6
  assert src.stats.truncated_targets == 0 and src.stats.dropped == 0


def test_eval_batches_are_fixed_and_padded():
  src = _reverse_source(10)
  batches = tr.eval_batches(src, batch_size=4, num_batches=5)
  assert len(batches) == 3  # 10 items: 4 + 4 + 2 (+ 2 padding rows).
  assert batches[2]["loss_mask"][2:].sum() == 0
  again = tr.eval_batches(src, 4, 5)
  assert all(np.array_equal(a[k], b[k]) for a, b in zip(batches, again) for k in a)


def test_examples_from_records_with_a_tokenizer(tmp_path):
  spm = pytest.importorskip("sentencepiece")
  from specjax.tokenizers.sentencepiece import SentencePieceTokenizer
  prefix = str(tmp_path / "sp")
  spm.SentencePieceTrainer.train(
      input=os.path.join(FIXTURES, "tokenizer_corpus.txt"), model_prefix=prefix, vocab_size=100,
      pad_id=0, eos_id=1, unk_id=2, bos_id=-1, num_threads=1, minloglevel=2)
  tok = SentencePieceTokenizer(prefix + ".model")
  records = [{"inputs": "The cat sleeps.", "targets": "Die Katze schläft."}]
  (lm,) = tr.lm_examples(records, tok, "{inputs} Summary:")
  assert lm.prompt[-1] != tok.eos_id and lm.target[-1] == tok.eos_id
  assert tok.decode(lm.target) == "Die Katze schläft."
  (doc,) = tr.lm_examples(records, tok, None, "{inputs}")
  assert doc.prompt.size == 0 and doc.target[-1] == tok.eos_id
  (s2s,) = tr.seq2seq_examples(records, tok, "translate: {inputs}")
  assert s2s.prompt[-1] == tok.eos_id and s2s.target[-1] == tok.eos_id
  with pytest.raises(ValueError, match="'document'"):
    tr.lm_examples(records, tok, "{document}")


# -----------------------------------------------------------------------------
# Losses and training.
# -----------------------------------------------------------------------------


def test_token_losses_match_a_reference():
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(2, 3, 5)), jnp.float32)
  teacher = jnp.asarray(rng.normal(size=(2, 3, 5)), jnp.float32)
  targets = jnp.asarray([[1, 2, 3], [0, 4, 4]])
  mask = jnp.asarray([[1, 1, 0], [1, 0, 0]], jnp.float32)
  logp = jax.nn.log_softmax(logits)
  ce_ref = -(logp[0, 0, 1] + logp[0, 1, 2] + logp[1, 0, 0]) / 3
  ce, m = tr.token_losses(logits, targets, mask)
  np.testing.assert_allclose(ce, ce_ref, rtol=1e-6)
  assert float(m["tokens"]) == 3
  q = jax.nn.softmax(teacher / 2.0)
  kl_tok = jnp.sum(q * (jnp.log(q) - jax.nn.log_softmax(logits / 2.0)), -1)
  kl_ref = (kl_tok[0, 0] + kl_tok[0, 1] + kl_tok[1, 0]) / 3
  loss, m = tr.token_losses(logits, targets, mask, teacher, distill_weight=0.25, temperature=2.0)
  np.testing.assert_allclose(float(m["kl_sum"]) / 3, kl_ref, rtol=1e-5)
  np.testing.assert_allclose(loss, 0.75 * ce_ref + 0.25 * 4.0 * kl_ref, rtol=1e-5)


def test_schedules():
  spec = tr.OptimizerSpec(learning_rate=1.0, warmup_steps=4, total_steps=12, min_lr_ratio=0.1)
  lr = tr.make_schedule(spec)
  np.testing.assert_allclose([float(lr(s)) for s in (0, 3)], [0.25, 1.0])
  np.testing.assert_allclose(float(lr(4)), 1.0)
  np.testing.assert_allclose(float(lr(12)), 0.1, rtol=1e-6)
  inv = tr.make_schedule(tr.OptimizerSpec(learning_rate=1.0, warmup_steps=4, schedule="inverse_sqrt"))
  np.testing.assert_allclose(float(inv(16)), 0.5)


def test_loss_decreases_on_reverse(tmp_path):
  src = _reverse_source(256)
  config = _config()
  spec = StepSpec(model=STUDENT, optimizer=tr.OptimizerSpec.from_config(config))
  init = init_params(STUDENT, 0)
  batches = tr.eval_batches(src, 8, 4)
  before = tr.evaluate_loss(spec, init, batches)["ce"]
  params = tr.train_model(STUDENT, init, src, config, str(tmp_path))
  assert not _leaves_equal(init, params)  # The caller's init params are not donated away.
  after = tr.evaluate_loss(spec, params, batches)["ce"]
  assert after < before - 0.5, (before, after)
  lines = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  assert [l["step"] for l in lines] == list(range(4, 25, 4))
  assert all(l["tokens_per_s"] > 0 and "eta_s" in l for l in lines[1:])
  # The same numbers as TensorBoard scalars beside the JSONL log.
  from tensorboardX.proto import event_pb2
  (events,) = [f for f in os.listdir(tmp_path / "tb") if f.startswith("events.out.tfevents")]
  data, tags = (tmp_path / "tb" / events).read_bytes(), set()
  while data:  # TFRecord framing: u64 length, u32 crc, payload, u32 crc
    n = int.from_bytes(data[:8], "little")
    event = event_pb2.Event.FromString(data[12:12 + n])
    tags |= {(event.step, v.tag) for v in event.summary.value}
    data = data[16 + n:]
  assert (24, "train/loss") in tags and (4, "train/learning_rate") in tags


class _RecordingSource(batching.LMSource):
  """Logs the stream positions it serves (the data order a run sees)."""

  def __init__(self, *a, **kw):
    super().__init__(*a, **kw)
    self.served = []

  def stream_rows(self, seed, source_index, positions):
    self.served.append([int(p) for p in positions])
    return super().stream_rows(seed, source_index, positions)


def test_resume_is_bit_exact(tmp_path):
  ex = tr.synthetic_examples("reverse", 30, VOCAB, 2, 6, seed=0)
  config = _config(keep_checkpoints=3)
  src_a = _RecordingSource(ex, 16)
  full = tr.train_model(STUDENT, None, src_a, config, str(tmp_path / "a"))

  src_b = _RecordingSource(ex, 16)
  half = tr.train_model(STUDENT, None, src_b, config, str(tmp_path / "b"), stop_at_step=13)
  assert not _leaves_equal(half, full)
  ckpts = tmp_path / "b" / "checkpoints"
  assert sorted(int(p) for p in os.listdir(ckpts) if p.isdigit()) == [8, 13]
  assert not (tmp_path / "b" / "final").exists()
  # A kill after step 13 but before its checkpoint: only step 8 survives.
  shutil.rmtree(ckpts / "13")
  resumed = tr.train_model(STUDENT, None, src_b, config, str(tmp_path / "b"))
  assert _leaves_equal(resumed, full)
  # The same data order: steps 0..12, then 8..23 again after the restart.
  assert src_b.served == src_a.served[:13] + src_a.served[8:]
  # The final artifact, and a finished run returning without training.
  stored, _ = restore_params(str(tmp_path / "b" / "final"), STUDENT.config)
  assert _leaves_equal(stored, full)
  n = len(src_b.served)
  again = tr.train_model(STUDENT, None, src_b, config, str(tmp_path / "b"))
  assert _leaves_equal(again, full) and len(src_b.served) == n
  # Resuming with a changed trajectory field is refused, naming it.
  with pytest.raises(ValueError, match="train.learning_rate"):
    tr.train_model(STUDENT, None, src_b, _config(learning_rate=1e-3),
                   str(tmp_path / "b"))


def _truncate_one_file(directory):
  """Truncates the largest file under `directory` to 5 bytes; returns its path."""
  files = [os.path.join(b, f) for b, _, fs in os.walk(directory) for f in fs]
  path = max(files, key=os.path.getsize)
  with open(path, "r+b") as f:
    f.truncate(5)
  return path


def test_a_damaged_step_checkpoint_falls_back_to_the_one_before(tmp_path):
  """Resume skips (and sets aside) a step checkpoint orbax cannot read, and
  continues from the newest intact one: the run still ends bit-exact."""
  src = _reverse_source()
  config = _config(keep_checkpoints=3)
  full = tr.train_model(STUDENT, None, src, config, str(tmp_path / "a"))
  tr.train_model(STUDENT, None, src, config, str(tmp_path / "b"), stop_at_step=16)
  ckpts = tmp_path / "b" / "checkpoints"
  _truncate_one_file(ckpts / "16" / "state")
  resumed = tr.train_model(STUDENT, None, src, config, str(tmp_path / "b"))
  assert _leaves_equal(resumed, full)
  aside = os.listdir(tmp_path / "b" / "checkpoints.corrupt")
  assert len(aside) == 1 and aside[0].startswith("16.corrupt-")
  # Every step checkpoint damaged: training starts again from step 0 (same result).
  tr.train_model(STUDENT, None, src, config, str(tmp_path / "c"), stop_at_step=8)
  _truncate_one_file(tmp_path / "c" / "checkpoints" / "8" / "state")
  assert _leaves_equal(tr.train_model(STUDENT, None, src, config, str(tmp_path / "c")), full)


def test_train_or_restore_rebuilds_a_damaged_final_and_refuses_other_settings(tmp_path):
  from specjax.checkpoints import CheckpointError
  from experiments.programs.common import train_or_restore
  src = _reverse_source()
  config = _config()
  work = str(tmp_path / "run")
  params = train_or_restore(STUDENT, src, config, work)
  assert os.path.exists(os.path.join(work, "final", "train_meta.json"))
  calls = []

  def lazy_source():
    calls.append(1)
    return src
  # Intact: restored without building the data.
  assert _leaves_equal(train_or_restore(STUDENT, lazy_source, config, work), params) and not calls
  for damage in ("params", "config.json"):
    if damage == "params":
      _truncate_one_file(os.path.join(work, "final", "params"))
    else:
      os.remove(os.path.join(work, "final", "config.json"))
    again = train_or_restore(STUDENT, lazy_source, config, work)
    assert _leaves_equal(again, params) and calls  # Rebuilt from the step-24 checkpoint.
    calls.clear()
    restored, _ = restore_params(os.path.join(work, "final"), STUDENT.config)
    assert _leaves_equal(restored, params)
  assert len([d for d in os.listdir(work) if d.startswith("final.corrupt-")]) == 2
  # Trained with other settings: named, not silently reused, nothing moved.
  with pytest.raises(CheckpointError, match="train.learning_rate") as err:
    train_or_restore(STUDENT, lazy_source, _config(learning_rate=1e-3), work)
  assert err.value.kind == "config_mismatch" and "Delete" in str(err.value) and not calls
  other = DecoderLM(STUDENT.config.replace(mlp_dim=32))
  with pytest.raises(CheckpointError, match="mlp_dim"):
    train_or_restore(other, lazy_source, config, work)


def test_distillation_lowers_kl_to_the_teacher(tmp_path):
  teacher_params = init_params(STUDENT, 42)
  # Sharpen the teacher so it has something definite to imitate.
  teacher_params = jax.tree_util.tree_map(lambda x: x * 1.5, teacher_params)
  src = _reverse_source(128)
  config = _config(distill_weight=1.0)
  spec = StepSpec(model=STUDENT, optimizer=tr.OptimizerSpec.from_config(config), teacher=STUDENT,
                  distill_weight=1.0)
  init = init_params(STUDENT, 0)
  batches = tr.eval_batches(src, 8, 4)
  before = tr.evaluate_loss(spec, init, batches, teacher_params)["kl"]
  params = tr.train_model(STUDENT, init, src, config, str(tmp_path),
                          teacher=(STUDENT, teacher_params))
  after = tr.evaluate_loss(spec, params, batches, teacher_params)["kl"]
  assert after < 0.7 * before, (before, after)


def test_seq2seq_training_with_a_t5_runs_and_learns(tmp_path):
  from specjax.models.t5 import T5, t5_config
  model = T5(t5_config("t5-tiny", vocab_size=VOCAB, num_layers=1))
  ex = tr.synthetic_examples("copy", 128, VOCAB, 2, 5, seed=0)
  src = tr.Seq2SeqSource(ex, input_len=8, target_len=8)
  config = _config(eval_batches=2)
  params = tr.train_model(model, None, src, config, str(tmp_path), eval_dataset=src)
  lines = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  train = [l for l in lines if "loss" in l]
  assert train[-1]["loss"] < train[0]["loss"] - 0.3
  evals = [l for l in lines if "eval_ce" in l]
  assert [l["step"] for l in evals] == [0, 24]  # Before training and at the end.
  assert evals[1]["eval_ce"] < evals[0]["eval_ce"]
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(
      model.init(jax.random.PRNGKey(0)))
  with pytest.raises(ValueError, match="dataset rows are 'seq2seq'"):
    tr.train_model(STUDENT, None, src, config, str(tmp_path / "x"))


# -----------------------------------------------------------------------------
# Config validation.
# -----------------------------------------------------------------------------


@pytest.mark.parametrize("field,value,match", [
    ("learning_rate", -1.0, "config.learning_rate"),
    ("steps", 0, "config.steps"),
    ("batch_size", 2.5, "config.batch_size"),
    ("schedule", "cosin", "config.schedule"),
    ("optimizer", "sgd", "config.optimizer"),
    ("distill_weight", 1.5, "config.distill_weight"),
    ("warmup_steps", 100, "config.warmup_steps"),
    ("b2", 1.0, "config.b2"),
])
def test_config_errors_name_the_field(field, value, match):
  c = _config().to_dict()  # A dict: ConfigDict itself refuses some wrong types.
  c[field] = value
  with pytest.raises((ValueError, TypeError), match=match):
    tr.validate_config(c)


def test_config_unknown_field_and_missing_teacher(tmp_path):
  c = _config()
  c.learning_rat = 1.0
  with pytest.raises(ValueError, match=r"config.learning_rat .*did you mean 'learning_rate'"):
    tr.validate_config(c)
  with pytest.raises(ValueError, match="config.distill_weight"):
    tr.train_model(STUDENT, None, _reverse_source(8), _config(distill_weight=0.5), str(tmp_path))


def test_presets_build():
  import importlib.util
  path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "train.py")
  spec = importlib.util.spec_from_file_location("train_presets", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  for preset in ("tiny", "tiny-t5", "summarize-draft", "summarize-target", "code-draft",
                 "chen-draft", "translate-t5-draft", "translate-t5-target"):
    tr.validate_config(mod.get_config(preset).train)
  with pytest.raises(ValueError, match="unknown train preset"):
    mod.get_config("nope")
