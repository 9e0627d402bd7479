"""Decode-step projections on CPU: the packed layout and one matrix-vector
product per token, against one matrix-matrix product on the standard layout.

  python benchmarks/projections_bench.py               # Chen target shape, ~6 min
  python benchmarks/projections_bench.py --quick       # tiny model (smoke run)

A decode step at small batch is a chain of products of a few token vectors
with each weight matrix. On XLA:CPU two things set their speed:

* XLA:CPU's matrix-vector product (YNNPACK, jaxlib 0.10.2's default dot
  backend) reads a kernel faster the longer its
  contiguous rows are (about 8 GB/s at rows of 384 floats, 16-20 GB/s at
  2048-4096 on the 2-core development machine). The packed decode layout
  (`DecoderLM.pack_params`) holds q/k/v as one kernel, gate/up as one, and
  down transposed: 4 wider kernels per layer instead of 7.
* Its matrix-matrix product at 2-8 rows reads the weights at about half the
  matrix-vector bandwidth. `DecoderConfig.matvec_max_rows` (default 8 on CPU)
  computes such calls as one matrix-vector product per token, back to back
  on each kernel: the kernel streams from memory once, the later products
  read it from cache.

Four variants of the same random weights, measured side by side in one
process, interleaved measurement by measurement: "packed" (packed layout,
matrix-vector products up to 8 tokens: the library's CPU default), "tuned"
(packed layout, `matvec_max_rows` chosen on this machine by
`specjax.tune_matvec_rows`, run first), "standard" (the standard layout,
products up to 8 tokens) and "matmul" (the standard layout, one
matrix-matrix product per call: the computation before either change). The
ratios are medians of the paired ratios matmul / variant (the machine is
noisy). Cells:

* `step_times` (in-graph, no dispatch) at batch B and T new tokens: B * T = 1
  is a matrix-vector product in every variant (only the layout differs);
  B * T = 12 > 8 is one matrix-matrix product in every variant (the packed
  layout's cost there);
* wall time per generated token of greedy `generate` at batch 1 and 8 (N
  tokens after a P-token prompt, minus the N = 1 call: the decode loop
  alone), and whether the variants generate the same tokens.

Writes `projections.json` and `projections.md` into --out_dir.
"""

import json
import os
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

import specjax
from specjax.atomic_io import atomic_write_text
from specjax.measure.provenance import machine_line, provenance, provenance_sentence
from specjax.measure.timing import step_times_side_by_side, time_call
from specjax.models.decoder import DecoderConfig, DecoderLM, decoder_config

_OUT = flags.DEFINE_string("out_dir", os.path.join(os.path.dirname(__file__), "results"),
                           "Where projections.json / projections.md go.")
_QUICK = flags.DEFINE_bool("quick", False, "Tiny model, one round (smoke run).")
_REPEATS = flags.DEFINE_integer("repeats", 15, "Interleaved measurements per cell (medians).")

# The Chen reproduction's `full` target (17.3M parameters).
CHEN_TARGET = DecoderConfig(vocab_size=4096, d_model=384, num_layers=8, num_heads=6,
                            num_kv_heads=6, head_dim=64, mlp_dim=1024)
VARIANTS = ("packed", "tuned", "standard", "matmul")
BASELINE = "matmul"


def _generate(lm, params, prompts, n, cache_len):
  return specjax.generate(lm, params, prompts, max_new_tokens=n, sampling=specjax.GREEDY,
                          cache_len=cache_len).tokens


def _row(what, seconds, path):
  """One table row: per variant the median ms and the paired ratio baseline / variant."""
  row = {"what": what, "path": path}
  for k in VARIANTS:
    row[f"{k}_ms"] = 1e3 * statistics.median(seconds[k])
    row[f"{k}_speedup"] = statistics.median(
        [b / v for b, v in zip(seconds[BASELINE], seconds[k])])
  return row


