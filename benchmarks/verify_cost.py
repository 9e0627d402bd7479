"""What a verify costs: one model call on T tokens against a one-token step.

  python benchmarks/verify_cost.py                          # ~20 min, all models
  python benchmarks/verify_cost.py --quick                  # tiny models (smoke run)
  python benchmarks/verify_cost.py --before=old.json        # "before" columns from a run of
                                                            # this script at another commit

Speculative decoding pays when verifying γ+1 tokens costs about one decode
step. This measures, in-graph (`specjax.measure.timing.StepTimer`: a jitted
`lax.fori_loop` of `extend` calls timed at 0 and N iterations, prefill and
dispatch cancelled, every logit consumed), the cost of a call on T = 1, 2,
4, 6, 8, 16, 32, 64 tokens relative to T = 1, at batch 1 and 8 and cache
buffers of 128 / 512 / 2048 slots, for three targets with random weights:

* `chen`: the Chen reproduction's `full` target (17.3M: 8 layers, d 384,
  6 heads x 64, SwiGLU 1024, vocab 4096);
* `t5`: the Leviathan reproduction's `full` T5 v1.1 target (4 + 4 layers,
  d 256, 8 heads x 32, gated-GELU 768, vocab 4096; 96 encoder positions);
* `decoder-27m`: `cpu-target-27m` (6 layers, d 512, 8 heads x 64).

The T values of one (model, batch, cache) cell are interleaved call by call
(`--repeats` rounds, medians), so each ratio is measured moments apart.
Two more sections explain the numbers:

* `products` (`--products`): the model's projection products alone (every
  q/k/v/o/MLP kernel of every layer and the LM head, chained as a call
  computes them, no attention) on M = 1..16 rows, against M = 1: what the
  matrix products of a T-token call cost on this CPU;
* `profile` (`--profile`): one T = 1 and one T = γ+1 call of `chen` (γ = 4)
  and `t5` (γ = 5) at batch 1, 512 slots under `jax.profiler`, the time of
  every XLA:CPU thunk grouped by what it computes (projections, attention
  products over the cache, softmax, cache writes, ...). Profiled times carry
  the profiler's own overhead per thunk: read the shares and the T = 1 vs
  T = γ+1 change, not the absolute numbers.

Goals (issue 23): batch 1, cache <= 512: T = 5 <= 1.2x a one-token step for
`chen`, T = 6 <= 1.4x for `t5`; T = 16 <= 1.5x; the one-token step no slower
than before (needs --before).

Writes `verify_cost.json` and `verify_cost.md` into --out_dir.
"""

import collections
import glob
import json
import os
import re
import shutil
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

from specjax.atomic_io import atomic_write_text
from specjax.measure.hlo import computations, while_bodies
from specjax.measure.provenance import machine_line, provenance, provenance_sentence
from specjax.measure.timing import StepTimer, floor_step_seconds, now
from specjax.models.decoder import DecoderConfig, DecoderLM, decoder_config
from specjax.models.t5 import T5
from specjax.models.t5_config import T5Config

_OUT = flags.DEFINE_string("out_dir", os.path.join(os.path.dirname(__file__), "results"),
                           "Where verify_cost.json / verify_cost.md go.")
_QUICK = flags.DEFINE_bool("quick", False, "Tiny models, few cells (smoke run).")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Interleaved rounds per cell (medians).")
_MODELS = flags.DEFINE_list("models", ["chen", "t5", "decoder-27m"], "Which targets.")
_BEFORE = flags.DEFINE_string("before", "", "A verify_cost.json of an earlier commit: its "
                              "ratios are shown beside this run's.")
_LABEL = flags.DEFINE_string("label", "", "A name for this run (e.g. the commit).")
_PROFILE = flags.DEFINE_bool("profile", True, "Add the per-op profile section.")
_PRODUCTS = flags.DEFINE_bool("products", True, "Add the projection-products section.")
_CELLS = flags.DEFINE_bool("cells", True, "Measure the T x batch x cache cells.")
_BATCHES = flags.DEFINE_list("batches", [str(b) for b in (1, 8)], "Batch sizes of the cells.")
_CACHES = flags.DEFINE_list("caches", [str(s) for s in (128, 512, 2048)], "Cache slots.")
_TOKENS = flags.DEFINE_list("tokens", [str(t) for t in (1, 2, 4, 6, 8, 16, 32, 64)],
                            "Tokens per call (1 first).")
