"""The tasks made from Debian's or installed Python packages' text.

``translate_en_de`` (German gettext catalogs), ``summarize_debian`` and
``summarize_debian_lead`` (package descriptions): each reads Debian's files
(`experiments.data.debian`) or what installed Python packages ship
(`experiments.data.pypi`, `experiments.data.docstrings`), and defaults to
``source="auto"``, which `experiments.data.tasks.resolve_source` turns into
the first of `TaskBuilder.auto_sources` this host can build.
"""

from __future__ import annotations

import abc
import os
import time
from typing import Any, Iterable, Iterator

from absl import logging

from experiments.data import builder
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
    "TranslateEnDe",
    "AptDescriptionsTask",
    "SummarizeDebian",
    "SummarizeDebianLead",
]


class TranslateEnDe(builder.TaskBuilder):
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
      raise builder.unsupported(self, spec, "auto, debian, pypi, debian+pypi")
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


class AptDescriptionsTask(builder.TaskBuilder):
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

  def finish(self, records: Iterable[common.Record],
             options: builder.BuildOptions, drops: dict[str, int]
             ) -> Iterable[common.Record]:
    """All records of all indexes, before the writer (unchanged here);
    counts what it drops in `drops`."""
    del options, drops
    return records

  def native_examples(self, spec, options, cache_dir, show_progress):
    if spec.kind == "pypi":
      return self._pypi_examples(options)
    if spec.kind != "apt":
      raise builder.unsupported(self, spec, "auto, apt, pypi")
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
