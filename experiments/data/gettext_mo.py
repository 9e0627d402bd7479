"""GNU gettext ``.mo`` catalogs: reader, writer and translation-pair cleaning.

The binary format (GNU gettext manual, "The Format of GNU MO Files"), all
integers 32-bit in the file's byte order:

  offset 0   magic 0x950412de (read as 0xde120495 in the other byte order)
  offset 4   file format revision (major in the high 16 bits: 0 or 1)
  offset 8   N, the number of strings
  offset 12  O, offset of the table of original strings
  offset 16  T, offset of the table of translated strings
  offset 20  S, size of the hashing table
  offset 24  H, offset of the hashing table

Each table holds N (length, offset) pairs; the strings are NUL-terminated
but the length excludes the NUL. An original string is ``msgid`` or
``msgctxt EOT msgid`` (EOT = ``\\x04``), with ``\\0 msgid_plural`` appended for
plural entries; the matching translation is the plural forms joined by
``\\0``. The entry with an empty msgid is the header (``Content-Type: ...;
charset=...``), which gives the charset of the other strings.
"""

from __future__ import annotations

import dataclasses
import os
import re
import struct
from typing import Iterable, Iterator, Sequence

__all__ = [
    "MoEntry",
    "MoFormatError",
    "parse_mo",
    "read_mo",
    "encode_mo",
    "strip_accelerator",
    "clean_pair",
    "mo_translation_pairs",
    "is_sentence_pair",
]

MO_MAGIC = 0x950412DE


class MoFormatError(ValueError):
  """A file is not a valid GNU .mo catalog."""


@dataclasses.dataclass(frozen=True)
class MoEntry:
  """One catalog entry, decoded.

  Attributes:
    msgid: the singular original string ("" for the header entry).
    msgstr: the first (singular) translation.
    context: the msgctxt, or None.
    msgid_plural: the plural original string, or None.
    msgstr_plural: all translated plural forms (empty for non-plural entries).
  """
  msgid: str
  msgstr: str
  context: str | None = None
  msgid_plural: str | None = None
  msgstr_plural: tuple[str, ...] = ()


_CHARSET_RE = re.compile(r"charset\s*=\s*([-\w.:]+)", re.IGNORECASE)


def _header_charset(header: bytes) -> str:
  m = _CHARSET_RE.search(header.decode("ascii", errors="replace"))
  if not m or m.group(1).upper() == "CHARSET":
    return "utf-8"
  charset = m.group(1)
  try:
    "".encode(charset)
  except LookupError:
    return "utf-8"
  return charset


def parse_mo(data: bytes, name: str = "<bytes>") -> list[MoEntry]:
  """Parses the bytes of a .mo file (either byte order) into entries.

  The header entry is returned too (msgid ""); strings are decoded with the
  header's charset (UTF-8 when absent), invalid bytes replaced.

  Args:
    data: the whole file.
    name: a file name for error messages.

  Raises:
    MoFormatError: bad magic, unknown major revision, or a table or string
      pointing outside the file.
  """
  if len(data) < 28:
    raise MoFormatError(f"{name}: too short for a .mo file ({len(data)} bytes)")
  (magic,) = struct.unpack("<I", data[:4])
  if magic == MO_MAGIC:
    order = "<"
  elif magic == struct.unpack(">I", struct.pack("<I", MO_MAGIC))[0]:
    order = ">"
  else:
    raise MoFormatError(f"{name}: bad magic number 0x{magic:08x}")
  revision, n, orig_off, trans_off = struct.unpack(order + "4I", data[4:20])
  if revision >> 16 not in (0, 1):
    raise MoFormatError(f"{name}: unsupported major revision {revision >> 16}")
  for off in (orig_off, trans_off):
    if off + 8 * n > len(data):
      raise MoFormatError(
          f"{name}: string table at {off} with {n} entries runs past the end "
          f"of the file ({len(data)} bytes)")

  def table(off: int) -> list[bytes]:
    out = []
    for i in range(n):
      length, start = struct.unpack_from(order + "2I", data, off + 8 * i)
      if start + length > len(data):
        raise MoFormatError(
            f"{name}: string {i} at {start}+{length} runs past the end of the "
            f"file ({len(data)} bytes)")
      out.append(data[start:start + length])
    return out

  originals = table(orig_off)
  translations = table(trans_off)
  charset = "utf-8"
  for orig, trans in zip(originals, translations):
    if orig == b"":
      charset = _header_charset(trans)
      break

  entries = []
  for orig, trans in zip(originals, translations):
    context = None
    if b"\x04" in orig:
      ctx, orig = orig.split(b"\x04", 1)
      context = ctx.decode(charset, errors="replace")
    msgid_plural = None
    if b"\x00" in orig:
      orig, plural = orig.split(b"\x00", 1)
      msgid_plural = plural.decode(charset, errors="replace")
    forms = tuple(t.decode(charset, errors="replace")
                  for t in trans.split(b"\x00"))
    entries.append(MoEntry(
        msgid=orig.decode(charset, errors="replace"),
        msgstr=forms[0],
        context=context,
        msgid_plural=msgid_plural,
        msgstr_plural=forms if msgid_plural is not None else ()))
  return entries


