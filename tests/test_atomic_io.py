"""Every atomic writer of specjax: content, the usual file mode (umask
applied, not mkstemp's 0600), nothing left behind, and a failed write that
leaves the old file in place."""

import json
import os
import stat

import numpy as np
import pytest
from etils import epath

from specjax import atomic_io
from specjax.checkpoints.hf_common import load_state_dict, save_safetensors
from experiments.data import common as data_common

from memgcs import memgcs, objects  # noqa: F401  (memgcs: the gs:// fixture)


@pytest.fixture
def umask_022():
  old = os.umask(0o022)
  yield
  os.umask(old)


def _mode(path) -> int:
  return stat.S_IMODE(os.stat(path).st_mode)


def _writers(tmp_path):
  yield "atomic_write_text", tmp_path / "a.txt", lambda p: atomic_io.atomic_write_text(p, "hi")
  yield "atomic_write_json", tmp_path / "a.json", lambda p: atomic_io.atomic_write_json(p, {"a": 1})
  yield "data.common", tmp_path / "b.txt", lambda p: data_common.atomic_write_text(p, "hi")
  yield "safetensors", tmp_path / "m.safetensors", lambda p: save_safetensors(
      {"w": np.ones((2, 3), np.float32)}, str(p))


def test_writers_publish_with_the_usual_mode(tmp_path, umask_022):
  for name, path, write in _writers(tmp_path / "sub"):  # the directory is created
    write(path)
    assert path.exists(), name
    assert _mode(path) == 0o644, (name, oct(_mode(path)))
  assert sorted(p.name for p in (tmp_path / "sub").iterdir() if p.name.startswith(".tmp")) == []
  assert json.loads((tmp_path / "sub" / "a.json").read_text()) == {"a": 1}
  np.testing.assert_array_equal(load_state_dict(str(tmp_path / "sub" / "m.safetensors"))["w"],
                                np.ones((2, 3), np.float32))


def test_a_failed_write_keeps_the_old_file(tmp_path):
  path = tmp_path / "x.txt"
  atomic_io.atomic_write_text(path, "old")
  with pytest.raises(RuntimeError, match="boom"):
    with atomic_io.atomic_path(path) as tmp:
      with open(tmp, "w") as f:
        f.write("partial")
      raise RuntimeError("boom")
  assert path.read_text() == "old"
  assert [p.name for p in tmp_path.iterdir()] == ["x.txt"]


def test_temporary_name_keeps_the_extension(tmp_path):
  with atomic_io.atomic_path(tmp_path / "plot.png") as tmp:
    assert tmp.endswith("plot.png") and os.path.dirname(tmp) == str(tmp_path)
    open(tmp, "wb").close()
  assert (tmp_path / "plot.png").exists()


# A destination on an object store (gs://, served from memory by tests/memgcs.py): the object
# is written in one upload, no temporary object is ever stored, a failed block uploads nothing.
def test_writers_on_gs(memgcs):
  atomic_io.atomic_write_text("gs://bucket/run/a.txt", "hi")
  atomic_io.atomic_write_json(epath.Path("gs://bucket/run/sub/a.json"), {"a": 1})
  atomic_io.atomic_write_bytes("gs://bucket/run/b.bin", b"\x00\x01")
  with atomic_io.atomic_path("gs://bucket/run/plot.png") as tmp:
    assert tmp.endswith("plot.png") and atomic_io.is_local(tmp)
    with open(tmp, "wb") as f:
      f.write(b"png")
  assert objects() == ["gs://bucket/run/a.txt", "gs://bucket/run/b.bin",
                       "gs://bucket/run/plot.png", "gs://bucket/run/sub/a.json"]
  assert epath.Path("gs://bucket/run/a.txt").read_text() == "hi"
  assert json.loads(epath.Path("gs://bucket/run/sub/a.json").read_text()) == {"a": 1}
  assert epath.Path("gs://bucket/run/b.bin").read_bytes() == b"\x00\x01"
  assert epath.Path("gs://bucket/run/plot.png").read_bytes() == b"png"
  assert not os.path.exists(tmp)  # the local temporary file is gone


def test_a_failed_write_on_gs_keeps_the_old_object(memgcs):
  atomic_io.atomic_write_text("gs://bucket/x.txt", "old")
  with pytest.raises(RuntimeError, match="boom"):
    with atomic_io.atomic_path("gs://bucket/x.txt") as tmp:
      with open(tmp, "w") as f:
        f.write("partial")
      raise RuntimeError("boom")
  assert epath.Path("gs://bucket/x.txt").read_text() == "old"
  assert objects() == ["gs://bucket/x.txt"]
  assert not os.path.exists(tmp)


def test_is_local_and_as_path(tmp_path):
  assert atomic_io.is_local(tmp_path) and atomic_io.is_local("rel/x")
  assert atomic_io.is_local(epath.Path(tmp_path))
  assert not atomic_io.is_local("gs://b/x") and not atomic_io.is_local(epath.Path("gs://b/x"))
  assert os.fspath(atomic_io.as_path("gs://b/x")) == "gs://b/x"
  assert os.fspath(atomic_io.as_path("rel")) == os.path.abspath("rel")


def test_atomic_dir_replaces_a_directory_whole(tmp_path):
  dest = tmp_path / "final"
  with atomic_io.atomic_dir(dest) as d:
    assert not dest.exists()   # written beside it, published at the end
    os.makedirs(d)
    (epath.Path(d) / "a.txt").write_text("new")
  assert (dest / "a.txt").read_text() == "new"
  (dest / "stale.txt").write_text("old")
  with pytest.raises(RuntimeError, match="boom"):
    with atomic_io.atomic_dir(dest) as d:
      os.makedirs(d)
      (epath.Path(d) / "a.txt").write_text("partial")
      raise RuntimeError("boom")
  assert sorted(p.name for p in dest.iterdir()) == ["a.txt", "stale.txt"]
  assert (dest / "a.txt").read_text() == "new"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]   # no temporary left
  with atomic_io.atomic_dir(dest) as d:
    os.makedirs(d)
    (epath.Path(d) / "b.txt").write_text("b")
  assert sorted(p.name for p in dest.iterdir()) == ["b.txt"]   # the old one is gone whole
  assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_atomic_dir_and_move_tree_on_gs(memgcs):
  atomic_io.atomic_write_text("gs://bucket/run/final/old.txt", "old")
  with atomic_io.atomic_dir("gs://bucket/run/final") as d:
    assert d == "gs://bucket/run/final" and objects() == []   # emptied, written in place
    atomic_io.atomic_write_text(f"{d}/a.txt", "new")
  assert objects() == ["gs://bucket/run/final/a.txt"]
  atomic_io.atomic_write_text("gs://bucket/run/final/sub/b.txt", "b")
  atomic_io.move_tree("gs://bucket/run/final", "gs://bucket/aside/final")
  assert objects() == ["gs://bucket/aside/final/a.txt", "gs://bucket/aside/final/sub/b.txt"]
  assert epath.Path("gs://bucket/aside/final/sub/b.txt").read_text() == "b"


def test_move_tree_renames_locally(tmp_path):
  (tmp_path / "src" / "sub").mkdir(parents=True)
  (tmp_path / "src" / "sub" / "x.txt").write_text("x")
  atomic_io.move_tree(tmp_path / "src", tmp_path / "dest")
  assert not (tmp_path / "src").exists()
  assert (tmp_path / "dest" / "sub" / "x.txt").read_text() == "x"
