"""Pieces shared by the reproduction experiments (Leviathan T5, Chen Chinchilla).

* `Stages` (`experiments.programs.stages`): finished stages, one atomic file
  each, keyed by a fingerprint of what they depend on, so a killed run
  resumes where it stopped, a rerun reuses everything, and a retrained model
  recomputes exactly the stages that read it;
* `enable_compilation_cache`: JAX's persistent compilation cache, so reruns
  skip XLA compilation;
* `train_or_restore`: train with `specjax.training.train_model` (which resumes
  from its own orbax checkpoints) unless final parameters already exist; a
  damaged `final/` is set aside and rebuilt from the newest intact step
  checkpoint;
* `pad_batch`: token lists → right-padded `[B, P]` + lengths;
* `Progress`: absl logging of done/total with rate and ETA;
* `check_data_host`: before any work, a `DataHostError` naming what this host
  lacks to build the configured data (apt-get, root, ...) and the alternatives;
* `publish_results`: a reproduction's last step, results.json, the report and
  the scalars from process 0.
"""

from __future__ import annotations

import glob
import json
import os
import time
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from absl import logging

from specjax.atomic_io import as_path, atomic_write_bytes, atomic_write_json, is_local
from specjax.measure.provenance import provenance
from specjax.checkpoints.integrity import CheckpointError
from specjax.checkpoints.orbax_io import restore_params
from experiments.data import host_problems
from experiments.programs import placement
from experiments.programs.stages import Stages, array_digest, fingerprint
from specjax.tokenizers.sentencepiece import SentencePieceTokenizer
from specjax.training import default_config, train_model
from specjax.training.checkpoint import TRAIN_META, move_aside
from specjax.training.config import validate_config
from specjax.training.loop import meta_difference, quiet_orbax_info_logs, training_meta

__all__ = ["Stages", "enable_compilation_cache", "train_or_restore", "pad_batch", "Progress",
           "train_config", "find_tokenizer", "array_digest", "fingerprint",
           "checkpoint_fingerprint",
           "pretrained_dir", "DataHostError", "check_data_host", "publish_results"]


class DataHostError(RuntimeError):
  """The configured data cannot be built on this host (raised before any training)."""


def check_data_host(builds: Mapping[str, Mapping[str, Any]], cache_dir: str,
                    alternatives: str) -> None:
  """Raises `DataHostError` when a dataset of `builds` ({task: build_task options}, as the
  program will build them) is not in `cache_dir` yet and this host lacks what building it
  needs (`experiments.data.host_problems`: Debian's apt-get and files, or the Python packages
  holding German catalogs); the message names
  what is missing and `alternatives` (the config fields for other sources). Runs nothing."""
  missing = {task: host_problems(task, cache_dir, **opts) for task, opts in builds.items()}
  missing = {task: p for task, p in missing.items() if p}
  if not missing:
    return
  raise DataHostError(
      "the built-in default data (German gettext catalogs and package descriptions) is built "
      "the first time from this host's Debian catalogs (apt-get; `sudo apt-get update -o "
      "Acquire::Languages=en` once on a non-root host) or, where there are none, from the "
      "catalogs and READMEs inside installed Python packages (`pip install -e \".[experiments]\"` "
      "brings Django, Sphinx, plone.app.locales and JupyterLab's German language pack); it is "
      f"then cached in {os.path.abspath(cache_dir)}, which does not hold it yet. Missing here: "
      + "; ".join(f"{task}: {', '.join(p)}" for task, p in missing.items())
      + f". Nothing was trained. Alternatives: {alternatives}")


def train_config(section) -> Any:
  """The default training config (`specjax.training.default_config`) with a
  config section's fields set over it."""
  tc = default_config()
  for k, v in section.items():
    tc[k] = v
  return tc


