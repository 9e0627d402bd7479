"""Gives every results JSON that predates the provenance record a "provenance" dict, honestly.

  python experiments/tools/backfill_provenance.py            # rewrite the files that lack one
  python experiments/tools/backfill_provenance.py --check    # list them; exit 1 if any

Results written since `specjax.measure.provenance.provenance()` became the one record carry it
under the top-level "provenance" key. Older files recorded part of it (a flat `machine` / `meta`
dict of git_commit, git_dirty, jax, ...; a "provenance" dict of those keys; a "Provenance: code
..." sentence) or nothing. For each of those this script writes

  recorded          False: the run did not record the whole record
  recorded_fields   which of commit, dirty, specjax_version, cpu_model, cores it did record
  commit, dirty, specjax_version, cpu_model, cores
                    the recorded value where the run kept one (parsed from the older keys, the
                    "x86_64 2 cores (CPU)" machine string, the provenance sentence), else None
  machine, python, jax, ..., command, utc
                    the other fields the run recorded, copied
  committed_in      the commit that last changed the file before this backfill (`git log`)
  committed_utc     that commit's date
  note              "reconstructed from git history; the run did not record it"

A file whose "provenance" already passes `record_problems` is left alone, so a second run
changes nothing. Everything else in a file stays as it was: it is loaded with its key order,
the key is added (or replaces an older "provenance" value, which moves into the record as
`legacy`) and the file is dumped with its own indentation, key sorting and ASCII escaping.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

from specjax.measure.provenance import PACKAGES, REQUIRED, record_problems

# The repository root (the default --root: the checkout this file is in).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

__all__ = ["result_files", "legacy_fields", "reconstruct", "dump_like", "backfill_file", "main"]

NOTE = "reconstructed from git history; the run did not record it"
# The fields of the older flat dicts worth keeping in the record, besides REQUIRED's.
_COPIED = ("machine", "python", *[k for k in PACKAGES if k != "specjax"], "command", "utc",
           "date")
_MACHINE = re.compile(r"^(?P<arch>\S+) (?P<cores>\d+) cores(?: \((?P<cpu>.+)\))?$")
_SENTENCE_CODE = re.compile(r"code (?P<commit>[0-9a-f]{7,40})(?P<dirty> \(dirty\))?")


def result_files(root: str = _ROOT) -> List[str]:
  """Every JSON under results/ and benchmarks/results/ of `root`, sorted, relative to it."""
  found = glob.glob(os.path.join(root, "results", "**", "*.json"), recursive=True)
  found += glob.glob(os.path.join(root, "benchmarks", "results", "**", "*.json"), recursive=True)
  return sorted(os.path.relpath(p, root) for p in found)


def _git(root: str, *args: str) -> Optional[str]:
  """stdout of `git <args>` in `root` (stripped), or None when it fails."""
  try:
    p = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL)
  except Exception:  # no git, or it hangs
    return None
  return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else None


def _legacy_sources(result: dict) -> List[dict]:
  """The older dicts that may hold provenance fields, most specific first."""
  out = []
  for key in ("provenance", "provenance_fields", "machine", "meta"):
    if isinstance(result.get(key), dict):
      out.append(result[key])
  if "git_commit" in result or isinstance(result.get("machine"), str):
    out.append(result)  # a benchmark that spread the fields at its top level
  return out


def _parse_sentence(text: str) -> Dict[str, Any]:
  """commit / dirty / versions / utc of a " Provenance: code 0123abcd4567 (dirty) · jaxlib
  0.4.30 · ... · 2025-01-31T12:00:00Z UTC." sentence; {} when it is not one."""
  out: Dict[str, Any] = {}
  m = _SENTENCE_CODE.search(text)
  if not m:
    return out
  out["commit"], out["dirty"] = m.group("commit"), bool(m.group("dirty"))
  for part in text.strip().rstrip(".").split(" · ")[1:]:
    name, _, value = part.strip().partition(" ")
    if value == "UTC":
      out["utc"] = name
    elif name.replace("-", "_") in PACKAGES and value:
      out["specjax_version" if name == "specjax" else name.replace("-", "_")] = value
  return out


