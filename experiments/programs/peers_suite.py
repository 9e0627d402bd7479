"""The CPU peer suite behind `benchmarks/peers_bench.py`: runs every system on
every pair, derives ratios, checks the goals, writes the markdown.

`run_suite(SuiteConfig(...))` returns one JSON-able dict; `to_markdown` turns
it into the report; `goals` computes the pass/fail lines. Measurement
pieces live in `experiments.programs.peers`.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax import theory
from experiments.programs import peers as bp
from specjax.generation import DecodeStats
from specjax.measure.beta import measure_beta
from specjax.measure.latency import emission_times, latency_stats
from specjax.measure.provenance import machine_line, provenance, provenance_sentence
from specjax.measure.timing import count_params, now, step_times
from specjax.parallel import sharding
from specjax.sampling import SamplingConfig

__all__ = ["SuiteConfig", "run_suite", "run_pair", "goals", "to_markdown", "QUICK", "SMOKE"]

GOAL_PEER_RATIO = 3.0        # specjax ≥ 3× transformers' tokens/s at batch 1
GOAL_LOOP_OVERHEAD = 0.10    # predicted / measured speedup − 1 ≤ 10%
GOAL_BATCH, GOAL_ALPHA, GOAL_BATCH_SPEEDUP = 8, 0.7, 1.5
GOAL_ROOFLINE = 1.3          # GPU: target step ≤ 1.3× its HBM roofline


@dataclasses.dataclass
class SuiteConfig:
  """What the suite measures (defaults: the full CPU suite)."""

  leviathan_dir: str = ""          # runs/leviathan_full: target/final, draft_<t5_draft>/final
  chen_dir: str = ""               # runs/chen_full: target/final, draft/final
  t5_draft: str = "small"
  data_cache: str = "data_cache"
  pairs: Sequence[str] = ("t5", "decoder")
  fallback_size: str = "full"      # random-init shapes when a dir is missing: full | tiny
  batches: Sequence[int] = (1, 4, 8, 16)
  gammas: Sequence[int] = tuple(range(1, 9))      # specjax speculative at batch 1
  gammas_batched: Sequence[int] = (2, 5)          # at batch > 1 (suite time)
  hf_gammas: Sequence[int] = (2, 4, 6, 8)         # transformers assisted (batch 1), + defaults
  lookup_gammas: Sequence[int] = (2, 4, 8)        # transformers prompt lookup (batch 1)
  hf_batches: Sequence[int] = (1, 4, 8, 16)       # transformers greedy
  max_new: int = 64
  prompt_len: int = 64
  b1_prompts: int = 2              # batch-1 requests per timed call (served in turn)
  repeats: int = 5                 # timed rounds over all systems of a batch size (median)
  stream_repeats: int = 2
  step_repeats: int = 3
  overhead_rounds: int = 7         # paired loop-overhead rounds at the best γ per batch (0: off)
  overhead_min_seconds: float = 20.0  # ... and more (≤ 4×) until the loops ran this long
  memory: bool = True
  memory_batches: Sequence[int] = (1, 16)
  memory_pairs: Sequence[str] = ("t5", "decoder")
  memory_systems: Sequence[str] = ("specjax autoregressive", "specjax speculative",
                                   "transformers greedy", "transformers assisted",
                                   "transformers prompt lookup")
  growth: bool = True
  growth_new_tokens: Sequence[int] = (64, 128, 256, 512)
  growth_buffers: Sequence[int] = (1, 2, 4, 8)
  growth_gamma: int = 0            # 0: the best γ at batch 1
  growth_fresh_compile: bool = True  # clear JAX's caches first: real compile times
  threads: int = 0                 # torch threads; 0: all cores
  # Batch-1 rows with the target split over a `model` mesh axis of this many
  # devices (draft replicated): 1 = off, 0 = every device of the process
  # (`benchmarks/peers_bench.py --model_parallel=0` makes one CPU device per core).
  model_parallel: int = 1
  mp_gammas: Sequence[int] = (1, 2, 4)            # speculative γ of those rows
  # Decoder pairs decode from the packed layout (`DecoderLM.pack_params`);
  # False: the standard tree (the layout the checkpoints hold).
  packed_decoder: bool = True
  # Decoder pairs: each model's `DecoderConfig.matvec_max_rows`: "auto" =
  # measured on this machine by `specjax.tune_matvec_rows` at these row
  # counts before the pair runs; None = the library default; an int: that.
  decoder_matvec_rows: Any = "auto"
  matvec_row_counts: Sequence[int] = (2, 3, 4, 5, 8)
  tune_repeats: int = 7            # paired measurements per row count
  mode: str = "full"

  def __post_init__(self):
    _check_model_parallel(self.model_parallel)
    _check_matvec_rows(self.decoder_matvec_rows)


def _check_matvec_rows(rows) -> None:
  if rows is None or rows == "auto":
    return
  if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
    raise ValueError(f"decoder_matvec_rows must be 'auto', None or an int >= 0, got {rows!r}")


def _check_model_parallel(k) -> None:
  if isinstance(k, bool) or not isinstance(k, int) or k < 0:
    raise ValueError(f"model_parallel must be an int >= 0 (0: every device), got {k!r}")


QUICK = dict(batches=(1, 8), gammas=(2, 4, 6), gammas_batched=(4,), hf_gammas=(4,),
             lookup_gammas=(4,), hf_batches=(1, 8), b1_prompts=1, repeats=2, stream_repeats=1,
             overhead_rounds=3, overhead_min_seconds=5.0, memory_batches=(1,),
             growth_new_tokens=(64, 256),
             growth_buffers=(1, 4), mp_gammas=(2, 4), mode="quick")
SMOKE = dict(fallback_size="tiny", batches=(1,), gammas=(2,), gammas_batched=(),
             hf_gammas=(2,), lookup_gammas=(2,), hf_batches=(1,), max_new=8, prompt_len=8,
             b1_prompts=1, repeats=1, stream_repeats=1, step_repeats=1, overhead_rounds=1,
             overhead_min_seconds=0.0,
             memory_batches=(1,),
             memory_systems=("specjax autoregressive",), memory_pairs=("decoder",),
             growth_new_tokens=(8,), matvec_row_counts=(2,), tune_repeats=1,
             growth_buffers=(1, 2), growth_fresh_compile=False, threads=1, model_parallel=2,
             mp_gammas=(2,), mode="smoke")


def _pair_spec(cfg: SuiteConfig, name: str) -> bp.PairSpec:
  if name == "t5":
    base = cfg.leviathan_dir
    dirs = (os.path.join(base, "target", "final"),
            os.path.join(base, f"draft_{cfg.t5_draft}", "final"))
    kind = "t5"
  elif name == "decoder":
    base = cfg.chen_dir
    dirs = (os.path.join(base, "target", "final"), os.path.join(base, "draft", "final"))
    kind = "decoder"
  else:
    raise ValueError(f"unknown pair {name!r}; known: t5, decoder")
  have = bool(base) and all(os.path.exists(os.path.join(d, "config.json")) for d in dirs)
  spec = bp.fallback_spec(name, kind, cfg.fallback_size, *(dirs if have else ("", "")))
  spec.packed = cfg.packed_decoder
  if kind == "decoder" and cfg.decoder_matvec_rows != "auto":
    spec.target_matvec_rows = spec.draft_matvec_rows = cfg.decoder_matvec_rows
  spec.note = ("trained: " + ", ".join(dirs) if have else
               f"random init ({cfg.fallback_size} shapes): "
               + ("no directory given" if not base else f"no trained models under {base}"))
  return spec


def _median(xs):
  return statistics.median(xs) if xs else float("nan")


def _specjax_rows(pair, runners, streams, tt, td, prefill_t, prefill_d, cfg, batch, n_groups):
  rows = []
  ar = runners[0]
  one = {r.gamma: r for r in runners if r.framework == "specjax" and r.devices == 1}
  for r in runners:
    if r.framework != "specjax":
      continue
    st = r.last["stats"]
    med = r.last["median_s"]
    rows_total = r.last["tokens"].shape[0]
    row = dict(system=r.system, framework="specjax", batch=batch, gamma=r.gamma,
               tokens_per_s=rows_total * cfg.max_new / med,
               ms_per_token=1e3 * med / (cfg.max_new * n_groups), median_s=med,
               runs=r.last["runs"], first_s=r.last["first_s"],
               compile_s=max(r.last["first_s"] - med, 0.0),
               agreement=bp.token_agreement(r.last["tokens"], ar.last["tokens"]),
               devices=r.devices)
    if r.gamma:
      measured = DecodeStats.from_histogram(st["hist"], st["drafted"])
      row.update(acceptance_rate=measured.alpha() if st["drafted"] else 0.0,
                 tokens_per_iteration=measured.tokens_per_iteration, iterations=st["iterations"])
    if r.devices > 1:  # Model-parallel: throughput against one device, nothing else.
      base = one.get(r.gamma)
      row["vs_one_device"] = (base.last["median_s"] / med) if base else float("nan")
      rows.append(row)
      continue
    row.update(streams.get(r.gamma, {}))
    if r.gamma:
      pred = bp.loop_prediction(cfg.max_new, r.gamma, st["iterations"], tt, td, prefill_t,
                                prefill_d)
      row.update(pred, **bp.overhead_fields(pred, ar.last["median_s"], med),
                 verify_cost=tt[r.gamma + 1] / tt[1], c=td[1] / tt[1])
    rows.append(row)
  return rows


def _latency_summary(requests) -> Dict[str, float]:
  """Median TTFT and the P50 / P99 / mean inter-token latency (ms) of streamed
  requests `[(start, events)]` (`specjax.measure.latency`); NaN without any."""
  times, arrivals = [], []
  for start, events in requests:
    rows = emission_times(events)
    times += rows
    arrivals += [start] * len(rows)
  keys = ("ttft_ms", "itl_p50_ms", "itl_p99_ms", "itl_mean_ms")
  if not any(len(t) > 1 for t in times):
    return dict.fromkeys(keys, float("nan"))
  stats = latency_stats([t for t in times if t], [a for a, t in zip(arrivals, times) if t])
  return {k: getattr(stats, k) for k in keys}


def _hf_rows(runners, reference, cfg, batch, n_groups):
  rows = []
  for r in runners:
    if r.framework != "transformers":
      continue
    med = r.last["median_s"]
    its = sum(r.last["stats"]["iterations"])
    mode = r.system.split()[-1]
    row = dict(system=r.system, framework="transformers", batch=batch, gamma=r.gamma,
               note=r.note, tokens_per_s=r.last["tokens"].shape[0] * cfg.max_new / med,
               ms_per_token=1e3 * med / (cfg.max_new * n_groups), median_s=med,
               runs=r.last["runs"], first_s=r.last["first_s"],
               warmup_s=max(r.last["first_s"] - med, 0.0),
               agreement=bp.token_agreement(r.last["tokens"], reference),
               **_latency_summary(r.latency_events))
    if mode in ("assisted", "lookup"):
      row["tokens_per_iteration"] = (cfg.max_new - 1) * n_groups / its if its else float("nan")
    rows.append(row)
  return rows


def _streams(pair, gammas, prompts, lengths, row_groups, cfg, cache_len, reference):
  """Latency of each specjax configuration through jitted init_state/step."""
  out = {}
  for g in gammas:
    stream = bp.SpecjaxStream(pair, g, cfg.max_new, cache_len)
    t0 = now()
    for a, b in row_groups:
      stream.run(prompts[a:b], lengths[a:b])
    first = now() - t0
    requests, totals, toks = [], [], []
    for _ in range(cfg.stream_repeats):
      t0 = now()
      toks = []
      for a, b in row_groups:
        start, events, tokens = stream.run(prompts[a:b], lengths[a:b])
        requests.append((start, events))
        toks.append(tokens)
      totals.append(now() - t0)
    rows_total = sum(b - a for a, b in row_groups)
    out[g] = dict(_latency_summary(requests),
                  stream_tokens_per_s=rows_total * cfg.max_new / _median(totals),
                  stream_compile_s=max(first - _median(totals), 0.0),
                  stream_identical=bool(np.array_equal(np.concatenate(toks), reference)))
  return out


def run_batch(pair, hf, prompts, lengths, batch: int, cfg: SuiteConfig, cache_len: int,
              log: Callable[[str], None]) -> Dict[str, Any]:
  """Every system at one batch size: throughput (interleaved), streams,
  component times, predictions."""
  row_groups = bp.groups(batch, cfg.b1_prompts)
  gam = list(cfg.gammas if batch == 1 else cfg.gammas_batched)
  runners = [bp.specjax_runner(pair, prompts, lengths, row_groups, g, cfg.max_new, cache_len)
             for g in [0] + gam]
  notes = []
  if batch == 1:
    mesh, note = model_parallel_mesh(cfg)
    notes += [note] if note else []
    if mesh is not None:
      runners += [bp.specjax_runner(pair, prompts, lengths, row_groups, g, cfg.max_new,
                                    cache_len, mesh=mesh) for g in [0] + list(cfg.mp_gammas)]
  if hf is not None and batch in cfg.hf_batches:
    runners.append(bp.hf_runner(hf, prompts, lengths, row_groups, "greedy", None, cfg.max_new))
    if batch == 1:
      runners += [bp.hf_runner(hf, prompts, lengths, row_groups, "assisted", g, cfg.max_new)
                  for g in list(cfg.hf_gammas) + [None]]
      runners += [bp.hf_runner(hf, prompts, lengths, row_groups, "lookup", g, cfg.max_new)
                  for g in cfg.lookup_gammas]
  if hf is not None and batch > 1:
    notes += _probe_batched(hf, prompts, lengths, batch)
  log(f"[{pair.spec.name}] batch {batch}: {len(runners)} systems × {cfg.repeats} repeats")
  bp.interleaved_times(runners, cfg.repeats, log)
  reference = runners[0].last["tokens"]
  alpha = measured_alpha(pair, prompts, lengths, reference) if gam else None
  if alpha is not None:
    log(f"[{pair.spec.name}] batch {batch}: α = E[β] {alpha:.3f} over the AR tokens")
  stream_gammas = [0] + gam
  if batch > 1 and gam:  # Latency of every γ at batch 1; above it of AR and the fastest γ.
    best = min((r for r in runners if r.framework == "specjax" and r.gamma and r.devices == 1),
               key=lambda r: r.last["median_s"])
    stream_gammas = [0, best.gamma]
  log(f"[{pair.spec.name}] batch {batch}: streams for γ = {stream_gammas}")
  streams = _streams(pair, stream_gammas, prompts, lengths, row_groups, cfg, cache_len,
                     reference)
  paired = None
  if gam and cfg.overhead_rounds:
    best = min((r for r in runners if r.framework == "specjax" and r.gamma and r.devices == 1),
               key=lambda r: r.last["median_s"])
    log(f"[{pair.spec.name}] batch {batch}: loop overhead at γ = {best.gamma}, "
        f"{cfg.overhead_rounds}+ paired rounds (≥ {cfg.overhead_min_seconds:g} s of loops)")
    paired = bp.paired_loop_overhead(pair, runners[0], best, prompts, lengths, cache_len,
                                     cfg.max_new, cfg.overhead_rounds,
                                     min_loop_seconds=cfg.overhead_min_seconds)
  plen = prompts.shape[1]
  log(f"[{pair.spec.name}] batch {batch}: component times")
  tt = step_times(pair.target, pair.tp, batch, cache_len, plen, sorted({1} | {g + 1 for g in gam}),
                  repeats=cfg.step_repeats)
  td, prefill_d = {}, float("nan")
  a, b = row_groups[0]
  if gam:
    td = step_times(pair.draft, pair.dp, batch, cache_len, plen, [1, 2], repeats=cfg.step_repeats)
    prefill_d = bp.prefill_time(pair.draft, pair.dp, prompts[a:b], lengths[a:b], cache_len,
                                cfg.step_repeats)
  prefill_t = bp.prefill_time(pair.target, pair.tp, prompts[a:b], lengths[a:b], cache_len,
                              cfg.step_repeats)
  rows = _specjax_rows(pair, runners, streams, tt, td, prefill_t, prefill_d, cfg, batch,
                       len(row_groups))
  rows += _hf_rows(runners, reference, cfg, batch, len(row_groups))
  return {"batch": batch, "rows": rows, "notes": notes, "cache_len": cache_len,
          "paired_overhead": paired, "alpha": alpha,
          "step_times_ms": {"target": {t: 1e3 * v for t, v in tt.items()},
                            "draft": {t: 1e3 * v for t, v in td.items()}},
          "prefill_ms": {"target": 1e3 * prefill_t, "draft": 1e3 * prefill_d}}


def measured_alpha(pair, prompts, lengths, tokens) -> float:
  """The pair's α = E[β] (Leviathan et al.'s α) over the target's greedy
  `tokens` `[R, N]` of prompts 0..R−1: the share of those positions where the
  draft's argmax, teacher-forced on the same prefix, equals the target's
  (`specjax.measure.beta.measure_beta` at temperature 0). Unlike accepted / drafted it
  counts every position, including those after a rejection."""
  rows, n = tokens.shape
  beta, mask = measure_beta(pair.target, pair.tp, pair.draft, pair.dp,
                            jnp.asarray(prompts[:rows]), jnp.asarray(lengths[:rows]),
                            jnp.asarray(tokens), jnp.full((rows,), n, jnp.int32),
                            SamplingConfig(temperature=0.0))
  return float(jnp.sum(beta * mask) / jnp.sum(mask))


def model_parallel_mesh(cfg: SuiteConfig) -> Tuple[Optional[jax.sharding.Mesh], str]:
  """The (1, k) mesh of the model-parallel rows, or None and why not."""
  _check_model_parallel(cfg.model_parallel)
  n = len(jax.devices())
  k = cfg.model_parallel or n
  if k < 2:
    return None, ("" if cfg.model_parallel else
                  "model-parallel rows: off (the process has one device; set XLA_FLAGS="
                  "--xla_force_host_platform_device_count=<cores> before jax starts)")
  if k > n:
    return None, (f"model-parallel rows: off (model_parallel={k} needs {k} devices, the process "
                  f"has {n}; set XLA_FLAGS=--xla_force_host_platform_device_count={k} before "
                  "jax is imported)")
  return sharding.make_mesh(data=1, model=k), ""


def _probe_batched(hf, prompts, lengths, batch: int) -> List[str]:
  """Whether transformers runs assisted generation / prompt lookup on `batch` rows."""
  notes = []
  for mode in ("assisted", "lookup"):
    try:
      hf.generate(prompts[:batch], lengths[:batch], 2, mode, 2)
      notes.append(f"transformers {mode} at batch {batch}: ran")
    except ValueError as e:
      notes.append(f"transformers {mode} at batch {batch}: ValueError: {e}")
  return notes


def best_row(rows, system: str, batch: int, with_defaults: bool = False
             ) -> Optional[Dict[str, Any]]:
  """The fastest row of `system` at `batch` (transformers' default-setting
  assisted row only `with_defaults`)."""
  cand = [r for r in rows if r["system"] == system and r["batch"] == batch
          and (with_defaults or not r.get("note"))]
  return max(cand, key=lambda r: r["tokens_per_s"]) if cand else None


def _memory(pair, hf, spec, prompts, lengths, rows, cfg, cache_len, tmp, log):
  path = os.path.join(tmp, f"{spec.name}_prompts.npz")
  np.savez(path, prompts=prompts, lengths=lengths)
  base = dict(pair=dataclasses.asdict(spec), prompts_path=path, max_new=cfg.max_new,
              cache_len=cache_len, threads=cfg.threads or os.cpu_count(),
              hf_dirs=hf.dirs if hf is not None else None)
  base["pair"].pop("note", None)
  for batch in cfg.memory_batches:
    systems = ["specjax autoregressive", "specjax speculative"]
    if hf is not None and batch in cfg.hf_batches:
      systems.append("transformers greedy")
      if batch == 1:
        systems += ["transformers assisted", "transformers prompt lookup"]
    for system in systems:
      if system not in cfg.memory_systems:
        continue
      row = best_row(rows, system, batch)
      if row is None:
        continue
      mode = {"transformers greedy": "greedy", "transformers assisted": "assisted",
              "transformers prompt lookup": "lookup"}.get(system)
      job = dict(base, system=system, batch=batch, gamma=row["gamma"], mode=mode)
      t0 = now()
      row["memory"] = bp.measure_memory(job)
      log(f"  memory {system} B={batch} γ={row['gamma']}: {row['memory']} "
          f"({now() - t0:.0f}s)")


def _ratios(rows, batches) -> List[Dict[str, Any]]:
  out = []
  for b in batches:
    ar = best_row(rows, "specjax autoregressive", b)
    sp = best_row(rows, "specjax speculative", b)
    hg = best_row(rows, "transformers greedy", b)
    ha = best_row(rows, "transformers assisted", b, with_defaults=True)
    hf_fixed = best_row(rows, "transformers assisted", b)
    hl = best_row(rows, "transformers prompt lookup", b)
    hd = [r for r in rows if r["system"] == "transformers assisted" and r["batch"] == b
          and r.get("note")]
    fast = max([r for r in (ar, sp) if r], key=lambda r: r["tokens_per_s"], default=None)
    peers = [r for r in (hg, ha, hl) + tuple(hd) if r]
    peer = max(peers, key=lambda r: r["tokens_per_s"], default=None)
    div = lambda x, y: x["tokens_per_s"] / y["tokens_per_s"] if x and y else None
    same = None
    if sp and hf_fixed:  # at transformers' best fixed γ
      same_g = [r for r in rows if r["system"] == "specjax speculative" and r["batch"] == b
                and r["gamma"] == hf_fixed["gamma"]]
      same = div(same_g[0], hf_fixed) if same_g else None
    mp = {}  # The model-parallel rows (every core on the target), against the same peers.
    for kind, peer_row in (("autoregressive", hg), ("speculative", ha)):
      cand = [r for r in rows if r["batch"] == b and r.get("devices", 1) > 1
              and r["system"].startswith(f"specjax {kind},")]
      best = max(cand, key=lambda r: r["tokens_per_s"], default=None)
      key = "ar_mp_vs_hf_greedy" if kind == "autoregressive" else "sp_mp_vs_hf_assisted"
      mp[key] = div(best, peer_row)
      mp[key.split("_vs_")[0] + "_system"] = (f"{best['system']} γ={best['gamma']}"
                                              if best else None)
    out.append(dict(batch=b, ar_vs_hf_greedy=div(ar, hg), sp_vs_hf_assisted=div(sp, ha),
                    sp_vs_hf_assisted_same_gamma=same, sp_vs_hf_lookup=div(sp, hl),
                    sp_vs_hf_assisted_defaults=div(sp, hd[0]) if hd else None,
                    best_vs_best_peer=div(fast, peer),
                    best_specjax=f"{fast['system']} γ={fast['gamma']}" if fast else None,
                    best_peer=(f"{peer['system']} γ={peer['gamma']}"
                               + (f" ({peer['note']})" if peer.get("note") else ""))
                    if peer else None,
                    sp_gamma=sp["gamma"] if sp else None,
                    hf_assisted_best=(("defaults" if ha.get("note") else f"γ={ha['gamma']}")
                                      if ha else None),
                    same_gamma=hf_fixed["gamma"] if hf_fixed else None, **mp))
  return out


def run_pair(name: str, cfg: SuiteConfig, tmp: str, log) -> Dict[str, Any]:
  t_start = now()
  spec = _pair_spec(cfg, name)
  log(f"[{name}] {spec.note}")
  pair = bp.load_pair(spec)
  tuning = None
  if spec.kind == "decoder" and cfg.decoder_matvec_rows == "auto":
    pair, tuning = _tune_matvec_rows(pair, cfg, log)
    spec = pair.spec
  n_prompts = max(max(cfg.batches), cfg.b1_prompts, 2)
  prompts, lengths, source = bp.pair_prompts(pair, n_prompts, cfg.prompt_len, cfg.data_cache)
  log(f"[{name}] prompts: {source}")
  hf, hf_error = None, None
  try:
    hf = bp.HFPair(pair, os.path.join(tmp, name), threads=cfg.threads or None)
  except ImportError as e:
    hf_error = f"transformers unavailable: {e}"
  max_gamma = max(list(cfg.gammas) + list(cfg.gammas_batched))
  cache_len = specjax.required_cache_len(pair.target, cfg.prompt_len, cfg.max_new, max_gamma)
  batches, rows, notes = [], [], []
  for batch in cfg.batches:
    res = run_batch(pair, hf, prompts, lengths, batch, cfg, cache_len, log)
    rows += res.pop("rows")
    notes += res.pop("notes")
    batches.append(res)
  if hf is not None and max(cfg.batches) == 1:
    notes += _probe_batched(hf, prompts, lengths, 2)
  if cfg.memory and name in cfg.memory_pairs:
    _memory(pair, hf, spec, prompts, lengths, rows, cfg, cache_len, tmp, log)
  growth = None
  if cfg.growth:
    sp1 = best_row(rows, "specjax speculative", 1)
    g = cfg.growth_gamma or (sp1["gamma"] if sp1 else 4)
    growth = {"gamma": g, "batch": 1, "base_new_tokens": cfg.max_new,
              "rows": bp.cost_growth(pair, prompts[:1], lengths[:1], g, cfg.growth_new_tokens,
                                     cfg.growth_buffers, cfg.max_new, cfg.repeats, log,
                                     fresh_compile=cfg.growth_fresh_compile)}
  import torch
  return {
      "name": name, "kind": spec.kind, "source": spec.note, "trained": spec.trained,
      "spec": {k: v for k, v in dataclasses.asdict(spec).items() if k != "note"},
      "params": {"target": count_params(pair.tp), "draft": count_params(pair.dp)},
      "prompts": {"source": source, "count": int(n_prompts), "prompt_len": cfg.prompt_len,
                  "mean_length": float(np.mean(lengths))},
      "cache_len": cache_len, "rows": rows, "batches": batches, "notes": notes,
      "matvec_tuning": tuning,
      "ratios": _ratios(rows, cfg.batches), "growth": growth, "hf_error": hf_error,
      "torch_threads": torch.get_num_threads(), "seconds": now() - t_start,
  }


def _tune_matvec_rows(pair, cfg: SuiteConfig, log):
  """Both decoders' `matvec_max_rows` measured on this machine (in the params'
  layout); returns the pair rebuilt with them, and the measurements."""
  choices = {}
  for role, model, params in (("target", pair.target, pair.tp), ("draft", pair.draft, pair.dp)):
    prefix = f"[{pair.spec.name}] {role} "
    choices[role] = specjax.tune_matvec_rows(
        model, params, row_counts=tuple(cfg.matvec_row_counts), prompt_len=cfg.prompt_len,
        repeats=cfg.tune_repeats, log=lambda line, pre=prefix: log(pre + line))
    log(f"{prefix}matvec_max_rows = {choices[role].rows} "
        f"(library default {choices[role].default_rows})")
  spec = dataclasses.replace(pair.spec, target_matvec_rows=choices["target"].rows,
                             draft_matvec_rows=choices["draft"].rows)
  spec.note = pair.spec.note
  tuned = dataclasses.replace(pair, spec=spec, target=choices["target"].apply(pair.target),
                              draft=choices["draft"].apply(pair.draft))
  return tuned, {role: c.to_dict() for role, c in choices.items()}


def run_suite(cfg: SuiteConfig, log: Callable[[str], None] = print,
              on_pair: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
  """Runs every pair; returns the results (meta, pairs, goals). `on_pair`
  gets the finished pairs after each one (to save partial results)."""
  t0 = now()
  load_start = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
  tmp = tempfile.mkdtemp(prefix="specjax_peers_")
  pairs = {}
  try:
    for name in cfg.pairs:
      pairs[name] = run_pair(name, cfg, tmp, log)
      if on_pair:
        on_pair(pairs)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  import torch
  import transformers
  results = {
      "provenance": provenance(),
      "meta": {"machine": machine_line(),
               "python": platform.python_version(), "jax": jax.__version__,
               "backend": jax.default_backend(), "torch": torch.__version__,
               "transformers": transformers.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
               "load_average": load_start,
               "xla_flags": os.environ.get("XLA_FLAGS", ""),
               "memory_heap_trim": True,  # memory_job trims the heap before the steady call
               "config": {k: list(v) if isinstance(v, tuple) else v
                          for k, v in dataclasses.asdict(cfg).items()}},
      "pairs": pairs,
  }
  results["meta"]["total_s"] = now() - t0
  results["meta"]["load_average_end"] = (list(os.getloadavg()) if hasattr(os, "getloadavg")
                                         else None)
  results["goals"] = goals(results)
  return results


# --------------------------------------------------------------------------- goals


def goals(results: Dict[str, Any]) -> List[Dict[str, Any]]:
  """The issue's goals as computed pass / fail / n/a lines."""
  out = []

  def add(goal, status, detail):
    out.append({"goal": goal, "status": status, "detail": detail})

  for name, p in results["pairs"].items():
    rows = p["rows"]
    ratio = next((r for r in p["ratios"] if r["batch"] == 1), None)
    tag = f"{name} ({'trained' if p['trained'] else 'random init'})"
    for key, what, peer in (("ar_vs_hf_greedy", "autoregressive", "greedy"),
                            ("sp_vs_hf_assisted", "speculative (best γ)",
                             "assisted (best of its γ values and defaults)")):
      v = ratio and ratio[key]
      goal = f"{tag}: specjax {what} ≥ {GOAL_PEER_RATIO:g}× transformers {peer} tokens/s, batch 1"
      if v is None:
        add(goal, "n/a", "not measured")
      else:
        add(goal, "PASS" if v >= GOAL_PEER_RATIO else "FAIL", f"{v:.2f}×")
    for key, peer in (("ar_mp_vs_hf_greedy", "greedy"),
                      ("sp_mp_vs_hf_assisted", "assisted (best of its γ values and defaults)")):
      v = ratio and ratio.get(key)
      if v is None:
        continue
      system = ratio[key.split("_vs_")[0] + "_system"]
      add(f"{tag}: {system} ≥ {GOAL_PEER_RATIO:g}× transformers {peer} tokens/s, batch 1 "
          f"(transformers on {p['torch_threads']} torch threads)",
          "PASS" if v >= GOAL_PEER_RATIO else "FAIL", f"{v:.2f}×")
    paired = {bt["batch"]: bt.get("paired_overhead") for bt in p.get("batches", [])}
    for b in sorted({r["batch"] for r in rows}):
      sp = best_row(rows, "specjax speculative", b)
      if sp is None:
        continue
      po = paired.get(b)
      unpaired = (f"predicted {sp['predicted_speedup']:.2f}× / measured "
                  f"{sp['measured_speedup']:.2f}×")
      if po:  # The paired rounds decide; the unpaired figure is shown alongside.
        v = po["loop_overhead"]
        split = (f"; decoding logic {100 * po['logic_overhead']:+.1f}%, composition "
                 f"{100 * po['composition_overhead']:+.1f}%" if "logic_overhead" in po else "")
        detail = (f"{100 * v:+.1f}% (median of {len(po['rounds'])} paired rounds at γ = "
                  f"{po['gamma']}, range {100 * po['loop_overhead_min']:+.1f}…"
                  f"{100 * po['loop_overhead_max']:+.1f}%{split}; unpaired "
                  f"{100 * sp['loop_overhead']:+.1f}%, {unpaired})")
      else:
        v = sp["loop_overhead"]
        detail = f"{100 * v:+.1f}% ({unpaired})"
      add(f"{tag}: loop overhead ≤ {100 * GOAL_LOOP_OVERHEAD:.0f}%, batch {b} "
          f"(best γ = {sp['gamma']})", "PASS" if v <= GOAL_LOOP_OVERHEAD else "FAIL", detail)
    sp = best_row(rows, "specjax speculative", GOAL_BATCH)
    goal = (f"{tag}: speculative ≥ {GOAL_BATCH_SPEEDUP:g}× autoregressive at batch {GOAL_BATCH} "
            f"when α ≥ {GOAL_ALPHA:g}")
    if sp is None:
      add(goal, "n/a", f"batch {GOAL_BATCH} not measured")
    else:
      alpha = next((bt.get("alpha") for bt in p.get("batches", [])
                    if bt["batch"] == GOAL_BATCH), None)
      detail = f"{sp['measured_speedup']:.2f}× at γ = {sp['gamma']}"
      rate = f"accepted / drafted {sp['acceptance_rate']:.2f}"
      proj = batch_goal_projection(rows)
      if alpha is None:
        add(goal, "n/a", f"{detail}, {rate}; α = E[β] not measured by this run{proj}")
      elif alpha < GOAL_ALPHA:
        add(goal, "n/a", f"{detail}; α = E[β] {alpha:.2f} < {GOAL_ALPHA:g}: the goal does not "
            f"apply ({rate}){proj}")
      else:
        add(goal, "PASS" if sp["measured_speedup"] >= GOAL_BATCH_SPEEDUP else "FAIL",
            f"{detail}, α = E[β] {alpha:.2f} ({rate}){proj}")
  add(f"GPU: target step ≤ {GOAL_ROOFLINE:g}× its HBM roofline", "pending",
      "no GPU on this machine: run benchmarks/gpu_roofline.py on one")
  return out


