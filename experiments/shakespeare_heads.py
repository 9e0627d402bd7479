"""Multi-token heads vs a pruned draft on tinyshakespeare (the seeds' exercise).

  python experiments/shakespeare_heads.py --config=configs/shakespeare_heads.py:full
"""

import os

from absl import app, logging
from ml_collections import config_flags

from experiments.programs import shakespeare_heads

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs", "shakespeare_heads.py"),
    "Experiment config (configs/shakespeare_heads.py:<preset>).")


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  shakespeare_heads.run(_CONFIG.value)


if __name__ == "__main__":
  app.run(main)
