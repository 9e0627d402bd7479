"""Trains (or resumes) a model from a config; see configs/train.py.

  python experiments/train.py --config=configs/train.py:tiny --workdir=/tmp/train_tiny
"""

from absl import flags

from experiments import launch
from experiments.programs import runner

_CONFIG = launch.config_flag("train.py", "Training")
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics and final params.",
                               required=True)
_STOP_AT = flags.DEFINE_integer("stop_at_step", None,
                                "Stop (with a checkpoint) at this step; rerun to continue.")

if __name__ == "__main__":
  launch.run(_CONFIG, lambda cfg: runner.run(cfg, _WORKDIR.value, stop_at_step=_STOP_AT.value))
