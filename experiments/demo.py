"""Plain decoding vs prompt lookup (fixed γ and gamma="auto") with a small
decoder trained here on code; prints α, tokens per target call, both speeds
and the γ auto chose, measured side by side.

  python experiments/demo.py --config=configs/demo.py
"""

import os

from absl import app, logging
from ml_collections import config_flags

from experiments.programs import demo

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs", "demo.py"),
    "Demo config (configs/demo.py).")


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  demo.run(_CONFIG.value)


if __name__ == "__main__":
  app.run(main)
