"""The long-context grid: AR and each draft decoding from one shared
prefill, per (context, batch, sampling setting); the components; the report.

Each cell is one stage (`<workdir>/stages/cells/...`), keyed by the models'
digests and the settings: a killed run resumes at the next cell.
"""

from __future__ import annotations

import json
import math
import os
from typing import Dict, List

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax import theory
from specjax.atomic_io import as_path, atomic_write_text
from specjax.checkpoints import params_digest
from specjax.drafters import PromptLookup, WindowedKV
from specjax.drafters.windowed import WindowedLM
from specjax.experiments.common import Progress
from specjax.experiments.report import machine_info, save, subplots
from specjax.experiments.stages import array_digest
from specjax.measure.provenance import provenance_sentence
from specjax.measure.timing import cache_step_times, now

__all__ = ["SETTINGS", "DRAFTS", "kv_bytes_per_position", "step_bytes", "component_times",
           "repo_prompts", "measure_cell", "measure_and_report", "crossovers", "render"]

SETTINGS = {"greedy": specjax.GREEDY, "t1": specjax.SamplingConfig(temperature=1.0)}
DRAFTS = {"lookup": "prompt lookup", "window": "windowed-KV self-draft",
          "small": "classic small draft"}
# MagicDec (arXiv 2408.11049), 8 x A100, self-speculation with a StreamingLLM draft.
MAGICDEC = [("LLaMA-2-7B-32K", "8k-32k", "32-256", "up to 2.0x"),
            ("LLaMA-3.1-8B", "32k-100k", "32-128", "up to 1.84x")]


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


def _drafters(cfg, target, tp, draft, dp, names=None, gamma=None):
  g = int(cfg.eval.gamma if gamma is None else gamma)
  out = {"lookup": (PromptLookup(max_ngram=int(cfg.eval.lookup_max_ngram), min_ngram=1), None),
         "window": (WindowedKV.of(target, window=int(cfg.eval.window),
                                  sinks=int(cfg.eval.sinks), gamma=g), None),
         "small": (draft, dp)}
  return {k: out[k] for k in (cfg.eval.drafts if names is None else names)}


def label(name: str) -> str:
  """"window" → "windowed-KV self-draft"; "window@2" → "... γ=2"."""
  base, _, g = name.partition("@")
  return DRAFTS[base] + (f" γ={g}" if g else "")


def parse_variant(text: str):
  """"window@2" → ("window", 2): a draft measured again at another γ."""
  base, sep, g = str(text).partition("@")
  if base not in DRAFTS or not sep or not g.isdigit() or int(g) < 1:
    raise ValueError(f"eval.variants entries must be <draft>@<gamma> with a draft in "
                     f"{sorted(DRAFTS)} and gamma >= 1, got {text!r}")
  return base, int(g)


def measure_cell(cfg, target, tp, drafts, prompts_RC: np.ndarray, batch: int,
                 setting: str, seed: int = 0, gamma: int = None) -> dict:
  """AR and every draft on `prompts_RC` in batches of `batch` rows, each
  batch prefilled once (timed, compilation excluded) and decoded by each
  decoder from a copy of that prefill (the first batch also once untimed,
  to compile). Returns seconds, tokens, target calls, accepted histograms
  and whether each draft's tokens equal AR's (greedy: must)."""
  sampling = SETTINGS[setting]
  gamma = int(cfg.eval.gamma if gamma is None else gamma)
  new = int(cfg.eval.max_new_tokens)
  r, c = prompts_RC.shape
  lengths = np.full((batch,), c, np.int32)
  rec = {"prefill_s": [], "ar": {"seconds": [], "tokens": []},
         **{d: {"seconds": [], "tokens": [], "target_calls": [], "hist": [], "identical": []}
            for d in drafts}}
  pre_fn = None
  for start in range(0, r - batch + 1, batch):
    x = jnp.asarray(prompts_RC[start:start + batch])
    keys = jnp.stack([jax.random.key(seed * 1_000_003 + start + i) for i in range(batch)])
    if pre_fn is None:  # compile the prefill without running it
      pre_fn = specjax.generation.run_prefill.lower(
          target, tp, sampling, x, jnp.asarray(lengths), keys,
          target.init_cache(batch, c + new + gamma)).compile()
    cache = target.init_cache(batch, c + new + gamma)
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

    for name in ["ar", *drafts]:
      if start == 0:
        run(name, pre)  # compile (untimed)
      sec, toks, lens, stats = run(name, pre)
      if name == "ar":
        ar_toks = toks
        rec["ar"]["seconds"].append(sec)
        rec["ar"]["tokens"].append(int(lens.sum()))
        continue
      e = rec[name]
      e["seconds"].append(sec)
      e["tokens"].append(int(lens.sum()))
      e["target_calls"].append(int(np.sum(stats.target_calls)))
      e["hist"].append(np.sum(stats.accepted_hist, axis=0).tolist())
      e["identical"].append(bool(np.array_equal(toks, ar_toks)))
    del pre
  return rec


