"""Sharded training (`specjax.training.mesh`) on 8 CPU devices (tests/conftest.py).

The reference is the single-device run of the same config. The runs distil
from a teacher (distill_weight 0.5), so the teacher's frozen params go over
the mesh too, and its KL is in the compared loss.

Tolerances: per-step losses (training and validation) within 1e-5 absolute
— they are 2 to 4 here, so that is also < 5e-6 relative; measured: < 1e-6.
Final parameters within 1e-5 absolute (measured: up to 4e-6).
"""

import json
import os

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from specjax import training as tr
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.parallel.sharding import MODEL, fsdp_spec, make_mesh
from specjax.training import mesh as mesh_lib
from specjax.training.checkpoint import Checkpointer
from specjax.training.steps import StepSpec, init_params, init_state

VOCAB = 32
# d_model 32, mlp 64: every matrix has an axis that 4 (the model axis) divides.
STUDENT = DecoderLM(decoder_config("tiny", vocab_size=VOCAB, num_layers=1, d_model=32,
                                   num_heads=2, num_kv_heads=2, head_dim=16, mlp_dim=64))
STEPS = 5
DISTILL = 0.5
LOSS_ATOL = 1e-5
PARAM_ATOL = 1e-5


def _config(mesh=(1, 1), **kw):
  c = tr.default_config()
  c.steps = STEPS
  c.batch_size = 8
  c.learning_rate = 1e-2
  c.warmup_steps = 1
  c.checkpoint_every = STEPS
  c.log_every = 1
  c.eval_every = 0
  c.eval_batches = 1
  c.distill_weight = DISTILL
  c.mesh_data, c.mesh_model = mesh
  for k, v in kw.items():
    c[k] = v
  return c


def _source():
  ex = tr.synthetic_examples("reverse", 64, VOCAB, 2, 6, seed=0)
  ex = [tr.Example(np.append(e.prompt, tr.EOS_ID), e.target) for e in ex]
  return tr.LMSource(ex, 16)


def _spec(config) -> StepSpec:
  """The StepSpec `train_model` builds from `config` (one compiled step)."""
  return StepSpec(model=STUDENT, optimizer=tr.OptimizerSpec.from_config(config), teacher=STUDENT,
                  distill_weight=DISTILL)


def _train(mesh, workdir, stop_at_step=None, **kw):
  """`train_model` on `mesh`, distilling; validation unless eval_batches=0."""
  src = _source()
  config = _config(mesh, **kw)
  return tr.train_model(STUDENT, None, src, config, str(workdir),
                        teacher=(STUDENT, init_params(STUDENT, 1)),
                        eval_dataset=src if config.eval_batches else None,
                        stop_at_step=stop_at_step)


def _records(workdir):
  """(train loss by step, validation CE by step) from metrics.jsonl."""
  lines = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  train = {l["step"]: l["loss"] for l in lines if "loss" in l}
  evals = {l["step"]: l["eval_ce"] for l in lines if "eval_ce" in l}
  return train, evals


