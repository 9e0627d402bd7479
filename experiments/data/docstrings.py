"""The prose of docstrings in installed Python distributions.

PEP 257: a docstring's first line is "a summary line", followed by a blank
line and "a more elaborate description". Docstrings of modules, classes and
functions are thus small articles with their own summary, and they ship in
every Python package: a summarisation source on any host
(`experiments.data.tasks`, source ``pypi``).

An article here is the prose that opens a docstring: its paragraphs (read
as reST by `readme_text.readme_sections`, so doctests, literal blocks,
lists and field lists are dropped) up to the first section of the Google or
NumPy conventions (``Args:``, ``Returns:``, ``Parameters`` over dashes,
...), which document the signature rather than say what the object does.

Files come from each distribution's RECORD (``.py`` files, not under a
``test``, ``tests``, ``testing``, ``_vendor`` or ``vendor`` folder), sorted,
at most `max_files` per distribution so that one large package (a deep
learning framework) neither dominates the corpus nor the build time. The
standard library is not read: it is the ``code_python`` corpus, and its
docstrings would leak the summaries into a code model's training data.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from typing import Any, Iterable, Iterator

from absl import logging

from experiments.data import pypi
from experiments.data import readme_text

__all__ = [
    "SKIPPED_DIRS",
    "DocstringArticle",
    "docstring_paragraphs",
    "file_docstrings",
    "installed_docstrings",
]

SKIPPED_DIRS = frozenset({"test", "tests", "testing", "_vendor", "vendor",
                          "__pycache__"})
# A section of the Google (``Args:``) or NumPy (``Parameters`` + dashes)
# docstring conventions, on a line of its own.
_SECTION_RE = re.compile(
    r"^[ \t]*(?:Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|"
    r"Examples?|Notes?|Attributes|See Also|Warnings?|References|Todo|Usage|"
    r"Keyword Arg(?:ument)?s|Other Parameters|Methods|Properties)"
    r"[ \t]*:?[ \t]*$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class DocstringArticle:
  """The opening prose of one docstring.

  Attributes:
    distribution: the distribution's name.
    name: ``<module path>:<qualified name>`` (``<module path>`` alone for a
      module docstring).
    paragraphs: the prose paragraphs; the first is the summary line.
  """
  distribution: str
  name: str
  paragraphs: tuple[str, ...]


def docstring_paragraphs(docstring: str) -> list[str]:
  """The prose paragraphs of a (cleaned, `inspect.cleandoc`) docstring
  before its first convention section or heading (see the module
  docstring)."""
  m = _SECTION_RE.search(docstring)
  if m:
    docstring = docstring[:m.start()]
  sections = readme_text.readme_sections(docstring, "text/x-rst")
  if not sections or sections[0][0]:
    return []  # a docstring that starts with a heading has no summary line
  return list(sections[0][1])


def file_docstrings(source: str) -> Iterator[tuple[str, str]]:
  """(qualified name, docstring) of the module, classes and functions of one
  Python source, in source order; "" names the module. A source that does
  not parse gives nothing."""
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError):
    return

  def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, str]]:
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.ClassDef, ast.FunctionDef,
                            ast.AsyncFunctionDef)):
        name = f"{prefix}{child.name}"
        doc = ast.get_docstring(child)
        if doc:
          yield name, doc
        yield from visit(child, name + ".")

  doc = ast.get_docstring(tree)
  if doc:
    yield "", doc
  yield from visit(tree, "")


def installed_docstrings(dists: Iterable[Any] | None = None,
                         max_files: int = 200) -> Iterator[DocstringArticle]:
  """The docstring articles of the installed distributions (`pypi`'s).

  Args:
    dists: the distributions (default: the installed ones,
      `pypi.distributions`).
    max_files: at most this many ``.py`` files per distribution (the first
      in path order).

  Yields:
    Articles with at least one paragraph, by distribution, file and source
    order.
  """
  if not isinstance(max_files, int) or max_files < 1:
    raise ValueError(f"max_files must be a positive int, got {max_files!r}")
  for dist in pypi.distributions(dists):
    files = sorted(
        (f for f in dist.files or ()
         if f.suffix == ".py" and not SKIPPED_DIRS.intersection(f.parts[:-1])),
        key=str)[:max_files]
    name = dist.metadata["Name"]
    for f in files:
      try:
        source = dist.locate_file(f).read_text(encoding="utf-8",
                                               errors="replace")
      except OSError as e:
        logging.info("%s: cannot read %s (%s)", name, f, e)
        continue
      module = str(f)[:-3].replace("/", ".")
      for qualname, doc in file_docstrings(source):
        paragraphs = docstring_paragraphs(doc)
        if paragraphs:
          yield DocstringArticle(
              name, f"{module}:{qualname}" if qualname else module,
              tuple(paragraphs))
