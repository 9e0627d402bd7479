"""Learned drafters on a frozen target (Medusa, EAGLE-1/3 and block heads, PARD
drafts): self-distilled data, training, accuracies (configs/train_drafter.py).

  python experiments/train_drafter.py --config=configs/train_drafter.py:medusa_quick
"""

from experiments import launch
from experiments.programs import drafter_training

_CONFIG = launch.config_flag("train_drafter.py", "Drafter training")

if __name__ == "__main__":
  launch.run(_CONFIG, drafter_training.run)
