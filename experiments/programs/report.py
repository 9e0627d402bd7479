"""Markdown tables, findings and plots for the reproductions."""

from __future__ import annotations

import os
import platform
import time
from typing import Dict

import jax
import numpy as np

from specjax.atomic_io import as_path, atomic_path, atomic_write_text
from experiments.programs.speed import AUTO_CELLS, cell_speedup
from specjax.measure.timing import now
from specjax.measure.provenance import machine_line, provenance_sentence

__all__ = ["machine_info", "write_leviathan", "plot_lines", "plot_bars", "hardware_line",
           "subplots", "save", "plot_gamma_traces"]


def machine_info() -> dict:
  """The run's machine and devices (the commit, versions and command are the result's
  "provenance" record, `specjax.measure.provenance.provenance()`)."""
  return {"machine": machine_line(), "python": platform.python_version(),
          "jax": jax.__version__, "backend": jax.default_backend(),
          "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}"
                     + (f" over {jax.process_count()} processes" if jax.process_count() > 1 else ""),
          "date": time.strftime("%Y-%m-%d %H:%M"),
          "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def hardware_line(results: dict) -> str:
  """"8 x TPU v4 (mesh data=1 x model=8, bfloat16) · " when the run names
  its devices and mesh (the paper presets), else ""."""
  m, mesh = results.get("machine", {}), results.get("mesh")
  if not m.get("devices"):
    return ""
  where = (f" (mesh data={mesh['data']} x model={mesh['model']}, {mesh['dtype']})"
           if mesh else "")
  return f"{m['devices']}{where} · "


def subplots(*args, figsize=None, **kwargs):
  """(fig, axes) like `pyplot.subplots`, on a bare `matplotlib.figure.Figure`:
  no pyplot, no backend chosen or switched (a notebook's inline plots keep
  working), nothing to close. `save(fig, path)` writes it; a notebook shows
  the returned figure with `display(fig)`."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=figsize)
  return fig, fig.subplots(*args, **kwargs)


def plot_lines(panels: Dict[str, Dict[str, tuple]], path: str, xlabel: str, ylabel: str,
               hline: float | None = None):
  """One subplot per panel; each panel maps a label to (xs, ys). Returns the Figure."""
  n = len(panels)
  fig, axes = subplots(1, n, figsize=(4.2 * n, 3.4), squeeze=False)
  for ax, (title, lines) in zip(axes[0], panels.items()):
    for label, (xs, ys) in lines.items():
      ax.plot(xs, ys, marker="o", label=label)
    if hline is not None:
      ax.axhline(hline, color="grey", lw=0.8, ls="--")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  return save(fig, path)


def save(fig, path: str, tight: bool = True):
  """Writes `fig` (a `subplots` Figure) to `path` atomically, its format from
  the extension (110 dpi, `tight_layout` unless `tight=False`); returns `fig`."""
  if tight:
    fig.tight_layout()
  with atomic_path(path) as tmp:  # the temporary name keeps the extension: the format
    fig.savefig(tmp, dpi=110)
  return fig


def plot_gamma_traces(results: dict, drafts, path: str) -> None:
  """The γ `gamma="auto"` chose at each iteration, per task / temperature
  panel and draft: over the first prompts of the series cell (one after the
  other: its probes show) where measured, else of the first prompt."""
  panels = {}
  for task, tr in results["tasks"].items():
    for t, te in tr["temperatures"].items():
      lines = {}
      for d in drafts:
        series = te["cells"].get(f"{d}/gauto_series", {}).get("gamma_traces")
        single = te["cells"].get(f"{d}/gauto", {}).get("gamma_traces") or [[]]
        trace = [g for tr_ in series for g in tr_] if series else single[0]
        lines[d] = (list(range(1, len(trace) + 1)), trace)
      panels[f"{task}, T={t}"] = lines
  plot_lines(panels, path, "iteration (the series' first prompts, in order)", "γ chosen",
             None)


def plot_bars(groups: Dict[str, Dict[str, float]], path: str, ylabel: str):
  """Grouped bars: groups (x positions) × series. Returns the Figure."""
  import numpy as np
  names = list(groups)
  series = list(next(iter(groups.values())))
  fig, ax = subplots(figsize=(1.6 + 1.3 * len(names), 3.4))
  width = 0.8 / len(series)
  for i, s in enumerate(series):
    ax.bar(np.arange(len(names)) + i * width, [groups[g][s] for g in names], width, label=s)
  ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2)
  ax.set_xticklabels(names, fontsize=8)
  ax.set_ylabel(ylabel)
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3, axis="y")
  return save(fig, path)


def _by_size(results, drafts) -> list:
  """The drafts, smallest first (by parameter count where known)."""
  params = results.get("params", {})
  return sorted(drafts, key=lambda d: (params.get(d, 0), list(drafts).index(d)))


def _mark(holds: int, total: int) -> str:
  """"✓" where a finding holds in every case checked, else "✗ k/N"."""
  return "✓" if total and holds == total else f"✗ {holds}/{total}"


def _findings(results) -> list:
  """Leviathan et al.'s findings, each one checked line with the numbers it rests on."""
  lines = []
  tasks = results["tasks"]
  drafts = _by_size(results, results["config"]["eval"]["drafts"])
  gammas = list(results["config"]["eval"]["gammas"])
  cases = [(task, t, te) for task, tr in tasks.items() for t, te in tr["temperatures"].items()]

  # α grows with draft size (paper: every row of Table 2).
  detail, holds = [], 0
  for task, t, te in cases:
    a = [te["alpha"][d] for d in drafts]
    ok = all(x < y for x, y in zip(a, a[1:]))
    holds += ok
    detail.append(f"{task} T={t}: " + (" < " if ok else ", ").join(
        f"{d} {x:.2f}" for d, x in zip(drafts, a)))
  lines.append(f"- {_mark(holds, len(cases))} **α grows with draft size** (per task × "
               f"temperature): " + "; ".join(detail) + ".")

  # The best γ grows with α (across drafts and temperatures, per task).
  detail, holds = [], 0
  for task, tr in tasks.items():
    pts = sorted((te["alpha"][d], te["best"][d]["gamma"]) for te in tr["temperatures"].values()
                 for d in drafts)
    g = [p[1] for p in pts]
    ok = all(x <= y for x, y in zip(g, g[1:])) and g[-1] > g[0]
    holds += ok
    detail.append(f"{task}: " + ", ".join(f"α {a_:.2f} → γ {g_}" for a_, g_ in pts)
                  + ("" if ok else " (flat)" if len(set(g)) == 1 else " (not monotone)"))
  lines.append(f"- {_mark(holds, len(tasks))} **the best γ grows with α** (across drafts and "
               f"temperatures, per task; γ from {gammas}): " + "; ".join(detail) + ".")

  # The largest draft is not the fastest (its draft step costs more: c).
  largest = drafts[-1]
  detail, holds = [], 0
  for task, t, te in cases:
    comp = tasks[task]["components"]
    c = {d: comp[d]["1"] / comp["target"]["1"] for d in drafts}
    fastest = max(drafts, key=lambda d: cell_speedup(te["best"][d]))
    b, bl = te["best"][fastest], te["best"][largest]
    holds += fastest != largest
    detail.append(f"{task} T={t}: fastest {fastest} {cell_speedup(b):.2f}x at γ={b['gamma']} "
                  f"(c {c[fastest]:.3f})" + ("" if fastest == largest else
                                             f", {largest} {cell_speedup(bl):.2f}x at "
                                             f"γ={bl['gamma']} (c {c[largest]:.3f})"))
  lines.append(f"- {_mark(holds, len(cases))} **the largest draft ({largest}) is not the "
               f"fastest** (c: draft step / target step): " + "; ".join(detail) + ".")

  # α at temperature 0 above α at temperature 1 (paper: every pair of Table 2's rows).
  pairs = [(task, d, tr["temperatures"]["0"]["alpha"][d], tr["temperatures"]["1"]["alpha"][d])
           for task, tr in tasks.items() if {"0", "1"} <= set(tr["temperatures"])
           for d in drafts]
  if pairs:
    holds = sum(a0 > a1 for _, _, a0, a1 in pairs)
    lines.append(f"- {_mark(holds, len(pairs))} **α at T=0 above α at T=1** (per task × "
                 "draft): " + ", ".join(f"{task} {d} {a0:.2f} vs {a1:.2f}"
                                        for task, d, a0, a1 in pairs) + ".")

  # Leviathan's formula with the measured α, c and verify cost, against decode-only.
  ratios = sorted(c["decode_speedup"] / c["predicted_from_alpha_verify"]
                  for _, _, te in cases for k, c in te["cells"].items()
                  if "decode_speedup" in c and "predicted_from_alpha_verify" in c)
  if ratios:
    within = sum(abs(r - 1) <= 0.15 for r in ratios)
    lines.append(f"- {_mark(within, len(ratios))} **Leviathan's formula predicts the speedup** "
                 "(1−α^{γ+1})/((1−α)(γc+v_γ)) with the measured α, c and verify cost v_γ, "
                 "against the measured decode-only speedup: within 15% in "
                 f"{within}/{len(ratios)} cells (measured / predicted: median "
                 f"{np.median(ratios):.2f}, range {ratios[0]:.2f}–{ratios[-1]:.2f}).")

  cells = [c for _, _, te in cases for k, c in te["cells"].items() if k != "ar"]
  for key, what, kind in (("measured_over_predicted", "end-to-end speedup", "end-to-end"),
                          ("decode_over_predicted", "decode-only speedup", "decode-only")):
    ratios = sorted(c[key] for c in cells if key in c)
    if ratios:
      within = sum(abs(r - 1) <= 0.15 for r in ratios)
      lines.append(f"- measured {what} / its prediction from the component times ({kind}): "
                   f"median {np.median(ratios):.2f} (range {ratios[0]:.2f}–{ratios[-1]:.2f}), "
                   f"within ±15% in {within}/{len(ratios)} cells.")
  return lines


def _time_split_line(results) -> str:
  """One line: where the run's time went (`results["time_split_s"]`), reused stages named."""
  sec, status = results["time_split_s"], results.get("time_split_status", {})

  def part(key, label):
    note = status.get(key)
    return f"{label} {sec[key]:.1f}" + (f" ({note})" if note and note != "computed" else "")
  cal = results.get("calibration", {})
  cal_note = ""
  if cal:
    cal_note = " (" + ", ".join(
        f"{d} reused" if v.get("reused") else "%s %.1f" % (d, v["calibration_seconds"])
        for d, v in cal.items()) + ")"
  parts = [part("data", "data & vocabulary"), part("training", "training"),
           f"calibration {sec.get('calibration', 0.0):.1f}" + (cal_note if cal else " (none)"),
           part("measurement", "measurement") + " [" + ", ".join(
               part(f"measurement/{p}", label) for p, label in (
                   ("components", "components"), ("prefill", "prefill"), ("alpha", "α"),
                   ("sweep", "sweep")) if f"measurement/{p}" in sec) + "]"]
  if "report" in sec:
    parts.append(f"report {sec['report']:.1f}")
  parts.append(f"other {sec.get('other', 0.0):.1f}")
  return (f"Time split of this run (s, {sec['total']:.0f} in all; a stage read back from an "
          "earlier run says reused, its seconds the reading): " + " · ".join(parts) + ".")


def _x(v) -> str:
  return "—" if v is None else f"{v:.2f}x"


def _decode(cell) -> str:
  return f"{cell['decode_speedup']:.2f}x" if "decode_speedup" in cell else "—"


def write_leviathan(results, out_dir, paper2, paper3, tasks_meta) -> None:
  """results.md + speedup_vs_gamma.png + alpha.png (`out_dir` local or gs://...).

  Every speedup it prints, ranks or plots is `cell_speedup`'s. With results["time_split_s"]
  (`leviathan.run`) it adds the report's own seconds there ("report", and to "total") and
  prints the split as one line."""
  t_report = now()
  as_path(out_dir).mkdir(parents=True, exist_ok=True)
  cfg = results["config"]
  drafts = list(cfg["eval"]["drafts"])
  gammas = list(cfg["eval"]["gammas"])
  params = results["params"]
  m = results["machine"]
  lines = [
      "# Leviathan et al. 2023 on this machine: T5 v1.1 target, three drafts", "",
      f"Preset `{cfg['preset']}` · {m['machine']} · {hardware_line(results)}JAX {m['jax']} "
      f"({m['backend']}) · {m['date']} · "
      f"batch 1 · {next(iter(results['tasks'].values()))['num_prompts']} test prompts per task."
      + provenance_sentence(results), "",
      "Models (parameters; ratio to the target): target "
      f"{params['target'] / 1e6:.2f}M · " + " · ".join(
          f"{d} {params[d] / 1e6:.3f}M (1:{params['target'] / params[d]:.0f})" for d in drafts)
      + f". Drafts distilled from the target with weight {cfg['train']['draft']['distill_weight']} "
      "(paper: T5-small/base/large, not distilled). Tasks: EN→DE Debian gettext pairs (paper: WMT "
      "EN-DE), Debian description → synopsis (paper: CNN/DM).", "",
      "**Speedup**, wherever this report prints, ranks or plots one (Table 2, the tables for "
      "every γ, the Findings, speedup_vs_gamma.png): autoregressive walltime over speculative "
      "walltime for AR's output lengths — each speculative cell's prefills plus its decode "
      "time per token for as many tokens as AR generated (`matched_speedup`). Greedy cells "
      "emit AR's very tokens, where this is the plain per-token speedup; sampled outputs "
      "differ in length, where the per-token ratio would let the prefill's share of a token "
      "decide the comparison.", "",
  ]
  split_at = len(lines)   # the time split goes here once the report's own time is known
  lines += [
      "## Table 2 layout (best γ per cell, as the paper picks it)", "",
      "| task (paper) | draft | temp | γ | α | tok/iter | speedup | pred. e2e | decode-only | "
      "pred. (α, c, v_γ) | pred. (components) | pred. (α, c) | paper γ | paper α | "
      "paper speedup |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for task, tr in results["tasks"].items():
    paper_task = tasks_meta[task]["paper"]
    for t, te in tr["temperatures"].items():
      for d in drafts:
        b = te["best"][d]
        pg, pa, ps = paper2.get((paper_task, d, int(float(t))), (None, None, None))
        lines.append(
            f"| {task} ({paper_task}) | {d} | {t} | {b['gamma']} | {b['alpha']:.2f} | "
            f"{b['tokens_per_iteration']:.2f} | **{cell_speedup(b):.2f}x** | "
            f"{_x(b.get('predicted_end_to_end'))} | {_decode(b)} | "
            f"{_x(b.get('predicted_from_alpha_verify'))} | "
            f"{b['predicted_from_components']:.2f}x | {b['predicted_from_alpha']:.2f}x | "
            f"{pg} | {pa} | {ps}x |")
  lines += ["", "`speedup`: end to end (prefill included), as defined above; `decode-only`: "
            "decode time per token with each prompt's measured prefill (encoders, "
            "cross-attention K/V, first token) subtracted from both sides. "
            "`pred. (α, c, v_γ)`: Leviathan's formula (1−α^{γ+1})/((1−α)(γc+v_γ)) with the "
            "measured α, c and verify cost v_γ (the target's call on γ+1 tokens over one step: "
            "the component table), to compare with `decode-only`; `pred. (α, c)`: the same "
            "with free verification (v_γ = 1), the paper's; `pred. (components)`: the decode-only speedup predicted from measured tokens per "
            "iteration × target step time / (measured draft time per iteration + measured verify "
            "time of γ+1 tokens); `pred. e2e`: the end-to-end speedup predicted from the same "
            "component times plus each call's measured prefill (target, and draft for speculative) "
            "and the measured number of target calls.", ""]
  lines += ["## Component times (batch 1, in-graph)", "",
            "| task | target step ms | " + " | ".join(f"verify γ={g} (×step)" for g in gammas) + " | "
            + " | ".join(f"{d} step ms (c)" for d in drafts) + " |",
            "|---|---|" + "---|" * (len(gammas) + len(drafts))]
  for task, tr in results["tasks"].items():
    comp = tr["components"]
    t1 = comp["target"]["1"]
    lines.append(f"| {task} | {1e3 * t1:.2f} | " + " | ".join(
        f"{comp['target'][str(g + 1)] / t1:.2f}" for g in gammas) + " | " + " | ".join(
        f"{1e3 * comp[d]['1']:.3f} ({comp[d]['1'] / t1:.3f})" for d in drafts) + " |")
  pre = {task: tr["prefill"] for task, tr in results["tasks"].items() if tr.get("prefill")}
  if pre:
    lines += ["", "Prefill per prompt (ms, batch 1): " + "; ".join(
        f"{task}: " + ", ".join(f"{m} {1e3 * v:.2f}" for m, v in p.items())
        for task, p in pre.items()) + "."]
  lines += ["", "## Speedup for every γ", ""]
  auto_rows = {a: [] for a in AUTO_CELLS}
  auto_head = {"auto": "auto", "auto_series": "auto, series"}
  for task, tr in results["tasks"].items():
    for t, te in tr["temperatures"].items():
      autos = [a for a in AUTO_CELLS if all(f"{d}/g{a}" in te["cells"] for d in drafts)]
      lines += [f"**{task}, temperature {t}** (AR {te['cells']['ar']['ms_per_token']:.2f} ms/token)", "",
                "| draft | α | " + " | ".join([f"γ={g}" for g in gammas] + [
                    f"{auto_head[a]} (γ chosen: iterations)" for a in autos]) + " |",
                "|---|---|" + "---|" * (len(gammas) + len(autos))]
      for d in drafts:
        cells = [te["cells"]["%s/g%d" % (d, g)] for g in gammas]
        row = f"| {d} | {te['alpha'][d]:.2f} | " + " | ".join(
            "%.2fx (%.2f)" % (cell_speedup(c), c["tokens_per_iteration"]) for c in cells) + " |"
        best = max(cell_speedup(c) for c in cells)
        for name in autos:
          a = te["cells"][f"{d}/g{name}"]
          chosen = ", ".join(f"{g}: {n}" for g, n in sorted(a.get("gamma_counts", {}).items(),
                                                           key=lambda kv: int(kv[0])))
          row += f" **{cell_speedup(a):.2f}x** ({a['tokens_per_iteration']:.2f}; {chosen}) |"
          auto_rows[name].append((cell_speedup(a), cell_speedup(a) / best))
        lines.append(row)
      ident = [te["cells"]["%s/g%d" % (d, g)]["identical_fraction"] for d in drafts for g in gammas]
      if float(t) == 0:
        lines.append(f"\nGreedy outputs identical to autoregressive decoding in "
                     f"{100 * min(ident):.0f}% of prompts (worst cell).")
      outs = te.get("ar_outputs")
      if outs:
        lines.append(f"\nAR outputs: median {outs['median_tokens']:.0f} tokens; "
                     f"{100 * outs['at_max_new']:.0f}% stopped at max_new_tokens = "
                     f"{outs['max_new_tokens']} instead of EOS.")
      lines.append("")
  any_auto = any(auto_rows.values())
  cal = results.get("calibration")
  lines += ["Cells: speedup (tokens per iteration)."
            + (" `auto`: `speculative_generate(gamma=\"auto\")`, γ chosen per iteration from "
               "{0, 1, 2, 4, 8} (0: a plain target step) in-graph, each call on its own (from "
               "the prior); `auto, series`: the prompts run as one series, each call starting "
               "from the acceptance estimate the previous one returned (`acceptance=`: the "
               "first call probes, and so does a later one once its evidence has idled away). "
               + (" One γ cost table per draft (`calibrate_gamma_costs` at the sweeps' largest "
                  "shapes, %s verification), measured once before the sweeps and passed to all "
                  "of that draft's `auto` cells (`gamma_costs=`), outside the timings."
                  % ("greedy" if all(float(t) == 0 for t in cfg["eval"]["temperatures"])
                     else "sampled") if cal else
                  " The one-time cost calibration is compiled and run outside the timings.")
               if any_auto else ""), ""]
  for name, rows in auto_rows.items():
    if rows:
      vs_ar = [r[0] for r in rows]
      vs_best = [r[1] for r in rows]
      lines += [f"`{auto_head[name]}` over {len(rows)} cells: {min(vs_ar):.2f}–{max(vs_ar):.2f}× "
                f"AR (median {np.median(vs_ar):.2f}; ≥ 0.97× in {sum(v >= 0.97 for v in vs_ar)}); "
                f"{min(vs_best):.2f}–{max(vs_best):.2f}× the best fixed γ of its row (median "
                f"{np.median(vs_best):.2f}; ≥ 0.95× in {sum(v >= 0.95 for v in vs_best)}).", ""]
  lines += ["",
            "## Table 3 layout: α of n-gram drafts", "",
            "| task | temp | unigram | bigram | " + " | ".join(drafts) + " |",
            "|---|---|---|---|" + "---|" * len(drafts)]
  for task, tr in results["tasks"].items():
    for t, te in tr["temperatures"].items():
      a = te["alpha"]
      lines.append(f"| {task} | {t} | {a['unigram']:.2f} | {a['bigram']:.2f} | "
                   + " | ".join(f"{a[d]:.2f}" for d in drafts) + " |")
  lines += ["", f"Paper (T5-XXL EN-DE, temperature 0): unigram {paper3['unigram']}, bigram "
            f"{paper3['bigram']}.", "", "## Findings", ""]
  lines += _findings(results)

  panels = {}
  for task, tr in results["tasks"].items():
    for t, te in tr["temperatures"].items():
      panels[f"{task}, T={t}"] = {
          "%s (α=%.2f)" % (d, te["alpha"][d]): (
              gammas, [cell_speedup(te["cells"]["%s/g%d" % (d, g)]) for g in gammas])
          for d in drafts}
  plot_lines(panels, os.path.join(out_dir, "speedup_vs_gamma.png"), "γ", "walltime speedup", 1.0)
  if any_auto:
    plot_gamma_traces(results, drafts, os.path.join(out_dir, "auto_gamma.png"))
  groups = {f"{task}\nT={t}": {d: te["alpha"][d] for d in ["unigram", "bigram"] + drafts}
            for task, tr in results["tasks"].items() for t, te in tr["temperatures"].items()}
  plot_bars(groups, os.path.join(out_dir, "alpha.png"), "α")
  split = results.get("time_split_s")
  if split is not None:
    seconds = now() - t_report   # (a report written again replaces its earlier seconds)
    split["total"] = split.get("total", 0.0) - split.get("report", 0.0) + seconds
    split["report"] = seconds
    lines[split_at:split_at] = [_time_split_line(results), ""]
  atomic_write_text(os.path.join(out_dir, "results.md"), "\n".join(lines) + "\n")