_AB = flags.DEFINE_string("ab", "", "Another checkout of specjax (e.g. a git worktree of an "
                          "earlier commit): the cells are measured alternately in both, "
                          "--ab_rounds times each, in fresh processes, and reported side by "
                          "side (medians over rounds): before = that checkout, after = this.")
_AB_ROUNDS = flags.DEFINE_integer("ab_rounds", 3, "Alternations for --ab.")
_CELLS_JSON = flags.DEFINE_string("cells_json", "", "Internal (--ab): measure the cells only "
                                  "and write them to this file.")

TOKENS = (1, 2, 4, 6, 8, 16, 32, 64)
BATCHES = (1, 8)
CACHES = (128, 512, 2048)
T5_ENCODER_LEN = 96
# The Chen reproduction's `full` target and the Leviathan reproduction's `full` T5 target.
CHEN = DecoderConfig(vocab_size=4096, d_model=384, num_layers=8, num_heads=6, num_kv_heads=6,
                     head_dim=64, mlp_dim=1024)
LEVIATHAN_T5 = T5Config(vocab_size=4096, d_model=256, d_kv=32, num_heads=8, d_ff=768,
                        num_layers=4, feed_forward="gated-gelu", tie_word_embeddings=False)
GAMMA = {"chen": 4, "t5": 5, "decoder-27m": 4}
GOALS = {"chen": 1.2, "t5": 1.4}   # T = γ+1 at batch 1, cache <= 512
GOAL_T16 = 1.5


def build(name: str, quick: bool):
  """(model, params, prompt_len for a cache of S slots)."""
  if name == "t5":
    config = LEVIATHAN_T5 if not quick else LEVIATHAN_T5.replace(
        d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=1, vocab_size=64)
    model = T5(config)
    return model, model.init(jax.random.PRNGKey(0)), lambda s: T5_ENCODER_LEN
  config = {"chen": CHEN, "decoder-27m": decoder_config("cpu-target-27m")}[name]
  if quick:
    config = decoder_config("tiny")
  model = DecoderLM(config.replace(matvec_max_rows=0))
  return model, model.init(jax.random.PRNGKey(0)), lambda s: s // 2


def measure_cells(name: str, quick: bool, repeats: int) -> list:
  model, params, prompt_of = build(name, quick)
  batches, caches, tokens = ((1,), (128,), (1, 2, 8)) if quick else (
      tuple(int(b) for b in _BATCHES.value), tuple(int(c) for c in _CACHES.value),
      tuple(int(t) for t in _TOKENS.value))
  rows = []
  for b in batches:
    for s in caches:
      t0 = now()
      timer = StepTimer(model, params, b, s, prompt_of(s), list(tokens), steps=4 if quick else 16)
      per_t = {t: [] for t in tokens}
      for _ in range(repeats):
        for t, sec in timer.measure(1).items():
          per_t[t].extend(sec)
      med = {t: floor_step_seconds(v) for t, v in per_t.items()}
      row = {"model": name, "batch": b, "cache": s, "t1_ms": 1e3 * med[1],
             "ms": {str(t): 1e3 * med[t] for t in tokens},
             "ratio": {str(t): med[t] / med[1] for t in tokens}}
      rows.append(row)
      logging.info("%s B=%d S=%d: T1 %.3f ms; %s (%.0fs)", name, b, s, row["t1_ms"],
                   " ".join(f"T{t} {r:.2f}x" for t, r in row["ratio"].items() if t != "1"),
                   now() - t0)
      del timer
      jax.clear_caches()
  return rows


# --------------------------------------------------------------------------- products


