"""Suffix drafting against prompt lookup on agent-like code edit sessions and
on summarisation: tokens per target call, ms per token and the speedup over
plain decoding, measured side by side.

  python experiments/suffix.py --config=configs/suffix.py
"""

import os

from absl import app, logging
from ml_collections import config_flags

from experiments.programs import suffix

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs", "suffix.py"),
    "Suffix drafting config (configs/suffix.py).")


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  suffix.run(_CONFIG.value)


if __name__ == "__main__":
  app.run(main)
