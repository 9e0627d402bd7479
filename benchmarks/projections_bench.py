"""Fused decode-step projections: one wide matmul for q/k/v and one for gate/up.

  python benchmarks/projections_bench.py               # Chen target shape, ~3 min
  python benchmarks/projections_bench.py --quick       # tiny model (smoke run)

A decode step at batch 1 is a chain of matrix-vector products whose cost on
XLA:CPU is the weights read plus a fixed cost per product.
`DecoderConfig.fused_projections` (opt-in) concatenates the q/k/v kernels
(and gate/up) for single-token calls, so a layer runs 4 products instead of 7;
calls on several tokens keep the separate matmuls. This benchmark measures,
side by side in one process on the same random weights, the model with the
option on and off, interleaved measurement by measurement; the ratio reported
is the median of the paired ratios (the machine is noisy):

* `step_times` (in-graph, no dispatch) at batch B and T new tokens; only
  B * T = 1 differs in the computation, the other cells are controls that
  show the noise (same HLO both ways);
* wall time per generated token of greedy `generate` at batch 1 (N tokens
  after a P-token prompt, minus the N = 1 call: the decode loop alone).

Writes `projections.json` and `projections.md` into --out_dir.
"""

import json
import os
import platform
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import specjax  # noqa: E402
from specjax.atomic_io import atomic_write_text  # noqa: E402
from specjax.benchmarking import step_times_side_by_side, time_call  # noqa: E402
from specjax.models.decoder import DecoderConfig, DecoderLM, decoder_config  # noqa: E402

_OUT = flags.DEFINE_string("out_dir", os.path.join(os.path.dirname(__file__), "results"),
                           "Where projections.json / projections.md go.")
_QUICK = flags.DEFINE_bool("quick", False, "Tiny model, one round (smoke run).")
_REPEATS = flags.DEFINE_integer("repeats", 15, "Interleaved measurements per cell (medians).")

# The Chen reproduction's `full` target (17.3M parameters).
CHEN_TARGET = DecoderConfig(vocab_size=4096, d_model=384, num_layers=8, num_heads=6,
                            num_kv_heads=6, head_dim=64, mlp_dim=1024)


def _generate(lm, params, prompts, n, cache_len):
  return specjax.generate(lm, params, prompts, max_new_tokens=n, sampling=specjax.GREEDY,
                          cache_len=cache_len).tokens


def main(argv):
  del argv
  quick = _QUICK.value
  config = decoder_config("tiny") if quick else CHEN_TARGET
  cells = [(1, 1), (1, 3)] if quick else [(1, 1), (1, 2), (1, 5), (2, 1), (8, 1)]
  prompt_len, max_new = (8, 8) if quick else (64, 64)
  cache_len = prompt_len + max_new
  models = {"fused": DecoderLM(config.replace(fused_projections=True)),
            "separate": DecoderLM(config)}
  params = models["fused"].init(jax.random.PRNGKey(0))
  prompts = jnp.asarray(np.random.default_rng(0).integers(2, config.vocab_size,
                                                          size=(1, prompt_len)), jnp.int32)
  rows = []
  for b, t in cells:
    sec = step_times_side_by_side(models, params, b, cache_len, prompt_len, t,
                                  repeats=3 if quick else _REPEATS.value)
    ratios = [s_ / f_ for s_, f_ in zip(sec["separate"], sec["fused"])]
    f, s_ = (1e3 * statistics.median(sec[k]) for k in ("fused", "separate"))
    rows.append({"what": f"step_times B={b} T={t}", "fused_ms": f, "separate_ms": s_,
                 "ratio": statistics.median(ratios), "fused_computation": b * t == 1})
    logging.info("step B=%d T=%d: fused %.2f ms, separate %.2f ms, paired ratio %.2f", b, t, f,
                 s_, rows[-1]["ratio"])
    jax.clear_caches()

  # The decode loop end to end: generate at batch 1, minus its N = 1 call.
  tokens, per_token = {}, {k: [] for k in models}
  for kind, lm in models.items():  # compile both first
    tokens[kind] = np.asarray(_generate(lm, params, prompts, max_new, cache_len))
    _generate(lm, params, prompts, 1, cache_len).block_until_ready()
  for r in range(2 if quick else _REPEATS.value):
    for kind in (list(models) if r % 2 == 0 else list(models)[::-1]):  # neither always first
      lm = models[kind]
      full = time_call(lambda: _generate(lm, params, prompts, max_new, cache_len), repeats=1)
      one = time_call(lambda: _generate(lm, params, prompts, 1, cache_len), repeats=1)
      per_token[kind].append((full["median_s"] - one["median_s"]) / (max_new - 1))
  same = bool(np.array_equal(tokens["fused"], tokens["separate"]))
  ratios = [s_ / f_ for s_, f_ in zip(per_token["separate"], per_token["fused"])]
  f, s_ = (1e3 * statistics.median(per_token[k]) for k in ("fused", "separate"))
  rows.append({"what": f"generate B=1, ms per token (N={max_new}, P={prompt_len})",
               "fused_ms": f, "separate_ms": s_, "ratio": statistics.median(ratios),
               "fused_computation": True})
  meta = {"machine": f"{platform.machine()} {os.cpu_count()} cores", "jax": jax.__version__,
          "model": "tiny" if quick else "Chen target shape (17.3M)", "params": config.num_params(),
          "repeats": 3 if quick else _REPEATS.value, "cache_len": cache_len, "greedy_tokens_identical": same,
          "load_average_at_start": os.getloadavg()[0]}
  lines = ["# Fused decode-step projections (`DecoderConfig.fused_projections`)", "",
           f"{meta['machine']}; jax {meta['jax']}; {meta['model']}, random weights; "
           f"{meta['repeats']} interleaved measurements per cell: medians, and the median of "
           f"the paired ratios (separate / fused, measured moments apart); cache {cache_len} slots; load average at start "
           f"{meta['load_average_at_start']:.2f}. Greedy tokens identical: "
           f"{'yes' if same else 'NO'}.", "",
           "| measurement | fused ms | separate ms | separate / fused | fused path taken |",
           "|---|---|---|---|---|"]
  for row in rows:
    lines.append(f"| {row['what']} | {row['fused_ms']:.2f} | {row['separate_ms']:.2f} | "
                 f"{row['ratio']:.2f}× | {'yes' if row['fused_computation'] else 'no (control)'} |")
  md = "\n".join(lines) + "\n"
  os.makedirs(_OUT.value, exist_ok=True)
  for name, text in [("projections.json", json.dumps({"meta": meta, "rows": rows}, indent=1)),
                     ("projections.md", md)]:
    atomic_write_text(os.path.join(_OUT.value, name), text)
  print(md)


if __name__ == "__main__":
  app.run(main)
