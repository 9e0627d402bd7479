"""Walltime sweeps of autoregressive vs speculative decoding over real prompts.

`sweep` runs, for every batch of prompts (batch 1 in the papers' setting),
the autoregressive baseline and every (draft, γ) cell on the same prompts,
interleaved, so slow phases of a noisy machine hit all cells alike; the
order of the calls rotates from batch to batch (`call_order`), so no call
is always timed in the same place (with AR always first, right after the
last cell, every `auto` cell running AR's own program read 3-9% slower
than AR in a Leviathan `full` run).
Compilation happens once per cell before any timing. Results are stored per
chunk of prompts and per cell as `Stages`, keyed by the models' parameter
digests and the settings, so a killed run resumes, a rerun costs nothing,
and a retrained draft re-measures only its own cells. `summarize` turns the records into per-cell totals.

Speedup is measured per generated token: (AR seconds / AR tokens) /
(speculative seconds / speculative tokens); at temperature 0 both decoders
emit the same tokens, at temperature > 0 they sample different (equally
distributed) continuations — of different lengths, so on a few short
outputs the prefill's share of a token differs between the cells
(`matched_speedup` compares them at the same lengths; `cell_speedup` picks
it wherever it was measured: the one speedup reports print). `repeats` times
each call several times and keeps the median. `calibrate_drafts` measures the
`gamma="auto"` cost table of each draft once, for every sweep's auto cells.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax._checks import check_int
from specjax.adaptive import AdaptiveGamma
from specjax.calibration import calibrate_gamma_costs
from specjax.drafters.model import ModelDrafter
from specjax.measure.timing import interleaved_rounds, now
from experiments.programs.common import Progress
from experiments.programs.stages import Stages, array_digest
from specjax.generation import DecodeStats, EosIds

__all__ = ["sweep", "summarize", "cell_name", "matched_speedup", "cell_speedup",
           "calibrate_drafts", "AUTO_CELLS", "configured_auto_cells"]


AUTO_CELLS = ("auto", "auto_series")


def cell_name(draft: str, gamma) -> str:
  """"<draft>/g<γ>": γ an int, "auto" (`speculative_generate(gamma="auto")`,
  each call on its own) or "auto_series" (the prompts as one series: each
  call starts from the acceptance estimate the previous one returned)."""
  return f"{draft}/g{gamma}"


def configured_auto_cells(eval_cfg) -> list:
  """The `AUTO_CELLS` a config's eval section asks for: none unless `auto` is set, then
  `auto_cells` (default both: `gamma="auto"` per call, and the prompts as one series)."""
  if not eval_cfg.get("auto", False):
    return []
  autos = list(eval_cfg.get("auto_cells", AUTO_CELLS))
  unknown = [a for a in autos if a not in AUTO_CELLS]
  if unknown:
    raise ValueError(f"config.eval.auto_cells must name cells of {list(AUTO_CELLS)}, got "
                     f"{unknown}")
  return autos


def gamma_room(gammas: Sequence) -> int:
  """The largest γ the cells of `gammas` (ints and `AUTO_CELLS`) may draft:
  the caches' room."""
  return max([int(g) for g in gammas if g not in AUTO_CELLS]
             + ([AdaptiveGamma().max_gamma] if set(AUTO_CELLS) & set(gammas) else []))


def sweep_cache_len(target, drafts: Sequence[object], prompt_len: int, max_new_tokens: int,
                    gamma: int) -> int:
  """The cache buffer `sweep` gives every model: the largest that the target
  or any draft needs for these prompts, outputs and γ."""
  return max(specjax.required_cache_len(m, prompt_len, max_new_tokens, gamma)
             for m in [target, *drafts])


