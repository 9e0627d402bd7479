"""Leviathan et al. 2023 reproduction (T5): data, training, measurements, report.

  python experiments/leviathan_t5.py --config=configs/leviathan_t5.py:quick
"""

from experiments import launch
from experiments.programs import leviathan

_CONFIG = launch.config_flag("leviathan_t5.py")

if __name__ == "__main__":
  launch.run(_CONFIG, leviathan.run, results_md=True)
