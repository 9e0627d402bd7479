"""Test set-up: 8 CPU devices for sharding tests, float32, no GPU probing.

Compiled programs are freed after every test module (`jax.clear_caches()`):
each live XLA:CPU executable holds ~16 memory mappings (its JIT-compiled
kernels), JAX keeps every executable it compiled, and a worker that ran a few
thousand programs segfaulted inside an XLA compile (twice: once in a
persistent-cache write, once in `backend_compile_and_load`), as a process
nearing the kernel's 65530-mapping limit does (one module alone left a
worker with up to 21.5k mappings; freed, ~1.4k). No persistent compilation
cache either: it saved ~5% of the time.
"""
import gc
import os
import sys

# Compile fast, run slower: the suite's programs are tiny, so XLA:CPU's compile
# time is most of its time, and LLVM at -O3 unrolls every small fixed loop of
# a small-batch program. A 64-row speculative loop (test_suffix's chi-square
# decoder) compiled in 41 s by default, 13 s with these flags; at 50k rows
# compile + one run took 21.6 s either way (the run ~3x slower, the compile ~4x
# faster). The whole suite on one 2-core machine: 49 min -> 26 min. Codegen
# only (the HLO is the same; float results may differ from -O3's in the last
# bits, which no test depends on: the suite passes under both). A caller's own
# XLA_FLAGS are kept and win over these.
_TEST_XLA_FLAGS = ("--xla_force_host_platform_device_count=8",
                   "--xla_backend_optimization_level=0",
                   "--xla_cpu_use_fusion_emitters=false")
_flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join(
    [_flags] * bool(_flags)
    + [f for f in _TEST_XLA_FLAGS if f.split("=")[0] not in _flags])
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# libtpu (the `[tpu]` extra, for the compile-only tests) takes a lockfile per process
# unless told not to; compiling for a topology opens no TPU, so workers may share it.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
  """After each module: drop JAX's caches (compiled executables, traces) so
  a long-lived worker's memory mappings stay bounded (see the docstring)."""
  yield
  if "jax" in sys.modules:
    sys.modules["jax"].clear_caches()
    gc.collect()


@pytest.fixture(autouse=True)
def _isolated_tuning_cache(tmp_path_factory, monkeypatch):
  """Tuned decode paths (`specjax.models.matvec_cache`) go to a fresh folder
  per test, never to the user's ~/.cache: a choice tuned by one test must not
  change how another computes (subprocesses inherit the variable)."""
  monkeypatch.setenv("SPECJAX_CACHE_DIR", str(tmp_path_factory.mktemp("specjax-cache")))


# The heaviest modules first (idle worker-seconds, measured): with whole
# modules per worker, a heavy module handed out last would leave the other
# worker idle at the end. The rest keep their collection order.
_HEAVY_FIRST = ("test_install_resolves", "test_bench_drafters", "test_leviathan", "test_benchmarks", "test_drafters",
                "test_bench_scripts", "test_chen", "test_eagle", "test_paper_presets",
                "test_long_context", "test_trees", "test_suffix", "test_generation",
                "test_shakespeare", "test_notebooks", "test_properties", "test_adaptive",
                "test_medusa", "test_block", "test_soak", "test_cache_layout", "test_aot",
                "test_sharding")


def pytest_collection_modifyitems(items):
  def rank(item):
    name = os.path.splitext(os.path.basename(str(item.fspath)))[0]
    return _HEAVY_FIRST.index(name) if name in _HEAVY_FIRST else len(_HEAVY_FIRST)
  items.sort(key=rank)  # stable: tests keep their order within a module