def read_mo(path: str | os.PathLike) -> list[MoEntry]:
  """Reads and parses the .mo file at `path` (see `parse_mo`)."""
  with open(path, "rb") as f:
    return parse_mo(f.read(), name=os.fspath(path))


def encode_mo(entries: Iterable[MoEntry], byteorder: str = "little",
              charset: str = "UTF-8", header: bool = True) -> bytes:
  """Builds the bytes of a .mo file holding `entries` (no hash table).

  Args:
    entries: the entries; plural entries use ``msgid_plural`` and
      ``msgstr_plural``, context entries ``context``.
    byteorder: "little" or "big".
    charset: the charset written into the header and used to encode strings.
    header: prepend a header entry (msgid "") declaring `charset`, unless one
      of `entries` already has an empty msgid.

  Returns:
    The file contents, readable by `parse_mo` and by Python's
    ``gettext.GNUTranslations``.
  """
  if byteorder not in ("little", "big"):
    raise ValueError(f"byteorder must be 'little' or 'big', got {byteorder!r}")
  order = "<" if byteorder == "little" else ">"
  pairs: list[tuple[bytes, bytes]] = []
  for e in entries:
    orig = e.msgid.encode(charset)
    if e.context is not None:
      orig = e.context.encode(charset) + b"\x04" + orig
    if e.msgid_plural is not None:
      orig += b"\x00" + e.msgid_plural.encode(charset)
      forms = e.msgstr_plural or (e.msgstr,)
      trans = b"\x00".join(f.encode(charset) for f in forms)
    else:
      trans = e.msgstr.encode(charset)
    pairs.append((orig, trans))
  if header and not any(o == b"" for o, _ in pairs):
    pairs.append((b"", (f"Content-Type: text/plain; charset={charset}\n"
                        ).encode("ascii")))
  pairs.sort()
  n = len(pairs)
  orig_off = 28
  trans_off = orig_off + 8 * n
  data_off = trans_off + 8 * n
  blobs = bytearray()
  orig_table = []
  trans_table = []
  for which, table in ((0, orig_table), (1, trans_table)):
    for pair in pairs:
      s = pair[which]
      table.append((len(s), data_off + len(blobs)))
      blobs += s + b"\x00"
  out = bytearray(struct.pack(order + "7I", MO_MAGIC, 0, n, orig_off,
                              trans_off, 0, data_off))
  for length, off in orig_table + trans_table:
    out += struct.pack(order + "2I", length, off)
  out += blobs
  return bytes(out)


# -----------------------------------------------------------------------------
# Cleaning.
# -----------------------------------------------------------------------------