def summarize_cell(rec: dict, gamma: int, batch: int) -> dict:
  """Speedups (decode only, and with the prefill), α, tokens per iteration
  and per target call, per draft; AR's seconds per decode step (its loop
  runs new − 1 target calls per batch: the first token is the prefill's)."""
  ar_s, pre_s = sum(rec["ar"]["seconds"]), sum(rec["prefill_s"])
  new = rec["ar"]["tokens"][0] // batch
  out = {"ar_ms_per_token": 1e3 * ar_s / sum(rec["ar"]["tokens"]), "prefill_s": pre_s,
         "ar_step_s": ar_s / (len(rec["ar"]["seconds"]) * max(new - 1, 1))}
  for name in [k for k in rec if k not in ("ar", "prefill_s")]:
    e = rec[name]
    s, hist = sum(e["seconds"]), np.sum(e["hist"], axis=0)
    iters = hist.sum()
    accepted = float((hist * np.arange(len(hist))).sum())
    out[name] = {
        "speedup": ar_s / s, "speedup_end_to_end": (ar_s + pre_s) / (s + pre_s),
        "alpha": accepted / (gamma * iters) if iters else 0.0,
        "tokens_per_iteration": float((hist * (np.arange(len(hist)) + 1)).sum() / iters)
        if iters else 1.0,
        "tokens_per_call": sum(e["tokens"]) / sum(e["target_calls"]),
        "identical": float(np.mean(e["identical"]))}
  return out


def crossovers(cells: List[dict], draft: str, setting: str) -> Dict[int, object]:
  """Per batch: the smallest context from which `draft`'s decode speedup
  stays above 1 (None: never in the grid)."""
  out = {}
  for b in sorted({c["batch"] for c in cells}):
    row = sorted((c for c in cells if c["batch"] == b and c["setting"] == setting
                  and draft in c["summary"]), key=lambda c: c["context"])
    found = None
    for i, c in enumerate(row):
      if all(r["summary"][draft]["speedup"] > 1.0 for r in row[i:]):
        found = c["context"]
        break
    out[b] = found
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


def render(res: dict) -> str:
  g = res["gamma"]
  drafts = list(res["drafts"]) + list(res.get("variants", []))
  lines = ["# Long contexts × batch: where speculative decoding pays on this CPU", "",
           f"{res['hardware']}. Command: `{res['command']}`"
           + provenance_sentence(res.get("machine", {})), "",
           f"Target {res['target_params'] / 1e6:.1f}M params ({res['weights_mb']:.0f} MB); "
           f"KV {res['kv_bytes_per_position'] / 1e3:.1f} KB per position and row. "
           f"γ = {g}; {res['max_new_tokens']} new tokens per row; self-draft window "
           f"{res['window']} + {res['sinks']} sinks. Speedup = AR decode time / speculative "
           "decode time from the same prefill (a draft model's own prefill counted); "
           "'e2e' adds the target's prefill to both; 'pred' = the speedup the components "
           "predict: τ · t_AR / (γ · t_draft + t_verify + t_AR − t_step), with τ the measured "
           "tokens per iteration, t_step / t_verify / t_draft in-graph component times, t_AR "
           "the AR loop's measured time per step (so t_AR − t_step is the loop's own work per "
           "iteration), prompt lookup's draft taken as free.", ""]
  for setting in res["settings"]:
    cells = [c for c in res["cells"] if c["setting"] == setting]
    if not cells:
      continue
    lines += [f"## {setting}", "",
              "| context | B | MB/step | step ms | verify/step | "
              + " | ".join(f"{label(d)}: α · tok/call · speedup (pred, e2e)" for d in drafts)
              + " |", "|---|---|---|---|---|" + "---|" * len(drafts)]
    for c in sorted(cells, key=lambda c: (c["context"], c["batch"])):
      comp = c["components"]
      parts = []
      for d in drafts:
        s = c["summary"].get(d)
        if s is None:
          parts.append("—")
          continue
        parts.append(f"{s['alpha']:.2f} · {s['tokens_per_call']:.2f} · **{s['speedup']:.2f}x** "
                     f"({s['predicted']:.2f}, {s['speedup_end_to_end']:.2f})"
                     + ("" if setting != "greedy" or s["identical"] == 1.0 else " NOT IDENTICAL"))
      lines.append(f"| {c['context']} | {c['batch']} | {c['step_mb']:.0f} | "
                   f"{1e3 * comp['step_s']:.2f} | {comp['verify_s'] / comp['step_s']:.2f} | "
                   + " | ".join(parts) + " |")
    lines += ["", "Crossover (smallest context from which the speedup stays > 1), per batch:", ""]
    for d in drafts:
      cx = crossovers(cells, d, setting)
      lines.append(f"- {label(d)}: " + ", ".join(
          f"B={b}: {v if v is not None else 'none'}" for b, v in cx.items()))
    lines.append("")
  lines += ["## Beside MagicDec", "",
            "| model | context | batch | speedup (8 x A100) |", "|---|---|---|---|"]
  lines += [f"| {m} | {c} | {b} | {s} |" for m, c, b, s in MAGICDEC]
  pairs = [c["summary"][d] for c in res["cells"] for d in drafts if d in c["summary"]]
  within = [p for p in pairs if abs(p["speedup"] / p["predicted"] - 1) <= 0.15]
  hits = [(c, d) for c in res["cells"] for d in drafts if d in c["summary"]
          and c["summary"][d]["speedup"] >= 1.5
          and abs(c["summary"][d]["speedup"] / c["summary"][d]["predicted"] - 1) <= 0.15]
  lines += ["", "## Goal", "",
            f"Measured within 15% of the components' prediction: {len(within)} of {len(pairs)} "
            "(cell, draft) pairs.", "",
            "≥ 1.5× walltime over AR at some (context, batch), within 15% of the prediction: "
            + ("**met** — " + "; ".join(
                f"{label(d)} at context {c['context']}, batch {c['batch']}, {c['setting']}: "
                f"{c['summary'][d]['speedup']:.2f}x (predicted {c['summary'][d]['predicted']:.2f}x)"
                for c, d in hits) if hits else "**not met**")]
  best = res.get("best")
  if best:
    lines += ["", f"Here: best {best['speedup']:.2f}x ({label(best['draft'])}, context "
                  f"{best['context']}, batch {best['batch']}, {best['setting']}), the components "
                  f"predicted {best['predicted']:.2f}x."]
  return "\n".join(lines) + "\n"


