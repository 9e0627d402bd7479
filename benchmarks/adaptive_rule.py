"""`gamma="auto"`'s rule against every fixed γ on acceptance processes of known law.

  python benchmarks/adaptive_rule.py            # ~2 min on 2 cores
  python benchmarks/adaptive_rule.py --quick    # smoke run (few trials)

Simulated, not timed: no model runs. Each row's drafts are accepted one
after the other with a known probability that depends on the row and on
the position in its output (a draft rejected ends the iteration, as in
greedy verification); an iteration at γ costs c(γ) plain steps (a cost
table); a batch runs until its last row holds `max_new` tokens. The rule is
`specjax.adaptive`'s own `choose` and `observe` (jitted) with its
defaults (the prior: the default 0.5, or a trained head's recorded
agreement, as the families comparison's auto rows of that head) and
retries (a drafter without previews), asked every iteration (the decoder
asks after blocks of plain steps or when a retry falls due: the same
choices where the estimate does not change within a block).
The score of a policy is tokens per plain-step time relative to plain
decoding (1.0 = as fast as plain decoding), averaged over trials; each
trial's random stream is seeded alike for every policy (each iteration
draws one uniform per row and draft slot).

What it separates from the wall-clock comparisons (`experiments/families.py`,
`results/families/`): the rule's own losses against the best fixed γ —
reacting to noise, exploring, a process that changes within a sequence —
from the loop's overhead and the machine's noise, which it does not have.

Writes `adaptive_rule.json` and `adaptive_rule.md` (`_quick` with --quick)
into --out_dir.
"""

import json
import os
from typing import Callable, Dict, List, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specjax import adaptive
from specjax.atomic_io import atomic_write_text
from specjax.measure.provenance import provenance, provenance_sentence

_OUT = flags.DEFINE_string("out_dir", "benchmarks/results", "Where the JSON and markdown go.")
_QUICK = flags.DEFINE_bool("quick", False, "Few trials, two cases (smoke run).")
_TRIALS = flags.DEFINE_integer("trials", 100, "Simulated calls per case and policy.")

MAX_NEW = 64

# Cost tables: an iteration at γ ∈ Γ = (0, 1, 2, 4, 8) in plain steps.
COSTS = {
    # Calibrated by `specjax.calibration` for the families comparison's
    # EAGLE-1 chain on the Chen full target, batch 8, 2026-12-07 (2-core AMD EPYC).
    "EAGLE-1 chain, batch 8 (measured)": (1.0, 1.515, 1.999, 2.659, 4.215),
    # Illustrative: a small draft model whose verify of γ + 1 tokens costs
    # little more than a step (a batch-1 call on a memory-bound machine).
    "draft model, batch 1 (illustrative)": (1.0, 1.2, 1.4, 1.8, 2.6),
    # Illustrative: a batch of 8, where a verify of more tokens costs more.
    "draft model, batch 8 (illustrative)": (1.0, 1.25, 1.45, 1.9, 2.8),
}


def _constant(alpha: float) -> Callable[[int], float]:
  return lambda pos: alpha


def _opening(hard: float, easy: float, tokens: int) -> Callable[[int], float]:
  return lambda pos: hard if pos < tokens else easy