def main(argv):
  del argv
  quick = _QUICK.value
  config = decoder_config("tiny") if quick else CHEN_TARGET
  rows_max = 8
  cells = ([(1, 3)] if quick else
           [(1, 1), (1, 2), (1, 3), (1, 5), (4, 1), (8, 1), (16, 1), (4, 3)])
  prompt_len, max_new = (8, 8) if quick else (64, 64)
  cache_len = prompt_len + max_new
  repeats = 3 if quick else _REPEATS.value
  rowwise = DecoderLM(config.replace(matvec_max_rows=rows_max))
  standard = rowwise.init(jax.random.PRNGKey(0))
  packed = rowwise.pack_params(standard)
  choice = specjax.tune_matvec_rows(rowwise, packed, row_counts=(2, 3) if quick else
                                    (2, 3, 4, 5, 8), prompt_len=prompt_len,
                                    steps=2 if quick else 16, repeats=2 if quick else 7,
                                    log=logging.info)
  models = {"packed": rowwise, "tuned": choice.apply(rowwise), "standard": rowwise,
            "matmul": DecoderLM(config.replace(matvec_max_rows=0))}
  params = {"packed": packed, "tuned": packed, "standard": standard, "matmul": standard}
  rng = np.random.default_rng(0)
  prompts = {b: jnp.asarray(rng.integers(2, config.vocab_size, size=(b, prompt_len)),
                            jnp.int32) for b in ((8,) if quick else (1, 8))}
  rows = []
  for b, t in cells:
    n = b * t
    path = ("matrix-vector (every variant)" if n == 1 else
            f"one product per token (matmul: one {n}-row product)" if n <= rows_max else
            f"one {n}-row product (every variant)")
    sec = step_times_side_by_side(models, params, b, cache_len, prompt_len, t, repeats=repeats)
    rows.append(_row(f"step_times B={b} T={t}", sec, path))
    logging.info("step B=%d T=%d: %s", b, t, ", ".join(
        f"{k} {rows[-1][k + '_ms']:.2f} ms ({rows[-1][k + '_speedup']:.2f}x)" for k in VARIANTS))
    jax.clear_caches()

  # The decode loop end to end: generate at batch 1 and 8, minus its N = 1 call.
  same = True
  for b, x in prompts.items():
    tokens, per_token = {}, {k: [] for k in VARIANTS}
    for k in VARIANTS:  # compile all first
      tokens[k] = np.asarray(_generate(models[k], params[k], x, max_new, cache_len))
      _generate(models[k], params[k], x, 1, cache_len).block_until_ready()
    for r in range(2 if quick else repeats):
      for k in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):  # none always first
        lm, p = models[k], params[k]
        full = time_call(lambda: _generate(lm, p, x, max_new, cache_len), repeats=1)
        one = time_call(lambda: _generate(lm, p, x, 1, cache_len), repeats=1)
        per_token[k].append((full["median_s"] - one["median_s"]) / (max_new - 1))
    same = same and all(np.array_equal(tokens[k], tokens[BASELINE]) for k in VARIANTS)
    rows.append(_row(f"generate B={b}, ms per step (N={max_new}, P={prompt_len})", per_token,
                     "matrix-vector (every variant)" if b == 1 else
                     "one product per row (tuned: if B <= its rows; matmul: one B-row product)"))
  record = provenance()
  meta = {"machine": machine_line(), "jax": jax.__version__,
          "model": "tiny" if quick else "Chen target shape (17.3M)", "params": config.num_params(),
          "repeats": repeats, "cache_len": cache_len, "matvec_max_rows": rows_max,
          "tuned_matvec_max_rows": choice.rows, "tuning": choice.to_dict(),
          "greedy_tokens_identical": same, "load_average_at_start": os.getloadavg()[0]}
  lines = ["# Decode-step projections: packed layout and matrix-vector products (CPU)", "",
           f"{meta['machine']}; jax {meta['jax']}; {meta['model']}, random weights; "
           f"{repeats} interleaved measurements per cell: medians, and the median of the paired "
           f"ratios matmul / variant (measured moments apart); cache {cache_len} slots; load "
           f"average at start {meta['load_average_at_start']:.2f}. packed = packed layout "
           f"(`DecoderLM.pack_params`) with one matrix-vector product per token up to "
           f"{rows_max} tokens (the CPU default); tuned = packed layout, `matvec_max_rows` = "
           f"{choice.rows}, chosen on this machine by `specjax.tune_matvec_rows` (per-token / "
           f"one-product speedup at N rows: "
           + ", ".join(f"N={n} {v:.2f}×" for n, v in choice.speedups.items())
           + f"); standard = the standard layout, products up to {rows_max} tokens; matmul = the "
           f"standard layout, one matrix-matrix product per call (`matvec_max_rows=0`). Greedy "
           f"tokens identical across the variants: {'yes' if same else 'NO'}."
           + provenance_sentence(record), "",
           "| measurement | " + " | ".join(f"{k} ms" for k in VARIANTS) + " | "
           + " | ".join(f"{k} speedup" for k in VARIANTS if k != BASELINE)
           + " | products (packed, standard) |", "|---" * (2 * len(VARIANTS) + 1) + "|"]
  for row in rows:
    lines.append(f"| {row['what']} | " + " | ".join(f"{row[k + '_ms']:.2f}" for k in VARIANTS)
                 + " | " + " | ".join(f"{row[k + '_speedup']:.2f}×" for k in VARIANTS
                                      if k != BASELINE) + f" | {row['path']} |")
  md = "\n".join(lines) + "\n"
  os.makedirs(_OUT.value, exist_ok=True)
  for name, text in [("projections.json", json.dumps({"meta": meta, "rows": rows,
                                                          "provenance": record}, indent=1)),
                     ("projections.md", md)]:
    atomic_write_text(os.path.join(_OUT.value, name), text)
  print(md)


if __name__ == "__main__":
  app.run(main)
