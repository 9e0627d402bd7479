"""The drafter families side by side on one trained target (CPU).

  python benchmarks/drafters_bench.py --chen_dir=runs/chen_full      # ~30-40 min
  python benchmarks/drafters_bench.py --chen_dir=runs/chen_full --medusa_dir=runs/medusa_full \
      --eagle_dir=runs/eagle_full --eagle3_dir=runs/eagle3_full     # + learned heads
  python benchmarks/drafters_bench.py --smoke                         # tiny random models

The flags of `experiments.programs.families.FamilyOptions` (what is measured, and
how a killed run resumes: see that module). Writes drafters.json and
drafters.md (drafters_smoke.*) into --out_dir. `experiments/families.py` runs
the same comparison from an ml_collections config into results/families.
"""

import os

from absl import app, flags

from experiments.programs import families

_OUT = flags.DEFINE_string("out_dir", os.path.join(os.path.dirname(__file__), "results"),
                           "Where drafters.json / drafters.md go.")
_CHEN = flags.DEFINE_string("chen_dir", "runs/chen_full", "Chen workdir (target/final, "
                            "draft/final, results/results.json for the vocabulary).")
_DATA = flags.DEFINE_string("data_cache", "data_cache", "Built tasks and vocabularies.")
_SMOKE = flags.DEFINE_bool("smoke", False, "Tiny random models and random prompts.")
_PROMPTS = flags.DEFINE_integer("prompts", 16, "Prompts per task.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 128, "Prompt bucket P.")
_MAX_NEW = flags.DEFINE_integer("max_new", 64, "Tokens generated per row.")
_BATCHES = flags.DEFINE_list("batches", ["1", "8"], "Batch sizes.")
_TEMPS = flags.DEFINE_list("temperatures", ["0", "1"], "Sampling temperatures.")
_GAMMA = flags.DEFINE_integer("gamma", 4, "γ of the chain drafters.")
_LOOKUP_GAMMA = flags.DEFINE_integer("lookup_gamma", 8, "γ of prompt lookup.")
_WINDOW = flags.DEFINE_integer("window", 64, "Windowed self-draft: recent positions kept.")
_SINKS = flags.DEFINE_integer("sinks", 4, "Windowed self-draft: attention-sink positions.")
_SKIP = flags.DEFINE_integer("skip_layers", 0, "Layer skip: layers kept (0: half the target's).")
_LA = flags.DEFINE_list("lookahead", ["4", "4", "4"], "Lookahead window W, n-gram N, candidates G.")
_TASKS = flags.DEFINE_list("tasks", ["code", "summarize", "code_repeat"], "Tasks (also "
                           "free_text: descriptions continued as plain text).")
_MEDUSA = flags.DEFINE_string("medusa_dir", "", "Trained Medusa heads (experiments/"
                              "train_drafter.py's workdir): adds Medusa rows.")
_WORK = flags.DEFINE_string("work_dir", "runs/drafters_bench", "Finished cells (resume).")
_MEDUSA_TREES = flags.DEFINE_list("medusa_trees", ["chain", "4", "8", "16", "32", "64"],
                                  "Medusa trees: chain, or node counts (root included).")

_EAGLE = flags.DEFINE_string("eagle_dir", "", "A trained EAGLE-1 head (train_drafter.py's "
                             "workdir): adds EAGLE-1 chain / tree and EAGLE-2 rows.")
_EAGLE3 = flags.DEFINE_string("eagle3_dir", "", "A trained EAGLE-3 head: adds an EAGLE-3 row.")
_PARD = flags.DEFINE_string("pard_dir", "", "A PARD draft (the Chen run's draft_parallel/): "
                            "adds a PARD chain row.")
_EAGLE_DYN = flags.DEFINE_list("eagle_dynamic", ["4", "4", "16"],
                               "EAGLE-2 / EAGLE-3 dynamic tree: top_k, depth, nodes.")


def options() -> families.FamilyOptions:
  """The flags as `experiments.programs.families.FamilyOptions`."""
  return families.FamilyOptions(
      out_dir=_OUT.value, name="drafters", chen_dir=_CHEN.value, data_cache=_DATA.value,
      work_dir=_WORK.value, smoke=_SMOKE.value, prompts=_PROMPTS.value,
      prompt_len=_PROMPT_LEN.value, max_new=_MAX_NEW.value,
      batches=tuple(int(b) for b in _BATCHES.value),
      temperatures=tuple(float(t) for t in _TEMPS.value), tasks=tuple(_TASKS.value),
      gamma=_GAMMA.value, lookup_gamma=_LOOKUP_GAMMA.value, window=_WINDOW.value,
      sinks=_SINKS.value, skip_layers=_SKIP.value,
      lookahead=tuple(int(x) for x in _LA.value), medusa_dir=_MEDUSA.value,
      medusa_trees=tuple(_MEDUSA_TREES.value), eagle_dir=_EAGLE.value,
      eagle3_dir=_EAGLE3.value, pard_dir=_PARD.value,
      eagle_dynamic=tuple(int(x) for x in _EAGLE_DYN.value))


def main(argv):
  del argv
  families.run_options(options())

if __name__ == "__main__":
  app.run(main)
