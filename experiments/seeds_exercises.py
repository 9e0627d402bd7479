"""The seeds' analysis exercises: tokens per call vs N, the α a speedup needs,
a traffic mix, an EAGLE-3 head's memory, α against KL (`experiments.programs.seeds`).

  python experiments/seeds_exercises.py                  # full: results/seeds/
  python experiments/seeds_exercises.py --quick --out_dir=/tmp/seeds
"""

import os

from absl import app, flags

from experiments.programs import seeds
from specjax._app import run_app

_OUT_DIR = flags.DEFINE_string(
    "out_dir", os.path.join(os.path.dirname(__file__), "..", "results", "seeds"),
    "Where exercises.json, exercises.md and the plots go.")
_QUICK = flags.DEFINE_bool("quick", False, "200 kB of text and 4 temperatures (seconds).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  seeds.run(_OUT_DIR.value, quick=_QUICK.value)
  with open(os.path.join(_OUT_DIR.value, "exercises.md"), encoding="utf-8") as f:
    print(f.read())


if __name__ == "__main__":
  run_app(main)
