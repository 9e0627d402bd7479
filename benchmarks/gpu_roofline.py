"""Step latency of real-size targets and drafts against the HBM roofline (GPU; never CI).

  python benchmarks/gpu_roofline.py --out=benchmarks/results/gpu_roofline.json
  python benchmarks/gpu_roofline.py --families=decoder --cache_len=1024 --out=...
  python benchmarks/gpu_roofline.py --batch=8 --out=benchmarks/results/gpu_roofline_b8.json
  python benchmarks/gpu_roofline.py --cpu_smoke --out=/tmp/roofline.json   # tiny, on CPU (the test)

Random bf16 weights (made leaf by leaf on the device) of T5-XXL (v1.1) with
T5-small/base/large drafts, and of a 7B-class decoder (`llama-7b-like`) with
a ~0.5B draft (`draft-0.5b-like`). For each model: the in-graph step latency
(`specjax.measure.timing.step_times`: the call repeated inside one jitted
fori_loop, prefill subtracted) at T = 1 and, for targets, T = γ + 1; the
bytes the step must move (`specjax.measure.roofline.step_bytes`: the weights it
uses, the KV cache — the whole static buffer — and its writes) divided by
the bandwidth measured with one large on-device elementwise pass. Prints
one table (and c, the verify cost, the speedup the components predict at a
few α, the ≤ 1.3× roofline goal; at --batch=8 also the batch-8 goal,
speculative ≥ 1.5× autoregressive at α = 0.7 as the components predict it)
and writes everything as JSON to --out.
"""

import json
import os
import sys
import time


_SMOKE_FLAG = "--cpu_smoke" in sys.argv
if _SMOKE_FLAG:  # Before JAX starts: CPU, and cheap compilation (its speed is not measured).
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_backend_optimization_level=0").strip()

import jax
from absl import app, flags

from specjax.measure import roofline
from specjax.measure.provenance import provenance

_OUT = flags.DEFINE_string("out", "benchmarks/results/gpu_roofline.json", "JSON output path.")
_SMOKE = flags.DEFINE_bool("cpu_smoke", False, "Tiny shapes on CPU (a smoke run for the test).")
_FAMILIES = flags.DEFINE_list("families", ["t5", "decoder"], "Which model families.")
_BATCH = flags.DEFINE_integer("batch", 1, "Rows per step.")
_PROMPT = flags.DEFINE_integer("prompt_len", 128, "Prompt (decoder-only) / encoder (T5) length.")
_CACHE = flags.DEFINE_integer("cache_len", 512, "Static KV buffer slots.")
_GAMMAS = flags.DEFINE_list("gammas", ["3", "5", "7"], "γ values: targets are timed at T = γ + 1.")
_STEPS = flags.DEFINE_integer("steps", 16, "Steps inside one timed fori_loop.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats (median).")
_PACKED = flags.DEFINE_bool("packed_decoder", True, "Decoder params in the packed decode layout "
                            "(DecoderLM.pack_params); false: the standard tree.")
_BW_GIB = flags.DEFINE_float("bandwidth_gib", 2.0, "Size of the bandwidth-measuring array.")


def main(argv):
  del argv
  smoke = _SMOKE.value
  families = roofline.SMOKE_FAMILIES if smoke else roofline.FAMILIES
  gammas = [3] if smoke else [int(g) for g in _GAMMAS.value]
  prompt_len, cache_len = (8, 32) if smoke else (_PROMPT.value, _CACHE.value)
  steps, repeats = (2, 1) if smoke else (_STEPS.value, _REPEATS.value)
  dev = jax.devices()[0]
  start = time.time()
  log = lambda msg: print(f"[{time.time() - start:6.0f}s] {msg}", flush=True)
  bw = roofline.copy_bandwidth(int((1 / 64 if smoke else _BW_GIB.value) * (1 << 30)),
                               repeats=3 if smoke else 10)
  log(f"{dev.device_kind}: copy bandwidth {bw['bandwidth'] / 1e9:.0f} GB/s (median), "
      f"{bw['peak_bandwidth'] / 1e9:.0f} GB/s (best)")
  rows = []
  common = dict(batch=_BATCH.value, prompt_len=prompt_len, cache_len=cache_len,
                bandwidth=bw["bandwidth"], steps=steps, repeats=repeats,
                packed=_PACKED.value, log=log)
  for family in _FAMILIES.value:
    target_name, drafts = families[family]
    target = roofline.build_model(family, target_name)
    rows += roofline.measure_model(family, target_name, "target", target,
                                   token_counts=[1] + [g + 1 for g in gammas], **common)
    for label, spec in drafts.items():
      rows += roofline.measure_model(family, label, "draft", roofline.build_model(family, spec),
                                     token_counts=[1, 2], **common)
  summary, goals = roofline.summarize(rows, gammas)
  print(roofline.format_table(rows, summary, goals, bw["bandwidth"]))
  result = {"provenance": provenance(), "meta": {"device": str(dev), "device_kind": dev.device_kind,
                     "platform": dev.platform, "jax": jax.__version__,
                     "date": time.strftime("%Y-%m-%d %H:%M"), "cpu_smoke": smoke,
                     "batch": _BATCH.value, "prompt_len": prompt_len, "cache_len": cache_len,
                     "gammas": gammas, "steps": steps, "repeats": repeats, "dtype": "bfloat16",
                     "packed_decoder": _PACKED.value,
                     "seconds": time.time() - start},
            "bandwidth": bw, "rows": rows, "summary": summary, "goals": goals}
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(result, f, indent=2)
  log(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
