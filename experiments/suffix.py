"""Suffix drafting against prompt lookup on agent-like code edit sessions and
on summarisation: tokens per target call, ms per token and the speedup over
plain decoding, measured side by side.

  python experiments/suffix.py --config=configs/suffix.py
"""

from experiments import launch
from experiments.programs import suffix

_CONFIG = launch.config_flag("suffix.py", "Suffix drafting")

if __name__ == "__main__":
  launch.run(_CONFIG, suffix.run)
