"""Measure before you train: what a verify costs at long contexts × batch.

  python benchmarks/long_context_cost.py                 # ~25 min on 2 cores
  python benchmarks/long_context_cost.py --quick         # tiny model, seconds

Speculative decoding pays where a decode step is memory-bound: the bytes it
reads (weights + every row's KV cache) dwarf the CPU's caches, so a call on
γ+1 tokens costs about what a one-token call costs. On a CPU that regime is
long contexts × batch (MagicDec, arXiv 2408.11049). With random weights
(the timing of dense products does not depend on the values) this measures,
for the long-context experiment's target shape (`configs/long_context.py`:
the Chen `full` target, 8 layers × 384, 6 heads × 64) and its drafts, per
(batch, context):

* bytes one step reads: weights + KV (`2 · L · K · D · 4` bytes per cached
  position and row);
* the target's one-token step and its call on γ+1 tokens (the verify), in
  one jitted `lax.fori_loop` of `extend` calls over a cache of `context`
  valid positions (`specjax.measure.timing.cache_step_times`: no prefill in
  the timed function, every logit consumed);
* the drafts' one-token steps: the windowed-KV self-draft (the target over
  sinks + window ring slots) and the classic small draft (1 layer × 160)
  over the whole context;
* the speedup the components predict at α ∈ {0.6, 0.8, 0.9} (Leviathan's
  formula with the measured verify cost: `specjax.theory`).

Two more sections:

* `--waste`: a cache buffer of 4096 slots holding 512 / 1024 / 2048 valid
  positions against a buffer of exactly that size — what the masked
  attention over the static buffer beyond the valid part costs;
* `--formulations`: one layer's attention over the cache alone (6 heads ×
  64, batch 16, 4096 slots) at T = 1 and T = γ+1, in five formulations: the
  library's (keys `[D, S]`, values `[S, D]`, queries on the left of both
  products), queries on the right (`[S, D] @ [D, T]`), values slots-last,
  a multiply-and-reduce without a matrix product, and T separate one-token
  products; with the rates (GB/s of KV read, GFLOP/s) that explain them.

Writes long_context_cost.json / .md into --out_dir.
"""

import json
import os
import platform

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

from specjax import theory
from specjax.atomic_io import atomic_write_text
from specjax.drafters.windowed import WindowedLM
from specjax.measure.provenance import provenance, provenance_sentence
from specjax.measure.timing import cache_step_times, now
from experiments.programs.long_context_measure import (component_times,
                                                      kv_bytes_per_position)
from experiments.programs.report import machine_info
from specjax.models.decoder import DecoderConfig, DecoderLM, decoder_config

_OUT = flags.DEFINE_string("out_dir", os.path.join(os.path.dirname(__file__), "results"),
                           "Where long_context_cost.json / .md go.")
_QUICK = flags.DEFINE_bool("quick", False, "Tiny model, two cells (smoke run).")
_BATCHES = flags.DEFINE_list("batches", ["1", "4", "16", "32"], "Batch sizes.")
_CONTEXTS = flags.DEFINE_list("contexts", ["512", "1024", "2048", "4096"], "Context lengths.")
_GAMMA = flags.DEFINE_integer("gamma", 4, "Drafts per iteration (the verify is γ+1 tokens).")
_WINDOW = flags.DEFINE_integer("window", 256, "The self-draft's window (positions).")
_SINKS = flags.DEFINE_integer("sinks", 4, "The self-draft's attention sinks.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Interleaved rounds per cell (medians).")
_WASTE = flags.DEFINE_bool("waste", True, "Add the static-buffer section.")
_FORMS = flags.DEFINE_bool("formulations", True, "Add the attention-formulations section.")
_ONLY_FORMS = flags.DEFINE_bool("formulations_only", False, "Measure only that section and "
                                "merge it into an existing long_context_cost.json.")

TARGET = DecoderConfig(vocab_size=4096, d_model=384, num_layers=8, num_heads=6, num_kv_heads=6,
                       head_dim=64, mlp_dim=1024, matvec_max_rows=0)
