"""Multi-token heads vs a pruned draft on tinyshakespeare (the seeds' exercise).

  python experiments/shakespeare_heads.py --config=configs/shakespeare_heads.py:full
"""

from experiments import launch
from experiments.programs import shakespeare_heads

_CONFIG = launch.config_flag("shakespeare_heads.py")

if __name__ == "__main__":
  launch.run(_CONFIG, shakespeare_heads.run)
