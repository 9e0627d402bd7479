"""Damaged files are named and recovered from: model checkpoints
(`restore_params` → CheckpointError) and cached experiment stages (`Stages`,
keyed by what they depend on)."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from etils import epath

from specjax.checkpoints import CheckpointError, params_digest, restore_params, save_params
from experiments.programs.stages import Stages, array_digest, first_difference, fingerprint
from specjax.models.decoder import DecoderLM, decoder_config

from memgcs import memgcs  # noqa: F401  (the gs:// fixture)
from memgcs import objects as memgcs_objects

LM = DecoderLM(decoder_config("tiny", vocab_size=64, num_layers=1))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  params = LM.init(jax.random.PRNGKey(0))
  root = tmp_path_factory.mktemp("ckpt")
  save_params(str(root / "model"), params, LM.config)
  return root / "model", params


def _copy(saved, tmp_path):
  directory, params = saved
  dest = tmp_path / "model"
  shutil.copytree(directory, dest)
  return dest, params


def _largest(directory):
  files = [os.path.join(b, f) for b, _, fs in os.walk(directory) for f in fs]
  return max(files, key=os.path.getsize)


def test_intact_checkpoint_round_trips_with_its_digest(saved):
  directory, params = saved
  restored, config = restore_params(str(directory), LM.config)
  assert config == LM.config and params_digest(restored) == params_digest(params)
  manifest = json.loads((directory / "integrity.json").read_text())
  assert manifest["params_sha256"] == params_digest(params)
  assert all(name.startswith("params/") for name in manifest["files"])
  # The digest sees values, dtypes and names.
  leaves, treedef = jax.tree_util.tree_flatten(params)
  changed = jax.tree_util.tree_unflatten(treedef, [leaves[0] + 1] + leaves[1:])
  assert params_digest(changed) != params_digest(params)
  halved = jax.tree_util.tree_unflatten(treedef, [leaves[0].astype("float16")] + leaves[1:])
  assert params_digest(halved) != params_digest(params)


def test_truncated_params_file_is_named(saved, tmp_path, capfd):
  directory, _ = _copy(saved, tmp_path)
  path = _largest(directory / "params")
  with open(path, "r+b") as f:
    f.truncate(10)
  with pytest.raises(CheckpointError) as err:
    restore_params(str(directory), LM.config)
  e = err.value
  assert e.kind == "truncated" and e.directory == str(directory)
  rel = os.path.relpath(path, directory)
  assert f"{rel} holds 10 bytes" in str(e) and "Delete it" in str(e)
  # Saved before manifests existed: orbax's own error, in one line, no asyncio noise.
  os.remove(directory / "integrity.json")
  with pytest.raises(CheckpointError) as err:
    restore_params(str(directory), LM.config)
  assert err.value.kind == "truncated" and "orbax cannot read params/" in str(err.value)
  assert len(str(err.value)) < 800
  captured = capfd.readouterr()
  assert "Event loop is closed" not in captured.err
  assert "exception was never retrieved" not in captured.err


def test_missing_and_unreadable_config_and_corrupt_values(saved, tmp_path):
  directory, _ = _copy(saved, tmp_path)
  (directory / "config.json").write_text('{"class": "specjax.mo')
  with pytest.raises(CheckpointError, match="config.json cannot be read") as err:
    restore_params(str(directory))
  assert err.value.kind == "unreadable"
  os.remove(directory / "config.json")
  with pytest.raises(CheckpointError, match="config.json is missing") as err:
    restore_params(str(directory))
  assert err.value.kind == "missing"
  with pytest.raises(FileNotFoundError):
    restore_params(str(tmp_path / "nothing-here"))
  # Same sizes, other bytes: the digest of the restored values tells.
  directory, _ = _copy(saved, tmp_path / "b")
  restored, _ = restore_params(str(directory))
  doubled = jax.tree_util.tree_map(lambda x: np.asarray(x) * 2, restored)
  shutil.rmtree(directory / "params")
  import orbax.checkpoint as ocp
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(str(directory / "params"), doubled)
  manifest = json.loads((directory / "integrity.json").read_text())
  manifest["files"] = {k: os.path.getsize(directory / k) for k in
                       [os.path.relpath(os.path.join(b, f), directory)
                        for b, _, fs in os.walk(directory / "params") for f in fs]}
  (directory / "integrity.json").write_text(json.dumps(manifest))
  with pytest.raises(CheckpointError, match="differ from the digest") as err:
    restore_params(str(directory))
  assert err.value.kind == "corrupt"
  assert restore_params(str(directory), verify=False)[1] == LM.config


def test_config_mismatch_is_a_checkpoint_error(saved):
  directory, _ = saved
  with pytest.raises(CheckpointError, match="num_layers") as err:
    restore_params(str(directory), LM.config.replace(num_layers=2))
  assert err.value.kind == "config_mismatch" and isinstance(err.value, ValueError)


# --------------------------------------------------------------------------- stages


def test_stages_reuse_only_what_was_computed_from_the_same_inputs(tmp_path):
  stages = Stages(str(tmp_path / "stages"))
  calls = []

  def measure(x):
    calls.append(x)
    return {"value": x}
  deps = {"target": "aa", "draft": "bb", "sampling": {"temperature": 1.0}}
  assert stages.run("t1/chunk0/small/g2", lambda: measure(1), deps) == {"value": 1}
  again = Stages(str(tmp_path / "stages"))  # A new run reads it from disk.
  assert again.run("t1/chunk0/small/g2", lambda: measure(2), deps) == {"value": 1}
  assert again.reused == ["t1/chunk0/small/g2"] and calls == [1]
  changed = dict(deps, sampling={"temperature": 0.7})
  assert again.run("t1/chunk0/small/g2", lambda: measure(3), changed) == {"value": 3}
  assert again.recomputed["t1/chunk0/small/g2"] == "sampling.temperature changed"
  assert again.computed == ["t1/chunk0/small/g2"]
  assert (tmp_path / "stages" / "t1" / "chunk0" / "small" / "g2.json").exists()
  # Informational entries keep their first value.
  again.note("timing/a", 1.5)
  again.note("timing/a", 9.0)
  again.note("timing/b/c", 2.0)
  assert again.values("timing") == {"a": 1.5, "b/c": 2.0}
  assert again.summary()["computed"] == 1
  with pytest.raises(ValueError, match="stage name"):
    again.path("../escape")
  with pytest.raises(ValueError, match="stage name"):
    again.path("a b")


def test_an_unreadable_stage_file_is_named_and_recomputed_alone(tmp_path, caplog):
  stages = Stages(str(tmp_path))
  stages.put("a/chunk0", [1, 2], {"x": 1})
  stages.put("a/chunk1", [3, 4], {"x": 1})
  path = stages.path("a/chunk0")
  with open(path, "r+b") as f:
    f.truncate(20)
  fresh = Stages(str(tmp_path))
  with caplog.at_level("WARNING"):
    assert fresh.run("a/chunk0", lambda: [5], {"x": 1}) == [5]
  assert path in caplog.text and "unreadable" in caplog.text
  assert fresh.run("a/chunk1", lambda: [6], {"x": 1}) == [3, 4]
  assert Stages(str(tmp_path)).get("a/chunk0", {"x": 1}) == [5]


def test_stages_on_gs_resume_and_recover(memgcs, caplog):
  """A workdir on an object store (gs://, from memory): a killed run's stages are reused by the
  next (a new Stages object), and a corrupt stage object is named and recomputed alone."""
  root = "gs://bucket/run/stages"
  stages = Stages(root)
  assert stages.directory == root
  calls = []

  def measure(x):
    calls.append(x)
    return {"value": x}
  for i in range(3):
    stages.run(f"t1/chunk{i}", lambda i=i: measure(i), {"x": i})
  stages.note("timing/t1", 1.5)
  assert calls == [0, 1, 2]
  assert memgcs_objects() == [f"{root}/t1/chunk{i}.json" for i in range(3)] + [
      f"{root}/timing/t1.json"]
  # The run is killed; the next one reads every stage from the bucket.
  again = Stages(root)
  for i in range(3):
    assert again.run(f"t1/chunk{i}", lambda: measure(-1), {"x": i}) == {"value": i}
  assert calls == [0, 1, 2] and again.computed == [] and len(again.reused) == 3
  assert again.values("timing") == {"t1": 1.5} and again.values("t1")["chunk2"] == {"value": 2}
  # A truncated object (a copy cut short) is named in the log and recomputed alone.
  path = epath.Path(again.path("t1/chunk1"))
  path.write_bytes(path.read_bytes()[:20])
  fresh = Stages(root)
  with caplog.at_level("WARNING"):
    assert fresh.run("t1/chunk1", lambda: measure(7), {"x": 1}) == {"value": 7}
  assert f"{root}/t1/chunk1.json" in caplog.text and "unreadable" in caplog.text
  assert fresh.recomputed["t1/chunk1"].startswith("unreadable file")
  assert fresh.run("t1/chunk0", lambda: measure(-1), {"x": 0}) == {"value": 0}
  assert calls == [0, 1, 2, 7] and Stages(root).get("t1/chunk1", {"x": 1}) == {"value": 7}
  # A changed input recomputes just that stage and names the field.
  assert fresh.run("t1/chunk2", lambda: measure(9), {"x": 5}) == {"value": 9}
  assert fresh.recomputed["t1/chunk2"] == "x changed"


def test_fingerprints_and_differences():
  assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
  assert fingerprint({"a": 1}) != fingerprint({"a": 2})
  assert first_difference({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}}) == "a.c"
  assert first_difference({"a": 1}, {"a": 1}) is None
  assert first_difference(None, {"a": 1}) == "(the whole value)"
  x = np.arange(6, dtype=np.int32).reshape(2, 3)
  assert array_digest(x) == array_digest(x.copy()) != array_digest(x.reshape(3, 2))
  assert array_digest(x) != array_digest(x.astype(np.int64))
