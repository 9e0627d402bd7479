"""The resume campaign, through the real `train_model` loop: kill, flip a byte, truncate, drop a
digest, diverge (a rigged learning rate, a poisoned batch), fill the disk, kill the final write.

Each case ends with the uninterrupted run's parameters (bit for bit: batch s is a function of
(seed, s), the state holds the rest) or stops by name with its good checkpoints kept. One tiny
student (the shape tests/test_train.py uses, so the compiled step is shared); the reference run
and a run stopped at step 16 (checkpoints 8 and 16) are made once per module and copied.
"""

import errno
import json
import logging
import math
import os
import shutil
import types

import jax
import numpy as np
import pytest
from etils.epath import gpath

from specjax import training as tr
from specjax.checkpoints.orbax_io import restore_params
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.training import checkpoint as ckpt_lib
from specjax.training.checkpoint import Checkpointer, CheckpointWriteError
from specjax.training.nonfinite import NonFiniteTrainingError
from specjax.training.rewind import rewind_events, rewind_metrics
from specjax.training.steps import StepSpec, init_params, init_state

VOCAB = 32
STUDENT = DecoderLM(decoder_config("tiny", vocab_size=VOCAB, num_layers=1, d_model=32,
                                   num_heads=2, num_kv_heads=2, head_dim=16, mlp_dim=64))
ALL_LOG_STEPS = list(range(4, 25, 4))


def _config(**kw):
  """tests/test_train.py's settings (one compiled step for both files)."""
  c = tr.default_config()
  c.steps, c.batch_size, c.learning_rate, c.warmup_steps = 24, 8, 1e-2, 2
  c.checkpoint_every, c.log_every, c.eval_every, c.eval_batches = 8, 4, 0, 0
  for k, v in kw.items():
    c[k] = v
  return c


def _source():
  ex = tr.synthetic_examples("reverse", 64, VOCAB, 2, 6, seed=0)
  return tr.LMSource([tr.Example(np.append(e.prompt, tr.EOS_ID), e.target) for e in ex], 16)


class _Rigged(tr.Mixture):
  """The same data, with a kill (KeyboardInterrupt) or a NaN loss mask at chosen steps."""

  def __init__(self, source, kill_at=None, poison=()):
    super().__init__(source)
    self.kill_at, self.poison, self.served = kill_at, set(poison), []

  def batch(self, seed, step, batch_size):
    if step == self.kill_at:
      raise KeyboardInterrupt(f"killed before step {step}")
    self.served.append(step)
    out = super().batch(seed, step, batch_size)
    if step in self.poison:
      out["loss_mask"] = np.full_like(out["loss_mask"], np.nan)  # a NaN loss
    return out


def _equal(a, b):
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y))
                                    for x, y in zip(la, lb))


def _steps(work):
  d = os.path.join(work, "checkpoints")
  return sorted(int(p) for p in os.listdir(d) if p.isdigit())


def _aside(work):
  d = os.path.join(work, "checkpoints.corrupt")
  return sorted(os.listdir(d)) if os.path.isdir(d) else []


def _metric_steps(work):
  with open(os.path.join(work, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line)["step"] for line in f]


def _tb_events(work):
  """[(step, tag)] of every scalar in `<work>/tb` (TFRecord framing)."""
  from tensorboardX.proto import event_pb2
  out = []
  for name in sorted(os.listdir(os.path.join(work, "tb"))):
    with open(os.path.join(work, "tb", name), "rb") as f:
      data = f.read()
    while data:
      n = int.from_bytes(data[:8], "little")
      event = event_pb2.Event.FromString(data[12:12 + n])
      out += [(event.step, v.tag) for v in event.summary.value]
      data = data[16 + n:]
  return out


def _like():
  spec = StepSpec(model=STUDENT, optimizer=tr.OptimizerSpec.from_config(_config()))
  return init_state(spec, init_params(STUDENT, 0), 0).to_dict()


def _verifies(work, step):
  ckpt = Checkpointer(work, 5)
  try:
    return ckpt.verify(step, _like()) is not None
  finally:
    ckpt.close()


def _largest_file(directory):
  files = [os.path.join(b, f) for b, _, fs in os.walk(directory) for f in fs]
  return max(files, key=os.path.getsize)


def _flip_byte(path, offset=None):
  with open(path, "r+b") as f:
    data = bytearray(f.read())
    k = len(data) // 2 if offset is None else offset
    data[k] ^= 0x01
    f.seek(0)
    f.write(bytes(data))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("campaign")
  src = _source()
  full = tr.train_model(STUDENT, None, src, _config(), str(root / "full"))
  tr.train_model(STUDENT, None, src, _config(), str(root / "at16"), stop_at_step=16)
  assert _steps(root / "at16") == [8, 16]
  return types.SimpleNamespace(src=src, full=full, at16=str(root / "at16"))


