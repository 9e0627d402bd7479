"""Compile every program of an experiment for a TPU topology, with no TPU attached.

  python -m specjax.aot --config=configs/chen_chinchilla.py:paper --topology=v5e:4x4
  python -m specjax.aot --config=configs/leviathan_t5.py:paper --topology=v4:1x1x1 \
      --programs=ar,draft --out=aot_leviathan_v4-1
  specjax-aot --target=llama-3.1-8b --drafts=llama-3.2-1b --topology=v5e:2x4 \
      --batch_size=1 --prompt_len=2048 --max_new_tokens=128    # named shapes: no checkout needed

Needs libtpu (`pip install -e ".[tpu]"`). Prints a markdown table per program and, with --out,
writes report.json and report.md there. The TPU compiler's host memory is returned only when the
process exits: --separate_processes compiles each kind of program in a process of its own and
merges the reports (`specjax.aot.merge_results`).
"""

import json
import os
import subprocess
import sys
import tempfile

from absl import app, flags, logging
from ml_collections import config_flags

from specjax._app import run_app
from specjax.aot.from_config import run_from_config, run_from_names
from specjax.aot.programs import PARAM_LAYOUTS
from specjax.aot.run import PROGRAM_KINDS, merge_results, run_aot
from specjax.atomic_io import atomic_write_json, atomic_write_text
from specjax.measure.provenance import provenance

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config (file:preset).")
_TOPOLOGY = flags.DEFINE_string("topology", "", "TPU slice, e.g. v5e:2x4, v4:2x2x4.")
_TARGET = flags.DEFINE_string("target", "", "Instead of --config: a named target shape "
                              "(specjax.DECODER_CONFIGS / T5_CONFIGS, e.g. llama-3.1-8b).")
_DRAFTS = flags.DEFINE_list("drafts", [], "With --target: named draft shapes (e.g. llama-3.2-1b).")
_GAMMAS = flags.DEFINE_list("gammas", ["4"], "With --target: γ values of the speculative loop.")
_BATCH = flags.DEFINE_integer("batch_size", 1, "With --target: the batch.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 2048, "With --target: prompt tokens.")
_NEW = flags.DEFINE_integer("max_new_tokens", 128, "With --target: new tokens.")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"],
                           "With --target: weights and activations.")
_PROGRAMS = flags.DEFINE_list("programs", ["prefill", "ar", "draft"],
                              f"Programs to compile, among {', '.join(PROGRAM_KINDS)}.")
_MESH = flags.DEFINE_string("mesh", "", "data x model, e.g. 1x8 (default: model over all).")
_OUT = flags.DEFINE_string("out", "", "Directory for report.json / report.md.")
_LAYOUTS = flags.DEFINE_enum("param_layouts", "default", list(PARAM_LAYOUTS),
                             "Weights in the devices' default layouts, or in the layouts the "
                             "compiler chooses (what a deployment placing them in the compiled "
                             "program's input formats runs).")
_SEPARATE = flags.DEFINE_bool("separate_processes", False,
                              "Compile each kind of program in a process of its own and merge "
                              "the reports (the compiler's host memory is freed at exit).")
_PART = flags.DEFINE_string("part_out", "", "Internal (--separate_processes): write this "
                            "process's result as JSON to this file.")

# The parent's flags a --separate_processes child does not inherit (it is given them anew).
_PARENT_ONLY = ("programs", "separate_processes", "out", "part_out")


def _child_args(argv):
  """The parent's flags without `_PARENT_ONLY` ("--flag=value" or "--flag value")."""
  out, skip = [], False
  for a in argv:
    if skip:
      skip = False
      continue
    name = a.lstrip("-").split("=")[0]
    if a.startswith("-") and name in _PARENT_ONLY + tuple("no" + n for n in _PARENT_ONLY):
      skip = "=" not in a and name in ("programs", "out", "part_out")
      continue
    out.append(a)
  return out


def _compile_apart(run, kinds):
  """Each kind of `run`'s programs compiled by `python -m specjax.aot` in its own process."""
  parts = []
  with tempfile.TemporaryDirectory() as tmp:
    for kind in kinds:
      path = os.path.join(tmp, f"{kind}.json")
      logging.info("compiling the %s programs in a process of their own", kind)
      rc = subprocess.call([sys.executable, "-m", "specjax.aot", *_child_args(sys.argv[1:]),
                            f"--programs={kind}", f"--part_out={path}"])
      if rc != 0:
        raise RuntimeError(f"compiling the {kind!r} programs failed (exit {rc}; a process "
                           "killed for host memory exits -9)")
      with open(path, encoding="utf-8") as f:
        parts.append(json.load(f))
  return merge_results(parts, run)


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  if (_CONFIG.value is None) == (not _TARGET.value):
    raise app.UsageError("give --config (e.g. configs/chen_chinchilla.py:paper, from a checkout) "
                         "or --target (a named shape, e.g. llama-3.1-8b), not both")
  overrides = {"programs": tuple(_PROGRAMS.value), "param_layouts": _LAYOUTS.value}
  if _MESH.value:
    data, model = (int(x) for x in _MESH.value.lower().split("x"))
    overrides["mesh"] = (data, model)
  if _TARGET.value:
    try:
      gammas = tuple(int(g) for g in _GAMMAS.value)
    except ValueError:
      raise app.UsageError(f"--gammas={_GAMMAS.value!r}: integers, e.g. 3,5") from None
    run = run_from_names(_TARGET.value, tuple(_DRAFTS.value), _TOPOLOGY.value, gammas=gammas,
                         batch_size=_BATCH.value, prompt_len=_PROMPT_LEN.value,
                         max_new_tokens=_NEW.value, dtype=_DTYPE.value, **overrides)
  else:
    run = run_from_config(_CONFIG.value, _TOPOLOGY.value or None, **overrides)
  if _SEPARATE.value and len(run.kinds) > 1:
    result = _compile_apart(run, run.kinds)
  else:
    result = run_aot(run, progress=logging.info)
  if _PART.value:
    atomic_write_json(_PART.value, result)
    return
  print(result["markdown"])
  if _OUT.value:
    os.makedirs(_OUT.value, exist_ok=True)
    atomic_write_json(os.path.join(_OUT.value, "report.json"),
                      {**{k: v for k, v in result.items() if k != "markdown"},
                       "provenance": provenance()})
    atomic_write_text(os.path.join(_OUT.value, "report.md"), result["markdown"] + "\n")


def run():
  """The `specjax-aot` console script and `python -m specjax.aot`: absl's `app.run(main)`."""
  # --help lists the main module's flags and docstring; under a console script that module is
  # the installed wrapper, so make ours its key flags and lend it our doc.
  for holder in (_CONFIG, _TOPOLOGY, _TARGET, _DRAFTS, _GAMMAS, _BATCH, _PROMPT_LEN, _NEW,
                 _DTYPE, _PROGRAMS, _MESH, _OUT, _LAYOUTS, _SEPARATE):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[holder.name])
  if not getattr(sys.modules["__main__"], "__doc__", None):
    sys.modules["__main__"].__doc__ = __doc__
  run_app(main)


if __name__ == "__main__":
  run()
