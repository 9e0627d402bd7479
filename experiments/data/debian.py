"""Debian as a text source: package descriptions and gettext catalogs.

Two corpora come out of an ordinary Debian system:

* ``Translation-en`` indexes (``/var/lib/apt/lists/*_i18n_Translation-en*``,
  present after ``apt-get update -o Acquire::Languages=en``) hold, per
  package description, a one-line synopsis and a long description: the
  summarisation task (`parse_translation_en`, `description_to_text`).
* German gettext catalogs (``usr/share/locale/de*/LC_MESSAGES/*.mo``) of
  installed packages, and of packages fetched with ``apt-get download`` and
  unpacked with ``dpkg-deb``: the EN->DE task (`local_catalogs`,
  `pick_catalog_packages`, `download_catalogs`).

Nothing here runs ``apt-get update`` unless `apt_update` is called.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from typing import Iterable, Iterator, Mapping, Sequence

from absl import logging

from experiments.data import common

__all__ = [
    "APT_LISTS_DIR",
    "SUDO_APT_UPDATE",
    "GERMAN_LOCALES",
    "TranslationEntry",
    "parse_deb822",
    "parse_translation_en",
    "description_to_text",
    "is_mostly_list",
    "translation_en_files",
    "read_translation_en",
    "apt_update",
    "apt_problems",
    "LocalCatalog",
    "local_catalogs",
    "packages_index_files",
    "read_packages_index",
    "installed_packages",
    "score_package",
    "KNOWN_CATALOG_PACKAGES",
    "pick_catalog_packages",
    "download_catalogs",
]

APT_LISTS_DIR = "/var/lib/apt/lists"
# The one command an ordinary user of a Debian/Ubuntu host runs once so that
# every later build reads apt's English descriptions and Packages index
# without root (`apt_update` runs the same, when it runs as root).
SUDO_APT_UPDATE = "sudo apt-get update -o Acquire::Languages=en"
# Locale folders read for German, in order of preference: when a text domain
# exists in several, only the first is used (de_CH writes "ss" for "ß").
GERMAN_LOCALES: tuple[str, ...] = ("de", "de_DE", "de_AT", "de_CH")

# -----------------------------------------------------------------------------
# deb822 and Translation-en.
# -----------------------------------------------------------------------------


def parse_deb822(text: str) -> Iterator[dict[str, str]]:
  """Parses deb822 stanzas (Packages, Translation-en, status files).

  Stanzas are separated by blank lines; a field is ``Name: value``; a line
  starting with a space or tab continues the previous field and is kept
  verbatim after a newline (so ``Description`` keeps its structure). Lines
  starting with ``#`` are comments.
  """
  fields: dict[str, str] = {}
  last = None
  for line in text.splitlines():
    if not line.strip():
      if fields:
        yield fields
      fields, last = {}, None
      continue
    if line.startswith("#"):
      continue
    if line[0] in " \t":
      if last is not None:
        fields[last] += "\n" + line
      continue
    name, sep, value = line.partition(":")
    if not sep:
      continue
    last = name.strip()
    fields[last] = value.strip()
  if fields:
    yield fields


@dataclasses.dataclass(frozen=True)
class TranslationEntry:
  """One stanza of a Translation-en index.

  Attributes:
    package: the ``Package`` field.
    md5: the ``Description-md5`` field.
    synopsis: the first line of ``Description-en``.
    long_lines: the continuation lines of ``Description-en``, each with its
      leading space removed (" ." lines became ".").
  """
  package: str
  md5: str
  synopsis: str
  long_lines: tuple[str, ...]


def parse_translation_en(text: str) -> Iterator[TranslationEntry]:
  """Yields the entries of a Translation-en index (see `TranslationEntry`).

  Stanzas without a ``Description-en`` (or ``Description``) are skipped.
  """
  for stanza in parse_deb822(text):
    desc = stanza.get("Description-en", stanza.get("Description"))
    if desc is None:
      continue
    first, *rest = desc.split("\n")
    yield TranslationEntry(
        package=stanza.get("Package", ""),
        md5=stanza.get("Description-md5", ""),
        synopsis=first.strip(),
        long_lines=tuple(line[1:] if line[:1] in " \t" else line
                         for line in rest))


_BULLET_RE = re.compile(r"^\s*(?:[-*+o#\u2022]|\d{1,2}[.)])\s+")
_URL_ONLY_RE = re.compile(r"^\s*(?:<?https?://\S+>?|\S+@\S+\.\S+)\s*$")


def description_to_text(long_lines: Sequence[str]) -> str:
  """Turns the long-description lines of a Debian package into plain prose.

  Debian policy (5.6.13): a line " ." is a blank line (paragraph break); a
  line indented by more than one space is displayed verbatim (lists, code).
  Here paragraphs are joined with one space; list bullets (``*``, ``-``,
  ``o``, ``+``, ``1.``) are dropped, and an item (its indented continuation
  lines included) without final punctuation ends with ``;``, or ``.`` when
  it is the last item of its list; lines that are only a URL or an e-mail
  address are dropped; whitespace is collapsed.
  """
  pieces: list[str] = []
  in_item = False

  def close_item(final: bool) -> None:
    nonlocal in_item
    if in_item and pieces and pieces[-1] and pieces[-1][-1] not in ".;:,!?":
      pieces[-1] += "." if final else ";"
    in_item = False

  for raw in long_lines:
    line = raw.rstrip()
    if line.strip() in (".", ""):
      close_item(final=True)
      continue
    if _URL_ONLY_RE.match(line):
      continue
    item = _BULLET_RE.sub("", line)
    if item != line:
      close_item(final=False)
      pieces.append(item.strip())
      in_item = True
    elif in_item and line[:1].isspace():
      pieces[-1] += " " + line.strip()
    else:
      close_item(final=True)
      pieces.append(line.strip())
  close_item(final=True)
  return common.collapse_whitespace(" ".join(pieces))


def _is_list_line(line: str) -> bool:
  """A list item, a verbatim (indented) line or a URL / e-mail-only line."""
  return bool(_BULLET_RE.match(line) or _URL_ONLY_RE.match(line) or
              line[:1].isspace())


def is_mostly_list(long_lines: Sequence[str], max_fraction: float = 0.5
                   ) -> bool:
  """True when a long description is not prose to take a lead sentence from.

  That is: it has no content line (only " ." separators or nothing), its
  first content line is a list item, a verbatim (indented) line or a lone
  URL / e-mail address, or more than `max_fraction` of its content lines
  are (the lines as in `TranslationEntry.long_lines`).
  """
  content = [line for line in long_lines if line.strip() not in ("", ".")]
  if not content or _is_list_line(content[0]):
    return True
  n_list = sum(1 for line in content if _is_list_line(line))
  return n_list > max_fraction * len(content)


def translation_en_files(lists_dir: str = APT_LISTS_DIR) -> list[str]:
  """The Translation-en indexes apt keeps in `lists_dir`, sorted.

  When an index exists in several compressions only one is returned (plain,
  then .gz, .xz, .bz2, .lz4, .zst).
  """
  found = sorted(glob.glob(os.path.join(lists_dir, "*_i18n_Translation-en*")))
  order = ["", ".gz", ".xz", ".bz2", ".lz4", ".zst"]
  by_stem: dict[str, str] = {}
  for path in found:
    stem, ext = path, ""
    for e in order[1:]:
      if path.endswith(e):
        stem, ext = path[:-len(e)], e
    if ext not in order:
      continue
    if stem not in by_stem or order.index(ext) < order.index(
        by_stem[stem][len(stem):]):
      by_stem[stem] = path
  return sorted(by_stem.values())


def read_translation_en(path: str) -> Iterator[TranslationEntry]:
  """Reads one (possibly compressed) Translation-en index."""
  with open(path, "rb") as f:
    data = common.decompress_bytes(f.read(), path)
  yield from parse_translation_en(data.decode("utf-8", errors="replace"))


def apt_update(languages: str = "en", extra_args: Sequence[str] = ()) -> None:
  """Runs ``apt-get update -o Acquire::Languages=<languages>`` (needs root).

  Raises:
    RuntimeError: apt-get is missing or the update failed (its stderr is in
      the message).
  """
  exe = shutil.which("apt-get")
  if exe is None:
    raise RuntimeError("apt-get not found: --apt_update needs a Debian/Ubuntu "
                       "system")
  cmd = [exe, "update", "-o", f"Acquire::Languages={languages}", *extra_args]
  logging.info("running %s", " ".join(cmd))
  result = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if result.returncode != 0:
    raise RuntimeError(
        f"`{' '.join(cmd)}` failed with exit code {result.returncode} (root "
        f"is needed: as an ordinary user run `{SUDO_APT_UPDATE}` once, then "
        f"build without apt_update):\n{result.stderr.strip()}")


def apt_problems(update: bool = False, download: bool = False,
                 lists_dir: str = APT_LISTS_DIR) -> list[str]:
  """What this host lacks to run `apt_update` (`update`) and `download_catalogs`
  of packages picked from apt's index (`download`), one sentence each.

  Checks only: runs nothing and touches no network. [] when nothing is missing
  (or nothing is asked).
  """
  if not (update or download):
    return []
  if shutil.which("apt-get") is None:
    return ["this host has no apt-get (it is not Debian/Ubuntu, or apt-get is "
            "not on PATH)"]
  problems = []
  geteuid = getattr(os, "geteuid", None)
  if update and geteuid is not None and geteuid() != 0:
    problems.append(f"`apt-get update` needs root and this process runs as uid "
                    f"{geteuid()}: run `{SUDO_APT_UPDATE}` once (later builds "
                    f"read apt's lists without root)")
  if download:
    if shutil.which("dpkg-deb") is None:
      problems.append("this host has no dpkg-deb (it unpacks the downloaded "
                      "packages)")
    if not packages_index_files(lists_dir) and shutil.which("apt-cache") is None:
      problems.append(f"no Packages index under {lists_dir} and no apt-cache "
                      f"(to pick the packages to download)")
  return problems


# -----------------------------------------------------------------------------
# Local gettext catalogs.
# -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LocalCatalog:
  """A German catalog file: its text domain, locale folder and path."""
  domain: str
  locale: str
  path: str


def local_catalogs(
    roots: Sequence[str] = ("/usr/share/locale",),
    locales: Sequence[str] = GERMAN_LOCALES,
    exclude_domains: Sequence[str] = (),
) -> list[LocalCatalog]:
  """Finds ``<root>/<locale>/LC_MESSAGES/*.mo`` catalogs, one per domain.

  Args:
    roots: locale roots to scan, in order of preference.
    locales: locale folders, in order of preference; a domain found under
      several (roots, locales) is taken from the first.
    exclude_domains: fnmatch patterns of text domains to skip (``"iso_*"``).

  Returns:
    Catalogs sorted by domain; symlinks to an already chosen file are dropped.
  """
  chosen: dict[str, LocalCatalog] = {}
  seen_real: set[str] = set()
  for root in roots:
    for locale in locales:
      folder = os.path.join(root, locale, "LC_MESSAGES")
      for path in sorted(glob.glob(os.path.join(folder, "*.mo"))):
        domain = os.path.basename(path)[:-3]
        if domain in chosen:
          continue
        if any(fnmatch.fnmatchcase(domain, pat) for pat in exclude_domains):
          continue
        real = os.path.realpath(path)
        if real in seen_real:
          continue
        seen_real.add(real)
        chosen[domain] = LocalCatalog(domain, locale, path)
  return [chosen[d] for d in sorted(chosen)]


# -----------------------------------------------------------------------------
# Picking and downloading packages that ship German catalogs.
# -----------------------------------------------------------------------------


def packages_index_files(lists_dir: str = APT_LISTS_DIR) -> list[str]:
  """The binary ``Packages`` indexes in `lists_dir` (any compression)."""
  return sorted(p for p in glob.glob(os.path.join(lists_dir, "*_Packages*"))
                if not p.endswith((".diff_Index", ".gpg")))


def read_packages_index(paths: Sequence[str] | None = None
                        ) -> list[dict[str, str]]:
  """Reads Packages stanzas from `paths` (default: apt's lists).

  Falls back to ``apt-cache dumpavail`` when no index file is found.
  """
  if paths is None:
    paths = packages_index_files()
  stanzas: list[dict[str, str]] = []
  if paths:
    for path in paths:
      with open(path, "rb") as f:
        text = common.decompress_bytes(f.read(), path).decode(
            "utf-8", errors="replace")
      stanzas.extend(parse_deb822(text))
    return stanzas
  exe = shutil.which("apt-cache")
  if exe is None:
    raise RuntimeError(
        f"no Packages index under {APT_LISTS_DIR} and no apt-cache: cannot "
        f"pick packages to download")
  out = subprocess.run([exe, "dumpavail"], capture_output=True, text=True,
                       check=True).stdout
  return list(parse_deb822(out))


def installed_packages() -> set[str]:
  """Names of the installed packages (empty set without dpkg-query)."""
  exe = shutil.which("dpkg-query")
  if exe is None:
    return set()
  result = subprocess.run([exe, "-W", "-f=${Package}\\n"], capture_output=True,
                          text=True, check=False)
  return set(result.stdout.split())


_SKIP_SECTIONS = frozenset({
    "libdevel", "doc", "debug", "fonts", "oldlibs", "metapackages", "tasks",
    "haskell", "rust", "golang", "javascript", "java", "perl", "python",
    "ruby", "php", "gnu-r", "ocaml", "lisp", "cli-mono", "introspection",
    "kernel", "tex", "zope"})
_SKIP_SUFFIXES = ("-dev", "-doc", "-dbg", "-dbgsym", "-udeb", "-tests",
                  "-examples")
_L10N_SUFFIXES = ("-l10n", "-locales", "-i18n")


def _tags(stanza: Mapping[str, str]) -> set[str]:
  return {t.strip() for t in re.split(r"[,\s]+", stanza.get("Tag", ""))
          if t.strip()}


def score_package(stanza: Mapping[str, str]) -> float:
  """How likely a package (a Packages stanza) ships German gettext catalogs.

  A heuristic from the Packages index alone; 0 means "do not try". Signals:
  GNU, GNOME and Xfce projects (debtags ``suite::``, the homepage) translate
  through gettext almost always; KDE too; ``*-l10n`` / ``*-locales`` /
  ``*-i18n`` packages exist to carry catalogs (Qt-only ones ship ``.qm``
  instead and score low); GTK programs and their ``-common``/``-data``
  packages usually do. Development, documentation, language-binding and
  library sections, metapackages, themes and tiny dependency-only packages
  are skipped.
  """
  name = stanza.get("Package", "")
  section = stanza.get("Section", "").split("/")[-1]
  if not name or section in _SKIP_SECTIONS or name.endswith(_SKIP_SUFFIXES):
    return 0.0
  tags = _tags(stanza)
  if tags & {"role::metapackage", "role::dummy", "made-of::icons",
             "role::documentation", "role::debug-symbols"}:
    return 0.0
  if "icon-theme" in name or "-theme" in name:
    return 0.0
  try:
    if int(stanza.get("Installed-Size", "100")) < 20:  # KiB: dependency-only
      return 0.0
  except ValueError:
    pass
  homepage = stanza.get("Homepage", "").lower()
  score = 0.0
  if "suite::gnu" in tags or "gnu.org/software" in homepage or (
      "savannah" in homepage):
    score += 4
  if ("suite::gnome" in tags or section == "gnome" or "gnome.org" in homepage):
    score += 3
  if "suite::xfce" in tags or section == "xfce" or "xfce.org" in homepage:
    score += 3
  if "suite::kde" in tags or section == "kde" or "kde.org" in homepage:
    score += 2
  if "uitoolkit::gtk" in tags:
    score += 2
  if name.endswith(_L10N_SUFFIXES):
    qt_only = "lxqt" in name or "uitoolkit::qt" in tags
    score += 1 if qt_only else 4
  if score == 0:
    return 0.0
  if "role::program" in tags or "role::app-data" in tags:
    score += 1
  if name.endswith(("-common", "-data")) and section != "libs":
    score += 0.5
  if section in ("libs", "localization") and not name.endswith(_L10N_SUFFIXES):
    score -= 2
  return max(score, 0.0)


# Packages known to carry sizeable German catalogs under usr/share/locale
# (GNU toolchain and system tools, GTK, GNOME and Xfce data packages). They
# are tried first; everything after them comes from `score_package`.
KNOWN_CATALOG_PACKAGES: tuple[str, ...] = (
    "gcc-12-locales", "util-linux-locales", "e2fsprogs-l10n", "gnupg-l10n",
    "libgtk-3-common", "libgtk-4-common", "gimp-data", "gnucash-common",
    "aptitude-common", "libsane-common", "subversion", "vlc-l10n",
    "evolution-data-server-common", "evolution-common", "gnome-shell-common",
    "mutter-common", "network-manager", "pulseaudio", "gparted-common",
    "synaptic", "mc-data", "nano", "sudo", "kbd", "gawk", "bison", "gdbm-l10n",
    "libgpg-error-l10n", "libgphoto2-l10n", "libgstreamer-plugins-base1.0-0",
    "gstreamer1.0-plugins-good", "udisks2", "xfce4-panel", "totem-common",
    "cheese-common", "zenity-common", "gnome-software-common", "evince-common",
    "claws-mail-i18n", "pidgin-data")


def pick_catalog_packages(
    max_packages: int,
    stanzas: Sequence[Mapping[str, str]] | None = None,
    *,
    exclude: Iterable[str] = (),
    max_size_bytes: int = 30_000_000,
    per_source: int = 1,
    known: Sequence[str] = KNOWN_CATALOG_PACKAGES,
) -> list[str]:
  """Picks up to `max_packages` packages likely to ship German catalogs.

  Args:
    max_packages: how many names to return.
    stanzas: Packages stanzas (default: `read_packages_index`).
    exclude: names to leave out (e.g. the installed packages, whose catalogs
      are read from the locale folder anyway).
    max_size_bytes: skip .debs larger than this (download time).
    per_source: at most this many binary packages per source package (the
      catalogs of one source usually live in one of its binaries).
    known: names tried first, in this order, when the index has them.

  Returns:
    Package names: first those of `known`, then the others by decreasing
    `score_package`. Within one source package, a name from `known`, then a
    ``-common`` / ``-data`` /
    ``-l10n`` / ``-locales`` / ``-i18n`` binary is preferred over the
    program, since that is where Debian usually puts the catalogs. The order
    is deterministic for a given index.
  """
  if max_packages <= 0:
    return []
  if stanzas is None:
    stanzas = read_packages_index()
  exclude = set(exclude)
  # name -> (score, size, source)
  cands: dict[str, tuple[float, int, str]] = {}
  for st in stanzas:
    name = st.get("Package", "")
    if not name or name in exclude:
      continue
    score = score_package(st)
    if name in known:
      score = max(score, 1.0)
    if score <= 0:
      continue
    try:
      size = int(st.get("Size", "0"))
    except ValueError:
      size = 0
    if size > max_size_bytes:
      continue
    source = st.get("Source", name).split()[0]
    prev = cands.get(name)
    if prev is None or (-score, size) < (-prev[0], prev[1]):
      cands[name] = (score, size, source)

  data_suffixes = _L10N_SUFFIXES + ("-common", "-data")
  groups: dict[str, list[str]] = {}
  for name, (_, _, source) in cands.items():
    groups.setdefault(source, []).append(name)
  rank = {n: i for i, n in enumerate(known)}
  for members in groups.values():
    members.sort(key=lambda n: (rank.get(n, len(rank)),
                                not n.endswith(data_suffixes), -cands[n][0],
                                cands[n][1], n))

  def group_key(source: str) -> tuple[int, float, int, str]:
    members = groups[source]
    known_rank = min((rank[n] for n in members if n in rank),
                     default=len(rank))
    best = max(cands[n][0] for n in members)
    return (known_rank, -best, cands[members[0]][1], members[0])

  picked: list[str] = []
  for source in sorted(groups, key=group_key):
    for name in groups[source][:per_source]:
      picked.append(name)
      if len(picked) >= max_packages:
        return picked
  return picked


def _apt_download(names: Sequence[str], directory: str) -> None:
  """``apt-get download`` of `names` into `directory`; failures are logged."""
  exe = shutil.which("apt-get")
  if exe is None:
    raise RuntimeError("apt-get not found: downloading catalogs needs a "
                       "Debian/Ubuntu system (use max_packages=0)")
  for start in range(0, len(names), 20):
    batch = list(names[start:start + 20])
    result = subprocess.run([exe, "download", *batch], cwd=directory,
                            capture_output=True, text=True, check=False)
    if result.returncode == 0:
      continue
    # One unknown name fails the whole batch: retry one by one.
    for name in batch:
      if glob.glob(os.path.join(directory, f"{name}_*.deb")):
        continue
      r = subprocess.run([exe, "download", name], cwd=directory,
                         capture_output=True, text=True, check=False)
      if r.returncode != 0:
        logging.warning("apt-get download %s failed: %s", name,
                        r.stderr.strip().splitlines()[-1:] or r.returncode)


def _extract_catalogs(deb: str, out_dir: str, locales: Sequence[str]) -> int:
  """Copies the German .mo files of `deb` into `out_dir`; returns how many."""
  exe = shutil.which("dpkg-deb")
  if exe is None:
    raise RuntimeError("dpkg-deb not found: cannot unpack downloaded packages")
  wanted = tuple(f"usr/share/locale/{loc}/LC_MESSAGES/" for loc in locales)
  proc = subprocess.Popen([exe, "--fsys-tarfile", deb], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
  n = 0
  try:
    with tarfile.open(fileobj=proc.stdout, mode="r|*") as tar:
      for member in tar:
        name = member.name.lstrip("./")
        if not (member.isfile() and name.endswith(".mo") and
                name.startswith(wanted)):
          continue
        locale = name.split("/")[3]
        f = tar.extractfile(member)
        if f is None:
          continue
        dest = os.path.join(out_dir, locale, "LC_MESSAGES",
                            os.path.basename(name))
        common.atomic_write_bytes(dest, f.read())
        n += 1
  finally:
    if proc.stdout is not None:
      proc.stdout.close()
    proc.wait()
  return n


def download_catalogs(
    packages: Sequence[str],
    dest_root: str,
    locales: Sequence[str] = GERMAN_LOCALES,
    show_progress: bool = True,
) -> dict[str, int]:
  """Downloads `packages` and keeps their German catalogs under `dest_root`.

  Each package's catalogs go to ``<dest_root>/<package>/<locale>/
  LC_MESSAGES/<domain>.mo``, followed by an empty ``.done`` marker, so a
  package already fetched is not fetched again. The .debs themselves live in
  a temporary folder that is removed afterwards.

  Returns:
    {package: number of catalogs found} for every package in `packages`
    (0 when it had none or could not be downloaded).
  """
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
  counts: dict[str, int] = {}
  todo = []
  for name in packages:
    marker = os.path.join(dest_root, name, ".done")
    if os.path.exists(marker):
      counts[name] = len(glob.glob(os.path.join(dest_root, name, "*",
                                                "LC_MESSAGES", "*.mo")))
    else:
      todo.append(name)
  if not todo:
    return counts
  with tempfile.TemporaryDirectory(prefix="specjax-debs-") as tmp:
    _apt_download(todo, tmp)
    for name in tqdm(todo, desc="extracting catalogs",
                     disable=not show_progress):
      debs = sorted(glob.glob(os.path.join(tmp, f"{name}_*.deb")))
      out_dir = os.path.join(dest_root, name)
      n = 0
      for deb in debs:
        n += _extract_catalogs(deb, out_dir, locales)
      counts[name] = n
      if debs:
        common.atomic_write_bytes(os.path.join(out_dir, ".done"), b"")
  return counts
