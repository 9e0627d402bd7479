"""The prose of a package README (Markdown, reStructuredText or plain text).

A distribution's long description (core metadata ``Description``, usually
its README) mixes prose with badges, code, tables, lists and markup. For a
summarisation source only the prose is wanted, in sections:
`readme_sections` returns ``[(heading, [paragraph, ...]), ...]`` where

* headings are Markdown ATX (``# Title``) or setext (``Title`` over ``===``
  / ``---``) headings and reStructuredText section titles (a line with a
  punctuation underline, optionally an overline);
* dropped blocks: fenced and indented code, reST literal blocks (after
  ``::``) and directives / comments (``.. name::``, ``..``) with their
  indented bodies, HTML blocks and comments, tables (``|`` rows, ``+---+``
  grids, ``=== ===`` simple tables), list items (bullets, enumerations,
  field lists ``:name:``), block quotes (``>``), Markdown link definitions
  (``[ref]: url``);
* inline markup is reduced to its text: links (``[text](url)``, ``[text][ref]``,
  ```text <url>`_``, ``text_``), images and badges (removed), code spans,
  emphasis, reST roles (``:func:`name```) and substitutions (``|name|``,
  removed), HTML tags (removed), bare URLs (removed).

The content type follows the core metadata specification: ``text/markdown``,
``text/x-rst`` or ``text/plain``; a missing one is read as reST, the
specification's default (plain text reads the same way).
"""

from __future__ import annotations

import re
from typing import Sequence

__all__ = [
    "CONTENT_TYPES",
    "inline_text",
    "readme_sections",
]

CONTENT_TYPES: tuple[str, ...] = ("text/markdown", "text/x-rst", "text/plain")

_FENCE_RE = re.compile(r"^\s{0,3}(```+|~~~+)")
_ATX_RE = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_UNDERLINE_RE = re.compile(r"^([=\-~^\"'`#*+:._])\1{2,}\s*$")
_LIST_RE = re.compile(r"^\s*(?:[-*+\u2022]|\d{1,3}[.)]|#\.|\(?[a-zA-Z\d]\))\s+")
_FIELD_RE = re.compile(r"^\s*:[^:\s][^:]*:(?:\s|$)")
_TABLE_RE = re.compile(r"^\s*(?:\||\+[-=+]+\+?\s*$|=+(?:\s+=+)+\s*$)")
_DIRECTIVE_RE = re.compile(r"^\s*\.\.(?:\s|$)")
_LINKDEF_RE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*\S+")
_HTML_BLOCK_RE = re.compile(r"^\s*<(?:!--|[A-Za-z/!?])")

_IMAGE_RE = re.compile(r"!\[[^\]]*\]\([^)]*\)|!\[[^\]]*\]\[[^\]]*\]")
_MD_LINK_RE = re.compile(r"\[([^\]]*)\]\([^)]*\)|\[([^\]]+)\]\[[^\]]*\]")
_RST_LINK_RE = re.compile(r"`([^`<]*?)\s*<[^>`]*>`_{1,2}")
_RST_REF_RE = re.compile(
    r"`([^`]+)`_{1,2}|\b([A-Za-z0-9][\w-]*[A-Za-z0-9])_(?!\w)")
_ROLE_RE = re.compile(r":[\w.+-]+:`(?:([^`<]*?)\s*<[^>`]*>|([^`]*))`")
_CODE_RE = re.compile(r"``([^`]+)``|`([^`]+)`")
_EMPH_RE = re.compile(r"(?<!\w)(\*\*|__|\*|_)(?=\S)(.+?)(?<=\S)\1(?!\w)")
_SUBST_RE = re.compile(r"\|[^|\s][^|]*\|_{0,2}")
_TAG_RE = re.compile(r"<!--.*?-->|</?[A-Za-z][^<>]*>")
_URL_RE = re.compile(r"<?\b(?:https?|ftp)://[^\s<>]+>?")
_WS_RE = re.compile(r"\s+")
# A Markdown backslash escape ("CODE\\_OF\\_CONDUCT"); hidden from the other
# rules as a private-use character, restored at the end.
_MD_ESCAPE_RE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|<>~])")
_PRIVATE = 0xE000


def _hide(text: str, chars: str) -> str:
  """`text` with `chars` mapped to private-use characters (see `_PRIVATE`)."""
  return "".join(chr(_PRIVATE + ord(c)) if c in chars else c for c in text)


