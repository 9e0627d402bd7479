"""The README's install commands resolve from the package indexes they name, with this machine's
pip configuration off (no local wheel folder, no caps): Linux for both commands, macOS arm64 for
the main job's (`--platform`, wheels only). pip's resolver runs as a dry run (no install) and
writes its report; this needs PyPI, as CI's own install does."""

import json
import os
import subprocess
import sys

from test_packaging import ROOT, readme_commands


def _pip_env() -> dict:
  env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
  env["PIP_CONFIG_FILE"] = os.devnull   # pip then reads no configuration file at all
  env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
  return env


def _dry_run(install: str, report: str, *extra: str) -> subprocess.Popen:
  words = install.replace('"', "").split()
  assert words[:2] == ["pip", "install"], install
  # An index this machine cannot reach (PyTorch's, where only PyPI is open) is skipped at once.
  cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--retries", "0", "--timeout", "60", "--report", report, *extra, *words[2:]]
  return subprocess.Popen(cmd, cwd=ROOT, env=_pip_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _resolved(proc: subprocess.Popen, report: str) -> dict:
  out, err = proc.communicate(timeout=900)
  assert proc.returncode == 0, err[-3000:]
  with open(report, encoding="utf-8") as f:
    return {item["metadata"]["name"].lower().replace("_", "-"): item
            for item in json.load(f)["install"]}


def test_the_readme_commands_resolve_on_linux_and_the_main_job_on_macos(tmp_path):
  (main_install, _), (test_install, _) = readme_commands()
  # The main job's install, without `-e` for the wheel-only macOS resolution (pip builds the
  # local project's metadata either way).
  mac = main_install.replace(" -e ", " ")
  reports = {k: str(tmp_path / f"{k}.json") for k in ("main", "tests", "mac")}
  procs = {
      "main": _dry_run(main_install, reports["main"]),
      "tests": _dry_run(test_install, reports["tests"]),
      "mac": _dry_run(mac, reports["mac"], "--target", str(tmp_path / "mac"), "--platform",
                      "macosx_14_0_arm64", "--python-version", "3.11", "--implementation", "cp",
                      "--only-binary=:all:"),
  }
  got = {k: _resolved(p, reports[k]) for k, p in procs.items()}
  for k in ("main", "mac"):
    assert {"specjax", "jax", "jaxlib", "flax", "matplotlib", "tqdm"} <= set(got[k]), k
    assert "torch" not in got[k] and "libtpu" not in got[k], k
  wheel = got["mac"]["jaxlib"]["download_info"]["url"].rsplit("/", 1)[-1]
  assert "macosx" in wheel and "arm64" in wheel, wheel
  assert {"torch", "transformers", "pytest", "libtpu", "rouge-score"} <= set(got["tests"])