def find_tokenizer(data_cache: str, prefix: str, vocab_size: int, workdir: str = ""):
  """`(tokenizer, path)` of a run's vocabulary: `<workdir>/results/results.json`
  → vocab.path if it names one, else the first `<data_cache>/vocab/<prefix>*`
  of this size; `(None, None)` when there is none."""
  hints = []
  try:  # the workdir may be gs://...; the data cache is local
    results = as_path(workdir or ".") / "results" / "results.json"
    hints.append(json.loads(results.read_text())["vocab"]["path"])
  except (OSError, KeyError, TypeError, ValueError):
    pass
  pattern = os.path.join(data_cache, "vocab", prefix + "*", "spiece.model")
  for path in hints + sorted(glob.glob(pattern)):
    if not os.path.exists(path):
      continue
    tok = SentencePieceTokenizer(path, require_t5_ids=False)
    if tok.vocab_size == vocab_size:
      return tok, path
  return None, None


def checkpoint_fingerprint(directory: str) -> str:
  """A cheap digest of a transformers-format checkpoint directory (its
  config.json's content and every weight / tokenizer file's name, size and
  mtime), so a 70B target is never read whole just to key the measurements."""
  files = []
  for name in sorted(os.listdir(directory)):
    path = os.path.join(directory, name)
    if name.endswith((".safetensors", ".bin", ".json", ".model")) and os.path.isfile(path):
      st = os.stat(path)
      files.append((name, st.st_size, int(st.st_mtime)))
  with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
    config = f.read()
  return fingerprint({"files": files, "config": config})


def pretrained_dir(cfg, field: str) -> str:
  """`cfg.models.<field>` checked to be a transformers-format checkpoint
  directory (a ValueError naming the config field otherwise)."""
  node, name = cfg.models, field
  if "." in field:  # e.g. "draft_dirs.small"
    head, name = field.rsplit(".", 1)
    for part in head.split("."):
      node = node[part]
  directory = node.get(name, "")
  if not directory:
    raise ValueError(f"config.models.{field} must name a local transformers-format checkpoint "
                     "directory (config.json + safetensors) for config.models.source='hf'")
  if not os.path.isfile(os.path.join(directory, "config.json")):
    raise FileNotFoundError(f"config.models.{field}={directory!r} holds no config.json")
  return directory


def open_workdir(path: str) -> str:
  """A run's workdir, created: an absolute local path, or a URL (gs://...) as given."""
  workdir = as_path(path)
  workdir.mkdir(parents=True, exist_ok=True)
  return str(workdir)


def copy_results(src_dir: str, dest_dir: str, names: Sequence[str] = ()) -> None:
  """Copies the files of `src_dir` (only `names`, when given) into `dest_dir`,
  each atomically; either may be local or gs://..."""
  src = as_path(src_dir)
  files = [src / n for n in names] if names else [f for f in src.iterdir() if f.is_file()]
  for f in files:
    atomic_write_bytes(as_path(dest_dir) / f.name, f.read_bytes())


def publish_results(results: dict, cfg, workdir: str, scalars, write_report) -> dict:
  """A reproduction's last step: `results` gains the config, the machine, the provenance
  record (`specjax.measure.provenance.provenance()`) and "_out_dir"
  (<workdir>/results); process 0 then writes the TensorBoard scalars (`scalars()`: {tag:
  value}), results.json (all but "_out_dir") and the report (`write_report(out_dir)`),
  copies them to `cfg.results_dir` when set and logs where they are. Returns `results`."""
  from experiments.programs import report  # Not at the top: report imports speed, which
                                           # imports this module.
  results["config"] = cfg.to_dict()
  results["machine"] = report.machine_info()
  results["provenance"] = provenance()
  out_dir = os.path.join(workdir, "results")
  results["_out_dir"] = out_dir
  if not placement.is_main_process():  # Only process 0 writes.
    return results
  placement.write_scalars(workdir, scalars())
  atomic_write_json(os.path.join(out_dir, "results.json"),
                    {k: v for k, v in results.items() if k != "_out_dir"}, indent=2)
  write_report(out_dir)
  if cfg.results_dir:
    copy_results(out_dir, cfg.results_dir)
  logging.info("results in %s", out_dir)
  return results


