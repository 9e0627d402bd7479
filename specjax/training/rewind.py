"""A resumed run's logs rewound to the step it resumes from.

A run killed at step 740 with its last checkpoint at 500 has logged steps 501..740; resumed, it
logs them again. `rewind_logs(workdir, step)` first drops from `<workdir>/metrics.jsonl` and the
TensorBoard events files under `<workdir>/tb` every record the resumed run will write again
(steps after `step`; everything when it starts from 0, whose step-0 validation reruns), and a
line or record cut short by the kill, so each step appears once. Each file is rewritten
atomically (`atomic_io`): the old content or the rewound one, never a mix.

Events files keep their TFRecord framing: the records kept are copied byte for byte (their
checksums included); an event's step is read from its protobuf (tensorboardX's `event_pb2`).
"""

from __future__ import annotations

import json
import os
from typing import Optional, Tuple

from absl import logging

from specjax import atomic_io

__all__ = ["rewind_logs", "rewind_metrics", "rewind_events"]


def _drops(step: int, resumed: int) -> bool:
  """Whether a record at `step` is one the run resumed at `resumed` writes again."""
  return step > resumed or resumed == 0


def rewind_metrics(path: str, resumed: int) -> int:
  """Drops the records of the JSONL log `path` that a run resumed at step `resumed` writes
  again (and unparseable lines); returns how many were dropped."""
  p = atomic_io.as_path(path)
  if not p.exists():
    return 0
  text = p.read_text(encoding="utf-8")
  kept, dropped = [], 0
  for line in text.splitlines():
    if not line.strip():
      continue
    try:
      rec = json.loads(line)
    except ValueError:  # a line cut short by a kill
      dropped += 1
      continue
    step = rec.get("step") if isinstance(rec, dict) else None
    if isinstance(step, int) and _drops(step, resumed):
      dropped += 1
    else:
      kept.append(line + "\n")
  if dropped or (text and not text.endswith("\n")):
    atomic_io.atomic_write_text(path, "".join(kept))
  return dropped


def _event_step(event_pb2, payload: bytes) -> Optional[int]:
  """The step of a serialized summary event, -1 for other events, None for an unreadable one."""
  try:
    event = event_pb2.Event.FromString(payload)
  except Exception:  # pylint: disable=broad-except  (protobuf's DecodeError)
    return None
  # The file-version record (no summary) is kept at any step.
  return int(event.step) if event.HasField("summary") else -1


def _rewind_events_file(event_pb2, path: str, resumed: int) -> Tuple[int, bytes]:
  with open(path, "rb") as f:
    data = f.read()
  out, pos, dropped = bytearray(), 0, 0
  while pos + 12 <= len(data):  # TFRecord: u64 length, u32 crc, payload, u32 crc
    n = int.from_bytes(data[pos:pos + 8], "little")
    end = pos + 12 + n + 4
    if end > len(data):
      break
    step = _event_step(event_pb2, data[pos + 12:pos + 12 + n])
    if step == -1 or (step is not None and not _drops(step, resumed)):
      out += data[pos:end]
    else:
      dropped += 1
    pos = end
  if pos < len(data):  # a record cut short by a kill
    dropped += 1
  return dropped, bytes(out)


def rewind_events(tb_dir: str, resumed: int) -> int:
  """Drops from each TensorBoard events file in `tb_dir` the events with a step a run resumed
  at `resumed` writes again (and a trailing partial record); returns how many were dropped.
  Local directories only (`ScalarWriter` writes none elsewhere)."""
  if not atomic_io.is_local(tb_dir) or not os.path.isdir(tb_dir):
    return 0
  try:
    from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  except ImportError:
    logging.warning("%s not rewound: tensorboardX is not installed", tb_dir)
    return 0
  total = 0
  for name in sorted(os.listdir(tb_dir)):
    if not name.startswith("events.out.tfevents"):
      continue
    path = os.path.join(tb_dir, name)
    dropped, data = _rewind_events_file(event_pb2, path, resumed)
    if dropped:
      atomic_io.atomic_write_bytes(path, data)
      total += dropped
  return total


def rewind_logs(workdir: str, resumed: int) -> None:
  """`rewind_metrics` on `<workdir>/metrics.jsonl` and `rewind_events` on `<workdir>/tb`
  (main process only: the others write neither)."""
  m = rewind_metrics(f"{workdir}/metrics.jsonl", resumed)
  e = rewind_events(os.path.join(workdir, "tb"), resumed)
  if m or e:
    logging.info("resuming at step %d: dropped %d metrics.jsonl line(s) and %d TensorBoard "
                 "event(s) after it (they are logged again)", resumed, m, e)