def _copy_at16(runs, tmp_path):
  work = str(tmp_path / "run")
  shutil.copytree(runs.at16, work)
  return work


def test_kill_and_resume_equals_the_uninterrupted_run_and_logs_each_step_once(runs, tmp_path):
  work = str(tmp_path / "run")
  with pytest.raises(KeyboardInterrupt):  # after the log line of step 20, checkpoint 16
    tr.train_model(STUDENT, None, _Rigged(runs.src, kill_at=21), _config(), work)
  assert _steps(work) == [8, 16] and _metric_steps(work) == ALL_LOG_STEPS[:5]
  resumed = tr.train_model(STUDENT, None, runs.src, _config(), work)
  assert _equal(resumed, runs.full)
  stored, _ = restore_params(os.path.join(work, "final"), STUDENT.config)
  assert _equal(stored, runs.full)
  # Steps 17..20 ran twice but are logged once, in metrics.jsonl and in TensorBoard.
  assert _metric_steps(work) == ALL_LOG_STEPS
  events = _tb_events(work)
  assert len(events) == len(set(events)) and (20, "train/loss") in events
  assert (24, "train/loss") in events


def _flip_state(work):
  path = _largest_file(os.path.join(work, "checkpoints", "16", "state"))
  before = os.path.getsize(path)
  ckpt = Checkpointer(work, 5)
  good = ckpt.restore(16, _like())
  _flip_byte(path)
  assert os.path.getsize(path) == before
  # orbax alone reads it without a word, and the values differ: only the digest can tell.
  damaged = ckpt.restore(16, _like())
  ckpt.close()
  assert not _equal(good, damaged)


def _truncate_state(work):
  with open(_largest_file(os.path.join(work, "checkpoints", "16", "state")), "r+b") as f:
    f.truncate(5)


def _edit(path, old, new):
  with open(path, "rb") as f:
    data = f.read()
  assert data.count(old) >= 1 and len(old) == len(new)
  with open(path, "wb") as f:
    f.write(data.replace(old, new, 1))


def _flip_meta(work):  # valid JSON, other settings: without its digest, a config mismatch
  _edit(os.path.join(work, "checkpoints", "16", "meta", "metadata"), b'"seed": 0', b'"seed": 1')


def _flip_digest(work):
  path = os.path.join(work, "checkpoints", "16", "integrity", "metadata")
  with open(path, "rb") as f:
    data = f.read()
  k = data.index(b'"state_sha256": "') + len(b'"state_sha256": "') + 5
  _edit(path, data[k - 5:k + 1], data[k - 5:k] + (b"0" if data[k:k + 1] != b"0" else b"1"))


def _drop_digest(work):
  shutil.rmtree(os.path.join(work, "checkpoints", "16", "integrity"))


@pytest.mark.parametrize("damage, reason", [
    (_flip_state, "its train state differs from its digest"),
    (_truncate_state, "its train state cannot be read"),
    (_flip_meta, "its meta differs from its digest"),
    (_flip_digest, "its train state differs from its digest"),
    (_drop_digest, "its digest cannot be read (integrity/ is missing)"),
], ids=["flip_state_byte", "truncate_state_file", "flip_meta", "flip_digest", "drop_digest"])
def test_a_damaged_latest_checkpoint_is_named_moved_aside_and_resumed_from_before(
    runs, tmp_path, caplog, damage, reason):
  work = _copy_at16(runs, tmp_path)
  damage(work)
  with caplog.at_level(logging.WARNING):
    resumed = tr.train_model(STUDENT, None, runs.src, _config(), work)
  # Resumed from step 8: bit-exact with the run that was never interrupted.
  assert _equal(resumed, runs.full)
  named = [r.getMessage() for r in caplog.records
           if f"{work}/checkpoints/16" in r.getMessage() and "moved aside" in r.getMessage()]
  assert len(named) == 1 and reason in named[0], named
  assert len(_aside(work)) == 1 and _aside(work)[0].startswith("16.corrupt-")
  assert _steps(work) == [16, 24] and all(_verifies(work, s) for s in (16, 24))
  assert _metric_steps(work) == ALL_LOG_STEPS  # 12 and 16 again, once each