def batch_goal_projection(rows) -> str:
  """What this machine's component times say about the batch goal, whatever
  the pair's α: the steady-state speedup tokens / (γc + verify cost) with
  the i.i.d. model's tokens per call at α = GOAL_ALPHA (best measured γ),
  and the least α that reaches GOAL_BATCH_SPEEDUP. "" without components."""
  cells = [(r["gamma"], r["c"], r["verify_cost"]) for r in rows
           if r["system"] == "specjax speculative" and r["batch"] == GOAL_BATCH
           and r.get("devices", 1) == 1 and r.get("verify_cost") and r.get("c") is not None]
  cells = [x for x in cells if np.isfinite(x[1]) and np.isfinite(x[2])]
  if not cells:
    return ""
  at = {g: theory.walltime_improvement_from_tokens(
      theory.expected_tokens_per_call(GOAL_ALPHA, g), g, c, v) for g, c, v in cells}
  g, c, v = max(cells, key=lambda x: at[x[0]])
  text = (f"; the components predict {at[g]:.2f}× at α = {GOAL_ALPHA:g} (γ = {g}: verify "
          f"{v:.2f}× a T = 1 step, c {c:.3f})")
  need = {g: theory.alpha_for_tokens(GOAL_BATCH_SPEEDUP * (g * c + v), g)
          for g, c, v in cells if GOAL_BATCH_SPEEDUP * (g * c + v) <= g + 1}
  if not need:
    return text + (f" and no α reaches {GOAL_BATCH_SPEEDUP:g}× at the measured γ "
                   f"({', '.join(str(x[0]) for x in cells)})")
  g2 = min(need, key=need.get)
  return text + f"; {GOAL_BATCH_SPEEDUP:g}× needs α ≥ {need[g2]:.2f} (γ = {g2})"


