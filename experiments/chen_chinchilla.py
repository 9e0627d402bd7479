"""Chen et al. 2023 reproduction (Chinchilla-style decoders): data, training,
measurements, report.

  python experiments/chen_chinchilla.py --config=configs/chen_chinchilla.py:quick
"""

from experiments import launch
from experiments.programs import chen

_CONFIG = launch.config_flag("chen_chinchilla.py")

if __name__ == "__main__":
  launch.run(_CONFIG, chen.run, results_md=True, extras=("experiments", "eval"))
