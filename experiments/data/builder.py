"""The interface of the task builders: options, results and `TaskBuilder`.

`experiments.data.tasks` holds the registry and `build` / `load`; the tasks
themselves subclass `TaskBuilder` (there and in `experiments.data.text_tasks`).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Iterable, Mapping

from experiments.data import common
from experiments.data import debian
from experiments.data import sources

__all__ = [
    "BuildOptions",
    "BuildResult",
    "TaskBuilder",
    "unsupported",
]


@dataclasses.dataclass(frozen=True)
class BuildOptions:
  """Options of `build`. Fields a task does not use are ignored by it.

  Attributes:
    source: where the examples come from; None means the task's default
      (see the module docstring and `experiments.data.sources`).
    max_packages: translate_en_de: how many extra Debian packages to
      download for their German catalogs (0: only the local ones).
    packages: translate_en_de: packages to download in addition.
    apt_update: summarize_debian / translate_en_de: run ``apt-get update -o
      Acquire::Languages=en`` first (needs root and the network).
    locale_roots: translate_en_de: local locale roots to scan.
    exclude_domains: translate_en_de: fnmatch patterns of gettext domains to
      skip (the iso-codes name lists by default).
    sentences_only: translate_en_de: keep only pairs that read as full
      sentences (`gettext_mo.is_sentence_pair`: capitalised, final
      punctuation, no markup, no command-line options); pair it with
      ``min_input_words`` / ``min_target_words`` for long ones.
    lists_dir: apt's lists directory.
    code_dir: code_python: the directory to read (default: the stdlib).
    chunking: code_python: "file" or "toplevel".
    tfds_data_dir: TFDS data_dir.
    max_examples: read at most this many examples per split (local / TFDS).
    min_input_words, max_input_words, min_target_words, max_target_words:
      override the task's `common.LengthFilter` defaults.
    validation_fraction, test_fraction: override the hash-split fractions.
  """
  source: str | None = None
  max_packages: int = 0
  packages: tuple[str, ...] = ()
  apt_update: bool = False
  locale_roots: tuple[str, ...] = ("/usr/share/locale",)
  exclude_domains: tuple[str, ...] = ("iso_*",)
  sentences_only: bool = False
  lists_dir: str = debian.APT_LISTS_DIR
  code_dir: str | None = None
  chunking: str = "file"
  tfds_data_dir: str | None = None
  max_examples: int | None = None
  min_input_words: int | None = None
  max_input_words: int | None = None
  min_target_words: int | None = None
  max_target_words: int | None = None
  validation_fraction: float | None = None
  test_fraction: float | None = None

  def __post_init__(self):
    for name in ("packages", "locale_roots", "exclude_domains"):
      value = getattr(self, name)
      if isinstance(value, str):
        value = (value,)
      object.__setattr__(self, name, tuple(value))
    if self.max_packages < 0:
      raise ValueError(f"max_packages must be >= 0, got {self.max_packages}")

  def cache_config(self, builder: "TaskBuilder") -> dict[str, Any]:
    """The options that determine the built files of `builder`'s task."""
    config = {"source": self.source or builder.default_source,
              "length_filter": dataclasses.asdict(self.length_filter(builder)),
              "max_examples": self.max_examples}
    if builder.fixed_split is None:
      config["split_fractions"] = dataclasses.asdict(self.fractions())
    kind = sources.parse_source(config["source"]).kind
    for name in builder.source_option_names.get(kind, builder.option_names):
      value = getattr(self, name)
      config[name] = list(value) if isinstance(value, tuple) else value
    for name in builder.flag_names:
      if getattr(self, name):
        config[name] = True
    return config

  def length_filter(self, builder: "TaskBuilder") -> common.LengthFilter:
    """The builder's default filter with this object's overrides."""
    return builder.default_filter.replace(
        min_input_words=self.min_input_words,
        max_input_words=self.max_input_words,
        min_target_words=self.min_target_words,
        max_target_words=self.max_target_words)

  def fractions(self) -> common.SplitFractions:
    """The hash-split fractions with this object's overrides."""
    default = common.SplitFractions()
    return common.SplitFractions(
        validation=(default.validation if self.validation_fraction is None
                    else self.validation_fraction),
        test=default.test if self.test_fraction is None else self.test_fraction)


@dataclasses.dataclass(frozen=True)
class BuildResult:
  """What `build` made (or found).

  Attributes:
    task: the task name.
    directory: the task's cache directory.
    paths: {split: path of its JSONL file}.
    meta: the contents of ``meta.json`` (``meta["counts"]`` per split).
    reused: True when an existing build was returned without reading sources.
  """
  task: str
  directory: str
  paths: dict[str, str]
  meta: dict[str, Any]
  reused: bool


