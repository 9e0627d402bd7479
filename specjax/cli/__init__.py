"""The small command lines (`specjax-pick`, `specjax-rollout`): absl, like every specjax CLI.

Each defines its flags on demand (`define_flags(flag_values) -> names`), not at import, so two
CLIs with flags of the same names can be imported together. `call` parses into a fresh
`FlagValues` (absl's global FLAGS untouched: tests call a CLI several times in one process);
`run` is the console script's entry (absl's `app.run`: --help, --flagfile, usage errors).
"""

from __future__ import annotations

import sys
from typing import Callable, List, Optional, Sequence

from absl import app, flags

from specjax._app import run_app

__all__ = ["call", "run"]

DefineFlags = Callable[[flags.FlagValues], List[str]]
Body = Callable[[flags.FlagValues], None]


def call(prog: str, define_flags: DefineFlags, body: Body,
         argv: Optional[Sequence[str]] = None) -> int:
  """Parses `argv` (without the program name; default `sys.argv[1:]`) into a fresh `FlagValues`
  and runs `body`; returns the exit status. Bad or missing flags raise `absl.flags.Error`, stray
  arguments `app.UsageError`."""
  fv = flags.FlagValues()
  define_flags(fv)
  rest = fv([prog, *(sys.argv[1:] if argv is None else argv)])
  if len(rest) > 1:
    raise app.UsageError(f"unexpected arguments: {rest[1:]}")
  body(fv)
  return 0


def run(define_flags: DefineFlags, body: Body, doc: str) -> None:
  """The command line through absl's `app.run` on the global FLAGS."""
  names = define_flags(flags.FLAGS)
  # --help lists the main module's flags and docstring; under a console script that module is
  # the installed wrapper, so make ours its key flags and lend it `doc`.
  for name in names:
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
  if not getattr(sys.modules["__main__"], "__doc__", None):
    sys.modules["__main__"].__doc__ = doc

  def app_main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {list(argv[1:])}")
    body(flags.FLAGS)

  run_app(app_main)