DRAFT = DecoderConfig(vocab_size=4096, d_model=160, num_layers=1, num_heads=4, num_kv_heads=4,
                      head_dim=40, mlp_dim=448, tie_embeddings=True, matvec_max_rows=0)
ALPHAS = (0.6, 0.8, 0.9)


def measure_cell(models, b: int, s: int, gamma: int, repeats: int) -> dict:
  target, tp, draft, dp, window = models
  c = target.config
  t0 = now()
  comp = component_times(target, tp, draft, dp, window, b, s, gamma, repeats)
  tgt = {1: comp["step_s"], gamma + 1: comp["verify_s"]}
  win, drf = {1: comp["window_s"]}, {1: comp["small_s"]}
  weights = 4 * c.num_params()
  kv = b * s * kv_bytes_per_position(c)
  row = {"batch": b, "context": s, "weights_mb": weights / 1e6, "kv_mb": kv / 1e6,
         "step_ms": 1e3 * tgt[1], "verify_ms": 1e3 * tgt[gamma + 1],
         "verify_ratio": tgt[gamma + 1] / tgt[1],
         "window_step_ms": 1e3 * win[1], "draft_step_ms": 1e3 * drf[1],
         "gb_per_s": (weights + kv) / tgt[1] / 1e9}
  for name, cost in (("window", win[1]), ("draft", drf[1])):
    row[f"{name}_c"] = cost / tgt[1]
    row[f"{name}_predicted"] = {
        str(a): float(theory.walltime_improvement_from_tokens(
            theory.expected_tokens_per_call(a, gamma), gamma, cost / tgt[1],
            tgt[gamma + 1] / tgt[1]))
        for a in ALPHAS}
  logging.info("B=%d S=%d: step %.2f ms, verify %.2fx, window c %.3f, draft c %.3f (%.0fs)",
               b, s, row["step_ms"], row["verify_ratio"], row["window_c"], row["draft_c"],
               now() - t0)
  return row


def measure_waste(target, tp, b: int, buffer: int, valid: int, gamma: int, repeats: int) -> dict:
  whole = cache_step_times(target, tp, b, buffer, valid, (1, gamma + 1), steps=8, repeats=repeats)
  exact = cache_step_times(target, tp, b, valid + gamma + 1, valid, (1, gamma + 1), steps=8,
                           repeats=repeats)
  jax.clear_caches()
  return {"batch": b, "buffer": buffer, "valid": valid,
          "buffer_ms": {str(t): 1e3 * v for t, v in whole.items()},
          "exact_ms": {str(t): 1e3 * v for t, v in exact.items()}}


def _forms():
  """{name: (fn(q [B, K, T, D], k, v) -> [B, K, T, D], key layout, value layout)}."""
  soft = jax.nn.softmax

  def library(q, k_DS, v_SD):
    return jnp.einsum("bkts,bksd->bktd", soft(jnp.einsum("bktd,bkds->bkts", q, k_DS), -1), v_SD)

  def queries_right(q, k_SD, v_SD):
    w = soft(jnp.einsum("bksd,bktd->bkst", k_SD, q), -2)
    return jnp.einsum("bkst,bksd->bktd", w, v_SD)

  def values_slots_last(q, k_DS, v_DS):
    return jnp.einsum("bkts,bkds->bktd", soft(jnp.einsum("bktd,bkds->bkts", q, k_DS), -1), v_DS)

  def multiply_reduce(q, k_DS, v_SD):
    w = soft(jnp.sum(q[..., :, None] * k_DS[:, :, None], axis=3), -1)
    return jnp.sum(w[..., None] * v_SD[:, :, None], axis=3)

  def per_token(q, k_DS, v_SD):
    return jnp.stack([library(q[:, :, t:t + 1], k_DS, v_SD)[:, :, 0]
                      for t in range(q.shape[2])], 2)

  return {"library (q left, K [D,S], V [S,D])": (library, "DS", "SD"),
          "queries on the right (K [S,D])": (queries_right, "SD", "SD"),
          "values slots-last (V [D,S])": (values_slots_last, "DS", "DS"),
          "multiply and reduce (no matmul)": (multiply_reduce, "DS", "SD"),
          "T one-token products": (per_token, "DS", "SD")}