def _kernels(name: str, params) -> list:
  """The projection kernels of one call, in order, as `[in, out]` matrices."""
  mats = []
  if name == "t5":
    dec = params["decoder"]
    for i in sorted(k for k in dec if k.startswith("layers_")):
      layer = dec[i]
      for attn in ("self_attn", "cross_attn"):
        for p in ("q", "o") if attn == "cross_attn" else ("q", "k", "v", "o"):
          k = layer[attn][p]["kernel"]
          mats.append(k.reshape(-1, k.shape[-1]) if p == "o" else k.reshape(k.shape[0], -1))
      for p in sorted(layer["mlp"]):
        mats.append(layer["mlp"][p]["kernel"])
    mats.append(params["lm_head"]["kernel"])
    return mats
  for i in sorted((k for k in params if k.startswith("layer_")), key=lambda k: int(k[6:])):
    layer = params[i]
    for p in ("q", "k", "v", "o", "gate", "up", "down"):
      k = layer[p]["kernel"]
      mats.append(k.reshape(-1, k.shape[-1]) if p == "o" else k.reshape(k.shape[0], -1))
  mats.append(params["lm_head"]["kernel"] if "lm_head" in params else params["embed"]["embedding"].T)
  return mats


def measure_products(name: str, quick: bool, repeats: int) -> dict:
  """The chain of a call's projection products on M rows, M = 1..16."""
  _, params, _ = build(name, quick)
  mats = tuple(jnp.asarray(m) for m in _kernels(name, params))
  counts = (1, 2, 5, 8, 16)

  def loop(m):
    def body(i, acc):
      for w in mats:  # Each product's input depends on the last one's output.
        x = jnp.full((m, w.shape[0]), 1e-3, w.dtype) + acc * 1e-9
        acc = acc + jnp.dot(x, w)[0, 0]
      return acc
    return jax.jit(lambda n: jax.lax.fori_loop(0, n, body, jnp.float32(0)))
  fns = {m: loop(m) for m in counts}
  for fn in fns.values():
    fn(2).block_until_ready()
  steps = 2 if quick else 16
  per_m = {m: [] for m in counts}
  for r in range(repeats):
    for m in (counts if r % 2 == 0 else counts[::-1]):
      t0 = now()
      fns[m](0).block_until_ready()
      a = now() - t0
      t0 = now()
      fns[m](steps).block_until_ready()
      per_m[m].append((now() - t0 - a) / steps)
  med = {m: floor_step_seconds(v) for m, v in per_m.items()}
  nbytes = sum(int(w.size) * w.dtype.itemsize for w in mats)
  flops = {m: 2 * m * sum(int(w.size) for w in mats) for m in counts}
  return {"model": name, "kernels": len(mats), "weight_mb": nbytes / 1e6,
          "ms": {str(m): 1e3 * med[m] for m in counts},
          "ratio": {str(m): med[m] / med[1] for m in counts},
          "gb_per_s": {str(m): nbytes / med[m] / 1e9 for m in counts},
          "gflop_per_s": {str(m): flops[m] / med[m] / 1e9 for m in counts}}


# --------------------------------------------------------------------------- profile

_CATEGORY_RULES = (
    ("cache writes", r"dynamic.update.slice|scatter"),
    ("embedding and relative-position lookups", r"relpos|take|gather"),
    ("norms", r"norm"),
)


def _categorize(op_name: str, is_product: bool, dims: tuple, model_dims: dict) -> str:
  """What a thunk computes, from its op_name metadata, whether it holds a
  matrix product, and its output shape."""
  slots = {model_dims["S"], model_dims["S"] + model_dims["T"], model_dims["P"]}
  if is_product:
    if model_dims["V"] in dims or len(dims) <= 1:  # at T > 1 fused with the max over V
      return "LM head"
    if any(d in slots for d in dims):
      return "attention: scores over the cache / encoder"
    if len(dims) >= 3 and dims[-1] == model_dims["D"]:
      return "attention: weighted sums of values"
    if len(dims) >= 3:
      return "attention: scores among the new tokens"
    return "projections (q/k/v/o, MLP)"
  for cat, pattern in _CATEGORY_RULES:
    if re.search(pattern, op_name):
      return cat
  if any(d in slots for d in dims):
    return "softmax and masks over the cache / encoder"
  return "elementwise, reshapes, rest"


