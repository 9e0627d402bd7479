"""The long-context grid's report: the names of its entries, the table,
what `gamma="auto"` did, the crossovers, the speedup surface
(`long_context_measure` measures the cells)."""

from __future__ import annotations

import math
from typing import Dict, List

import numpy as np

from specjax.adaptive import DEFAULT_GAMMAS
from experiments.programs.report import save, subplots
from specjax.measure.provenance import provenance_sentence

__all__ = ["DRAFTS", "AUTO", "label", "parse_variant", "is_auto", "crossovers", "best_fixed",
           "auto_lines", "render", "plot"]

DRAFTS = {"lookup": "prompt lookup", "window": "windowed-KV self-draft",
          "small": "classic small draft"}

# `gamma="auto"` entries ("<draft>@auto"): γ chosen per iteration from Γ.
AUTO = "auto"
# MagicDec (arXiv 2408.11049), 8 x A100, self-speculation with a StreamingLLM draft.
MAGICDEC = [("LLaMA-2-7B-32K", "8k-32k", "32-256", "up to 2.0x"),
            ("LLaMA-3.1-8B", "32k-100k", "32-128", "up to 1.84x")]


def label(name: str) -> str:
  """"window" → "windowed-KV self-draft"; "window@2" → "... γ=2";
  "window@auto" → "... γ=auto"."""
  base, _, g = name.partition("@")
  return DRAFTS[base] + (f" γ={g}" if g else "")


def parse_variant(text: str):
  """"window@2" → ("window", 2): a draft measured again at another γ;
  "window@auto" → ("window", "auto"): with `gamma="auto"`."""
  base, sep, g = str(text).partition("@")
  if base not in DRAFTS or not sep or not (g == AUTO or (g.isdigit() and int(g) >= 1)):
    raise ValueError(f"eval.variants entries must be <draft>@<gamma> with a draft in "
                     f"{sorted(DRAFTS)} and gamma >= 1 or 'auto', got {text!r}")
  return base, (AUTO if g == AUTO else int(g))


def is_auto(name: str) -> bool:
  """Whether a summary entry ("small@auto") was decoded with gamma="auto"."""
  return name.partition("@")[2] == AUTO


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


def _entry(s: dict, setting: str) -> str:
  """One draft's table entry: α · tokens per call · speedup, then the
  prediction and the end-to-end speedup, or for `gamma="auto"` the share
  of iterations at each γ and the end-to-end speedup."""
  head = f"{s['alpha']:.2f} · {s['tokens_per_call']:.2f} · **{s['speedup']:.2f}x** "
  if s["predicted"] is None:
    counts = s.get("gamma_counts", {})
    total = sum(counts.values()) or 1
    shares = ", ".join(f"{g}: {100 * k / total:.0f}%" for g, k in counts.items())
    tail = f"(γ {shares}; {s['speedup_end_to_end']:.2f})"
  else:
    tail = f"({s['predicted']:.2f}, {s['speedup_end_to_end']:.2f})"
  return head + tail + ("" if setting != "greedy" or s["identical"] == 1.0
                        else " NOT IDENTICAL")


def best_fixed(summary: dict, auto_name: str):
  """The fastest fixed-γ entry of the same draft in a cell (the draft at
  the grid's γ and its variants): (name, speedup), or None."""
  base = auto_name.partition("@")[0]
  fixed = [(n, s["speedup"]) for n, s in summary.items()
           if isinstance(s, dict) and "speedup" in s and not is_auto(n)
           and n.partition("@")[0] == base]
  return max(fixed, key=lambda kv: kv[1], default=None)


def auto_lines(res: dict) -> List[str]:
  """What `gamma="auto"` did over the grid, against AR and against the
  same draft's best fixed γ in each cell."""
  autos = [a for a in dict.fromkeys(list(res.get("auto", [])) + list(res.get("variants", [])))
           if is_auto(a)]
  if not autos:
    return []
  gammas = ", ".join(str(g) for g in res.get("auto_gammas", DEFAULT_GAMMAS))
  lines = ["## `gamma=\"auto\"`", "",
           f"γ chosen per iteration from Γ = {{{gammas}}} (0: a plain target step), from each "
           "row's acceptance so far and the cost of each γ measured once on this machine (per "
           "model pair, batch and cache length; outside the timings). Each cell's `auto` "
           "entries were measured beside their own AR run.", ""]
  for a in autos:
    cells = [c for c in res["cells"] if a in c["summary"]]
    if not cells:
      continue
    vs_ar = [c["summary"][a]["speedup"] for c in cells]
    vs_fixed = [c["summary"][a]["speedup"] / b[1] for c in cells
                for b in [best_fixed(c["summary"], a)] if b]
    line = (f"- {label(a)}: {min(vs_ar):.2f}–{max(vs_ar):.2f}× AR over {len(cells)} cells "
            f"(median {float(np.median(vs_ar)):.2f}; ≥ 0.97× in {sum(v >= 0.97 for v in vs_ar)})")
    if vs_fixed:
      line += (f"; {min(vs_fixed):.2f}–{max(vs_fixed):.2f}× the draft's best fixed γ "
               f"(median {float(np.median(vs_fixed)):.2f}; ≥ 0.95× in "
               f"{sum(v >= 0.95 for v in vs_fixed)}, above it in {sum(v > 1 for v in vs_fixed)})")
    lines.append(line + ".")
  return lines + [""]


def render(res: dict) -> str:
  g = res["gamma"]
  drafts = list(res["drafts"]) + list(res.get("variants", [])) + list(res.get("auto", []))
  lines = ["# Long contexts × batch: where speculative decoding pays on this CPU", "",
           f"{res['hardware']}. Command: `{res['command']}`"
           + provenance_sentence(res), "",
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
        parts.append(_entry(s, setting))
      lines.append(f"| {c['context']} | {c['batch']} | {c['step_mb']:.0f} | "
                   f"{1e3 * comp['step_s']:.2f} | {comp['verify_s'] / comp['step_s']:.2f} | "
                   + " | ".join(parts) + " |")
    lines += ["", "Crossover (smallest context from which the speedup stays > 1), per batch:", ""]
    for d in drafts:
      cx = crossovers(cells, d, setting)
      lines.append(f"- {label(d)}: " + ", ".join(
          f"B={b}: {v if v is not None else 'none'}" for b, v in cx.items()))
    lines.append("")
  lines += auto_lines(res)
  lines += ["## Beside MagicDec", "",
            "| model | context | batch | speedup (8 x A100) |", "|---|---|---|---|"]
  lines += [f"| {m} | {c} | {b} | {s} |" for m, c, b, s in MAGICDEC]
  pairs = [c["summary"][d] for c in res["cells"] for d in drafts
           if d in c["summary"] and c["summary"][d]["predicted"] is not None]
  within = [p for p in pairs if abs(p["speedup"] / p["predicted"] - 1) <= 0.15]
  hits = [(c, d) for c in res["cells"] for d in drafts if d in c["summary"]
          and c["summary"][d]["predicted"] is not None
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
  drafts = list(res["drafts"]) + list(res.get("variants", [])) + list(res.get("auto", []))
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


