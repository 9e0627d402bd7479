"""Long contexts × batch (issue 29): repository-level code completion,
AR against three drafts from one prefill, the speedup surface.

  python experiments/long_context.py --config=configs/long_context.py:quick
"""

import os

from absl import app, logging
from ml_collections import config_flags

from experiments.programs import long_context

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs", "long_context.py"),
    "Experiment config (configs/long_context.py:<preset>).")


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  out = long_context.run(_CONFIG.value)["_out_dir"]
  if out:
    with open(os.path.join(out, "results.md"), encoding="utf-8") as f:
      print(f.read())


if __name__ == "__main__":
  app.run(main)
