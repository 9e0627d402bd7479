"""libtpu stays quiet where there is no TPU (specjax._platform)."""

import importlib.util
import os
import subprocess
import sys

import pytest

from specjax import _platform

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# An absl program, as the launchers are (absl's logging is what shows libtpu's start-up
# messages): the default backend's devices, then a program compiled for a TPU slice.
_PROGRAM = r"""
from absl import app

def main(_):
  import specjax, jax, jax.numpy as jnp
  from specjax.aot.chips import topology_devices
  print("devices", sorted({d.platform for d in jax.devices()}))
  tpu = topology_devices("v5e:2x2")
  spec = jax.ShapeDtypeStruct((8, 128), jnp.float32,
                              sharding=jax.sharding.SingleDeviceSharding(tpu[0]))
  jax.jit(lambda a: a * 2).lower(spec).compile()
  print("compiled", len(tpu))

app.run(main)
"""
_NOISE = ("TPU_WORKER_HOSTNAMES", "jellyfish", "Unable to initialize backend 'tpu'",
          "lockfile", "could not determine TPU")


def _env(**extra):
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_PLATFORMS", "ALLOW_MULTIPLE_LIBTPU_LOAD") and not k.startswith("TPU_")}
  env.update(extra)
  return env


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None or _platform.tpu_chips_present(),
                    reason="needs libtpu (the [tpu] extra) on a machine without a TPU")
def test_no_libtpu_noise_on_a_cpu_machine_and_two_processes_compile_at_once():
  procs = [subprocess.Popen([sys.executable, "-c", _PROGRAM], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(2)]
  # Negative control: the platform choice turned off, the TPU backend is tried (and fails).
  control = subprocess.Popen([sys.executable, "-c", _PROGRAM], cwd=ROOT,
                             env=_env(SPECJAX_KEEP_PLATFORMS="1"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  for p in procs:
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert "devices ['cpu']" in out and "compiled 4" in out, out
    assert not [n for n in _NOISE if n in err], err
  out, err = control.communicate(timeout=300)
  assert control.returncode == 0, err
  assert "Unable to initialize backend 'tpu'" in err, err


def _sys_root(tmp_path, vendor=None, accel=False):
  if vendor is not None:
    d = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:00:04.0"
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
  if accel:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "accel0").write_text("")
  return str(tmp_path)


@pytest.mark.parametrize("vendor,accel,present", [
    (None, False, False), ("0x8086", False, False), ("0x1ae0", False, True),
    ("0x10de", True, True)])
def test_tpu_chips_present_reads_the_pci_bus_and_device_nodes(tmp_path, vendor, accel, present):
  assert _platform.tpu_chips_present(_sys_root(tmp_path, vendor, accel)) is present


def test_a_chosen_platform_or_a_tpu_is_left_alone(tmp_path):
  env = {"JAX_PLATFORMS": "cpu"}
  assert not _platform.quiet_tpu_if_absent(env, sys_root=str(tmp_path))
  assert env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
  env = {}
  assert not _platform.quiet_tpu_if_absent(env, sys_root=_sys_root(tmp_path, "0x1ae0"))
  assert "TPU_WORKER_HOSTNAMES" not in env   # a real TPU VM reads its metadata itself
