"""`train_model`: the training loop with exact resume.

  params = train_model(model, None, source, config, "/tmp/run")

runs `config.steps` optimizer steps (`specjax.training.config`), saving the full train state
every `config.checkpoint_every` steps (and at the last) with orbax. Called again with the same
arguments and workdir (after a kill, or `stop_at_step`) it restores the latest checkpoint and
continues: batch s is a pure function of (seed, s) (`batching`) and the state holds everything
else, so the run ends with the same parameters (bit for bit on CPU) as an uninterrupted one. A
finished run returns its parameters without training; resuming with a different model, teacher,
data or trajectory field is an error naming what changed.

No host sync per step: metrics stay on the device until a log step (`log_every`). The first
step (compilation) is timed separately.

Nothing is lost to a damaged checkpoint or a divergence (`checkpoint`, `nonfinite`): each step
checkpoint carries a digest verified on resume (a damaged step is moved aside and the newest
intact one used); before any metrics line, checkpoint or `final/` is written the steps' losses
and gradient norms are checked, a non-finite one stopping the run with a
`NonFiniteTrainingError` (or skipping the step: `config.on_nonfinite`); rotation never deletes
the newest verified checkpoint; and a resumed run first rewinds metrics.jsonl and TensorBoard to
the step it resumes from (`rewind`), so each step is logged once.

With `config.mesh_data` x `config.mesh_model` > 1 the step runs over that device mesh (batch
rows over `data`, params and optimizer state split over `model`: `specjax.training.mesh`);
checkpoints keep the single-device format and restore straight onto the mesh.
"""

from __future__ import annotations

import dataclasses
import json
import logging as py_logging
import math
import os
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np
from absl import logging

from specjax._clock import now
from specjax import atomic_io
from specjax._checks import check_int
from specjax.checkpoints.integrity import CheckpointError
from specjax.checkpoints.orbax_io import config_to_dict
from specjax.measure.tensorboard import ScalarWriter
from specjax.models.decoder import DecoderLM
from specjax.models.t5 import T5
from specjax.parallel.distributed import is_main_process
from specjax.training import batching, mesh as mesh_lib, steps as steps_lib
from specjax.training.checkpoint import Checkpointer, CheckpointWriteError, save_final_params
from specjax.training.config import trajectory_fields, validate_config
from specjax.training.nonfinite import NonFiniteGuard, NonFiniteTrainingError, train_step_for
from specjax.training.optim import OptimizerSpec
from specjax.training.parallel import ParallelObjective
from specjax.training.rewind import rewind_logs
from specjax.training.steps import StepSpec, TrainState, eval_step, init_state

__all__ = ["train_model", "evaluate_loss", "summarize_metrics", "quiet_orbax_info_logs",
           "training_meta", "meta_difference", "NonFiniteTrainingError", "CheckpointWriteError"]


class _DropOrbaxInfo(py_logging.Filter):
  """Drops orbax's INFO lines (dozens per checkpoint); its warnings pass."""

  def filter(self, record):
    return record.levelno >= py_logging.WARNING or "/orbax/" not in (record.pathname or "")


_ORBAX_FILTER = _DropOrbaxInfo()


def quiet_orbax_info_logs(quiet: bool = True) -> None:
  """Hides (or shows again) orbax's INFO logs on absl's logger, process-wide."""
  logger = py_logging.getLogger("absl")
  if quiet:
    if _ORBAX_FILTER not in logger.filters:
      logger.addFilter(_ORBAX_FILTER)
  else:
    logger.removeFilter(_ORBAX_FILTER)


def _model_format(model) -> Optional[str]:
  """"seq2seq" / "decoder" for the known model classes, None for others."""
  if isinstance(model, DecoderLM):
    return "decoder"
  return "seq2seq" if isinstance(model, T5) else None


def _model_meta(model) -> Any:
  config = getattr(model, "config", None)
  try:
    return config_to_dict(config)
  except TypeError:
    return {"class": f"{type(model).__module__}.{type(model).__qualname__}", "repr": repr(model)}


def _jsonable(x):
  return json.loads(json.dumps(x, default=str))


