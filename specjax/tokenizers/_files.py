"""File access of the tokenizer loaders: local paths through `os`, URLs (`gs://bucket/llama`,
any filesystem `etils.epath` opens) through epath, with the same answers for both.

Local paths keep their spelling (a relative path stays relative in messages and `.path`); URLs
are joined with "/" and never made absolute.
"""

from __future__ import annotations

import os

from specjax.atomic_io import PathLike, as_path, is_local

__all__ = ["fspath", "is_dir", "is_file", "exists", "join", "parent", "read_text", "read_bytes"]


def fspath(path: PathLike, name: str = "path") -> str:
  """`path` as a string (an `epath.Path` of a URL keeps its scheme); a TypeError naming `name`
  for anything that is not a path (None, an int, bytes)."""
  if isinstance(path, bytes):
    raise TypeError(f"{name} must be a str or os.PathLike (a file, a directory or a URL), got "
                    f"bytes {path!r:.80}")
  try:
    return os.fspath(path)
  except TypeError:
    raise TypeError(f"{name} must be a str or os.PathLike (a file, a directory or a URL), got "
                    f"{path!r:.80} ({type(path).__name__})") from None


def is_dir(path: str) -> bool:
  return os.path.isdir(path) if is_local(path) else as_path(path).is_dir()


def is_file(path: str) -> bool:
  return os.path.isfile(path) if is_local(path) else as_path(path).is_file()


def exists(path: str) -> bool:
  return os.path.exists(path) if is_local(path) else as_path(path).exists()


def join(directory: str, name: str) -> str:
  """`directory/name` (a URL joined with "/")."""
  return os.path.join(directory, name) if is_local(directory) else (
      f"{directory.rstrip('/')}/{name}")


def parent(path: str) -> str:
  """The folder holding the file `path` (local: absolute)."""
  if is_local(path):
    return os.path.dirname(os.path.abspath(path))
  return path.rstrip("/").rsplit("/", 1)[0]


def read_text(path: str) -> str:
  """The UTF-8 text of the file `path`."""
  if is_local(path):
    with open(path, encoding="utf-8") as f:
      return f.read()
  return as_path(path).read_text(encoding="utf-8")


def read_bytes(path: str) -> bytes:
  """The bytes of the file `path`."""
  if is_local(path):
    with open(path, "rb") as f:
      return f.read()
  return as_path(path).read_bytes()