def test_a_rigged_learning_rate_stops_by_name_keeping_the_good_checkpoints(tmp_path):
  work = str(tmp_path / "run")
  config = _config(learning_rate=1e30, checkpoint_every=1, log_every=1)
  for attempt in range(2):  # a rerun resumes from step 1, diverges again, deletes nothing
    with pytest.raises(NonFiniteTrainingError) as err:
      tr.train_model(STUDENT, None, _source(), config, work)
    e = err.value  # The first update (lr 1e30 / warmup) blows the parameters up to ~1e29.
    assert isinstance(e, FloatingPointError) and e.step == 2 and e.metric == "loss"
    assert not math.isfinite(e.value) and "non-finite loss at step 2: nan" in str(e)
    assert _steps(work) == [1] and _verifies(work, 1)
    assert not os.path.exists(os.path.join(work, "final"))
    assert not os.path.exists(os.path.join(work, "summary.json"))
    # Nothing of step 2 was written; every logged number is finite.
    assert _metric_steps(work) == [1], attempt
    with open(os.path.join(work, "metrics.jsonl"), encoding="utf-8") as f:
      assert all(math.isfinite(v) for line in f for v in json.loads(line).values())


def test_a_nonfinite_loss_mid_run_stops_before_writing_and_a_rerun_recovers(runs, tmp_path):
  work = str(tmp_path / "run")
  with pytest.raises(NonFiniteTrainingError, match=r"non-finite loss at step 19: nan") as err:
    tr.train_model(STUDENT, None, _Rigged(runs.src, poison={18}), _config(), work)
  assert "[8, 16]" in str(err.value)  # the checkpoints it names as kept
  # Found at the log step 20, before its line, its checkpoint (24 never) or any rotation.
  assert _steps(work) == [8, 16] and _metric_steps(work) == [4, 8, 12, 16]
  assert not os.path.exists(os.path.join(work, "final"))
  assert _equal(tr.train_model(STUDENT, None, runs.src, _config(), work), runs.full)
  assert _metric_steps(work) == ALL_LOG_STEPS


def test_skip_step_drops_exactly_the_nonfinite_update(runs, tmp_path, caplog):
  work = str(tmp_path / "run")
  config = _config(on_nonfinite="skip_step", max_skipped_steps=2)
  data = _Rigged(runs.src, poison={9})  # the update to step 10
  at9 = tr.train_model(STUDENT, None, data, config, work, stop_at_step=9)
  with caplog.at_level(logging.WARNING):
    at10 = tr.train_model(STUDENT, None, data, config, work, stop_at_step=10)
  assert _equal(at10, at9)  # parameters and optimizer state kept; the batch is skipped
  assert any("step 10 skipped" in r.getMessage() for r in caplog.records)
  final = tr.train_model(STUDENT, None, data, config, work)
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(final))
  assert os.path.exists(os.path.join(work, "final", "config.json"))
  with open(os.path.join(work, "metrics.jsonl"), encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  assert [r["step"] for r in records] == [4, 8, 9, 10, 12, 16, 20, 24]
  assert records[3]["skipped_steps"] == 1 and "loss" not in records[3]
  assert all(math.isfinite(v) for r in records for v in r.values())
  # While every step is finite the guarded step computes the plain one: another compiled
  # program, so equal within float rounding (not always bit for bit: XLA fuses it differently).
  finite = tr.train_model(STUDENT, None, runs.src, config, str(tmp_path / "ok"))
  for x, y in zip(jax.tree_util.tree_leaves(finite), jax.tree_util.tree_leaves(runs.full)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
  # More than max_skipped_steps in a row: stopped by name at the third.
  work2 = str(tmp_path / "run2")
  with pytest.raises(NonFiniteTrainingError, match="3 steps in a row skipped") as err:
    tr.train_model(STUDENT, None, _Rigged(runs.src, poison=range(9, 24)), config, work2)
  assert err.value.step == 12 and _steps(work2) == [8]


@pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])
def test_disk_full_during_a_save_leaves_the_previous_checkpoint_restorable(
    runs, tmp_path, monkeypatch, async_save):
  work = str(tmp_path / "run")
  write_text = gpath.PosixGPath.write_text

  def full_disk(self, *args, **kw):  # step 16's meta: no space left
    p = os.fspath(self)
    if "/checkpoints/16" in p and os.path.basename(os.path.dirname(p)).startswith("meta"):
      raise OSError(errno.ENOSPC, "No space left on device (simulated)", p)
    return write_text(self, *args, **kw)
  monkeypatch.setattr(gpath.PosixGPath, "write_text", full_disk)
  config = _config(async_checkpointing=async_save)
  with pytest.raises(CheckpointWriteError) as err:
    tr.train_model(STUDENT, None, runs.src, config, work)
  e = err.value
  assert isinstance(e, OSError) and e.errno == errno.ENOSPC and e.step == 16 and e.kept == [8]
  assert _steps(work) == [8] and _verifies(work, 8)
  assert not os.path.exists(os.path.join(work, "final"))
  monkeypatch.setattr(gpath.PosixGPath, "write_text", write_text)
  assert _equal(tr.train_model(STUDENT, None, runs.src, config, work), runs.full)
  assert _metric_steps(work) == ALL_LOG_STEPS


