"""Shared pieces of the task builders: records, filters, splits and the cache.

A *record* is a plain ``dict`` with at least two string fields, ``"inputs"``
and ``"targets"``; builders may add more (``"origin"``, ``"task_id"``, ...).
Every task is written by one function, `write_task`, which

1. cleans nothing (cleaning is the builder's job) but drops records whose
   ``inputs`` is empty,
2. deduplicates on ``inputs``: when one input occurs with several targets the
   most frequent target wins, ties broken by the smaller string, so the result
   does not depend on the order in which sources were read,
3. applies a `LengthFilter` (whitespace-separated words of inputs / targets),
4. assigns each record to a split from a hash of its (deduplicated) inputs
   text (`split_of`) unless the source fixed the split,
5. writes ``train.jsonl``, ``validation.jsonl``, ``test.jsonl`` (records
   sorted by that hash, which is a deterministic shuffle) and ``meta.json``
   atomically (temporary file + ``os.replace``) into the task's directory.

Because the split of a record is a function of its own text only, a record
lands in the same split whatever else is added to or removed from the source.
"""

from __future__ import annotations

import bz2
import collections
import dataclasses
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import time
import uuid
from typing import Any, Iterable, Iterator, Mapping, Sequence

from absl import logging

from specjax.atomic_io import atomic_path, atomic_write_bytes, atomic_write_text

__all__ = [
    "Record",
    "SPLITS",
    "LengthFilter",
    "SplitFractions",
    "split_of",
    "split_key",
    "dedup_records",
    "write_task",
    "read_jsonl",
    "atomic_write_text",
    "atomic_write_bytes",
    "read_meta",
    "write_meta",
    "open_text",
    "decompress_bytes",
    "count_words",
    "collapse_whitespace",
    "task_dirname",
    "iter_limited",
]

Record = dict[str, Any]

SPLITS: tuple[str, ...] = ("train", "validation", "test")
META_FILENAME = "meta.json"
FORMAT_VERSION = 1


def count_words(text: str) -> int:
  """Number of whitespace-separated words in `text`."""
  return len(text.split())


_WS_RE = re.compile(r"\s+")


def collapse_whitespace(text: str) -> str:
  """Replaces every run of whitespace (newlines included) by one space."""
  return _WS_RE.sub(" ", text).strip()


def task_dirname(task: str) -> str:
  """Directory name of `task` in a cache (``wmt14_translate/de-en`` -> ...)."""
  return re.sub(r"[^A-Za-z0-9_.-]+", "__", task)