def _loop_body_instructions(hlo: str) -> dict:
  """{instruction name: (op_name, holds a product, output dims)} of the
  instructions of the program's while bodies (what runs once per call)."""
  comps, bodies = computations(hlo), while_bodies(hlo)
  out = {}
  for body in bodies:
    for line in comps.get(body, []):
      m = re.match(r"^\s+(?:ROOT )?%(\S+) = \w+\[([0-9,]*)\]\S* ([\w-]+)\(", line)
      if not m:
        continue
      called = re.search(r"calls=%([\w.-]+)", line)
      product = m.group(3) in ("dot", "convolution") or bool(called and any(
          re.search(r" (dot|convolution)\(", l) for l in comps.get(called.group(1), [])))
      op = re.search(r'op_name="([^"]*)"', line)
      dims = tuple(int(d) for d in m.group(2).split(",") if d)
      out[m.group(1)] = (op.group(1) if op else "", product, dims)
  return out


def profile_call(name: str, t: int, quick: bool, slots: int = 512) -> dict:
  """Per-category thunk time of `extend` on t tokens (batch 1) under jax.profiler."""
  from jax.profiler import ProfileData
  model, params, prompt_of = build(name, quick)
  cache = model.init_cache(1, slots, prompt_of(slots))
  prompt = jnp.ones((1, prompt_of(slots)), jnp.int32)
  v = model.vocab_size

  def run(params, cache, n):
    _, _, cache = model.prefill(params, prompt, jnp.full((1,), prompt.shape[1], jnp.int32), cache)
    start = cache.lengths

    def body(i, carry):
      cache, acc = carry
      toks = (jnp.zeros((1, t), jnp.int32) + i + jnp.arange(t)[None]) % v
      logits, cache = model.extend(params, toks, cache.replace(lengths=start))
      return cache, acc + jnp.sum(jnp.max(logits, axis=-1))
    return jax.lax.fori_loop(0, n, body, (cache, 0.0))[1]
  fn = jax.jit(run)
  iterations = 4 if quick else 40
  fn(params, cache, 2).block_until_ready()
  info = _loop_body_instructions(fn.lower(params, cache, 2).compile().as_text())
  folder = tempfile.mkdtemp(prefix="verify_cost_profile_")
  try:
    with jax.profiler.trace(folder):
      fn(params, cache, iterations).block_until_ready()
    data = ProfileData.from_file(glob.glob(folder + "/**/*.xplane.pb", recursive=True)[-1])
  finally:
    shutil.rmtree(folder, ignore_errors=True)
  head_dim = model.config.d_kv if name == "t5" else model.config.head_dim
  model_dims = {"S": slots, "T": t, "V": v, "D": head_dim,
                "P": T5_ENCODER_LEN if name == "t5" else -1}
  per_cat = collections.Counter()
  for plane in data.planes:
    for line in plane.lines:
      for ev in line.events:
        if ev.name not in info:
          continue
        op_name, product, dims = info[ev.name]
        per_cat[_categorize(op_name, product, dims, model_dims)] += ev.duration_ns
  total = sum(per_cat.values())
  return {"model": name, "tokens": t, "slots": slots,
          "us_per_call": {k: v / iterations / 1e3 for k, v in per_cat.most_common()},
          "total_us": total / iterations / 1e3}


# --------------------------------------------------------------------------- report


def _goal_lines(rows: list, before: dict) -> list:
  lines = []
  for name, limit in GOALS.items():
    t = GAMMA[name] + 1
    for r in rows:
      if r["model"] != name or r["batch"] != 1 or r["cache"] > 512 or str(t) not in r["ratio"]:
        continue
      for tt, lim in ((t, limit), (16, GOAL_T16)):
        if str(tt) not in r["ratio"]:
          continue
        got = r["ratio"][str(tt)]
        lines.append(f"| {name} B=1 S={r['cache']}: T={tt} ≤ {lim}× a step | {got:.2f}× | "
                     f"{'PASS' if got <= lim else 'FAIL'} |")
      b = before.get((name, 1, r["cache"]))
      if b:
        change = r["t1_ms"] / b["t1_ms"] - 1
        lines.append(f"| {name} B=1 S={r['cache']}: one-token step no slower (±3%) | "
                     f"{b['t1_ms']:.3f} → {r['t1_ms']:.3f} ms ({change:+.1%}) | "
                     f"{'PASS' if change <= 0.03 else 'FAIL'} |")
  return lines


