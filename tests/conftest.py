"""Test set-up: 8 CPU devices for sharding tests, float32, no GPU probing, and
one persistent XLA compilation cache per test session.

The cache (a fresh temporary folder, removed at the end) is shared by the
xdist workers and every subprocess the tests start (launchers, benchmark
smokes, notebooks): many tests compile the same tiny models' programs, and a
second compilation of an identical program becomes a file read. Its entries
are written and read under JAX's file lock (a size cap turns the lock on), so
one worker never reads another's half-written entry. The experiments' own
caches (`<workdir>/jax_cache`) are unaffected: they set the folder
themselves. `SPECJAX_TEST_XLA_CACHE=0` turns it off.
"""
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

_CACHE_ENV = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.05",
              "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
              "JAX_COMPILATION_CACHE_MAX_SIZE": str(8 << 30)}


def pytest_configure(config):
  # The controller (or a run without xdist) makes the folder before any worker
  # or test imports jax; the workers inherit the variables.
  if hasattr(config, "workerinput") or os.environ.get("SPECJAX_TEST_XLA_CACHE") == "0":
    return
  if "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return
  folder = tempfile.mkdtemp(prefix="specjax-tests-xla-")
  config._specjax_xla_cache = folder  # pylint: disable=protected-access
  os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
  for name, value in _CACHE_ENV.items():
    os.environ.setdefault(name, value)


def pytest_unconfigure(config):
  folder = getattr(config, "_specjax_xla_cache", None)
  if folder:
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _isolated_tuning_cache(tmp_path_factory, monkeypatch):
  """Tuned decode paths (`specjax.models.matvec_cache`) go to a fresh folder
  per test, never to the user's ~/.cache: a choice tuned by one test must not
  change how another computes (subprocesses inherit the variable)."""
  monkeypatch.setenv("SPECJAX_CACHE_DIR", str(tmp_path_factory.mktemp("specjax-cache")))
