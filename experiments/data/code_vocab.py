"""A SentencePiece vocabulary for code and text that round-trips Python exactly.

`experiments.data.train_sentencepiece` trains on one stripped line per sentence
with SentencePiece's default normalisation (NFKC, whitespace collapsed): fine
for prose, lossy for code — newlines, indentation and runs of spaces are gone
after a round trip. `train_code_sentencepiece` trains a model that keeps them:

* normalisation "identity", no whitespace collapsing, no dummy prefix, so
  `decode(encode(s)) == s` for every string (bytes outside the vocabulary
  go through `byte_fallback`);
* the newline, the tab and 4/8/12-space indents are user-defined pieces
  (one token each), and whitespace-only pieces are allowed;
* the training sentences keep their newlines: a code document is cut into
  chunks of `lines_per_sentence` lines (each under the trainer's sentence
  limit), a text record is written as ``"{inputs} Summary: {targets}"``.

Special ids follow T5 (pad 0, EOS 1, UNK 2, no BOS), so the model loads in
`specjax.tokenizers.sentencepiece.SentencePieceTokenizer`. With no dummy prefix a word at
the start of a string has no leading "▁": a decoder-only target that follows
a prompt should start with its space (" {targets}").

The model goes to ``<cache_dir>/vocab/<name>/spiece.model`` with
``spiece.json`` (options + the build ids of the tasks); a second call with the
same options on the same builds returns the existing file. Deterministic: the
sentence sample is chosen by hash (`common.split_key`), SentencePiece's own
sampling and shuffling are off and it runs on one thread.
"""

from __future__ import annotations

import io
import os
import time
from typing import Any, Iterable, Iterator, Sequence

from absl import logging

from experiments.data import common, tasks as tasks_lib, vocab as vocab_lib

__all__ = ["CODE_TRAINER_OPTIONS", "code_sentences", "train_code_sentencepiece",
           "round_trip_failures"]

# SentencePiece options that make the model lossless on source code.
CODE_TRAINER_OPTIONS = {
    "normalization_rule_name": "identity",
    "remove_extra_whitespaces": False,
    "add_dummy_prefix": False,
    "allow_whitespace_only_pieces": True,
    "split_by_whitespace": True,
    "split_digits": True,
    "byte_fallback": True,
    "user_defined_symbols": ["\n", "\t", " " * 12, " " * 8, " " * 4],
}
_MAX_SENTENCE_BYTES = 4000  # below the trainer's max_sentence_length (8192 here)


def _cut_bytes(text: str, limit: int) -> Iterator[str]:
  """Cuts `text` into pieces of at most `limit` UTF-8 bytes (at characters)."""
  piece, size = [], 0
  for ch in text:
    n = len(ch.encode("utf-8"))
    if piece and size + n > limit:
      yield "".join(piece)
      piece, size = [], 0
    piece.append(ch)
    size += n
  if piece:
    yield "".join(piece)


def code_sentences(text: str, lines_per_sentence: int = 20,
                   max_bytes: int = _MAX_SENTENCE_BYTES) -> Iterator[str]:
  """Chunks of `text` of at most `lines_per_sentence` lines, newlines kept.

  The chunks concatenate back to `text`; a chunk over `max_bytes` bytes is
  cut further (at characters). Whitespace-only chunks are skipped.
  """
  if lines_per_sentence < 1:
    raise ValueError(f"lines_per_sentence must be >= 1, got {lines_per_sentence}")
  lines = text.splitlines(keepends=True)
  for i in range(0, len(lines), lines_per_sentence):
    chunk = "".join(lines[i:i + lines_per_sentence])
    if not chunk.strip():
      continue
    if len(chunk.encode("utf-8")) <= max_bytes:
      yield chunk
    else:
      yield from _cut_bytes(chunk, max_bytes)


def _sample(items: Sequence[str], n: int) -> list[str]:
  """At most n items, the ones with the smallest hash (deterministic)."""
  if len(items) <= n:
    return list(items)
  return sorted(items, key=common.split_key)[:n]


