"""specjax against transformers on the same weights, on this CPU (one command).

  python benchmarks/peers_bench.py --leviathan_dir=runs/leviathan_full \
      --chen_dir=runs/chen_full                      # the full suite (~35 min)
  python benchmarks/peers_bench.py ... --model_parallel=0  # + batch-1 rows on every core
  python benchmarks/peers_bench.py --quick ...       # fewer cells (~10 min)
  python benchmarks/peers_bench.py --smoke           # tiny random models (< 1 min; the test)
  python benchmarks/peers_bench.py --render=benchmarks/results/peers_t5.json  # report only

Pairs: `t5` = the Leviathan T5 v1.1 target and its draft_<--t5_draft> (orbax
dirs under --leviathan_dir), `decoder` = the Chen target and draft (under
--chen_dir). A pair whose directory is empty or missing is initialised at
random with the same shapes, and the report says so.

Systems, side by side in one process: specjax autoregressive and speculative
(γ sweep) at every --batches, transformers greedy, transformers assisted
generation (batch 1: it refuses more, which is recorded) and prompt lookup
on the weights exported with `export_hf_*`. Then each system's peak memory in
a fresh process, and the cost growth of the static buffers.

Writes peers.json and peers.md (peers_quick.* / peers_smoke.*) into --out_dir;
see benchmarks/README.md for every column.
"""

import os
import time

from absl import app, flags, logging

from specjax.atomic_io import atomic_write_json, atomic_write_text
from experiments.programs import peers_suite

_OUT = flags.DEFINE_string("out_dir", os.path.join(os.path.dirname(__file__), "results"),
                           "Where peers.json / peers.md go.")
_LEV = flags.DEFINE_string("leviathan_dir", "", "Leviathan workdir (target/final, draft_*/final).")
_CHEN = flags.DEFINE_string("chen_dir", "", "Chen workdir (target/final, draft/final).")
_T5_DRAFT = flags.DEFINE_string("t5_draft", "small", "Which Leviathan draft to pair with the target.")
_DATA = flags.DEFINE_string("data_cache", "data_cache", "Built tasks and vocabularies (test prompts).")
_QUICK = flags.DEFINE_bool("quick", False, "Fewer batch sizes, γ values and repeats.")
_SMOKE = flags.DEFINE_bool("smoke", False, "Tiny random models, a few cells: a smoke run.")
_PAIRS = flags.DEFINE_list("pairs", ["t5", "decoder"], "Pairs to measure.")
_BATCHES = flags.DEFINE_list("batches", None, "Override the batch sizes.")
_GAMMAS = flags.DEFINE_list("gammas", None, "Override γ at batch 1.")
_GAMMAS_B = flags.DEFINE_list("gammas_batched", None, "Override γ at batch > 1.")
_REPEATS = flags.DEFINE_integer("repeats", None, "Override the timed rounds.")
_MAX_NEW = flags.DEFINE_integer("max_new", None, "Override N, the tokens generated per row.")
_ROUNDS = flags.DEFINE_integer("overhead_rounds", None,
                               "Override the paired loop-overhead rounds (0: off).")
_MIN_S = flags.DEFINE_float("overhead_min_seconds", None,
                            "Override the loops' minimum summed time over the paired rounds "
                            "(more rounds, up to 4x, until reached).")
_MEMORY = flags.DEFINE_bool("memory", True, "Measure peak memory in subprocesses.")
_GROWTH = flags.DEFINE_bool("growth", True, "Measure cost growth with length and buffer.")
_MP = flags.DEFINE_integer("model_parallel", None, "Batch-1 model-parallel rows on this many CPU "
                           "devices (0: one per core; default 1: off; smoke: 2).")
_MP_GAMMAS = flags.DEFINE_list("mp_gammas", None, "Override γ of the model-parallel rows.")
_THREADS = flags.DEFINE_integer("torch_threads", None, "torch threads (default: all cores; "
                                "smoke: 1).")
_PACKED = flags.DEFINE_bool("packed_decoder", True, "Decoder pairs decode from the packed "
                            "layout (DecoderLM.pack_params); false: the standard tree.")
