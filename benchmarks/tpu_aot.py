"""The paper shapes compiled for real TPU slices, no TPU attached (`specjax.aot`).

  python benchmarks/tpu_aot.py [--only=leviathan,chen,today] [--out=results/tpu_aot]

Cases (bf16, greedy, every program compiled by the TPU compiler from libtpu):
* leviathan: T5-XXL v1.1 target with T5-small / base / large drafts, batch 1,
  512 encoder tokens, 128 new, the paper's γ = 7 (Table 2, EN-DE, T = 0), on
  one TPU v4 chip (the paper's setup) and on v5e-8.
* chen: the chinchilla-70b shape with the chinchilla-4b draft, and the
  Llama-3.1-70B shape with a Llama-3.2-1B draft, K = 4, batch 1, on 16 TPU v4
  chips (the paper's setup) and v5e-16, the draft replicated (the launchers'
  default); chen_sharded: on the 16 v4 chips with the draft split too.
* today: Llama-3.1-8B with a Llama-3.2-1B draft and an EAGLE-3 head (chain,
  γ = 4) on v5e-8 and v6e-8, batch 1 / 32, contexts 2k / 32k, both drafts
  replicated; today_split: the same on v5e-8 / v6e-8 at batch 1 and 32, 2k (and
  v6e-8 at batch 32 × 32k), with the draft and the head split over the 8 chips
  like the target; today_pallas: v6e-8 at batch 32 × 32k split, the models'
  attention over the cache on the fused Pallas kernel (`attention_kernel`);
  today_sampled: v5e-8 at batch 32 × 2k split, sampled at T = 1.
* auto_layouts: seven of the cases above with the weights in the layouts the
  compiler chooses (`AotRun.param_layouts="auto"`): with the devices' default
  layouts it copies some kernels once per program.
* prefill: Llama-3.1-8B's prefill alone on v5e-8, chunked and not, batch 1–32
  (the memory plan's activation terms against the compiler; not in the default run).
* chen_llama_split: Llama-3.1-70B with a split Llama-3.2-1B on 16 v4 chips
  (its speculative loop alone takes the TPU compiler ~18 GB of host memory).

Each kind of program of a case (prefill, AR loop, speculative loops, ...) is
compiled in a process of its own — the TPU compiler returns an 80-layer
program's host memory only at exit, and the 70B AR loop and a split draft's
loop together need more than 24 GB — and written to `<out>/.parts/`; when
every kind is done the case is merged into `<out>/<case>.json` (a rerun skips
finished cases and finished kinds) and the tables are collected into
`<out>/tables.md`.
"""

import dataclasses
import json
import os
import subprocess
import sys
import time

from absl import app, flags

from specjax.aot.run import AotRun, merge_results, replan, run_aot
from specjax.atomic_io import atomic_write_json, atomic_write_text
from experiments.programs.leviathan import PAPER_TABLE2
from specjax.measure.provenance import provenance
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.models.t5 import T5, t5_config
from specjax.sampling import SamplingConfig

_ONLY = flags.DEFINE_list("only", ["leviathan", "chen", "chen_sharded", "today", "today_split",
                                   "today_pallas", "today_sampled", "chen_llama_split",
                                   "auto_layouts"],
                          "Case groups to run.")
_OUT = flags.DEFINE_string("out", "results/tpu_aot", "Output directory.")
_REPLAN = flags.DEFINE_bool("replan", False, "Compile nothing: recompute the memory-plan "
                            "comparisons of the finished cases with the current plan code.")
_CASE = flags.DEFINE_string("case", "", "Run this one case in this process (the driver runs "
                            "each case in a process of its own: the TPU compiler's memory "
                            "for an 80-layer program is returned to the system only at exit).")
_KIND = flags.DEFINE_string("kind", "", "With --case: compile only this kind of program of "
                            "the case (`specjax.aot.PROGRAM_KINDS`) into <out>/.parts/.")

BF16 = dict(dtype="bfloat16", param_dtype="bfloat16")


def _dec(name, **kw):
  return DecoderLM(decoder_config(name, **BF16, **kw))


def _t5(name):
  return T5(t5_config(name, **BF16))


