"""Plain decoding vs prompt lookup (fixed γ and gamma="auto") with a small
decoder trained here on code; prints α, tokens per target call, both speeds
and the γ auto chose, measured side by side.

  python experiments/demo.py --config=configs/demo.py
"""

from experiments import launch
from experiments.programs import demo

_CONFIG = launch.config_flag("demo.py", "Demo")

if __name__ == "__main__":
  launch.run(_CONFIG, demo.run)
