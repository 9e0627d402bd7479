"""Per-iteration accounting of a compiled program's HLO: bytes, collectives, copies.

`loop_cost(hlo_text)` reads a compiled program's optimized HLO (`compiled.as_text()`), finds
its main `while` loop (the decode loop) and accounts one iteration of it:

* **HBM bytes**: every top-level instruction of the body reads its operands and writes its
  result (a fusion is one kernel). An operand a fusion only slices (`dynamic-slice`, `slice`,
  `gather`) is charged the slices; one updated in place (`dynamic-update-slice`, `scatter`
  operand 0) nothing to read and the update to write. Nested loops count their trip count
  (`known_trip_count`, or N for a `counter < N` condition: `lax.scan` / `fori_loop`) times; a
  conditional its largest branch. Buffers in on-chip memory (layout memory space `S(n)`,
  n > 0) are not HBM traffic.
* **collectives** by kind: count and bytes per iteration.
* **host transfers** (send / recv / infeed / outfeed, host callbacks): none for a loop that
  stays on the device.
* **large copies**: `copy` kernels (or copy / transpose fusions) of at least `copy_threshold`
  bytes: a cache-sized buffer copied every iteration.

Our own accounting, not `cost_analysis()` (whose `bytes accessed` counts cross-program
prefetches and whose `optimal_seconds` can be negative).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Dict, List, Optional, Tuple

__all__ = ["Instr", "parse_module", "shape_bytes", "LoopCost", "loop_cost"]

_ITEMSIZE = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2,
             "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
             "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3b11fnuz": 1, "f8e4m3fnuz": 1,
             "f8e5m2fnuz": 1}
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\](\{[^}]*\})?")
# A layout's memory space other than 0 (HBM): S(1) vector, S(2) scalar / sync, S(3) v4's CMEM.
_ON_CHIP = re.compile(r"S\([1-9]\d*\)")
_NO_TRAFFIC = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all",
               "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain"}
# (and every `*-done`: its `*-start` carries the traffic)
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
                "ragged-all-to-all")
_HOST = {"send", "recv", "infeed", "outfeed"}
_VIEWS = {"bitcast", "reshape", "get-tuple-element"}
_SLICES = {"dynamic-slice", "slice", "gather"}
_IN_PLACE = {"dynamic-update-slice", "scatter"}


@dataclasses.dataclass
class Instr:
  """One HLO instruction: `%name = type opcode(operands), attributes`."""

  name: str
  type: str
  opcode: str
  operands: List[str]
  attrs: str
  root: bool = False
  args: str = ""


def shape_bytes(type_str: str, hbm_only: bool = False) -> int:
  """Bytes of an HLO type (a tuple: the sum of its arrays). `hbm_only`: without arrays in
  on-chip memory."""
  total = 0.0
  for dtype, dims, layout in _ARRAY.findall(type_str):
    if dtype not in _ITEMSIZE:
      continue
    if hbm_only and layout and _ON_CHIP.search(layout):
      continue
    n = math.prod(int(d) for d in dims.split(",")) if dims else 1
    total += n * _ITEMSIZE[dtype]
  return int(total)


def _split_type(rest: str) -> Tuple[str, str]:
  """('type', 'remainder') of the text after '= '."""
  if rest.startswith("("):
    depth = 0
    for i, ch in enumerate(rest):
      depth += ch == "("
      depth -= ch == ")"
      if depth == 0:
        return rest[:i + 1], rest[i + 1:].lstrip()
  i = rest.find(" ")
  return rest[:i], rest[i + 1:]


def _parse_instr(line: str) -> Optional[Instr]:
  s = line.strip()
  root = s.startswith("ROOT ")
  if root:
    s = s[5:]
  m = re.match(r"%([\w.\-]+) = ", s)
  if not m:
    return None
  type_str, rest = _split_type(s[m.end():])
  om = re.match(r"([\w\-]+)\(", rest)
  if not om:
    return None
  depth, i = 0, om.end() - 1
  for j in range(i, len(rest)):
    depth += rest[j] == "("
    depth -= rest[j] == ")"
    if depth == 0:
      break
  operands = re.findall(r"%([\w.\-]+)", rest[i:j + 1])
  return Instr(m.group(1), type_str, om.group(1), operands, rest[j + 1:], root, rest[i + 1:j])


def parse_module(hlo: str) -> Tuple[Dict[str, List[Instr]], Optional[str]]:
  """({computation: instructions}, entry computation name) of HLO text."""
  comps: Dict[str, List[Instr]] = {}
  entry, name = None, None
  for line in hlo.splitlines():
    head = re.match(r"^(ENTRY )?%([\w.\-]+) ", line)
    if head and line.rstrip().endswith("{"):
      name = head.group(2)
      comps[name] = []
      if head.group(1):
        entry = name
    elif name is not None and line.startswith(" "):
      ins = _parse_instr(line)
      if ins is not None:
        comps[name].append(ins)
  return comps, entry


def _attr(attrs: str, key: str) -> Optional[str]:
  m = re.search(key + r"=%([\w.\-]+)", attrs)
  return m.group(1) if m else None


def _trip_count(attrs: str) -> Optional[int]:
  m = re.search(r'"known_trip_count":\{"n":"(\d+)"', attrs)
  return int(m.group(1)) if m else None


@dataclasses.dataclass
class LoopCost:
  """One iteration of a program's main loop (see the module docstring).

  Attributes:
    body: the loop body's computation name.
    trip_count: the loop's known trip count (None: data-dependent).
    bytes_read / bytes_written: HBM bytes per iteration.
    collectives: {kind: (count, bytes)} per iteration.
    host_transfers: host transfer instructions per iteration.
    large_copies: (instruction, bytes, hbm_to_hbm) of copies of at least the threshold;
      hbm_to_hbm False: a move between HBM and on-chip memory, True: a copy within HBM.
    unknown_trips: nested loops without a known trip count (counted once).
  """

  body: str
  trip_count: Optional[int]
  bytes_read: int = 0
  bytes_written: int = 0
  collectives: Dict[str, Tuple[int, int]] = dataclasses.field(default_factory=dict)
  host_transfers: int = 0
  large_copies: List[Tuple[str, int, bool]] = dataclasses.field(default_factory=list)
  unknown_trips: int = 0

  @property
  def bytes_accessed(self) -> int:
    return self.bytes_read + self.bytes_written

  @property
  def hbm_copies(self) -> List[Tuple[str, int, bool]]:
    """Large copies within HBM (the ones that must not happen per iteration)."""
    return [c for c in self.large_copies if c[2]]

  @property
  def collective_count(self) -> int:
    return sum(c for c, _ in self.collectives.values())

  @property
  def collective_bytes(self) -> int:
    return sum(b for _, b in self.collectives.values())


class _Accountant:
  """Walks computations, charging bytes per the module docstring's rules."""

  def __init__(self, comps: Dict[str, List[Instr]], copy_threshold: int):
    self.comps = comps
    self.copy_threshold = copy_threshold
    self.types = {c: {i.name: i.type for i in instrs} for c, instrs in comps.items()}

  def _fused_reads(self, comp: str, n_operands: int, operand_types: List[str]) -> List[int]:
    """Bytes a fusion reads of each operand."""
    instrs = self.comps.get(comp, [])
    users: Dict[str, List[Instr]] = {}
    for ins in instrs:
      for op in ins.operands:
        users.setdefault(op, []).append(ins)

    def read(name: str, full: int, depth: int = 0) -> int:
      total = 0
      for u in users.get(name, []):
        if u.opcode in _SLICES and u.operands and u.operands[0] == name:
          total += shape_bytes(u.type)
        elif u.opcode in _IN_PLACE and u.operands and u.operands[0] == name:
          continue
        elif u.opcode in _VIEWS and depth < 8:
          total += read(u.name, full, depth + 1)
        else:
          return full
      return min(total, full)

    out = []
    # Parameter k of a fused computation: `%name = type parameter(k)`.
    numbered = {int(i.args): i for i in instrs
                if i.opcode == "parameter" and i.args.strip().isdigit()}
    for k in range(n_operands):
      ins = numbered.get(k)
      full = shape_bytes(operand_types[k], hbm_only=True) if k < len(operand_types) else 0
      out.append(full if ins is None else read(ins.name, full))
    return out

  def _fused_written(self, comp: str, out_type: str) -> int:
    instrs = self.comps.get(comp, [])
    by_name = {i.name: i for i in instrs}
    root = next((i for i in instrs if i.root), None)

    def written(ins: Optional[Instr], depth: int = 0) -> int:
      if ins is None or depth > 8:
        return shape_bytes(out_type, hbm_only=True)
      if ins.opcode == "tuple":
        return sum(written(by_name.get(o), depth + 1) for o in ins.operands)
      if ins.opcode in _VIEWS and ins.operands:
        return written(by_name.get(ins.operands[0]), depth + 1)
      if ins.opcode == "dynamic-update-slice" and len(ins.operands) > 1:
        return shape_bytes(self._type_in(comp, ins.operands[1]))
      if ins.opcode == "scatter" and len(ins.operands) > 2:
        return shape_bytes(self._type_in(comp, ins.operands[-1]))
      return shape_bytes(ins.type, hbm_only=True)
    return written(root)

  def _counted_trips(self, cond: Optional[str]) -> Optional[int]:
    """N for a loop whose condition is `counter < N` (JAX's counters start at 0)."""
    instrs = self.comps.get(cond or "", [])
    root = next((i for i in instrs if i.root), None)
    if root is None or root.opcode != "compare" or "direction=LT" not in root.attrs:
      return None
    consts = {i.name: i.args for i in instrs if i.opcode == "constant"}
    if len(root.operands) == 2 and root.operands[1] in consts:
      lit = consts[root.operands[1]].strip()
      if lit.lstrip("-").isdigit():
        return int(lit)
    return None

  def _fused_root_opcode(self, comp: str) -> str:
    root = next((i for i in self.comps.get(comp, []) if i.root), None)
    return root.opcode if root else ""

  def _fused_opcodes(self, comp: str) -> List[str]:
    return [i.opcode for i in self.comps.get(comp, [])]

  def _type_in(self, comp: str, name: str) -> str:
    return self.types.get(comp, {}).get(name, "")

  def account(self, comp: str, cost: LoopCost, times: int = 1, depth: int = 0) -> None:
    if depth > 16:
      return
    for ins in self.comps.get(comp, []):
      op = ins.opcode
      if op == "while":
        body, cond = _attr(ins.attrs, "body"), _attr(ins.attrs, "condition")
        n = _trip_count(ins.attrs) or self._counted_trips(cond)
        if n is None:
          cost.unknown_trips += 1
          n = 1
        for c in (body, cond):
          if c:
            self.account(c, cost, times * n, depth + 1)
        continue
      if op == "conditional":
        branches = re.findall(r"%([\w.\-]+)", ins.attrs.split("branch_computations=")[-1]
                              .split("}")[0]) if "branch_computations" in ins.attrs else \
            [c for c in (_attr(ins.attrs, "true_computation"),
                         _attr(ins.attrs, "false_computation")) if c]
        best = None
        for b in branches:
          trial = LoopCost(b, None)
          self.account(b, trial, 1, depth + 1)
          if best is None or trial.bytes_accessed > best.bytes_accessed:
            best = trial
        if best is not None:
          self._add(cost, best, times)
        continue
      called = _attr(ins.attrs, "(?:to_apply|calls)") if op in ("call", "async-start") else None
      if called:
        self.account(called, cost, times, depth + 1)
        continue
      base = op[:-6] if op.endswith("-start") else op
      if base in _COLLECTIVES:
        n, b = cost.collectives.get(base, (0, 0))
        nbytes = shape_bytes(ins.type)
        if op.endswith("-start") and ins.type.startswith("("):
          nbytes //= 2  # (operand, result) pairs
        cost.collectives[base] = (n + times, b + times * nbytes)
      if op in _HOST or (op == "custom-call" and re.search(r"host|callback|python", ins.attrs,
                                                             re.I)):
        cost.host_transfers += times
      if op in _NO_TRAFFIC or op.endswith("-done"):
        continue
      operand_types = [self._type_in(comp, o) for o in ins.operands]
      if op.endswith("-start") and base not in _COLLECTIVES:
        # Async copies and slices (HBM <-> on-chip moves): the side(s) in HBM are traffic.
        arrays = [f"{d}[{n}]{l}" for d, n, l in _ARRAY.findall(ins.type)]
        if op == "copy-start" and len(arrays) >= 2:
          dest, src = arrays[0], arrays[1]
        elif len(arrays) >= 2:
          src = operand_types[0] if operand_types else arrays[0]
          dest = arrays[1]
        else:
          continue
        moved = shape_bytes(dest)
        reads = moved if shape_bytes(src, hbm_only=True) else 0
        writes = shape_bytes(dest, hbm_only=True)
        if op == "copy-start" and moved >= self.copy_threshold:
          cost.large_copies.append((ins.name, moved, bool(reads and writes)))
        cost.bytes_read += times * reads
        cost.bytes_written += times * writes
        continue
      elif op == "fusion":
        called = _attr(ins.attrs, "calls")
        reads = sum(self._fused_reads(called, len(ins.operands), operand_types))
        writes = self._fused_written(called, ins.type)
        kernel = self._fused_root_opcode(called)
        for inner in self._fused_opcodes(called):
          base_inner = inner[:-6] if inner.endswith("-start") else inner
          if base_inner in _COLLECTIVES:
            n, b = cost.collectives.get(base_inner, (0, 0))
            cost.collectives[base_inner] = (n + times, b + times * shape_bytes(ins.type))
      else:
        reads = sum(shape_bytes(t, hbm_only=True) for t in operand_types)
        if op in _SLICES and operand_types:  # reads the slice, not the whole operand
          reads += shape_bytes(ins.type) - shape_bytes(operand_types[0], hbm_only=True)
        if op in _IN_PLACE and operand_types:
          reads -= shape_bytes(operand_types[0], hbm_only=True)
          writes = shape_bytes(operand_types[1 if op == "dynamic-update-slice" else -1])
        else:
          writes = shape_bytes(ins.type, hbm_only=True)
        kernel = op
      cost.bytes_read += times * reads
      cost.bytes_written += times * writes
      if kernel in ("copy", "transpose") and writes >= self.copy_threshold:
        cost.large_copies.append((ins.name, writes, bool(reads)))

  @staticmethod
  def _add(cost: LoopCost, other: LoopCost, times: int) -> None:
    cost.bytes_read += times * other.bytes_read
    cost.bytes_written += times * other.bytes_written
    for k, (n, b) in other.collectives.items():
      n0, b0 = cost.collectives.get(k, (0, 0))
      cost.collectives[k] = (n0 + times * n, b0 + times * b)
    cost.host_transfers += times * other.host_transfers
    cost.large_copies.extend(other.large_copies)
    cost.unknown_trips += other.unknown_trips


