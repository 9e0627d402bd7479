"""Trains (or resumes) a model from a config; see configs/train.py.

  python experiments/train.py --config=configs/train.py:tiny --workdir=/tmp/train_tiny
"""

import os

from absl import app, flags, logging
from ml_collections import config_flags

from experiments.programs import runner

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs", "train.py"),
    "Training config (configs/train.py:<preset>).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics and final params.",
                               required=True)
_STOP_AT = flags.DEFINE_integer("stop_at_step", None,
                                "Stop (with a checkpoint) at this step; rerun to continue.")


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  runner.run(_CONFIG.value, _WORKDIR.value, stop_at_step=_STOP_AT.value)


if __name__ == "__main__":
  app.run(main)
