"""Loading trained draft heads: Medusa heads and EAGLE heads.

`experiments/train_drafter.py` writes the heads to `<dir>/final` (orbax params, `config.json`,
Medusa's `accuracy.json`, EAGLE / PARD's per-depth `agreement.json`); these load from `<dir>` or
`<dir>/final`.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Tuple

import numpy as np

from specjax.atomic_io import as_path
from specjax.checkpoints.orbax_io import restore_params
from specjax.models.eagle_head import EagleConfig
from specjax.models.medusa_head import MedusaConfig

__all__ = ["final_dir", "load_medusa_heads", "load_eagle_head", "read_agreement"]


def final_dir(directory: str) -> str:
  """`directory` when it holds a saved model (`config.json`), else `directory/final`."""
  if (as_path(directory) / "config.json").exists():
    return directory
  return f"{directory}/final"


def load_medusa_heads(directory: str, *, strict: bool = False
                      ) -> Tuple[MedusaConfig, Dict[str, Any], Optional[np.ndarray]]:
  """(config, params, top-k accuracy `[K, R]` or None) from `<dir>` or `<dir>/final`.

  `strict`: as in `restore_params` (refuse heads saved without an integrity digest).

  Raises:
    ValueError: the directory holds another config, or `accuracy.json` is not
      {"topk_accuracy": [[fractions]]} (naming the file).
  """
  d = final_dir(directory)
  params, config = restore_params(d, strict=strict)
  if not isinstance(config, MedusaConfig):
    raise ValueError(f"{d} holds a {type(config).__name__}, not Medusa heads")
  acc = None
  path = as_path(d) / "accuracy.json"
  if path.exists():
    try:
      acc = np.asarray(json.loads(path.read_text())["topk_accuracy"], np.float64)
      if acc.ndim != 2 or not np.all((acc >= 0) & (acc <= 1)):
        raise ValueError(f"topk_accuracy of shape {acc.shape}")
    except (OSError, KeyError, TypeError, ValueError) as e:
      raise ValueError(f"{path}: not a record of top-k accuracy by head "
                       f"({{\"topk_accuracy\": [[fractions in [0, 1]]]}}): {e}") from e
  return config, params, acc


def load_eagle_head(directory: str, *, strict: bool = False) -> Tuple[EagleConfig, Dict[str, Any]]:
  """(config, params) of a trained EAGLE head from `<dir>` or `<dir>/final` (`strict`: as in
  `restore_params`)."""
  d = final_dir(directory)
  params, config = restore_params(d, strict=strict)
  if not isinstance(config, EagleConfig):
    raise ValueError(f"{d} holds a {type(config).__name__}, not an EAGLE head")
  return config, params


def read_agreement(directory: str) -> Optional[Tuple[float, ...]]:
  """The validation top-1 agreement with the target's argmax by draft depth that training
  recorded (`agreement.json`; entry 0: a first draft's greedy acceptance rate, teacher-forced),
  or None. E.g. `AdaptiveGamma(prior_alpha=read_agreement(dir)[0])`.

  Raises:
    ValueError: naming the file when it is unreadable or not a list of fractions in [0, 1].
  """
  path = as_path(final_dir(directory)) / "agreement.json"
  if not path.exists():
    return None
  try:
    values = tuple(float(v) for v in json.loads(path.read_text())["agreement_by_step"])
    if not values or not all(0.0 <= v <= 1.0 for v in values):
      raise ValueError(f"agreement_by_step {values}")
  except (OSError, KeyError, TypeError, ValueError) as e:
    raise ValueError(f"{path}: not a record of top-1 agreement by draft depth "
                     f"({{\"agreement_by_step\": [fractions in [0, 1]]}}): {e}") from None
  return values