def _data_meta(mixture: batching.Mixture) -> dict:
  return _jsonable({
      "format": mixture.format,
      "row_spec": {k: [list(s), np.dtype(d).name] for k, (s, d) in mixture.row_spec.items()},
      "num_items": [s.num_items for s in mixture.sources],
      "weights": [round(float(w), 12) for w in mixture.weights],
  })


def summarize_metrics(sums: Mapping[str, float]) -> dict:
  """Token-weighted means from summed metrics (`token_losses`' sums)."""
  tokens = max(float(sums.get("tokens", 0.0)), 1.0)
  out = {"ce": sums["ce_sum"] / tokens, "accuracy": sums["correct"] / tokens,
         "tokens": float(sums.get("tokens", 0.0))}
  j = 1
  while f"slot{j}_tokens" in sums:  # PARD's mask slots: accuracy against the data
    n = max(float(sums[f"slot{j}_tokens"]), 1.0)
    out[f"slot{j}_accuracy"] = sums[f"slot{j}_correct"] / n
    j += 1
  if "kl_sum" in sums:
    out["kl"] = sums["kl_sum"] / tokens
    out["teacher_ce"] = sums["teacher_ce_sum"] / tokens
  return out


def evaluate_loss(spec: StepSpec, params, batches: Sequence[dict], teacher_params=None) -> dict:
  """Token-weighted CE / accuracy (and KL to the teacher) over fixed batches."""
  fn = eval_step(spec)
  parts = [fn(params, b, teacher_params) for b in batches]
  sums = {k: float(np.sum([float(p[k]) for p in parts])) for k in parts[0]}
  return summarize_metrics(sums)


def training_meta(model, config, teacher_model=None, mixture=None) -> dict:
  """What fixes the parameters a run ends with: the model and teacher configs, the training
  config's trajectory fields and (given `mixture`) the data's shape and weights. Stored with
  every checkpoint and with `final/`."""
  meta = {"model": _jsonable(_model_meta(model)),
          "teacher": _jsonable(_model_meta(teacher_model)) if teacher_model is not None else None,
          "train": _jsonable(trajectory_fields(config))}
  if mixture is not None:
    meta["data"] = _data_meta(mixture)
  return meta


def meta_difference(old: dict, new: dict) -> Optional[tuple]:
  """The first `(field, old value, new value)` where two `training_meta`s differ (in `new`'s
  sections only), or None. Fields are named down to two levels, e.g. "model.fields.d_model"."""
  for section in new:
    a, b = old.get(section), new[section]
    if a == b:
      continue
    field = section
    if isinstance(a, dict) and isinstance(b, dict):
      for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
          field, a, b = f"{section}.{k}", a.get(k), b.get(k)
          break
      if isinstance(a, dict) and isinstance(b, dict):  # One more level (config fields).
        for k in sorted(set(a) | set(b)):
          if a.get(k) != b.get(k):
            field, a, b = f"{field}.{k}", a.get(k), b.get(k)
            break
    return field, a, b
  return None


def _check_resume(meta: dict, expected: dict, directory: str, step: int) -> None:
  diff = meta_difference(meta, expected)
  if diff is not None:
    field, old, new = diff
    raise CheckpointError(
        os.path.join(directory, str(step)), "config_mismatch",
        f"cannot resume from it: {field} was {old!r}, now {new!r}",
        "Use the same settings, or a new workdir.")