def _max_diff(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Uninterrupted runs on one device and on a 2 x 4 mesh: {name: (workdir, params)}."""
  out = {}
  for name, mesh in (("single", (1, 1)), ("2x4", (2, 4))):
    work = str(tmp_path_factory.mktemp(name))
    out[name] = (work, _train(mesh, work))
  return out


def test_fsdp_spec_splits_the_largest_divisible_axis():
  mesh = make_mesh(2, 4)
  assert fsdp_spec((32, 64), mesh) == P(None, MODEL)
  assert fsdp_spec((64, 64), mesh) == P(MODEL, None)      # A tie: the first axis.
  assert fsdp_spec((6, 32, 2), mesh) == P(None, MODEL, None)
  assert fsdp_spec((6, 3), mesh) == P(None, None)        # Nothing divisible: replicated.
  assert fsdp_spec((), mesh) == P()
  assert fsdp_spec((32, 64), make_mesh(8, 1)) == P(None, None)
  with pytest.raises(ValueError, match="axis must be one of"):
    fsdp_spec((8,), mesh, axis="heads")


@pytest.mark.parametrize("mesh", [(2, 4), (8, 1)], ids=["2x4", "8x1"])
def test_sharded_losses_match_one_device(runs, mesh, tmp_path):
  single_dir, single_params = runs["single"]
  if mesh == (2, 4):
    work, params = runs["2x4"]
  else:
    work, params = str(tmp_path), _train(mesh, tmp_path, eval_batches=0)
  ref_train, ref_eval = _records(single_dir)
  got_train, got_eval = _records(work)
  assert sorted(got_train) == list(range(1, STEPS + 1))
  diffs = [abs(got_train[s] - ref_train[s]) for s in ref_train]
  if mesh == (2, 4):
    assert sorted(got_eval) == [0, STEPS]
    diffs += [abs(got_eval[s] - ref_eval[s]) for s in ref_eval]
  assert max(diffs) <= LOSS_ATOL, (diffs, ref_train, got_train)
  assert ref_train[STEPS] < ref_train[1]  # It trains at all.
  assert _max_diff(params, single_params) <= PARAM_ATOL
  # The returned params live on the mesh; with a model axis, split over it.
  leaves = jax.tree_util.tree_leaves(params)
  assert all(len(x.sharding.device_set) == 8 for x in leaves)
  if mesh[1] > 1:
    kernel = params["layer_0"]["up"]["kernel"]  # [32, 64]
    assert kernel.sharding.spec == P(None, MODEL), kernel.sharding
    assert all(MODEL in x.sharding.spec for x in leaves)  # Here every leaf has a divisible axis.


def test_the_state_stays_split_over_the_model_axis():
  """One sharded step by hand: params and optimizer-state leaves (Adam's
  moments) come out split over `model`, the batch goes over `data`, and the
  teacher's params over `model`."""
  mesh = make_mesh(2, 4)
  spec = _spec(_config((2, 4)))
  state = mesh_lib.shard_state(init_state(spec, init_params(STUDENT, 0), 0), mesh)
  batch = mesh_lib.shard_rows(_source().batch(0, 0, 8), mesh)
  assert batch["tokens"].sharding.spec == P("data")
  teacher = mesh_lib.shard_tree(init_params(STUDENT, 1), mesh)
  assert teacher["layer_0"]["up"]["kernel"].sharding.spec == P(None, MODEL)
  step = mesh_lib.sharded_train_step(spec, mesh, state)
  assert step is mesh_lib.sharded_train_step(spec, mesh, state)  # One compiled step per layout.
  state, metrics = step(state, batch, teacher)
  assert np.isfinite(float(metrics["loss"])) and float(metrics["kl_sum"]) > 0
  expected = mesh_lib.state_shardings(state, mesh)
  for got, want in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(expected)):
    assert got.sharding.is_equivalent_to(want, got.ndim), (got.sharding, want)
  moments = [x for x in jax.tree_util.tree_leaves(state.opt_state) if x.ndim >= 1]
  assert moments and all(MODEL in x.sharding.spec for x in moments)
  for x in moments:  # Each device holds a quarter of the leaf.
    assert x.addressable_shards[0].data.size * 4 == x.size


