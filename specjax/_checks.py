"""Argument checks shared by every entry point of specjax: one rule everywhere.

A value of the wrong type is a `TypeError`, one of the right type outside its range a
`ValueError`; both name the argument, the value and what is allowed. `bool` is not an integer
here (`True` is no batch size); numpy scalars are accepted. Array-valued arguments (theory's
closed forms broadcast them) go through `check_real_array` / `check_int_array`, whose messages
name the first bad entry.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["check_int", "check_optional_int", "check_real", "check_optional_real",
           "check_probability", "check_real_array", "check_int_array", "first_bad",
           "check_bool", "is_concrete", "check_prompts", "check_token_ids", "INT32_MAX",
           "format_bytes", "memory_stats_of", "free_memory_bytes", "check_memory",
           "MEMORY_LIMIT_ENV"]

INT32_MAX = 2**31 - 1  # token ids, positions and lengths are int32 on the device


def _num(x) -> str:
  return str(x) if isinstance(x, numbers.Integral) else f"{x:g}"


def _range_text(minimum, maximum, lo_open=False, hi_open=False) -> str:
  """"in [a, b)", ">= a", "< b" or "" (no bound)."""
  if minimum == -math.inf and maximum == math.inf:
    return ""
  if maximum == math.inf:
    return f"> {_num(minimum)}" if lo_open else f">= {_num(minimum)}"
  if minimum == -math.inf:
    return f"< {_num(maximum)}" if hi_open else f"<= {_num(maximum)}"
  return (f"in {'(' if lo_open else '['}{_num(minimum)}, {_num(maximum)}"
          f"{')' if hi_open else ']'}")


def _with_range(what: str, *bounds, **open_ends) -> str:
  text = _range_text(*bounds, **open_ends)
  return f"{what} {text}" if text else what


def check_int(name: str, value: Any, minimum: Optional[int] = None,
              maximum: Optional[int] = None, *, note: str = "") -> int:
  """`value` as an int in [minimum, maximum] (either bound may be None); `note` (e.g. " (0
  disables)") follows the allowed range in the messages."""
  allowed = _with_range("an int", -math.inf if minimum is None else minimum,
                        math.inf if maximum is None else maximum) + note
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
    raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})")
  if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
    raise ValueError(f"{name} must be {allowed}, got {value!r}")
  return int(value)


def check_optional_int(name: str, value: Any, minimum: Optional[int] = None,
                       maximum: Optional[int] = None, **kw) -> Optional[int]:
  """None, or `check_int`."""
  return None if value is None else check_int(name, value, minimum, maximum, **kw)


def check_real(name: str, value: Any, minimum: float = -math.inf, maximum: float = math.inf, *,
               lo_open: bool = False, hi_open: bool = False, allow_nan: bool = False,
               note: str = "", what: str = "a finite number") -> float:
  """`value` as a finite float in [minimum, maximum] (`lo_open` / `hi_open`: the bound excluded;
  `allow_nan`: NaN passes, meaning "unknown"). `note` follows the allowed range in the messages;
  `what` names the value in the ValueError ("a finite number")."""
  ends = dict(lo_open=lo_open, hi_open=hi_open)
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
    raise TypeError(f"{name} must be {_with_range('a real number', minimum, maximum, **ends)}"
                    f"{note}, got {value!r} ({type(value).__name__})")
  v = float(value)
  if allow_nan and math.isnan(v):
    return v
  ok = (math.isfinite(v) and (v > minimum if lo_open else v >= minimum)
        and (v < maximum if hi_open else v <= maximum))
  if not ok:
    raise ValueError(f"{name} must be {_with_range(what, minimum, maximum, **ends)}{note}, "
                     f"got {value!r}")
  return v


def check_optional_real(name: str, value: Any, minimum: float = -math.inf,
                        maximum: float = math.inf, **kw) -> Optional[float]:
  """None, or `check_real`."""
  return None if value is None else check_real(name, value, minimum, maximum, **kw)


def check_probability(name: str, value: Any, *, lo_open: bool = False, hi_open: bool = False,
                      note: str = "") -> float:
  """`value` as a float in [0, 1] (`lo_open` / `hi_open`: 0 / 1 excluded), with "must be a
  probability in ..." messages."""
  return check_real(name, value, 0.0, 1.0, lo_open=lo_open, hi_open=hi_open, note=note,
                    what="a probability")


