"""Token ids handed to the tokenizers, checked before anything is decoded.

`read_ids` turns the `ids` of a ``decode`` call into Python ints, `token_rows` the
``tokens [B, N]`` / ``lengths [B]`` of a ``decode_batch`` call into checked numpy arrays. Both
refuse, by name, what would otherwise be misread or fail inside numpy or the tokenizer library:

* a wrong kind of value (None, a string, a float or a bool where an id is expected, an
  unordered container): a `TypeError` naming the argument, the position and the value;
* a wrong structure (ragged nested lists, a batch where one sequence is expected) or an id
  outside ``[0, vocab_size)``: a `ValueError` naming the argument, the position, the value and
  the allowed range.

Accepted ids: Python ints, numpy / jax integer scalars and arrays (any integer dtype, int64 and
uint64 included), and sequences or iterables of them. Floats are refused even when they hold a
whole number (``3.0``): a float array of ids is the output of some computation that was not
meant to produce ids, and truncating it would decode the wrong text.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Set
from typing import Any

import numpy as np

__all__ = ["read_ids", "read_id", "token_rows", "text_list"]

_IDS_WHAT = "a sequence of integer token ids"


def _describe(value: Any) -> str:
  """`value` for a message: its repr (clipped) and its type."""
  text = repr(value)
  if len(text) > 80:
    text = text[:77] + "..."
  return f"{text} ({type(value).__name__})"


def _allowed(vocab_size: int) -> str:
  return f"an integer in [0, {vocab_size})"


def _is_array(value: Any) -> bool:
  """Whether `value` is an array with a dtype (numpy, jax, or anything numpy converts)."""
  return hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "__array__")


def _scalar_id(name: str, value: Any, vocab_size: int) -> int | None:
  """`value` as an int when it is one integer (Python or a 0-d numpy / jax integer); None when it
  is a container; a TypeError naming `name` for any other scalar (bool, float, None, a string)."""
  if isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be {_allowed(vocab_size)}, got the bool {value!r}")
  if isinstance(value, numbers.Integral):
    return int(value)
  if _is_array(value) and tuple(value.shape) == ():
    kind = np.dtype(value.dtype).kind
    if kind in "iu":
      return int(value)
    raise TypeError(f"{name} must be {_allowed(vocab_size)}, got {_describe(value)} with dtype "
                    f"{np.dtype(value.dtype)}")
  if _is_array(value) or isinstance(value, (list, tuple, range)):
    return None
  raise TypeError(f"{name} must be {_allowed(vocab_size)}, got {_describe(value)}")


def _flat_ids(name: str, ids: Any, vocab_size: int) -> list[int]:
  """Every id of `ids` (one sequence, or one integer) as a Python int, types and structure
  checked; ranges are not (the caller checks those it reads)."""
  if ids is None or isinstance(ids, (str, bytes, bytearray)):
    raise TypeError(f"{name} must be {_IDS_WHAT} (a list or an integer array), got "
                    f"{_describe(ids)}")
  if isinstance(ids, (Set, Mapping)):
    raise TypeError(f"{name} must be {_IDS_WHAT} in order (a list or an integer array), got an "
                    f"unordered {type(ids).__name__}")
  if _is_array(ids):
    arr = np.asarray(ids)
    if arr.ndim == 0:
      return [_scalar_id(name, ids, vocab_size)]
    if arr.ndim != 1:
      raise ValueError(f"{name} must be one sequence of token ids (1-D), got an array of shape "
                       f"{arr.shape}; decode a batch [B, N] with decode_batch")
    kind = arr.dtype.kind
    if kind in "iu":
      return arr.tolist()
    if kind != "O":
      first = _describe(arr[0].item()) if arr.size else "none"
      raise TypeError(f"{name} must hold integer token ids, got an array of dtype {arr.dtype} "
                      f"(first entry {first})")
    ids = arr.tolist()
  elif not isinstance(ids, (list, tuple, range)):
    if not isinstance(ids, Iterable):
      return [_scalar_id(name, ids, vocab_size)]  # one integer, or a named TypeError
    ids = list(ids)  # any other iterable (a generator, a deque, ...)
  out = []
  for i, x in enumerate(ids):
    value = _scalar_id(f"{name}[{i}]", x, vocab_size)
    if value is None:
      raise ValueError(f"{name} must be one flat sequence of token ids, got a nested "
                       f"{type(x).__name__} at {name}[{i}] (ragged lists, or a batch: decode a "
                       "batch [B, N] with decode_batch)")
    out.append(value)
  return out


def read_ids(ids: Any, *, vocab_size: int, stop_id: int | None, skip_id: int | None,
             source: str, name: str = "ids") -> list[int]:
  """The ids of `ids` that a decode reads: those before the first `stop_id` (EOS), without
  `skip_id` (padding).

  Every entry's type is checked; the range ``[0, vocab_size)`` is checked for the entries read
  (those after the first EOS are never read, as the decode docstrings say).

  Raises:
    TypeError: `ids` is None, a string, an unordered container, or holds a non-integer (float,
      bool, None, a string); the message names the position.
    ValueError: `ids` is nested (ragged, or a batch), or an id before the first EOS lies
      outside ``[0, vocab_size)`` (naming its position, its value and `source`).
  """
  flat = _flat_ids(name, ids, vocab_size)
  kept = []
  for i, value in enumerate(flat):
    if value == stop_id:
      break
    if not 0 <= value < vocab_size:
      raise ValueError(f"{name}[{i}]: token id {value} is outside the vocabulary "
                       f"[0, {vocab_size}) of {source}")
    if value != skip_id:
      kept.append(value)
  return kept


def read_id(name: str, value: Any, vocab_size: int, source: str) -> int:
  """`value` as one token id in ``[0, vocab_size)`` (a Python int, or a numpy / jax integer
  scalar); a TypeError (not an integer) or ValueError (out of range) naming `name` otherwise."""
  if _is_array(value) and tuple(value.shape) != ():
    raise TypeError(f"{name} must be {_allowed(vocab_size)} (one id), got an array of shape "
                    f"{tuple(value.shape)}")
  one = _scalar_id(name, value, vocab_size)
  if one is None:
    raise TypeError(f"{name} must be {_allowed(vocab_size)} (one id), got {_describe(value)}")
  if not 0 <= one < vocab_size:
    raise ValueError(f"{name} must be {_allowed(vocab_size)} (the vocabulary of {source}), "
                     f"got {one}")
  return one


def text_list(texts: Any) -> list[str]:
  """`texts` (a sequence or iterable of strings) as a list; a TypeError naming the argument or
  the row otherwise."""
  if texts is None or isinstance(texts, (str, bytes, bytearray)) or not isinstance(
      texts, Iterable):
    raise TypeError(f"texts must be a sequence of strings, got {_describe(texts)}")
  texts = list(texts)
  for row, text in enumerate(texts):
    if not isinstance(text, str):
      raise TypeError(f"texts[{row}] must be a str, got {_describe(text)}")
  return texts


def _int_array(name: str, value: Any, what: str) -> np.ndarray:
  """`value` as a numpy array of an integer dtype (named errors for ragged nestings, strings,
  None, bools and floats); object arrays of Python ints are accepted as they are."""
  if value is None or isinstance(value, (str, bytes, bytearray)):
    raise TypeError(f"{name} must be {what}, got {_describe(value)}")
  try:
    arr = np.asarray(value)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{name} must be {what} (nested lists of one shape), got a ragged "
                     f"{type(value).__name__}: {e}") from None
  if arr.dtype.kind == "O":
    for index, x in np.ndenumerate(arr):
      if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be {what}, got {_describe(x)} at index {index}")
  elif arr.dtype.kind not in "iu":
    raise TypeError(f"{name} must be {what}, got an array of dtype {arr.dtype}")
  return arr


def token_rows(tokens_bn: Any, lengths_b: Any = None) -> tuple[np.ndarray, np.ndarray]:
  """`tokens [B, N]` (integer ids) and `lengths [B]` (integers in [0, N]; default: N per row) as
  checked numpy arrays.

  Raises:
    TypeError: either holds something other than integers (floats, bools, None, strings).
    ValueError: a ragged nesting, a shape other than ``[B, N]`` / ``[B]``, or a length outside
      ``[0, N]`` (naming the row).
  """
  tokens_bn = _int_array("tokens", tokens_bn, "integer token ids of shape [B, N]")
  if tokens_bn.ndim != 2:
    raise ValueError(f"tokens must have shape [B, N], got {tokens_bn.shape}")
  b, n = tokens_bn.shape
  if lengths_b is None:
    lengths_b = np.full((b,), n)
  lengths_b = _int_array("lengths", lengths_b, f"integers in [0, {n}] of shape [{b}]")
  if lengths_b.shape != (b,):
    raise ValueError(f"lengths must have shape [{b}], got {lengths_b.shape}")
  bad = [i for i, x in enumerate(lengths_b.tolist()) if not 0 <= x <= n]
  if bad:
    raise ValueError(f"lengths must lie in [0, {n}] (the row length of tokens), got "
                     f"lengths[{bad[0]}] = {lengths_b.tolist()[bad[0]]} ({len(bad)} invalid "
                     "entries)")
  return tokens_bn, lengths_b