def test_resume_on_the_mesh_matches_an_uninterrupted_run(runs, tmp_path):
  full_dir, full_params = runs["2x4"]
  full_train, _ = _records(full_dir)
  work = tmp_path / "mesh"
  _train((2, 4), work, stop_at_step=3, eval_batches=0)
  resumed = _train((2, 4), work, eval_batches=0)
  train, _ = _records(work)
  assert [train[s] for s in range(1, STEPS + 1)] == [full_train[s] for s in range(1, STEPS + 1)]
  for a, b in zip(jax.tree_util.tree_leaves(resumed), jax.tree_util.tree_leaves(full_params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The checkpoint restores straight into the mesh layout.
  mesh = make_mesh(2, 4)
  like = mesh_lib.shard_state(init_state(_spec(_config()), init_params(STUDENT, 0), 0), mesh)
  ckpt = Checkpointer(str(work), keep=2, async_save=False)
  try:
    restored = ckpt.restore(3, like.to_dict())
  finally:
    ckpt.close()
  for got, want in zip(jax.tree_util.tree_leaves(restored),
                       jax.tree_util.tree_leaves(like.to_dict())):
    assert isinstance(got, jax.Array) and got.sharding == want.sharding
  # A mesh checkpoint resumes on one device too (the mesh is a run-only field).
  one = tmp_path / "one"
  _train((2, 4), one, stop_at_step=3, eval_batches=0)
  _train((1, 1), one, eval_batches=0)
  train, _ = _records(one)
  single_train, _ = _records(runs["single"][0])
  assert max(abs(train[s] - single_train[s]) for s in single_train) <= LOSS_ATOL


def test_mesh_config_errors():
  with pytest.raises(ValueError, match=r"config.batch_size \(6\) must be divisible by "
                                       r"config.mesh_data \(4\)"):
    tr.validate_config(_config((4, 2), batch_size=6))
  for field, value in (("mesh_data", 0), ("mesh_model", -2)):
    with pytest.raises(ValueError, match=f"config.{field} must be an int >= 1"):
      tr.validate_config(_config(**{field: value}))
  with pytest.raises(TypeError, match="config.mesh_model must be an int"):
    tr.validate_config(dict(_config().to_dict(), mesh_model=2.0))
  with pytest.raises(ValueError, match="needs 16 devices, 8 are available"):
    tr.train_model(STUDENT, None, _source(), _config((4, 4), distill_weight=0.0),
                   "/nonexistent-never-created")
  with pytest.raises(ValueError, match=r"has 6 rows, not divisible by the mesh's data axis \(4\)"):
    mesh_lib.shard_rows({"tokens": np.zeros((6, 16), np.int32)}, make_mesh(4, 2))


def test_medusa_heads_on_a_mesh_match_one_device(tmp_path):
  """`train_medusa` with train.mesh_data x train.mesh_model = 2 x 4: the same
  per-step losses as one device, the heads split over `model`."""
  import ml_collections
  from specjax.models.medusa_head import MedusaConfig
  from specjax.training.heads import DistillData, train_medusa
  lm, params = STUDENT, init_params(STUDENT, 0)  # The frozen target.
  config = MedusaConfig(num_heads=2, d_model=lm.config.d_model, vocab_size=lm.vocab_size)
  base = np.tile(np.arange(10, 20, dtype=np.int32), 4)[None, :24]
  tokens = np.concatenate([np.roll(base, s, axis=1) for s in range(8)])
  data = DistillData(tokens=tokens, generated=np.ones_like(tokens, bool))

  def train_config(mesh, **kw):
    return ml_collections.ConfigDict(dict(
        dict(steps=STEPS, batch_size=4, learning_rate=3e-3, warmup_steps=1,
             checkpoint_every=STEPS, log_every=1, seed=0, keep_checkpoints=1,
             mesh_data=mesh[0], mesh_model=mesh[1]), **kw))
  losses, heads = {}, {}
  for mesh in ((1, 1), (2, 4)):
    work = str(tmp_path / f"{mesh[0]}x{mesh[1]}")
    heads[mesh] = train_medusa(lm, params, config, data, None, train_config(mesh), work)["params"]
    lines = [json.loads(l) for l in open(os.path.join(work, "metrics.jsonl"))]
    losses[mesh] = np.array([l["loss"] for l in lines])
  assert len(losses[1, 1]) == STEPS
  np.testing.assert_allclose(losses[2, 4], losses[1, 1], rtol=0, atol=LOSS_ATOL)
  assert _max_diff(heads[2, 4], heads[1, 1]) <= PARAM_ATOL
  assert MODEL in heads[2, 4]["lm_head"].sharding.spec  # [K, E, V]
  with pytest.raises(ValueError, match=r"train.batch_size \(4\) must be divisible by "
                                       r"train.mesh_data \(8\)"):
    train_medusa(lm, params, config, data, None, train_config((8, 1)), str(tmp_path / "bad"))


def test_eagle3_head_on_a_mesh_matches_one_device(tmp_path):
  """`train_eagle` (EAGLE-3: fused features, training-time test) with
  train.mesh_data x train.mesh_model = 2 x 4: the same per-step losses as
  one device, the head split over `model`."""
  import ml_collections
  from specjax.models.eagle_head import EagleConfig
  from specjax.training.eagle import EagleLoss, train_eagle
  from specjax.training.heads import DistillData
  lm, params = STUDENT, init_params(STUDENT, 0)  # The frozen target.
  config = EagleConfig(d_model=lm.config.d_model, vocab_size=lm.vocab_size, num_heads=2,
                       mlp_dim=64, feature_layers=(0,))  # the student has one block
  base = np.tile(np.arange(10, 20, dtype=np.int32), 4)[None, :24]
  tokens = np.concatenate([np.roll(base, s, axis=1) for s in range(8)])
  data = DistillData(tokens=tokens, generated=np.ones_like(tokens, bool))
  loss = EagleLoss.for_version(3, unroll=2)
  losses, heads = {}, {}
  for mesh in ((1, 1), (2, 4)):
    work = str(tmp_path / f"{mesh[0]}x{mesh[1]}")
    train = ml_collections.ConfigDict(dict(
        steps=STEPS, batch_size=4, learning_rate=3e-3, warmup_steps=1, checkpoint_every=STEPS,
        log_every=1, seed=0, keep_checkpoints=1, mesh_data=mesh[0], mesh_model=mesh[1]))
    heads[mesh] = train_eagle(lm, params, config, data, None, train, work, loss=loss)["params"]
    lines = [json.loads(l) for l in open(os.path.join(work, "metrics.jsonl"))]
    losses[mesh] = np.array([l["loss"] for l in lines])
  assert len(losses[1, 1]) == STEPS
  np.testing.assert_allclose(losses[2, 4], losses[1, 1], rtol=0, atol=LOSS_ATOL)
  assert _max_diff(heads[2, 4], heads[1, 1]) <= PARAM_ATOL
  assert MODEL in heads[2, 4]["gate"].sharding.spec  # [E, F]
