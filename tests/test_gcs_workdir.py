"""A workdir on an object store: what a run reads and writes under `gs://bucket/run`, served from
memory (tests/memgcs.py). Stages are covered in test_recovery, atomic writes in test_atomic_io.

Not covered (yet): the end-to-end micro run on gs://. orbax writes array data through
tensorstore's own "gcs" kvstore driver, not fsspec, so training checkpoints cannot live on the
in-memory filesystem; see the module doc of tests/memgcs.py."""

import json

import pytest
from etils import epath

from specjax.atomic_io import atomic_write_json
from specjax.checkpoints import CheckpointError, integrity
from specjax.checkpoints.orbax_io import config_to_dict, read_config
from experiments.programs import common
from specjax.models.decoder import decoder_config

from memgcs import memgcs  # noqa: F401  (the gs:// fixture)
from memgcs import objects


def test_model_directory_config_and_manifest_on_gs(memgcs):
  """read_config, the manifest and the file checks of a model directory under gs://."""
  d = "gs://bucket/run/draft/final"
  with pytest.raises(FileNotFoundError, match=d):
    read_config(d)
  config = decoder_config("tiny", vocab_size=64, num_layers=1)
  (epath.Path(d) / "params" / "shard").mkdir(parents=True, exist_ok=True)
  (epath.Path(d) / "params" / "shard" / "0").write_bytes(b"x" * 10)
  (epath.Path(d) / "params" / "meta").write_bytes(b"y" * 3)
  with pytest.raises(CheckpointError, match="config.json is missing"):
    read_config(d)
  atomic_write_json(f"{d}/config.json", config_to_dict(config), indent=2)
  assert read_config(d) == config
  assert integrity.file_manifest(d) == {"params/meta": 3, "params/shard/0": 10}
  integrity.write_manifest(d, "digest")
  manifest = integrity.read_manifest(d)
  assert manifest["params_sha256"] == "digest"
  integrity.check_files(d, manifest)
  (epath.Path(d) / "params" / "shard" / "0").write_bytes(b"x" * 4)
  with pytest.raises(CheckpointError, match="holds 4 bytes, the save wrote 10"):
    integrity.check_files(d, manifest)
  (epath.Path(d) / "params" / "meta").unlink()
  with pytest.raises(CheckpointError, match="params/meta is missing"):
    integrity.check_files(d, manifest)
  assert objects() == [f"{d}/config.json", f"{d}/{integrity.MANIFEST}", f"{d}/params/shard/0"]


def test_train_meta_and_results_are_read_from_gs(memgcs, tmp_path):
  run = "gs://bucket/run"
  assert common._read_train_meta(f"{run}/target/final/train_meta.json") is None
  atomic_write_json(f"{run}/target/final/train_meta.json", {"steps": 3})
  assert common._read_train_meta(f"{run}/target/final/train_meta.json") == {"steps": 3}
  epath.Path(f"{run}/target/final/train_meta.json").write_text("{trunc")
  assert common._read_train_meta(f"{run}/target/final/train_meta.json") is None  # logged
  # find_tokenizer takes the vocabulary a run used from <workdir>/results/results.json.
  atomic_write_json(f"{run}/results/results.json", {"vocab": {"path": str(tmp_path / "none")}})
  assert common.find_tokenizer(str(tmp_path), "spm", 64, workdir=run) == (None, None)
  assert json.loads(epath.Path(f"{run}/results/results.json").read_text())["vocab"]


def test_compilation_cache_on_gs_creates_no_local_directory(memgcs, tmp_path, monkeypatch):
  import jax
  monkeypatch.chdir(tmp_path)
  before = jax.config.jax_compilation_cache_dir
  try:
    common.enable_compilation_cache("gs://bucket/run/jax_cache")
    assert jax.config.jax_compilation_cache_dir == "gs://bucket/run/jax_cache"
    assert list(tmp_path.iterdir()) == []  # no ./gs:/bucket/... directory
  finally:
    jax.config.update("jax_compilation_cache_dir", before)


def test_tensorboard_scalars_are_skipped_for_a_gs_workdir(memgcs, tmp_path, monkeypatch):
  from experiments.programs import placement
  monkeypatch.chdir(tmp_path)
  placement.write_scalars("gs://bucket/run", {"a": 1.0})
  assert objects() == [] and list(tmp_path.iterdir()) == []


def test_logs_distillation_data_and_head_directories_on_gs(memgcs, tmp_path):
  """What the drafter trainers write besides orbax: metrics appended (an object
  store cannot append: rewritten whole), distillation data, head accuracies."""
  import numpy as np
  from specjax.atomic_io import append_text
  from specjax.checkpoints.heads import final_dir
  from specjax.training.heads import DistillData
  log = "gs://bucket/heads/metrics.jsonl"
  for step in (1, 2, 3):
    append_text(log, json.dumps({"step": step}) + "\n")
  assert [json.loads(line)["step"] for line in epath.Path(log).read_text().splitlines()] \
      == [1, 2, 3]
  local = tmp_path / "m.jsonl"
  append_text(local, "a\n")
  append_text(local, "b\n")
  assert local.read_text() == "a\nb\n"
  data = DistillData(tokens=np.arange(12, dtype=np.int32).reshape(3, 4),
                     generated=np.arange(12).reshape(3, 4) % 2 == 0)
  data.save("gs://bucket/heads/distill_train.npz")
  back = DistillData.load("gs://bucket/heads/distill_train.npz")
  np.testing.assert_array_equal(back.tokens, data.tokens)
  np.testing.assert_array_equal(back.generated, data.generated)
  assert final_dir("gs://bucket/heads") == "gs://bucket/heads/final"
  atomic_write_json("gs://bucket/heads/final/config.json", {})
  assert final_dir("gs://bucket/heads/final") == "gs://bucket/heads/final"
  assert "gs://bucket/heads/distill_train.npz" in objects()