def plot(res: dict, path: str):
  """Speedup surface (decode, greedy): one heat map per draft, context × batch."""
  setting = "greedy" if "greedy" in res["settings"] else res["settings"][0]
  cells = [c for c in res["cells"] if c["setting"] == setting]
  ctx = sorted({c["context"] for c in cells})
  bs = sorted({c["batch"] for c in cells})
  drafts = list(res["drafts"]) + list(res.get("variants", []))
  fig, axes = subplots(1, len(drafts), figsize=(4.0 * len(drafts), 3.4), squeeze=False)
  for ax, d in zip(axes[0], drafts):
    grid = np.full((len(bs), len(ctx)), np.nan)
    for c in cells:
      if d in c["summary"]:
        grid[bs.index(c["batch"]), ctx.index(c["context"])] = c["summary"][d]["speedup"]
    im = ax.imshow(grid, cmap="RdYlGn", vmin=0.5, vmax=1.5, origin="lower", aspect="auto")
    for i in range(len(bs)):
      for j in range(len(ctx)):
        if not math.isnan(grid[i, j]):
          ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(ctx)), [str(x) for x in ctx])
    ax.set_yticks(range(len(bs)), [str(x) for x in bs])
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("batch")
    ax.set_title(f"{label(d)} ({setting})", fontsize=9)
  fig.subplots_adjust(left=0.05, right=0.9, bottom=0.16, top=0.9, wspace=0.3)
  fig.colorbar(im, cax=fig.add_axes([0.92, 0.16, 0.012, 0.74]), label="speedup over AR")
  return save(fig, path, tight=False)  # tight_layout would put the colorbar over a panel


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
      v_comp = stages.run(f"components/c{context}_b{batch}_g{v_gamma}", lambda: component_times(
          target, tp, draft if v_name == "small" else None, dp,
          WindowedLM(target, int(cfg.eval.window), int(cfg.eval.sinks), v_gamma + 1)
          if v_name == "window" else None, int(batch), int(context), v_gamma,
          int(cfg.eval.component_repeats)), dict(fps, gamma=v_gamma, window=int(cfg.eval.window)))
      v_sum = summarize_cell(v_rec, v_gamma, int(batch))
      summary[v] = v_sum[v]
      summary[v]["predicted"] = predicted(summary[v], v_sum["ar_step_s"], v_comp, v, v_gamma)
      summary[v]["verify_ratio"] = v_comp["verify_s"] / v_comp["step_s"]
    cells.append({"context": int(context), "batch": int(batch), "setting": setting,
                  "step_mb": step_bytes(target.config, int(batch), int(context)) / 1e6,
                  "components": comp, "summary": summary})
    progress.update(1, " ".join(f"{d} {summary[d]['speedup']:.2f}x" for d in summary
                                if isinstance(summary[d], dict)))
  names = list(drafts) + variants
  best = max(((c, d) for c in cells for d in names if d in c["summary"]),
             key=lambda cd: cd[0]["summary"][cd[1]]["speedup"], default=None)
  m = machine_info()
  res = {"hardware": f"{m['machine']}, {m['devices']}, jax {m['jax']}", "machine": m,
         "command": f"python experiments/long_context.py --config=configs/long_context.py:"
                    f"{cfg.preset} --config.workdir=<workdir>",
         "gamma": gamma, "max_new_tokens": int(cfg.eval.max_new_tokens),
         "window": int(cfg.eval.window), "sinks": int(cfg.eval.sinks),
         "settings": list(cfg.eval.settings), "drafts": list(drafts), "variants": variants,
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
