"""What produced a result: the machine, the library versions, the code's commit, the command.

Every result file (the experiments' `results.json` and markdown header, the benchmarks' JSON
`meta`) carries `provenance()`:

  machine           "x86_64 16 cores (AMD EPYC 9B14)" (`platform.machine()`, `os.cpu_count()`,
                    `cpu_model()` where the system names it)
  cpu               `cpu_model()`: /proc/cpuinfo's model name (Linux), sysctl's brand string
                    (macOS), else `platform.processor()`; None when nothing names it
  specjax, jax, ... installed versions of `PACKAGES` (`importlib.metadata`); None if absent
  git_commit        `git rev-parse HEAD` in specjax's source directory (`git_state`)
  git_dirty         tracked files modified; None when the commit is None
  command           `shlex.join(sys.argv)`;  utc: when, "2025-01-31T12:00:00Z"

It never raises: whatever it cannot find is None. `provenance_line` / `provenance_sentence`
are the short forms for a markdown header.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from typing import Dict, Optional, Tuple

__all__ = ["provenance", "provenance_line", "provenance_sentence", "git_state",
           "package_versions", "cpu_model", "PACKAGES"]

# result key -> the distributions that provide it (the first one installed wins).
PACKAGES: Dict[str, Tuple[str, ...]] = {
    "specjax": ("specjax",), "jax": ("jax",), "jaxlib": ("jaxlib",), "flax": ("flax",),
    "orbax_checkpoint": ("orbax-checkpoint",), "optax": ("optax",), "numpy": ("numpy",),
    "libtpu": ("libtpu", "libtpu-nightly"),
}

_SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # specjax/
_GIT_TIMEOUT_S = 10


def package_versions() -> Dict[str, Optional[str]]:
  """{key: version or None} for `PACKAGES`."""
  out: Dict[str, Optional[str]] = {}
  for key, dists in PACKAGES.items():
    out[key] = None
    for dist in dists:
      try:
        out[key] = importlib.metadata.version(dist)
        break
      except Exception:  # PackageNotFoundError, or broken metadata: not installed as far as we know
        continue
  return out


def cpu_model() -> Optional[str]:
  """The CPU's model name, or None where the system does not say."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith(("model name", "Model")):
          return line.split(":", 1)[1].strip() or None
  except OSError:
    pass
  if sys.platform == "darwin":
    try:
      out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                           text=True, timeout=_GIT_TIMEOUT_S, stdin=subprocess.DEVNULL)
      if out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip()
    except Exception:  # no sysctl, or it hangs
      pass
  return platform.processor() or None


def _git(args, cwd: str) -> Optional[str]:
  """stdout of `git <args>` in cwd, or None if git is missing, fails or hangs."""
  try:
    p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                       timeout=_GIT_TIMEOUT_S, stdin=subprocess.DEVNULL)
  except Exception:  # FileNotFoundError (no git), NotADirectoryError, TimeoutExpired, ...
    return None
  return p.stdout if p.returncode == 0 else None


def git_state(source_dir: Optional[str] = None) -> Tuple[Optional[str], Optional[bool]]:
  """(commit, dirty) of the checkout holding `source_dir` (default: specjax's own directory).

  (None, None) outside a git checkout, when its files are not tracked there (an installed copy
  inside another repository), or without git. dirty counts tracked files only."""
  cwd = source_dir or _SOURCE_DIR
  commit = _git(["rev-parse", "--verify", "HEAD"], cwd)
  if not commit or not commit.strip():
    return None, None
  if not (_git(["ls-files", "--", "."], cwd) or "").strip():
    return None, None
  status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
  return commit.strip(), (None if status is None else bool(status.strip()))


def provenance(source_dir: Optional[str] = None) -> dict:
  """The run's provenance (module docstring); `source_dir` overrides where git looks."""
  commit, dirty = git_state(source_dir)
  cpu = cpu_model()
  return {
      "machine": f"{platform.machine()} {os.cpu_count()} cores" + (f" ({cpu})" if cpu else ""),
      "cpu": cpu,
      **package_versions(),
      "git_commit": commit, "git_dirty": dirty,
      "command": shlex.join(sys.argv),
      "utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
  }


def provenance_line(meta: dict) -> str:
  """"code 0123abcd4567 (dirty) · jaxlib 0.4.30 · flax 0.8.5 · ... · 2025-01-31T12:00:00Z UTC"
  from a dict holding `provenance()`'s keys; "" for results written before they existed."""
  if not isinstance(meta, dict) or "git_commit" not in meta:
    return ""
  commit = meta.get("git_commit")
  parts = ["code " + (f"{commit[:12]}{' (dirty)' if meta.get('git_dirty') else ''}"
                      if commit else "unknown commit")]
  parts += [f"{k.replace('_', '-')} {meta[k]}" for k in PACKAGES
            if k != "jax" and meta.get(k)]
  if meta.get("utc"):
    parts.append(f"{meta['utc']} UTC")
  return " · ".join(parts)


def provenance_sentence(meta: dict) -> str:
  """" Provenance: <provenance_line>." to append to a markdown header line, or ""."""
  line = provenance_line(meta)
  return f" Provenance: {line}." if line else ""
