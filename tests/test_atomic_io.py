"""Every atomic writer of specjax: content, the usual file mode (umask
applied, not mkstemp's 0600), nothing left behind, and a failed write that
leaves the old file in place."""

import json
import os
import stat

import numpy as np
import pytest

from specjax import atomic_io
from specjax.checkpoints.hf_common import load_state_dict, save_safetensors
from specjax.data import common as data_common


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
