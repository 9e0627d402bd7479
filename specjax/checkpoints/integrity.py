"""Integrity of saved models: named errors, file manifests, content digests.

A model directory written by `orbax_io.save_params` holds, besides `params/` (orbax) and
`config.json`, an `integrity.json`:

  {"files": {"params/<relative path>": <bytes>, ...},
   "params_sha256": <digest of the parameter values>}

`check_files` compares the directory against it before orbax opens anything, so a truncated or
missing file is named in one line (not a tensorstore message and asyncio tracebacks), and the
restored values' `params_digest` is compared with the stored one (corrupt bytes of the right
length). Directories without a manifest still load, with orbax's own checks only and an
`UnverifiedCheckpointWarning` (`restore_params(strict=True)` refuses them).

Every problem with a checkpoint is a `CheckpointError` (a ValueError) that names the directory,
says what is wrong and what to do.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging as py_logging
import os
import sys
from typing import Any, Dict, Iterator, Optional

import jax
import numpy as np
from specjax import atomic_io

__all__ = ["CheckpointError", "UnverifiedCheckpointWarning", "params_digest", "file_manifest", "check_files",
           "quiet_asyncio_errors", "first_line"]

MANIFEST = "integrity.json"

# What is wrong, in the words a CheckpointError uses.
KINDS = ("missing", "unreadable", "truncated", "corrupt", "config_mismatch")


class CheckpointError(ValueError):
  """A saved model or train state that cannot be used as it is.

  Attributes:
    directory: the checkpoint directory.
    kind: "missing" (no such checkpoint, or a file of it absent), "unreadable", "truncated",
      "corrupt" (values differ from their digest) or "config_mismatch" (another model / setup).
    problem: one line saying what is wrong.
    remedy: what to do about it.
  """

  def __init__(self, directory: str, kind: str, problem: str, remedy: str = ""):
    if kind not in KINDS:
      raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    self.directory, self.kind, self.problem = directory, kind, problem
    self.remedy = remedy or (
        "Delete it (or put back a copy) and save or train it again; the experiment launchers "
        "do this on their own: they fall back to the newest intact step checkpoint of the "
        "training run and re-finalise it.")
    super().__init__(f"checkpoint {directory} is {kind.replace('_', ' ')}: {problem}. "
                     f"{self.remedy}")


class UnverifiedCheckpointWarning(UserWarning):
  """A saved model loaded without a digest to verify it against (no `integrity.json`, or one
  without `params_sha256`): a damaged byte would have loaded as a wrong value unnoticed."""


def first_line(error: BaseException, limit: int = 300) -> str:
  """An exception message's first line, clipped to `limit` characters (tensorstore's carry a
  whole JSON spec)."""
  text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
  return text if len(text) <= limit else text[:limit] + " ..."


def params_digest(params: Any) -> str:
  """sha256 of a parameter tree: every leaf's path, dtype, shape and bytes, in key-path order.
  Equal trees (same values and layout) give equal digests; experiments key cached measurements
  by it."""
  h = hashlib.sha256()
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
    x = np.ascontiguousarray(np.asarray(leaf))
    h.update(f"{jax.tree_util.keystr(path)}|{x.dtype.str}|{x.shape}|".encode())
    h.update(memoryview(x).cast("B"))
  return h.hexdigest()


def file_manifest(directory: str, sub: str = "params") -> Dict[str, int]:
  """{relative path: size in bytes} of every file under `directory/sub` (local or gs://...)."""
  if atomic_io.is_local(directory):
    root = os.path.join(directory, sub)
    out = {}
    for base, _, files in os.walk(root):
      for name in files:
        path = os.path.join(base, name)
        out[os.path.relpath(path, directory)] = os.path.getsize(path)
    return dict(sorted(out.items()))
  out = {}
  pending = [(atomic_io.as_path(directory) / sub, sub)]
  while pending:  # iterdir, not epath's walk (whose gs:// paths lose their prefix)
    node, rel = pending.pop()
    if not node.is_dir():
      continue
    for child in node.iterdir():
      if child.is_dir():
        pending.append((child, f"{rel}/{child.name}"))
      else:
        out[f"{rel}/{child.name}"] = child.stat().length
  return dict(sorted(out.items()))


def write_manifest(directory: str, digest: str) -> None:
  atomic_io.atomic_write_json(os.path.join(directory, MANIFEST),
                              {"files": file_manifest(directory), "params_sha256": digest})


def read_manifest(directory: str) -> Optional[dict]:
  """The stored manifest, None when the directory predates manifests."""
  path = atomic_io.as_path(directory) / MANIFEST
  if not path.exists():
    return None
  try:
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(manifest.get("files"), dict):
      raise ValueError("no 'files' mapping")
  except (OSError, ValueError) as e:
    raise CheckpointError(directory, "unreadable", f"{MANIFEST} cannot be read ({first_line(e)})")
  return manifest


def check_files(directory: str, manifest: dict) -> None:
  """Every file the save wrote is there with the size it was written with."""
  for rel, size in manifest["files"].items():
    path = atomic_io.as_path(directory) / rel
    if not path.exists():
      raise CheckpointError(directory, "missing", f"{rel} is missing (the save wrote {size} bytes)")
    now = path.stat().length
    if now != size:
      kind = "truncated" if now < size else "corrupt"
      raise CheckpointError(directory, kind, f"{rel} holds {now} bytes, the save wrote {size}")


class _DropTaskErrors(py_logging.Filter):
  """asyncio's "Task exception was never retrieved" lines: orbax gathers one task per array, and
  when one fails the others' errors are logged later."""

  def filter(self, record):
    return "exception was never retrieved" not in record.getMessage()


_INSTALLED = []


def _install_filters() -> None:
  """Once per process: drop the two kinds of noise a failed orbax read leaves, and only those:
  asyncio's log line for the gather's other failed tasks, and tensorstore's callbacks firing
  after orbax closed its event loop (`RuntimeError('Event loop is closed')` reaching
  `sys.unraisablehook` once per array)."""
  if _INSTALLED:
    return
  py_logging.getLogger("asyncio").addFilter(_DropTaskErrors())
  previous = sys.unraisablehook

  def hook(unraisable):
    exc = unraisable.exc_value
    if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
      return
    previous(unraisable)
  sys.unraisablehook = hook
  _INSTALLED.append(hook)


@contextlib.contextmanager
def quiet_asyncio_errors() -> Iterator[None]:
  """Around an orbax read that may fail: the one error that matters is raised (the caller
  re-raises it as a CheckpointError); the asyncio noise it leaves is dropped."""
  _install_filters()
  try:
    yield
  except BaseException:
    gc.collect()  # The failed gather's other tasks are reported when collected: now.
    raise