# A GTK mnemonic ("_File") or a Qt/KDE accelerator ("&File"): the marker
# followed by a letter or digit ("&&" is never one).
_UNDERSCORE_ACCEL_RE = re.compile(r"_(?=[^\W_])")
_AMP_ACCEL_RE = re.compile(r"(?<!&)&(?=[^\W_])(?![A-Za-z]+;|#\d+;)")
# printf (%s, %5.2f, %1$s, %'d, %lu, %(name)s), Python/C# braces ({0},
# {name}), Qt (%1), shell-ish ($VAR, ${VAR}).
_FORMAT_RE = re.compile(
    r"%(?:\([^)]*\))?(?:\d+\$)?[-+ #0']*(?:\*|\d+)?(?:\.(?:\*|\d+))?"
    r"(?:hh|h|ll|l|L|q|j|z|Z|t|I64|I32)?[diouxXeEfFgGaAcspnmC%]"
    r"|%\d+|\{[^{}\s]*\}|\$\{?\w+\}?|<[^<>]*>")
# gnupg marks some msgids with a pseudo context: "|pinentry-label|_OK".
_PSEUDO_CONTEXT_RE = re.compile(r"^\|[^|\s]{1,40}\|")
_LETTERS_RE = re.compile(r"[^\W\d_]{2,}")


def strip_accelerator(text: str, marker: str) -> str:
  """Removes one keyboard-accelerator `marker` ("_" or "&") from `text`.

  Only a single marker in front of a letter or digit is removed (``"_Open"``,
  ``"Sa&ve"``); texts with several candidates (``snake_case_names``) are
  returned unchanged, and ``"&&"`` is left alone (in gettext catalogs it is
  mostly shell syntax, not Qt's escaped ampersand).
  """
  if marker == "_":
    hits = _UNDERSCORE_ACCEL_RE.findall(text)
    if len(hits) == 1 and text.count("_") == 1:
      return _UNDERSCORE_ACCEL_RE.sub("", text)
    return text
  if marker == "&":
    if len(_AMP_ACCEL_RE.findall(text)) == 1:
      text = _AMP_ACCEL_RE.sub("", text)
    return text
  raise ValueError(f"marker must be '_' or '&', got {marker!r}")


_SNAKE_RE = re.compile(r"^[a-z0-9]+(?:_[a-z0-9]+)+$")


def _has_accelerator(text: str, marker: str) -> bool:
  """True when `text` carries exactly one plausible accelerator `marker`.

  A marker at the start of a word always counts; one inside a word only in a
  short label (at most five words, no format specifier, no ``=``, no path or
  newline) whose word has no digit and is not a snake_case identifier.
  """
  if marker == "_":
    if text.count("_") != 1 or not _UNDERSCORE_ACCEL_RE.search(text):
      return False
  elif len(_AMP_ACCEL_RE.findall(text)) != 1:
    return False
  if marker == "_":
    i = text.index(marker)
  else:
    i = _AMP_ACCEL_RE.search(text).start()
  if i == 0 or text[i - 1].isspace():
    return True
  word = next(w for w in text.split() if marker in w)
  if (len(text.split()) > 5 or any(c in text for c in "%=/\\\n") or
      any(c.isdigit() for c in word) or _SNAKE_RE.match(word.strip(".,:;"))):
    return False
  return True


def _is_shared_identifier(msgid: str, msgstr: str, marker: str) -> bool:
  """True when the word holding `marker` in `msgid` also occurs in `msgstr`.

  The comparison ignores case and surrounding punctuation; a marker that
  starts both strings (``"_Open"`` / ``"_Öffnen"``) is never an identifier.
  """
  if msgid.startswith(marker) and msgstr.startswith(marker):
    return False
  for word in msgid.split():
    if marker in word:
      return word.strip(".,;:!?()[]'\"`").lower() in msgstr.lower()
  return False


