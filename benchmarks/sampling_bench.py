"""Sampling benchmark: the per-token work outside the model call.

  python benchmarks/sampling_bench.py                  # V 2k/4k/32k, B 1/16, ~2 min
  python benchmarks/sampling_bench.py --quick          # one shape (smoke run)

Every decoding step turns logits into a processed distribution
(`specjax.process_logits`) and draws a token (`specjax.sampling.sample_tokens`);
a speculative iteration does this γ times for the draft and once more for the
residual. On XLA:CPU the textbook implementations — a Gumbel-max draw
(`jax.random.categorical`, V random numbers per row) and top-p by a full sort
— cost more than a small draft's forward pass. This benchmark times, side by
side in one process and inside one jitted `lax.fori_loop` (as the decoding
loop runs them, no dispatch counted):

* draw: `jax.random.categorical` (baseline) vs specjax's two-level inverse CDF;
* top-p 0.8: sort + cumsum cut (baseline) vs specjax's bisection on the
  float bits (the same kept set);

for shapes [B, V] (a draft step) and [B, γ+1, V] (a verify). Writes
`sampling.json` and `sampling.md` into --out_dir.
"""

import json
import os

import jax
import jax.numpy as jnp
from absl import app, flags, logging

from specjax.atomic_io import atomic_write_text
from specjax.measure.provenance import machine_line, provenance, provenance_sentence
from specjax.measure.timing import now
from specjax.sampling import SamplingConfig, process_logits, sample_tokens

_OUT = flags.DEFINE_string("out_dir", os.path.join(os.path.dirname(__file__), "results"),
                           "Where sampling.json / sampling.md go.")
_QUICK = flags.DEFINE_bool("quick", False, "One shape (smoke run).")
_ITERS = flags.DEFINE_integer("iters", 200, "Calls per in-graph loop.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed loops per measurement (median).")


def baseline_draw(keys_B, probs_BV):
  """Gumbel-max: what `jax.random.categorical` does."""
  return jax.vmap(lambda k, p: jax.random.categorical(k, jnp.log(p)))(keys_B, probs_BV)


def baseline_top_p(logits, top_p):
  """Sort, cumulative sum, cut at the first prefix reaching top_p."""
  probs = jax.nn.softmax(logits, axis=-1)
  sorted_probs = jnp.flip(jnp.sort(probs, axis=-1), axis=-1)
  keep = (jnp.cumsum(sorted_probs, axis=-1) - sorted_probs) < top_p
  thr = jnp.min(jnp.where(keep, sorted_probs, jnp.inf), axis=-1, keepdims=True)
  probs = jnp.where(probs >= thr, probs, 0.0)
  return probs / jnp.sum(probs, axis=-1, keepdims=True)


def in_loop_us(fn, x, iters, repeats):
  """Microseconds per call of fn(x, i) run `iters` times in one fori_loop."""

  @jax.jit
  def loop(x):
    def body(i, acc):
      return acc + jnp.sum(fn(x + acc * 0.0, i)).astype(jnp.float32)
    return jax.lax.fori_loop(0, iters, body, jnp.zeros((), jnp.float32))

  loop(x).block_until_ready()
  times = []
  for _ in range(repeats):
    t0 = now()
    loop(x).block_until_ready()
    times.append(now() - t0)
  times.sort()
  return 1e6 * times[len(times) // 2] / iters


def measure(shape, iters, repeats):
  logits = jax.random.normal(jax.random.key(0), shape, jnp.float32) * 3.0
  rows = 1
  for d in shape[:-1]:
    rows *= d
  flat = logits.reshape(rows, shape[-1])
  probs = jax.nn.softmax(flat, axis=-1)
  base_key = jax.random.key(1)

  def keys(i):
    return jax.random.split(jax.random.fold_in(base_key, i), rows)

  nucleus = SamplingConfig(1.0, top_p=0.8)
  row = {"shape": list(shape)}
  row["draw_categorical_us"] = in_loop_us(lambda p, i: baseline_draw(keys(i), p), probs, iters,
                                          repeats)
  row["draw_specjax_us"] = in_loop_us(lambda p, i: sample_tokens(keys(i), p), probs, iters,
                                      repeats)
  row["top_p_sort_us"] = in_loop_us(lambda x, i: baseline_top_p(x, 0.8), logits, iters, repeats)
  row["top_p_specjax_us"] = in_loop_us(lambda x, i: process_logits(x, nucleus), logits, iters,
                                       repeats)
  row["softmax_us"] = in_loop_us(lambda x, i: jax.nn.softmax(x, axis=-1), logits, iters, repeats)
  same = bool(jnp.all((baseline_top_p(logits, 0.8) > 0) == (process_logits(logits, nucleus) > 0)))
  row["top_p_same_kept_set"] = same
  row["draw_ratio"] = row["draw_categorical_us"] / row["draw_specjax_us"]
  row["top_p_ratio"] = row["top_p_sort_us"] / row["top_p_specjax_us"]
  return row


def to_markdown(rows, meta, record=None):
  """The report's markdown; `record` is the run's provenance (`meta` holds it in older JSON)."""
  lines = [
      "# Sampling: per-token work outside the model call",
      "",
      f"{meta['machine']}; jax {meta['jax']}; in-graph (one jitted fori_loop of "
      f"{meta['iters']} calls), median of {meta['repeats']} loops; µs per call."
      + provenance_sentence(record or meta),
      "",
      "| shape [B, (T,) V] | draw: categorical | draw: specjax | × | top-p 0.8: sort | "
      "top-p 0.8: specjax | × | softmax | same kept set |",
      "|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
        f"| {r['shape']} | {r['draw_categorical_us']:.0f} | {r['draw_specjax_us']:.0f} | "
        f"{r['draw_ratio']:.1f} | {r['top_p_sort_us']:.0f} | {r['top_p_specjax_us']:.0f} | "
        f"{r['top_p_ratio']:.1f} | {r['softmax_us']:.0f} | {'yes' if r['top_p_same_kept_set'] else 'NO'} |")
  lines += ["", "Draws of [B, γ+1, V] shapes are not made (a verify draws one residual per row)."]
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  shapes = [(1, 2048)] if _QUICK.value else [
      (1, 2048), (1, 5, 2048), (16, 2048), (1, 4096), (1, 5, 4096), (16, 4096),
      (1, 32128), (1, 5, 32128)]
  rows = []
  for shape in shapes:
    r = measure(shape, _ITERS.value, _REPEATS.value)
    logging.info("%s: draw %.0f → %.0f µs, top-p %.0f → %.0f µs", shape,
                 r["draw_categorical_us"], r["draw_specjax_us"], r["top_p_sort_us"],
                 r["top_p_specjax_us"])
    rows.append(r)
  record = provenance()
  meta = {"machine": machine_line(), "jax": jax.__version__,
          "iters": _ITERS.value, "repeats": _REPEATS.value,
          "load_average_at_start": os.getloadavg()[0]}
  os.makedirs(_OUT.value, exist_ok=True)
  result = {"meta": meta, "rows": rows, "provenance": record}
  for name, text in [("sampling.json", json.dumps(result, indent=1)),
                     ("sampling.md", to_markdown(rows, meta, record))]:
    atomic_write_text(os.path.join(_OUT.value, name), text)
  print(to_markdown(rows, meta, record))


if __name__ == "__main__":
  app.run(main)