def first_bad(arr: np.ndarray, bad: np.ndarray) -> str:
  """For a message: `arr`'s first entry where `bad` holds (value; index and count if an array)."""
  if arr.ndim == 0:
    return repr(arr.item())
  count = int(np.count_nonzero(bad))
  index = tuple(int(i) for i in np.argwhere(bad)[0])
  return f"{arr[index].item()!r} at index {index} ({count} invalid entries)"


def _array_of(name: str, value: Any, kinds: str, what: str, dtypes: str) -> np.ndarray:
  """`value` as a numpy array of a dtype kind in `kinds`; named errors for a string, a ragged
  nesting or another dtype (bool included)."""
  if isinstance(value, (str, bytes)):
    raise TypeError(f"{name} must be {what} or an array-like of them, got the string {value!r}")
  try:
    arr = np.asarray(value)
  except (ValueError, TypeError) as e:
    raise ValueError(f"{name} must be {what} or a rectangular array-like of them, got "
                     f"{value!r} ({e})") from None
  if arr.dtype.kind not in kinds:
    raise TypeError(f"{name} must be {what} or an array-like of them ({dtypes}), got "
                    f"{value!r} with dtype {arr.dtype}")
  return arr


def check_real_array(name: str, value: Any, minimum: float = -math.inf,
                     maximum: float = math.inf, *, lo_open: bool = False,
                     hi_open: bool = False) -> np.ndarray:
  """`value` (a real number or array-like of them) as a float64 array of finite entries in
  [minimum, maximum] (`lo_open` / `hi_open`: the bound excluded); errors name the first bad one."""
  arr = _array_of(name, value, "iuf", "a real number", "int or float dtype").astype(np.float64)
  bad = ~np.isfinite(arr)
  if bad.any():
    raise ValueError(f"{name} must be finite, got {first_bad(arr, bad)}")
  bad = ((arr <= minimum if lo_open else arr < minimum)
         | (arr >= maximum if hi_open else arr > maximum))
  if bad.any():
    text = _range_text(minimum, maximum, lo_open, hi_open)
    raise ValueError(f"{name} must {'lie' if text.startswith('in') else 'be'} {text}, got "
                     f"{first_bad(arr, bad)}")
  return arr


def check_int_array(name: str, value: Any, minimum: int = 0) -> np.ndarray:
  """`value` (an integer or array-like of them; not bool) as an int64 array of entries >=
  `minimum`; the ValueError names the first bad entry."""
  if isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be an integer >= {minimum}, got the bool {value!r}")
  arr = _array_of(name, value, "iu", f"an integer >= {minimum}", "integer dtype").astype(np.int64)
  bad = arr < minimum
  if bad.any():
    raise ValueError(f"{name} must be an integer >= {minimum}, got {first_bad(arr, bad)}")
  return arr


def check_bool(name: str, value: Any) -> bool:
  """`value` as a bool (True / False only, numpy's included)."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
  return bool(value)


def is_concrete(x: Any) -> bool:
  """Whether `x`'s values can be read on this host for a check: not a tracer, nor a global array
  spanning other processes' devices (multi-host: such checks are skipped)."""
  return (not isinstance(x, jax.core.Tracer)
          and getattr(x, "is_fully_addressable", True))


def _as_array(name: str, value: Any) -> np.ndarray:
  """`value` as a numpy array; a named ValueError for ragged nested lists."""
  try:
    return np.asarray(value)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{name} must be an array (or nested lists of one shape), got a "
                     f"{type(value).__name__} that is not one: {e}") from None


