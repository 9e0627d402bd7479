"""absl entry points whose --help exits 0.

absl's `app.run` prints the usage for `--help` / `--helpshort` / `--helpfull` / `--helpxml` and
then exits with status 1, so `cmd --help && ...` fails and shells report an error after a help
page. `run_app` is `app.run` with that one exit turned into 0; every other exit is kept.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence

from absl import app

_HELP_FLAGS = ("-h", "-?", "--help", "--helpshort", "--helpfull", "--helpxml")


def asks_for_help(argv: Sequence[str]) -> bool:
  """Whether a command line (argv[0] excluded) asks for a help page."""
  for arg in argv[1:]:
    if arg == "--":
      return False
    if arg.split("=", 1)[0] in _HELP_FLAGS:
      return True
  return False


def run_app(main: Callable[[list], object], argv: Optional[Sequence[str]] = None) -> None:
  """`absl.app.run(main, argv)`, exiting 0 after a help page absl exits 1 after."""
  argv = list(sys.argv if argv is None else argv)
  try:
    app.run(main, argv)
  except SystemExit as e:
    if e.code == 1 and asks_for_help(argv):
      raise SystemExit(0) from None
    raise