class _Progress:
  """Accumulates device metrics; logs and writes them every `log_every` steps."""

  def __init__(self, workdir: str, log_every: int, end_step: int, positions_per_step: int):
    self.path = f"{workdir}/metrics.jsonl"
    self.log_every = log_every
    self.end_step = end_step
    self.positions_per_step = positions_per_step
    self.pending: list = []
    self.t0 = None
    self.steps_since = 0
    self.excluded = 0.0
    self.last_eval = None
    self.last: dict = {}
    self.tb = None

  def write(self, record: dict) -> None:
    """Appends `record` to metrics.jsonl and its numbers to TensorBoard (`<workdir>/tb`);
    process 0 only."""
    if not is_main_process():
      return
    atomic_io.append_text(self.path, json.dumps(record, sort_keys=True) + "\n")
    if self.tb is None:
      self.tb = ScalarWriter(self.path.rsplit("/", 1)[0] + "/tb")
    prefix = f"eval/{record['eval']}/" if "eval" in record else "train/"
    self.tb.write(int(record["step"]), {
        prefix + k: v for k, v in record.items()
        if k not in ("step", "eval") and isinstance(v, (int, float)) and not isinstance(v, bool)})
    self.tb.flush()

  def close(self) -> None:
    """Flushes and closes the TensorBoard events file (idempotent)."""
    if self.tb is not None:
      self.tb.close()
      self.tb = None

  def start_clock(self):
    self.t0 = now()
    self.steps_since = 0
    self.excluded = 0.0

  def exclude(self, seconds: float) -> None:
    """Time not to count in the throughput (validation)."""
    self.excluded += seconds

  def add(self, step: int, metrics, timed: bool = True) -> None:
    """Queues a step's device metrics; `timed=False` keeps it out of the rates."""
    self.pending.append((metrics, timed))
    self.steps_since += int(timed)
    if step % self.log_every == 0 or step == self.end_step:
      self.flush(step)

  def flush(self, step: int) -> None:
    if not self.pending:
      return
    fetched = jax.device_get([m for m, _ in self.pending])
    timed_tokens = float(sum(m["tokens"] for m, (_, t) in zip(fetched, self.pending) if t))
    self.pending = []
    applied = [m for m in fetched if not float(m.get("skipped", 0.0))]  # on_nonfinite=skip_step
    rec = {"step": step, "learning_rate": float(fetched[-1]["learning_rate"])}
    if applied:
      sums = {k: float(np.sum([m[k] for m in applied])) for k in applied[0]
              if k.endswith(("_sum", "_correct", "_tokens")) or k in ("correct", "tokens")}
      rec.update(loss=float(np.mean([m["loss"] for m in applied])),
                 grad_norm=float(np.mean([m["grad_norm"] for m in applied])))
      rec.update({f"train_{k}": v for k, v in summarize_metrics(sums).items()})
    if len(applied) < len(fetched):
      rec["skipped_steps"] = len(fetched) - len(applied)
    t = now()
    if self.t0 is not None and self.steps_since:
      dt = max(t - self.t0 - self.excluded, 1e-9)
      rec["steps_per_s"] = self.steps_since / dt
      rec["tokens_per_s"] = timed_tokens / dt
      rec["positions_per_s"] = self.steps_since * self.positions_per_step / dt
      rec["eta_s"] = (self.end_step - step) / rec["steps_per_s"]
    self.start_clock()
    self.last = rec
    self.write(rec)
    extra = ""
    if "steps_per_s" in rec:
      extra = (f" | {rec['tokens_per_s']:.0f} tok/s ({rec['positions_per_s']:.0f} pos/s)"
               f" | {rec['steps_per_s']:.2f} steps/s | ETA {rec['eta_s'] / 60:.1f} min")
    if not applied:
      logging.info("step %d/%d | every step since the last line skipped (non-finite)", step,
                   self.end_step)
      return
    kl = f" kl {rec['train_kl']:.4f}" if "train_kl" in rec else ""
    logging.info("step %d/%d | loss %.4f (ce %.4f%s, acc %.3f%s) | lr %.2e | gnorm %.3f%s", step,
                 self.end_step, rec["loss"], rec["train_ce"], kl, rec["train_accuracy"],
                 _slot_accuracies(rec, "train_"), rec["learning_rate"], rec["grad_norm"], extra)


def _slot_accuracies(res: Mapping[str, float], prefix: str = "") -> str:
  """", slots 0.41 / 0.22" for PARD's mask slots' accuracies, "" without."""
  accs = [v for k, v in res.items()   # in slot order (`summarize_metrics` adds them so)
          if k.startswith(f"{prefix}slot") and k.endswith("_accuracy")]
  return ", slots " + " / ".join(f"{a:.3f}" for a in accs) if accs else ""


def _positions_per_step(mixture: batching.Mixture, batch_size: int) -> int:
  spec = mixture.row_spec
  key = "decoder_inputs" if "decoder_inputs" in spec else "tokens"
  return batch_size * int(spec[key][0][0])