@pytest.mark.parametrize("failure", [KeyboardInterrupt("killed"),
                                     OSError(errno.ENOSPC, "No space left on device")],
                         ids=["kill", "disk_full"])
def test_a_failure_while_writing_final_keeps_the_last_checkpoint(runs, tmp_path, monkeypatch,
                                                                 failure):
  work = _copy_at16(runs, tmp_path)
  save_params = ckpt_lib.save_params

  def interrupted(directory, *args, **kw):  # the params written, then the process dies
    save_params(directory, *args, **kw)
    raise failure
  monkeypatch.setattr(ckpt_lib, "save_params", interrupted)
  with pytest.raises(type(failure)):
    tr.train_model(STUDENT, None, runs.src, _config(), work)
  assert not [d for d in os.listdir(work) if d.startswith("final")]
  assert _steps(work) == [16, 24] and _verifies(work, 24)
  monkeypatch.setattr(ckpt_lib, "save_params", save_params)
  data = _Rigged(runs.src)
  assert _equal(tr.train_model(STUDENT, None, data, _config(), work), runs.full)
  assert not data.served  # finished: re-finalised from checkpoint 24 without training
  stored, _ = restore_params(os.path.join(work, "final"), STUDENT.config)
  assert _equal(stored, runs.full)


def test_rotation_keeps_the_newest_verified_checkpoint_when_the_newest_is_damaged(
    runs, tmp_path, monkeypatch):
  work = _copy_at16(runs, tmp_path)
  prune = Checkpointer.prune

  def bit_rot_then_prune(self):  # step 24 damaged on disk right after its write
    if 24 in self.steps() and 24 not in self.verified and not _aside(work):
      _flip_byte(_largest_file(os.path.join(self.directory, "24", "state")))
    prune(self)
  monkeypatch.setattr(Checkpointer, "prune", bit_rot_then_prune)
  params = tr.train_model(STUDENT, None, runs.src, _config(keep_checkpoints=1), work)
  assert _equal(params, runs.full)
  # keep_checkpoints=1, but step 24 does not verify: 16 (verified) is kept, 24 set aside.
  assert _steps(work) == [16] and _verifies(work, 16)
  assert len(_aside(work)) == 1 and _aside(work)[0].startswith("24.corrupt-")


def test_save_and_final_refuse_nonfinite_values(tmp_path):
  like = _like()
  like["params"]["embed"]["embedding"] = np.asarray(like["params"]["embed"]["embedding"]).copy()
  like["params"]["embed"]["embedding"][3, 1] = np.inf
  ckpt = Checkpointer(str(tmp_path), 2)
  with pytest.raises(NonFiniteTrainingError,
                     match=r"\['params'\]\['embed'\]\['embedding'\] at step 5: inf"):
    ckpt.save(5, like, {"note": "x"})
  ckpt.close()
  assert _steps(tmp_path) == []
  with pytest.raises(NonFiniteTrainingError, match="final parameters: inf"):
    ckpt_lib.save_final_params(str(tmp_path), like["params"], STUDENT.config)
  assert not os.path.exists(tmp_path / "final")


def test_rewind_drops_later_and_partial_records(tmp_path):
  from specjax.measure.tensorboard import ScalarWriter
  path = tmp_path / "metrics.jsonl"
  path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (0, 4, 8, 12))
                  + '{"step": 16, "lo')
  assert rewind_metrics(str(path), 8) == 2
  assert [json.loads(l)["step"] for l in path.read_text().splitlines()] == [0, 4, 8]
  assert rewind_metrics(str(path), 8) == 0
  with ScalarWriter(str(tmp_path / "tb")) as tb:
    for s in range(1, 6):
      tb.write(s, {"loss": float(s)})
  (name,) = os.listdir(tmp_path / "tb")
  with open(tmp_path / "tb" / name, "ab") as f:
    f.write(b"\x30\x00\x00\x00\x00")  # a record cut short
  assert rewind_events(str(tmp_path / "tb"), 3) == 3
  assert _tb_events(tmp_path) == [(1, "loss"), (2, "loss"), (3, "loss")]


@pytest.mark.parametrize("value, match", [
    ("restore_lower_lr", "not implemented"), ("ignore", "config.on_nonfinite must be one of")])
def test_on_nonfinite_choices(value, match):
  with pytest.raises(ValueError, match=match):
    tr.validate_config(_config(on_nonfinite=value))
  assert tr.validate_config(_config(on_nonfinite="skip_step")).on_nonfinite == "skip_step"
