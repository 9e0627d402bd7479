"""Reading and writing transformers-format weights, without a hub.

* `load_state_dict(path)`: a `.safetensors` file, a sharded index
  (`model.safetensors.index.json`), a directory holding either, or a PyTorch `.bin` / `.pt`
  state dict (`torch.load(weights_only=True)`, never plain unpickling; the `[torch]` extra) →
  float32 numpy by name. Local paths or URLs (`gs://...`, `streaming.open_tensors`).
* `save_safetensors(tensors, path)`: writes one safetensors file atomically.
* `check_state_dict(expected_shapes, tensors)`: a ValueError naming missing, unexpected or
  mis-shaped tensors.
* `config_beside(path)`: the `config.json` of a checkpoint directory or of the folder holding a
  weights file, local or a URL; `read_json` reads it (`read_config_json`: a JSON object), a
  ValueError naming the file when it is not JSON.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, Mapping, Tuple

import numpy as np

from specjax.atomic_io import PathLike, as_path, atomic_path, is_local
from specjax.checkpoints import streaming

__all__ = ["load_state_dict", "save_safetensors", "check_state_dict", "read_json",
           "read_config_json", "config_beside", "make_directory"]


def load_state_dict(path: PathLike) -> Dict[str, np.ndarray]:
  """Transformers-format weights from a file or directory as whole float32 numpy arrays (the
  importers read lazily with `streaming.open_tensors` instead)."""
  tensors = streaming.open_tensors(path)
  return {name: np.array(tensors.read(name), np.float32) for name in tensors}


def save_safetensors(tensors: Mapping[str, np.ndarray], path: str,
                     metadata: Mapping[str, str] | None = None) -> None:
  """Writes `tensors` (contiguous numpy arrays) to `path` atomically."""
  from safetensors.numpy import save_file
  with atomic_path(path) as tmp:
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp,
              metadata=dict(metadata or {"format": "pt"}))


def check_state_dict(expected_shapes: Mapping[str, Tuple[int, ...]],
                     tensors: Mapping[str, np.ndarray],
                     optional: Iterable[str] = ()) -> None:
  """Raises ValueError naming every missing, unexpected or mis-shaped tensor.

  Names in `optional` may be absent or present (e.g. a tied lm_head copy).
  """
  optional = set(optional)
  missing = sorted(k for k in expected_shapes if k not in tensors and k not in optional)
  unexpected = sorted(k for k in tensors if k not in expected_shapes)
  misshaped = sorted(
      f"{k}: expected {tuple(expected_shapes[k])}, got {tuple(tensors[k].shape)}"
      for k in tensors if k in expected_shapes and tuple(tensors[k].shape) != tuple(expected_shapes[k]))
  problems = []
  if missing:
    problems.append(f"missing tensors: {', '.join(missing)}")
  if unexpected:
    problems.append(f"unexpected tensors: {', '.join(unexpected)}")
  if misshaped:
    problems.append(f"mis-shaped tensors: {'; '.join(misshaped)}")
  if problems:
    raise ValueError("checkpoint does not match the model config — " + " | ".join(problems))


def read_json(path: PathLike) -> Any:
  """The JSON value in the file `path` (local or a URL).

  Raises:
    ValueError: the file is not UTF-8 JSON; the message names the file (the JSON error is its
      `__cause__`).
  """
  try:
    return json.loads(as_path(path).read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{os.fspath(path)} is not valid JSON: {e}") from e


def read_config_json(path: PathLike) -> Dict[str, Any]:
  """The JSON object of a transformers `config.json` (`read_json`; a ValueError naming the file
  when it holds another JSON value)."""
  value = read_json(path)
  if not isinstance(value, dict):
    raise ValueError(f"{os.fspath(path)} must hold a JSON object (a transformers config), got "
                     f"{type(value).__name__} {str(value)[:60]}")
  return value


def config_beside(path: PathLike) -> str:
  """The path of the `config.json` that belongs to the checkpoint at `path`: inside it when it is
  a directory, else beside the file (local paths absolute; URLs kept as they are)."""
  p = as_path(path)
  folder = p if p.is_dir() else p.parent
  return os.fspath(folder / "config.json")


def make_directory(directory: PathLike) -> str:
  """Creates `directory` (and its parents) where it is missing; returns it as a string. URLs
  (`gs://...`) go through epath (an object store has no directories: nothing to create)."""
  directory = os.fspath(directory)
  if is_local(directory):
    os.makedirs(directory, exist_ok=True)
  else:
    as_path(directory).mkdir(parents=True, exist_ok=True)
  return directory


