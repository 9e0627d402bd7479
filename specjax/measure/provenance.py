"""What produced a result: the code's commit, the machine, the library versions, the command.

Every results JSON (the experiments' `results.json`, the benchmarks' JSON, the TPU AOT
reports) carries one record, `provenance()`, under its top-level "provenance" key:

  recorded          True: measured by the run itself (`backfill_provenance` writes False for
                    files that predate the record: see `experiments/tools/backfill_provenance.py`)
  commit, dirty     `git rev-parse HEAD` of specjax's checkout and whether tracked files were
                    modified (`git_state`); both None outside a checkout (an installed copy)
  specjax_version   the installed distribution's version, else `specjax.__version__`
  cpu_model         `cpu_model()`: /proc/cpuinfo's model name (Linux), sysctl's brand string
                    (macOS), else `platform.processor()`; None when nothing names it
  cores             `os.cpu_count()`
  machine           "x86_64 16 cores (AMD EPYC 9B14)" (`machine_line()`)
  python, jax, ...  the interpreter's and `PACKAGES`' versions (`importlib.metadata`); None
                    if absent
  command           `shlex.join(sys.argv)`;  utc: when, "2025-01-31T12:00:00Z"

It never raises: whatever it cannot find is None. `record_problems(result)` says what a loaded
results JSON lacks (the check the results tests run); `provenance_line` / `provenance_sentence`
are the short forms for a markdown header.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import re
import shlex
import subprocess
import sys
from typing import Dict, Optional, Tuple

__all__ = ["provenance", "provenance_line", "provenance_sentence", "git_state",
           "package_versions", "cpu_model", "machine_line", "specjax_version",
           "record_problems", "PACKAGES", "REQUIRED"]

# result key -> the distributions that provide it (the first one installed wins).
PACKAGES: Dict[str, Tuple[str, ...]] = {
    "specjax": ("specjax",), "jax": ("jax",), "jaxlib": ("jaxlib",), "flax": ("flax",),
    "orbax_checkpoint": ("orbax-checkpoint",), "optax": ("optax",), "numpy": ("numpy",),
    "libtpu": ("libtpu", "libtpu-nightly"),
}

# What every record names; values may be None only where "recorded" is False.
REQUIRED: Tuple[str, ...] = ("commit", "dirty", "specjax_version", "cpu_model", "cores")

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


def specjax_version() -> Optional[str]:
  """The installed distribution's version, else the source tree's (its pyproject.toml's
  `version`; the package root is not imported from here)."""
  version = package_versions().get("specjax")
  if version:
    return version
  pyproject = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))), "pyproject.toml")
  try:
    with open(pyproject, encoding="utf-8") as f:
      found = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
  except OSError:   # a missing file must not stop a result from being written
    return None
  return found.group(1) if found else None


def machine_line(cpu: Optional[str] = None) -> str:
  """"x86_64 16 cores (AMD EPYC 9B14)": the architecture, `os.cpu_count()` and the CPU model
  (`cpu`, default `cpu_model()`) where one is known."""
  cpu = cpu_model() if cpu is None else cpu
  return f"{platform.machine()} {os.cpu_count()} cores" + (f" ({cpu})" if cpu else "")


def provenance(source_dir: Optional[str] = None) -> dict:
  """The run's provenance record (module docstring); `source_dir` overrides where git looks.

  Args:
    source_dir: the directory whose git checkout names the commit; default specjax's own.

  Returns:
    A JSON-serialisable dict with "recorded" True and `REQUIRED`'s keys among others.
  """
  commit, dirty = git_state(source_dir)
  cpu = cpu_model()
  versions = package_versions()
  version = versions.pop("specjax", None) or specjax_version()
  return {
      "recorded": True,
      "commit": commit, "dirty": dirty, "specjax_version": version,
      "cpu_model": cpu, "cores": os.cpu_count(),
      "machine": machine_line(cpu or ""),
      "python": platform.python_version(),
      **versions,
      "command": shlex.join(sys.argv),
      "utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
  }


def record_problems(result) -> list:
  """What a loaded results JSON lacks of a provenance record; [] when it has one.

  Args:
    result: the parsed JSON (any value).

  Returns:
    Sentences, one per problem: no "provenance" dict at the top level, a `REQUIRED` key or
    "recorded" missing, or a None value in a record that says it was recorded at run time.
  """
  if not isinstance(result, dict):
    return ["the file is not a JSON object"]
  rec = result.get("provenance")
  if not isinstance(rec, dict):
    return ["no \"provenance\" dict at the top level"]
  problems = [f"provenance lacks {k!r}" for k in ("recorded", *REQUIRED) if k not in rec]
  if not isinstance(rec.get("recorded"), bool):
    problems.append("provenance's 'recorded' is not true or false")
  elif rec["recorded"]:
    problems += [f"provenance's {k!r} is null though recorded is true" for k in REQUIRED
                 if k in rec and rec[k] is None]
  else:
    if not rec.get("committed_in") or not rec.get("note"):
      problems.append("a reconstructed provenance names no 'committed_in' and 'note'")
  return problems


def _record_of(meta) -> Optional[dict]:
  """The provenance fields of `meta`: a record, a result holding one, or a flat dict of the
  older keys (git_commit, git_dirty, ...); None when it has none."""
  if not isinstance(meta, dict):
    return None
  if isinstance(meta.get("provenance"), dict):
    meta = meta["provenance"]
  if "commit" in meta or "git_commit" in meta:
    return meta
  return None


def provenance_line(meta: dict) -> str:
  """"code 0123abcd4567 (dirty) · specjax 0.1.0 · jaxlib 0.4.30 · ... · 2025-01-31T12:00:00Z
  UTC" from a record, a result holding one (its "provenance" key) or a dict of the older flat
  keys; "" for results that hold none."""
  rec = _record_of(meta)
  if rec is None:
    return ""
  commit = rec.get("commit", rec.get("git_commit"))
  dirty = rec.get("dirty", rec.get("git_dirty"))
  if commit:
    code = f"code {commit[:12]}{' (dirty)' if dirty else ''}"
  elif rec.get("recorded") is False and rec.get("committed_in"):
    code = f"code not recorded (results committed in {rec['committed_in'][:12]})"
  else:
    code = "code unknown commit"
  parts = [code]
  version = rec.get("specjax_version", rec.get("specjax"))
  if version:
    parts.append(f"specjax {version}")
  parts += [f"{k.replace('_', '-')} {rec[k]}" for k in PACKAGES
            if k not in ("jax", "specjax") and rec.get(k)]
  if rec.get("utc"):
    parts.append(f"{rec['utc']} UTC")
  return " · ".join(parts)


def provenance_sentence(meta: dict) -> str:
  """" Provenance: <provenance_line>." to append to a markdown header line, or ""."""
  line = provenance_line(meta)
  return f" Provenance: {line}." if line else ""
