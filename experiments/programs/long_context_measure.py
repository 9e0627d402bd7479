"""The long-context grid: AR and each draft decoding from one shared
prefill, per (context, batch, sampling setting); the components
(`long_context_report` writes the report).

Each cell is one stage (`<workdir>/stages/cells/...`), keyed by the models'
digests and the settings: a killed run resumes at the next cell.
"""

from __future__ import annotations

import json
import math
import os
from typing import Dict

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax import theory
from specjax.atomic_io import as_path, atomic_write_text
from specjax.adaptive import DEFAULT_GAMMAS
from specjax.checkpoints import params_digest
from specjax.drafters import PromptLookup, WindowedKV
from specjax.drafters.windowed import WindowedLM
from experiments.programs.common import Progress
from experiments.programs.long_context_report import (AUTO, is_auto, parse_variant, plot,
                                                     render)
from experiments.programs.report import machine_info
from specjax.measure.provenance import provenance
from experiments.programs.speed import call_order
from experiments.programs.stages import array_digest
from specjax.generation import DecodeStats
from specjax.measure.timing import cache_step_times, now

__all__ = ["SETTINGS", "kv_bytes_per_position", "step_bytes", "component_times", "repo_prompts",
           "measure_cell", "summarize_cell", "measure_and_report"]

SETTINGS = {"greedy": specjax.GREEDY, "t1": specjax.SamplingConfig(temperature=1.0)}
# `gamma="auto"` entries ("<draft>@auto") size their caches for Γ's largest γ.
AUTO_ROOM = max(DEFAULT_GAMMAS)


# ----------------------------------------------------------------------------- cost model


def kv_bytes_per_position(config, dtype_bytes: int = 4) -> int:
  """Bytes of keys and values one cached position holds, all layers."""
  return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes


def step_bytes(config, batch: int, context: int, dtype_bytes: int = 4) -> int:
  """Bytes one decode step reads: the weights plus every row's KV cache."""
  return dtype_bytes * config.num_params() + batch * context * kv_bytes_per_position(
      config, dtype_bytes)