def legacy_fields(result: dict) -> Dict[str, Any]:
  """The provenance fields `result` recorded at run time, under the record's names."""
  out: Dict[str, Any] = {}
  sentences = [v for k in ("provenance", "provenance_line")
               for v in [result.get(k)] if isinstance(v, str)]
  for src in _legacy_sources(result):
    pairs = {"commit": src.get("commit", src.get("git_commit")),
             "dirty": src.get("dirty", src.get("git_dirty")),
             "specjax_version": src.get("specjax_version", src.get("specjax")),
             "cpu_model": src.get("cpu_model", src.get("cpu")),
             "cores": src.get("cores")}
    pairs.update({k: src.get(k) for k in _COPIED})
    machine = src.get("machine")
    m = _MACHINE.match(machine) if isinstance(machine, str) else None
    if m:
      pairs["cores"] = pairs["cores"] or int(m.group("cores"))
      pairs["cpu_model"] = pairs["cpu_model"] or m.group("cpu")
    for k, v in pairs.items():
      if v is not None and out.get(k) is None:
        out[k] = v
  for text in sentences:
    for k, v in _parse_sentence(text).items():
      out.setdefault(k, v)
  return out


def reconstruct(result: dict, path: str, root: str = _ROOT) -> dict:
  """The "provenance" record for `result` (the parsed file at `path`, relative to `root`):
  what it recorded, None for the rest, the commit that last changed it and the note."""
  fields = legacy_fields(result)
  commit = fields.get("commit")
  if commit and len(commit) < 40:  # a sentence's 12-digit prefix: the full sha where unique
    commit = _git(root, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}") or commit
    fields["commit"] = commit
  rec: Dict[str, Any] = {"recorded": False,
                         "recorded_fields": [k for k in REQUIRED if fields.get(k) is not None]}
  rec.update({k: fields.get(k) for k in REQUIRED})
  rec.update({k: fields[k] for k in _COPIED if fields.get(k) is not None})
  last = _git(root, "log", "-1", "--format=%H %cI", "--", path)
  sha, _, when = (last or "").partition(" ")
  rec["committed_in"] = sha or None
  rec["committed_utc"] = when or None
  rec["note"] = NOTE
  old = result.get("provenance")
  if old is not None and not isinstance(old, dict):
    rec["legacy"] = old  # the sentence the run wrote in place of a record
  return rec


def _format_of(text: str) -> Tuple[Optional[int], bool]:
  """(indent, ensure_ascii) the text was dumped with, as far as it shows."""
  m = re.search(r"\n( +)\S", text)
  indent = len(m.group(1)) if m else None
  return indent, all(ord(c) < 128 for c in text)


def dump_like(original_text: str, original: Any, updated: Any) -> str:
  """`updated` dumped the way `original_text` (which parses to `original`) was: the indent, key
  sorting, ASCII escaping and trailing newline that reproduce it, when some do."""
  indent, ascii_only = _format_of(original_text)
  newline = "\n" if original_text.endswith("\n") else ""
  for sort_keys in (True, False):  # sorted first: what atomic_write_json writes
    for ensure_ascii in ((True, False) if ascii_only else (False, True)):
      if json.dumps(original, indent=indent, sort_keys=sort_keys,
                    ensure_ascii=ensure_ascii) + newline == original_text:
        return json.dumps(updated, indent=indent, sort_keys=sort_keys,
                          ensure_ascii=ensure_ascii) + newline
  return json.dumps(updated, indent=indent, ensure_ascii=ascii_only) + newline


def backfill_file(path: str, root: str = _ROOT, write: bool = True) -> Optional[dict]:
  """Adds a reconstructed record to the JSON at `path` (relative to `root`) when it lacks a
  valid one; returns the record written (None: the file already had one)."""
  full = os.path.join(root, path)
  with open(full, encoding="utf-8") as f:
    text = f.read()
  result = json.loads(text)
  if not isinstance(result, dict) or not record_problems(result):
    return None
  rec = reconstruct(result, path, root)
  if "provenance" in result:
    updated = {k: (rec if k == "provenance" else v) for k, v in result.items()}
  else:
    updated = {**result, "provenance": rec}
  if write:
    with open(full, "w", encoding="utf-8") as f:
      f.write(dump_like(text, result, updated))
  return rec


def main(argv=None) -> int:
  """Command line: rewrite (default) or `--check` the results JSONs."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="list the files lacking a record")
  parser.add_argument("--root", default=_ROOT, help="the repository root")
  args = parser.parse_args(argv)
  todo = 0
  for path in result_files(args.root):
    rec = backfill_file(path, args.root, write=not args.check)
    if rec is not None:
      todo += 1
      print(f"{'lacks' if args.check else 'backfilled'} {path}: recorded "
            f"{', '.join(rec['recorded_fields']) or 'none'}; committed in "
            f"{(rec['committed_in'] or '?')[:12]}")
  return 1 if args.check and todo else 0


if __name__ == "__main__":
  sys.exit(main())
