"""Long contexts × batch (issue 29): repository-level code completion,
AR against three drafts from one prefill, the speedup surface.

  python experiments/long_context.py --config=configs/long_context.py:quick
"""

from experiments import launch
from experiments.programs import long_context

_CONFIG = launch.config_flag("long_context.py")

if __name__ == "__main__":
  launch.run(_CONFIG, long_context.run, results_md=True)