def render(results: dict) -> str:
  meta = results["meta"]
  before = {(r["model"], r["batch"], r["cache"]): r for r in results.get("before", {}).get(
      "cells", [])}
  lines = ["# Verify cost: a call on T tokens against a one-token step", "",
           f"{meta['machine']}; jax {meta['jax']}; random weights, float32, "
           f"`matvec_max_rows=0`; {meta['repeats']} interleaved rounds per cell (medians); "
           f"load average at start {meta['load_average_at_start']:.2f}; "
           f"run {meta.get('label') or '(unlabelled)'}"
           + (f", before = {results['before']['meta'].get('label') or 'an earlier run'}"
              if before else "") + "." + provenance_sentence(results), ""]
  lines += ["## Goals", "", "| goal | measured | status |", "|---|---|---|"]
  lines += _goal_lines(results["cells"], before) or ["| (no goal cells measured) | | |"]
  tokens = list(results["cells"][0]["ratio"]) if results["cells"] else ["1"]
  lines += ["", "## Cost of a call on T tokens / a one-token step", "",
            "Each cell: this run" + (" (before → after)" if before else "") + ".", "",
            "| model | B | S | T=1 ms | " + " | ".join(f"T={t}" for t in tokens[1:]) + " |",
            "|---" * (4 + len(tokens) - 1) + "|"]
  for r in results["cells"]:
    b = before.get((r["model"], r["batch"], r["cache"]))
    cells = []
    for t in tokens[1:]:
      now_r = r["ratio"][t]
      cells.append(f"{b['ratio'][t]:.2f} → {now_r:.2f}" if b and t in b["ratio"] else f"{now_r:.2f}")
    t1 = f"{b['t1_ms']:.3f} → {r['t1_ms']:.3f}" if b else f"{r['t1_ms']:.3f}"
    lines.append(f"| {r['model']} | {r['batch']} | {r['cache']} | {t1} | " + " | ".join(cells)
                 + " |")
  if results.get("products"):
    lines += ["", "## The matrix products alone (every projection of a call, no attention)", "",
              "| model | weights MB | M=1 ms | GB/s at M=1 | " + " | ".join(
                  f"M={m} / M=1" for m in ("2", "5", "8", "16")) + " | GFLOP/s at M=5 |",
              "|---" * 9 + "|"]
    for p in results["products"]:
      lines.append(f"| {p['model']} | {p['weight_mb']:.1f} | {p['ms']['1']:.3f} | "
                   f"{p['gb_per_s']['1']:.1f} | " + " | ".join(
                       f"{p['ratio'][m]:.2f}" for m in ("2", "5", "8", "16"))
                   + f" | {p['gflop_per_s']['5']:.0f} |")
  if results.get("profile"):
    lines += ["", "## Where a call's time goes (jax.profiler, batch 1, 512 slots)", "",
              "Thunk time per call by what it computes; profiled times include the profiler's "
              "overhead per thunk, so compare shares and the change from T = 1.", ""]
    for name in sorted({p["model"] for p in results["profile"]}):
      prof = {p["tokens"]: p for p in results["profile"] if p["model"] == name}
      ts = sorted(prof)
      cats = sorted({c for p in prof.values() for c in p["us_per_call"]},
                    key=lambda c: -prof[ts[-1]]["us_per_call"].get(c, 0.0))
      lines += [f"### {name}", "", "| what | " + " | ".join(f"T={t} µs (share)" for t in ts)
                + f" | T={ts[-1]} / T={ts[0]} |", "|---" * (len(ts) + 2) + "|"]
      for c in cats:
        vals = [prof[t]["us_per_call"].get(c, 0.0) for t in ts]
        shares = [v / prof[t]["total_us"] for v, t in zip(vals, ts)]
        ratio = f"{vals[-1] / vals[0]:.2f}×" if vals[0] > 0 else "—"
        lines.append(f"| {c} | " + " | ".join(f"{v:.0f} ({s:.0%})" for v, s in zip(vals, shares))
                     + f" | {ratio} |")
      lines.append("| **total** | " + " | ".join(f"{prof[t]['total_us']:.0f}" for t in ts)
                   + f" | {prof[ts[-1]]['total_us'] / prof[ts[0]]['total_us']:.2f}× |")
      lines.append("")
  return "\n".join(lines) + "\n"


