"""A `gs://` filesystem in memory, for tests of workdirs on object stores.

`etils.epath.Path("gs://bucket/x")` reaches GCS through fsspec (`fsspec.filesystem("gcs")`,
gcsfs, when TensorFlow is not installed). The `memgcs` fixture registers `MemGCS`, fsspec's
in-memory filesystem under the "gs"/"gcs" protocols, with gcsfs's path form ("bucket/path", no
root marker), so real `gs://` strings are served from a dict that the fixture empties before and
after each test. What it lacks against GCS: no mtimes (stat gives 0), directories are pseudo
entries (GCS has none), and `epath.Path.walk` yields paths without the `gs://` prefix (gcsfs does
the same), so code that lists a workdir uses `iterdir`/`glob`.
"""

from __future__ import annotations

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem


class MemGCS(MemoryFileSystem):
  protocol = ("gs", "gcs")
  root_marker = ""
  store: dict = {}  # own class-level store, not memory://'s
  pseudo_dirs = [""]

  @classmethod
  def _strip_protocol(cls, path):
    path = fsspec.utils.stringify_path(path)
    for prefix in ("gs://", "gcs://"):
      if path.startswith(prefix):
        path = path[len(prefix):]
    return path.strip("/")


def clear() -> None:
  MemGCS.store.clear()
  MemGCS.pseudo_dirs[:] = [""]


def objects() -> list:
  """The `gs://` URLs of every object stored."""
  return sorted("gs://" + k for k in MemGCS.store)


@pytest.fixture
def memgcs(monkeypatch):
  """gs:// served from memory for this test (see the module doc)."""
  from etils.epath import backend, gpath
  monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)  # epath would pick tf.io.gfile
  for proto in ("gs", "gcs"):
    fsspec.register_implementation(proto, MemGCS, clobber=True)
  backend.fsspec_backend._get_filesystem.cache_clear()  # drop a cached real gcsfs, if any
  clear()
  yield MemGCS
  clear()
  backend.fsspec_backend._get_filesystem.cache_clear()
