"""GNU gettext ``.po`` catalogs (the text form), read into `gettext_mo.MoEntry`.

Python packages on PyPI often ship a catalog's source ``.po`` file next to, or
instead of, its compiled ``.mo``. The syntax (GNU gettext manual, "The Format
of PO Files"): an entry is a run of comment lines (``#`` translator, ``#.``
extracted, ``#:`` reference, ``#,`` flags, ``#|`` previous msgid) followed by
``msgctxt``, ``msgid``, ``msgid_plural`` and ``msgstr`` / ``msgstr[N]``
keywords, each followed by one or more C string literals that are
concatenated; entries are separated by blank lines; ``#~`` lines are obsolete
entries. The header (msgid ``""``) names the charset.

Two rules make a ``.po`` entry into the pair a compiled ``.mo`` would hold,
or a better one:

* entries flagged ``fuzzy`` are skipped (``msgfmt`` leaves them out of the
  ``.mo`` too: the translation is unreviewed);
* projects that use message identifiers (Zope / Plone style ``msgid
  "help_title"``) put the English text in an extracted comment ``#. Default:
  "..."``; when the msgid is such an identifier and the comment is there, the
  comment's text becomes the msgid.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from typing import Iterator

from experiments.data import gettext_mo

__all__ = [
    "PoFormatError",
    "PoEntry",
    "parse_po",
    "read_po",
    "po_entries_as_mo",
]


class PoFormatError(ValueError):
  """A file is not a readable GNU .po catalog."""


@dataclasses.dataclass(frozen=True)
class PoEntry:
  """One ``.po`` entry, decoded.

  Attributes:
    msgid, msgstr, context, msgid_plural, msgstr_plural: as in
      `gettext_mo.MoEntry` (``msgstr`` is ``msgstr[0]`` for plural entries).
    fuzzy: the ``#, fuzzy`` flag is set.
    default: the text of a ``#. Default: "..."`` comment, or None.
  """
  msgid: str
  msgstr: str
  context: str | None = None
  msgid_plural: str | None = None
  msgstr_plural: tuple[str, ...] = ()
  fuzzy: bool = False
  default: str | None = None


_KEYWORD_RE = re.compile(r"^(msgctxt|msgid_plural|msgid|msgstr(?:\[(\d+)\])?)"
                         r"\s+(\".*\")\s*$")
_STRING_RE = re.compile(r"^(\".*\")\s*$")
_DEFAULT_RE = re.compile(r"^Default:\s*(\".*\")\s*$")
_CHARSET_RE = re.compile(rb"charset\s*=\s*([-\w.:]+)", re.IGNORECASE)
# A message identifier rather than English text: lowercase words joined by
# "_", "-" or "." ("help_title", "label.save").
_IDENTIFIER_RE = re.compile(r"^[a-z][a-z0-9]*(?:[_.-][a-z0-9]+)+$")


def _unquote(literal: str, where: str) -> str:
  """The value of one C string literal (``"..."`` with C escapes)."""
  if len(literal) < 2 or literal[0] != '"' or literal[-1] != '"':
    raise PoFormatError(f"{where}: not a quoted string: {literal!r}")
  body = literal[1:-1]
  # Python's string literal escapes are a superset of C's (\n \t \" \\ \ooo
  # \xhh); a raw unescaped quote inside is malformed in both.
  try:
    return ast.literal_eval('"' + body.replace("\n", "") + '"')
  except (SyntaxError, ValueError) as e:
    raise PoFormatError(f"{where}: bad string literal {literal!r} ({e})"
                        ) from None


def _charset(data: bytes) -> str:
  """The charset the header of a .po file declares (UTF-8 by default)."""
  m = _CHARSET_RE.search(data[:4000])
  if not m:
    return "utf-8"
  name = m.group(1).decode("ascii", errors="replace")
  try:
    "".encode(name)
  except LookupError:
    return "utf-8"
  return "utf-8" if name.upper() == "CHARSET" else name


def parse_po(data: bytes | str, name: str = "<po>") -> list[PoEntry]:
  """Parses the contents of a .po file into entries (the header included).

  Args:
    data: the file's bytes (decoded with the header's charset, invalid bytes
      replaced) or its text.
    name: a file name for error messages.

  Raises:
    PoFormatError: a line that is neither a comment, a keyword with a
      string, nor a continuation string, or a bad string literal.
  """
  if isinstance(data, bytes):
    data = data.decode(_charset(data), errors="replace")
  entries: list[PoEntry] = []
  fields: dict[str, str] = {}
  plurals: dict[int, str] = {}
  flags: set[str] = set()
  default: list[str | None] = [None]
  current: list[str | None] = [None]  # the keyword continuation lines extend

  def flush() -> None:
    if "msgid" in fields:
      forms = tuple(plurals[i] for i in sorted(plurals))
      entries.append(PoEntry(
          msgid=fields["msgid"],
          msgstr=fields.get("msgstr", forms[0] if forms else ""),
          context=fields.get("msgctxt"),
          msgid_plural=fields.get("msgid_plural"),
          msgstr_plural=forms if "msgid_plural" in fields else (),
          fuzzy="fuzzy" in flags,
          default=default[0]))
    fields.clear()
    plurals.clear()
    flags.clear()
    default[0] = None
    current[0] = None

  for n, raw in enumerate(data.splitlines(), 1):
    line = raw.strip()
    where = f"{name}:{n}"
    if not line:
      flush()
      continue
    if line.startswith("#"):
      if "msgid" in fields and "msgstr" in fields or plurals:
        flush()  # a new entry's comments without a blank line before them
      if line.startswith("#,"):
        flags.update(f.strip() for f in line[2:].split(","))
      elif line.startswith("#."):
        m = _DEFAULT_RE.match(line[2:].strip())
        if m:
          default[0] = _unquote(m.group(1), where)
      continue  # other comments, and obsolete (#~) entries, are skipped
    m = _KEYWORD_RE.match(line)
    if m:
      keyword, index, literal = m.groups()
      if keyword in ("msgctxt", "msgid") and ("msgstr" in fields or plurals):
        flush()  # the next entry starts without a blank line
      value = _unquote(literal, where)
      if index is not None:
        plurals[int(index)] = value
        current[0] = f"plural:{index}"
      else:
        fields[keyword] = value
        current[0] = keyword
      continue
    m = _STRING_RE.match(line)
    if m and current[0] is not None:
      value = _unquote(m.group(1), where)
      if current[0].startswith("plural:"):
        plurals[int(current[0][7:])] += value
      else:
        fields[current[0]] += value
      continue
    raise PoFormatError(f"{where}: cannot parse {raw[:80]!r}")
  flush()
  return entries


def po_entries_as_mo(entries: list[PoEntry]) -> Iterator[gettext_mo.MoEntry]:
  """The entries a compiled catalog would hold, with English msgids.

  Fuzzy entries are skipped; an identifier msgid (``help_title``) with a
  ``Default`` comment is replaced by the comment's text (see the module
  docstring). The header entry (msgid ``""``) is kept.
  """
  for e in entries:
    if e.fuzzy:
      continue
    msgid = e.msgid
    if e.default and _IDENTIFIER_RE.match(msgid):
      msgid = e.default
    yield gettext_mo.MoEntry(msgid=msgid, msgstr=e.msgstr, context=e.context,
                             msgid_plural=e.msgid_plural,
                             msgstr_plural=e.msgstr_plural)


def read_po(path: str | os.PathLike) -> list[gettext_mo.MoEntry]:
  """Reads the .po file at `path` as `po_entries_as_mo` entries."""
  with open(path, "rb") as f:
    data = f.read()
  return list(po_entries_as_mo(parse_po(data, name=os.fspath(path))))