# -----------------------------------------------------------------------------
# Filters and splits.
# -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LengthFilter:
  """Keeps records whose word counts lie in closed ranges.

  ``None`` as a maximum means no upper limit. Words are whitespace-separated
  tokens (`count_words`); a record with empty ``targets`` has 0 target words,
  so LM corpora use ``min_target_words=0``.
  """
  min_input_words: int = 1
  max_input_words: int | None = None
  min_target_words: int = 1
  max_target_words: int | None = None

  def __post_init__(self):
    for name in ("min_input_words", "min_target_words"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
    for lo, hi in (("min_input_words", "max_input_words"),
                   ("min_target_words", "max_target_words")):
      high = getattr(self, hi)
      if high is not None and high < getattr(self, lo):
        raise ValueError(
            f"{hi}={getattr(self, hi)} is below {lo}={getattr(self, lo)}")

  def accepts(self, record: Mapping[str, Any]) -> bool:
    """True when `record` passes both the inputs and the targets limits."""
    n_in = count_words(record["inputs"])
    n_out = count_words(record["targets"])
    if n_in < self.min_input_words or n_out < self.min_target_words:
      return False
    if self.max_input_words is not None and n_in > self.max_input_words:
      return False
    if self.max_target_words is not None and n_out > self.max_target_words:
      return False
    return True

  def replace(self, **overrides: int | None) -> "LengthFilter":
    """A copy with the given fields replaced (``None`` values are ignored)."""
    changes = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class SplitFractions:
  """Fractions of records that go to validation and test; the rest is train."""
  validation: float = 0.02
  test: float = 0.02

  def __post_init__(self):
    if not (0 <= self.validation and 0 <= self.test and
            self.validation + self.test <= 1):
      raise ValueError(
          f"split fractions must be >= 0 and sum to <= 1, got validation="
          f"{self.validation}, test={self.test}")


def split_key(text: str) -> int:
  """A stable 64-bit hash of `text` (sha256, first 8 bytes, big endian)."""
  digest = hashlib.sha256(text.encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big")


def split_of(text: str, fractions: SplitFractions = SplitFractions()) -> str:
  """The split ("train", "validation" or "test") that `text` belongs to.

  The unit interval is cut into [0, test) -> test, [test, test + validation)
  -> validation, the rest -> train, and `text` falls at
  ``split_key(text) / 2**64``. The result depends on `text` alone.
  """
  u = split_key(text) / 2.0**64
  if u < fractions.test:
    return "test"
  if u < fractions.test + fractions.validation:
    return "validation"
  return "train"


def dedup_records(records: Iterable[Record]) -> tuple[list[Record], int]:
  """Deduplicates `records` on their ``inputs`` text.

  For an input seen with several targets the most frequent target wins, then
  the smallest string; the other fields come from the first record that had
  the winning target. Records with empty ``inputs`` are dropped. Returns the
  unique records (in first-seen order of their inputs) and the number of
  records read.
  """
  counts: dict[str, collections.Counter] = {}
  first: dict[tuple[str, str], Record] = {}
  n_read = 0
  for record in records:
    n_read += 1
    inputs = record["inputs"]
    if not inputs:
      continue
    key = (inputs, record["targets"])
    counts.setdefault(inputs, collections.Counter())[record["targets"]] += 1
    first.setdefault(key, record)
  unique = []
  for inputs, counter in counts.items():
    best = min(counter.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    unique.append(first[(inputs, best)])
  return unique, n_read


# -----------------------------------------------------------------------------
# Atomic files (`specjax.atomic_io`; atomic_write_bytes / _text re-exported).
# -----------------------------------------------------------------------------


def _atomic_write_jsonl(path: str, records: Iterable[Mapping[str, Any]]) -> int:
  """Streams `records` as JSON lines into `path` atomically; returns count."""
  n = 0
  with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
    for record in records:
      f.write(json.dumps(record, ensure_ascii=False, sort_keys=True))
      f.write("\n")
      n += 1
  return n


def read_jsonl(path: str | os.PathLike) -> list[Record]:
  """Reads a JSON-lines file (optionally compressed) into a list of dicts."""
  with open_text(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def write_meta(task_dir: str | os.PathLike, meta: Mapping[str, Any]) -> None:
  """Writes `meta` as ``<task_dir>/meta.json`` atomically."""
  atomic_write_text(os.path.join(os.fspath(task_dir), META_FILENAME),
                    json.dumps(meta, indent=2, ensure_ascii=False,
                               sort_keys=True) + "\n")


def read_meta(task_dir: str | os.PathLike) -> dict[str, Any] | None:
  """The ``meta.json`` of a built task directory, or None if absent/broken."""
  path = os.path.join(os.fspath(task_dir), META_FILENAME)
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


# -----------------------------------------------------------------------------
# Compressed inputs.
# -----------------------------------------------------------------------------


def _decompress_with_command(data: bytes, command: str, path: str) -> bytes:
  exe = shutil.which(command)
  if exe is None:
    raise RuntimeError(
        f"cannot decompress {path}: the Python module for this format is not "
        f"installed and the `{command}` command is not on PATH. Install one "
        f"(`pip install {'lz4' if command == 'lz4' else 'zstandard'}` or "
        f"`apt-get install {command}`), or make apt keep plain/gzip indexes "
        f"(-o Acquire::GzipIndexes=true).")
  result = subprocess.run([exe, "-d", "-c"], input=data, capture_output=True,
                          check=False)
  if result.returncode != 0:
    raise RuntimeError(
        f"`{command} -d` failed on {path}: "
        f"{result.stderr.decode(errors='replace').strip()}")
  return result.stdout


def decompress_bytes(data: bytes, path: str = "<bytes>") -> bytes:
  """Decompresses `data` by the suffix of `path` (.gz .xz .lzma .bz2 .lz4 .zst).

  Unknown suffixes are returned unchanged. lz4 and zstd use the Python
  modules (``lz4``, ``zstandard``) when installed and the ``lz4`` / ``zstd``
  commands otherwise; with neither, a RuntimeError says what to install.
  """
  if path.endswith(".gz"):
    return gzip.decompress(data)
  if path.endswith((".xz", ".lzma")):
    return lzma.decompress(data)
  if path.endswith(".bz2"):
    return bz2.decompress(data)
  if path.endswith(".lz4"):
    try:
      import lz4.frame  # pylint: disable=g-import-not-at-top
    except ImportError:
      return _decompress_with_command(data, "lz4", path)
    return lz4.frame.decompress(data)
  if path.endswith(".zst"):
    try:
      import zstandard  # pylint: disable=g-import-not-at-top
    except ImportError:
      return _decompress_with_command(data, "zstd", path)
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)
  return data


def open_text(path: str | os.PathLike) -> io.TextIOBase:
  """Opens a (possibly compressed) UTF-8 text file for reading."""
  path = os.fspath(path)
  if path.endswith(".gz"):
    return gzip.open(path, "rt", encoding="utf-8")
  if path.endswith((".xz", ".lzma")):
    return lzma.open(path, "rt", encoding="utf-8")
  if path.endswith(".bz2"):
    return bz2.open(path, "rt", encoding="utf-8")
  if path.endswith((".lz4", ".zst")):
    with open(path, "rb") as f:
      data = decompress_bytes(f.read(), path)
    return io.StringIO(data.decode("utf-8"))
  return open(path, encoding="utf-8")


# -----------------------------------------------------------------------------
# The writer.
# -----------------------------------------------------------------------------


def write_task(
    records: Iterable[Record],
    task_dir: str | os.PathLike,
    *,
    task: str,
    source: str,
    length_filter: LengthFilter,
    fractions: SplitFractions = SplitFractions(),
    fixed_split: str | None = None,
    unfiltered_splits: Sequence[str] = (),
    config: Mapping[str, Any] | None = None,
    extra_meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
  """Deduplicates, filters, splits and writes `records`; returns the meta.

  Args:
    records: dicts with ``"inputs"`` and ``"targets"`` strings. A record may
      carry a ``"split"`` field (one of `SPLITS`): then it keeps that split
      (sources with official splits, such as TFDS), deduplication happens
      within each split, and the field is not written out.
    task_dir: the directory that receives the split files and ``meta.json``.
    task: the task name, recorded in the meta.
    source: a human-readable description of where the records came from.
    length_filter: the word-count limits.
    fractions: validation / test fractions for hash splitting.
    fixed_split: put every record into this split (evaluation sets).
    unfiltered_splits: splits whose records are not length-filtered when the
      split was fixed by the source or by `fixed_split` (official evaluation
      sets stay intact); hash-split records are always filtered.
    config: the build options; stored in the meta so that a later build with
      the same options reuses the cache.
    extra_meta: more fields for the meta (e.g. the catalogs read).

  Returns:
    The meta dict that was written to ``meta.json``.
  """
  if fixed_split is not None and fixed_split not in SPLITS:
    raise ValueError(
        f"fixed_split must be one of {SPLITS}, got {fixed_split!r}")
  start = time.time()
  task_dir = os.fspath(task_dir)
  by_split: dict[str | None, list[Record]] = collections.defaultdict(list)
  for record in records:
    record = dict(record)
    split = record.pop("split", None)
    if split is not None and split not in SPLITS:
      raise ValueError(
          f"record has split {split!r}; expected one of {SPLITS}: {record!r}")
    by_split[fixed_split or split].append(record)

  n_read = 0
  n_unique = 0
  n_filtered_out = 0
  outputs: dict[str, list[tuple[int, Record]]] = {s: [] for s in SPLITS}
  for given_split, group in by_split.items():
    unique, n = dedup_records(group)
    n_read += n
    n_unique += len(unique)
    apply_filter = given_split is None or given_split not in unfiltered_splits
    for record in unique:
      if apply_filter and not length_filter.accepts(record):
        n_filtered_out += 1
        continue
      split = given_split or split_of(record["inputs"], fractions)
      outputs[split].append((split_key(record["inputs"]), record))

  counts = {}
  for split in SPLITS:
    rows = sorted(outputs[split], key=lambda kr: (kr[0], kr[1]["inputs"]))
    counts[split] = _atomic_write_jsonl(
        os.path.join(task_dir, f"{split}.jsonl"), (r for _, r in rows))
  meta = {
      "task": task,
      "format_version": FORMAT_VERSION,
      "source": source,
      "counts": counts,
      "num_read": n_read,
      "num_unique": n_unique,
      "num_filtered_out": n_filtered_out,
      "length_filter": dataclasses.asdict(length_filter),
      "split_fractions": (None if fixed_split else
                          dataclasses.asdict(fractions)),
      "fixed_split": fixed_split,
      "unfiltered_splits": list(unfiltered_splits),
      "config": dict(config or {}),
      "build_seconds": round(time.time() - start, 3),
      "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
      "build_id": uuid.uuid4().hex,  # changes with every (re)build
  }
  if extra_meta:
    meta.update(extra_meta)
  write_meta(task_dir, meta)
  logging.info("wrote %s to %s: %s (read %d, unique %d, filtered out %d)",
               task, task_dir, counts, n_read, n_unique, n_filtered_out)
  return meta


def iter_limited(items: Sequence[Any] | Iterable[Any],
                 limit: int | None) -> Iterator[Any]:
  """Yields at most `limit` items (all when `limit` is None)."""
  for i, item in enumerate(items):
    if limit is not None and i >= limit:
      return
    yield item
