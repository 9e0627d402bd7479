"""Compile-only runs: every program an experiment would execute, for a TPU topology.

`AotRun` names a run's shapes (target, drafts, γ values, batch, lengths) and the slice; `run_aot`
lowers every program of it with abstract sharded arguments (`specjax.aot.programs`), compiles each
for the slice's devices (no TPU needed, no memory allocated) and reports per program
(`specjax.aot.report`): memory against the chip's HBM, per-iteration bytes, collectives, host
transfers, cache-sized copies, the predicted iteration time, the memory plan's agreement with the
compiler and, given acceptance rates, theory's predicted speedup. Example: docs/tpu.md.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import numpy as np
from jax.sharding import Mesh

from specjax._clock import now
from specjax import theory
from specjax.aot.chips import Chip, chip as chip_named, chip_of_device, num_hosts, topology_devices
from specjax.aot.programs import (PARAM_LAYOUTS, Lowered, lower_ar_loop, lower_eagle_train_step,
                                  lower_prefill, lower_speculative_loop, lower_train_step)
from specjax.aot.report import ProgramReport, compile_program, format_reports
from specjax.drafters.eagle import DynamicTree, Eagle
from specjax.drafters.medusa import Medusa
from specjax.drafters.model import ModelDrafter
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.models.eagle_head import EagleConfig, init_eagle
from specjax.models.medusa_head import MedusaConfig
from specjax.parallel.sharding import DATA, MODEL, fit_to_mesh, param_spec
from specjax.planning.memory import memory_plan, prompt_feature_bytes
from specjax.planning.mesh import choose_mesh
from specjax.sampling import GREEDY, SamplingConfig
from specjax.tree import TokenTree
from specjax._checks import check_int

__all__ = ["AotRun", "run_aot", "replan", "merge_results", "PROGRAM_KINDS"]

PROGRAM_KINDS = ("prefill", "ar", "draft", "prompt_lookup", "eagle_chain", "eagle_static",
                 "eagle_tree", "medusa", "train", "train_eagle")

# EAGLE-1's static tree: two children at each of the first two depths, then chains (7 nodes
# past the root, depth 3).
_STATIC_TREE_PATHS = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (1, 0, 0))


@dataclasses.dataclass(frozen=True)
class AotRun:
  """The shapes of a run and the slice to compile it for.

  Attributes:
    topology: a TPU slice ("v5e:2x4", "v4:2x2x4", ...).
    target: the target model (`DecoderLM` or `T5`).
    drafts: (name, model) draft models (classic speculative decoding).
    gammas: γ values of the speculative loop.
    batch_size, prompt_len, max_new_tokens: the run's batch and lengths.
    cache_len: cache slots (default prompt_len + max_new_tokens + max γ + 1).
    mesh: (data, model) axis sizes (default: data 1 x model over every chip — the decode-latency
      layout).
    programs: which kinds of program to compile (`PROGRAM_KINDS`; decoder-only drafters apply to
      decoder targets).
    eagle_features, eagle_tree: the target blocks an EAGLE-3 head fuses (() = EAGLE-1); (top_k,
      depth, nodes) of EAGLE-2's dynamic tree. medusa_heads: Medusa heads (a chain that deep).
    draft_replicated: draft weights whole on every device (else split like the target).
    train_batch, train_seq_len: the draft train step's batch.
    alphas: {draft name: acceptance rate} for the predicted speedup.
    sampling: how every program samples (default greedy, matching the predictions' acceptance
      rates; a sampled program also processes the full vocabulary on every device).
    param_layouts: "default" (the devices' default layouts, as `jax.device_put` leaves them) or
      "auto" (the layouts the compiler chooses for the prefill, AR and speculative programs: what
      a deployment placing its weights in the program's `input_formats` runs).
  """

  topology: str
  target: Any
  drafts: Tuple[Tuple[str, Any], ...] = ()
  gammas: Tuple[int, ...] = (4,)
  batch_size: int = 1
  prompt_len: int = 128
  max_new_tokens: int = 128
  cache_len: Optional[int] = None
  mesh: Optional[Tuple[int, int]] = None
  programs: Tuple[str, ...] = ("prefill", "ar", "draft")
  eagle_features: Tuple[int, ...] = ()
  eagle_tree: Tuple[int, int, int] = (4, 5, 24)
  medusa_heads: int = 4
  draft_replicated: bool = True
  train_batch: int = 8
  train_seq_len: int = 512
  alphas: Tuple[Tuple[str, float], ...] = ()
  sampling: SamplingConfig = GREEDY
  param_layouts: str = "default"

  def __post_init__(self):
    if self.param_layouts not in PARAM_LAYOUTS:
      raise ValueError(f"param_layouts must be one of {PARAM_LAYOUTS}, "
                       f"got {self.param_layouts!r}")
    bad = [k for k in self.programs if k not in PROGRAM_KINDS]
    if bad:
      raise ValueError(f"programs must be among {PROGRAM_KINDS}, got {bad}")
    for name in ("batch_size", "prompt_len", "max_new_tokens"):
      check_int(name, getattr(self, name), 1)
    for g in self.gammas:
      check_int("gammas[i]", g, 1)

  @property
  def kinds(self) -> Tuple[str, ...]:
    """The kinds of program to compile, in `PROGRAM_KINDS` order (e.g. one process each)."""
    return tuple(k for k in PROGRAM_KINDS if k in self.programs)

  @property
  def slots(self) -> int:
    if self.cache_len is not None:
      return self.cache_len
    return self.prompt_len + self.max_new_tokens + max(self.gammas + (self.medusa_heads,
                                                                       self.eagle_tree[2])) + 1


def _mesh(run: AotRun, devices) -> Mesh:
  n = len(devices)
  data, model = run.mesh if run.mesh is not None else (1, n)
  if data * model != n:
    raise ValueError(f"mesh {data}x{model} needs {data * model} devices; topology "
                     f"{run.topology!r} has {n}")
  return Mesh(np.array(devices).reshape(data, model), (DATA, MODEL))


def _is_decoder(model) -> bool:
  return not hasattr(model.config, "d_kv")


def _lowerings(run: AotRun, mesh: Mesh):
  """(name, thunk) of every program of the run, in order; models laid out as a run lays them out
  (`sharding.fit_to_mesh`: kv heads repeated where they do not divide the model axis)."""
  t = fit_to_mesh(run.target, None, mesh)[0]
  if not run.draft_replicated:
    run = dataclasses.replace(run, drafts=tuple((name, fit_to_mesh(d, None, mesh)[0])
                                                for name, d in run.drafts))
  b, p, n, s = run.batch_size, run.prompt_len, run.max_new_tokens, run.slots
  common = dict(batch_size=b, prompt_len=p, max_new_tokens=n, cache_len=s,
                sampling=run.sampling, param_layouts=run.param_layouts)
  out = []
  if "prefill" in run.programs:
    out.append(lambda: lower_prefill(t, mesh, batch_size=b, prompt_len=p, cache_len=s,
                                     sampling=run.sampling, param_layouts=run.param_layouts))
    for name, d in run.drafts:
      out.append(lambda d=d, name=name: lower_prefill(
          d, mesh, batch_size=b, prompt_len=p, cache_len=s, name=f"prefill draft {name}",
          replicated=run.draft_replicated, sampling=run.sampling,
          param_layouts=run.param_layouts))
  if "ar" in run.programs:
    out.append(lambda: lower_ar_loop(t, mesh, **common))
  if "draft" in run.programs:
    for name, d in run.drafts:
      for g in run.gammas:
        out.append(lambda d=d, g=g, name=name: lower_speculative_loop(
            t, ModelDrafter(d), mesh, gamma=g, draft_replicated=run.draft_replicated,
            name=f"speculative draft {name} γ={g}", **common))
  dec = _is_decoder(t)
  if "prompt_lookup" in run.programs and dec:
    for g in run.gammas:
      out.append(lambda g=g: lower_speculative_loop(
          t, PromptLookup(max_ngram=3, min_ngram=1), mesh, gamma=g,
          name=f"speculative prompt lookup γ={g}", **common))
  if dec and any(k in run.programs for k in ("eagle_chain", "eagle_static", "eagle_tree",
                                              "train_eagle")):
    c = t.config
    ecfg = EagleConfig(c.d_model, c.vocab_size, num_heads=c.num_heads, head_dim=c.head_dim,
                       mlp_dim=c.mlp_dim, feature_layers=tuple(run.eagle_features),
                       rope_theta=c.rope_theta, norm_eps=c.norm_eps,
                       split=not run.draft_replicated)
    head = jax.eval_shape(lambda: init_eagle(ecfg, jax.random.PRNGKey(0)))
    label = "EAGLE-3" if run.eagle_features else "EAGLE-1"

    # The head as deployed beside a bf16 target: in the target's parameter dtype (trained in
    # float32, cast by `cast_params`), whole on every device or split over `model`.
    head_dtype = np.dtype(getattr(c, "param_dtype", "float32"))

    def head_spec(path, x):
      if run.draft_replicated:
        return jax.sharding.PartitionSpec()
      return param_spec(("head",) + tuple(path), x.shape, mesh)

    def eagle_params(tp, head=head):
      return {"head": jax.tree_util.tree_map_with_path(
          lambda path, x: jax.ShapeDtypeStruct(
              x.shape, head_dtype, sharding=jax.sharding.NamedSharding(mesh, head_spec(path, x))),
          head), "target": tp}
    layout = dict(draft_replicated=run.draft_replicated)   # recorded on each `Lowered`
    if "train_eagle" in run.programs:
      out.append(lambda: lower_eagle_train_step(t, ecfg, mesh, batch_size=run.train_batch,
                                                seq_len=run.train_seq_len,
                                                name=f"train {label} head"))
    if "eagle_chain" in run.programs:
      for g in run.gammas:
        out.append(lambda g=g: lower_speculative_loop(
            t, Eagle(ecfg, TokenTree.chain(g), t), mesh, gamma=g, draft_params_fn=eagle_params,
            name=f"speculative {label} chain γ={g}", **layout, **common))
    if "eagle_static" in run.programs:
      static = TokenTree.from_paths(_STATIC_TREE_PATHS)
      out.append(lambda: lower_speculative_loop(
          t, Eagle(ecfg, static, t), mesh, gamma=static.depth, draft_params_fn=eagle_params,
          name=f"speculative {label} static tree {static.size} nodes", **layout, **common))
    if "eagle_tree" in run.programs:
      tree = DynamicTree(*run.eagle_tree)
      out.append(lambda: lower_speculative_loop(
          t, Eagle(ecfg, tree, t, "top_k"), mesh, gamma=tree.depth, draft_params_fn=eagle_params,
          name=f"speculative {label} dynamic tree {tree.nodes + 1} nodes", **layout, **common))
  if "medusa" in run.programs and dec:
    c = t.config
    mcfg = MedusaConfig(run.medusa_heads, c.d_model, c.vocab_size, share_lm_head=True)

    def medusa_params(tp):
      rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
      k, e = mcfg.num_heads, mcfg.d_model
      heads = {"w": jax.ShapeDtypeStruct((k, e, e), np.float32, sharding=rep),
               "b": jax.ShapeDtypeStruct((k, e), np.float32, sharding=rep)}
      return {"heads": heads, "target": tp}
    out.append(lambda: lower_speculative_loop(
        t, Medusa(mcfg, TokenTree.chain(run.medusa_heads), t), mesh, gamma=run.medusa_heads,
        draft_params_fn=medusa_params, name=f"speculative Medusa chain {run.medusa_heads}",
        **common))
  if "train" in run.programs:
    for name, d in run.drafts:
      out.append(lambda d=d, name=name: lower_train_step(
          d, mesh, batch_size=run.train_batch, seq_len=run.train_seq_len,
          name=f"train draft {name}"))
  return out


def _plan_check(run: AotRun, mesh: Mesh, lowered: Lowered, report: ProgramReport,
                draft) -> Optional[Dict[str, Any]]:
  """The memory plan of this program's models against the compiler's figures."""
  if report.error or lowered.kind == "train":
    return None
  plan = memory_plan(run.target.config, None if draft is None else draft.config,
                     mesh_shape=(mesh.shape[DATA], mesh.shape[MODEL]), batch_size=run.batch_size,
                     cache_len=run.slots, draft_sharded=not run.draft_replicated,
                     activation_tokens=_prefill_tokens(run), prompt_len=run.prompt_len,
                     logit_tokens=max(1, lowered.tokens_per_call if lowered.kind != "prefill"
                                      else 1))
  held = plan.target_params + plan.target_cache + plan.draft_params + plan.draft_cache
  holds_target = not lowered.name.startswith("prefill draft")
  if not holds_target:
    held = plan.draft_params + plan.draft_cache
  elif lowered.kind in ("prefill", "ar"):
    held = plan.target_params + plan.target_cache
  elif draft is None:  # not a model (EAGLE, Medusa, lookup): its params and state by shape
    own = lowered.slices.get("draft_params", 0) + lowered.slices.get("draft_cache", 0)
    held = plan.target_params + plan.target_cache + own
  args = report.argument_bytes - report.shared_argument_bytes   # each buffer once
  out = {"plan_params_and_caches": held, "compiler_arguments": args,
         "ratio": args / held if held else None}
  if holds_target:  # the plan's activation estimate is the target's prefill (or the draft's)
    total = plan.per_device_bytes + (held - plan.target_params - plan.target_cache
                                     if draft is None and lowered.kind == "speculative" else 0)
    width = lowered.prompt_hidden_width
    if width:   # a head absorbing the prompt's features during the target's prefill
      c = run.target.config
      total += prompt_feature_bytes(run.batch_size, _prefill_tokens(run), c.d_model, width,
                                    np.dtype(c.dtype).itemsize, data=mesh.shape[DATA])
    out.update(plan_total=total, compiler_peak=report.peak_bytes,
               total_ratio=report.peak_bytes / total, prompt_hidden_width=width)
  return out


def _topology_chip(run: AotRun):
  """The chip generation `run.topology` names ("v5e:2x4" → v5e's figures)."""
  return chip_named(run.topology.split(":")[0])


def run_aot(run: AotRun, progress: Callable[[str], None] = print,
            devices: Optional[Sequence[Any]] = None) -> Dict[str, Any]:
  """Compiles every program of `run` for its topology and reports them.

  Returns {"topology", "chip", "hosts", "mesh", "programs": [report dicts], "speedups": [...],
  "markdown": str}. `devices` overrides the topology's devices (local CPUs: no libtpu needed)."""
  devices = list(devices) if devices is not None else topology_devices(run.topology)
  chip = (chip_of_device(devices[0]) if devices[0].platform == "tpu"
          else _topology_chip(run))
  mesh = _mesh(run, devices)
  data, model = mesh.shape[DATA], mesh.shape[MODEL]
  rows = run.batch_size // data if run.batch_size % data == 0 else run.batch_size
  tcfg = run.target.config  # query heads per kv head (T5: multi-head)
  group = tcfg.num_heads // getattr(tcfg, "num_kv_heads", tcfg.num_heads)
  cache_buffer = _cache_buffer_bytes(run, mesh)
  reports, plans = [], []
  thunks = _lowerings(run, mesh)
  start = now()
  for i, thunk in enumerate(thunks):
    try:
      lowered = thunk()
    except Exception as e:  # a lowering error is a finding, reported
      msg = (str(e).strip().splitlines() or [type(e).__name__])[0][:500]
      reports.append(ProgramReport(f"program {i}", "lowering", 0.0, 0, 0, 0, 0, 0,
                                   chip.hbm_bytes, {}, None, 0, None, 0.0, {}, error=msg))
      plans.append(None)
      progress(f"[{i + 1}/{len(thunks)}] lowering failed: {msg}")
      continue
    rep = compile_program(lowered, chip, batch_rows=rows, group=group,
                          copy_threshold=cache_buffer)
    reports.append(rep)
    draft = lowered.draft_model if lowered.kind == "speculative" else None
    if lowered.kind == "prefill" and lowered.name.startswith("prefill draft"):
      draft = dict(run.drafts)[lowered.name[len("prefill draft "):]]
    plans.append(_plan_check(run, mesh, lowered, rep, draft))
    elapsed = now() - start
    eta = elapsed / (i + 1) * (len(thunks) - i - 1)
    progress(f"[{i + 1}/{len(thunks)}] {rep.name}: "
             + (f"FAILED {rep.error}" if rep.error else
                f"compiled in {rep.compile_s:.0f} s, peak {rep.peak_bytes / 1e9:.2f} GB of "
                f"{chip.hbm_bytes / 1e9:.1f}") + f" (elapsed {elapsed:.0f} s, ETA {eta:.0f} s)")
  return _result(run, chip, devices, data, model, reports, plans)


def _result(run: AotRun, chip, devices, data: int, model: int, reports, plans
            ) -> Dict[str, Any]:
  """`run_aot`'s result from the compiled programs' reports and plan checks."""
  out = {"topology": run.topology, "chip": dataclasses.asdict(chip),
         "hosts": num_hosts(devices), "devices": len(devices), "mesh": [data, model],
         "batch_size": run.batch_size, "prompt_len": run.prompt_len,
         "max_new_tokens": run.max_new_tokens, "cache_len": run.slots,
         "sampling": dataclasses.asdict(run.sampling), "param_layouts": run.param_layouts,
         "programs": [dict(r.to_dict(), plan=p) for r, p in zip(reports, plans)]}
  out["speedups"] = predicted_speedups(reports, dict(run.alphas))
  out["fits"] = all(r.fits for r in reports)
  if not out["fits"]:
    out["smallest_fitting"] = smallest_fitting_slice(run, chip)
  out["markdown"] = format_reports(reports, f"{run.topology} ({len(devices)} chips, "
                                   f"{num_hosts(devices)} host(s)), mesh data={data} x "
                                   f"model={model}, batch {run.batch_size}, prompt "
                                   f"{run.prompt_len}, {run.slots} cache slots, "
                                   + ("greedy" if run.sampling.is_greedy
                                      else f"sampled {run.sampling}")
                                   + ("" if run.param_layouts == "default"
                                      else ", weights in the compiler's layouts"))
  return out


def merge_results(parts: Sequence[Dict[str, Any]], run: AotRun,
                  devices: Optional[Sequence[Any]] = None) -> Dict[str, Any]:
  """One `run_aot` result from results of `run`'s program kinds compiled apart (each
  `run_aot(dataclasses.replace(run, programs=(kind,)))`, e.g. one process each: the TPU compiler
  frees a large program's host memory only at exit). Speedups, `fits` and the table recomputed."""
  if not parts:
    raise ValueError("parts must hold at least one run_aot result, got none")
  keys = ("topology", "mesh", "batch_size", "prompt_len", "cache_len", "param_layouts")
  for part in parts[1:]:
    diff = [k for k in keys if part.get(k) != parts[0].get(k)]
    if diff:
      raise ValueError(f"parts must be results of one run; they differ in {diff}")
  devices = list(devices) if devices is not None else topology_devices(run.topology)
  chip = Chip(**parts[0]["chip"])
  reports = [ProgramReport.from_dict(p) for part in parts for p in part["programs"]]
  plans = [p.get("plan") for part in parts for p in part["programs"]]
  data, model = parts[0]["mesh"]
  return _result(run, chip, devices, data, model, reports, plans)


def replan(result: Dict[str, Any], run: AotRun) -> Dict[str, Any]:
  """`result` (a `run_aot` result, e.g. from JSON) with every program's memory-plan comparison
  and a non-fitting run's smallest fitting slice recomputed by the current plan code, without
  compiling (how a plan change reaches committed results)."""
  mesh = types.SimpleNamespace(shape={DATA: result["mesh"][0], MODEL: result["mesh"][1]})
  drafts = dict(run.drafts)
  for p in result["programs"]:
    if p.get("error") or p["kind"] not in ("prefill", "ar", "speculative"):
      continue
    tokens = 1
    if p["kind"] == "speculative" and "γ=" in p["name"]:
      tokens = int(p["name"].split("γ=")[1]) + 1
    draft = None
    if p["kind"] == "speculative" and p["name"].startswith("speculative draft "):
      draft = drafts.get(p["name"][len("speculative draft "):].split(" γ=")[0])
    elif p["name"].startswith("prefill draft "):
      draft = drafts.get(p["name"][len("prefill draft "):])
    lowered = types.SimpleNamespace(kind=p["kind"], name=p["name"], tokens_per_call=tokens,
                                    slices=p.get("slices", {}),
                                    prompt_hidden_width=(p.get("plan") or {}).get(
                                        "prompt_hidden_width", 0))
    rep = types.SimpleNamespace(error=None, argument_bytes=p["argument_bytes"],
                                shared_argument_bytes=p.get("shared_argument_bytes", 0),
                                peak_bytes=p["peak_bytes"])
    p["plan"] = _plan_check(run, mesh, lowered, rep, draft)
  if not result.get("fits", True):
    result["smallest_fitting"] = smallest_fitting_slice(run, _topology_chip(run))
  return result


def _prefill_tokens(run: AotRun) -> int:
  """Positions of the largest call: the prompt, or one prefill chunk of it."""
  chunk = getattr(run.target.config, "prefill_chunk", None)
  return min(run.prompt_len, chunk) if chunk else run.prompt_len


def smallest_fitting_slice(run: AotRun, chip, max_chips: int = 256) -> Optional[Dict[str, Any]]:
  """The fewest chips of this generation (powers of two) whose best mesh
  (`planning.mesh.choose_mesh`) fits the run by the memory plan, or None within `max_chips`."""
  draft = run.drafts[0][1].config if run.drafts else None
  n = 1
  while n <= max_chips:
    try:
      mesh = choose_mesh(run.target.config, draft, num_devices=n, batch_size=run.batch_size,
                         cache_len=run.slots, capacity_bytes=chip.hbm_bytes,
                         draft_sharded=not run.draft_replicated,
                         activation_tokens=_prefill_tokens(run), prompt_len=run.prompt_len,
                         logit_tokens=max(run.gammas) + 1)
      return {"chips": n, "mesh": list(mesh)}
    except ValueError:
      n *= 2
  return None


def _cache_buffer_bytes(run: AotRun, mesh: Mesh) -> int:
  """The size from which a per-iteration copy counts as cache-sized: half the per-device bytes of
  one of the target's cache buffers (one layer's keys)."""
  cache = jax.eval_shape(lambda: run.target.init_cache(run.batch_size, run.slots,
                                                       run.prompt_len))
  leaves = [x for x in jax.tree_util.tree_leaves(cache) if x.ndim == 4]
  if not leaves:
    return 1 << 62
  x = leaves[0]
  return int(np.prod(x.shape) * x.dtype.itemsize // max(mesh.shape[MODEL], 1)) // 2


def predicted_speedups(reports, alphas: Dict[str, float]):
  """Theory's speedup from each speculative program's predicted iteration time against the AR
  step's: E[tokens per iteration](α, γ) × t_AR / t_iteration (`walltime_improvement_from_times`)."""
  ar = next((r for r in reports if r.kind == "ar" and not r.error and r.predicted_s), None)
  rows = []
  if ar is None:
    return rows
  t_ar = ar.predicted_s["total_s"]
  for r in reports:
    if r.kind != "speculative" or r.error or not r.predicted_s:
      continue
    name = r.name.split(" γ=")[0].replace("speculative draft ", "")
    gamma = int(r.name.split("γ=")[1]) if "γ=" in r.name else None
    row = {"program": r.name, "iteration_cost_vs_ar": r.predicted_s["total_s"] / t_ar}
    if name in alphas and gamma is not None:
      tokens = float(theory.expected_tokens_per_call(alphas[name], gamma))
      row.update(alpha=alphas[name], gamma=gamma, tokens_per_iteration=tokens,
                 predicted_speedup=theory.walltime_improvement_from_times(
                     tokens, t_ar, r.predicted_s["total_s"]))
    rows.append(row)
  return rows