def _only_formats(text: str) -> bool:
  """True when `text` has no word of two letters outside format specifiers."""
  return not _LETTERS_RE.search(_FORMAT_RE.sub(" ", text))


def clean_pair(msgid: str, msgstr: str) -> tuple[str, str] | None:
  """Cleans one (English, German) catalog pair; None when it should be dropped.

  Steps: drop untranslated entries and the header; remove a gnupg-style
  ``|context|`` prefix; remove an accelerator marker when *both* sides
  carry exactly one (``"_Open"`` / ``"Ö_ffnen"``) and it is not inside a
  word that both sides share (``max_connections``, ``AT&T`` are identifiers,
  not accelerators); collapse whitespace (multi-line help texts become one
  line); drop pairs that are only format strings / punctuation / numbers,
  and pairs whose two sides are identical single tokens (identifiers,
  option names).
  """
  if not msgid or not msgstr:
    return None
  msgid = _PSEUDO_CONTEXT_RE.sub("", msgid)
  msgstr = _PSEUDO_CONTEXT_RE.sub("", msgstr)
  for marker in ("_", "&"):
    if (_has_accelerator(msgid, marker) and _has_accelerator(msgstr, marker)
        and not _is_shared_identifier(msgid, msgstr, marker)):
      msgid = strip_accelerator(msgid, marker)
      msgstr = strip_accelerator(msgstr, marker)
  msgid = " ".join(msgid.split())
  msgstr = " ".join(msgstr.split())
  if not msgid or not msgstr:
    return None
  if _only_formats(msgid) or _only_formats(msgstr):
    return None
  if msgid == msgstr and " " not in msgid:
    return None
  return msgid, msgstr


def mo_translation_pairs(entries: Sequence[MoEntry]
                         ) -> Iterator[tuple[str, str]]:
  """Yields the cleaned singular (msgid, msgstr) pairs of catalog `entries`.

  Context is dropped, plural entries give their singular pair, the header
  and untranslated entries are skipped (see `clean_pair`).
  """
  for e in entries:
    if not e.msgid:
      continue
    pair = clean_pair(e.msgid, e.msgstr)
    if pair is not None:
      yield pair


# Markup: an HTML/XML/Pango tag or an entity ("<b>", "</a>", "&amp;").
_MARKUP_RE = re.compile(r"<[A-Za-z/!?][^<>]*>|&(?:[A-Za-z]+|#\d+);")
# A command-line option ("-f", "--force") or a usage synopsis.
_OPTION_RE = re.compile(r"(?:^|[\s\[(|,])--?[A-Za-z]|\busage:", re.IGNORECASE)
_SENTENCE_END = (".", "!", "?", ":")
_CLOSERS = "\"')]\u201c\u201d\u2019\u00bb\u00ab"


def _ends_like_sentence(text: str) -> bool:
  return text.rstrip(_CLOSERS).endswith(_SENTENCE_END)


def is_sentence_pair(en: str, de: str, max_format_fraction: float = 0.2
                     ) -> bool:
  """True when a cleaned (English, German) pair reads as full sentences.

  The English side starts with an uppercase letter and the German side does
  not start with a lowercase one; both end with ``.``, ``!``, ``?`` or ``:``
  (closing quotes or brackets allowed after it); neither holds markup (tags,
  entities) nor a command-line option or usage synopsis (``-f``,
  ``--force``, ``Usage:``), the staple of ``--help`` texts; and format
  specifiers (``%s``, ``{0}``, ``$VAR``) are at most `max_format_fraction`
  of the English words. Word-count limits are the task's `LengthFilter`.
  """
  if not en or not de or not en[0].isupper() or de[0].islower():
    return False
  if not (_ends_like_sentence(en) and _ends_like_sentence(de)):
    return False
  if any(_MARKUP_RE.search(t) or _OPTION_RE.search(t) for t in (en, de)):
    return False
  n_formats = len(_FORMAT_RE.findall(en))
  return n_formats <= max_format_fraction * len(en.split())
