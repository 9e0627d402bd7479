"""Compile lowered programs for a TPU and report what physics says about them.

`compile_program(lowered, chip)` compiles one `aot.programs.Lowered` and returns a
`ProgramReport`: compile time; the compiler's per-device memory (arguments, outputs,
temporaries, aliased: donated buffers updated in place) against the chip's HBM; the main
loop's per-iteration accounting (`aot.hlo_cost`); the bytes it *should* read per iteration
(the parameter and cache slices each call reads) and the ratio; and a roofline prediction of
one iteration from the chip's published figures:

  t = max(HBM bytes / HBM bandwidth, FLOPs / peak bf16 FLOP/s)
      + collectives × latency + collective bytes / ICI bandwidth

FLOPs are our own count (2 per weight per token row, 2 per cache element per query head
reading it); the collective latency (`COLLECTIVE_LATENCY_S`) is an assumption, reported apart
so the HBM floor stays visible.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

from specjax._clock import now
from specjax.aot.chips import Chip
from specjax.aot.hlo_cost import LoopCost, loop_cost, program_cost
from specjax.aot.programs import Lowered

__all__ = ["ProgramReport", "compile_program", "format_reports", "COLLECTIVE_LATENCY_S"]

COLLECTIVE_LATENCY_S = 10e-6


@dataclasses.dataclass
class ProgramReport:
  """What one compiled program holds and moves per device (bytes)."""

  name: str
  kind: str
  compile_s: float
  argument_bytes: int
  output_bytes: int
  temp_bytes: int
  alias_bytes: int
  code_bytes: int
  hbm_bytes: int
  slices: Dict[str, int]
  loop: Optional[Dict[str, Any]]
  expected_bytes: int
  read_ratio: Optional[float]
  flops: float
  predicted_s: Dict[str, float]
  error: Optional[str] = None
  shared_argument_bytes: int = 0

  @property
  def peak_bytes(self) -> int:
    """Live bytes per device: arguments + outputs − aliased + temporaries, a buffer passed as
    two arguments counted once (`shared_argument_bytes`)."""
    return (self.argument_bytes - self.shared_argument_bytes + self.output_bytes
            - self.alias_bytes + self.temp_bytes)

  @property
  def fits(self) -> bool:
    return self.error is None and self.peak_bytes <= self.hbm_bytes

  def to_dict(self) -> Dict[str, Any]:
    d = dataclasses.asdict(self)
    d.update(peak_bytes=self.peak_bytes, fits=self.fits)
    return d

  @classmethod
  def from_dict(cls, d: Dict[str, Any]) -> "ProgramReport":
    """The report `to_dict` wrote (derived and extra keys ignored)."""
    fields = dataclasses.fields(cls)
    names = {f.name for f in fields}
    missing = sorted(f.name for f in fields if f.name not in d
                     and f.default is dataclasses.MISSING)
    if missing:
      raise ValueError(f"a program report needs {missing}; got keys {sorted(d)}")
    return cls(**{k: v for k, v in d.items() if k in names})


def _loop_dict(cost: LoopCost) -> Dict[str, Any]:
  return {"bytes_read": cost.bytes_read, "bytes_written": cost.bytes_written,
          "collectives": {k: {"count": n, "bytes": b} for k, (n, b) in cost.collectives.items()},
          "collective_count": cost.collective_count, "collective_bytes": cost.collective_bytes,
          "host_transfers": cost.host_transfers,
          "hbm_copies": [{"instruction": n, "bytes": b} for n, b, _ in cost.hbm_copies],
          "memory_space_moves": sum(b for _, b, h in cost.large_copies if not h),
          "unknown_trip_loops": cost.unknown_trips}


def expected_bytes(lowered: Lowered) -> int:
  """Bytes one iteration must read per device: the target's params and cache slices once, and
  per draft call the draft's slices and the target weights it reads (`draft_shared`)."""
  s = lowered.slices
  if lowered.kind == "train":
    return s.get("train_state", 0)
  total = s.get("target_params", 0) + s.get("target_cache", 0)
  if lowered.kind == "speculative":
    total += lowered.draft_calls * _draft_call_bytes(s)
  return total


def _draft_call_bytes(slices) -> int:
  return slices.get("draft_params", 0) + slices.get("draft_cache", 0) \
      + slices.get("draft_shared", 0)


def _flops(lowered: Lowered, batch_rows: int, group: int, itemsize: int = 2) -> float:
  """Per-device FLOPs of one iteration (see the module docstring)."""
  s = lowered.slices
  t = lowered.tokens_per_call
  flops = 2.0 * s.get("target_params", 0) / itemsize * batch_rows * t
  flops += 2.0 * s.get("target_cache", 0) / itemsize * t * group
  if lowered.kind == "speculative":
    flops += lowered.draft_calls * 2.0 * _draft_call_bytes(s) / itemsize * batch_rows
  if lowered.kind == "train":
    flops = 6.0 * s.get("train_state", 0) / 3 / 4 * batch_rows * t  # params ~ 1/3 of f32 state
  return flops


