"""Compile-only runs for TPU slices: fit, streaming and collectives before renting one.

Every program an experiment would run is lowered with abstract arguments carrying the run's
shardings, compiled for the slice by the TPU compiler (libtpu, on any machine) and reported
against the chip's HBM and published figures (docs/tpu.md).

  python -m specjax.aot --config=configs/chen_chinchilla.py:paper --topology=v5e:4x4

Modules: `chips` (chip figures, topology devices), `hlo_cost` (per-iteration accounting of
compiled HLO), `programs` (abstract sharded arguments, lowering), `report` (one program), `run`
(every program of a run), `from_config` (a launcher config → a run).
"""

from specjax.aot.chips import CHIPS, Chip, chip, topology_devices
from specjax.aot.run import AotRun, merge_results, run_aot

__all__ = ["AotRun", "run_aot", "merge_results", "CHIPS", "Chip", "chip", "topology_devices"]
