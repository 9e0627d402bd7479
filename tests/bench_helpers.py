"""Running the benchmark scripts as a user does (`python benchmarks/x.py ...`)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(args, timeout=900):
  """Runs `python <args>` from the repository root on the real CPU device
  (no fake devices); asserts it succeeds and returns the finished process."""
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # No 8 fake devices for the scripts.
  res = subprocess.run([sys.executable] + args, cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=timeout)
  assert res.returncode == 0, res.stderr[-3000:]
  return res
