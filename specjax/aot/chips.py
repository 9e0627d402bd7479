"""TPU chips and topologies for compile-only runs: published figures, no TPU needed.

`CHIPS` holds each TPU generation's published per-chip figures, with the page they come from.
`topology_devices` returns the devices of a named slice (`"v5e:2x4"`, `"v4:2x2x1"`, ...: chips per
axis; one device per chip) from the TPU compiler (`libtpu`): programs lowered with shardings over
them compile for that TPU on a machine that has none.

`specjax.aot`'s predicted times come from these figures and our own accounting of the compiled
program, not from `cost_analysis()` (its `optimal_seconds` can be negative, and its `bytes
accessed` counts cross-program prefetches).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Dict, List, Sequence

import jax

__all__ = ["Chip", "CHIPS", "chip", "chip_of_device", "topology_devices", "parse_topology",
           "num_hosts"]


@dataclasses.dataclass(frozen=True)
class Chip:
  """Published per-chip figures of one TPU generation.

  Attributes:
    name: the generation as slices name it ("v4", "v5e", "v5p", "v6e").
    device_kind: what `jax.Device.device_kind` says for it.
    hbm_bytes: HBM capacity per chip.
    hbm_bytes_per_s: HBM bandwidth per chip.
    bf16_flops_per_s: peak dense bf16 FLOP/s per chip.
    ici_bytes_per_s: inter-chip interconnect bandwidth per chip, one direction (half the
      published bidirectional figure).
    source: where the figures are published.
  """

  name: str
  device_kind: str
  hbm_bytes: int
  hbm_bytes_per_s: float
  bf16_flops_per_s: float
  ici_bytes_per_s: float
  source: str


_GIB, _GB = 1 << 30, 10**9

# Figures from Google Cloud's TPU system-architecture pages (fetched 2026-12).
CHIPS: Dict[str, Chip] = {
    # v4 ICI: 6 links of 50 GB/s per direction (Jouppi et al., "TPU v4", ISCA 2023).
    "v4": Chip("v4", "TPU v4", 32 * _GIB, 1200e9, 275e12, 300e9,
               "https://cloud.google.com/tpu/docs/v4"),
    "v5e": Chip("v5e", "TPU v5 lite", 16 * _GB, 819e9, 197e12, 200e9,
                "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("v5p", "TPU v5", 95 * _GB, 2765e9, 459e12, 600e9,
                "https://cloud.google.com/tpu/docs/v5p"),
    # v6e: Trillium.
    "v6e": Chip("v6e", "TPU v6 lite", 32 * _GB, 1638e9, 918e12, 400e9,
                "https://cloud.google.com/tpu/docs/v6e"),
}

_TOPOLOGY = re.compile(r"^(v4|v5e|v5p|v6e):(\d+(?:x\d+){1,2})$")


def chip(name: str) -> Chip:
  """The `Chip` of a generation name ("v4", "v5e", "v5p", "v6e")."""
  if name not in CHIPS:
    raise ValueError(f"chip must be one of {sorted(CHIPS)}, got {name!r}")
  return CHIPS[name]


def chip_of_device(device: jax.Device) -> Chip:
  """The `Chip` of a TPU device (a real one or one of `topology_devices`)."""
  kind = getattr(device, "device_kind", "")
  for c in CHIPS.values():
    if c.device_kind == kind:
      return c
  raise ValueError(f"no published figures for device kind {kind!r}; known: "
                   f"{sorted(c.device_kind for c in CHIPS.values())}")


def parse_topology(topology: str):
  """("v5e", (2, 4)) from "v5e:2x4"; a clear ValueError for anything else."""
  if not isinstance(topology, str):
    raise TypeError(f"topology must be a string like 'v5e:2x4', got {type(topology).__name__}")
  m = _TOPOLOGY.match(topology.strip())
  if not m:
    raise ValueError(f"topology must look like 'v5e:2x4', 'v6e:4x4' or 'v4:2x2x4' "
                     f"(generation {sorted(CHIPS)}, chips per axis), got {topology!r}")
  dims = tuple(int(d) for d in m.group(2).split("x"))
  if min(dims) < 1:
    raise ValueError(f"topology {topology!r} has an axis of size 0")
  return m.group(1), dims


# Chips per host (a v4 / v5p host holds 2x2x1 chips, a v5e / v6e host 2x4 = 8).
_HOST_BOUNDS = {"v4": (2, 2, 1), "v5p": (2, 2, 1), "v5e": (2, 4, 1), "v6e": (2, 4, 1)}


def _topology_options(generation: str, dims) -> dict:
  """Options of `get_topology_desc`: one device per chip (v4 / v5p as "megacore": the chip's two
  TensorCores are one JAX device), and a slice smaller than a host on a host of its own size."""
  opts = {}
  if generation in ("v4", "v5p"):
    opts["chip_config_name"] = "megacore"
  bounds = _HOST_BOUNDS[generation]
  full = tuple(dims) + (1,) * (3 - len(dims))
  if generation in ("v5e", "v6e") or any(d < b for d, b in zip(full, bounds)):
    opts["chips_per_host_bounds"] = tuple(min(d, b) for d, b in zip(full, bounds))
  return opts


def topology_devices(topology: str) -> List[jax.Device]:
  """The devices of a TPU slice, e.g. "v5e:2x4" (8 chips), without a TPU.

  Needs `libtpu` (specjax's `[tpu]` extra). The devices go in a `Mesh` and in `NamedSharding`s of
  `jax.ShapeDtypeStruct` arguments; `jax.jit(f).lower(...).compile()` then compiles for that
  TPU. Multi-host slices give the devices of every host (`device.process_index`).
  """
  generation, dims = parse_topology(topology)
  # Compiling opens no TPU: let several processes (a notebook, test workers) load libtpu
  # instead of the first one holding its lockfile (`import specjax` set it already, unless
  # the environment was changed since).
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  except ImportError as e:  # pragma: no cover - part of jax
    raise RuntimeError("jax.experimental.topologies is unavailable in this jax") from e
  try:
    desc = topologies.get_topology_desc(topology_name=topology, platform="tpu",
                                        **_topology_options(generation, dims))
  except Exception as e:  # the TPU plugin's errors vary by version
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "libtpu" in msg.lower() or "unknown backend" in msg.lower() or "plugin" in msg.lower():
      raise RuntimeError(f"compiling for TPU topology {topology!r} needs libtpu: "
                         "pip install 'specjax[tpu]' (or 'jax[tpu]' matching your jax). "
                         f"({msg})") from None
    raise ValueError(f"the TPU compiler does not know topology {topology!r}: {msg}") from None
  devices = list(desc.devices)
  expected = chip(generation).device_kind
  if devices and devices[0].device_kind != expected:
    raise ValueError(f"topology {topology!r} gave {devices[0].device_kind!r} devices, "
                     f"expected {expected!r}")
  return devices


def num_hosts(devices: Sequence[jax.Device]) -> int:
  """Hosts a slice spans (distinct `process_index` values)."""
  return len({d.process_index for d in devices})
