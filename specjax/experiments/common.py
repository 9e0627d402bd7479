"""Pieces shared by the reproduction experiments (Leviathan T5, Chen Chinchilla).

* `Stages`: a results file of finished stages, written atomically, so a
  killed run resumes where it stopped and a rerun reuses everything;
* `enable_compilation_cache`: JAX's persistent compilation cache, so reruns
  skip XLA compilation;
* `train_or_restore`: train with `specjax.train.train_model` (which resumes
  from its own orbax checkpoints) unless final parameters already exist;
* `pad_batch`: token lists → right-padded `[B, P]` + lengths;
* `Progress`: absl logging of done/total with rate and ETA.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, Optional, Sequence

import jax
import numpy as np
from absl import logging

from specjax import atomic_io
from specjax.checkpoints.orbax_io import restore_params

__all__ = ["Stages", "enable_compilation_cache", "train_or_restore", "pad_batch", "Progress",
           "atomic_write_text"]


def atomic_write_text(text: str, path: str) -> None:
  """Writes `text` to `path` atomically (`specjax.atomic_io`; note the
  argument order, text first)."""
  atomic_io.atomic_write_text(path, text)


class Stages:
  """A JSON file of named, finished stage results (atomic, resumable)."""

  def __init__(self, path: str):
    self.path = path
    self.data: Dict[str, Any] = {}
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        self.data = json.load(f)

  def get(self, name: str) -> Optional[Any]:
    return self.data.get(name)

  def put(self, name: str, value: Any) -> Any:
    self.data[name] = value
    atomic_write_text(json.dumps(self.data, indent=1, sort_keys=True), self.path)
    return value

  def run(self, name: str, fn: Callable[[], Any]) -> Any:
    """Returns the stored result of `name`, or computes, stores and returns it."""
    if name in self.data:
      return self.data[name]
    return self.put(name, fn())


def enable_compilation_cache(directory: str) -> None:
  """Persists compiled XLA executables under `directory` (reruns skip compiles)."""
  os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def train_or_restore(model, source, train_config, workdir: str, *, teacher=None,
                     eval_dataset=None, init_params=None):
  """Final params from `workdir/final` if a finished run left them, else trains
  (resuming from the workdir's checkpoints)."""
  final = os.path.join(workdir, "final")
  if os.path.exists(os.path.join(final, "config.json")):
    params, _ = restore_params(final, model.config)
    logging.info("reusing trained parameters in %s", final)
    return params
  from specjax.train import train_model  # Imported late: pulls in optax/orbax.
  return train_model(model, init_params, source, train_config, workdir, teacher=teacher,
                     eval_dataset=eval_dataset)


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
