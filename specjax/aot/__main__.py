"""Compile every program of an experiment for a TPU topology, with no TPU attached.

  python -m specjax.aot --config=configs/chen_chinchilla.py:paper --topology=v5e:4x4
  python -m specjax.aot --config=configs/leviathan_t5.py:paper --topology=v4:1x1x1 \
      --programs=ar,draft --out=results/tpu_aot/leviathan_v4-1

Needs libtpu (`pip install -e ".[tpu]"`). Prints a markdown table per
program (memory against the chip's HBM, bytes per iteration against what
each call must read, collectives, host transfers, cache-sized copies,
predicted times) and, with --out, writes report.json and report.md there.
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from specjax.aot.from_config import run_from_config
from specjax.aot.run import PROGRAM_KINDS, run_aot
from specjax.atomic_io import atomic_write_json, atomic_write_text
from specjax.measure.provenance import provenance

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config (file:preset).")
_TOPOLOGY = flags.DEFINE_string("topology", "", "TPU slice, e.g. v5e:2x4, v4:2x2x4.")
_PROGRAMS = flags.DEFINE_list("programs", ["prefill", "ar", "draft"],
                              f"Programs to compile, among {', '.join(PROGRAM_KINDS)}.")
_MESH = flags.DEFINE_string("mesh", "", "data x model, e.g. 1x8 (default: model over all).")
_OUT = flags.DEFINE_string("out", "", "Directory for report.json / report.md.")


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  if _CONFIG.value is None:
    raise app.UsageError("--config is required, e.g. configs/chen_chinchilla.py:paper")
  overrides = {"programs": tuple(_PROGRAMS.value)}
  if _MESH.value:
    data, model = (int(x) for x in _MESH.value.lower().split("x"))
    overrides["mesh"] = (data, model)
  run = run_from_config(_CONFIG.value, _TOPOLOGY.value or None, **overrides)
  result = run_aot(run, progress=logging.info)
  print(result["markdown"])
  if _OUT.value:
    os.makedirs(_OUT.value, exist_ok=True)
    atomic_write_json(os.path.join(_OUT.value, "report.json"),
                      {**{k: v for k, v in result.items() if k != "markdown"},
                       "provenance": provenance()})
    atomic_write_text(os.path.join(_OUT.value, "report.md"), result["markdown"] + "\n")


def run():
  """The `specjax-aot` console script and `python -m specjax.aot`: absl's `app.run(main)`."""
  # --help lists the main module's flags and prints its docstring; under a console script
  # the main module is the installed wrapper, so name ours its key flags and lend it our doc.
  for holder in (_CONFIG, _TOPOLOGY, _PROGRAMS, _MESH, _OUT):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[holder.name])
  if not getattr(sys.modules["__main__"], "__doc__", None):
    sys.modules["__main__"].__doc__ = __doc__
  app.run(main)


if __name__ == "__main__":
  run()
