"""Training a shared SentencePiece vocabulary on built tasks (T5 conventions).

`train_sentencepiece` reads the training split of one or more built tasks,
streams their inputs and targets (one sentence per text line) into
``SentencePieceTrainer.train`` and trains a model with T5's special ids
(pad 0, EOS 1, UNK 2, no BOS), one vocabulary for source and target. The
model goes to ``<cache_dir>/vocab/<name>/spiece.model`` (written through a
temporary file and ``os.replace``) next to ``spiece.vocab`` (piece and
score per line) and ``spiece.json`` (the options and the build ids of the
tasks); a second call with the same options on the same builds returns the
existing file.

Determinism: the corpus is a function of the built files; when it has more
than `max_sentences` lines, the lines with the smallest hash
(`common.split_key`) are kept; SentencePiece's own sampling and shuffling are
switched off; the lines are streamed to the trainer (no file path ends up in
the model), and ``num_threads=1`` (the default) makes the model
byte-identical across runs.
"""

from __future__ import annotations

import io
import json
import os
import time
from typing import Any, Iterator, Sequence

from absl import logging

from experiments.data import common
from experiments.data import tasks as tasks_lib

__all__ = ["T5_SPECIAL_IDS", "corpus_lines", "train_sentencepiece"]

T5_SPECIAL_IDS = {"pad_id": 0, "eos_id": 1, "unk_id": 2, "bos_id": -1}
_MAX_LINE_BYTES = 4000  # below SentencePiece's default max_sentence_length


def is_cached(model_path: str, config: dict[str, Any]) -> bool:
  """Whether `model_path` exists and its ``spiece.json`` records `config`
  (compared as JSON): then the vocabulary is reused."""
  info_path = os.path.join(os.path.dirname(model_path), "spiece.json")
  if not os.path.exists(model_path):
    return False
  try:
    with open(info_path, encoding="utf-8") as f:
      if json.load(f).get("config") == json.loads(json.dumps(config)):
        logging.info("reusing %s", model_path)
        return True
  except (OSError, ValueError):
    pass
  return False