class TaskBuilder(abc.ABC):
  """How one task gets its examples. Subclasses set the class attributes.

  Attributes:
    name: the registry name.
    description: one line for ``--help`` and the meta.
    default_source: the source used when `BuildOptions.source` is None.
    mapping: the field mapping for local-file and TFDS sources.
    default_filter: the length limits unless overridden.
    fixed_split: put every record into this split (evaluation sets).
    unfiltered_splits: splits fixed by the source that are not filtered.
    option_names: `BuildOptions` fields that change this task's output.
    flag_names: boolean `BuildOptions` fields that change the output when
      True; they enter the cache config only then, so that builds made
      before a flag existed keep their cache.
    source_option_names: {source kind: the `option_names` of builds from
      that source} where they differ (a PyPI build ignores apt's options).
    auto_sources: the sources ``source="auto"`` tries, in order (see
      `experiments.data.tasks.resolve_source`); empty when the task has no
      "auto".
    auto_adjustments: {source: {field: value}}: the filter and split fields
      "auto" changes for a smaller source (`auto_candidate`).
  """
  name: str = ""
  description: str = ""
  default_source: str = ""
  mapping: sources.FieldMapping = sources.FieldMapping("inputs", "targets")
  default_filter: common.LengthFilter = common.LengthFilter()
  fixed_split: str | None = None
  unfiltered_splits: tuple[str, ...] = ()
  option_names: tuple[str, ...] = ()
  flag_names: tuple[str, ...] = ()
  source_option_names: Mapping[str, tuple[str, ...]] = {}
  auto_sources: tuple[str, ...] = ()
  auto_adjustments: Mapping[str, Mapping[str, float]] = {}

  def auto_candidate(self, options: BuildOptions, source: str
                     ) -> tuple[BuildOptions, dict[str, Any]]:
    """The options of an "auto" build from `source` (one of `auto_sources`),
    and {field: [asked, used]} for the fields changed for that source.

    `auto_adjustments` ({source: {field: value}}) names them, for a source
    much smaller than the one the options were sized for: a ``min_*_words``
    value is a ceiling (a stricter minimum is relaxed to it), a
    ``*_fraction`` replaces the default split fraction unless the options
    set one. Explicit sources are never adjusted.
    """
    changes: dict[str, Any] = {}
    adjusted: dict[str, Any] = {}
    for name, value in self.auto_adjustments.get(source, {}).items():
      asked = getattr(options, name)
      if name.startswith("min_"):
        current = (getattr(self.default_filter, name) if asked is None
                   else asked)
        if current <= value:
          continue
      elif name.endswith("_fraction"):
        if asked is not None:
          continue
        current = getattr(common.SplitFractions(), name[:-len("_fraction")])
      else:
        raise ValueError(f"{type(self).__name__}.auto_adjustments: {name!r} "
                         f"is neither a min_*_words nor a *_fraction field")
      changes[name] = value
      adjusted[name] = [current, value]
    return dataclasses.replace(options, source=source, **changes), adjusted

  def examples(self, options: BuildOptions, cache_dir: str,
               show_progress: bool
               ) -> tuple[Iterable[common.Record], str, dict[str, Any]]:
    """Returns (records, source description, extra meta) for `options`.

    `cache_dir` is the cache root (for downloads kept between builds).

    Local-file sources (``jsonl:``/``tsv:``) are handled here for every
    task; anything else goes to `native_examples`.
    """
    spec = sources.parse_source(options.source or self.default_source)
    if spec.kind in ("jsonl", "tsv"):
      examples = sources.iter_local_examples(spec, self.mapping,
                                             options.max_examples)
      records = sources.records_from_examples(examples, self.mapping)
      return records, str(spec), {}
    return self.native_examples(spec, options, cache_dir, show_progress)

  @abc.abstractmethod
  def native_examples(self, spec: sources.SourceSpec, options: BuildOptions,
                      cache_dir: str, show_progress: bool
                      ) -> tuple[Iterable[common.Record], str, dict[str, Any]]:
    """The task's own sources (Debian, stdlib, TFDS...)."""

  def host_problems(self, spec: sources.SourceSpec, options: BuildOptions
                    ) -> list[str]:
    """What this host lacks to read `spec` with `options`, one sentence each
    ([] here: the tasks that need system tools override it). Checks only."""
    del spec, options
    return []


def unsupported(builder: TaskBuilder, spec: sources.SourceSpec,
                supported: str) -> ValueError:
  """The error for a source `builder` does not read; `supported` lists its
  own sources."""
  return ValueError(
      f"task {builder.name!r} does not support source {str(spec)!r}; use "
      f"{supported}, jsonl:PATH or tsv:PATH")
