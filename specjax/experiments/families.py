"""The family comparison (configs/families.py): `specjax.bench.families` run
from a config, results into `<workdir>/results` and `results_dir`."""

from __future__ import annotations

import os
import shutil

from absl import logging

from specjax.bench.families import FamilyOptions, run as run_families

__all__ = ["options", "run"]


def options(cfg) -> FamilyOptions:
  """The config as `FamilyOptions` (a learned drafter whose directory does
  not exist is left out, with a warning naming it)."""
  dirs = {}
  for key in ("medusa_dir", "eagle_dir", "eagle3_dir"):
    d = cfg.get(key) or ""
    if d and not os.path.exists(d):
      logging.warning("%s=%s does not exist: its rows are left out (train it with "
                      "experiments/train_drafter.py)", key, d)
      d = ""
    dirs[key] = d
  return FamilyOptions(
      out_dir=os.path.join(cfg.workdir, "results"), name="families", chen_dir=cfg.chen_dir,
      data_cache=cfg.data_cache, work_dir=os.path.join(cfg.workdir, "cells"), smoke=cfg.smoke,
      prompts=int(cfg.prompts), prompt_len=int(cfg.prompt_len), max_new=int(cfg.max_new),
      batches=tuple(int(b) for b in cfg.batches),
      temperatures=tuple(float(t) for t in cfg.temperatures), tasks=tuple(cfg.tasks),
      gamma=int(cfg.gamma), lookup_gamma=int(cfg.lookup_gamma), window=int(cfg.window),
      medusa_trees=tuple(str(t) for t in cfg.medusa_trees),
      eagle_dynamic=tuple(int(x) for x in cfg.eagle_dynamic),
      eagle_tree_nodes=int(cfg.eagle_tree_nodes), **dirs)


def run(cfg) -> dict:
  """Measures (resuming finished cells) and writes families.{json,md}."""
  opts = options(cfg)
  results = run_families(opts)
  if cfg.get("results_dir"):
    os.makedirs(cfg.results_dir, exist_ok=True)
    name = opts.name + ("_smoke" if opts.smoke else "")
    for ext in (".json", ".md", ".png"):
      shutil.copyfile(os.path.join(opts.out_dir, name + ext),
                      os.path.join(cfg.results_dir, name + ext))
  return results
