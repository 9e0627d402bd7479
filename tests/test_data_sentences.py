"""Tests of the sentence-level data: the splitter, summarize_debian_lead and
translate_en_de's sentences_only filter."""

import os

import pytest

from experiments import data
from experiments.data import common
from experiments.data import debian
from experiments.data import gettext_mo
from experiments.data import sentences
from experiments.data import tasks
from test_data_pypi import use_distributions


@pytest.fixture(autouse=True)
def no_installed_packages(monkeypatch):
  """The default sources never read the machine's own Python packages here."""
  use_distributions(monkeypatch, [])


# -----------------------------------------------------------------------------
# The sentence splitter.
# -----------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    # Abbreviations that never end a sentence.
    ("It reads images, e.g. PNG and JPEG files. It is fast.",
     ["It reads images, e.g. PNG and JPEG files.", "It is fast."]),
    ("A kernel, i.e. Linux or Hurd, is needed. Then install it.",
     ["A kernel, i.e. Linux or Hurd, is needed.", "Then install it."]),
    ("Compare it to Dr. Smith and see Jones et al. The results agree.",
     ["Compare it to Dr. Smith and see Jones et al. The results agree."]),
    ("Data from the U.S. Census Bureau. More follows.",
     ["Data from the U.S. Census Bureau.", "More follows."]),
    # "etc." before an uppercase word closes the sentence (a list ends it).
    ("It reads PNG, JPEG, etc. This package holds the library.",
     ["It reads PNG, JPEG, etc.", "This package holds the library."]),
    # Version numbers and file names: no space after their periods.
    ("Version 2.4.1 adds support. It needs libfoo 1.2. See setup.py and "
     "www.Example.org for Details.",
     ["Version 2.4.1 adds support.", "It needs libfoo 1.2.",
      "See setup.py and www.Example.org for Details."]),
    # Initials next to each other stay; a lone capital letter ends it.
    ("Fonts by A. V. Hershey are included. It is written in C. It is small.",
     ["Fonts by A. V. Hershey are included.", "It is written in C.",
      "It is small."]),
    # "!", "?", closing quotes and brackets.
    ("Fast! Really? Yes (mostly.) It prints \"Done.\" Then it exits.",
     ["Fast!", "Really?", "Yes (mostly.)", "It prints \"Done.\"",
      "Then it exits."]),
    # A lowercase word after a period does not start a sentence.
    ("Run foo. bar is started by it. Ok.",
     ["Run foo. bar is started by it.", "Ok."]),
    # One sentence, with or without a final mark; nothing.
    ("A tool to count stripes.", ["A tool to count stripes."]),
    ("A tool to count stripes", ["A tool to count stripes"]),
    ("", []),
    # A list as description_to_text writes it is one sentence.
    ("Features: fast counting of vertical stripes; colour reports; a quiet "
     "mode. Homepage:",
     ["Features: fast counting of vertical stripes; colour reports; a quiet "
      "mode.", "Homepage:"]),
])
def test_split_sentences(text, expected):
  assert sentences.split_sentences(text) == expected


def test_split_sentences_keeps_every_word():
  text = ("Zebra 1.0 counts stripes, e.g. in PNG files. It is by J. R. Doe! "
          "Is it fast? Yes, etc. The end")
  parts = sentences.split_sentences(text)
  assert len(parts) == 5
  assert " ".join(parts).split() == text.split()


def test_lead_split_two_sentence_rule():
  short = "Zebra counts stripes."  # 3 words
  long = " ".join(["word"] * 25) + "."
  assert sentences.lead_split([short, long, "Rest."], 20) == (
      [short, long], ["Rest."])
  assert sentences.lead_split([long, short, "Rest."], 20) == (
      [long], [short, "Rest."])
  assert sentences.lead_split([short], 20) == ([short], [])
  assert sentences.lead_split([short, long], 3) == ([short], [long])
  assert sentences.lead_split([], 20) == ([], [])


def test_is_mostly_list():
  prose = ("Zebra counts stripes.", "It reads PNG.", ".", " * a list item",
           "More prose here.")
  assert not debian.is_mostly_list(prose)
  assert debian.is_mostly_list((" * first item", "Then prose.", "More."))
  assert debian.is_mostly_list((" verbatim code", "Prose."))
  assert debian.is_mostly_list(("Features:", " * a", " * b", " - c"))
  assert debian.is_mostly_list(("Homepage:", "https://example.org/a",
                                "https://example.org/b"))
  assert debian.is_mostly_list((".",))
  assert debian.is_mostly_list(())
  # Exactly half is still prose.
  assert not debian.is_mostly_list(("Prose one.", " * item"))


# -----------------------------------------------------------------------------
# summarize_debian_lead.
# -----------------------------------------------------------------------------

_FILLER = ("The program reads its input files one by one and reports the "
           "number of stripes it found in each of them, together with the "
           "colours of the widest and the narrowest stripe. It can write "
           "its report as plain text, as CSV or as JSON, and it returns a "
           "non-zero exit status when a file could not be read.")  # 60 words