def _chunk(ctx, batch=1):
  """The prefill chunk (`DecoderConfig.prefill_chunk`; None: one call) of a batch of
  `ctx`-slot rows, the largest power of two up to 512 positions that keeps two
  per-chip temporaries of the chunk small:
  * the float32 attention scores of a chunk over the whole cache, ∝ batch × chunk × ctx:
    batch × chunk × ctx ≤ 2**26 (at 32 rows × 32k slots a 512-position chunk's scores
    took 17 GB per chip of a v5e-8: 43 GB of temporaries with the 17 GB cache);
  * one layer's states and MLP units, ∝ batch × chunk: batch × chunk ≤ 8192 rows
    (before the decoder materialised its residual stream per block, XLA kept every
    layer's outputs live: 34 GB per chip for 32 × 1792 tokens of Llama-3.1-8B on a
    v5e-8 unchunked).
  Short contexts at small batches (batch × ctx ≤ 16384) prefill in one call."""
  if batch * ctx <= 16384:
    return None
  limit = min(512, 8192 // batch, (1 << 26) // (batch * ctx))
  return 1 << (max(limit, 1).bit_length() - 1)


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
  # The paper's setup splits the draft over the 16 chips too: a replicated 4B draft reads
  # all 8 GB on every chip at every draft step.
  # (Llama-3.1-70B with a split Llama-3.2-1B: group chen_llama_split; its AR loop and
  # speculative loop compiled in one process took the TPU compiler past 24 GB of host memory.)
  for group, tgt, draft in (("chen_sharded", "chinchilla-70b", "chinchilla-4b-draft"),
                            ("chen_llama_split", "llama-3.1-70b", "llama-3.2-1b")):
    out.append((group, f"chen_{tgt}_v4-2x2x4_draft-split",
                lambda tgt=tgt, draft=draft: AotRun(
                    "v4:2x2x4", _dec(tgt), ((draft, _dec(draft)),), gammas=(4,), batch_size=1,
                    prompt_len=1024, max_new_tokens=128, programs=("ar", "draft"),
                    draft_replicated=False, alphas=((draft, 0.8),))))
  for topo in ("v5e:2x4", "v6e:2x4"):
    for batch, ctx in ((1, 2048), (32, 2048), (1, 32768), (32, 32768)):
      if topo.startswith("v6e") and (batch, ctx) not in ((1, 2048), (32, 32768)):
        continue
      out.append(("today", f"today_llama-3.1-8b_{topo.replace(':', '-')}_b{batch}_ctx{ctx}",
                  lambda topo=topo, batch=batch, ctx=ctx: AotRun(
                      topo, _dec("llama-3.1-8b", prefill_chunk=_chunk(ctx, batch)),
                      (("llama-3.2-1b", _dec("llama-3.2-1b", prefill_chunk=_chunk(ctx, batch))),),
                      gammas=(4,), batch_size=batch, prompt_len=ctx - 256, max_new_tokens=128,
                      cache_len=ctx, programs=("ar", "draft", "eagle_chain"),
                      eagle_features=(2, 16, 29), alphas=(("llama-3.2-1b", 0.8),))))
  # The drafts split like the target: each chip reads 1/8 of the 1B draft and of the
  # EAGLE-3 head at every draft step instead of all of it.
  # Batch 32 at 32k on a v6e-8 (32 GB per chip): the target's cache takes 17 GB per chip
  # and a replicated 1B draft's 34 GB; split, the draft's is 4 GB.
  for topo, batch, ctx in (("v5e:2x4", 1, 2048), ("v5e:2x4", 32, 2048), ("v6e:2x4", 1, 2048),
                           ("v6e:2x4", 32, 2048), ("v6e:2x4", 32, 32768)):
    out.append(("today_split",
                f"today_llama-3.1-8b_{topo.replace(':', '-')}_b{batch}_ctx{ctx}_draft-split",
                lambda topo=topo, batch=batch, ctx=ctx: AotRun(
                    topo, _dec("llama-3.1-8b", prefill_chunk=_chunk(ctx, batch)),
                    (("llama-3.2-1b", _dec("llama-3.2-1b", prefill_chunk=_chunk(ctx, batch))),),
                    gammas=(4,), batch_size=batch, prompt_len=ctx - 256, max_new_tokens=128,
                    cache_len=ctx, programs=("ar", "draft", "eagle_chain"),
                    draft_replicated=False, eagle_features=(2, 16, 29),
                    alphas=(("llama-3.2-1b", 0.8),))))
  # The same pair on the fused cache-attention kernel (`attention_kernel="pallas"`): the
  # verify call's float32 scores stay on chip.
  for topo, batch, ctx in (("v6e:2x4", 32, 32768),):
    out.append(("today_pallas",
                f"today_llama-3.1-8b_{topo.replace(':', '-')}_b{batch}_ctx{ctx}_draft-split_pallas",
                lambda topo=topo, batch=batch, ctx=ctx: AotRun(
                    topo, _dec("llama-3.1-8b", prefill_chunk=_chunk(ctx, batch),
                               attention_kernel="pallas"),
                    (("llama-3.2-1b", _dec("llama-3.2-1b", prefill_chunk=_chunk(ctx, batch),
                                           attention_kernel="pallas")),),
                    gammas=(4,), batch_size=batch, prompt_len=ctx - 256, max_new_tokens=128,
                    cache_len=ctx, programs=("ar", "draft", "eagle_chain"),
                    draft_replicated=False, eagle_features=(2, 16, 29),
                    alphas=(("llama-3.2-1b", 0.8),))))
  # The split pair at batch 32 sampled at T = 1 (the other cases decode greedily): what the
  # sampler costs when every chip runs it over the whole vocabulary.
  out.append(("today_sampled", "today_llama-3.1-8b_v5e-2x4_b32_ctx2048_draft-split_t1",
              lambda: AotRun(
                  "v5e:2x4", _dec("llama-3.1-8b", prefill_chunk=_chunk(2048, 32)),
                  (("llama-3.2-1b", _dec("llama-3.2-1b", prefill_chunk=_chunk(2048, 32))),),
                  gammas=(4,), batch_size=32, prompt_len=2048 - 256, max_new_tokens=128,
                  cache_len=2048, programs=("ar", "draft", "eagle_chain"),
                  draft_replicated=False, eagle_features=(2, 16, 29),
                  alphas=(("llama-3.2-1b", 0.8),), sampling=SamplingConfig(1.0))))
  # The weights in the layouts the compiler chooses (`AotRun.param_layouts="auto"`) where the
  # default layouts made it copy kernels once per program (the memory plan's misses).
  auto_of = ("chen_chinchilla-70b_v4-2x2x4", "chen_chinchilla-70b_v4-2x2x4_draft-split",
             "chen_llama-3.1-70b_v4-2x2x4_draft-split",
             "leviathan_v5e-2x4", "today_llama-3.1-8b_v5e-2x4_b1_ctx32768",
             "today_llama-3.1-8b_v5e-2x4_b1_ctx2048_draft-split",
             "today_llama-3.1-8b_v6e-2x4_b1_ctx2048_draft-split")
  for _, name, thunk in [c for c in out if c[1] in auto_of]:
    out.append(("auto_layouts", f"{name}_auto-layouts",
                lambda thunk=thunk: dataclasses.replace(thunk(), param_layouts="auto")))
  # The target's prefill alone, chunked and not, at a few batch sizes: what the compiler
  # keeps live against the memory plan's activation terms (results/tpu_aot/README.md).
  for batch, prompt, chunk in ((1, 1792, None), (8, 1792, None), (1, 1792, 256),
                               (32, 1792, 256), (32, 1792, 64), (1, 16384, 512)):
    out.append(("prefill", f"prefill_llama-3.1-8b_v5e-2x4_b{batch}_p{prompt}_chunk{chunk}",
                lambda batch=batch, prompt=prompt, chunk=chunk: AotRun(
                    "v5e:2x4", _dec("llama-3.1-8b", prefill_chunk=chunk), (),
                    batch_size=batch, prompt_len=prompt, max_new_tokens=128,
                    cache_len=prompt + 256, programs=("prefill",))))
  return out


def _part_path(name: str, kind: str) -> str:
  return os.path.join(_OUT.value, ".parts", f"{name}.{kind}.json")


def run_cases() -> None:
  """Every case of the --only groups not finished yet, each kind of program of it in a
  process of its own; a case whose kinds are all compiled is merged into its JSON."""
  todo = [c for c in cases() if c[0] in _ONLY.value]
  t0 = time.time()
  for i, (group, name, thunk) in enumerate(todo):
    path = os.path.join(_OUT.value, f"{name}.json")
    if os.path.exists(path):
      continue
    run = thunk()
    failed = []
    for kind in run.kinds:
      if os.path.exists(_part_path(name, kind)):
        continue
      print(f"== [{i + 1}/{len(todo)}] {name}: {kind} (elapsed {time.time() - t0:.0f} s)",
            flush=True)
      rc = subprocess.call([sys.executable, os.path.relpath(__file__), f"--case={name}",
                            f"--kind={kind}", f"--out={_OUT.value}"])
      if rc != 0:
        failed.append(kind)
        print(f"   {name}: {kind} failed (exit {rc}); not merged", flush=True)
    if not failed:
      parts = []
      for kind in run.kinds:
        with open(_part_path(name, kind), encoding="utf-8") as f:
          parts.append(json.load(f))
      result = merge_results(parts, run)
      result.update(case=name, group=group, provenance=parts[-1]["provenance"])
      atomic_write_json(path, result)
      for kind in run.kinds:
        os.remove(_part_path(name, kind))


def main(argv):
  del argv
  os.makedirs(os.path.join(_OUT.value, ".parts"), exist_ok=True)
  if _CASE.value:
    group, name, thunk = next(c for c in cases() if c[1] == _CASE.value)
    run = thunk()
    if _KIND.value:
      run = dataclasses.replace(run, programs=(_KIND.value,))
    result = run_aot(run, progress=lambda m: print("  " + m, flush=True))
    result.update(case=name, group=group, provenance=provenance())
    atomic_write_json(_part_path(name, _KIND.value) if _KIND.value
                      else os.path.join(_OUT.value, f"{name}.json"), result)
    return
  if _REPLAN.value:
    for group, name, thunk in cases():
      path = os.path.join(_OUT.value, f"{name}.json")
      if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
          atomic_write_json(path, replan(json.load(f), thunk()))
  else:
    run_cases()
  results = []
  for group, name, _ in cases():
    path = os.path.join(_OUT.value, f"{name}.json")
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        results.append(json.load(f))
  atomic_write_text(os.path.join(_OUT.value, "tables.md"), render(results))


def _ms(x):
  return f"{x * 1e3:.2f}" if x else ""


def render(results) -> str:
  """A summary table (one row per program, the numbers that decide whether a run
  fits and how fast it can go) and each case's full table."""
  lines = ["| case | program | fits | peak / HBM GB | plan / compiler (held, peak) | read / expected "
           "| collectives / iter | HBM copies | host | predicted ms | speedup (α) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in results:
    speed = {x["program"]: x for x in r.get("speedups", [])}
    for p in r["programs"]:
      plan = p.get("plan") or {}
      loop = p.get("loop") or {}
      sp = speed.get(p["name"], {})
      fits = "**no**" if not p["fits"] else "yes"
      if p.get("error"):
        fits = f"**no**: {p['error'][:80]}"
      ratio = f"{p['read_ratio']:.2f}" if p.get("read_ratio") else ""
      planr = f"{1 / plan['ratio']:.3f}" if plan.get("ratio") else ""
      if plan.get("total_ratio"):
        planr += f", {1 / plan['total_ratio']:.3f}"
      coll = loop.get("collective_count", "")
      pred = _ms(p.get("predicted_s", {}).get("total_s"))
      spd = (f"{sp['predicted_speedup']:.2f} ({sp['alpha']})" if "predicted_speedup" in sp
             else "")
      lines.append(f"| {r['case']} | {p['name']} | {fits} "
                   f"| {p['peak_bytes'] / 1e9:.2f} / {p['hbm_bytes'] / 1e9:.1f} | {planr} "
                   f"| {ratio} | {coll} | {len(loop.get('hbm_copies', []))} "
                   f"| {loop.get('host_transfers', '')} | {pred} | {spd} |")
    if r.get("smallest_fitting") is not None or not r.get("fits", True):
      lines.append(f"| {r['case']} | *smallest slice that fits (memory plan)* | "
                   f"{r.get('smallest_fitting')} | | | | | | | | |")
  out = ["# Summary", "", "\n".join(lines), ""]
  for r in results:
    out.append(f"## {r['case']}\n\n{r['markdown']}\n")
  return "\n".join(out)


if __name__ == "__main__":
  sys.exit(app.run(main))