def train_model(model, init_params, dataset, config, workdir: str, teacher=None, *,
                eval_dataset=None, stop_at_step: Optional[int] = None):
  """Trains `model` and returns its parameters (see the module doc).

  Args:
    model: a `DecoderLM` or `T5` (any hashable object whose `forward` matches the batch layout:
      `forward(params, tokens)` or `forward(params, inputs, input_lengths, decoder_inputs)`).
    init_params: starting parameters, or None for `model.init(PRNGKey(seed))`; ignored when the
      workdir holds a checkpoint (the run resumes).
    dataset: a `batching.Source`, `Mixture` or `[(Source, weight), ...]`.
    config: a training ConfigDict (`default_config()`), validated here.
    workdir: checkpoints, metrics.jsonl, summary.json and final/ go here.
    teacher: `(teacher_model, teacher_params)` for distillation (needs config.distill_weight
      > 0; same vocabulary and batch layout).
    eval_dataset: a Source (or {name: Source}) for the validation loss on its first
      `eval_batches * batch_size` items.
    stop_at_step: stop (with a checkpoint) once this step is reached, as a preempted run
      would; calling again continues to config.steps.

  Returns:
    The parameters after `min(config.steps, stop_at_step)` steps (on a mesh: jax.Arrays split
    over it).
  """
  config = validate_config(config)
  mesh = mesh_lib.training_mesh(config.mesh_data, config.mesh_model)
  quiet_orbax_info_logs()
  mixture = batching.as_mixture(dataset)
  fmt = _model_format(model)
  if fmt is not None and fmt != mixture.format:
    raise ValueError(f"dataset rows are {mixture.format!r} but {type(model).__name__} needs "
                     f"{fmt!r} rows")
  teacher_model, teacher_params = None, None
  if config.distill_weight > 0:
    if teacher is None:
      raise ValueError(f"config.distill_weight is {config.distill_weight} but no teacher was "
                       "given; pass teacher=(model, params) or set distill_weight=0")
    teacher_model, teacher_params = teacher
    if teacher_model.vocab_size != model.vocab_size:
      raise ValueError(f"teacher vocab_size {teacher_model.vocab_size} != student vocab_size "
                       f"{model.vocab_size}")
    tfmt = _model_format(teacher_model)
    if tfmt is not None and tfmt != mixture.format:
      raise ValueError(f"the teacher {type(teacher_model).__name__} needs {tfmt!r} rows, the "
                       f"dataset has {mixture.format!r}")
  elif teacher is not None:
    logging.warning("a teacher was given but config.distill_weight = 0: it is not used")
  if stop_at_step is not None:
    stop_at_step = check_int("stop_at_step", stop_at_step, 1)
  end = config.steps if stop_at_step is None else min(config.steps, stop_at_step)

  parallel = None
  if config.parallel_slots:
    parallel = ParallelObjective(int(config.parallel_slots), int(config.parallel_mask_id),
                                 float(config.parallel_decay))
    parallel.check(model)
  spec = StepSpec(model=model, optimizer=OptimizerSpec.from_config(config), teacher=teacher_model,
                  distill_weight=float(config.distill_weight),
                  distill_temperature=float(config.distill_temperature), parallel=parallel)
  atomic_io.as_path(workdir).mkdir(parents=True, exist_ok=True)
  meta = training_meta(model, config, teacher_model, mixture)
  for k, s in enumerate(mixture.sources):
    logging.info("data source %d (%s, weight %.3f): %s", k, s.format, mixture.weights[k],
                 s.stats)

  ckpt = Checkpointer(workdir, config.keep_checkpoints, config.async_checkpointing)
  progress = None
  try:
    if init_params is None:
      init_params = steps_lib.init_params(model, config.seed)
    if mesh is not None:
      logging.info("training on a %d x %d (data x model) mesh", config.mesh_data,
                   config.mesh_model)
      init_params = mesh_lib.shard_tree(init_params, mesh)
      if teacher_params is not None:
        teacher_params = mesh_lib.shard_tree(teacher_params, mesh)
    state = init_state(spec, init_params, config.seed)
    if mesh is not None:
      state = mesh_lib.shard_state(state, mesh)
    had_checkpoints = ckpt.latest_step() is not None
    found = ckpt.restore_newest_intact(
        state.to_dict(), lambda m, step: _check_resume(m, meta, ckpt.directory, step))
    if found is not None:
      latest, restored = found
      state = TrainState.from_dict(restored)
      if mesh is not None:
        state = mesh_lib.shard_state(state, mesh)
      logging.info("resumed from the checkpoint at step %d in %s", latest, ckpt.directory)
    elif had_checkpoints:
      logging.warning("no intact checkpoint left in %s: training from step 0", ckpt.directory)
    start = int(state.step)
    if start > end:
      raise ValueError(f"the checkpoint is at step {start}, past the requested end {end}")
    if is_main_process():
      rewind_logs(workdir, start)  # the steps after `start` are logged again below

    eval_sets = {}
    if eval_dataset is not None and config.eval_batches:
      named = eval_dataset if isinstance(eval_dataset, Mapping) else {"validation": eval_dataset}
      eval_sets = {name: mesh_lib.shard_eval_batches(
          batching.eval_batches(src, config.batch_size, config.eval_batches), mesh)
                   for name, src in named.items()}
    progress = _Progress(workdir, config.log_every, end,
                         _positions_per_step(mixture, config.batch_size))

    def run_eval(step, params):
      for name, batches in eval_sets.items():
        t0 = now()
        res = evaluate_loss(spec, params, batches, teacher_params)
        rec = {"step": step, "eval": name, **{f"eval_{k}": v for k, v in res.items()}}
        progress.write(rec)
        progress.last_eval = rec
        logging.info("step %d | %s: ce %.4f (ppl %.4g), acc %.3f%s%s | %.1fs", step, name,
                     res["ce"], math.exp(min(res["ce"], 50.0)), res["accuracy"],
                     f", kl {res['kl']:.4f}" if "kl" in res else "", _slot_accuracies(res),
                     now() - t0)
        progress.exclude(now() - t0)

    if start == 0 and eval_sets:
      run_eval(0, state.params)  # The starting point (e.g. the KL to the teacher before).
    step_fn = train_step_for(spec, config.on_nonfinite, mesh, state)
    guard = NonFiniteGuard(
        config.on_nonfinite, config.max_skipped_steps,
        lambda: f"the step checkpoints in {ckpt.directory} are {ckpt.steps()}, the newest "
                "good one is where a rerun resumes")
    compile_s = None
    t_run = now()
    for step in range(start, end):
      batch = mixture.batch(config.seed, step, config.batch_size)
      if mesh is not None:
        batch = mesh_lib.shard_rows(batch, mesh)
      first = compile_s is None
      if first:
        t0 = now()
        state, metrics = step_fn(state, batch, teacher_params)
        jax.block_until_ready(metrics)
        compile_s = now() - t0
        logging.info("first step (compilation included): %.1fs", compile_s)
        progress.start_clock()
      else:
        state, metrics = step_fn(state, batch, teacher_params)
      done = step + 1
      guard.add(done, metrics)
      save_now = done % config.checkpoint_every == 0 or done == end
      eval_now = bool(eval_sets) and ((config.eval_every and done % config.eval_every == 0)
                                      or done == config.steps)
      if save_now or eval_now or done % config.log_every == 0:
        guard.check()  # before anything of these steps is written (NonFiniteTrainingError)
      progress.add(done, metrics, timed=not first)
      if save_now:
        ckpt.save(done, state.to_dict(), meta)  # refuses a non-finite state
      if eval_now:
        run_eval(done, state.params)
    guard.check()
    ckpt.wait()  # the last save complete (CheckpointWriteError if not), then rotation
    finished = int(state.step) == config.steps
    if finished:
      final = None
      if dataclasses.is_dataclass(getattr(model, "config", None)):
        final = save_final_params(workdir, state.params, model.config, meta,
                                  step=int(state.step))
      summary = {"step": int(state.step), "final_params": final,
                 "compile_s": compile_s, "wall_s_this_run": now() - t_run,
                 "steps_this_run": end - start, "last_train": progress.last,
                 "skipped_steps_this_run": guard.skipped_steps,
                 "last_eval": progress.last_eval,
                 "data": [s.stats.__dict__ for s in mixture.sources]}
      atomic_io.atomic_write_json(os.path.join(workdir, "summary.json"), summary, default=str)
    return state.params
  finally:
    ckpt.close()
    if progress is not None:
      progress.close()