_LONG_LEAD = ("Quagga tools count the stripes of striped images in many file "
              "formats and print the total number of stripes together with "
              "their colours.")  # 24 words


def _stanza(package, lines):
  body = "\n".join(" " + line for line in lines)
  return (f"Package: {package}\nDescription-md5: {'0' * 32}\n"
          f"Description-en: synopsis of {package}\n{body}\n")


def _lead_lists_dir(tmp_path):
  stanzas = [
      # A short first sentence (6 words): the lead takes two.
      _stanza("two-lead", ["Zebra tools count the stripes.",
                           "They read PNG and PPM files and work on every "
                           "platform.", ".", _FILLER]),
      # A long first sentence: the lead is that sentence.
      _stanza("one-lead", [_LONG_LEAD, "It is written in C.", ".", _FILLER]),
      # A list first, and mostly lists / URLs.
      _stanza("list-first", [" * counts stripes", "Prose follows here.",
                             _FILLER]),
      _stanza("mostly-urls", ["Homepages of the project:",
                              "https://example.org/a", "https://example.org/b",
                              " * mirror one", _FILLER]),
      # The rest is under 40 words.
      _stanza("short-doc", [_LONG_LEAD.replace("Quagga", "Okapi"),
                            "It is small and fast."]),
      # The lead comes back later in the description.
      _stanza("repeated", ["Hyena tools count the spots of spotted images in "
                           "many file formats and print the total number of "
                           "spots found.", ".", _FILLER, ".",
                           "Hyena tools count the spots of spotted images in "
                           "many file formats and print the total number of "
                           "spots found."]),
      # No sentence end in the lead (nor anywhere).
      _stanza("no-end", ["Tapir tools count the stripes of striped images",
                         "and print the total number of stripes and colours"]),
      # Two descriptions sharing a lead: one is kept.
      _stanza("family-a", [_LONG_LEAD.replace("Quagga", "Lemur"), _FILLER,
                           "This package holds the library."]),
      _stanza("family-b", [_LONG_LEAD.replace("Quagga", "Lemur"), _FILLER,
                           "This package holds the documentation."]),
      "Package: no-long\nDescription-md5: 1\nDescription-en: synopsis only\n",
  ]
  lists = tmp_path / "lists"
  lists.mkdir()
  (lists / "example_dists_main_i18n_Translation-en").write_text(
      "\n".join(stanzas), encoding="utf-8")
  return str(lists)


def _all_rows(task, cache):
  return [r for s in common.SPLITS for r in data.load_task(task, s, cache)]


def test_summarize_debian_lead_builds_caches_and_loads(tmp_path):
  lists = _lead_lists_dir(tmp_path)
  cache = tmp_path / "cache"
  first = data.build_task("summarize_debian_lead", cache, lists_dir=lists,
                          show_progress=False)
  assert not first.reused
  assert first.meta["dropped"] == {
      "empty": 1, "mostly_list": 2, "lead_repeated": 1, "no_sentence_end": 1,
      "length": 1, "duplicate_lead": 1}
  rows = {r["origin"]: r for r in _all_rows("summarize_debian_lead", cache)}
  assert sum(first.meta["counts"].values()) == 3
  assert set(rows) == {"two-lead", "one-lead"} | (
      set(rows) & {"family-a", "family-b"})
  two = rows["two-lead"]
  assert two["targets"] == ("Zebra tools count the stripes. They read PNG and "
                            "PPM files and work on every platform.")
  assert two["inputs"] == _FILLER
  one = rows["one-lead"]
  assert one["targets"] == _LONG_LEAD
  assert one["inputs"] == "It is written in C. " + _FILLER
  for row in rows.values():
    assert row["targets"] not in row["inputs"]
    assert common.count_words(row["inputs"]) >= 40
  # The family member kept is the one with the smaller split key.
  family = [r for o, r in rows.items() if o.startswith("family")]
  assert len(family) == 1
  other = _FILLER + (" This package holds the documentation."
                     if family[0]["origin"] == "family-a" else
                     " This package holds the library.")
  assert common.split_key(family[0]["inputs"]) < common.split_key(other)

  again = data.build_task("summarize_debian_lead", cache, lists_dir=lists,
                          show_progress=False)
  assert again.reused and again.meta["build_id"] == first.meta["build_id"]
  # A looser filter keeps the short document.
  looser = data.build_task("summarize_debian_lead", cache, lists_dir=lists,
                           min_input_words=3, show_progress=False)
  assert not looser.reused
  assert "short-doc" in {r["origin"]
                         for r in _all_rows("summarize_debian_lead", cache)}
  assert "length" not in looser.meta["dropped"]