def sweep(target, target_params, drafts: Mapping[str, Tuple[object, object]],
          prompts_NP: np.ndarray, lengths_N: np.ndarray, *, gammas: Sequence[int],
          sampling: specjax.SamplingConfig, max_new_tokens: int, eos_id: EosIds, stages: Stages,
          prefix: str, fingerprints: Mapping[str, str], batch_size: int = 1, chunk: int = 25,
          seed: int = 0, keep_ar_tokens: bool = True, keep_cell_tokens: Sequence[str] = (),
          cache_gamma: int = 0, place=None, repeats: int = 1,
          gamma_costs: Optional[Mapping[str, Sequence[float]]] = None) -> List[dict]:
  """Measures AR and every (draft, γ) on all prompts; returns chunk records.

  Each record: {"ar": {...}, "cells": {cell_name: {...}}} with per-batch
  lists of seconds, generated tokens, target calls and accepted histograms;
  the cells named in `keep_cell_tokens` also keep their "outputs" (one token
  list per prompt, as the AR record does with `keep_ar_tokens`). The caches
  are sized for max(gammas, cache_gamma): a sweep over fewer γ with the same
  `cache_gamma` reuses another sweep's executables (same shapes).
  `place(prompts, lengths, keys)` → the same arrays placed where the
  decoding runs (e.g. `specjax.parallel.sharding.shard_batch` over a mesh's data
  axis); None leaves them on the default device. `repeats`: each call is
  timed this many times (AR and the cells interleaved) and its median kept.
  `gamma_costs`: {draft: its γ cost table} (`calibrate_drafts`), passed to
  the `AUTO_CELLS` of that draft as `speculative_generate(gamma_costs=)`, so
  no cell calibrates on its own; their stages are then keyed by the table.

  Every chunk stores AR and each cell as separate stages
  (`<prefix>/chunk<k>/ar`, `<prefix>/chunk<k>/<draft>/g<γ>`) keyed by the
  chunk's prompts, the decoding settings and the `fingerprints` of the
  models they ran ({"target": digest, <draft name>: digest, ...}: see
  `specjax.checkpoints.params_digest`). A chunk with some stages missing
  (a retrained draft, an unreadable file) measures only those again — AR is
  always rerun alongside, for its tokens, and its stored timing kept.
  """
  repeats = check_int("repeats", repeats, 1)
  n = (len(prompts_NP) // batch_size) * batch_size
  if n == 0:
    raise ValueError(f"need at least batch_size={batch_size} prompts, got {len(prompts_NP)}")
  missing = sorted({"target", *drafts} - set(fingerprints))
  if missing:
    raise ValueError(f"fingerprints must name every model of the sweep; missing {missing}")
  p = prompts_NP.shape[1]
  cache_len = sweep_cache_len(target, [d for d, _ in drafts.values()], p, max_new_tokens,
                              max(gamma_room(gammas), cache_gamma))
  common = dict(max_new_tokens=max_new_tokens, sampling=sampling, eos_id=eos_id, pad_id=0,
                cache_len=cache_len)

  def keys_for(start):
    return jnp.stack([jax.random.key(seed * 1_000_003 + start + r) for r in range(batch_size)])

  place = place or (lambda *arrays: arrays)  # e.g. rows over a mesh's data axis
  gamma_costs = {d: [float(c) for c in v] for d, v in (gamma_costs or {}).items()}

  def run_ar(x, l, k):
    x, l, k = place(x, l, k)
    return specjax.generate(target, target_params, x, l, key=k, **common)

  def run_sp(name, g, x, l, k, acceptance=None):
    model, params = drafts[name]
    x, l, k = place(x, l, k)
    return specjax.speculative_generate(target, target_params, model, params, x, l,
                                        gamma="auto" if g in AUTO_CELLS else g, key=k,
                                        acceptance=acceptance,
                                        gamma_costs=gamma_costs.get(name) if g in AUTO_CELLS
                                        else None, **common)

  cells = [(d, g) for d in drafts for g in gammas]
  batches = [(s, jnp.asarray(prompts_NP[s:s + batch_size]), jnp.asarray(lengths_N[s:s + batch_size]))
             for s in range(0, n, batch_size)]
  per_chunk = max(chunk // batch_size, 1)
  chunks = [batches[i:i + per_chunk] for i in range(0, len(batches), per_chunk)]
  base = {"target": fingerprints["target"], "sampling": dataclasses.asdict(sampling),
          "max_new_tokens": int(max_new_tokens),
          "eos_id": list(eos_id) if isinstance(eos_id, tuple) else eos_id, "seed": int(seed),
          "batch_size": int(batch_size), "cache_len": int(cache_len),
          "keep_ar_tokens": bool(keep_ar_tokens)}
  if repeats > 1:   # stages measured once keep their keys
    base["repeats"] = repeats
  plan = []  # Per chunk: (name, deps) of AR and every cell, and what is stored.
  for k, chunk_batches in enumerate(chunks):
    lo, hi = chunk_batches[0][0], chunk_batches[-1][0] + batch_size
    ar_deps = dict(base, prompts=array_digest(prompts_NP[lo:hi], lengths_N[lo:hi]))
    names = {"ar": (f"{prefix}/chunk{k}/ar", ar_deps)}
    for d, g in cells:
      names[cell_name(d, g)] = (f"{prefix}/chunk{k}/{cell_name(d, g)}",
                                dict(ar_deps, draft=fingerprints[d],
                                     gamma=g if g in AUTO_CELLS else int(g),
                                     keep_tokens=cell_name(d, g) in keep_cell_tokens,
                                     **({"chunk": k, "carried": True}
                                        if g == "auto_series" else {}),
                                     **({"gamma_costs": gamma_costs[d]}
                                        if g in AUTO_CELLS and d in gamma_costs else {})))
    stored = {key: stages.get(name, deps) for key, (name, deps) in names.items()}
    plan.append((names, stored))
  todo_cells = sorted({c for _, stored in plan for c, v in stored.items() if v is None} - {"ar"})
  todo_chunks = [k for k, (_, stored) in enumerate(plan) if any(v is None for v in stored.values())]
  if todo_chunks:
    # Compile AR and every cell to be measured once, outside the timings.
    s0, x0, l0 = batches[0]
    t0 = now()
    jax.block_until_ready(run_ar(x0, l0, keys_for(s0)))
    for d, g in cells:
      if cell_name(d, g) in todo_cells:
        if g != "auto_series":
          jax.block_until_ready(run_sp(d, g, x0, l0, keys_for(s0)))
          continue
        # A series' programs: drafting (a fresh estimate probes) and, where
        # an estimate that rejects everything leads there, plain decoding's.
        for start in (specjax.Acceptance.fresh(), specjax.Acceptance(
            np.zeros(2, np.float32), np.asarray([1e3, 0.0], np.float32))):
          jax.block_until_ready(run_sp(d, g, x0, l0, keys_for(s0), start))
    if len(todo_cells) == len(cells):
      stages.put(f"{prefix}/compile_s", now() - t0)
  progress = Progress(prefix, sum(len(chunks[k]) for k in todo_chunks))
  records = []
  # "auto_series" cells run the prompts as one series, in order: each call
  # starts from the estimate the previous one returned (stored with each
  # chunk, so a resumed sweep goes on from where it stopped).
  carried = {cell_name(d, g): specjax.Acceptance.fresh() for d, g in cells
             if g == "auto_series"}
  for k, chunk_batches in enumerate(chunks):
    names, stored = plan[k]
    if k in todo_chunks:
      todo = [(d, g) for d, g in cells if stored[cell_name(d, g)] is None]
      fresh = _measure_chunk(chunk_batches, todo, keys_for, run_ar, run_sp, keep_ar_tokens,
                             keep_cell_tokens, progress, repeats, carried, batch_size)
      for key, (name, deps) in names.items():
        if stored[key] is None:
          stored[key] = stages.put(name, fresh[key], deps)
          stages.computed.append(name)
        else:
          stages.reused.append(name)
    else:
      stages.reused.extend(name for name, _ in names.values())
    for name in carried:
      carried[name] = specjax.Acceptance(*(np.asarray(v, np.float32)
                                           for v in stored[name]["acceptance"]))
    records.append({"ar": stored["ar"], "cells": {cell_name(d, g): stored[cell_name(d, g)]
                                                  for d, g in cells}})
  return records


def _measure_chunk(chunk_batches, cells, keys_for, run_ar, run_sp, keep_ar_tokens: bool,
                   keep_cell_tokens: Sequence[str], progress, repeats: int = 1,
                   carried: Optional[Dict[str, object]] = None,
                   batch_size: int = 1) -> Dict[str, dict]:
  """AR and the given (draft, γ) cells on every batch of one chunk,
  interleaved batch by batch (each batch's calls in `repeats` interleaved
  rounds, the median kept; the same key gives the same tokens): {"ar":
  record, cell name: record}. The order of the calls rotates by one from one
  batch (and round) to the next (`call_order`), so that no cell is always
  timed right after the same other one. `carried`: the estimate
  each gamma="auto" cell's next call starts from (updated; its record
  keeps the last as "acceptance")."""
  carried = {} if carried is None else carried
  ar_rec = {"seconds": [], "tokens": [], "outputs": []}
  recs = {cell_name(d, g): {"seconds": [], "tokens": [], "target_calls": [], "hist": [],
                            "identical": []} for d, g in cells}
  for s, x, l in chunk_batches:
    keys = keys_for(s)

    def call(i):   # -1: AR; else the cell cells[i]
      if i < 0:
        return run_ar(x, l, keys)
      d, g = cells[i]
      return run_sp(d, g, x, l, keys, carried.get(cell_name(d, g)))
    order = call_order(len(cells), s // batch_size)
    timed = interleaved_rounds({i: functools.partial(call, i) for i in order}, repeats)
    outs = {i: (timed.last[i], timed.median(i)) for i in order}
    ar, t_ar = outs[-1]
    lens = np.asarray(ar.lengths)
    toks = np.asarray(ar.tokens)
    ar_rec["seconds"].append(t_ar)
    ar_rec["tokens"].append(int(lens.sum()))
    if keep_ar_tokens:
      ar_rec["outputs"].extend(toks[r, :lens[r]].tolist() for r in range(len(lens)))
    for i, (d, g) in enumerate(cells):
      name = cell_name(d, g)
      sp, t_sp = outs[i]
      c = recs[name]
      if name in carried:
        carried[name] = sp.stats.acceptance
        a = sp.stats.acceptance
        c["acceptance"] = [np.asarray(v).tolist() for v in (a.accepted_2, a.rejected_2)
                           + ((a.long_run_2,) if a.long_run_2 is not None else ())]
      c["seconds"].append(t_sp)
      c["tokens"].append(int(np.asarray(sp.lengths).sum()))
      c["target_calls"].append(int(np.asarray(sp.stats.target_calls).sum()))
      c["hist"].append(np.asarray(sp.stats.accepted_hist).sum(0).tolist())
      c.setdefault("drafted", []).append(int(np.asarray(sp.stats.drafted).sum()))
      if sp.stats.gamma_trace is not None:   # gamma="auto": how often each γ ran
        trace = np.asarray(sp.stats.gamma_trace)   # per-row mode: [B, I], one trace a row
        c.setdefault("gamma_trace", []).extend(
            t[t >= 0].tolist() for t in (trace if trace.ndim == 2 else trace[None]))
      c["identical"].append(bool(np.array_equal(np.asarray(sp.tokens), toks)))
      if cell_name(d, g) in keep_cell_tokens:
        sp_lens, sp_toks = np.asarray(sp.lengths), np.asarray(sp.tokens)
        c.setdefault("outputs", []).extend(
            sp_toks[r, :sp_lens[r]].tolist() for r in range(len(sp_lens)))
    progress.update(1)
  return {"ar": ar_rec, **recs}


def call_order(cells: int, batch: int) -> List[int]:
  """The order of one batch's calls: -1 (AR) then the cells 0 .. cells - 1,
  rotated left by `batch` (mod cells + 1). Over cells + 1 consecutive
  batches each call is timed once in every position, and its neighbours
  change: a call that runs faster right after another (a program or a
  model's weights still warm) favours no cell over the sweep."""
  order = [-1] + list(range(cells))
  k = batch % len(order)
  return order[k:] + order[:k]


def decode_ms_per_token(seconds: float, tokens: int, calls: int, prefill_s: float) -> float:
  """ms per generated token with the prompts' prefill subtracted: `calls`
  generate calls took `seconds` in all, each paying `prefill_s` up front."""
  return 1e3 * max(seconds - calls * prefill_s, 0.0) / tokens


def matched_speedup(ar: Mapping[str, float], cell: Mapping[str, float], calls: int,
                    cell_prefill_s: float) -> float:
  """The speedup at the AR cell's output lengths: AR's seconds over the
  cell's time to produce AR's number of tokens (its `calls` prefills, then
  its decode time per token, `decode_ms_per_token`). Equal to the per-token
  speedup where both emit as many tokens (greedy); at temperature > 0 it
  keeps the prefill's share of a token out of the comparison of sampled
  outputs of different lengths. `ar` / `cell`: "seconds" and "tokens"."""
  decode_s = decode_ms_per_token(cell["seconds"], cell["tokens"], calls, cell_prefill_s) / 1e3
  prefill_s = min(calls * cell_prefill_s, cell["seconds"])
  return float(ar["seconds"] / max(prefill_s + ar["tokens"] * decode_s, 1e-12))


def cell_speedup(cell: Mapping[str, float]) -> float:
  """The speedup of a cell, the one measure a report prints, ranks and publishes:
  `matched_speedup` (at the AR cell's output lengths) where the prefills were
  measured, else the per-token "speedup". Greedy cells emit AR's very tokens,
  where the two are equal; sampled ones emit outputs of other lengths, where
  only the matched one compares like with like."""
  return float(cell.get("matched_speedup", cell["speedup"]))


# The calibration a sweep's gamma="auto" cells share (`calibrate_drafts`): the library's
# defaults, 64 iterations x 5 rounds. Measured on the quick preset's shapes (random-init target
# with the small and the large draft, greedy and sampled, three tables each, on a loaded 2-core
# host), c(1)/c(0) spread over 1.6-4.4 at 64 x 5, 1.6-4.7 at 32 x 3 (one table with c(8) <
# c(4)) and 0.74-4.5 at 16 x 3 (one with c(1) < c(0)); measuring took 1.7-5.2 s of a table at
# 64 x 5 against 0.8-1.6 s at 32 x 3, compiling its branches 20-54 s. Fewer iterations save
# 1-4 s a table at no gain in noise: what saves is calibrating once per pair, not per cell.
CALIBRATION_ITERATIONS = 64
CALIBRATION_REPEATS = 5


def calibrate_drafts(target, target_params, drafts: Mapping[str, Tuple[object, object]], *,
                     prompt_len: int, cache_len: int, sampling: specjax.SamplingConfig,
                     stages: Stages, fingerprints: Mapping[str, str], batch_size: int = 1,
                     prefix: str = "calibration", iterations: int = CALIBRATION_ITERATIONS,
                     repeats: int = CALIBRATION_REPEATS) -> Dict[str, dict]:
  """One `gamma="auto"` cost table per draft model: `calibrate_gamma_costs` on the pair
  (target, draft) at these shapes, for `sweep(gamma_costs=)` to hand every auto cell of the
  draft (every task and temperature) instead of each cell calibrating its own (one table per
  model pair, Γ, batch, cache bucket and greedy-or-sampled). Each table is a stage
  (`<prefix>/<draft>`) keyed by both models' fingerprints, the shapes and the settings, kept
  out of the machine's store (the run's stages are its record).

  Returns {draft: {"gammas", "seconds" (per γ of the default Γ), "calibration_seconds" (when
  measured, compilation included), "reused" (True: read back from an earlier run)}}."""
  adaptive = AdaptiveGamma()
  out = {}
  for name, (model, params) in drafts.items():
    stage = f"{prefix}/{name}"
    deps = {"target": fingerprints["target"], "draft": fingerprints[name],
            "gammas": list(adaptive.gammas), "batch_size": int(batch_size),
            "prompt_len": int(prompt_len), "cache_len": int(cache_len),
            "greedy": bool(sampling.is_greedy), "iterations": int(iterations),
            "repeats": int(repeats)}
    def measure(model=model, params=params):
      table = calibrate_gamma_costs(target, target_params, ModelDrafter(model), params, adaptive,
                                    batch_size=batch_size, prompt_len=prompt_len,
                                    cache_len=cache_len, sampling=sampling,
                                    iterations=iterations, repeats=repeats, store=False)
      return {"gammas": list(table.gammas), "seconds": list(table.seconds),
              "calibration_seconds": float(table.calibration_seconds)}
    computed_before = len(stages.computed)
    stored = stages.run(stage, measure, deps)
    out[name] = dict(stored, reused=len(stages.computed) == computed_before)
  return out


def summarize(records: Sequence[dict]) -> Dict[str, dict]:
  """Per-cell totals: seconds, tokens, ms/token, speedup vs AR, tokens per
  iteration (from the histograms), acceptance, identical fraction."""
  ar_s = sum(sum(r["ar"]["seconds"]) for r in records)
  ar_tok = sum(sum(r["ar"]["tokens"]) for r in records)
  out = {"ar": {"seconds": ar_s, "tokens": ar_tok, "ms_per_token": 1e3 * ar_s / ar_tok}}
  for name in records[0]["cells"]:
    s = sum(sum(r["cells"][name]["seconds"]) for r in records)
    tok = sum(sum(r["cells"][name]["tokens"]) for r in records)
    hist = np.sum([h for r in records for h in r["cells"][name]["hist"]], axis=0)
    identical = [x for r in records for x in r["cells"][name]["identical"]]
    drafted = [x for r in records for x in r["cells"][name].get("drafted", [])]
    traces = [t for r in records for t in r["cells"][name].get("gamma_trace", [])]
    st = DecodeStats.from_histogram(hist, drafted)
    # gamma="auto": γ varies, acceptance is accepted / drafted; else α at the cell's γ.
    acceptance = st.alpha(None if drafted and traces else len(hist) - 1)
    out[name] = {
        "seconds": s, "tokens": tok, "ms_per_token": 1e3 * s / tok,
        "speedup": (ar_s / ar_tok) / (s / tok),
        "tokens_per_iteration": st.tokens_per_iteration if st.iterations else 1.0,
        "acceptance_rate": acceptance if np.isfinite(acceptance) else 0.0,
        "accepted_hist": hist.tolist(), "identical_fraction": float(np.mean(identical)),
        "target_calls": int(sum(sum(r["cells"][name]["target_calls"]) for r in records)),
    }
    if traces:
      chosen = np.concatenate([np.asarray(t, int) for t in traces])
      out[name]["gamma_counts"] = {str(v): int((chosen == v).sum()) for v in np.unique(chosen)}
      out[name]["gamma_traces"] = traces[:8]   # a few prompts' γ over time (for the plot)
  return out
