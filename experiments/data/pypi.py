"""Installed Python packages as a text source: gettext catalogs and READMEs.

Two corpora ship inside the distributions of any Python environment, with no
Debian, no root and no network:

* German gettext catalogs (``.../<locale>/LC_MESSAGES/<domain>.po`` or
  ``.mo``, the layout of GNU gettext and of Babel) that packages such as
  Django (``django/conf/locale/de/`` and its contrib apps), Sphinx,
  ``plone.app.locales`` or JupyterLab's language packs carry: the EN->DE
  task (`installed_catalogs`, `catalog_pairs`);
* each distribution's core metadata (PEP 566 / the core metadata
  specification): ``Summary``, the one-line description, and
  ``Description``, the long description (usually the README) with its
  ``Description-Content-Type``: the summarisation tasks
  (`installed_descriptions`).

Distributions are found with `importlib.metadata` (the ``.dist-info`` /
``.egg-info`` folders on ``sys.path``); a name found twice is read from the
first, the one ``import`` would use. Nothing here downloads anything.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib.metadata
import os
import re
from typing import Any, Iterable, Iterator, Sequence

from absl import logging

from experiments.data import gettext_mo
from experiments.data import gettext_po
from experiments.data import readme_text

__all__ = [
    "GERMAN_LOCALES",
    "INSTALL_HINT",
    "NO_CATALOGS",
    "NO_DESCRIPTIONS",
    "PackageCatalog",
    "PackageDescription",
    "normalize_name",
    "distributions",
    "installed_catalogs",
    "read_catalog",
    "catalog_pairs",
    "installed_descriptions",
]

# As `experiments.data.debian.GERMAN_LOCALES`: a domain found in several is
# read from the first (de_CH writes "ss" for "ß").
GERMAN_LOCALES: tuple[str, ...] = ("de", "de_DE", "de_AT", "de_CH")

# What to install where no source is found (the host checks' sentences).
INSTALL_HINT = ('`pip install "specjax[experiments]"` (`pip install -e '
                '".[experiments]"` in a checkout) brings Django, Sphinx and '
                'plone.app.locales, whose German catalogs this source reads')
NO_CATALOGS = ("no installed Python package ships a German gettext catalog "
               "(<locale>/LC_MESSAGES/*.po or *.mo for locale de, de_DE, "
               "de_AT or de_CH): " + INSTALL_HINT)
NO_DESCRIPTIONS = ("no installed Python distribution has a long description "
                   "in its metadata; `pip install \"specjax[experiments]\"` "
                   "installs dozens that do")


def normalize_name(name: str) -> str:
  """A distribution name as PEP 503 normalises it (``Foo_Bar`` ->
  ``foo-bar``)."""
  return re.sub(r"[-_.]+", "-", name).lower()


def distributions(dists: Iterable[Any] | None = None) -> list[Any]:
  """The installed distributions, one per normalised name, sorted by it.

  Args:
    dists: `importlib.metadata.Distribution` objects (default: every one on
      ``sys.path``, `importlib.metadata.distributions`); of two with the same
      name the first is kept.
  """
  if dists is None:
    dists = importlib.metadata.distributions()
  chosen: dict[str, Any] = {}
  for dist in dists:
    name = dist.metadata.get("Name")
    if not name:
      continue
    chosen.setdefault(normalize_name(name), dist)
  return [chosen[n] for n in sorted(chosen)]


# -----------------------------------------------------------------------------
# Catalogs.
# -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PackageCatalog:
  """A German catalog inside a distribution.

  Attributes:
    distribution: the distribution's name (``Django``).
    domain: the text domain (the file name without ``.po`` / ``.mo``).
    locale: the locale folder (``de``, ``de_DE``...).
    path: the file (the ``.po`` when the folder has both, since it keeps
      the ``fuzzy`` flags and ``Default`` comments that `gettext_po` uses).
  """
  distribution: str
  domain: str
  locale: str
  path: str

  @property
  def origin(self) -> str:
    """``<distribution>:<domain>``, the records' ``origin``."""
    return f"{self.distribution}:{self.domain}"