def write_model(model_path: str, proto: bytes, info: dict[str, Any],
                quote_pieces: bool = False):
  """Writes a trained model atomically next to ``spiece.vocab`` (piece and
  score per line; pieces JSON-quoted with `quote_pieces`, for pieces that are
  whitespace) and ``spiece.json`` (`info`, which must hold the "config");
  returns the loaded `SentencePieceProcessor`."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  processor = spm.SentencePieceProcessor(model_proto=proto)
  piece = json.dumps if quote_pieces else str
  vocab_text = "".join(
      f"{piece(processor.id_to_piece(i))}\t{processor.get_score(i):g}\n"
      for i in range(processor.get_piece_size()))
  out_dir = os.path.dirname(model_path)
  common.atomic_write_bytes(model_path, proto)
  common.atomic_write_text(os.path.join(out_dir, "spiece.vocab"), vocab_text)
  common.atomic_write_text(os.path.join(out_dir, "spiece.json"),
                           json.dumps(info, indent=2, sort_keys=True) + "\n")
  return processor


def _split_long(line: str) -> Iterator[str]:
  """Cuts a line at spaces into pieces of at most `_MAX_LINE_BYTES` bytes."""
  if len(line.encode("utf-8")) <= _MAX_LINE_BYTES:
    yield line
    return
  piece: list[str] = []
  size = 0
  for word in line.split(" "):
    n = len(word.encode("utf-8")) + 1
    if piece and size + n > _MAX_LINE_BYTES:
      yield " ".join(piece)
      piece, size = [], 0
    if n > _MAX_LINE_BYTES:  # a single giant token: drop it
      continue
    piece.append(word)
    size += n
  if piece:
    yield " ".join(piece)


def task_fingerprint(task: str, cache_dir: str) -> dict[str, Any]:
  """Identifies one build of `task` (its build id and counts)."""
  meta = common.read_meta(tasks_lib.task_dir(task, cache_dir))
  if meta is None:
    raise FileNotFoundError(
        f"task {task!r} is not built in {cache_dir}: run `python -m "
        f"experiments.data.build --task={task} --cache_dir={cache_dir}` first")
  return {"build_id": meta.get("build_id"), "counts": meta.get("counts")}


def corpus_lines(records: Sequence[common.Record],
                 fields: Sequence[str] = ("inputs", "targets")
                 ) -> Iterator[str]:
  """The non-empty text lines of `fields` of `records`, long lines cut."""
  for record in records:
    for field in fields:
      for line in str(record.get(field, "")).splitlines():
        line = line.strip()
        if line:
          yield from _split_long(line)


def train_sentencepiece(
    task_names: str | Sequence[str],
    cache_dir: str | os.PathLike,
    vocab_size: int = 8000,
    *,
    split: str = "train",
    fields: Sequence[str] = ("inputs", "targets"),
    max_sentences: int = 1_000_000,
    model_type: str = "unigram",
    character_coverage: float = 0.9999,
    byte_fallback: bool = False,
    num_threads: int = 1,
    name: str | None = None,
    overwrite: bool = False,
    **trainer_kwargs: Any,
) -> str:
  """Trains (or reuses) a SentencePiece model on built tasks; returns its path.

  Args:
    task_names: a task or tasks already built in `cache_dir` (see
      `tasks.build`).
    cache_dir: the cache root.
    vocab_size: the vocabulary size, special pieces included.
    split: which split to read (only "train" avoids test leakage).
    fields: record fields to train on (source and target share the vocab).
    max_sentences: keep at most this many lines (smallest hash first).
    model_type: "unigram" (T5) or "bpe", "char", "word".
    character_coverage: SentencePiece's character coverage.
    byte_fallback: encode unknown characters as bytes instead of UNK.
    num_threads: trainer threads; 1 gives byte-identical models across runs.
    name: the folder name under ``<cache_dir>/vocab``; default
      ``spm<vocab_size>_<task>+<task>``.
    overwrite: retrain even if a model with the same options exists.
    **trainer_kwargs: more ``SentencePieceTrainer.train`` arguments.

  Returns:
    The path of ``spiece.model``.

  Raises:
    FileNotFoundError: a task is not built.
    ValueError: no text to train on.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  if isinstance(task_names, str):
    task_names = [task_names]
  if not task_names:
    raise ValueError("task_names is empty")
  cache_dir = os.fspath(cache_dir)
  name = name or "spm{}_{}".format(
      vocab_size, "+".join(common.task_dirname(t) for t in task_names))
  out_dir = os.path.join(cache_dir, "vocab", name)
  model_path = os.path.join(out_dir, "spiece.model")
  config = {
      "tasks": list(task_names), "vocab_size": vocab_size, "split": split,
      "fields": list(fields), "max_sentences": max_sentences,
      "model_type": model_type, "character_coverage": character_coverage,
      "byte_fallback": byte_fallback, "num_threads": num_threads,
      "trainer_kwargs": {k: trainer_kwargs[k] for k in sorted(trainer_kwargs)},
      **T5_SPECIAL_IDS,
      # A rebuilt task (new files) invalidates the vocabulary.
      "data": {t: task_fingerprint(t, cache_dir) for t in task_names},
  }
  if not overwrite and is_cached(model_path, config):
    return model_path

  start = time.time()
  lines: list[str] = []
  for task in task_names:
    lines.extend(corpus_lines(tasks_lib.load(task, split, cache_dir), fields))
  n_lines = len(lines)
  if not lines:
    raise ValueError(f"no text in the {split} split of {list(task_names)}")
  if n_lines > max_sentences:
    lines = sorted(lines, key=common.split_key)[:max_sentences]

  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines),
      model_writer=model,
      vocab_size=vocab_size,
      model_type=model_type,
      character_coverage=character_coverage,
      byte_fallback=byte_fallback,
      num_threads=num_threads,
      input_sentence_size=0,
      shuffle_input_sentence=False,
      pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
      minloglevel=1,
      **T5_SPECIAL_IDS,
      **trainer_kwargs)
  write_model(model_path, model.getvalue(), {
      "config": config, "num_lines": n_lines, "num_lines_used": len(lines),
      "seconds": round(time.time() - start, 3)})
  logging.info("trained %s on %d lines in %.1fs", model_path, len(lines),
               time.time() - start)
  return model_path