def check_prompts(prompts: Any, prompt_lengths: Any = None,
                  vocab_size: Optional[int] = None) -> Tuple[jax.Array, jax.Array]:
  """Right-padded prompts `[B, P]` of integer ids and their lengths `[B]` in [1, P] (default: all
  P), as int32 arrays; named errors otherwise. With `vocab_size`, the ids within the lengths must
  lie in [0, vocab_size) (`check_token_ids`)."""
  if not hasattr(prompts, "shape") or not hasattr(prompts, "dtype"):
    prompts = _as_array("prompts", prompts)
  if prompts.ndim != 2:
    raise ValueError(f"prompts must be 2-D [batch, prompt_len], got shape {tuple(prompts.shape)}")
  if not jnp.issubdtype(prompts.dtype, jnp.integer):
    raise TypeError(f"prompts must hold integer token ids, got dtype {prompts.dtype}")
  b, p = prompts.shape
  if b < 1 or p < 1:
    raise ValueError(f"prompts must have batch >= 1 and length >= 1, got shape {(b, p)}")
  if prompt_lengths is None:
    prompt_lengths = np.full((b,), p, np.int32)
  if not hasattr(prompt_lengths, "shape"):
    prompt_lengths = _as_array("prompt_lengths", prompt_lengths)
  if prompt_lengths.ndim != 1 or prompt_lengths.shape[0] != b:
    raise ValueError(
        f"prompt_lengths must have shape [batch] = ({b},) to match prompts {(b, p)}, "
        f"got {tuple(prompt_lengths.shape)}")
  if not jnp.issubdtype(prompt_lengths.dtype, jnp.integer):
    raise TypeError(f"prompt_lengths must be integers, got dtype {prompt_lengths.dtype}")
  if is_concrete(prompt_lengths):
    lens = np.asarray(prompt_lengths)
    bad = np.nonzero((lens < 1) | (lens > p))[0]
    if bad.size:
      raise ValueError(
          f"prompt_lengths must lie in [1, {p}] (the padded prompt length); row {bad[0]} "
          f"has {lens[bad[0]]} ({bad.size} rows out of range)")
  if vocab_size is not None:
    check_token_ids("prompts", prompts, prompt_lengths, vocab_size)
  return jnp.asarray(prompts, jnp.int32), jnp.asarray(prompt_lengths, jnp.int32)


@jax.jit
def first_invalid_token(tokens_BP, lengths_B, vocab_size):
  """(row, position, id) of the first id outside [0, vocab_size) within the rows' lengths, row
  -1 if none: a reduction on the device."""
  b, p = tokens_BP.shape
  bad_BP = (((tokens_BP < 0) | (tokens_BP >= vocab_size))
            & (jnp.arange(p)[None] < lengths_B[:, None]))
  flat = jnp.argmax(bad_BP.reshape(-1))
  row, pos = flat // p, flat % p
  found = jnp.any(bad_BP)
  return (jnp.where(found, row, -1), pos, tokens_BP[row, pos],
          jnp.sum(bad_BP, dtype=jnp.int32))


def _cheap_to_read(tokens, lengths) -> bool:
  """Small arrays on the host's CPU: read them rather than dispatch a reduction and wait."""
  for a in (tokens, lengths):
    if isinstance(a, jax.Array) and (a.size > 65536 or not a.is_fully_addressable
                                     or len(a.devices()) != 1
                                     or next(iter(a.devices())).platform != "cpu"):
      return False
  return True


def check_token_ids(name: str, tokens: Any, lengths: Any, vocab_size: int) -> None:
  """ValueError naming the row, position and id of the first token of `tokens` `[B, P]` (the
  first `lengths[b]` of row b; padding is not read) outside [0, vocab_size): an embedding lookup
  would clamp it silently. Host tokens are checked on the host (an int64 id would wrap to int32
  on the device); device tokens by one jitted reduction whose three scalars are read back.
  Tracers (inside an outer `jit`) and multi-host global arrays are not checked."""
  if not (is_concrete(tokens) and is_concrete(lengths)):
    return
  if isinstance(tokens, jax.Array) and not _cheap_to_read(tokens, lengths):
    row, pos, tok, count = (int(v) for v in jax.device_get(
        first_invalid_token(jnp.asarray(tokens), jnp.asarray(lengths), vocab_size)))
  else:
    t = np.asarray(tokens)
    bad = ((t < 0) | (t >= vocab_size)) & (np.arange(t.shape[1])[None]
                                           < np.asarray(lengths)[:, None])
    count = int(bad.sum())
    row, pos = (int(i) for i in np.unravel_index(np.argmax(bad), bad.shape)) if count else (-1, 0)
    tok = int(t[row, pos]) if count else 0
  if row >= 0:
    raise ValueError(
        f"{name} must hold token ids in [0, {vocab_size}) (the model's vocabulary); row {row} "
        f"position {pos} holds {tok} ({count} ids out of range)")