def compile_program(lowered: Lowered, chip: Chip, *, batch_rows: int = 1, group: int = 1,
                    copy_threshold: Optional[int] = None,
                    collective_latency_s: float = COLLECTIVE_LATENCY_S,
                    hlo_path: Optional[str] = None) -> ProgramReport:
  """Compiles `lowered` and reports it (a compile error is reported, not raised).

  batch_rows: rows on one device (B / data); group: query heads per kv head (attention
  FLOPs); copy_threshold: the size from which a per-iteration copy counts as cache-sized
  (default: none)."""
  t0 = now()
  try:
    compiled = lowered.lowered.compile()
  except Exception as e:  # an OOM or an unsupported op: the report says which
    msg = str(e).strip().splitlines()
    return ProgramReport(lowered.name, lowered.kind, now() - t0, 0, 0, 0, 0, 0,
                         chip.hbm_bytes, dict(lowered.slices), None, expected_bytes(lowered),
                         None, 0.0, {}, error=(msg[0] if msg else type(e).__name__)[:500])
  compile_s = now() - t0
  mem = compiled.memory_analysis()
  # The arguments jax kept (unused ones are dropped before XLA); unknown: none discounted.
  kept = getattr(getattr(compiled, "_executable", None), "_kept_var_idx", None)
  shared = 0 if kept is None else sum(n for i, j, n in lowered.shared_args
                                      if i in kept and j in kept)
  hlo = compiled.as_text()
  if hlo_path:
    with open(hlo_path, "w", encoding="utf-8") as f:
      f.write(hlo)
  cost = (program_cost(hlo) if lowered.kind in ("prefill", "train")
          else loop_cost(hlo, copy_threshold or (1 << 62)))
  exp = expected_bytes(lowered)
  flops = _flops(lowered, batch_rows, group)
  pred = {}
  if cost is not None:
    hbm_s = cost.bytes_accessed / chip.hbm_bytes_per_s
    compute_s = flops / chip.bf16_flops_per_s
    coll_s = (cost.collective_count * collective_latency_s
              + cost.collective_bytes / chip.ici_bytes_per_s)
    pred = {"hbm_s": hbm_s, "compute_s": compute_s, "collectives_s": coll_s,
            "roofline_s": max(hbm_s, compute_s), "total_s": max(hbm_s, compute_s) + coll_s}
  return ProgramReport(
      name=lowered.name, kind=lowered.kind, compile_s=compile_s,
      argument_bytes=int(mem.argument_size_in_bytes), output_bytes=int(mem.output_size_in_bytes),
      temp_bytes=int(mem.temp_size_in_bytes), alias_bytes=int(mem.alias_size_in_bytes),
      code_bytes=int(mem.generated_code_size_in_bytes), hbm_bytes=chip.hbm_bytes,
      slices=dict(lowered.slices), loop=None if cost is None else _loop_dict(cost),
      expected_bytes=exp,
      # The per-iteration goal applies to loops; a prefill or a train step is one call.
      read_ratio=(None if cost is None or not exp or lowered.kind not in ("ar", "speculative")
                  else cost.bytes_read / exp),
      flops=flops, predicted_s=pred, shared_argument_bytes=shared)


def _gb(n: float) -> str:
  return f"{n / 1e9:.2f}"


def format_reports(reports: List[ProgramReport], title: str) -> str:
  """A markdown table of reports (per device; GB = 10^9 bytes; args: each buffer once)."""
  lines = [f"### {title}", "",
           "| program | compile s | args GB | temp GB | peak GB / HBM | fits | read/iter GB "
           "| expected GB | ratio | collectives/iter | HBM-copies | host | HBM floor ms "
           "| +collectives ms |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in reports:
    if r.error:
      lines.append(f"| {r.name} | {r.compile_s:.0f} | — | — | — | **no**: {r.error[:120]} "
                   "| | | | | | | | |")
      continue
    loop = r.loop or {}
    coll = ", ".join(f"{v['count']} {k}" for k, v in sorted(loop.get("collectives", {}).items()))
    p = r.predicted_s
    lines.append(
        f"| {r.name} | {r.compile_s:.0f} | {_gb(r.argument_bytes - r.shared_argument_bytes)} "
        f"| {_gb(r.temp_bytes)} "
        f"| {_gb(r.peak_bytes)} / {_gb(r.hbm_bytes)} | {'yes' if r.fits else '**no**'} "
        f"| {_gb(loop.get('bytes_read', 0))} | {_gb(r.expected_bytes)} "
        f"| {'' if r.read_ratio is None else f'{r.read_ratio:.2f}'} | {coll or '0'} "
        f"| {len(loop.get('hbm_copies', []))} | {loop.get('host_transfers', 0)} "
        f"| {p.get('roofline_s', 0) * 1e3:.2f} | {p.get('total_s', 0) * 1e3:.2f} |")
  return "\n".join(lines)
