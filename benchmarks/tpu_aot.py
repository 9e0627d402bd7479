"""The paper shapes compiled for real TPU slices, no TPU attached (`specjax.aot`).

  python benchmarks/tpu_aot.py [--only=leviathan,chen,today] [--out=results/tpu_aot]

Cases (bf16, greedy, every program compiled by the TPU compiler from libtpu):
* leviathan: T5-XXL v1.1 target with T5-small / base / large drafts, batch 1,
  512 encoder tokens, 128 new, the paper's γ = 7 (Table 2, EN-DE, T = 0), on
  one TPU v4 chip (the paper's setup) and on v5e-8.
* chen: the chinchilla-70b shape with the chinchilla-4b draft, and the
  Llama-3.1-70B shape with a Llama-3.2-1B draft, K = 4, batch 1, on 16 TPU v4
  chips (the paper's setup) and v5e-16.
* today: Llama-3.1-8B with a Llama-3.2-1B draft and an EAGLE-3 head (chain,
  γ = 4) on v5e-8 and v6e-8, batch 1 / 32, contexts 2k / 32k.

Each case writes `<out>/<case>.json` when it finishes (a rerun skips finished
cases) and the tables are collected into `<out>/README.md`.
"""

import json
import os
import sys
import time

from absl import app, flags

from specjax.aot.run import AotRun, run_aot
from specjax.atomic_io import atomic_write_json, atomic_write_text
from specjax.experiments.leviathan import PAPER_TABLE2
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.models.t5 import T5, t5_config

_ONLY = flags.DEFINE_list("only", ["leviathan", "chen", "today"], "Case groups to run.")
_OUT = flags.DEFINE_string("out", "results/tpu_aot", "Output directory.")

BF16 = dict(dtype="bfloat16", param_dtype="bfloat16")


def _dec(name, **kw):
  return DecoderLM(decoder_config(name, **BF16, **kw))


def _t5(name):
  return T5(t5_config(name, **BF16))


def _chunk(ctx):
  """Long prompts prefill in chunks of 512 positions (attention scores of one chunk at a
  time: `DecoderConfig.prefill_chunk`)."""
  return 512 if ctx > 4096 else None


def cases():
  """(group, case name, AotRun thunk)."""
  out = []
  alphas = tuple((d, PAPER_TABLE2["EN-DE", d, 0][1]) for d in ("small", "base", "large"))
  for topo in ("v4:1x1x1", "v5e:2x4"):
    out.append(("leviathan", f"leviathan_{topo.replace(':', '-')}", lambda topo=topo: AotRun(
        topo, _t5("t5-v1_1-xxl"), tuple((d, _t5(f"t5-v1_1-{d}")) for d in ("small", "base",
                                                                            "large")),
        gammas=(7,), batch_size=1, prompt_len=512, max_new_tokens=128,
        programs=("prefill", "ar", "draft"), alphas=alphas)))
  for topo in ("v4:2x2x4", "v5e:4x4"):
    for tgt, draft in (("chinchilla-70b", "chinchilla-4b-draft"), ("llama-3.1-70b",
                                                                    "llama-3.2-1b")):
      out.append(("chen", f"chen_{tgt}_{topo.replace(':', '-')}",
                  lambda topo=topo, tgt=tgt, draft=draft: AotRun(
                      topo, _dec(tgt), ((draft, _dec(draft)),), gammas=(4,), batch_size=1,
                      prompt_len=1024, max_new_tokens=128, programs=("ar", "draft"),
                      alphas=((draft, 0.8),))))
  for topo in ("v5e:2x4", "v6e:2x4"):
    for batch, ctx in ((1, 2048), (32, 2048), (1, 32768), (32, 32768)):
      if topo.startswith("v6e") and (batch, ctx) not in ((1, 2048), (32, 32768)):
        continue
      out.append(("today", f"today_llama-3.1-8b_{topo.replace(':', '-')}_b{batch}_ctx{ctx}",
                  lambda topo=topo, batch=batch, ctx=ctx: AotRun(
                      topo, _dec("llama-3.1-8b", prefill_chunk=_chunk(ctx)),
                      (("llama-3.2-1b", _dec("llama-3.2-1b", prefill_chunk=_chunk(ctx))),),
                      gammas=(4,), batch_size=batch, prompt_len=ctx - 256, max_new_tokens=128,
                      cache_len=ctx, programs=("ar", "draft", "eagle_chain"),
                      eagle_features=(2, 16, 29), alphas=(("llama-3.2-1b", 0.8),))))
  return out


def main(argv):
  del argv
  os.makedirs(_OUT.value, exist_ok=True)
  todo = [c for c in cases() if c[0] in _ONLY.value]
  t0 = time.time()
  for i, (group, name, thunk) in enumerate(todo):
    path = os.path.join(_OUT.value, f"{name}.json")
    if os.path.exists(path):
      continue
    print(f"== [{i + 1}/{len(todo)}] {name} (elapsed {time.time() - t0:.0f} s)", flush=True)
    result = run_aot(thunk(), progress=lambda m: print("  " + m, flush=True))
    result.update(case=name, group=group)
    atomic_write_json(path, result)
  tables = []
  for group, name, _ in cases():
    path = os.path.join(_OUT.value, f"{name}.json")
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        r = json.load(f)
      tables.append(f"## {name}\n\n{r['markdown']}\n")
      if r.get("speedups"):
        tables.append("| program | iteration / AR step | α | γ | E[tokens] | predicted speedup |\n"
                      "|---|---|---|---|---|---|\n" + "\n".join(
                          f"| {s['program']} | {s['iteration_cost_vs_ar']:.2f} "
                          f"| {s.get('alpha', '')} | {s.get('gamma', '')} "
                          f"| {s.get('tokens_per_iteration', 0):.2f} "
                          f"| {s.get('predicted_speedup', 0):.2f} |" for s in r["speedups"])
                      + "\n")
  atomic_write_text(os.path.join(_OUT.value, "tables.md"), "\n".join(tables))


if __name__ == "__main__":
  sys.exit(app.run(main))