def _ab_cells(models: list, repeats: int) -> dict:
  """The cells measured alternately in the other checkout (before) and this
  one (after), each round a fresh process per side; per cell and T the
  median over rounds of each side's ratio and T = 1 time."""
  import subprocess  # pylint: disable=g-import-not-at-top
  here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  sides = {"before": os.path.abspath(_AB.value), "after": here}
  runs = {side: [] for side in sides}
  flags_ = [f"--models={','.join(models)}", f"--repeats={repeats}",
            f"--batches={','.join(_BATCHES.value)}", f"--caches={','.join(_CACHES.value)}",
            f"--tokens={','.join(_TOKENS.value)}"]
  for r in range(_AB_ROUNDS.value):
    for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
      out = os.path.join(tempfile.mkdtemp(prefix="verify_ab_"), "cells.json")
      env = dict(os.environ, PYTHONPATH=sides[side])
      # Each side's own copy of this script, so it imports its own specjax.
      script = os.path.join(sides[side], "benchmarks", "verify_cost.py")
      subprocess.run([sys.executable, script, f"--cells_json={out}"] + flags_, cwd=sides[side],
                     env=env, check=True)
      with open(out, encoding="utf-8") as f:
        runs[side].append(json.load(f))
      logging.info("ab round %d: %s done", r, side)
  merged = {}
  for side, rounds in runs.items():
    cells = []
    for i, cell in enumerate(rounds[0]):
      per_round = [rd[i] for rd in rounds]
      med = lambda key, t: float(np.median([c[key][t] for c in per_round]))
      cells.append({**cell, "t1_ms": float(np.median([c["t1_ms"] for c in per_round])),
                    "ms": {t: med("ms", t) for t in cell["ms"]},
                    "ratio": {t: med("ratio", t) for t in cell["ratio"]},
                    "rounds": len(per_round)})
    merged[side] = cells
  return merged


def main(argv):
  del argv
  quick = _QUICK.value
  if _CELLS_JSON.value:
    cells = []
    for name in _MODELS.value:
      cells += measure_cells(name, quick, 2 if quick else _REPEATS.value)
    atomic_write_text(_CELLS_JSON.value, json.dumps(cells))
    return
  repeats = 2 if quick else _REPEATS.value
  meta = {"machine": machine_line(),
          "jax": jax.__version__, "repeats": repeats, "label": _LABEL.value, "quick": quick,
          "load_average_at_start": os.getloadavg()[0]}
  models = ["chen", "t5"] if quick else list(_MODELS.value)
  results = {"meta": meta, "cells": [], "products": [], "profile": [],
             "provenance": provenance()}
  if _BEFORE.value:
    with open(_BEFORE.value, encoding="utf-8") as f:
      results["before"] = {k: v for k, v in json.load(f).items() if k in ("meta", "cells")}
  if _AB.value:
    ab = _ab_cells(models, repeats)
    results["cells"] = ab["after"]
    results["before"] = {"meta": {"label": f"{_AB.value} (alternated, "
                                           f"{_AB_ROUNDS.value} rounds each)"},
                         "cells": ab["before"]}
    meta["ab_rounds"] = _AB_ROUNDS.value
  else:
    for name in models if _CELLS.value else ():
      results["cells"] += measure_cells(name, quick, repeats)
  if _PRODUCTS.value:
    for name in models:
      results["products"].append(measure_products(name, quick, repeats))
      logging.info("products %s: %s", name, results["products"][-1]["ratio"])
  if _PROFILE.value:
    for name in [m for m in ("chen", "t5") if m in models]:
      for t in (1, GAMMA[name] + 1):
        results["profile"].append(profile_call(name, t, quick, 64 if quick else 512))
  md = render(results)
  os.makedirs(_OUT.value, exist_ok=True)
  atomic_write_text(os.path.join(_OUT.value, "verify_cost.json"), json.dumps(results, indent=1))
  atomic_write_text(os.path.join(_OUT.value, "verify_cost.md"), md)
  print(md)


if __name__ == "__main__":
  app.run(main)
