"""The training config (an ml_collections ConfigDict) and its validation.

`default_config()` lists every field with its default; `validate_config` checks a config
against it, raising ValueError / TypeError naming the field (an unknown field too, with the
closest known name), so a typo never trains silently with a default. The fields that change the
trajectory (all but `RUN_ONLY_FIELDS`) are stored with each checkpoint; resuming with a
different value is an error naming the field.

`on_nonfinite` says what a NaN / infinite loss or gradient norm does (`training.nonfinite`):
"stop" (the default: a `NonFiniteTrainingError` naming the step, the metric and its value,
before anything is written or rotated) or "skip_step" (the update is dropped and logged;
`max_skipped_steps` in a row stop the run). Both are run-only: a run stopped by a divergence may
be resumed with "skip_step" (a different compiled step: it continues within float rounding).
"""

from __future__ import annotations

import difflib
import math
from typing import Any

import ml_collections

from specjax.training.nonfinite import ON_NONFINITE
from specjax.training.optim import OPTIMIZERS, SCHEDULES
from specjax._checks import check_bool, check_int, check_real

__all__ = ["default_config", "validate_config", "RUN_ONLY_FIELDS", "trajectory_fields"]

# Fields that may differ between a run and its resumption (a run may resume on another mesh,
# continuing within float rounding: `specjax.training.mesh`).
RUN_ONLY_FIELDS = ("log_every", "eval_every", "eval_batches", "checkpoint_every",
                   "keep_checkpoints", "async_checkpointing", "mesh_data", "mesh_model",
                   "on_nonfinite", "max_skipped_steps")


def default_config() -> ml_collections.ConfigDict:
  """Every training field with its default (see the comments)."""
  c = ml_collections.ConfigDict()
  c.steps = 1000               # optimizer steps in the whole run
  c.batch_size = 16            # rows per step
  c.seed = 0                   # data order and init: a resumed run needs the same one
  c.optimizer = "adamw"        # "adamw" | "adafactor"
  c.learning_rate = 1e-3       # peak learning rate
  c.schedule = "cosine"        # "cosine" | "linear" | "inverse_sqrt" | "constant"
  c.warmup_steps = 100         # linear warmup from 0
  c.min_lr_ratio = 0.1         # final lr / peak lr (cosine, linear)
  c.weight_decay = 0.0         # AdamW: decoupled, matrices only
  c.b1 = 0.9
  c.b2 = 0.95
  c.eps = 1e-8
  c.grad_clip = 1.0            # global-norm clip; 0 disables
  c.distill_weight = 0.0       # loss = (1 - w) CE + w tau^2 KL(teacher || student)
  c.distill_temperature = 1.0  # tau
  # PARD (`training.parallel`): train `parallel_slots` mask slots (gamma - 1 for gamma); 0: none.
  c.parallel_slots = 0
  c.parallel_mask_id = 0       # the mask token (specjax's vocabularies: the pad id)
  c.parallel_decay = 0.8       # slot j's loss weight decay^j
  c.checkpoint_every = 500     # steps between orbax checkpoints (the last step always)
  c.keep_checkpoints = 2       # the last k are kept (and always the newest verified one)
  c.async_checkpointing = True
  c.log_every = 50             # steps between progress lines
  c.eval_every = 500           # steps between validation losses (0: only at the end)
  c.eval_batches = 8           # fixed validation batches (0: no validation)
  # A (data, model) device mesh for the train step (`training.mesh`); 1 x 1: one device.
  c.mesh_data = 1              # data-parallel ways; must divide batch_size
  c.mesh_model = 1             # ways each parameter / optimizer-state leaf is split
  # A NaN / infinite loss or gradient norm: "stop" (NonFiniteTrainingError, nothing written) |
  # "skip_step" (that update dropped, logged; `max_skipped_steps` in a row stop the run).
  c.on_nonfinite = "stop"
  c.max_skipped_steps = 10
  return c


_DEFAULTS = default_config()


_PARALLEL_FIELDS = ("parallel_slots", "parallel_mask_id", "parallel_decay")


