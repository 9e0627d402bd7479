"""Keep libtpu quiet on machines without a TPU (README "Installing").

With libtpu installed (the `[tpu]` extra, for compiling TPU programs with no TPU attached),
JAX's first backend initialisation also tries to open a TPU: on a CPU or GPU machine that prints
libtpu's start-up errors (`TPU_WORKER_HOSTNAMES ... INVALID_ARGUMENT`, "No jellyfish device
found") and takes libtpu's process lockfile, so a second process that compiles for a TPU topology
at the same time fails ("Internal error when accessing libtpu multi-process lockfile").

`quiet_tpu_if_absent`, run when `specjax` is imported, does two things before any backend exists:

* where no TPU chip is on the PCI bus, libtpu is installed, no other accelerator plugin is
  (CUDA / ROCm) and the user chose no platforms (`JAX_PLATFORMS` unset), it sets JAX's
  `jax_platforms` to `"cpu"`: the TPU backend is never initialised. Compiling for TPU topologies
  (`jax.experimental.topologies`, `specjax.aot`) loads libtpu on its own and keeps working;
* it sets `ALLOW_MULTIPLE_LIBTPU_LOAD=1` (unless set), so several processes can compile for TPU
  topologies at once, and (where no TPU is) the worker hostname / host bounds libtpu would ask a
  TPU VM's metadata server for, so loading it for a topology prints no start-up errors.

`SPECJAX_KEEP_PLATFORMS=1` turns the first part off. Programs that use
`jax.experimental.topologies` without importing specjax set both themselves.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os

# Google's PCI vendor id: every Cloud TPU chip (v2 to v7) appears under it.
_GOOGLE_PCI_VENDOR = "0x1ae0"
_ACCELERATOR_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin",
                        "jax_rocm7_plugin")


def tpu_chips_present(sys_root: str = "/") -> bool:
  """Whether a TPU chip (a Google PCI device, or a TPU device node) is on this machine."""
  for vendor in glob.glob(os.path.join(sys_root, "sys/bus/pci/devices/*/vendor")):
    try:
      with open(vendor, encoding="ascii") as f:
        if f.read().strip().lower() == _GOOGLE_PCI_VENDOR:
          return True
    except OSError:
      continue
  return bool(glob.glob(os.path.join(sys_root, "dev/accel[0-9]*")))


def _libtpu_installed() -> bool:
  return importlib.util.find_spec("libtpu") is not None


def _other_accelerator_plugin() -> bool:
  if any(importlib.util.find_spec(name) is not None for name in _ACCELERATOR_PLUGINS):
    return True
  try:
    plugins = importlib.metadata.entry_points(group="jax_plugins")
  except Exception:  # pragma: no cover - metadata of a broken environment
    return True
  return any("tpu" not in ep.name.lower() for ep in plugins)


def quiet_tpu_if_absent(environ=None, sys_root: str = "/") -> bool:
  """Keeps JAX off libtpu's runtime where there is no TPU. Returns True where it set "cpu".

  Called once at `import specjax` (before any backend is initialised); safe to call again.
  """
  environ = os.environ if environ is None else environ
  environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  if not _libtpu_installed() or tpu_chips_present(sys_root):
    return False
  # Compile-only use of libtpu: no TPU VM metadata to read. Without these, loading libtpu for
  # a topology prints "could not determine TPU worker hostnames / accelerator type" errors;
  # the compiled programs are the same (the topology is given explicitly).
  environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  environ.setdefault("TPU_HOST_BOUNDS", "1,1,1")
  if environ.get("JAX_PLATFORMS") or environ.get("SPECJAX_KEEP_PLATFORMS") == "1":
    return False
  if _other_accelerator_plugin():
    return False
  import jax  # pylint: disable=g-import-not-at-top
  if jax.config.jax_platforms:   # chosen in code before specjax was imported
    return False
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  if xla_bridge.backends_are_initialized():
    return False
  jax.config.update("jax_platforms", "cpu")
  return True
