"""Core benchmark: autoregressive vs speculative decoding on this machine.

  python benchmarks/core_bench.py                       # full: batch 1 and 8, gamma 2, 4, 7
  python benchmarks/core_bench.py --quick               # one small cell, for a smoke run
  python benchmarks/core_bench.py --out_dir=/tmp/bench

For each batch size, draft (a ~46x smaller random draft, and the target
itself = "self", every token accepted) and gamma it measures, side by side in
one process:

* component times, in-graph (`specjax.measure.timing.step_times`): target step
  (T=1), target verify (T=gamma+1), draft step (T=1) and the draft's first
  step of an iteration (T=2);
* wall time of `generate` and `speculative_generate` (greedy, no EOS, same
  prompts), interleaved, median of `--repeats`;
* measured tokens per target call / per iteration, the measured speedup, the
  speedup predicted from the component times and the measured tokens per
  iteration, and the loop overhead = predicted / measured - 1.

Writes `core.json` and `core.md` into --out_dir.
"""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

import specjax
from specjax.measure.provenance import machine_line, provenance, provenance_sentence
from specjax.measure.timing import count_params, step_times, time_call
from specjax.models.decoder import DecoderLM, decoder_config

_OUT = flags.DEFINE_string("out_dir", os.path.join(os.path.dirname(__file__), "results"),
                           "Where core.json / core.md go.")
_QUICK = flags.DEFINE_bool("quick", False, "One small cell (smoke run).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats per measurement.")
_TARGET = flags.DEFINE_string("target", "cpu-target-27m", "Target decoder config name.")
_DRAFT = flags.DEFINE_string("draft", "cpu-draft-1m", "Draft decoder config name.")


def measure_cell(target, tp, draft, dp, draft_name, batch, gamma, prompt_len, max_new, repeats):
  rng = np.random.default_rng(batch * 100 + gamma)
  prompts = jnp.asarray(rng.integers(2, target.vocab_size, size=(batch, prompt_len)), jnp.int32)
  cache_len = specjax.required_cache_len(target, prompt_len, max_new, gamma)
  kw = dict(max_new_tokens=max_new, sampling=specjax.GREEDY, cache_len=cache_len)
  outs = {}

  def ar():
    outs["ar"] = specjax.generate(target, tp, prompts, **kw)
    return outs["ar"].tokens

  def sp():
    outs["sp"] = specjax.speculative_generate(target, tp, draft, dp, prompts, gamma=gamma, **kw)
    return outs["sp"].tokens

  compile_ar = time_call(ar, repeats=1)["first_s"]
  compile_sp = time_call(sp, repeats=1)["first_s"]
  t_ar, t_sp = [], []
  for _ in range(repeats):
    t_ar.append(time_call(ar, repeats=1, warmup=0)["median_s"])
    t_sp.append(time_call(sp, repeats=1, warmup=0)["median_s"])
  ar_s, sp_s = float(np.median(t_ar)), float(np.median(t_sp))

  tt = step_times(target, tp, batch, cache_len, prompt_len, [1, gamma + 1], repeats=repeats)
  td = step_times(draft, dp, batch, cache_len, prompt_len, [1, 2], repeats=repeats)
  sp_out = outs["sp"]
  iters = float(jnp.mean(sp_out.stats.target_calls - 1))
  m = sp_out.mean_tokens_per_iteration
  iter_pred_s = td[2] + (gamma - 1) * td[1] + tt[gamma + 1]
  # Both loops also run one prefill; it is in the wall times, so time it too.
  prefill = jax.jit(lambda p, x, c: target.prefill(p, x, jnp.full((batch,), prompt_len), c)[0])
  cache = target.init_cache(batch, cache_len, prompt_len)
  prefill_s = time_call(lambda: prefill(tp, prompts, cache), repeats=repeats)["median_s"]
  ar_pred_s = prefill_s + (max_new - 1) * tt[1]
  sp_pred_s = 2 * prefill_s + iters * iter_pred_s
  predicted_speedup = ar_pred_s / sp_pred_s
  measured_speedup = ar_s / sp_s
  return {
      "draft": draft_name, "batch": batch, "gamma": gamma, "prompt_len": prompt_len,
      "max_new_tokens": max_new, "cache_len": cache_len,
      "greedy_identical": bool(jnp.all(outs["ar"].tokens == sp_out.tokens)),
      "acceptance_rate": sp_out.acceptance_rate, "tokens_per_iteration": m,
      "tokens_per_target_call": sp_out.tokens_per_target_call, "iterations": iters,
      "t_target_step_ms": 1e3 * tt[1], "t_target_verify_ms": 1e3 * tt[gamma + 1],
      "t_draft_step_ms": 1e3 * td[1], "t_draft_first_step_ms": 1e3 * td[2],
      "c": td[1] / tt[1], "verify_cost": tt[gamma + 1] / tt[1], "t_prefill_ms": 1e3 * prefill_s,
      "ar_wall_s": ar_s, "sp_wall_s": sp_s,
      "ar_ms_per_token": 1e3 * ar_s / max_new, "sp_ms_per_token": 1e3 * sp_s / max_new,
      "ar_loop_overhead": ar_s / ar_pred_s - 1, "sp_loop_overhead": sp_s / sp_pred_s - 1,
      "measured_speedup": measured_speedup, "predicted_speedup": predicted_speedup,
      "overhead_vs_prediction": predicted_speedup / measured_speedup - 1,
      "compile_s": {"autoregressive": compile_ar, "speculative": compile_sp},
  }