def component_times(target, tp, draft, dp, window, batch: int, context: int, gamma: int,
                    repeats: int) -> dict:
  """In-graph seconds of a target step (T = 1), a verify (T = γ+1), a
  windowed self-draft step and a small-draft step at `context` cached
  positions per row (`specjax.measure.timing.cache_step_times`)."""
  steps = max(4, min(32, 2 ** 19 // (context * batch)))  # ~0.5 s per timed call at most
  slots = context + gamma + 1
  tgt = cache_step_times(target, tp, batch, slots, context, (1, gamma + 1), steps=steps,
                         repeats=repeats)
  out = {"step_s": tgt[1], "verify_s": tgt[gamma + 1]}
  if window is not None:
    out["window_s"] = cache_step_times(window, tp, batch, window.slots,
                                       window.window + window.sinks, (1,), steps=steps,
                                       repeats=repeats)[1]
  if draft is not None:
    out["small_s"] = cache_step_times(draft, dp, batch, slots, context, (1,), steps=steps,
                                      repeats=repeats)[1]
  jax.clear_caches()
  return out


def repo_prompts(streams_tokens: Dict[str, np.ndarray], context: int, n: int,
                 continuation: int) -> np.ndarray:
  """`n` prompts `[n, context]`: windows of the packages' token streams,
  each followed by at least `continuation` tokens of its stream, taken
  round-robin over the packages long enough, at evenly spaced end points
  within each package (deterministic)."""
  need = context + continuation
  usable = {k: v for k, v in sorted(streams_tokens.items()) if len(v) >= need}
  if not usable:
    longest = max((len(v) for v in streams_tokens.values()), default=0)
    raise ValueError(f"no held-out package has context + continuation = {need} tokens "
                     f"(the longest has {longest}); hold out larger packages or shorten "
                     "the context")
  names = list(usable)
  per = {k: (n + len(names) - 1 - i) // len(names) for i, k in enumerate(names)}
  rows = {}
  for k, m in per.items():
    toks = usable[k]
    span = len(toks) - need
    rows[k] = [toks[e - context:e] for e in
               (context + (j + 1) * span // (m + 1) for j in range(m))]
  out = []
  for j in range(max(per.values())):  # round-robin: every batch mixes packages
    out.extend(rows[k][j] for k in names if j < len(rows[k]))
  return np.stack(out[:n]).astype(np.int32)


# ----------------------------------------------------------------------------- cells


def _copy(tree):
  out = jax.tree_util.tree_map(jnp.copy, tree)
  jax.block_until_ready(out)
  return out


def _room(gamma) -> int:
  """Draft slots a decoder at `gamma` (an int or "auto") needs."""
  return AUTO_ROOM if gamma == AUTO else int(gamma)


def _drafters(cfg, target, tp, draft, dp, names=None, gamma=None):
  g = _room(cfg.eval.gamma if gamma is None else gamma)
  out = {"lookup": (PromptLookup(max_ngram=int(cfg.eval.lookup_max_ngram), min_ngram=1), None),
         "window": (WindowedKV.of(target, window=int(cfg.eval.window),
                                  sinks=int(cfg.eval.sinks), gamma=g), None),
         "small": (draft, dp)}
  return {k: out[k] for k in (cfg.eval.drafts if names is None else names)}


def measure_cell(cfg, target, tp, drafts, prompts_RC: np.ndarray, batch: int,
                 setting: str, seed: int = 0, gamma: int = None) -> dict:
  """AR and every draft on `prompts_RC` in batches of `batch` rows, each
  batch prefilled once (timed, compilation excluded) and decoded by each
  decoder from a copy of that prefill, in an order rotating from batch to
  batch (the first batch also once untimed, to compile; with
  `gamma="auto"` it also measures the γ costs once, see
  `specjax.calibration`). Returns seconds, tokens, target calls, drafted
  tokens, accepted histograms, whether each draft's tokens equal AR's
  (greedy: must) and, with `gamma="auto"`, how many iterations ran each γ."""
  sampling = SETTINGS[setting]
  gamma = cfg.eval.gamma if gamma is None else gamma
  gamma = AUTO if gamma == AUTO else int(gamma)
  room = _room(gamma)
  new = int(cfg.eval.max_new_tokens)
  r, c = prompts_RC.shape
  lengths = np.full((batch,), c, np.int32)
  rec = {"prefill_s": [], "ar": {"seconds": [], "tokens": []},
         **{d: {"seconds": [], "tokens": [], "target_calls": [], "drafted": [], "hist": [],
                "identical": []} for d in drafts}}
  pre_fn = None
  for start in range(0, r - batch + 1, batch):
    x = jnp.asarray(prompts_RC[start:start + batch])
    keys = jnp.stack([jax.random.key(seed * 1_000_003 + start + i) for i in range(batch)])
    if pre_fn is None:  # compile the prefill without running it
      pre_fn = specjax.generation.run_prefill.lower(
          target, tp, sampling, x, jnp.asarray(lengths), keys,
          target.init_cache(batch, c + new + room)).compile()
    cache = target.init_cache(batch, c + new + room)
    t0 = now()
    pre = pre_fn(tp, x, jnp.asarray(lengths), keys, cache)
    jax.block_until_ready(pre)
    rec["prefill_s"].append(now() - t0)

    def run(name, pre):
      kw = dict(max_new_tokens=new, sampling=sampling, key=keys, prefilled=_copy(pre))
      t_start = now()
      if name == "ar":
        out = specjax.generate(target, tp, x, jnp.asarray(lengths), **kw)
      else:
        d, dp = drafts[name]
        out = specjax.speculative_generate(target, tp, d, dp, x, jnp.asarray(lengths),
                                           gamma=gamma, **kw)
      jax.block_until_ready(out.tokens)
      sec = now() - t_start
      res = (sec, np.asarray(out.tokens), np.asarray(out.lengths),
             jax.device_get(out.stats))
      del out
      return res

    names = list(drafts)
    outs = {}
    # AR and the drafts in an order rotating from batch to batch (`call_order`).
    for i in call_order(len(names), start // batch):
      name = "ar" if i < 0 else names[i]
      if start == 0:
        run(name, pre)  # compile (untimed)
      outs[name] = run(name, pre)
    sec, ar_toks, lens, _ = outs["ar"]
    rec["ar"]["seconds"].append(sec)
    rec["ar"]["tokens"].append(int(lens.sum()))
    for name in names:
      sec, toks, lens, stats = outs[name]
      e = rec[name]
      e["seconds"].append(sec)
      e["tokens"].append(int(lens.sum()))
      e["target_calls"].append(int(np.sum(stats.target_calls)))
      e["drafted"].append(int(np.sum(stats.drafted)))
      e["hist"].append(np.sum(stats.accepted_hist, axis=0).tolist())
      if stats.gamma_trace is not None:   # gamma="auto": iterations per chosen γ
        trace = np.asarray(stats.gamma_trace)
        counts = e.setdefault("gamma_counts", {})
        for g, k in zip(*np.unique(trace[trace >= 0], return_counts=True)):
          counts[str(int(g))] = counts.get(str(int(g)), 0) + int(k)
      e["identical"].append(bool(np.array_equal(toks, ar_toks)))
    del pre
  return rec


def summarize_cell(rec: dict, gamma, batch: int) -> dict:
  """Speedups (decode only, and with the prefill), α, tokens per iteration
  and per target call, per draft; AR's seconds per decode step (its loop
  runs new − 1 target calls per batch: the first token is the prefill's).
  α = accepted / (γ · iterations), and accepted / drafted tokens for
  `gamma="auto"` (`gamma`), whose entries also carry the iterations that
  ran each γ."""
  ar_s, pre_s = sum(rec["ar"]["seconds"]), sum(rec["prefill_s"])
  new = rec["ar"]["tokens"][0] // batch
  out = {"ar_ms_per_token": 1e3 * ar_s / sum(rec["ar"]["tokens"]), "prefill_s": pre_s,
         "ar_step_s": ar_s / (len(rec["ar"]["seconds"]) * max(new - 1, 1))}
  for name in [k for k in rec if k not in ("ar", "prefill_s")]:
    e = rec[name]
    s, st = sum(e["seconds"]), DecodeStats.from_histogram(e["hist"], e.get("drafted", []))
    # γ varies per iteration under "auto" (γ = 0 drafts nothing): count the drafts.
    alpha = st.alpha(None if gamma == AUTO else gamma)
    out[name] = {
        "speedup": ar_s / s, "speedup_end_to_end": (ar_s + pre_s) / (s + pre_s),
        "alpha": alpha if np.isfinite(alpha) else 0.0,
        "tokens_per_iteration": st.tokens_per_iteration if st.iterations else 1.0,
        "tokens_per_call": sum(e["tokens"]) / sum(e["target_calls"]),
        "identical": float(np.mean(e["identical"]))}
    if "gamma_counts" in e:
      out[name]["gamma_counts"] = dict(sorted(e["gamma_counts"].items(),
                                              key=lambda kv: int(kv[0])))
  return out


def predicted(summary: dict, ar_step_s: float, comp: dict, name: str, gamma: int) -> float:
  """The speedup the components predict for one draft of a cell:

    τ · t_AR / (γ · t_draft + t_verify + (t_AR − t_step))

  τ the measured tokens per iteration; t_step, t_verify, t_draft the
  in-graph component times (`component_times`; prompt lookup's draft taken
  as free); t_AR the AR loop's measured seconds per step, so t_AR − t_step
  is the loop's own work per iteration (sampling, commit, the while loop),
  taken as the same for a speculative iteration."""
  base = name.partition("@")[0]
  t_draft = {"lookup": 0.0, "window": comp.get("window_s", 0.0),
             "small": comp.get("small_s", 0.0)}[base]
  overhead = max(ar_step_s - comp["step_s"], 0.0)
  return float(theory.walltime_improvement_from_tokens(
      summary["tokens_per_iteration"], gamma, t_draft / ar_step_s,
      (comp["verify_s"] + overhead) / ar_step_s))


def measure_and_report(cfg, tok, streams, target, tp, draft, dp, workdir: str, stages) -> dict:
  """Every (context, batch, setting) cell of the config's grid — measured, or
  read back from its stage — with its components, predictions and variants;
  writes results.json / results.md / speedup_surface.png into
  `<workdir>/results` (and `cfg.results_dir`) and returns the results."""
  gamma = int(cfg.eval.gamma)
  drafts = _drafters(cfg, target, tp, draft, dp)
  window = WindowedLM(target, int(cfg.eval.window), int(cfg.eval.sinks), gamma + 1)
  fps = {"target": params_digest(tp), "draft": params_digest(dp)}
  base = dict(fps, gamma=gamma, max_new_tokens=int(cfg.eval.max_new_tokens),
              window=int(cfg.eval.window), sinks=int(cfg.eval.sinks),
              lookup=int(cfg.eval.lookup_max_ngram), drafts=list(drafts))
  todo = [(s, b, st) for s in cfg.eval.contexts for b in cfg.eval.batches
          for st in cfg.eval.settings
          if st == "greedy" or b in cfg.eval.get("sampled_batches", cfg.eval.batches)]
  variants = list(cfg.eval.get("variants", []))
  for v in variants:
    parse_variant(v)
  variant_contexts = set(int(x) for x in cfg.eval.get("variant_contexts", cfg.eval.contexts))
  auto_bases = list(cfg.eval.get("auto_drafts", []))
  autos = [f"{d}@{AUTO}" for d in auto_bases]
  for a in autos:
    parse_variant(a)
  progress = Progress("long-context cells", len(todo))
  cells = []
  for context, batch, setting in todo:
    rows = int(math.ceil(max(batch, int(cfg.eval.min_rows)) / batch)) * batch
    prompts = repo_prompts(streams, int(context), rows, int(cfg.eval.max_new_tokens))
    deps = dict(base, prompts=array_digest(prompts), batch=int(batch), setting=setting)
    name = f"cells/c{context}_b{batch}_{setting}"
    rec = stages.run(name, lambda: measure_cell(cfg, target, tp, drafts, prompts, int(batch),
                                                setting, cfg.seed), deps)
    comp = stages.run(f"components/c{context}_b{batch}", lambda: component_times(
        target, tp, draft if "small" in drafts else None, dp,
        window if "window" in drafts else None, int(batch), int(context), gamma,
        int(cfg.eval.component_repeats)), dict(fps, gamma=gamma, window=int(cfg.eval.window)))
    summary = summarize_cell(rec, gamma, int(batch))
    for d in drafts:
      summary[d]["predicted"] = predicted(summary[d], summary["ar_step_s"], comp, d, gamma)
    for v in (variants if int(context) in variant_contexts
              and setting in cfg.eval.get("variant_settings", cfg.eval.settings) else ()):
      v_name, v_gamma = parse_variant(v)
      v_drafts = {v: _drafters(cfg, target, tp, draft, dp, [v_name], v_gamma)[v_name]}
      v_rec = stages.run(f"{name}_{v_name}g{v_gamma}", lambda: measure_cell(
          cfg, target, tp, v_drafts, prompts, int(batch), setting, cfg.seed, v_gamma),
          dict(deps, drafts=[v], gamma=v_gamma))
      if v_gamma == AUTO:   # no single γ for the components to predict from
        summary[v] = dict(summarize_cell(v_rec, AUTO, int(batch))[v], predicted=None)
        continue
      v_comp = stages.run(f"components/c{context}_b{batch}_g{v_gamma}", lambda: component_times(
          target, tp, draft if v_name == "small" else None, dp,
          WindowedLM(target, int(cfg.eval.window), int(cfg.eval.sinks), v_gamma + 1)
          if v_name == "window" else None, int(batch), int(context), v_gamma,
          int(cfg.eval.component_repeats)), dict(fps, gamma=v_gamma, window=int(cfg.eval.window)))
      v_sum = summarize_cell(v_rec, v_gamma, int(batch))
      summary[v] = v_sum[v]
      summary[v]["predicted"] = predicted(summary[v], v_sum["ar_step_s"], v_comp, v, v_gamma)
      summary[v]["verify_ratio"] = v_comp["verify_s"] / v_comp["step_s"]
    if autos:   # every auto entry of the cell from one record (one AR beside them)
      a_drafts = {f"{d}@{AUTO}": m for d, m in
                  _drafters(cfg, target, tp, draft, dp, auto_bases, AUTO).items()}
      a_rec = stages.run(f"{name}_auto", lambda: measure_cell(
          cfg, target, tp, a_drafts, prompts, int(batch), setting, cfg.seed, AUTO),
          dict(deps, drafts=autos, gamma=AUTO))
      a_sum = summarize_cell(a_rec, AUTO, int(batch))
      for a in autos:
        summary[a] = dict(a_sum[a], predicted=None)
    cells.append({"context": int(context), "batch": int(batch), "setting": setting,
                  "step_mb": step_bytes(target.config, int(batch), int(context)) / 1e6,
                  "components": comp, "summary": summary})
    progress.update(1, " ".join(f"{d} {summary[d]['speedup']:.2f}x" for d in summary
                                if isinstance(summary[d], dict)))
  names = [n for n in list(drafts) + variants if not is_auto(n)]
  best = max(((c, d) for c in cells for d in names if d in c["summary"]),
             key=lambda cd: cd[0]["summary"][cd[1]]["speedup"], default=None)
  m = machine_info()
  res = {"hardware": f"{m['machine']}, {m['devices']}, jax {m['jax']}", "machine": m,
         "provenance": provenance(),
         "command": f"python experiments/long_context.py --config=configs/long_context.py:"
                    f"{cfg.preset} --config.workdir=<workdir>",
         "gamma": gamma, "max_new_tokens": int(cfg.eval.max_new_tokens),
         "window": int(cfg.eval.window), "sinks": int(cfg.eval.sinks),
         "settings": list(cfg.eval.settings), "drafts": list(drafts), "variants": variants,
         "auto": autos, "auto_gammas": list(DEFAULT_GAMMAS),
         "target_params": target.config.num_params(),
         "weights_mb": 4 * target.config.num_params() / 1e6,
         "kv_bytes_per_position": kv_bytes_per_position(target.config), "cells": cells,
         "train_s": {k: stages.get(f"timing/{k}") for k in ("train_target", "train_draft")}}
  if best:
    c, d = best
    res["best"] = {"draft": d, "context": c["context"], "batch": c["batch"],
                   "setting": c["setting"], "speedup": c["summary"][d]["speedup"],
                   "predicted": c["summary"][d]["predicted"]}
  out_dir = os.path.join(workdir, "results")
  dirs = [out_dir] + ([cfg.results_dir] if cfg.results_dir else [])
  for d in dirs:
    as_path(d).mkdir(parents=True, exist_ok=True)
    atomic_write_text(os.path.join(d, "results.json"), json.dumps(res, indent=1, default=float))
    atomic_write_text(os.path.join(d, "results.md"), render(res))
    plot(res, os.path.join(d, "speedup_surface.png"))
  res["_out_dir"] = out_dir
  return res