def measure_formulations(b: int, s: int, gamma: int, repeats: int, steps: int = 8) -> list:
  """One layer's attention over a cache of `s` slots, T = 1 and γ+1."""
  k_, d = TARGET.num_kv_heads, TARGET.head_dim
  key = jax.random.PRNGKey(0)
  base = jax.random.normal(key, (b, k_, s, d))
  layouts = {"SD": base, "DS": jnp.swapaxes(base, 2, 3)}
  rows = []
  for name, (fn, kl, vl) in _forms().items():
    k_buf, v_buf = layouts[kl], layouts[vl]
    ms = {}
    for t in (1, gamma + 1):
      q = jax.random.normal(key, (b, k_, t, d))

      def loop(q, k_buf, v_buf, n, fn=fn):
        body = lambda i, acc: acc + fn(q + acc * 0 + i * 1e-6, k_buf, v_buf).sum()
        return jax.lax.fori_loop(0, n, body, jnp.zeros(()))

      run = jax.jit(loop)
      run(q, k_buf, v_buf, 1).block_until_ready()
      per = []
      for _ in range(repeats):
        t0 = now()
        run(q, k_buf, v_buf, steps).block_until_ready()
        t1 = now()
        run(q, k_buf, v_buf, 2 * steps).block_until_ready()
        per.append(((now() - t1) - (t1 - t0)) / steps)
      ms[t] = 1e3 * max(float(np.median(per)), 1e-7)
    kv_bytes = 2 * b * k_ * s * d * 4
    flops = 4 * b * k_ * s * d * (gamma + 1)
    rows.append({"name": name, "t1_ms": ms[1], "tg_ms": ms[gamma + 1],
                 "ratio": ms[gamma + 1] / ms[1], "gb_per_s_t1": kv_bytes / ms[1] / 1e6,
                 "gflops_tg": flops / ms[gamma + 1] / 1e6})
    logging.info("%s: T1 %.2f ms, T%d %.2f ms", name, ms[1], gamma + 1, ms[gamma + 1])
  jax.clear_caches()
  return rows


def render(res: dict) -> str:
  g = res["gamma"]
  out = ["# Long contexts × batch: what a step, a verify and a draft step cost", "",
         res["hardware"] + f"; random weights, float32; γ = {g}; self-draft window "
         f"{res['window']} + {res['sinks']} sinks; medians of {res['repeats']} interleaved "
         "rounds; no prefill in the timed loop." + provenance_sentence(res),
         "",
         "Target: 8 layers × 384 (17.3M params, 69 MB); classic draft: 1 layer × 160 (1.0M).", "",
         "| B | context | weights + KV MB | step ms | GB/s | verify (γ+1) / step | "
         "window draft c | small draft c | predicted α=0.6 / 0.8 / 0.9: window | small draft |",
         "|---|---|---|---|---|---|---|---|---|---|"]
  for r in res["cells"]:
    pw = " / ".join(f"{r['window_predicted'][str(a)]:.2f}" for a in ALPHAS)
    pd = " / ".join(f"{r['draft_predicted'][str(a)]:.2f}" for a in ALPHAS)
    out.append(f"| {r['batch']} | {r['context']} | {r['weights_mb'] + r['kv_mb']:.0f} | "
               f"{r['step_ms']:.2f} | {r['gb_per_s']:.1f} | {r['verify_ratio']:.2f} | "
               f"{r['window_c']:.3f} | {r['draft_c']:.3f} | {pw} | {pd} |")
  if res.get("waste"):
    out += ["", "## The static buffer beyond the valid part", "",
            "Same valid positions, a buffer of exactly that size against a 4096-slot buffer:",
            "", "| B | valid | buffer | step ms (exact → 4096) | verify ms (exact → 4096) |",
            "|---|---|---|---|---|"]
    for w in res["waste"]:
      t = str(g + 1)
      out.append(f"| {w['batch']} | {w['valid']} | {w['buffer']} | {w['exact_ms']['1']:.2f} → "
                 f"{w['buffer_ms']['1']:.2f} | {w['exact_ms'][t]:.2f} → {w['buffer_ms'][t]:.2f} |")
  if res.get("formulations"):
    f = res["formulations"]
    out += ["", "## One layer's attention over the cache, five ways", "",
            f"Batch {f['batch']}, {f['slots']} slots, 6 heads × 64 (200 MB of KV per layer): "
            "the attention products alone, no projections.", "",
            f"| formulation | T=1 ms | T={g + 1} ms | ratio | GB/s at T=1 | GFLOP/s at T={g + 1} |",
            "|---|---|---|---|---|---|"]
    for r in f["rows"]:
      out.append(f"| {r['name']} | {r['t1_ms']:.2f} | {r['tg_ms']:.2f} | {r['ratio']:.2f} | "
                 f"{r['gb_per_s_t1']:.1f} | {r['gflops_tg']:.1f} |")
  return "\n".join(out) + "\n"