# ---------------------------------------------------------------- memory before allocation

MEMORY_LIMIT_ENV = "SPECJAX_MEMORY_LIMIT_BYTES"
# Below this a call's buffers are not compared with the free memory (no query per small call),
# unless a limit is stated (`MEMORY_LIMIT_ENV`).
_SMALL_BYTES = 64 * 2**20


def format_bytes(n: float) -> str:
  """`n` bytes in decimal units: "512 B", "3.1 KB", "34.2 GB"."""
  for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
    if abs(n) >= size:
      return f"{n / size:.1f} {unit}"
  return f"{int(n)} B"


def memory_stats_of(device: Any) -> Optional[dict]:
  """`device.memory_stats()`, or None where the backend offers none (XLA:CPU) or fails."""
  try:
    stats = device.memory_stats()
  except Exception:  # noqa: BLE001 - backends without stats raise various errors
    return None
  return stats or None


def _host_available_bytes() -> Optional[int]:
  """The host's available memory (Linux `MemAvailable`, else free pages), or None."""
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  try:
    return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
  except (AttributeError, OSError, ValueError):
    return None


def free_memory_bytes(device: Any) -> Tuple[Optional[int], str]:
  """(bytes free, what they are) on `device`: its allocator's `bytes_limit - bytes_in_use`
  (GPU, TPU), the host's available memory for XLA:CPU, or (None, "") where neither is known."""
  stats = memory_stats_of(device)
  if stats and stats.get("bytes_limit"):
    free = int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    return max(free, 0), f"free on {device.platform} device {device.id}"
  if getattr(device, "platform", None) == "cpu":
    avail = _host_available_bytes()
    if avail is not None:
      return avail, "the host's available memory, XLA:CPU"
  return None, ""


def _stated_limit() -> Optional[int]:
  raw = os.environ.get(MEMORY_LIMIT_ENV)
  if raw is None or not raw.strip():
    return None
  try:
    value = int(float(raw))
  except ValueError:
    raise ValueError(f"{MEMORY_LIMIT_ENV} must be a number of bytes >= 1, got {raw!r}") from None
  return check_int(MEMORY_LIMIT_ENV, value, 1)


def check_memory(what: str, parts: Sequence[Tuple[str, int]], devices: Sequence[Any],
                 advice: str) -> None:
  """ValueError naming every part and its bytes when the buffers `parts` ((description,
  bytes) pairs) that `what` is about to allocate, split evenly over `devices` (a lower bound of
  any layout), exceed the memory they can use: the limit stated in `SPECJAX_MEMORY_LIMIT_BYTES`,
  else each device's free memory (CPU devices share the host's, so they are compared
  together). Where nothing is known about the memory, nothing is checked. `advice` ends the
  message (what to lower)."""
  total = sum(int(n) for _, n in parts)
  limit = _stated_limit()
  if limit is None and total < _SMALL_BYTES:
    return
  devices = list(devices)
  n = max(len(devices), 1)
  if limit is not None:
    need, capacity, where = total, limit, f"the stated limit, {MEMORY_LIMIT_ENV}"
  elif devices and all(getattr(d, "platform", None) == "cpu" for d in devices):
    need = total
    capacity, where = free_memory_bytes(devices[0])
  else:
    need = -(-total // n)
    known = [free for free, _ in map(free_memory_bytes, devices) if free is not None]
    if not known:
      return
    capacity = min(known)
    where = (f"free on the emptiest of its {n} devices" if n > 1
             else free_memory_bytes(devices[0])[1])
  if capacity is None or need <= capacity:
    return
  shown = "; ".join(f"{name} {format_bytes(b)}" for name, b in parts if b)
  per = f" ({format_bytes(need)} per device over {n} devices)" if need != total else ""
  raise ValueError(
      f"{what} needs {format_bytes(total)} for its caches and buffers ({shown}){per}, more "
      f"than the {format_bytes(capacity)} available ({where}): refused before allocating. "
      f"{advice}")
