"""Running the benchmark scripts as a user does (`python benchmarks/x.py ...`)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_device_xla_flags():
  """The test run's XLA_FLAGS without its fake device count: a script,
  notebook or worker process gets its own device count and keeps conftest.py's
  codegen flags (compile fast: a smoke run is mostly compilation; the HLO is
  the same, and no test asserts a timing). The drafters smoke run: 111 s -> 38 s."""
  return " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                  if not f.startswith("--xla_force_host_platform_device_count"))


def run_script(args, timeout=900):
  """Runs `python <args>` from the repository root on the real CPU device
  (no fake devices); asserts it succeeds and returns the finished process."""
  # No 8 fake devices; specjax imported from this checkout whatever the install.
  env = dict(os.environ, XLA_FLAGS=one_device_xla_flags(),
             PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
  res = subprocess.run([sys.executable] + args, cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=timeout)
  assert res.returncode == 0, res.stderr[-3000:]
  return res
