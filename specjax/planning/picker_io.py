"""The picker's inputs from a results JSON (the families benchmark's `drafters.json` layout:
`{"tasks": {task: [cells]}}`, each cell one (batch, temperature) with a row per drafter).

  ms = measurements_from_json("drafters.json", "code", 1, 0.0)
  vc = verify_cost_from_json("drafters.json", "code", 1, 0.0)
  rec = specjax.planning.picker.pick(ms, vc, batch_size=1, ...)
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Union

import numpy as np

from specjax._checks import check_int, check_real
from specjax.planning.picker import BASELINE, COST_PER, FamilyMeasurement, VerifyCost

__all__ = ["measurements_from_json", "verify_cost_from_json"]


def _load(source: Union[str, os.PathLike, Mapping[str, Any]]) -> Mapping[str, Any]:
  if isinstance(source, Mapping):
    return source
  if not isinstance(source, (str, os.PathLike)):
    raise TypeError(f"source must be a path or a results dict, got {type(source).__name__}")
  with open(source, encoding="utf-8") as f:
    return json.load(f)


def _cell(source, task: str, batch: int, temperature: float) -> Mapping[str, Any]:
  results = _load(source)
  tasks = results.get("tasks")
  if not isinstance(tasks, Mapping):
    raise ValueError("the results have no 'tasks' mapping (expected the drafters.json layout "
                     "{'tasks': {task: [cells]}})")
  if task not in tasks:
    raise ValueError(f"task must be one of {sorted(tasks)}, got {task!r}")
  batch = check_int("batch", batch, 1)
  temperature = check_real("temperature", temperature, 0.0)
  cells = tasks[task]
  for cell in cells:
    if cell.get("batch") == batch and abs(float(cell.get("temperature", -1)) - temperature) < 1e-9:
      return cell
  have = sorted((c.get("batch"), c.get("temperature")) for c in cells)
  raise ValueError(f"task {task!r} has no cell at batch {batch}, temperature {temperature}; "
                   f"it has (batch, temperature) {have}")


def verify_cost_from_json(source, task: str, batch: int, temperature: float, *,
                          extrapolate: bool = False) -> VerifyCost:
  """V(T) from a results cell: each row's (call_tokens, call_cost).

  Rows sharing a call size share its measured cost (averaged if they differ).
  Args as `measurements_from_json`; `extrapolate` as in `VerifyCost`.
  """
  cell = _cell(source, task, batch, temperature)
  per: Dict[int, List[float]] = {}
  for row in cell["rows"]:
    if row.get("call_tokens") is not None and row.get("call_cost") is not None:
      per.setdefault(int(row["call_tokens"]), []).append(float(row["call_cost"]))
  return VerifyCost({t: float(np.mean(v)) for t, v in per.items()} or {1: 1.0},
                    extrapolate=extrapolate, batch=batch)


def measurements_from_json(source, task: str, batch: int, temperature: float, *,
                           derived_cost_per: str = "iteration") -> List[FamilyMeasurement]:
  """One `FamilyMeasurement` per drafter row of a results cell.

  Reads the cell at `batch` and `temperature` of `results["tasks"][task]`, every row but the
  autoregressive baseline:

  * τ = `tokens_per_call`; α = `alpha` (None stays None: τ is used);
  * shape: the row's `gamma` / `tree_nodes` if present; else a row with α is a chain with
    γ = call_tokens − 1, and a row without α keeps its measured call of `call_tokens` tokens
    (as tree_nodes: predicted from its measured τ and call only);
  * c: the row's `cost_ratio` if present (per token for a chain, else per iteration, or the
    row's `cost_per`); else derived from the measured speedup s and call cost V: an iteration
    takes τ / s target steps, so the draft takes τ / s − V (clipped at 0). That holds every
    per-iteration overhead, not only draft steps, so by default (`derived_cost_per="iteration"`)
    it stays per iteration and the family is predicted at its measured γ only (reproducing the
    measured speedup exactly). With "token" a chain with α gets c = (τ / s − V) / γ and its γ is
    searched, assuming all of that time scales with γ (optimistic for smaller γ);
  * `draft_params_bytes`, `draft_cache_bytes_per_token` when present (else None: unknown),
    `call_cost` as measured.

  Args:
    source: a path to the JSON or the loaded dict.
    task: the task name, e.g. "code".
    batch: the cell's batch size.
    temperature: the cell's temperature.
    derived_cost_per: "iteration" or "token", how a derived c is read (above).
  """
  if derived_cost_per not in COST_PER:
    raise ValueError(f"derived_cost_per must be one of {COST_PER}, got {derived_cost_per!r}")
  cell = _cell(source, task, batch, temperature)
  out = []
  for row in cell["rows"]:
    name = row.get("drafter") or row.get("family")
    if name == BASELINE:
      continue
    where = f"row {name!r} of task {task!r} (batch {batch}, temperature {temperature})"
    tau, alpha = row.get("tokens_per_call"), row.get("alpha")
    call_tokens, call_cost = row.get("call_tokens"), row.get("call_cost")
    gamma, tree = row.get("gamma"), row.get("tree_nodes")
    if gamma is None and tree is None:
      if call_tokens is None:
        raise ValueError(f"{where} has none of gamma, tree_nodes, call_tokens")
      if alpha is not None:
        gamma = int(call_tokens) - 1
      else:
        tree = int(call_tokens)
    if gamma is not None and tree is not None:
      tree = None  # both given: a chain
    c = row.get("cost_ratio")
    if c is not None:
      cost_per = row.get("cost_per") or ("token" if gamma is not None else "iteration")
    else:
      speedup = row.get("speedup")
      if speedup is None or call_cost is None or tau is None:
        raise ValueError(f"{where} has no cost_ratio and lacks speedup / call_cost / "
                         "tokens_per_call to derive it from")
      per_iteration = max(0.0, tau / speedup - call_cost)
      searchable = gamma is not None and alpha is not None
      cost_per = derived_cost_per if searchable else "iteration"
      c = per_iteration / gamma if cost_per == "token" else per_iteration
    out.append(FamilyMeasurement(
        family=name, cost_ratio=float(c), alpha=alpha, tau=tau, gamma=gamma, tree_nodes=tree,
        cost_per=cost_per, draft_params_bytes=row.get("draft_params_bytes"),
        draft_cache_bytes_per_token=row.get("draft_cache_bytes_per_token"),
        call_cost=call_cost, measured_speedup=row.get("speedup"), batch=batch,
        temperature=temperature))
  if not out:
    raise ValueError(f"task {task!r} at batch {batch}, temperature {temperature} has no "
                     "drafter rows")
  return out
