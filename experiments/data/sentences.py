"""Sentence splitting and XSum-style lead extraction for English prose.

`split_sentences` cuts text after ``.``, ``!`` or ``?`` (optionally followed
by closing quotes or brackets) when whitespace and then an uppercase letter
(optionally behind an opening quote or bracket) follow. Everything else stays
inside a sentence:

* periods without a following space: version numbers (``1.2.3``), file and
  host names (``setup.py``, ``www.debian.org``), ``e.g.,``;
* abbreviations that never end a sentence (`NON_FINAL_ABBREVIATIONS`:
  ``e.g.``, ``i.e.``, ``cf.``, ``vs.``, ``Dr.``, ``et al.``, ...), and dotted
  initialisms of single letters (``U.S.``, ``e.g.``);
* initials: a one-letter word with a period next to another one (``A. V.
  Hershey``); a lone one (``written in C. It ...``) ends the sentence.

``etc.``, ``Inc.`` and ``Ltd.`` followed by an uppercase word do end a
sentence: in Debian's descriptions "..., etc. This package ..." is by far the
commonest use (a list closes the sentence), and keeping them joined would
glue the following sentence to the lead.

`lead_split` takes the lead of a text the way XSum took a BBC article's
introductory sentence as its summary (Narayan et al. 2018): the first
sentence, or the first two when the first is short, and the remaining
sentences as the document.
"""

from __future__ import annotations

import re
from typing import Sequence

__all__ = [
    "NON_FINAL_ABBREVIATIONS",
    "split_sentences",
    "lead_split",
]

# Lowercased words (without their final period) after which a period never
# ends a sentence, even when an uppercase word follows.
NON_FINAL_ABBREVIATIONS: frozenset[str] = frozenset({
    "e.g", "eg", "i.e", "ie", "cf", "vs", "viz", "approx", "incl", "esp",
    "resp", "ca", "al", "fig", "figs", "dr", "mr", "mrs", "ms", "prof", "st",
    "jr", "sr", "vol", "no", "nr", "sect", "ch", "ed", "eds", "rev", "gen",
    "ref", "refs", "dept", "univ", "min", "max", "mt", "ft", "pp", "op",
})

# A sentence-final mark, closing quotes/brackets, whitespace, and the start of
# the next sentence (an uppercase letter, maybe behind an opening quote or
# bracket): the split goes between the whitespace and the next sentence.
_BOUNDARY_RE = re.compile(
    r"[.!?]+[\"'\u201d\u2019)\]]*(\s+)(?=[\"'\u201c\u2018(\[]?[A-Z\u00c0-\u00de])")
_DOTTED_INITIALISM_RE = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]$")
_INITIAL_RE = re.compile(r"^[A-Z]\.$")


def _last_word(text: str) -> str:
  """The last whitespace-separated word of `text` (with its punctuation)."""
  parts = text.rsplit(None, 1)
  return parts[-1] if parts else ""


def _is_boundary(before: str, after: str) -> bool:
  """Whether a candidate boundary between `before` (ending in the mark and
  any closing characters) and `after` (the next sentence) is a real one."""
  word = _last_word(before)
  if not word.endswith("."):
    return True  # "!" / "?" / a closing quote or bracket after the mark
  stem = word[:-1].lstrip("\"'(\u201c\u2018[")
  if stem.lower() in NON_FINAL_ABBREVIATIONS:
    return False
  if _DOTTED_INITIALISM_RE.match(stem):
    return False
  if _INITIAL_RE.match(word):
    # "A. V. Hershey": an initial next to another initial. "in C. It": not.
    previous = _last_word(before[:-len(word)])
    following = after.split(None, 1)[0] if after.split() else ""
    if _INITIAL_RE.match(previous) or _INITIAL_RE.match(following):
      return False
  return True


def split_sentences(text: str) -> list[str]:
  """Splits `text` into sentences (see the module docstring for the rule).

  Whitespace inside a sentence is kept as it is; each sentence is stripped.
  Text without a boundary is one sentence; empty text gives [].
  """
  sentences: list[str] = []
  start = 0
  for m in _BOUNDARY_RE.finditer(text):
    end = m.start(1)
    if _is_boundary(text[start:end], text[m.end(1):]):
      piece = text[start:end].strip()
      if piece:
        sentences.append(piece)
      start = m.end(1)
  rest = text[start:].strip()
  if rest:
    sentences.append(rest)
  return sentences


def lead_split(sentences: Sequence[str], short_lead_words: int
               ) -> tuple[list[str], list[str]]:
  """(lead sentences, document sentences) of a text given as `sentences`.

  The lead is the first sentence, or the first two when the first has fewer
  than `short_lead_words` words; the document is the sentences after it
  ([] when none remain). Empty `sentences` give ([], []).
  """
  n = 1
  if sentences and len(sentences[0].split()) < short_lead_words:
    n = 2
  return list(sentences[:n]), list(sentences[n:])
