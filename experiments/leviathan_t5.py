"""Leviathan et al. 2023 reproduction (T5): data, training, measurements, report.

  python experiments/leviathan_t5.py --config=configs/leviathan_t5.py:quick
"""

import os

from absl import app, logging
from ml_collections import config_flags

from specjax.aot.from_config import run_from_config
from specjax.aot.run import run_aot
from experiments.programs import leviathan

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs", "leviathan_t5.py"),
    "Experiment config (configs/leviathan_t5.py:<preset>).")


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  if _CONFIG.value.get("aot_topology", ""):  # compile-only for a TPU slice (specjax.aot)
    print(run_aot(run_from_config(_CONFIG.value), progress=logging.info)["markdown"])
    return
  results_md = os.path.join(leviathan.run(_CONFIG.value)["_out_dir"], "results.md")
  with open(results_md, encoding="utf-8") as f:
    print(f.read())


if __name__ == "__main__":
  app.run(main)
