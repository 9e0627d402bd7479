"""Example sources shared by all tasks: local JSONL/TSV files and TFDS.

A *source spec* is a string:

* ``jsonl:PATH`` -- one JSON object per line (``.gz``/``.xz``/... allowed);
* ``tsv:PATH`` -- tab-separated lines; the first line is a header when it
  names the task's fields (or ``inputs``/``targets``), otherwise the columns
  are (inputs, targets[, split]);
* ``tfds`` or ``tfds:NAME`` -- a TensorFlow Datasets dataset (needs
  ``pip install specjax[tfds]``);
* any other word (``debian``, ``apt``, ``stdlib``, ``package``,
  ``dir:PATH``) is interpreted by the task itself.

In ``PATH`` a ``{split}`` placeholder reads one file per split
(``train``/``validation``/``test``; missing ones are skipped) and fixes each
record's split. Without it, a record may carry a ``"split"`` field (JSONL) or
a third column (TSV); otherwise the writer splits by hash.

`records_from_examples` is the pure mapping from raw examples (dicts with
the dataset's own field names, values ``str`` or ``bytes``) to records.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterable, Iterator, Mapping, Sequence

from experiments.data import common

__all__ = [
    "FieldMapping",
    "SourceSpec",
    "parse_source",
    "records_from_examples",
    "iter_local_examples",
    "require_tfds",
    "iter_tfds_examples",
]


@dataclasses.dataclass(frozen=True)
class FieldMapping:
  """Which example fields become ``inputs`` and ``targets``.

  Attributes:
    inputs: the field holding the model input (``"en"``, ``"article"``...).
    targets: the field holding the reference output; None for LM corpora
      (targets become "").
    keep: extra fields copied into the record unchanged (``"task_id"``...).
    strip: strip surrounding whitespace of inputs and targets (off for code,
      where indentation and trailing newlines matter).
  """
  inputs: str
  targets: str | None
  keep: tuple[str, ...] = ()
  strip: bool = True


@dataclasses.dataclass(frozen=True)
class SourceSpec:
  """A parsed source string: ``kind`` (jsonl, tsv, tfds, ...) and ``arg``."""
  kind: str
  arg: str | None = None

  def __str__(self) -> str:
    return self.kind if self.arg is None else f"{self.kind}:{self.arg}"


def parse_source(spec: str) -> SourceSpec:
  """Parses ``kind[:arg]``; ``jsonl``/``tsv``/``dir`` need a path argument."""
  if not spec:
    raise ValueError("empty source spec")
  kind, sep, arg = spec.partition(":")
  kind = kind.strip().lower()
  if kind in ("jsonl", "tsv", "dir") and not arg:
    raise ValueError(
        f"source {spec!r}: '{kind}' needs a path, e.g. {kind}:/path/to/file")
  return SourceSpec(kind, arg if sep else None)


def _to_str(value: Any) -> str:
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if hasattr(value, "item") and not isinstance(value, str):  # numpy scalars
    value = value.item()
    if isinstance(value, bytes):
      return value.decode("utf-8")
  return "" if value is None else str(value)


def records_from_examples(examples: Iterable[Mapping[str, Any]],
                          mapping: FieldMapping) -> Iterator[common.Record]:
  """Maps raw examples to ``{"inputs", "targets", ...}`` records.

  Values may be ``bytes`` (TFDS) or ``str``; both sides are stripped of
  surrounding whitespace when ``mapping.strip``. An example that lacks
  ``mapping.inputs`` but has ``"inputs"`` (and ``"targets"``) is taken as
  already mapped. A ``"split"`` field is passed through for the writer.

  Raises:
    KeyError: a required field is missing; the message lists the fields the
      example has.
  """
  for i, ex in enumerate(examples):
    if mapping.inputs in ex:
      in_key, out_key = mapping.inputs, mapping.targets
    elif "inputs" in ex:
      in_key, out_key = "inputs", ("targets" if mapping.targets else None)
    else:
      raise KeyError(
          f"example {i} has no field {mapping.inputs!r} (nor 'inputs'); its "
          f"fields are {sorted(ex)}")
    if out_key is not None and out_key not in ex:
      raise KeyError(
          f"example {i} has no field {out_key!r}; its fields are {sorted(ex)}")
    inputs = _to_str(ex[in_key])
    targets = _to_str(ex[out_key]) if out_key else ""
    if mapping.strip:
      inputs, targets = inputs.strip(), targets.strip()
    record: common.Record = {"inputs": inputs, "targets": targets}
    for key in mapping.keep:
      if key in ex:
        record[key] = _to_str(ex[key])
    if "split" in ex:
      record["split"] = _to_str(ex["split"])
    yield record


def _read_jsonl_examples(path: str) -> Iterator[dict[str, Any]]:
  with common.open_text(path) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        yield json.loads(line)
      except ValueError as e:
        raise ValueError(f"{path}:{n}: not valid JSON ({e})") from None


def _read_tsv_examples(path: str, mapping: FieldMapping
                       ) -> Iterator[dict[str, Any]]:
  names = {mapping.inputs, "inputs"}
  with common.open_text(path) as f:
    header: list[str] | None = None
    for n, line in enumerate(f, 1):
      line = line.rstrip("\n").rstrip("\r")
      if not line.strip():
        continue
      cols = line.split("\t")
      if n == 1 and names & set(cols):
        header = cols
        continue
      if header is not None:
        if len(cols) != len(header):
          raise ValueError(f"{path}:{n}: {len(cols)} columns, header has "
                           f"{len(header)}")
        yield dict(zip(header, cols))
      else:
        if len(cols) not in (2, 3):
          raise ValueError(
              f"{path}:{n}: expected 2 or 3 tab-separated columns (inputs, "
              f"targets[, split]) or a header naming {mapping.inputs!r}; got "
              f"{len(cols)}")
        ex = {"inputs": cols[0], "targets": cols[1]}
        if len(cols) == 3:
          ex["split"] = cols[2]
        yield ex


def iter_local_examples(spec: SourceSpec, mapping: FieldMapping,
                        max_examples: int | None = None
                        ) -> Iterator[dict[str, Any]]:
  """Yields raw examples from a ``jsonl:`` or ``tsv:`` source.

  Raises:
    FileNotFoundError: the file (or, with ``{split}``, every split file) is
      missing; the message names the path.
    ValueError: `spec` is not a jsonl/tsv source, or a line is malformed.
  """
  if spec.kind not in ("jsonl", "tsv") or not spec.arg:
    raise ValueError(f"not a local file source: {spec}")
  path = os.path.expanduser(spec.arg)

  def read(p: str) -> Iterator[dict[str, Any]]:
    if spec.kind == "jsonl":
      return _read_jsonl_examples(p)
    return _read_tsv_examples(p, mapping)

  if "{split}" in path:
    found = False
    for split in common.SPLITS:
      p = path.replace("{split}", split)
      if not os.path.exists(p):
        continue
      found = True
      for ex in common.iter_limited(read(p), max_examples):
        yield {**ex, "split": split}
    if not found:
      raise FileNotFoundError(
          f"no split file for source {spec}: tried "
          f"{[path.replace('{split}', s) for s in common.SPLITS]}")
    return
  if not os.path.exists(path):
    raise FileNotFoundError(f"source file not found: {path} (from {spec})")
  yield from common.iter_limited(read(path), max_examples)


def require_tfds(task: str) -> Any:
  """Imports and returns ``tensorflow_datasets``, or explains how to get it.

  Raises:
    ImportError: naming the ``specjax[tfds]`` extra and the local-file
      alternative.
  """
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        f"task {task!r} with source 'tfds' needs tensorflow_datasets, which "
        f"is not installed ({e}). Install it with `pip install "
        f"specjax[tfds]`, or build the task from local files with "
        f"--source=jsonl:/path/{{split}}.jsonl or --source=tsv:/path/file.tsv"
    ) from e
  return tfds


def iter_tfds_examples(task: str, name: str,
                       splits: Sequence[str] = common.SPLITS,
                       data_dir: str | None = None,
                       max_examples: int | None = None
                       ) -> Iterator[dict[str, Any]]:
  """Yields the examples of TFDS dataset `name`, each with its ``"split"``.

  Downloads and prepares the dataset when needed (internet required).
  Splits the dataset does not have are skipped.
  """
  tfds = require_tfds(task)
  builder = tfds.builder(name, data_dir=data_dir)
  builder.download_and_prepare()
  for split in splits:
    if split not in builder.info.splits:
      continue
    ds = builder.as_dataset(split=split, shuffle_files=False)
    for ex in common.iter_limited(tfds.as_numpy(ds), max_examples):
      yield {**{k: v for k, v in ex.items()}, "split": split}
