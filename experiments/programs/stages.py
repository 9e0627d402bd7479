"""Finished stages of an experiment, cached on disk and keyed by what they depend on.

  stages = Stages(os.path.join(workdir, "stages"))   # a local path or gs://bucket/run/stages
  comp = stages.run("components/target", measure, deps={"target": params_digest(tp),
                                                         "cache_len": 96})

Every stage is one JSON file, `<directory>/<name>.json`, written atomically:

  {"name": ..., "fingerprint": sha256 of deps, "deps": {...}, "value": ...}

`deps` is whatever the value depends on — the config fields that matter, the
digest of each model's parameters (`specjax.checkpoints.params_digest`), the
digest of the prompts (`array_digest`). A stored stage is reused only when
its fingerprint equals that of the caller's deps; otherwise it is
recomputed, and the log names the first field that changed. Retraining one
draft therefore recomputes exactly the stages that read that draft.

A file that cannot be read (a run killed while the disk filled, a truncated
copy) is named in the log and recomputed; one file per stage means nothing
else is lost with it. Entries without deps (`note`, e.g. wall times of
stages) are kept as they are.

The directory may be a local path or a URL of an object store (`gs://...`): files are read
and listed through `etils.epath` and written by `specjax.atomic_io`.

Each instance counts what it computed and what it reused this run
(`computed`, `reused`), so a caller — or a test — can say which stages a
change touched.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Callable, Dict, List, Optional

import numpy as np
from absl import logging

from specjax import atomic_io
from specjax.atomic_io import PathLike

__all__ = ["Stages", "fingerprint", "array_digest", "first_difference"]

_SEGMENT = re.compile(r"^[A-Za-z0-9_.=+-]+$")


def _canonical(obj: Any) -> str:
  return json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))


def fingerprint(deps: Any) -> str:
  """sha256 of `deps` as canonical JSON (sorted keys; non-JSON values as str)."""
  return hashlib.sha256(_canonical(deps).encode("utf-8")).hexdigest()


def array_digest(*arrays) -> str:
  """sha256 of arrays' dtypes, shapes and bytes (e.g. the prompts of a chunk)."""
  h = hashlib.sha256()
  for a in arrays:
    x = np.ascontiguousarray(np.asarray(a))
    h.update(f"{x.dtype.str}|{x.shape}|".encode())
    h.update(memoryview(x).cast("B"))
  return h.hexdigest()


def first_difference(old: Any, new: Any, path: str = "") -> Optional[str]:
  """The first dotted path where two JSON-like values differ, e.g.
  "draft" or "sampling.temperature"; None when they are equal."""
  old, new = json.loads(_canonical(old)), json.loads(_canonical(new))

  def walk(a, b, where):
    if a == b:
      return None
    if isinstance(a, dict) and isinstance(b, dict):
      for k in sorted(set(a) | set(b)):
        d = walk(a.get(k), b.get(k), f"{where}.{k}" if where else k)
        if d is not None:
          return d
    return where or "(the whole value)"
  return walk(old, new, path)


class Stages:
  """Finished stages under `directory`, one file each (see the module doc)."""

  def __init__(self, directory: PathLike):
    self._dir = atomic_io.as_path(directory)
    self.directory = str(self._dir)  # absolute, or the URL as given
    self._dir.mkdir(parents=True, exist_ok=True)
    self._cache: Dict[str, dict] = {}
    self.computed: List[str] = []
    self.reused: List[str] = []
    self.recomputed: Dict[str, str] = {}  # name -> why (changed field, unreadable file)

  def _epath(self, name: str):
    """The file of stage `name` ("a/b/c" → `<directory>/a/b/c.json`)."""
    parts = name.split("/")
    if not name or any(p in (".", "..") or not _SEGMENT.match(p) for p in parts):
      raise ValueError(f"stage name must be '/'-separated segments of letters, digits and "
                       f"'_.=+-', got {name!r}")
    return self._dir.joinpath(*parts[:-1], parts[-1] + ".json")

  def path(self, name: str) -> str:
    """The file of stage `name` ("a/b/c" → `<directory>/a/b/c.json`)."""
    return str(self._epath(name))

  def _load(self, name: str) -> Optional[dict]:
    if name in self._cache:
      return self._cache[name]
    path = self._epath(name)
    if not path.exists():
      return None
    try:
      entry = json.loads(path.read_text(encoding="utf-8"))
      if not isinstance(entry, dict) or "value" not in entry:
        raise ValueError("not a stage entry")
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
      logging.warning("stage file %s is unreadable (%s): the stage is recomputed", path, e)
      self.recomputed[name] = f"unreadable file ({e})"
      return None
    self._cache[name] = entry
    return entry

  def get(self, name: str, deps: Any = None) -> Optional[Any]:
    """The stored value of `name`, or None when there is none, its file is
    unreadable, or (given `deps`) it was computed from other inputs."""
    entry = self._load(name)
    if entry is None:
      return None
    if deps is not None and entry.get("fingerprint") != fingerprint(deps):
      why = first_difference(entry.get("deps"), deps)
      if name not in self.recomputed:
        logging.info("stage %s: %s changed since it was measured: recomputing", name, why)
      self.recomputed[name] = f"{why} changed"
      return None
    return entry["value"]

  def put(self, name: str, value: Any, deps: Any = None) -> Any:
    """Stores `value` (with the fingerprint of `deps`) atomically; returns it.
    The value is stored as JSON: what comes back from a later `get` is its
    JSON form (tuples as lists, dict keys as strings)."""
    entry = {"name": name, "fingerprint": None if deps is None else fingerprint(deps),
             "deps": deps, "value": value}
    text = json.dumps(entry, indent=1, sort_keys=True, default=str)
    atomic_io.atomic_write_text(self.path(name), text)
    self._cache[name] = json.loads(text)
    return value

  def run(self, name: str, fn: Callable[[], Any], deps: Any = None) -> Any:
    """The stored value of `name` if it was computed from `deps`, else
    `fn()`, stored and returned."""
    value = self.get(name, deps)
    if value is not None:
      self.reused.append(name)
      return value
    self.computed.append(name)
    return self.put(name, fn(), deps)

  def note(self, name: str, value: Any) -> None:
    """Stores an informational value (no deps) unless one is stored already
    (e.g. the wall time a stage took when it was computed)."""
    if self.get(name) is None:
      self.put(name, value)

  def values(self, prefix: str) -> Dict[str, Any]:
    """{name below `prefix`: value} of every readable stage under `prefix`
    (e.g. "timing")."""
    prefix = prefix.strip("/")
    out = {}
    for rel in _stage_files(self._dir.joinpath(*prefix.split("/")), prefix):
      value = self.get(rel)
      if value is not None:
        out[rel[len(prefix) + 1:]] = value
    return dict(sorted(out.items()))

  def summary(self) -> Dict[str, Any]:
    """How many distinct stages this run computed and reused, and why each
    stored one was recomputed."""
    return {"computed": len(set(self.computed)), "reused": len(set(self.reused) - set(self.computed)),
            "recomputed": dict(self.recomputed)}


def _stage_files(directory, rel: str) -> List[str]:
  """Names ("<rel>/a/b") of the stage files below `directory`, by iterdir (not
  `epath.Path.walk`, whose paths lose their gs:// prefix)."""
  if not directory.is_dir():
    return []
  names = []
  for child in sorted(directory.iterdir(), key=lambda p: p.name):
    if child.name.startswith("."):
      continue
    if child.is_dir():
      names += _stage_files(child, f"{rel}/{child.name}")
    elif child.name.endswith(".json"):
      names.append(f"{rel}/{child.name[:-5]}")
  return names