def main(argv):
  del argv
  quick, gamma, repeats = _QUICK.value, _GAMMA.value, _REPEATS.value
  path = os.path.join(_OUT.value, "long_context_cost.json")
  if _ONLY_FORMS.value:
    with open(path, encoding="utf-8") as f:
      res = json.load(f)
    res["formulations"] = {"batch": 16, "slots": 4096,
                           "rows": measure_formulations(16, 4096, gamma, max(repeats, 5))}
    atomic_write_text(path, json.dumps(res, indent=1))
    atomic_write_text(os.path.join(_OUT.value, "long_context_cost.md"), render(res))
    print(render(res))
    return
  tcfg, dcfg = (TARGET, DRAFT) if not quick else (
      decoder_config("tiny").replace(matvec_max_rows=0),
      decoder_config("tiny").replace(num_layers=1, matvec_max_rows=0))
  target, draft = DecoderLM(tcfg), DecoderLM(dcfg)
  tp, dp = target.init(jax.random.PRNGKey(0)), draft.init(jax.random.PRNGKey(1))
  window = WindowedLM(target, 16 if quick else _WINDOW.value, _SINKS.value, gamma + 1)
  batches = (1, 2) if quick else tuple(int(b) for b in _BATCHES.value)
  contexts = (64,) if quick else tuple(int(s) for s in _CONTEXTS.value)
  cells = [measure_cell((target, tp, draft, dp, window), b, s, gamma, repeats)
           for b in batches for s in contexts]
  waste = []
  if _WASTE.value and not quick:
    waste = [measure_waste(target, tp, b, 4096, v, gamma, repeats)
             for b in (1, 16) for v in (512, 1024, 2048)]
  m = machine_info()
  hardware = (f"{m['machine']} ({platform.processor() or 'cpu'}), {m['devices']}; jax {m['jax']}; "
              f"load average at the end {m['load_average'][0]:.2f}")
  forms = None
  if _FORMS.value:
    fb, fs = (2, 64) if quick else (16, 4096)
    forms = {"batch": fb, "slots": fs, "rows": measure_formulations(fb, fs, gamma, repeats)}
  res = {"hardware": hardware, "machine": m, "provenance": provenance(), "formulations": forms,
         "gamma": gamma, "window": window.window, "sinks": window.sinks, "repeats": repeats,
         "cells": cells, "waste": waste}
  os.makedirs(_OUT.value, exist_ok=True)
  atomic_write_text(os.path.join(_OUT.value, "long_context_cost.json"), json.dumps(res, indent=1))
  atomic_write_text(os.path.join(_OUT.value, "long_context_cost.md"), render(res))
  print(render(res))


if __name__ == "__main__":
  app.run(main)
