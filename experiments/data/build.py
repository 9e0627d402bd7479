r"""Builds offline datasets into a local cache (and optionally a vocabulary).

Examples::

  python -m experiments.data.build --task=translate_en_de \
      --cache_dir=/tmp/specjax_data --max_packages=40
  python -m experiments.data.build --task=summarize_debian \
      --cache_dir=/tmp/specjax_data --apt_update
  python -m experiments.data.build --task=translate_en_de \
      --cache_dir=/tmp/specjax_data --max_packages=100 --sentences_only \
      --min_target_words=16
  python -m experiments.data.build --task=code_python,humaneval \
      --cache_dir=/tmp/specjax_data
  python -m experiments.data.build --task=xsum --cache_dir=/tmp/specjax_data \
      --source=jsonl:/data/xsum/{split}.jsonl
  python -m experiments.data.build --task=translate_en_de,summarize_debian \
      --cache_dir=/tmp/specjax_data --spm_vocab_size=8000

Prints one line per task with the split counts, then the vocabulary path.
A task already built with the same options is reused (--overwrite rebuilds).
"""

from __future__ import annotations

import dataclasses
import sys
import time

from absl import app
from absl import flags
from absl import logging

from experiments.data import tasks as tasks_lib
from experiments.data import vocab as vocab_lib

_TASK = flags.DEFINE_list(
    "task", None,
    f"Comma-separated tasks: {', '.join(tasks_lib.task_names())}.")
_CACHE_DIR = flags.DEFINE_string("cache_dir", None, "Cache root directory.")
_SOURCE = flags.DEFINE_string(
    "source", None, "Override the source: jsonl:PATH, tsv:PATH (PATH may hold "
    "{split}), tfds[:NAME], dir:PATH (code_python); debian, apt, pypi, "
    "debian+pypi (translate_en_de / summarize_*); default: the task's own "
    "(auto for the Debian-backed tasks: Debian's files, else installed Python "
    "packages').")
_MAX_PACKAGES = flags.DEFINE_integer(
    "max_packages", 0, "translate_en_de: Debian packages to download for "
    "their German catalogs (0: only the catalogs already on this machine).")
_PACKAGES = flags.DEFINE_list(
    "packages", [], "translate_en_de: extra packages to download.")
_SENTENCES_ONLY = flags.DEFINE_bool(
    "sentences_only", False, "translate_en_de: keep only pairs that read as "
    "full sentences (capitalised, final punctuation, no markup or options).")
_APT_UPDATE = flags.DEFINE_bool(
    "apt_update", False, "Run `apt-get update -o Acquire::Languages=en` first "
    "(root, network).")
_CHUNKING = flags.DEFINE_enum(
    "chunking", "file", ["file", "toplevel"], "code_python documents.")
_CODE_DIR = flags.DEFINE_string(
    "code_dir", None, "code_python: directory to read (default: the stdlib).")
_TFDS_DATA_DIR = flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir.")
_MAX_EXAMPLES = flags.DEFINE_integer(
    "max_examples", None, "Read at most this many examples per split "
    "(local files / TFDS).")
_MIN_INPUT_WORDS = flags.DEFINE_integer("min_input_words", None, "Filter.")
_MAX_INPUT_WORDS = flags.DEFINE_integer("max_input_words", None, "Filter.")
_MIN_TARGET_WORDS = flags.DEFINE_integer("min_target_words", None, "Filter.")
_MAX_TARGET_WORDS = flags.DEFINE_integer("max_target_words", None, "Filter.")
_VALIDATION_FRACTION = flags.DEFINE_float(
    "validation_fraction", None, "Hash-split validation fraction.")
_TEST_FRACTION = flags.DEFINE_float(
    "test_fraction", None, "Hash-split test fraction.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Rebuild existing tasks.")
_SPM_VOCAB_SIZE = flags.DEFINE_integer(
    "spm_vocab_size", 0, "If > 0, train a SentencePiece vocabulary of this "
    "size on the train splits of the built tasks.")
_SPM_THREADS = flags.DEFINE_integer(
    "spm_threads", 1, "SentencePiece trainer threads (1 is deterministic).")

flags.mark_flags_as_required(["task", "cache_dir"])


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  options = tasks_lib.BuildOptions(
      source=_SOURCE.value, max_packages=_MAX_PACKAGES.value,
      packages=tuple(_PACKAGES.value), sentences_only=_SENTENCES_ONLY.value,
      apt_update=_APT_UPDATE.value,
      chunking=_CHUNKING.value, code_dir=_CODE_DIR.value,
      tfds_data_dir=_TFDS_DATA_DIR.value, max_examples=_MAX_EXAMPLES.value,
      min_input_words=_MIN_INPUT_WORDS.value,
      max_input_words=_MAX_INPUT_WORDS.value,
      min_target_words=_MIN_TARGET_WORDS.value,
      max_target_words=_MAX_TARGET_WORDS.value,
      validation_fraction=_VALIDATION_FRACTION.value,
      test_fraction=_TEST_FRACTION.value)
  for i, task in enumerate(_TASK.value):
    start = time.time()
    # apt-get update once, before the first task that reads apt's lists.
    opts = options if i == 0 else dataclasses.replace(
        options, apt_update=False)
    result = tasks_lib.build(task, _CACHE_DIR.value, opts,
                             overwrite=_OVERWRITE.value)
    meta = result.meta
    counts = " ".join(f"{s}={meta['counts'][s]}"
                      for s in ("train", "validation", "test"))
    print(f"{task}: {counts} (read {meta['num_read']}, unique "
          f"{meta['num_unique']}, filtered out {meta['num_filtered_out']}) "
          f"from {meta['config'].get('source')} "
          f"{'reused' if result.reused else 'built'} in "
          f"{time.time() - start:.1f}s -> {result.directory}")
  if _SPM_VOCAB_SIZE.value > 0:
    start = time.time()
    path = vocab_lib.train_sentencepiece(
        _TASK.value, _CACHE_DIR.value, _SPM_VOCAB_SIZE.value,
        num_threads=_SPM_THREADS.value, overwrite=_OVERWRITE.value)
    print(f"sentencepiece vocab {_SPM_VOCAB_SIZE.value}: {path} "
          f"({time.time() - start:.1f}s)")
  sys.stdout.flush()
  logging.flush()
  return 0


if __name__ == "__main__":
  app.run(main)
