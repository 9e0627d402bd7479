"""Test set-up: 8 CPU devices for sharding tests, float32, no GPU probing.

No persistent XLA compilation cache here: writing serialized CPU executables
from two workers at once crashed a CI worker (a segfault inside
`compilation_cache.put_executable_and_time`), and it saved ~5% of the time.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated_tuning_cache(tmp_path_factory, monkeypatch):
  """Tuned decode paths (`specjax.models.matvec_cache`) go to a fresh folder
  per test, never to the user's ~/.cache: a choice tuned by one test must not
  change how another computes (subprocesses inherit the variable)."""
  monkeypatch.setenv("SPECJAX_CACHE_DIR", str(tmp_path_factory.mktemp("specjax-cache")))