# --------------------------------------------------------------------------- markdown


def _f(v, fmt="{:.2f}", none="—"):
  if v is None or (isinstance(v, float) and not np.isfinite(v)):
    return none
  return fmt.format(v)


def _mem(row):
  m = row.get("memory")
  if not m:
    return "—"
  if "error" in m:
    return "error"
  return _f(m.get("peak_mb"), "{:.0f}")


def _memory_table(rows) -> List[str]:
  lines = ["| system | B | γ | idle RSS MiB | peak (steady call) | transient (the call) | peak with "
           "load + compile | resident after |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    m = r.get("memory")
    if not m:
      continue
    if "error" in m:
      lines.append(f"| {r['system']} | {r['batch']} | {r['gamma'] or '—'} | error: {m['error']} "
                   "| | | | |")
      continue
    x = lambda k: _f(m.get(k), "{:.0f}")
    lines.append(f"| {r['system']} | {r['batch']} | {r['gamma'] or '—'} | {x('idle_rss_mb')} | "
                 f"{x('peak_mb')} | {x('transient_mb')} | {x('peak_with_load_mb')} | "
                 f"{x('resident_mb')} |")
  return lines if len(lines) > 2 else []


def _agreement(row) -> str:
  """The "= specjax AR" cell: yes, or identical rows / rows (first differing position)."""
  ag = row["agreement"]
  return ("yes" if ag["identical"] else
          f"{ag['identical_rows']}/{ag['rows']} (pos {ag['first_mismatch']})")


def _system_table(rows) -> List[str]:
  lines = ["| system | B | γ | tok/s | ms/token | TTFT ms | ITL P50 ms | ITL P99 ms | ITL mean ms "
           "| peak MiB | compile s | acc. / drafted | tok/iter | = specjax AR |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in sorted(rows, key=lambda r: (r["batch"], r["framework"] != "specjax", r["system"],
                                       r["gamma"] or 99)):
    same = _agreement(r)
    gamma = "—" if not r["gamma"] and r["system"] != "transformers assisted" else (
        "default" if r.get("note") else str(r["gamma"]))
    compile_s = r.get("compile_s")
    lines.append(
        f"| {r['system']} | {r['batch']} | {gamma} | {_f(r['tokens_per_s'], '{:.1f}')} | "
        f"{_f(r['ms_per_token'])} | {_f(r.get('ttft_ms'))} | {_f(r.get('itl_p50_ms'))} | "
        f"{_f(r.get('itl_p99_ms'))} | {_f(r.get('itl_mean_ms'))} | {_mem(r)} | "
        f"{_f(compile_s, '{:.1f}')} | {_f(r.get('acceptance_rate'))} | "
        f"{_f(r.get('tokens_per_iteration'))} | {same} |")
  return lines


