"""Runs a worker script in two local CPU processes (jax.distributed over gloo)."""

import json
import os
import socket
import subprocess
import sys

from bench_helpers import one_device_xla_flags


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_two_processes(script_text: str, tmp_path, *args: str, timeout: float = 180) -> list:
  """Starts `script_text` as `worker.py <process id> <port> <args...>` in two
  processes of 4 CPU devices each, waits, asserts both exited 0 and returns
  the JSON each printed on its last `RESULT ` line (process 0 first)."""
  script = tmp_path / "worker.py"
  script.write_text(script_text)
  # The workers import specjax from this checkout whatever the install (a worker
  # once failed with "No module named 'specjax'" mid-suite on an editable install).
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  # 4 devices each, and conftest.py's codegen flags (compile fast).
  xla_flags = f"--xla_force_host_platform_device_count=4 {one_device_xla_flags()}".strip()
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags,
             PYTHONPATH=os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p))
  port = str(free_port())
  procs = [subprocess.Popen([sys.executable, str(script), str(i), port, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=timeout)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  results = []
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1]
    results.append(json.loads(line[len("RESULT "):]))
  return results
