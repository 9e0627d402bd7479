"""Which drafter family and γ to use, or none, for a measured cell: the picker's CLI.

  python -m specjax.experiments.pick --results=benchmarks/results/drafters.json \
      --task=code --batch=1 --temperature=0 --context=128 --max_new=64

reads the cell (`specjax.planning.picker_io`), runs `specjax.planning.picker.pick`
and prints the recommendation with the numbers it used.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from specjax.planning.picker import pick
from specjax.planning.picker_io import measurements_from_json, verify_cost_from_json

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m specjax.experiments.pick",
                              description=__doc__.split("\n")[0])
  p.add_argument("--results", required=True, help="results JSON (drafters.json layout)")
  p.add_argument("--task", required=True, help="task name in the results")
  p.add_argument("--batch", type=int, default=1, help="batch size (a measured cell)")
  p.add_argument("--temperature", type=float, default=0.0, help="temperature (a measured cell)")
  p.add_argument("--memory_budget_mb", type=float, default=None,
                 help="draft memory budget in MiB (default: none)")
  p.add_argument("--context", type=int, default=128, help="prompt tokens per sequence")
  p.add_argument("--max_new", type=int, default=64, help="new tokens per sequence")
  p.add_argument("--min_speedup", type=float, default=1.05, help="least speedup worth it")
  p.add_argument("--min_new_tokens", type=int, default=50, help="shorter outputs: don't")
  p.add_argument("--max_gamma", type=int, default=32, help="largest γ searched")
  p.add_argument("--extrapolate", action="store_true",
                 help="extrapolate the verify cost beyond the measured call sizes")
  p.add_argument("--search_gamma", action="store_true",
                 help="read a derived draft cost per drafted token and search γ for chains "
                      "with α (default: per iteration, each family at its measured γ)")
  return p


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Prints the recommendation for a measured cell; returns the exit status."""
  a = _parser().parse_args(argv)
  budget = None if a.memory_budget_mb is None else a.memory_budget_mb * 2**20
  derived = "token" if a.search_gamma else "iteration"
  rec = pick(measurements_from_json(a.results, a.task, a.batch, a.temperature,
                                    derived_cost_per=derived),
             verify_cost_from_json(a.results, a.task, a.batch, a.temperature,
                                   extrapolate=a.extrapolate),
             batch_size=a.batch, memory_budget_bytes=budget, context_tokens=a.context,
             max_new_tokens=a.max_new, temperature=a.temperature, min_speedup=a.min_speedup,
             min_new_tokens=a.min_new_tokens, max_gamma=a.max_gamma)
  print(rec.format())
  return 0


if __name__ == "__main__":
  sys.exit(main())
