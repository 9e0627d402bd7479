"""The drafter families side by side on one trained target (issue 26).

  python experiments/families.py --config=configs/families.py:quick
"""

from experiments import launch
from experiments.programs import families

_CONFIG = launch.config_flag("families.py")

if __name__ == "__main__":
  launch.run(_CONFIG, families.run)