def trajectory_fields(config) -> dict:
  """The fields that determine the parameters a run ends with (the PARD fields only when
  `parallel_slots` > 0, so runs stored without them still resume)."""
  skip = set(RUN_ONLY_FIELDS) | (set(_PARALLEL_FIELDS) if not config["parallel_slots"] else set())
  return {k: config[k] for k in sorted(_DEFAULTS) if k not in skip}


def _int(config, name, minimum):
  check_int(f"config.{name}", config[name], minimum)


def _num(config, name, lo=None, hi=None, lo_open=False, hi_open=False):
  check_real(f"config.{name}", config[name], -math.inf if lo is None else lo,
             math.inf if hi is None else hi, lo_open=lo_open, hi_open=hi_open)


def _choice(config, name, choices):
  v = config[name]
  if v not in choices:
    raise ValueError(f"config.{name} must be one of {choices}, got {v!r}")


def validate_config(config: Any) -> ml_collections.ConfigDict:
  """Checks a training config (ConfigDict or dict); returns it as a ConfigDict.

  Raises ValueError / TypeError naming the bad field."""
  if not isinstance(config, (ml_collections.ConfigDict, dict)):
    raise TypeError(f"config must be an ml_collections.ConfigDict, got {type(config).__name__}")
  keys = set(config.keys())
  unknown = sorted(keys - set(_DEFAULTS.keys()))
  if unknown:
    close = difflib.get_close_matches(unknown[0], list(_DEFAULTS.keys()), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"config.{unknown[0]} is not a training field{hint}; known: "
                     f"{sorted(_DEFAULTS.keys())}")
  missing = sorted(set(_DEFAULTS.keys()) - keys)
  if missing:
    raise ValueError(f"config.{missing[0]} is missing; start from "
                     f"specjax.training.default_config()")
  _int(config, "steps", 1)
  _int(config, "batch_size", 1)
  _int(config, "seed", 0)
  _choice(config, "optimizer", OPTIMIZERS)
  _num(config, "learning_rate", 0, None, lo_open=True)
  _choice(config, "schedule", SCHEDULES)
  _int(config, "warmup_steps", 0)
  if config["warmup_steps"] > config["steps"]:
    raise ValueError(f"config.warmup_steps ({config['warmup_steps']}) must not exceed "
                     f"config.steps ({config['steps']})")
  _num(config, "min_lr_ratio", 0, 1)
  _num(config, "weight_decay", 0)
  _num(config, "b1", 0, 1, hi_open=True)
  _num(config, "b2", 0, 1, hi_open=True)
  _num(config, "eps", 0, None, lo_open=True)
  _num(config, "grad_clip", 0)
  _num(config, "distill_weight", 0, 1)
  _num(config, "distill_temperature", 0, None, lo_open=True)
  _int(config, "parallel_slots", 0)
  _int(config, "parallel_mask_id", 0)
  _num(config, "parallel_decay", 0, 1, lo_open=True)
  _int(config, "checkpoint_every", 1)
  _int(config, "keep_checkpoints", 1)
  check_bool("config.async_checkpointing", config["async_checkpointing"])
  _int(config, "log_every", 1)
  _int(config, "eval_every", 0)
  _int(config, "eval_batches", 0)
  _int(config, "mesh_data", 1)
  _int(config, "mesh_model", 1)
  if config["on_nonfinite"] == "restore_lower_lr":
    raise ValueError("config.on_nonfinite='restore_lower_lr' is not implemented (the learning "
                     f"rate fixes the trajectory); use one of {ON_NONFINITE}, and for a lower "
                     "learning rate a new workdir")
  _choice(config, "on_nonfinite", ON_NONFINITE)
  _int(config, "max_skipped_steps", 0)
  if config["batch_size"] % config["mesh_data"]:
    raise ValueError(f"config.batch_size ({config['batch_size']}) must be divisible by "
                     f"config.mesh_data ({config['mesh_data']}): each data shard takes "
                     "batch_size / mesh_data rows")
  if isinstance(config, dict):
    config = ml_collections.ConfigDict(config)
  return config
