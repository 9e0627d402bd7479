"""Atomic files, the one implementation every writer in specjax uses.

A destination is a local path or a URL of another filesystem (`gs://bucket/run/x.json`, any
`str`, `os.PathLike` or `etils.epath.Path`; `is_local` tells which).

Local: a file is written to a temporary file in the destination's directory, given the usual
mode (0666 minus the umask: `mkstemp`'s 0600 would leave results readable by their owner only),
then moved over the destination with `os.replace`. A reader sees the old file or the new one,
never a partial one; a failing writer leaves the destination as it was.

Not local (gs://, s3://, ... through `etils.epath`): one upload of the final object. An object
store publishes an object only when its upload completes, and its "rename" is a copy plus a
delete, so a temporary object would double the traffic for no extra safety. `atomic_path` gives
writers that need a local file name (matplotlib, safetensors) a local temporary file.
`atomic_dir` publishes a directory whole, `move_tree` moves one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Iterator, Union

from etils import epath

__all__ = ["PathLike", "is_local", "as_path", "atomic_path", "atomic_write_bytes",
           "atomic_write_text", "atomic_write_json", "append_text", "atomic_dir", "move_tree"]

PathLike = Union[str, os.PathLike, epath.Path]


def is_local(path: PathLike) -> bool:
  """False for a URL of another filesystem (`gs://...`, `s3://...`), True for a local path."""
  return "://" not in os.fspath(path)


def as_path(path: PathLike) -> epath.Path:
  """`path` as an `etils.epath.Path`: a local one made absolute, a URL kept as it is."""
  if is_local(path):
    return epath.Path(os.path.abspath(os.fspath(path)))
  return epath.Path(path)


def _umask() -> int:
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[str]:
  """Yields a temporary local path for a writer to fill; when the block ends without an error it
  becomes `path` (local: `os.replace`; a URL: one upload), otherwise it is removed. The temporary
  name ends with `path`'s name, so writers that choose a format by extension keep it."""
  if not is_local(path):
    dest = epath.Path(path)
    with tempfile.TemporaryDirectory(prefix="specjax-upload-") as d:
      tmp = os.path.join(d, ".tmp-" + dest.name)
      yield tmp
      with open(tmp, "rb") as f:
        _write_object(dest, f.read())
    return
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


def _write_object(dest: epath.Path, data: bytes) -> None:
  """One upload of `data` as the object `dest` (see the module doc)."""
  dest.parent.mkdir(parents=True, exist_ok=True)  # no-op on object stores, kept for others
  dest.write_bytes(data)


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
  """Writes `data` to `path` atomically (creating its directory)."""
  if not is_local(path):
    _write_object(epath.Path(path), bytes(data))
    return
  with atomic_path(path) as tmp, open(tmp, "wb") as f:
    f.write(data)


def atomic_write_text(path: PathLike, text: str) -> None:
  """Writes UTF-8 `text` to `path` atomically."""
  atomic_write_bytes(path, text.encode("utf-8"))


def append_text(path: PathLike, text: str) -> None:
  """Appends UTF-8 `text` to the file `path` (created if missing). An object store cannot append:
  the object is read and rewritten whole (fine for a run's metrics.jsonl, not for big files)."""
  if is_local(path):
    with open(path, "a", encoding="utf-8") as f:
      f.write(text)
    return
  dest = epath.Path(path)
  atomic_write_text(dest, (dest.read_text() if dest.exists() else "") + text)


def atomic_write_json(path: PathLike, obj: Any, indent: int = 1, **dumps_kw) -> None:
  """Writes `obj` as JSON (keys sorted) to `path` atomically; `dumps_kw` go to `json.dumps`."""
  atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=True, **dumps_kw))


@contextlib.contextmanager
def atomic_dir(path: PathLike) -> Iterator[str]:
  """Yields a directory for a writer to fill, which replaces the directory `path` whole when the
  block ends without an error.

  Local: `<path>.tmp-<pid>`, renamed to `path` (a previous `path` is first renamed to
  `<path>.old-<pid>`, removed after), so `path` is the old or the new complete directory; a
  failed block leaves `path` as it was. Not local (no directory rename): `path` itself, emptied
  and written in place; the writer must make an incomplete directory recognisable (a marker
  file written last)."""
  if not is_local(path):
    dest = epath.Path(path)
    dest.rmtree(missing_ok=True)
    yield os.fspath(dest)
    return
  final = os.path.abspath(os.fspath(path))
  tmp, old = f"{final}.tmp-{os.getpid()}", f"{final}.old-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  if os.path.exists(final):
    os.rename(final, old)
  os.rename(tmp, final)
  shutil.rmtree(old, ignore_errors=True)


def move_tree(src: PathLike, dest: PathLike) -> None:
  """Moves the directory `src` to `dest`: one `os.rename` on a local disk; elsewhere (an object
  store has no rename) every file is copied, then the source tree removed."""
  if is_local(src):
    os.rename(src, dest)
    return
  src, dest = epath.Path(src), epath.Path(dest)
  for item in src.iterdir():
    if item.is_dir():
      move_tree(item, dest / item.name)
    else:
      dest.mkdir(parents=True, exist_ok=True)
      item.copy(dest / item.name)
  src.rmtree(missing_ok=True)
