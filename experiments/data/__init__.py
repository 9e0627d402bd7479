"""Offline datasets for the speculative-decoding experiments.

One interface for every task (see `experiments.data.tasks` for the table):

  build_task(task, cache_dir, options=None, *, overwrite=False,
             show_progress=True, **option_overrides) -> BuildResult
  load_task(task, split, cache_dir, build_if_missing=False) -> list[dict]
  is_built(task, cache_dir, options=None, **option_overrides) -> bool
  host_problems(task, cache_dir, options=None, **option_overrides) -> list[str]
  resolve_source(task, cache_dir, options=None, **option_overrides)
      -> (BuildOptions, note)
  train_sentencepiece(task_names, cache_dir, vocab_size=8000, ...) -> path

(`build_task` / `load_task` are `experiments.data.tasks.build` / `.load`; the
package does not export the name ``build`` because ``experiments.data.build`` is
the command-line module.)

Records are dicts with ``"inputs"`` and ``"targets"`` strings (plus
task-specific fields); splits are "train", "validation" and "test". The
command line is ``python -m experiments.data.build --task=... --cache_dir=...``.

Tasks built offline: ``translate_en_de`` (German gettext catalogs),
``summarize_debian`` and ``summarize_debian_lead`` (package descriptions) from
a Debian machine's files, or, where there are none (macOS, Colab, a TPU VM
without root), from what installed Python packages ship (source "auto",
`experiments.data.tasks.resolve_source`); ``code_python`` (the standard
library), ``humaneval``; with internet and
``pip install specjax[tfds]``: ``wmt14_translate/de-en``,
``cnn_dailymail``, ``xsum`` (each also buildable from local JSONL/TSV).
"""

from experiments.data.common import LengthFilter
from experiments.data.common import read_jsonl
from experiments.data.common import SplitFractions
from experiments.data.common import SPLITS
from experiments.data.common import split_of
from experiments.data.common import write_task
from experiments.data.sources import FieldMapping
from experiments.data.sources import records_from_examples
from experiments.data.tasks import build as build_task
from experiments.data.tasks import BuildOptions
from experiments.data.tasks import BuildResult
from experiments.data.tasks import get_builder
from experiments.data.tasks import host_problems
from experiments.data.tasks import is_built
from experiments.data.tasks import load as load_task
from experiments.data.tasks import resolve_source
from experiments.data.tasks import task_dir
from experiments.data.tasks import task_names
from experiments.data.tasks import TaskBuilder
from experiments.data.tasks import TASKS
from experiments.data.vocab import train_sentencepiece

__all__ = [
    "BuildOptions",
    "BuildResult",
    "FieldMapping",
    "LengthFilter",
    "SPLITS",
    "SplitFractions",
    "TASKS",
    "TaskBuilder",
    "build_task",
    "get_builder",
    "host_problems",
    "is_built",
    "load_task",
    "read_jsonl",
    "records_from_examples",
    "resolve_source",
    "split_of",
    "task_dir",
    "task_names",
    "train_sentencepiece",
    "write_task",
]
