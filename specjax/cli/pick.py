r"""Which drafter family and γ to use, or none, for a measured cell: the picker's CLI.

  specjax-pick --results=drafters.json \
      --task=code --batch=1 --temperature=0 --context=128 --max_new=64

(or `python -m specjax.cli.pick ...`) reads the cell (`planning.picker_io`), runs
`planning.picker.pick` and prints the recommendation with the numbers it used.
"""

from __future__ import annotations

from typing import Optional, Sequence

from absl import flags

from specjax import cli
from specjax.planning.picker import pick
from specjax.planning.picker_io import measurements_from_json, verify_cost_from_json

__all__ = ["main", "run"]

_PROG = "specjax-pick"


def _define_flags(fv: flags.FlagValues) -> list[str]:
  """Defines the CLI's flags on `fv`; returns their names. Defined on demand, not at import:
  `specjax.cli.rollout` has flags of the same names, and importing both must work."""
  holders = [
      flags.DEFINE_string("results", None, "results JSON (drafters.json layout)", flag_values=fv),
      flags.DEFINE_string("task", None, "task name in the results", flag_values=fv),
      flags.DEFINE_integer("batch", 1, "batch size (a measured cell)", flag_values=fv),
      flags.DEFINE_float("temperature", 0.0, "temperature (a measured cell)", flag_values=fv),
      flags.DEFINE_float("memory_budget_mb", None, "draft memory budget in MiB (default: none)",
                         flag_values=fv),
      flags.DEFINE_integer("context", 128, "prompt tokens per sequence", flag_values=fv),
      flags.DEFINE_integer("max_new", 64, "new tokens per sequence", flag_values=fv),
      flags.DEFINE_float("min_speedup", 1.05, "least speedup worth it", flag_values=fv),
      flags.DEFINE_integer("min_new_tokens", 50, "shorter outputs: don't", flag_values=fv),
      flags.DEFINE_integer("max_gamma", 32, "largest γ searched", flag_values=fv),
      flags.DEFINE_bool("extrapolate", False,
                        "extrapolate the verify cost beyond the measured call sizes",
                        flag_values=fv),
      flags.DEFINE_bool("search_gamma", False,
                        "read a derived draft cost per drafted token and search γ for chains "
                        "with α (default: per iteration, each family at its measured γ)",
                        flag_values=fv),
  ]
  flags.mark_flags_as_required(["results", "task"], flag_values=fv)
  return [h.name for h in holders]


def _pick(fv: flags.FlagValues) -> None:
  """Prints the recommendation for the cell that the parsed flags `fv` name."""
  budget = None if fv.memory_budget_mb is None else fv.memory_budget_mb * 2**20
  derived = "token" if fv.search_gamma else "iteration"
  rec = pick(measurements_from_json(fv.results, fv.task, fv.batch, fv.temperature,
                                    derived_cost_per=derived),
             verify_cost_from_json(fv.results, fv.task, fv.batch, fv.temperature,
                                   extrapolate=fv.extrapolate),
             batch_size=fv.batch, memory_budget_bytes=budget, context_tokens=fv.context,
             max_new_tokens=fv.max_new, temperature=fv.temperature, min_speedup=fv.min_speedup,
             min_new_tokens=fv.min_new_tokens, max_gamma=fv.max_gamma)
  print(rec.format())


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Prints the recommendation for a measured cell; returns the exit status. `argv`: the flags
  without the program name (default `sys.argv[1:]`), parsed into a fresh `FlagValues` (absl's
  global FLAGS untouched). Bad or missing flags raise `absl.flags.Error`."""
  return cli.call(_PROG, _define_flags, _pick, argv)


def run() -> None:
  """The command line through absl's `app.run` (--help, --flagfile, usage errors)."""
  cli.run(_define_flags, _pick, __doc__)


if __name__ == "__main__":
  run()