def _alternating(copied: float, new: float, period: int) -> Callable[[int], float]:
  return lambda pos: copied if (pos // period) % 2 == 0 else new


# The EAGLE-1 head's recorded top-1 agreement (its `agreement.json`), the
# prior the families comparison's auto rows of that head start from.
HEAD_PRIOR = 0.79


def cases(quick: bool) -> List[dict]:
  """(name, rows' acceptance laws, cost table, the rule's prior_alpha) per case."""
  eagle, b1, b8 = list(COSTS)
  d = adaptive.AdaptiveGamma().prior_alpha
  out = [
      ("α = 0.3 every row", [_constant(0.3)] * 8, b8, d),
      ("α = 0.6 every row", [_constant(0.6)] * 8, b8, d),
      ("α = 0.6, one row 0.05", [_constant(0.6)] * 7 + [_constant(0.05)], b8, d),
      ("α = 0.93 every row", [_constant(0.93)] * 8, eagle, d),
      ("α = 0.8 every row", [_constant(0.8)] * 8, eagle, HEAD_PRIOR),
      ("α = 0.93 every row", [_constant(0.93)] * 8, eagle, HEAD_PRIOR),
      ("hard opening: α = 0.3 for 6 tokens, then 0.93", [_opening(0.3, 0.93, 6)] * 8, eagle,
       HEAD_PRIOR),
      ("hard opening, batch 1", [_opening(0.3, 0.93, 6)], b1, d),
      ("α = 0.8, batch 1", [_constant(0.8)], b1, d),
      ("alternating 16 copied (α 0.95) / 16 new (α 0.2), batch 1",
       [_alternating(0.95, 0.2, 16)], b1, d),
  ]
  if quick:
    out = [out[2], out[8]]
  return [{"name": n, "laws": laws, "costs_name": c, "costs": COSTS[c], "prior": p}
          for n, laws, c, p in out]


class _Rule:
  """The adaptive rule's jitted choice and observation for one Γ."""

  def __init__(self, cfg: adaptive.AdaptiveGamma):
    self.cfg = cfg
    self.choose = jax.jit(lambda st, costs, active, left: adaptive.choose(
        cfg, st, costs, active, None, left))
    self.observe = jax.jit(lambda st, n, v, active, step: adaptive.observe(
        cfg, st, n, v, active, step))


def simulate(laws: Sequence[Callable[[int], float]], costs: Sequence[float], policy,
             rule: _Rule, seed: int, max_new: int = MAX_NEW) -> dict:
  """One call: `policy` a fixed γ (int) or "auto". Returns the time in
  plain steps and, for "auto", the γ of each iteration."""
  rng = np.random.default_rng(seed)
  gammas = np.asarray(rule.cfg.gammas)
  b = len(laws)
  costs_g = jnp.asarray(costs, jnp.float32)
  st = adaptive.AdaptState.zeros(b, 4 * max_new, None, retries=True)
  out = np.zeros(b, np.int64)
  time, step, trace = 0.0, 0, []
  while (out < max_new).any():
    active = out < max_new
    if policy == "auto":
      branch, limit = rule.choose(st, costs_g, jnp.asarray(active), jnp.asarray(max_new - out))
      branch, limit = int(branch), np.asarray(limit)
      gamma = int(gammas[branch])
      time += float(costs[branch])
    else:
      gamma = int(policy)
      limit = np.where(active, gamma, 0)
      time += float(costs[list(gammas).index(gamma)])
    trace.append(gamma)
    u = rng.random((b, max(int(gammas[-1]), 1)))   # the same draws for every policy
    accepted = np.zeros(b, np.int64)
    for row in range(b):
      while accepted[row] < limit[row] and u[row, accepted[row]] < laws[row](
          out[row] + accepted[row]):
        accepted[row] += 1
    out = np.where(active, np.minimum(out + accepted + 1, max_new), out)
    if policy == "auto":
      st = rule.observe(st.replace(branch=jnp.int32(branch)), jnp.asarray(accepted, jnp.int32),
                        jnp.asarray(limit, jnp.int32), jnp.asarray(active), jnp.int32(step))
    step += 1
  return {"time": time, "trace": trace}


def run_case(case: dict, rule: _Rule, trials: int) -> dict:
  policies = list(rule.cfg.gammas) + ["auto"]
  time = {str(p): 0.0 for p in policies}
  hist: Dict[int, int] = {g: 0 for g in rule.cfg.gammas}
  for t in range(trials):
    for p in policies:
      r = simulate(case["laws"], case["costs"], p, rule, seed=1000 + t)
      time[str(p)] += r["time"]
      if p == "auto":
        for g in r["trace"]:
          hist[g] += 1
  plain = time["0"]
  speed = {p: plain / s for p, s in time.items()}   # relative to plain decoding
  fixed = {p: v for p, v in speed.items() if p not in ("0", "auto")}
  best = max(fixed, key=fixed.get)
  n_iter = sum(hist.values())
  return {"case": case["name"], "batch": len(case["laws"]), "prior": rule.cfg.prior_alpha,
          "costs": case["costs_name"],
          "cost_table": list(case["costs"]), "speed": speed, "best_fixed": int(best),
          "auto_vs_best_fixed": speed["auto"] / fixed[best],
          "auto_vs_plain": speed["auto"],
          "auto_beats_every_fixed": speed["auto"] > max(fixed.values()),
          "gamma_share": {str(g): c / n_iter for g, c in hist.items()}}


def render(result: dict) -> str:
  lines = ["# `gamma=\"auto\"`'s rule against fixed γ (simulated acceptance)", "",
           provenance_sentence(result).strip(), "",
           f"{result['trials']} simulated calls of {MAX_NEW} tokens per case and policy, the same "
           "seed per trial for every policy; speed = plain decoding's time / the policy's "
           "(1.00 = plain decoding). No wall clock: the rule's decisions alone.", "",
           "| case | batch | prior | costs c(0, 1, 2, 4, 8) | γ=1 | γ=2 | γ=4 | γ=8 | auto | "
           "auto / best fixed | auto's γ = 0 / 1 / 2 / 4 / 8 |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in result["cases"]:
    s = r["speed"]
    share = " / ".join(f"{100 * r['gamma_share'][g]:.0f}%" for g in ("0", "1", "2", "4", "8"))
    costs = ", ".join(f"{c:g}" for c in r["cost_table"])
    lines.append(f"| {r['case']} | {r['batch']} | {r['prior']:g} | {costs} ({r['costs']}) | "
                 f"{s['1']:.3f} | "
                 f"{s['2']:.3f} | {s['4']:.3f} | {s['8']:.3f} | **{s['auto']:.3f}** | "
                 f"{r['auto_vs_best_fixed']:.3f} (γ = {r['best_fixed']}) | {share} |")
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  quick = _QUICK.value
  trials = 4 if quick else _TRIALS.value
  rules = {}
  results = []
  for c in cases(quick):
    if c["prior"] not in rules:
      rules[c["prior"]] = _Rule(adaptive.AdaptiveGamma(prior_alpha=c["prior"]))
    results.append(run_case(c, rules[c["prior"]], trials))
  for r in results:
    print(f"{r['case']}: auto {r['speed']['auto']:.3f}x plain, "
          f"{r['auto_vs_best_fixed']:.3f}x best fixed (γ = {r['best_fixed']})", flush=True)
  result = {"trials": trials, "max_new": MAX_NEW,
            "rule": "AdaptiveGamma() defaults but prior_alpha (per case)",
            "cases": results, "provenance": provenance()}
  stem = "adaptive_rule" + ("_quick" if quick else "")
  os.makedirs(_OUT.value, exist_ok=True)
  atomic_write_text(os.path.join(_OUT.value, stem + ".json"), json.dumps(result, indent=1))
  atomic_write_text(os.path.join(_OUT.value, stem + ".md"), render(result))


if __name__ == "__main__":
  app.run(main)