def installed_catalogs(
    locales: Sequence[str] = GERMAN_LOCALES,
    dists: Iterable[Any] | None = None,
    exclude_domains: Sequence[str] = (),
) -> list[PackageCatalog]:
  """The German catalogs that installed distributions list in their files.

  A catalog is a file ``<root>/<locale>/LC_MESSAGES/<domain>.po`` (or
  ``.mo``) of a distribution's RECORD, with `locale` one of `locales`. Per
  distribution, catalog root and domain, one file is taken: from the first
  of `locales` that has one, the ``.po`` before the ``.mo``. Distributions
  without a file list (no RECORD) are skipped.

  Args:
    locales: the locale folders, in order of preference.
    dists: the distributions (default: the installed ones, `distributions`).
    exclude_domains: fnmatch patterns of domains to skip.

  Returns:
    Catalogs sorted by (distribution, path).
  """
  if isinstance(locales, str) or not locales:
    raise ValueError(f"locales must be a non-empty sequence of locale folder "
                     f"names such as {GERMAN_LOCALES}, got {locales!r}")
  rank = {loc: i for i, loc in enumerate(locales)}
  found: list[PackageCatalog] = []
  seen_real: set[str] = set()
  for dist in distributions(dists):
    files = dist.files
    if files is None:
      continue
    # (catalog root, domain) -> (locale rank, .mo after .po, path, locale)
    best: dict[tuple[str, str], tuple[int, int, str, str]] = {}
    for f in files:
      parts = f.parts
      if (len(parts) < 3 or parts[-2] != "LC_MESSAGES" or
          parts[-3] not in rank or not f.name.endswith((".po", ".mo"))):
        continue
      domain, suffix = f.name[:-3], f.name[-3:]
      if any(fnmatch.fnmatchcase(domain, pat) for pat in exclude_domains):
        continue
      key = ("/".join(parts[:-3]), domain)
      cand = (rank[parts[-3]], suffix == ".mo", str(dist.locate_file(f)),
              parts[-3])
      if key not in best or cand < best[key]:
        best[key] = cand
    name = dist.metadata["Name"]
    for (_, domain), (_, _, path, locale) in sorted(best.items()):
      real = os.path.realpath(path)
      if real in seen_real or not os.path.isfile(path):
        continue
      seen_real.add(real)
      found.append(PackageCatalog(name, domain, locale, path))
  return found


def read_catalog(catalog: PackageCatalog) -> list[gettext_mo.MoEntry]:
  """The entries of `catalog` (`gettext_po.read_po` or `gettext_mo.read_mo`)."""
  if catalog.path.endswith(".po"):
    return gettext_po.read_po(catalog.path)
  return gettext_mo.read_mo(catalog.path)


def catalog_pairs(catalog: PackageCatalog) -> Iterator[tuple[str, str]]:
  """The cleaned (English, German) pairs of `catalog`.

  As `gettext_mo.mo_translation_pairs`, less pairs whose two sides are
  equal: Python packages often ship ``.mo`` files compiled with the English
  text copied into untranslated entries.
  """
  for en, de in gettext_mo.mo_translation_pairs(read_catalog(catalog)):
    if en != de:
      yield en, de


# -----------------------------------------------------------------------------
# Descriptions.
# -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PackageDescription:
  """A distribution's descriptions from its core metadata.

  Attributes:
    distribution: the name.
    summary: the ``Summary`` field ("" when absent).
    body: the long description ("" when absent).
    content_type: ``Description-Content-Type`` without parameters, or None.
  """
  distribution: str
  summary: str
  body: str
  content_type: str | None


def _long_description(metadata: Any) -> str:
  """The long description: the message body (metadata 2.1+) or the
  ``Description`` header, whose continuation lines carry 8 spaces or
  ``       |`` (the core metadata specification)."""
  body = metadata.get_payload()
  if isinstance(body, str) and body.strip():
    return body
  header = metadata.get("Description") or ""
  if header.strip().upper() == "UNKNOWN":
    return ""
  lines = header.splitlines()
  out = lines[:1]
  for line in lines[1:]:
    if line.startswith("       |"):
      line = line[8:]
    elif line.startswith("        "):
      line = line[8:]
    out.append(line)
  return "\n".join(out)


def installed_descriptions(dists: Iterable[Any] | None = None
                           ) -> list[PackageDescription]:
  """The descriptions of the installed distributions, sorted by name.

  Distributions without a long description are included (with ``body``
  ""); a content type outside `readme_text.CONTENT_TYPES` is logged and
  passed on as None (read as reST).
  """
  out = []
  for dist in distributions(dists):
    metadata = dist.metadata
    summary = metadata.get("Summary") or ""
    if summary.strip().upper() == "UNKNOWN":
      summary = ""
    content_type = metadata.get("Description-Content-Type")
    if content_type:
      content_type = content_type.split(";")[0].strip().lower()
      if content_type not in readme_text.CONTENT_TYPES:
        logging.info("%s: unknown Description-Content-Type %r, read as reST",
                     metadata["Name"], content_type)
        content_type = None
    out.append(PackageDescription(metadata["Name"], " ".join(summary.split()),
                                  _long_description(metadata),
                                  content_type or None))
  return out