def _speculative_table(rows, alphas) -> List[str]:
  lines = ["| B | γ | α = E[β] | acc. / drafted | tok/iter | iterations | AR tok/s | SP tok/s | "
           "speedup | predicted | loop overhead | AR ovh | SP ovh | verify cost (×T=1) | c |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  ar = {r["batch"]: r for r in rows if r["system"] == "specjax autoregressive"}
  for r in sorted((r for r in rows if r["system"] == "specjax speculative"),
                  key=lambda r: (r["batch"], r["gamma"])):
    lines.append(
        f"| {r['batch']} | {r['gamma']} | {_f(alphas.get(r['batch']))} | "
        f"{_f(r['acceptance_rate'])} | "
        f"{_f(r['tokens_per_iteration'])} | {sum(r['iterations'])} | "
        f"{_f(ar[r['batch']]['tokens_per_s'], '{:.1f}')} | {_f(r['tokens_per_s'], '{:.1f}')} | "
        f"{_f(r['measured_speedup'])}× | {_f(r['predicted_speedup'])}× | "
        f"{_f(100 * r['loop_overhead'], '{:+.1f}')}% | "
        f"{_f(100 * r['ar_loop_overhead'], '{:+.1f}')}% | "
        f"{_f(100 * r['sp_loop_overhead'], '{:+.1f}')}% | {_f(r['verify_cost'])} | "
        f"{_f(r['c'], '{:.3f}')} |")
  return lines


def _paired_table(batches) -> List[str]:
  found = [b["paired_overhead"] for b in batches if b.get("paired_overhead")]
  if not found:
    return []
  lines = ["| B | γ | rounds | loop overhead (median) | range | predicted | measured | AR ovh | "
           "SP ovh | logic | composition | SP logic | per round |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  pct = lambda po, key: _f(100 * po[key], "{:+.1f}%") if key in po else "—"
  for po in found:
    per = ", ".join(f"{100 * r['loop_overhead']:+.1f}" for r in po["rounds"])
    lines.append(
        f"| {po['batch']} | {po['gamma']} | {len(po['rounds'])} | "
        f"{100 * po['loop_overhead']:+.1f}% | {100 * po['loop_overhead_min']:+.1f}…"
        f"{100 * po['loop_overhead_max']:+.1f}% | {po['predicted_speedup']:.2f}× | "
        f"{po['measured_speedup']:.2f}× | {100 * po['ar_loop_overhead']:+.1f}% | "
        f"{100 * po['sp_loop_overhead']:+.1f}% | {pct(po, 'logic_overhead')} | "
        f"{pct(po, 'composition_overhead')} | {pct(po, 'sp_logic')} | {per} |")
  return lines


def _layout_note(p) -> str:
  """The decoder params' layout in specjax's rows ('' for T5 and results from
  before the packed layout existed)."""
  packed = p.get("spec", {}).get("packed")
  if p["kind"] != "decoder" or packed is None:
    return ""
  note = (" · specjax params: packed decode layout (`DecoderLM.pack_params`)" if packed
          else " · specjax params: standard layout")
  spec, tuning = p.get("spec", {}), p.get("matvec_tuning")
  if spec.get("target_matvec_rows") is not None:
    note += (f" · `matvec_max_rows` target {spec['target_matvec_rows']}, draft "
             f"{spec['draft_matvec_rows']} ("
             + ("tuned on this machine by `specjax.tune_matvec_rows`" if tuning else "set"))
    if tuning:
      note += "; per-token products' speedup over one matrix-matrix product at N rows: " + \
          "; ".join(f"{role} " + ", ".join(f"N={n} {v:.2f}×" for n, v in sorted(
              tuning[role]["speedups"].items(), key=lambda kv: int(kv[0])))
                    for role in ("target", "draft") if role in tuning)
    note += ")"
  return note


def _model_parallel_table(rows) -> List[str]:
  mp = [r for r in rows if r.get("devices", 1) > 1]
  if not mp:
    return []
  peers = {}
  for b in {r["batch"] for r in mp}:
    peers[b] = (best_row(rows, "transformers greedy", b),
                best_row(rows, "transformers assisted", b, with_defaults=True))
  lines = ["| system | B | γ | tok/s | ms/token | × one device (same γ) | / transformers greedy | "
           "/ transformers assisted (best) | α | = specjax AR |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in sorted(mp, key=lambda r: (r["batch"], r["gamma"])):
    hg, ha = peers[r["batch"]]
    div = lambda peer: _f(r["tokens_per_s"] / peer["tokens_per_s"], "{:.2f}×") if peer else "—"
    same = _agreement(r)
    lines.append(f"| {r['system']} | {r['batch']} | {r['gamma'] or '—'} | "
                 f"{_f(r['tokens_per_s'], '{:.1f}')} | {_f(r['ms_per_token'])} | "
                 f"{_f(r.get('vs_one_device'), '{:.2f}×')} | {div(hg)} | {div(ha)} | "
                 f"{_f(r.get('acceptance_rate'))} | {same} |")
  return lines


def _ratio_table(ratios) -> List[str]:
  lines = ["| B | specjax AR / transformers greedy | specjax SP (best γ) / transformers assisted "
           "(best) | at the same γ | / assisted (defaults) | / prompt lookup (best) | best specjax / "
           "best transformers |", "|---|---|---|---|---|---|---|"]
  for r in ratios:
    x = lambda k: _f(r[k], "{:.2f}×")
    sp = x("sp_vs_hf_assisted") + (f" (γ={r['sp_gamma']} vs {r['hf_assisted_best']})"
                                   if r["sp_vs_hf_assisted"] is not None else "")
    same = x("sp_vs_hf_assisted_same_gamma") + (f" (γ={r['same_gamma']})"
                                                if r["sp_vs_hf_assisted_same_gamma"] else "")
    lines.append(f"| {r['batch']} | {x('ar_vs_hf_greedy')} | {sp} | "
                 f"{same} | {x('sp_vs_hf_assisted_defaults')} | "
                 f"{x('sp_vs_hf_lookup')} | {x('best_vs_best_peer')} ({r['best_specjax']} vs "
                 f"{r['best_peer']}) |")
  return lines


def growth_conclusion(growth) -> List[str]:
  """Plain-language conclusions from the cost-growth rows."""
  rows = growth["rows"]
  out = []
  for g, label in ((0, "autoregressive"), (growth["gamma"], f"speculative γ={growth['gamma']}")):
    length = sorted((r for r in rows if r["sweep"] == "length" and r["gamma"] == g),
                    key=lambda r: r["new_tokens"])
    buf = sorted((r for r in rows if r["sweep"] == "buffer" and r["gamma"] == g),
                 key=lambda r: r["buffer_factor"])
    if len(length) >= 2:
      a, b = length[0], length[-1]
      out.append(f"- {label}: {a['ms_per_token']:.2f} ms/token at N = {a['new_tokens']} → "
                 f"{b['ms_per_token']:.2f} at N = {b['new_tokens']} "
                 f"({100 * (b['ms_per_token'] / a['ms_per_token'] - 1):+.0f}%): the cost of a "
                 "longer context (buffer sized to fit).")
    if len(buf) >= 2:
      base = buf[0]
      parts = [f"×{r['buffer_factor']}: "
               f"{100 * (r['ms_per_token'] / base['ms_per_token'] - 1):+.0f}%" for r in buf[1:]]
      out.append(f"- {label}, N = {base['new_tokens']}: a larger buffer than needed costs "
                 + ", ".join(parts) + " per token (every step reads and masks all slots).")
      two = next((r for r in buf if r["buffer_factor"] == 2), None)
      if two is not None:
        extra = two["median_s"] - base["median_s"]
        comp = two["compile_s"]
        if extra > 0:
          calls = comp / extra
          out.append(
              f"  One compilation costs {comp:.1f} s = the extra time of {calls:.0f} calls with a "
              "×2 buffer: bucketing buffer lengths to powers of two (at most ×2 waste) pays "
              f"whenever a new exact length would be used for fewer than ~{calls:.0f} calls.")
        else:
          out.append(f"  A ×2 buffer cost nothing measurable here (compile {comp:.1f} s): "
                     "bucketing buffer lengths to powers of two is free.")
      longest = next((r for r in length if r["cache_len"] >= buf[-1]["cache_len"]), None)
      if longest is not None:
        out.append(
            f"  Same buffer, different context: N = {buf[-1]['new_tokens']} in S = "
            f"{buf[-1]['cache_len']} costs {buf[-1]['ms_per_token']:.2f} ms/token, "
            f"N = {longest['new_tokens']} in S = {longest['cache_len']} costs "
            f"{longest['ms_per_token']:.2f}: the buffer, not the valid context, sets the "
            "per-step cost of a static cache.")
  return out


def _growth_table(growth) -> List[str]:
  rows = growth["rows"]
  lines = ["| sweep | N | S (slots) | S / needed | AR ms/token | SP ms/token | AR compile s | "
           "SP compile s |", "|---|---|---|---|---|---|---|---|"]
  keyed = {(r["sweep"], r["new_tokens"], r["buffer_factor"], r["gamma"]): r for r in rows}
  seen = []
  for r in rows:
    k = (r["sweep"], r["new_tokens"], r["buffer_factor"])
    if k in seen:
      continue
    seen.append(k)
    a, s = keyed.get(k + (0,)), keyed.get(k + (growth["gamma"],))
    lines.append(f"| {r['sweep']} | {r['new_tokens']} | {r['cache_len']} | ×{r['buffer_factor']} | "
                 f"{_f(a and a['ms_per_token'])} | {_f(s and s['ms_per_token'])} | "
                 f"{_f(a and a['compile_s'], '{:.1f}')} | {_f(s and s['compile_s'], '{:.1f}')} |")
  return lines


def to_markdown(results: Dict[str, Any]) -> str:
  m, cfg = results["meta"], results["meta"]["config"]
  lines = [
      "# specjax against transformers on the same weights (CPU)", "",
      f"{m['machine']} · Python {m['python']} · JAX {m['jax']} ({m['backend']}) · torch "
      f"{m['torch']} · transformers {m['transformers']} · {m['date']} · mode `{cfg['mode']}` · "
      f"total {m['total_s'] / 60:.1f} min · load average at start "
      f"{_f(m['load_average'] and m['load_average'][0])}." + provenance_sentence(results), "",
      f"Greedy decoding, EOS ignored: every system generates exactly N = {cfg['max_new']} tokens "
      f"per row from the same prompts; float32 everywhere. Batch 1 serves {cfg['b1_prompts']} "
      f"request(s) one after another per timed call; batch B > 1 decodes prompts 0..B-1 at once. "
      f"Throughput: median of {cfg['repeats']} interleaved rounds over all systems of a batch size "
      "(after one warm-up call each). specjax throughput = the fused `lax.while_loop` "
      "(`generate` / `speculative_generate`); specjax latency = jitted `init_state` / `step` with "
      "the tokens fetched to the host after each iteration; transformers latency = a `BaseStreamer` "
      "timestamping `put`. Every token an iteration commits arrives at that iteration's timestamp "
      "(the first with the iteration's gap, the others with 0), hence P50 ITL of 0 when iterations "
      "commit ≥ 2 tokens on average. Peak memory: each system alone in a fresh process, peak RSS "
      "during a steady call (high-water mark reset after a warm-up call"
      + (", the C heap's free pages returned to the OS first" if m.get("memory_heap_trim")
         else "") + ") minus that process's "
      "idle RSS after its imports (details in the memory table). compile = "
      "first call − steady call. loop overhead = predicted speedup (from `step_times` component "
      "times and the measured iterations) / measured speedup − 1; AR / SP ovh = wall / "
      "predicted − 1. The loop-overhead goals use the paired rounds (loops and components timed "
      "moments apart, best γ per batch); the speculative table's column is unpaired (components "
      "timed minutes after the loops).",
      ""]
  if m["load_average"] and m["load_average"][0] > 0.5 and cfg["mode"] != "smoke":
    lines += [f"**Warning: the machine was busy when the suite started (load average "
              f"{m['load_average'][0]:.2f}); timings, transformers' above all (its OpenMP threads "
              "stall when a core is taken), are not representative.**", ""]
  lines += ["## Goals", ""]
  for g in results["goals"]:
    lines.append(f"- **{g['status']}** — {g['goal']}: {g['detail']}")
  for name, p in results["pairs"].items():
    lines += ["", f"## Pair `{name}` ({p['kind']})", "",
              f"Models: {p['source']} · target {p['params']['target'] / 1e6:.2f}M params, draft "
              f"{p['params']['draft'] / 1e6:.3f}M "
              f"(1 : {p['params']['target'] / p['params']['draft']:.0f}) "
              f"· prompts: {p['prompts']['source']} (P = {p['prompts']['prompt_len']}, mean length "
              f"{p['prompts']['mean_length']:.1f}) · cache buffer {p['cache_len']} slots · torch "
              f"threads {p['torch_threads']}{_layout_note(p)} · {p['seconds'] / 60:.1f} min", ""]
    if p["hf_error"]:
      lines += [f"transformers not measured: {p['hf_error']}", ""]
    lines += ["### Every configuration", ""] + _system_table(p["rows"]) + [""]
    mem = _memory_table(p["rows"])
    if mem:
      lines += ["### Peak memory (MiB above the idle process; each system alone in a fresh "
                "process)", ""] + mem + [""]
    lines += ["### specjax speculative vs autoregressive: measured and predicted", ""]
    alphas = {b["batch"]: b.get("alpha") for b in p["batches"]}
    lines += _speculative_table(p["rows"], alphas) + [""]
    lines += ["α = E[β]: the share of the target's greedy positions (the autoregressive "
              "tokens of that batch's prompts) where the draft's argmax, teacher-forced on the "
              "same prefix, is the target's — Leviathan et al.'s α, which the goals use. "
              "acc. / drafted is another number: it counts the drafts after a rejection "
              "(proposed, never checked) as not accepted, and the positions the loop does "
              "check need not be typical ones." if any(a is not None for a in alphas.values())
              else "α = E[β] was not measured by this run (the goals fall back to n/a); "
              "acc. / drafted is another number (it counts the drafts after a rejection, "
              "never checked, as not accepted).", ""]
    st = "; ".join(
        f"B={b['batch']}: target "
        + ", ".join(f"T={t} {v:.2f}" for t, v in b["step_times_ms"]["target"].items()) + " ms"
        + "".join(f"; draft T={t} {v:.3f} ms" for t, v in b["step_times_ms"]["draft"].items())
        for b in p["batches"])
    lines += [f"Component times (in-graph): {st}.", ""]
    paired = _paired_table(p["batches"])
    if paired:
      lines += ["### Loop overhead, paired rounds (best γ per batch)", "",
                "Each round times the AR and the speculative loop once and right after every "
                "component once (target T = 1 and γ + 1, draft T = 1 and 2, both prefills); "
                "overhead = predicted / measured speedup − 1 per round. "
                + (f"Batch sizes with short loops get more rounds (up to 4×), until the loops "
                   f"ran {cfg['overhead_min_seconds']:g} s in all. "
                   if cfg.get("overhead_min_seconds") else "")
                + "The goal uses the "
                "median of the rounds' overheads; the predicted, measured and AR / SP ovh "
                "columns are medians of their own, so their ratio need not equal it. "
                "Each round also times both loops' model calls alone "
                "(`specjax.measure.calls.model_call_loop`: the same calls in the same "
                "order for the same requests and iteration counts, without verify, commit, "
                "stopping, statistics or the API's host work), which splits the overhead: "
                "logic = model-call speedup / measured − 1 (the decoding logic), composition = "
                "predicted / model-call speedup − 1 (the components run in one loop instead of "
                "each in its own: draft and target one after another, positions that advance); "
                "(1 + logic)(1 + composition) = 1 + overhead "
                "per round. SP logic = speculative loop / its model calls − 1.",
                ""] + paired + [""]
    lines += ["### Ratios (tokens/s)", ""] + _ratio_table(p["ratios"]) + [""]
    mp = _model_parallel_table(p["rows"])
    if mp:
      lines += ["### Every core on the target: model-parallel rows", "",
                "The target's params split over a `model` mesh axis of one CPU device per core "
                "(`specjax.parallel.sharding.shard_params`: heads, MLP units and vocabulary Megatron-style; "
                "XLA inserts the all-reduces), the draft replicated on every device "
                "(`sharding.replicate`), the caches placed likewise and allocated inside each "
                "timed call. Timed in the same interleaved rounds as every other batch-1 "
                "system; transformers uses every core through its torch threads. Latency, "
                "memory and the loop-overhead split are measured on one device only.", ""]
      lines += mp + [""]
    for note in p["notes"]:
      lines.append(f"- {note}")
    if p["growth"]:
      g = p["growth"]
      lines += ["", f"### Cost growth (batch {g['batch']}, γ = {g['gamma']})", ""]
      lines += _growth_table(g) + [""] + growth_conclusion(g)
  lines += ["", f"Total runtime: {m['total_s'] / 60:.1f} min."]
  return "\n".join(lines) + "\n"