def train_code_sentencepiece(
    cache_dir: str | os.PathLike,
    vocab_size: int = 4096,
    *,
    code_tasks: Sequence[str] = ("code_python",),
    text_tasks: Sequence[str] = ("summarize_debian",),
    text_template: str = "{inputs} Summary: {targets}",
    max_sentences: int = 60_000,
    code_fraction: float = 0.5,
    lines_per_sentence: int = 20,
    model_type: str = "unigram",
    character_coverage: float = 0.9995,
    name: str | None = None,
    overwrite: bool = False,
) -> str:
  """Trains (or reuses) a lossless code + text SentencePiece model.

  Args:
    cache_dir: the cache root holding the built tasks.
    vocab_size: the requested size (a soft limit: a small corpus gives fewer
      pieces; read the size from the loaded tokenizer).
    code_tasks: document tasks (records' ``inputs`` are the documents).
    text_tasks: prompt/target tasks, written with `text_template`.
    text_template: how a text record becomes one sentence.
    max_sentences: sentences to train on in all.
    code_fraction: the share of code sentences when both kinds have more
      than their share.
    lines_per_sentence: code lines per sentence.
    model_type: "unigram" or "bpe".
    character_coverage: SentencePiece's character coverage (the rest goes
      through byte fallback).
    name: the folder under ``<cache_dir>/vocab``.
    overwrite: retrain even if the same model exists.

  Returns:
    The path of ``spiece.model``.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  if not 0.0 <= code_fraction <= 1.0:
    raise ValueError(f"code_fraction must lie in [0, 1], got {code_fraction}")
  cache_dir = os.fspath(cache_dir)
  name = name or f"code{vocab_size}_" + "+".join(
      common.task_dirname(t) for t in list(code_tasks) + list(text_tasks))
  out_dir = os.path.join(cache_dir, "vocab", name)
  model_path = os.path.join(out_dir, "spiece.model")
  config = {
      "code_tasks": list(code_tasks), "text_tasks": list(text_tasks),
      "text_template": text_template, "vocab_size": vocab_size,
      "max_sentences": max_sentences, "code_fraction": code_fraction,
      "lines_per_sentence": lines_per_sentence, "model_type": model_type,
      "character_coverage": character_coverage, "options": CODE_TRAINER_OPTIONS,
      "data": {t: vocab_lib.task_fingerprint(t, cache_dir)
               for t in list(code_tasks) + list(text_tasks)},
  }
  if not overwrite and vocab_lib.is_cached(model_path, config):
    return model_path

  start = time.time()
  code: list[str] = []
  for task in code_tasks:
    for r in tasks_lib.load(task, "train", cache_dir):
      code.extend(code_sentences(r["inputs"], lines_per_sentence))
  text: list[str] = []
  for task in text_tasks:
    for r in tasks_lib.load(task, "train", cache_dir):
      text.extend(_cut_bytes(text_template.format(**r), _MAX_SENTENCE_BYTES))
  if not code and not text:
    raise ValueError(f"no training text in {list(code_tasks) + list(text_tasks)}")
  n_code = min(len(code), max(int(round(max_sentences * code_fraction)),
                              max_sentences - len(text)))
  n_text = min(len(text), max_sentences - n_code)
  sentences = _sample(code, n_code) + _sample(text, n_text)

  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
      model_type=model_type, character_coverage=character_coverage, num_threads=1,
      input_sentence_size=0, shuffle_input_sentence=False, hard_vocab_limit=False,
      max_sentence_length=2 * _MAX_SENTENCE_BYTES + 192, minloglevel=1,
      pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
      pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
      **CODE_TRAINER_OPTIONS)
  proto = model.getvalue()
  seconds = round(time.time() - start, 3)
  pieces = spm.SentencePieceProcessor(model_proto=proto).get_piece_size()
  vocab_lib.write_model(model_path, proto, {
      "config": config, "code_sentences": len(code), "text_sentences": len(text),
      "used": {"code": n_code, "text": n_text}, "pieces": pieces, "seconds": seconds},
      quote_pieces=True)
  logging.info("trained %s (%d pieces) on %d code + %d text sentences in %.1fs", model_path,
               pieces, n_code, n_text, seconds)
  return model_path


def round_trip_failures(tokenizer, texts: Iterable[str]) -> list[int]:
  """Indices of `texts` whose encode → decode is not the identity.

  `tokenizer` is a `SentencePieceTokenizer` (or anything with ``encode(text,
  add_eos)`` and ``decode(ids)``)."""
  return [i for i, t in enumerate(texts)
          if tokenizer.decode(tokenizer.encode(t, add_eos=False)) != t]
