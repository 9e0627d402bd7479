"""Atomic files, the one implementation every writer in specjax uses.

A file is written to a temporary file in the destination's directory, given
the usual mode (0666 minus the umask: `tempfile.mkstemp` creates 0600 files,
which would leave results readable by their owner only), then moved over the
destination with `os.replace`. A reader sees the old file or the new one,
never a partial one; a writer that fails leaves the destination as it was and
removes its temporary file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Iterator

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text", "atomic_write_json"]


def _umask() -> int:
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
  """Yields a temporary path next to `path` for a writer to fill; when the
  block ends without an error it gets the usual file mode and replaces
  `path`, otherwise it is removed. The temporary name ends with `path`'s
  name, so writers that choose a format by extension (matplotlib) keep it."""
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
  os.close(fd)
  try:
    yield tmp
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
  """Writes `data` to `path` atomically (creating its directory)."""
  with atomic_path(path) as tmp, open(tmp, "wb") as f:
    f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
  """Writes UTF-8 `text` to `path` atomically."""
  atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 1, **dumps_kw) -> None:
  """Writes `obj` as JSON (keys sorted) to `path` atomically; `dumps_kw` go
  to `json.dumps` (e.g. `default=str`)."""
  atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=True, **dumps_kw))