def inline_text(text: str, markdown: bool = False) -> str:
  """`text` with its inline Markdown / reST markup reduced to plain words
  (see the module docstring), whitespace collapsed. reST's ``name_``
  references are read only when not `markdown`."""
  if markdown:
    text = _MD_ESCAPE_RE.sub(lambda m: _hide(m.group(1), m.group(1)), text)
  text = _TAG_RE.sub(" ", text)
  text = _IMAGE_RE.sub(" ", text)
  text = _MD_LINK_RE.sub(lambda m: m.group(1) or m.group(2) or "", text)
  text = _RST_LINK_RE.sub(lambda m: m.group(1), text)
  text = _ROLE_RE.sub(lambda m: m.group(1) or m.group(2) or "", text)
  if not markdown:
    text = _RST_REF_RE.sub(lambda m: m.group(1) or m.group(2), text)
  # Code spans keep their text verbatim: their "_" and "*" are hidden from
  # the emphasis rule.
  text = _CODE_RE.sub(lambda m: _hide(m.group(1) or m.group(2), "_*"), text)
  text = _SUBST_RE.sub(" ", text)
  text = _URL_RE.sub(" ", text)
  for _ in range(2):  # nested emphasis (***x***)
    text = _EMPH_RE.sub(lambda m: m.group(2), text)
  text = re.sub("[\ue000-\ue07f]", lambda m: chr(ord(m.group()) - _PRIVATE),
                text)
  text = _WS_RE.sub(" ", text).strip()
  # Markup removed in front of punctuation leaves "word ." behind.
  return re.sub(r"\s+([.,;:!?])", r"\1", text)


def _indent(line: str) -> int:
  return len(line) - len(line.lstrip(" \t"))


def _has_words(text: str) -> bool:
  return bool(re.search(r"[^\W\d_]{2,}", text))


def readme_sections(text: str, content_type: str | None = None
                    ) -> list[tuple[str, list[str]]]:
  """The prose of a README, as ``[(heading, [paragraph, ...]), ...]``.

  The first section's heading is ``""`` (the text before any heading);
  sections without a prose paragraph are left out. Paragraphs are inline
  text (`inline_text`) with at least one word of two letters.

  Args:
    text: the README.
    content_type: ``text/markdown``, ``text/x-rst``, ``text/plain`` (a
      ``; charset=...`` parameter is ignored) or None (read as reST).

  Raises:
    ValueError: `content_type` is none of those.
  """
  kind = (content_type or "text/x-rst").split(";")[0].strip().lower()
  if kind not in CONTENT_TYPES:
    raise ValueError(f"content_type must be one of {CONTENT_TYPES} or None, "
                     f"got {content_type!r}")
  markdown = kind == "text/markdown"
  lines = text.expandtabs(4).splitlines()
  sections: list[tuple[str, list[str]]] = [("", [])]
  para: list[str] = []
  # "skip_indented": drop the indented lines that follow (literal blocks,
  # directive bodies); "skip_block": drop lines until a blank line.
  mode = None
  literal_next = False

  def end_paragraph() -> None:
    nonlocal literal_next
    if not para:
      return
    joined = " ".join(s.strip() for s in para)
    literal_next = not markdown and joined.endswith("::")
    if literal_next:
      joined = joined[:-2].rstrip() + (":" if not joined[:-2].endswith(" ")
                                       else "")
    para.clear()
    prose = inline_text(joined, markdown)
    if _has_words(prose):
      sections[-1][1].append(prose)

  def heading(title: str) -> None:
    para.clear()
    sections.append((inline_text(title, markdown), []))

  i = 0
  while i < len(lines):
    line = lines[i].rstrip()
    i += 1
    if mode == "fence":
      if _FENCE_RE.match(line):
        mode = None
      continue
    if mode == "skip_indented":
      if not line.strip() or _indent(line) > 0:
        continue
      mode = None
    if mode == "skip_block":
      if line.strip():
        continue
      mode = None
    if not line.strip():
      end_paragraph()
      continue
    if literal_next and _indent(line) > 0:
      mode = "skip_indented"
      continue
    literal_next = False
    if _FENCE_RE.match(line):
      end_paragraph()
      mode = "fence"
      continue
    if markdown:
      m = _ATX_RE.match(line)
      if m:
        end_paragraph()
        heading(m.group(1))
        continue
    # A title with an underline (and maybe an overline) of one character.
    if (_UNDERLINE_RE.match(line) and i < len(lines) and
        lines[i].strip() and i + 1 < len(lines) and
        _UNDERLINE_RE.match(lines[i + 1].rstrip()) and not para):
      heading(lines[i])
      i += 2
      continue
    if _UNDERLINE_RE.match(line) and len(para) == 1 and (
        markdown and line.lstrip()[0] in "=-" or not markdown):
      heading(para[0])
      continue
    if (not para and _indent(line) >= 4) or line.lstrip().startswith(">"):
      # Indented code (Markdown) or a block quote (reST): not the author's
      # running prose.
      mode = "skip_indented" if _indent(line) else "skip_block"
      continue
    if not markdown and _DIRECTIVE_RE.match(line):
      end_paragraph()
      mode = "skip_indented"
      continue
    if (_LIST_RE.match(line) or _FIELD_RE.match(line) or
        _TABLE_RE.match(line) or _LINKDEF_RE.match(line) or
        (not para and _HTML_BLOCK_RE.match(line))):
      end_paragraph()
      mode = "skip_block"
      continue
    para.append(line)
  end_paragraph()
  return [(title, paras) for title, paras in sections if paras]