def to_markdown(meta, rows, record=None):
  """The report's markdown; `record` is the run's provenance (`meta` holds it in older JSON)."""
  lines = [
      "# Core benchmark: autoregressive vs speculative (greedy)", "",
      f"{meta['machine']} · JAX {meta['jax']} · target {meta['target']} "
      f"({meta['target_params'] / 1e6:.1f}M params) · draft {meta['draft']} "
      f"({meta['draft_params'] / 1e6:.2f}M, ratio {meta['ratio']:.0f}x) · prompt "
      f"{rows[0]['prompt_len']} · {rows[0]['max_new_tokens']} new tokens · median of "
      f"{meta['repeats']} interleaved runs." + provenance_sentence(record or meta), "",
      "Times per row-step (a batch step advances every row). `overhead` = predicted speedup / "
      "measured speedup − 1 (the loop's cost beyond its components); `AR ovh` / `SP ovh` = wall "
      "time / time predicted from components − 1.", "",
      "| draft | B | γ | α (acc.) | tok/iter | target step ms | verify ms | draft step ms | c | "
      "AR ms/tok | SP ms/tok | speedup | predicted | overhead | AR ovh | SP ovh | identical |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
        f"| {r['draft']} | {r['batch']} | {r['gamma']} | {r['acceptance_rate']:.3f} | "
        f"{r['tokens_per_iteration']:.2f} | {r['t_target_step_ms']:.2f} | "
        f"{r['t_target_verify_ms']:.2f} | {r['t_draft_step_ms']:.3f} | {r['c']:.3f} | "
        f"{r['ar_ms_per_token']:.2f} | {r['sp_ms_per_token']:.2f} | "
        f"{r['measured_speedup']:.2f}x | {r['predicted_speedup']:.2f}x | "
        f"{100 * r['overhead_vs_prediction']:+.1f}% | {100 * r['ar_loop_overhead']:+.1f}% | "
        f"{100 * r['sp_loop_overhead']:+.1f}% | {r['greedy_identical']} |")
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  target = DecoderLM(decoder_config(_TARGET.value))
  draft = DecoderLM(decoder_config(_DRAFT.value, vocab_size=target.vocab_size))
  tp = jax.jit(target.init)(jax.random.PRNGKey(0))
  dp = jax.jit(draft.init)(jax.random.PRNGKey(1))
  batches, gammas, max_new = ([1], [4], 16) if _QUICK.value else ([1, 8], [2, 4, 7], 64)
  record = provenance()
  meta = {
      "machine": machine_line(), "jax": jax.__version__,
      "backend": jax.default_backend(), "target": _TARGET.value, "draft": _DRAFT.value,
      "target_params": count_params(tp), "draft_params": count_params(dp),
      "ratio": count_params(tp) / count_params(dp), "repeats": _REPEATS.value,
      "date": time.strftime("%Y-%m-%d %H:%M"),
      "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
  }
  rows = []
  cells = [(b, g, d) for b in batches for g in gammas for d in ("small", "self")]
  start = time.time()
  for i, (batch, gamma, which) in enumerate(cells):
    d, p = (draft, dp) if which == "small" else (target, tp)
    rows.append(measure_cell(target, tp, d, p, which, batch, gamma, 32, max_new, _REPEATS.value))
    done = time.time() - start
    logging.info("cell %d/%d (B=%d γ=%d %s): speedup %.2fx predicted %.2fx; ETA %.0fs", i + 1,
                 len(cells), batch, gamma, which, rows[-1]["measured_speedup"],
                 rows[-1]["predicted_speedup"], done / (i + 1) * (len(cells) - i - 1))
  os.makedirs(_OUT.value, exist_ok=True)
  name = "core_quick" if _QUICK.value else "core"
  from specjax.atomic_io import atomic_write_json, atomic_write_text
  atomic_write_json(os.path.join(_OUT.value, f"{name}.json"),
                    {"meta": meta, "rows": rows, "provenance": record}, indent=2)
  md = to_markdown(meta, rows, record)
  atomic_write_text(os.path.join(_OUT.value, f"{name}.md"), md)
  print(md)


if __name__ == "__main__":
  app.run(main)
