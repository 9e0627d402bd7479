"""A SentencePiece tokenizer with T5's conventions.

Ids: pad = 0, EOS = 1 (UNK = 2 in vocabularies trained by `experiments.data.train_sentencepiece`),
no BOS; an encoder-decoder model's decoder starts from the pad id (T5's ``decoder_start_token``).
Batches are right-padded ``np.int32`` ``[B, P]`` arrays with ``lengths [B]`` (real tokens per
row, EOS included when added); rows longer than ``max_len`` are an error unless ``truncate``.

  tok = SentencePieceTokenizer("/tmp/data/vocab/spm8000_.../spiece.model")
  tokens_bp, lengths_b = tok.encode_batch(["Hello world."], max_len=16)
  tok.decode_batch(tokens_bp, lengths_b)  # ["Hello world."]
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from specjax._checks import check_bool, check_int
from specjax.tokenizers import _files
from specjax.tokenizers._ids import read_ids, text_list, token_rows

__all__ = ["SentencePieceTokenizer", "token_rows"]


class SentencePieceTokenizer:
  """Encodes and decodes text with a SentencePiece model (T5 conventions).

  Attributes:
    path: the model file it was loaded from.
  """

  def __init__(self, path: str | os.PathLike, *, require_t5_ids: bool = True):
    """Loads the ``spiece.model``-style file at `path`.

    Args:
      path: a serialized SentencePiece model, local or a URL (``gs://...``, read through
        `etils.epath`).
      require_t5_ids: check that the model has pad id 0 and EOS id 1.

    Raises:
      FileNotFoundError: `path` does not exist.
      ValueError: the file is not a SentencePiece model, or (with `require_t5_ids`) its pad /
        EOS ids are not 0 / 1. Messages name the path.
    """
    self.path = _files.fspath(path)
    if not _files.is_file(self.path):
      raise FileNotFoundError(
          f"SentencePiece model not found: {self.path} (build one with "
          f"`python -m experiments.data.build --task=... --spm_vocab_size=N`)")
    proto = _files.read_bytes(self.path)
    self._sp = spm.SentencePieceProcessor()
    try:
      self._sp.LoadFromSerializedProto(proto)
    except Exception as e:  # sentencepiece raises OSError/RuntimeError
      raise ValueError(
          f"{self.path} is not a valid SentencePiece model: {e}") from None
    if self._sp.get_piece_size() <= 0:
      raise ValueError(f"{self.path} is not a valid SentencePiece model: it "
                       f"has no pieces")
    if require_t5_ids and (self._sp.pad_id() != 0 or self._sp.eos_id() != 1):
      raise ValueError(
          f"{self.path} does not follow T5's ids: pad_id={self._sp.pad_id()} "
          f"(want 0), eos_id={self._sp.eos_id()} (want 1); train it with "
          f"pad_id=0 eos_id=1 unk_id=2 bos_id=-1 or pass "
          f"require_t5_ids=False")

  def __repr__(self) -> str:
    return (f"SentencePieceTokenizer(path={self.path!r}, "
            f"vocab_size={self.vocab_size})")

  def __getstate__(self) -> dict[str, object]:
    return {"path": self.path, "proto": self._sp.serialized_model_proto()}

  def __setstate__(self, state: dict[str, object]) -> None:
    self.path = state["path"]
    self._sp = spm.SentencePieceProcessor()
    self._sp.LoadFromSerializedProto(state["proto"])

  @property
  def processor(self) -> spm.SentencePieceProcessor:
    """The underlying ``SentencePieceProcessor``."""
    return self._sp

  @property
  def vocab_size(self) -> int:
    """Number of pieces; valid ids are ``0 .. vocab_size - 1``."""
    return int(self._sp.get_piece_size())

  @property
  def pad_id(self) -> int:
    """The padding id (0 for T5)."""
    return int(self._sp.pad_id())

  @property
  def eos_id(self) -> int:
    """The end-of-sequence id (1 for T5)."""
    return int(self._sp.eos_id())

  @property
  def eos_ids(self) -> tuple:
    """Every id that ends generation: `(eos_id,)` (as `HFTokenizer.eos_ids`)."""
    return (self.eos_id,)

  @property
  def unk_id(self) -> int:
    """The unknown-piece id."""
    return int(self._sp.unk_id())

  @property
  def decoder_start_id(self) -> int:
    """The first decoder input of an encoder-decoder model: the pad id."""
    return self.pad_id

  def encode(self, text: str, add_eos: bool = True) -> list[int]:
    """Token ids of `text`, with EOS appended when `add_eos`.

    Raises:
      TypeError: `text` is not a str (ids are decoded with `decode`), or `add_eos` not a bool.
    """
    if not isinstance(text, str):
      raise TypeError(f"text must be a str, got {text!r:.80} ({type(text).__name__})")
    check_bool("add_eos", add_eos)
    ids = list(self._sp.encode(text, out_type=int))
    if add_eos:
      ids.append(self.eos_id)
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`: stops at the first EOS and drops pad ids.

    Args:
      ids: one sequence of token ids: a list or iterable of ints, or a 1-D integer array (numpy
        or jax, any integer dtype); one int is a sequence of one.

    Raises:
      TypeError: `ids` is None, a string, or holds a non-integer (a float, a bool, None); the
        message names the position.
      ValueError: `ids` is nested (ragged lists, or a 2-D batch: `decode_batch`), or an id
        before the first EOS is outside ``[0, vocab_size)``.
    """
    return self._decode(ids, "ids")

  def _decode(self, ids, name: str) -> str:
    kept = read_ids(ids, vocab_size=self.vocab_size, stop_id=self.eos_id, skip_id=self.pad_id,
                    source=self.path, name=name)
    return self._sp.decode(kept)

  def encode_batch(self, texts: Sequence[str], max_len: int, *,
                   add_eos: bool = True, truncate: bool = False
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Encodes `texts` into a right-padded batch.

    Args:
      texts: B strings.
      max_len: P, the padded length.
      add_eos: append EOS to every row.
      truncate: cut rows longer than `max_len`; with `add_eos` the last kept token becomes
        EOS, so every row still ends with EOS.

    Returns:
      ``tokens [B, P]`` (np.int32, pad id after the last token) and ``lengths [B]`` (np.int32,
      real tokens per row, EOS included).

    Raises:
      TypeError: `texts` is one string or holds a non-string (naming the row), `max_len` is not
        an int, or a flag is not a bool.
      ValueError: `max_len` < 1, or a row is longer than `max_len` and `truncate` is False
        (the message names the row and its length).
    """
    if isinstance(texts, str):
      raise TypeError("texts must be a sequence of strings, not one string")
    texts = text_list(texts)
    max_len = check_int("max_len", max_len, 1)
    check_bool("add_eos", add_eos)
    check_bool("truncate", truncate)
    tokens_bp = np.full((len(texts), max_len), self.pad_id, dtype=np.int32)
    lengths_b = np.zeros((len(texts),), dtype=np.int32)
    for row, text in enumerate(texts):
      ids = self.encode(text, add_eos=add_eos)
      if len(ids) > max_len:
        if not truncate:
          raise ValueError(
              f"row {row} has {len(ids)} tokens (EOS included: {add_eos}), "
              f"more than max_len={max_len}; raise max_len or pass "
              f"truncate=True (text starts {text[:60]!r})")
        ids = ids[:max_len]
        if add_eos:
          ids[-1] = self.eos_id
      tokens_bp[row, :len(ids)] = ids
      lengths_b[row] = len(ids)
    return tokens_bp, lengths_b

  def decode_batch(self, tokens_bn: np.ndarray,
                   lengths_b: np.ndarray | Sequence[int] | None = None
                   ) -> list[str]:
    """Decodes each row of `tokens_bn`.

    Args:
      tokens_bn: ``[B, N]`` token ids (any integer array-like).
      lengths_b: ``[B]`` tokens to read per row (default: the whole row); decoding also stops
        at a row's first EOS and skips pad ids.

    Returns:
      B strings.

    Raises:
      TypeError / ValueError: as `decode` (naming the row), or `lengths_b` not integers in
        ``[0, N]`` of shape ``[B]``.
    """
    tokens_bn, lengths_b = token_rows(tokens_bn, lengths_b)
    return [self._decode(tokens_bn[b, :int(lengths_b[b])], f"tokens[{b}]")
            for b in range(tokens_bn.shape[0])]