def loop_cost(hlo: str, copy_threshold: int = 1 << 62) -> Optional[LoopCost]:
  """Accounting of one iteration of the program's main loop (None: no loop).

  The main loop: the entry computation's top-level `while` with a data-dependent trip count
  moving the most bytes per iteration, or else the one moving the most."""
  comps, entry = parse_module(hlo)
  if entry is None:
    raise ValueError("not an HLO module: no ENTRY computation")
  acc = _Accountant(comps, copy_threshold)
  best, best_open = None, None
  for ins in comps[entry]:
    if ins.opcode != "while":
      continue
    body, cond = _attr(ins.attrs, "body"), _attr(ins.attrs, "condition")
    cost = LoopCost(body, _trip_count(ins.attrs))
    acc.account(body, cost)
    if cond:
      acc.account(cond, cost)
    if best is None or cost.bytes_accessed > best.bytes_accessed:
      best = cost
    # The decode loop runs until every row is done: no known or counted trip count.
    if cost.trip_count is None and acc._counted_trips(cond) is None:
      if best_open is None or cost.bytes_accessed > best_open.bytes_accessed:
        best_open = cost
  return best_open or best


def program_cost(hlo: str) -> LoopCost:
  """The same accounting over the whole entry computation (a prefill, a train step)."""
  comps, entry = parse_module(hlo)
  if entry is None:
    raise ValueError("not an HLO module: no ENTRY computation")
  cost = LoopCost(entry, 1)
  _Accountant(comps, 1 << 62).account(entry, cost)
  return cost
