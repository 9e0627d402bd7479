"""Deterministic, resumable batching of tokenized examples into fixed shapes.

An *example* is a pair of int32 token arrays, `Example(prompt, target)`:

  * seq2seq (T5): prompt = encoder inputs, target = decoder targets (both with EOS);
  * decoder-only "prompt + target": prompt = the conditioning text (no EOS), target = the
    continuation (with EOS); the loss covers the target only;
  * decoder-only documents: empty prompt, target = the document (with EOS); every predicted
    token is scored.

A *source* turns examples into fixed-shape rows; a `Mixture` of weighted sources turns rows into
batches. Batch `step` is a pure function of `(seed, step, batch_size)`, so a resumed run sees
exactly the batches an uninterrupted run sees:

  * one source: row r of step s is element n = s * B + r of the source's stream, in epoch
    e = n // N at position n % N of `np.random.default_rng((seed, 2, k, e)).permutation(N)`
    (k: the source's index in the mixture);
  * a mixture: each row draws its source from the weights (rows of steps [256 j, 256 j + 256)
    from `default_rng((seed, 1, j))`) and takes that source's next element ("number of earlier
    rows that drew this source"); per-block counts are cached, so any step costs O(step / 256).

Batch layouts (numpy, right-padded with the pad id 0):

  seq2seq:  inputs [B, P] int32, input_lengths [B] int32, decoder_inputs [B, T] int32 (0 =
            decoder start, then targets shifted right), targets [B, T] int32, loss_mask [B, T] f32.
  decoder:  tokens [B, T] int32 (the model input), targets [B, T] int32 (the next token),
            loss_mask [B, T] float32.

Overlong examples (policy `overlong`, counted in `source.stats`):

  * "truncate" (default). seq2seq: inputs are cut to P tokens, the last kept one replaced by EOS;
    targets are cut to T tokens *without* EOS (the true text goes on, so the model is not taught
    to stop there). decoder, padded: prompt + target must fit T + 1 tokens; the prompt is cut from
    the left (its end, "... Summary:", is kept) down to one token, then the target at the end (no
    EOS). A document keeps its first T + 1 tokens.
  * "drop": examples that would be truncated are removed at construction.

Packed decoder sources (`LMSource(packing=True)`) concatenate the epoch's shuffled examples into
one stream cut into windows of T + 1 tokens with stride T (every token but the first predicted
once per epoch), then shuffle the windows; nothing is truncated or dropped. No segment masks (a
token attends to earlier examples in its window, GPT-2-style); the loss mask is carried along,
so prompts stay unscored.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import numpy as np
from specjax._checks import check_int, check_real_array

__all__ = [
    "PAD_ID", "EOS_ID", "Example", "SourceStats", "Source", "Seq2SeqSource", "LMSource",
    "Mixture", "as_mixture", "eval_batches", "seq2seq_examples", "lm_examples",
    "synthetic_examples", "OVERLONG_POLICIES", "Batch",
]

PAD_ID = 0
EOS_ID = 1
OVERLONG_POLICIES = ("truncate", "drop")
_MIX_BLOCK = 256

Batch = dict  # str -> np.ndarray


class Example(NamedTuple):
  """One tokenized example (see the module doc): int32 `prompt` and `target`."""
  prompt: np.ndarray
  target: np.ndarray


def _as_example(ex: Any, i: int) -> Example:
  if isinstance(ex, Mapping):
    ex = (ex["prompt"], ex["target"])
  if not isinstance(ex, (tuple, list)) or len(ex) != 2:
    raise TypeError(f"example {i} must be Example(prompt, target) or a (prompt, target) pair, "
                    f"got {type(ex).__name__}")
  prompt, target = (np.asarray(x) for x in ex)
  for name, arr in (("prompt", prompt), ("target", target)):
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
      raise TypeError(f"example {i}: {name} must be a 1-D integer array, got shape "
                      f"{arr.shape} dtype {arr.dtype}")
  return Example(prompt.astype(np.int32), target.astype(np.int32))


@dataclasses.dataclass
class SourceStats:
  """What a source did to its examples at construction.

  Attributes:
    examples, kept, dropped: examples given, kept in the source, removed by overlong="drop".
    truncated_prompts, truncated_targets: kept examples whose prompt / target was cut (a cut
      target has no EOS).
    tokens: real (prompt + target) tokens kept, after truncation.
  """
  examples: int = 0
  kept: int = 0
  truncated_prompts: int = 0
  truncated_targets: int = 0
  dropped: int = 0
  tokens: int = 0


class Source(abc.ABC):
  """Fixed-shape rows from examples. Subclasses set `num_items`, `row_spec`, `stats`.

  `row_spec` maps each batch key to (per-row shape, dtype); sources with equal specs can mix.
  """

  num_items: int
  row_spec: dict
  stats: SourceStats
  format: str

  @abc.abstractmethod
  def stream_rows(self, seed: int, source_index: int, positions: np.ndarray) -> Batch:
    """Rows at stream positions `positions` (shuffled order) → {key: [n, ...]}."""

  @abc.abstractmethod
  def fixed_rows(self, indices: np.ndarray) -> Batch:
    """Rows at unshuffled item indices (validation) → {key: [n, ...]}."""

  def empty_rows(self, n: int) -> Batch:
    """n padding rows (loss mask 0)."""
    return {k: np.zeros((n,) + shape, dtype) for k, (shape, dtype) in self.row_spec.items()}

  def batch(self, seed: int, step: int, batch_size: int) -> Batch:
    """Batch `step` of this source alone (see the module doc)."""
    return Mixture([(self, 1.0)]).batch(seed, step, batch_size)


def _stack(rows: Sequence[dict], spec: dict) -> Batch:
  return {k: np.stack([r[k] for r in rows]).astype(spec[k][1]) for k in spec}


class _EpochOrders:
  """Per-epoch permutations of N items, a pure function of (seed, k, epoch), cached."""

  def __init__(self, n: int):
    self.n = n
    self._cache: dict = {}

  def get(self, seed: int, k: int, epoch: int) -> np.ndarray:
    key = (seed, k, epoch)
    if key not in self._cache:
      if len(self._cache) >= 4:
        self._cache.pop(next(iter(self._cache)))
      self._cache[key] = np.random.default_rng((seed, 2, k, epoch)).permutation(self.n)
    return self._cache[key]


class _PaddedSource(Source):
  """Sources with one example per row."""

  _rows_of: Callable[[int], dict]

  def _finish_init(self):
    if not self.num_items:
      raise ValueError(f"no examples left in this {type(self).__name__} "
                       f"({self.stats.dropped} dropped as overlong of {self.stats.examples})")
    self._orders = _EpochOrders(self.num_items)

  def stream_rows(self, seed, source_index, positions):
    idx = []
    for n in np.asarray(positions).tolist():
      epoch, pos = divmod(n, self.num_items)
      idx.append(int(self._orders.get(seed, source_index, epoch)[pos]))
    return self.fixed_rows(np.asarray(idx, np.int64))

  def fixed_rows(self, indices):
    return _stack([self._row(int(i)) for i in indices], self.row_spec)


class Seq2SeqSource(_PaddedSource):
  """Encoder-decoder rows: inputs [P] + length, decoder inputs / targets / mask [T].

  Args:
    examples: `Example(prompt=encoder inputs, target=targets)`, both with EOS.
    input_len, target_len: P, T.
    overlong: "truncate" or "drop" (module doc).
    decoder_start_id: the first decoder input (T5: the pad id 0).
  """

  format = "seq2seq"

  def __init__(self, examples: Iterable[Any], input_len: int, target_len: int,
               overlong: str = "truncate", decoder_start_id: int = PAD_ID):
    self.input_len = check_int("input_len", input_len, 1)
    self.target_len = check_int("target_len", target_len, 1)
    if overlong not in OVERLONG_POLICIES:
      raise ValueError(f"overlong must be one of {OVERLONG_POLICIES}, got {overlong!r}")
    self.overlong = overlong
    self.decoder_start_id = decoder_start_id
    self.row_spec = {
        "inputs": ((self.input_len,), np.int32), "input_lengths": ((), np.int32),
        "decoder_inputs": ((self.target_len,), np.int32),
        "targets": ((self.target_len,), np.int32),
        "loss_mask": ((self.target_len,), np.float32)}
    self.stats = SourceStats()
    self._examples = []
    for i, ex in enumerate(examples):
      ex = _as_example(ex, i)
      self.stats.examples += 1
      if ex.prompt.size == 0:
        raise ValueError(f"example {i} has empty encoder inputs")
      cut_in = ex.prompt.size > self.input_len
      cut_tg = ex.target.size > self.target_len
      if (cut_in or cut_tg) and overlong == "drop":
        self.stats.dropped += 1
        continue
      prompt = ex.prompt[:self.input_len].copy()
      if cut_in:
        prompt[-1] = EOS_ID
      target = ex.target[:self.target_len]
      self.stats.truncated_prompts += int(cut_in)
      self.stats.truncated_targets += int(cut_tg)
      self.stats.tokens += prompt.size + target.size
      self._examples.append(Example(prompt, target))
    self.num_items = self.stats.kept = len(self._examples)
    self._finish_init()

  def _row(self, i: int) -> dict:
    prompt, target = self._examples[i]
    p, t = self.input_len, self.target_len
    inputs = np.zeros((p,), np.int32)
    inputs[:prompt.size] = prompt
    targets = np.zeros((t,), np.int32)
    targets[:target.size] = target
    decoder_inputs = np.zeros((t,), np.int32)
    decoder_inputs[0] = self.decoder_start_id
    decoder_inputs[1:target.size] = target[:-1]
    mask = np.zeros((t,), np.float32)
    mask[:target.size] = 1.0
    return {"inputs": inputs, "input_lengths": np.int32(prompt.size),
            "decoder_inputs": decoder_inputs, "targets": targets, "loss_mask": mask}


def _lm_spec(seq_len: int) -> dict:
  return {"tokens": ((seq_len,), np.int32), "targets": ((seq_len,), np.int32),
          "loss_mask": ((seq_len,), np.float32)}


class LMSource(_PaddedSource):
  """Decoder-only rows: tokens / targets / loss_mask [T], padded or packed.

  Args:
    examples: `Example(prompt, target)`; prompt empty for documents.
    seq_len: T, the model's input length (rows hold T + 1 tokens of text).
    packing: pack examples into windows instead of one example per row.
    overlong: "truncate" or "drop" (padded only; module doc).
  """

  format = "decoder"

  def __init__(self, examples: Iterable[Any], seq_len: int, packing: bool = False,
               overlong: str = "truncate"):
    self.seq_len = check_int("seq_len", seq_len, 1)
    if overlong not in OVERLONG_POLICIES:
      raise ValueError(f"overlong must be one of {OVERLONG_POLICIES}, got {overlong!r}")
    self.overlong = overlong
    self.packing = bool(packing)
    self.row_spec = _lm_spec(self.seq_len)
    self.stats = SourceStats()
    self._examples = []
    keep = self.seq_len + 1
    for i, ex in enumerate(examples):
      ex = _as_example(ex, i)
      self.stats.examples += 1
      if ex.prompt.size + ex.target.size == 0:
        raise ValueError(f"example {i} is empty")
      if not self.packing and ex.prompt.size + ex.target.size > keep:
        if overlong == "drop":
          self.stats.dropped += 1
          continue
        prompt, target = ex
        if target.size < keep:  # Cut the prompt from the left, keep the target.
          prompt = prompt[prompt.size - (keep - target.size):]
          self.stats.truncated_prompts += 1
        else:  # Keep the prompt's last token (if any), cut the target's tail.
          self.stats.truncated_prompts += int(prompt.size > 1)
          prompt = prompt[-1:]
          target = target[:keep - prompt.size]
          self.stats.truncated_targets += 1
        ex = Example(prompt, target)
      self.stats.tokens += ex.prompt.size + ex.target.size
      self._examples.append(ex)
    self.stats.kept = len(self._examples)
    if self.packing:
      self._init_packing()
    else:
      self.num_items = self.stats.kept
    self._finish_init()

  # Padded rows.
  def _row(self, i: int) -> dict:
    prompt, target = self._examples[i]
    seq = np.concatenate([prompt, target])
    scored = np.concatenate([np.zeros(prompt.size, np.float32), np.ones(target.size, np.float32)])
    return self._window(seq, scored)

  def _window(self, seq: np.ndarray, scored: np.ndarray) -> dict:
    t = self.seq_len
    n = seq.size - 1
    tokens = np.zeros((t,), np.int32)
    targets = np.zeros((t,), np.int32)
    mask = np.zeros((t,), np.float32)
    tokens[:n] = seq[:-1]
    targets[:n] = seq[1:]
    mask[:n] = scored[1:]
    return {"tokens": tokens, "targets": targets, "loss_mask": mask}

  # Packed rows.
  def _init_packing(self):
    lengths = np.array([e.prompt.size + e.target.size for e in self._examples], np.int64)
    self._total = int(lengths.sum())
    if self._total < self.seq_len + 1:
      raise ValueError(f"packing needs at least seq_len + 1 = {self.seq_len + 1} tokens, the "
                       f"examples hold {self._total}")
    self.num_items = (self._total - 1) // self.seq_len
    self._packed: dict = {}

  def _epoch_stream(self, seed: int, k: int, epoch: int):
    key = (seed, k, epoch)
    if key not in self._packed:
      if len(self._packed) >= 2:
        self._packed.pop(next(iter(self._packed)))
      if epoch < 0:  # The unshuffled order (validation).
        order, windows = np.arange(len(self._examples)), np.arange(self.num_items)
      else:
        rng = np.random.default_rng((seed, 2, k, epoch))
        order, windows = rng.permutation(len(self._examples)), rng.permutation(self.num_items)
      seq = np.concatenate([np.concatenate([self._examples[j].prompt, self._examples[j].target])
                            for j in order])
      scored = np.concatenate([np.concatenate([np.zeros(self._examples[j].prompt.size, np.float32),
                                               np.ones(self._examples[j].target.size, np.float32)])
                               for j in order])
      self._packed[key] = (seq, scored, windows)
    return self._packed[key]

  def _packed_rows(self, seed, k, epochs_positions) -> Batch:
    rows = []
    for epoch, pos in epochs_positions:
      seq, scored, windows = self._epoch_stream(seed, k, epoch)
      start = int(windows[pos]) * self.seq_len
      rows.append(self._window(seq[start:start + self.seq_len + 1],
                               scored[start:start + self.seq_len + 1]))
    return _stack(rows, self.row_spec)

  def stream_rows(self, seed, source_index, positions):
    if not self.packing:
      return super().stream_rows(seed, source_index, positions)
    return self._packed_rows(seed, source_index,
                             [divmod(int(n), self.num_items) for n in np.asarray(positions)])

  def fixed_rows(self, indices):
    if not self.packing:
      return super().fixed_rows(indices)
    return self._packed_rows(0, 0, [(-1, int(i)) for i in indices])


class Mixture:
  """Sources mixed with weights (normalised); see the module doc for the order.

  Args:
    sources: `[(source, weight), ...]` or a single `Source`, all with the same `row_spec`.
  """

  def __init__(self, sources: Sequence[tuple[Source, float]] | Source):
    if isinstance(sources, Source):
      sources = [(sources, 1.0)]
    sources = list(sources)
    if not sources:
      raise ValueError("a Mixture needs at least one source")
    for i, item in enumerate(sources):
      if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], Source)):
        raise TypeError(f"mixture entry {i} must be a (Source, weight) pair, got {item!r}")
    self.sources = [s for s, _ in sources]
    weights = check_real_array("mixture weights", [w for _, w in sources], 0.0, lo_open=True)
    self.weights = weights / weights.sum()
    spec = self.sources[0].row_spec
    for i, s in enumerate(self.sources[1:], 1):
      if s.row_spec != spec:
        raise ValueError(f"mixture source {i} has rows {s.row_spec}, source 0 has {spec}: "
                         "mix only sources of one format and length")
    self.row_spec = spec
    self.format = self.sources[0].format
    self._block_counts: dict = {}  # (seed, B, block) -> [K] rows per source in the block
    self._prefix: dict = {}  # (seed, B) -> list of cumulative counts at block starts

  def _choices(self, seed: int, batch_size: int, block: int) -> np.ndarray:
    rng = np.random.default_rng((seed, 1, block))
    return rng.choice(len(self.sources), size=(_MIX_BLOCK, batch_size), p=self.weights)

  def _counts_before_block(self, seed: int, batch_size: int, block: int) -> np.ndarray:
    prefix = self._prefix.setdefault((seed, batch_size), [np.zeros(len(self.sources), np.int64)])
    while len(prefix) <= block:
      j = len(prefix) - 1
      counts = np.bincount(self._choices(seed, batch_size, j).ravel(),
                           minlength=len(self.sources))
      prefix.append(prefix[-1] + counts)
    return prefix[block]

  def assignment(self, seed: int, step: int, batch_size: int):
    """(source of each row [B], stream position of each row [B]) at `step`."""
    seed = check_int("seed", seed, 0)
    step = check_int("step", step, 0)
    batch_size = check_int("batch_size", batch_size, 1)
    if len(self.sources) == 1:
      return (np.zeros(batch_size, np.int64),
              step * batch_size + np.arange(batch_size, dtype=np.int64))
    block, offset = divmod(step, _MIX_BLOCK)
    choices = self._choices(seed, batch_size, block)
    before = self._counts_before_block(seed, batch_size, block).copy()
    before += np.bincount(choices[:offset].ravel(), minlength=len(self.sources))
    row_src = choices[offset]
    positions = np.empty(batch_size, np.int64)
    for r, k in enumerate(row_src):
      positions[r] = before[k]
      before[k] += 1
    return row_src, positions

  def batch(self, seed: int, step: int, batch_size: int) -> Batch:
    """Batch `step`: a pure function of (seed, step, batch_size)."""
    row_src, positions = self.assignment(seed, step, batch_size)
    out = {k: np.zeros((batch_size,) + shape, dtype) for k, (shape, dtype) in self.row_spec.items()}
    for k, source in enumerate(self.sources):
      rows = np.nonzero(row_src == k)[0]
      if rows.size:
        part = source.stream_rows(seed, k, positions[rows])
        for key in out:
          out[key][rows] = part[key]
    return out


def as_mixture(dataset: Any) -> Mixture:
  """A `Mixture` from a Mixture, a Source or `[(Source, weight), ...]`."""
  if isinstance(dataset, Mixture):
    return dataset
  if isinstance(dataset, Source) or isinstance(dataset, (list, tuple)):
    return Mixture(dataset)
  raise TypeError(f"dataset must be a specjax.training Source, Mixture or [(Source, weight)], "
                  f"got {type(dataset).__name__}")


def eval_batches(source: Source, batch_size: int, num_batches: int) -> list[Batch]:
  """The first `num_batches * batch_size` items of `source`, unshuffled, as fixed batches; the
  last is padded with rows of zero loss mask when the source is shorter."""
  batch_size = check_int("batch_size", batch_size, 1)
  num_batches = check_int("num_batches", num_batches, 0)
  out = []
  for b in range(num_batches):
    idx = np.arange(b * batch_size, min((b + 1) * batch_size, source.num_items))
    if idx.size == 0:
      break
    rows = source.fixed_rows(idx)
    if idx.size < batch_size:
      pad = source.empty_rows(batch_size - idx.size)
      rows = {k: np.concatenate([rows[k], pad[k]]) for k in rows}
    out.append(rows)
  return out


# --- From records (text) to examples ---


def _format_all(template: str, records: Sequence[Mapping[str, Any]], what: str) -> list[str]:
  try:
    return [template.format(**r) for r in records]
  except KeyError as e:
    raise ValueError(f"{what} {template!r} names field {e.args[0]!r}, which the records lack "
                     f"(they have {sorted(records[0])})") from None


def _encode_all(tokenizer, texts: Sequence[str], add_eos: bool) -> list[np.ndarray]:
  ids = tokenizer.processor.encode(list(texts), out_type=int)
  eos = [tokenizer.eos_id] if add_eos else []
  return [np.asarray(list(x) + eos, np.int32) for x in ids]


def seq2seq_examples(records: Sequence[Mapping[str, Any]], tokenizer,
                     input_template: str = "{inputs}",
                     target_template: str = "{targets}") -> list[Example]:
  """Encoder inputs and targets (both with EOS) from text records."""
  records = list(records)
  if not records:
    return []
  prompts = _encode_all(tokenizer, _format_all(input_template, records, "input_template"), True)
  targets = _encode_all(tokenizer, _format_all(target_template, records, "target_template"), True)
  return [Example(p, t) for p, t in zip(prompts, targets)]


def lm_examples(records: Sequence[Mapping[str, Any]], tokenizer,
                prompt_template: str | None = None,
                target_template: str = "{targets}") -> list[Example]:
  """Decoder-only examples from text records.

  With `prompt_template` ("{inputs} Summary:"): prompt (no EOS) + target (with EOS), the loss on
  the target only. Without (None or ""): documents, `target_template` with EOS.
  """
  records = list(records)
  if not records:
    return []
  targets = _encode_all(tokenizer, _format_all(target_template, records, "target_template"), True)
  if not prompt_template:
    empty = np.zeros((0,), np.int32)
    return [Example(empty, t) for t in targets]
  prompts = _encode_all(tokenizer, _format_all(prompt_template, records, "prompt_template"), False)
  return [Example(p, t) for p, t in zip(prompts, targets)]


def synthetic_examples(kind: str, num: int, vocab_size: int, min_len: int, max_len: int,
                       seed: int = 0, first_id: int = 2) -> list[Example]:
  """Toy tasks over ids [first_id, vocab_size): target = the prompt "copy"-ed, "reverse"-d or
  "sorted", + EOS."""
  ops = {"copy": lambda x: x, "reverse": lambda x: x[::-1], "sorted": np.sort}
  if kind not in ops:
    raise ValueError(f"kind must be one of {sorted(ops)}, got {kind!r}")
  if not 1 <= min_len <= max_len:
    raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(num):
    x = rng.integers(first_id, vocab_size, size=int(rng.integers(min_len, max_len + 1)))
    x = x.astype(np.int32)
    out.append(Example(x, np.append(ops[kind](x), EOS_ID).astype(np.int32)))
  return out
