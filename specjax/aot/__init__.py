"""Compile-only runs for TPU slices: fit, streaming and collectives before renting one.

The TPU compiler (libtpu: `pip install -e ".[tpu]"`) runs on any machine, and
`jax.experimental.topologies` describes the devices of a real slice with no
TPU attached. `specjax.aot` lowers every program an experiment would run —
prefills, the autoregressive loop, the speculative loop for each drafter and
γ, a draft's sharded train step — with abstract arguments carrying the run's
shardings, compiles them for the slice, and reports per program the
compiler's per-device memory against the chip's HBM, the bytes one
iteration reads against the parameter and cache slices it must read,
collectives per iteration, host transfers and cache-sized copies, and a
roofline prediction from the chip's published figures.

  python -m specjax.aot --config=configs/chen_chinchilla.py:paper --topology=v5e:4x4

Modules: `chips` (published chip figures, topology devices), `hlo_cost`
(per-iteration accounting of compiled HLO), `programs` (abstract sharded
arguments, lowering), `report` (compile and report one program), `run`
(every program of a run), `from_config` (a launcher config → a run).
"""

from specjax.aot.chips import CHIPS, Chip, chip, topology_devices
from specjax.aot.run import AotRun, merge_results, run_aot

__all__ = ["AotRun", "run_aot", "merge_results", "CHIPS", "Chip", "chip", "topology_devices"]
