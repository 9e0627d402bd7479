"""Choosing a decoder's compute path for the machine it runs on.

`DecoderConfig.matvec_max_rows` decides how a call on N = B * T tokens computes each
projection: for 1 < N <= it, one matrix-vector product per token; otherwise one matrix-matrix
product. Which is faster depends on the CPU, so measure:

  choice = specjax.tune_matvec_rows(lm, params)
  lm = choice.apply(lm)                              # same weights, same params

The choice is also stored for this machine (`models.matvec_cache`: keyed by the CPU, the JAX
version, the model's shape and the parameter layout), so later processes decode that shape on
the tuned path with `matvec_max_rows=None` (the default; without a stored choice, one
matrix-matrix product per call).

The measurement is the in-graph cost of one call on N tokens at batch 1
(`measure.timing.step_times_side_by_side`, both paths interleaved call by call). The threshold
is the largest N such that the per-token products beat one matrix-matrix product by more than
`margin` at every measured row count up to it (0: never). Only how calls compute changes (the
same values up to float rounding; a compute-only field, so checkpoints restore across values).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Callable, Dict, Mapping, Optional, Sequence

from specjax.measure.timing import floor_step_seconds, step_times_side_by_side
from specjax.models import decoder_layout, matvec_cache
from specjax.models.decoder import DecoderLM, matvec_rows

__all__ = ["MatvecChoice", "tune_matvec_rows", "choose_matvec_rows"]

DEFAULT_ROW_COUNTS = (2, 3, 4, 5, 8)


@dataclasses.dataclass(frozen=True)
class MatvecChoice:
  """The outcome of `tune_matvec_rows`.

  Attributes:
    rows: the chosen `matvec_max_rows` (0: always one matrix-matrix product).
    speedups: per measured row count N, the median paired ratio (matrix-matrix time /
      per-token time): > 1 means the per-token products were faster.
    per_token_ms, matmul_ms: per N, the median milliseconds per call.
    default_rows: what the config's own setting resolved to (for reports).
    stored_at: the file the choice was stored in ("" when not stored).
  """

  rows: int
  speedups: Mapping[int, float]
  per_token_ms: Mapping[int, float]
  matmul_ms: Mapping[int, float]
  default_rows: int
  stored_at: str = ""

  def apply(self, model: DecoderLM) -> DecoderLM:
    """`model` with `matvec_max_rows` set to the choice (same params)."""
    _check_model(model)
    return DecoderLM(model.config.replace(matvec_max_rows=self.rows))

  def to_dict(self) -> Dict[str, object]:
    """JSON-able (row counts as string keys)."""
    return {"rows": self.rows, "default_rows": self.default_rows, "stored_at": self.stored_at,
            "speedups": {str(k): v for k, v in self.speedups.items()},
            "per_token_ms": {str(k): v for k, v in self.per_token_ms.items()},
            "matmul_ms": {str(k): v for k, v in self.matmul_ms.items()}}


def _check_margin(margin) -> None:
  if not margin > 0:
    raise ValueError(f"margin must be > 0, got {margin!r}")


def choose_matvec_rows(speedups: Mapping[int, float], margin: float = 1.0) -> int:
  """The largest row count N of `speedups` such that every measured count up to N has a
  speedup (matrix-matrix / per-token time) above `margin`; 0 when the smallest does not. A
  threshold never extends past a measurement."""
  if not speedups:
    raise ValueError(f"speedups must hold at least one row count, got {dict(speedups)!r}")
  _check_margin(margin)
  rows = 0
  for n in sorted(speedups):
    if not speedups[n] > margin:  # NaN (an unmeasurable cell) stops it too
      break
    rows = n
  return rows


def _check_model(model) -> None:
  if not isinstance(model, DecoderLM):
    raise TypeError(f"model must be a specjax DecoderLM (matvec_max_rows is a decoder "
                    f"option), got {type(model).__name__}")


def tune_matvec_rows(model: DecoderLM, params, row_counts: Sequence[int] = DEFAULT_ROW_COUNTS,
                     prompt_len: int = 64, cache_len: Optional[int] = None, steps: int = 16,
                     repeats: int = 7, margin: float = 1.0,
                     log: Optional[Callable[[str], None]] = None,
                     save: bool = True) -> MatvecChoice:
  """Measures per-token products against one matrix-matrix product at each row count and
  returns the `MatvecChoice` (module doc). Compiles 2 * len(row_counts) step loops.

  Args:
    model: a `DecoderLM`; params: its parameters in the layout decoding will use (standard or
      packed: the choice can differ).
    row_counts: the N to measure, each an int >= 2 (N = 1 is a matrix-vector product either way).
    prompt_len: tokens already in the cache before each timed call; cache_len: its slots
      (default: prompt_len + max(row_counts)).
    steps, repeats: calls per timed loop, paired measurements per N.
    margin: the per-token path must be faster by more than this factor.
    log: called with one line per N (e.g. `print`, `logging.info`).
    save: store the choice where `matvec_max_rows=None` finds it (`models.matvec_cache`).
  """
  _check_model(model)
  _check_margin(margin)  # before a minute of measuring, not after
  counts = tuple(row_counts)
  if not counts or any(isinstance(n, bool) or not isinstance(n, int) or n < 2 for n in counts):
    raise ValueError(f"row_counts must be a non-empty sequence of ints >= 2, got "
                     f"{row_counts!r}")
  if len(set(counts)) != len(counts):
    raise ValueError(f"row_counts must not repeat a count, got {row_counts!r}")
  if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or prompt_len < 1:
    raise ValueError(f"prompt_len must be an int >= 1, got {prompt_len!r}")
  need = prompt_len + max(counts)
  cache_len = need if cache_len is None else cache_len
  if isinstance(cache_len, bool) or not isinstance(cache_len, int) or cache_len < need:
    raise ValueError(f"cache_len must be an int >= prompt_len + max(row_counts) = {need}, "
                     f"got {cache_len!r}")
  config = model.config
  speedups, per_token_ms, matmul_ms = {}, {}, {}
  for n in sorted(counts):
    models = {"per_token": DecoderLM(config.replace(matvec_max_rows=n)),
              "matmul": DecoderLM(config.replace(matvec_max_rows=0))}
    sec = step_times_side_by_side(models, params, 1, cache_len, prompt_len, n, steps=steps,
                                  repeats=repeats)
    # Calls too cheap to resolve read as the 0.1 µs floor, never as <= 0.
    per_token, matmul = ([floor_step_seconds([x]) for x in sec[k]] for k in ("per_token", "matmul"))
    speedups[n] = statistics.median(m / p for m, p in zip(matmul, per_token))
    per_token_ms[n] = 1e3 * statistics.median(per_token)
    matmul_ms[n] = 1e3 * statistics.median(matmul)
    if log:
      log(f"matvec tuning: N={n}: per-token {per_token_ms[n]:.3f} ms, matrix-matrix "
          f"{matmul_ms[n]:.3f} ms ({speedups[n]:.2f}x)")
  packed = decoder_layout.is_packed(params)
  default_rows = matvec_rows(config, packed)
  rows = choose_matvec_rows(speedups, margin)
  stored_at = matvec_cache.store(config, packed, rows) if save else ""
  if log and stored_at:
    log(f"matvec tuning: matvec_max_rows = {rows} stored in {stored_at}")
  return MatvecChoice(rows=rows, speedups=speedups, per_token_ms=per_token_ms,
                      matmul_ms=matmul_ms, default_rows=default_rows, stored_at=stored_at)
