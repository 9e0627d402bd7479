"""The drafter families side by side on one trained target (issue 26).

  python experiments/families.py --config=configs/families.py:quick
"""

import os

from absl import app, logging
from ml_collections import config_flags

from experiments.programs import families

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs", "families.py"),
    "Experiment config (configs/families.py:<preset>).")


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  families.run(_CONFIG.value)


if __name__ == "__main__":
  app.run(main)