def test_summarize_debian_lead_is_registered_like_summarize_debian(tmp_path):
  lead = tasks.get_builder("summarize_debian_lead")
  plain = tasks.get_builder("summarize_debian")
  assert isinstance(lead, tasks.AptDescriptionsTask)
  assert isinstance(plain, tasks.AptDescriptionsTask)
  assert lead.mapping == plain.mapping and lead.option_names == ("lists_dir",)
  with pytest.raises(FileNotFoundError,
                     match=r"sudo apt-get update -o Acquire::Languages=en"):
    data.build_task("summarize_debian_lead", tmp_path / "c", source="apt",
                    lists_dir=str(tmp_path), show_progress=False)
  assert data.host_problems("summarize_debian_lead", tmp_path / "c",
                            source="apt", lists_dir=str(tmp_path))
  assert lead.auto_sources == plain.auto_sources == ("apt", "pypi")


# -----------------------------------------------------------------------------
# translate_en_de, sentences_only.
# -----------------------------------------------------------------------------


@pytest.mark.parametrize("en, de, expected", [
    ("The file could not be opened because it is locked by another program.",
     "Die Datei konnte nicht geöffnet werden, weil ein anderes Programm sie "
     "sperrt.", True),
    ("Do you want to remove all files in %s?",
     "Wollen Sie alle Dateien in %s entfernen?", True),
    ("The following packages will be removed:",
     "Die folgenden Pakete werden entfernt:", True),
    ("Could not open \u201c%s\u201d.",
     "\u201e%s\u201c konnte nicht ge\u00f6ffnet werden.", False),  # %s: 1 of 4
    ("Open file", "Datei öffnen", False),  # no final mark
    ("remove the file when done.", "Die Datei danach entfernen.", False),
    ("Remove the file when done.", "die Datei danach entfernen.", False),
    ("Use <b>bold</b> text for headings.", "Fetten Text nutzen.", False),
    ("Press Ctrl &amp; Q to quit.", "Strg &amp; Q zum Beenden.", False),
    ("-f, --force remove existing destination files.",
     "-f, --force vorhandene Zieldateien entfernen.", False),
    ("Usage: %s [OPTION]... FILE.", "Aufruf: %s [OPTION]... DATEI.", False),
    ("Try the -depth option instead.", "Probieren Sie -depth.", False),
    ("A well-known file name.", "Ein wohlbekannter Dateiname.", True),
    ("%s: %s: %s: %s.", "%s: %s: %s: %s.", False),
])
def test_is_sentence_pair(en, de, expected):
  assert gettext_mo.is_sentence_pair(en, de) is expected


_SENTENCE_CATALOG = [
    gettext_mo.MoEntry("Open file", "Datei öffnen"),
    gettext_mo.MoEntry(
        "The archive is damaged and cannot be read any more.",
        "Das Archiv ist beschädigt und kann nicht mehr gelesen werden."),
    gettext_mo.MoEntry("Could not save the document.",
                       "Das Dokument konnte nicht gespeichert werden."),
    gettext_mo.MoEntry("-v, --verbose print every file.",
                       "-v, --verbose jede Datei ausgeben."),
    gettext_mo.MoEntry("Click <b>Save</b> to keep the changes.",
                       "Klicken Sie <b>Speichern</b>, um sie zu behalten."),
]


def test_translate_en_de_sentences_only(tmp_path):
  root = tmp_path / "locale"
  path = root / "de" / "LC_MESSAGES" / "app.mo"
  os.makedirs(path.parent)
  path.write_bytes(gettext_mo.encode_mo(_SENTENCE_CATALOG))
  cache = tmp_path / "cache"
  everything = data.build_task("translate_en_de", cache,
                               locale_roots=(str(root),), show_progress=False)
  # The option stays out of the cache config unless set: caches built before
  # it existed are reused.
  assert "sentences_only" not in everything.meta["config"]
  assert "not_sentences" not in everything.meta
  assert sum(everything.meta["counts"].values()) == 5

  only = data.build_task("translate_en_de", cache, locale_roots=(str(root),),
                         sentences_only=True, show_progress=False)
  assert not only.reused and only.meta["config"]["sentences_only"] is True
  assert only.meta["not_sentences"] == {"pairs": 3}
  rows = {r["inputs"]: r["targets"]
          for r in _all_rows("translate_en_de", cache)}
  assert rows == {
      "The archive is damaged and cannot be read any more.":
          "Das Archiv ist beschädigt und kann nicht mehr gelesen werden.",
      "Could not save the document.":
          "Das Dokument konnte nicht gespeichert werden."}
  assert data.is_built("translate_en_de", cache, locale_roots=(str(root),),
                       sentences_only=True)

  longer = data.build_task("translate_en_de", cache, locale_roots=(str(root),),
                           sentences_only=True, min_target_words=7,
                           show_progress=False)
  assert [r["inputs"] for r in _all_rows("translate_en_de", cache)] == [
      "The archive is damaged and cannot be read any more."]
  assert longer.meta["num_filtered_out"] == 1