_MATVEC = flags.DEFINE_string("decoder_matvec_rows", "auto", "Decoder pairs' matvec_max_rows: "
                              "auto (measured on this machine by specjax.tune_matvec_rows), "
                              "default (the library's), or an int >= 0.")
_RENDER = flags.DEFINE_string("render", "", "Measure nothing: recompute the goals of this "
                               "results JSON and rewrite the markdown next to it (X.json → X.md).")


def _matvec_rows(value: str):
  if value in ("auto", "default"):
    return None if value == "default" else value
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"--decoder_matvec_rows must be auto, default or an int >= 0, got "
                     f"{value!r}") from None


def make_config() -> peers_suite.SuiteConfig:
  kw = dict(peers_suite.SMOKE if _SMOKE.value else peers_suite.QUICK if _QUICK.value else {})
  kw.update(leviathan_dir=_LEV.value, chen_dir=_CHEN.value, t5_draft=_T5_DRAFT.value,
            data_cache=_DATA.value, pairs=tuple(_PAIRS.value), memory=_MEMORY.value,
            growth=_GROWTH.value, packed_decoder=_PACKED.value,
            decoder_matvec_rows=_matvec_rows(_MATVEC.value))
  ints = lambda xs: tuple(int(x) for x in xs)
  for flag, key in ((_BATCHES, "batches"), (_GAMMAS, "gammas"), (_GAMMAS_B, "gammas_batched"),
                    (_MP_GAMMAS, "mp_gammas")):
    if flag.value:
      kw[key] = ints(flag.value)
  if "batches" in kw:
    kw.setdefault("hf_batches", kw["batches"])
  for flag, key in ((_REPEATS, "repeats"), (_MAX_NEW, "max_new"), (_THREADS, "threads"),
                    (_MP, "model_parallel"),
                    (_ROUNDS, "overhead_rounds"), (_MIN_S, "overhead_min_seconds")):
    if flag.value is not None:
      kw[key] = flag.value
  return peers_suite.SuiteConfig(**kw)


def render(path: str) -> str:
  """Rewrites `<stem>.md` (and the goals in `<stem>.json`) from a results JSON
  with this code's report: a change to the report or to the goals' rules
  then reaches committed results without measuring again."""
  import json
  with open(path) as f:
    results = json.load(f)
  # The JSON's keys are sorted; the report lists the pairs in the order they ran.
  order = [n for n in results["meta"]["config"].get("pairs", ()) if n in results["pairs"]]
  results["pairs"] = {n: results["pairs"][n] for n in order + sorted(set(results["pairs"])
                                                                      - set(order))}
  results["goals"] = peers_suite.goals(results)
  atomic_write_json(path, results, indent=2)
  md = peers_suite.to_markdown(results)
  atomic_write_text(os.path.splitext(path)[0] + ".md", md)
  return md


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  if _RENDER.value:
    print(render(_RENDER.value))
    return
  cfg = make_config()
  if cfg.model_parallel != 1 and "device_count" not in os.environ.get("XLA_FLAGS", ""):
    # CPU devices for the model-parallel rows; XLA reads this when the backend
    # starts (the first computation), so before anything runs.
    n = cfg.model_parallel or os.cpu_count() or 1
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={n}").strip()
  if _SMOKE.value:  # Tiny models: compilation dominates, and its speed is not measured here.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_backend_optimization_level=0").strip()
  start = time.time()
  log = lambda msg: logging.info("[%5.0fs] %s", time.time() - start, msg)
  name = {"smoke": "peers_smoke", "quick": "peers_quick"}.get(cfg.mode, "peers")
  os.makedirs(_OUT.value, exist_ok=True)
  partial = os.path.join(_OUT.value, f".{name}.partial.json")
  results = peers_suite.run_suite(
      cfg, log, on_pair=lambda pairs: atomic_write_json(partial, pairs, indent=2))
  atomic_write_json(os.path.join(_OUT.value, f"{name}.json"), results, indent=2)
  if os.path.exists(partial):
    os.remove(partial)
  md = peers_suite.to_markdown(results)
  atomic_write_text(os.path.join(_OUT.value, f"{name}.md"), md)
  print(md)


if __name__ == "__main__":
  app.run(main)