def enable_compilation_cache(directory: str) -> None:
  """Persists compiled XLA executables under `directory` (reruns skip compiles); JAX
  takes a gs://... directory as it is."""
  if is_local(directory):
    os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def train_or_restore(model, source, train_config, workdir: str, *, teacher=None,
                     eval_dataset=None, init_params=None):
  """Final params from `workdir/final` if a finished run left them, else trains
  (resuming from the workdir's checkpoints).

  `source` (and `eval_dataset`) may be zero-argument callables that build
  the data: they are called only when training is needed.

  A `final/` trained with other settings (model config, training trajectory
  fields, teacher) is a CheckpointError naming the field: delete the
  directory to retrain. A damaged `final/` (missing or truncated files,
  values that differ from their digest, an unreadable config.json) is moved
  aside (`final.corrupt-<time>`, logged) and rebuilt: training resumes from
  the newest intact step checkpoint and writes a new `final/`; nothing else
  is touched."""
  quiet_orbax_info_logs()  # orbax logs a dozen INFO lines per restore.
  final = str(as_path(workdir) / "final")  # local (absolute) or gs://...
  if as_path(final).exists():
    remedy = (f"Delete {os.path.dirname(final)} to train it again with the new settings (the "
              "measurements that read it are then recomputed, the others reused), or use "
              "a new workdir.")
    try:
      params, _ = restore_params(final, model.config)
    except CheckpointError as e:
      if e.kind == "config_mismatch":
        raise CheckpointError(final, e.kind, e.problem, remedy) from None
      move_aside(final, f"the trained parameters cannot be used: {e.problem}")
      logging.warning("recovering %s: training resumes from the newest intact step checkpoint "
                      "in %s and writes a new final/", final,
                      os.path.join(os.path.dirname(final), "checkpoints"))
    else:
      meta_path = os.path.join(final, TRAIN_META)
      stored = _read_train_meta(meta_path)
      if stored is not None:
        expected = training_meta(model, validate_config(train_config),
                                 teacher[0] if teacher is not None else None)
        expected.pop("model")  # Checked above, with compute-only fields ignored.
        diff = meta_difference(stored, expected)
        if diff is not None:
          raise CheckpointError(final, "config_mismatch",
                                f"it was trained with {diff[0]} = {diff[1]!r}, the config now "
                                f"asks for {diff[2]!r}", remedy)
      logging.info("reusing trained parameters in %s", final)
      return params
  source = source() if callable(source) else source
  eval_dataset = eval_dataset() if callable(eval_dataset) else eval_dataset
  return train_model(model, init_params, source, train_config, workdir, teacher=teacher,
                     eval_dataset=eval_dataset)


def _read_train_meta(path: str):
  """final/train_meta.json (local or gs://...), or None when absent (a final from before it
  existed) or unreadable (logged: the params themselves were verified)."""
  path = as_path(path)
  if not path.exists():
    return None
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (OSError, ValueError) as e:
    logging.warning("%s is unreadable (%s): the training settings of %s are not checked", path,
                    e, path.parent)
    return None


def pad_batch(sequences: Sequence[Sequence[int]], length: int, pad_id: int = 0):
  """Token lists → (int32 `[B, length]` right-padded, int32 `[B]` lengths).

  A sequence longer than `length` is a ValueError naming it."""
  out = np.full((len(sequences), length), pad_id, np.int32)
  lengths = np.zeros((len(sequences),), np.int32)
  for i, seq in enumerate(sequences):
    if len(seq) > length:
      raise ValueError(f"sequence {i} has {len(seq)} tokens, more than the bucket length {length}")
    if len(seq) == 0:
      raise ValueError(f"sequence {i} is empty")
    out[i, : len(seq)] = seq
    lengths[i] = len(seq)
  return out, lengths


class Progress:
  """Logs `label: done/total, rate, ETA` at most every `every_s` seconds."""

  def __init__(self, label: str, total: int, every_s: float = 20.0):
    self.label, self.total, self.every_s = label, max(int(total), 1), every_s
    self.start = self.last = time.time()
    self.done = 0

  def update(self, n: int = 1, note: str = "") -> None:
    self.done += n
    now = time.time()
    if now - self.last >= self.every_s or self.done >= self.total:
      self.last = now
      rate = self.done / max(now - self.start, 1e-9)
      eta = (self.total - self.done) / max(rate, 1e-9)
      logging.info("%s: %d/%d (%.2f/s, ETA %.0fs) %s", self.label, self.done, self.total, rate,
                   eta, note)
