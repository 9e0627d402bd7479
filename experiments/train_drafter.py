"""Learned drafters on a frozen target (Medusa, EAGLE-1/3 and block heads, PARD
drafts): self-distilled data, training, accuracies (configs/train_drafter.py).

  python experiments/train_drafter.py --config=configs/train_drafter.py:medusa_quick
"""

import os

from absl import app, logging
from ml_collections import config_flags

from experiments.programs import drafter_training

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs", "train_drafter.py"),
    "Drafter training config (configs/train_drafter.py:<preset>).")


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  drafter_training.run(_CONFIG.value)


if __name__ == "__main__":
  app.run(main)
