"""Hugging Face ``tokenizer.json`` tokenizers, a loader for either kind, a draft/target check.

`HFTokenizer` reads a ``tokenizer.json`` (Llama 3, Qwen; never downloading anything) and offers
`SentencePieceTokenizer`'s batch interface: right-padded ``np.int32`` ``tokens [B, P]`` with
``lengths [B]``, EOS appended by default, rows longer than ``max_len`` an error unless
``truncate=True``.

Special tokens (BOS / EOS / PAD) come from the files next to ``tokenizer.json``, first match wins:
``tokenizer_config.json`` (``"eos_token": "<|eot_id|>"`` or ``{"content": ...}``), then
``special_tokens_map.json`` (same keys), then ``config.json`` (``"eos_token_id"``: an id or a
list, first entry used). A key present with ``null`` means "no such token". With no side file at
all, the well-known names of ``_WELL_KNOWN`` are looked up among the special tokens. Keyword
arguments of `HFTokenizer` override all of it.

Padding: without a pad token, batches are padded with the EOS id (or 0 without EOS); padding is
never a real token, so read ``lengths`` to know where each row ends. Usage: docs/checkpoints.md.

Every path may be a URL (``gs://bucket/llama``, through `etils.epath`): the files are read as
they are, with no local copy.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Iterable, Sequence, Union

import numpy as np

from specjax._checks import check_bool, check_int
from specjax.tokenizers import _files
from specjax.tokenizers._ids import read_id, read_ids, text_list, token_rows
from specjax.tokenizers.chat import read_chat_template, read_eos_ids, render_chat
from specjax.tokenizers.sentencepiece import SentencePieceTokenizer

if TYPE_CHECKING:
  import tokenizers

__all__ = ["HFTokenizer", "load_tokenizer", "check_tokenizers_compatible"]

TOKENIZER_JSON = "tokenizer.json"
SENTENCEPIECE_NAMES = ("spiece.model", "tokenizer.model")
# Files next to tokenizer.json that name special tokens, in priority order.
_TOKEN_CONFIGS = ("tokenizer_config.json", "special_tokens_map.json")
_MODEL_CONFIG = "config.json"
_SPECIAL_NAMES = ("bos", "eos", "pad")
_WELL_KNOWN = {
    "bos": ("<|begin_of_text|>", "<s>", "<bos>"),
    "eos": ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"),
    "pad": ("<pad>", "<|pad|>"),
}

AnyTokenizer = Union["HFTokenizer", SentencePieceTokenizer]


def _read_json_object(path: str) -> dict[str, Any] | None:
  """The JSON object in `path`, or None when absent (ValueError: not JSON / not an object)."""
  if not _files.is_file(path):
    return None
  try:
    value = json.loads(_files.read_text(path))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is not valid JSON: {e}") from None
  if not isinstance(value, dict):
    raise ValueError(f"{path} must hold a JSON object, got "
                     f"{type(value).__name__}")
  return value


def _token_content(value: Any, where: str) -> str | None:
  """A token entry of tokenizer_config.json: a string, {"content": ...} or null."""
  if value is None or isinstance(value, str):
    return value
  if isinstance(value, dict) and isinstance(value.get("content"), str):
    return value["content"]
  raise ValueError(f"{where} must be a token string, an object with a "
                   f"\"content\" string, or null; got {value!r}")


class HFTokenizer:
  """Encodes and decodes text with a Hugging Face ``tokenizer.json``.

  Ids come from the file unchanged (no T5 conventions). ``encode`` does not run the file's
  post-processor: BOS is added when `add_bos` is true (default: `add_bos_by_default`), EOS when
  `add_eos` is true (default True, as in `SentencePieceTokenizer`; pass ``add_eos=False`` for
  language-model prompts).

  Attributes:
    path: the ``tokenizer.json`` file it was loaded from.
    bos_token, eos_token, pad_token: the special tokens as strings, or None when the tokenizer
      has none (`pad_id` is still an int then).
    add_bos_by_default: whether ``encode`` adds BOS when `add_bos` is None:
      ``tokenizer_config.json``'s ``add_bos_token`` when present, else whether the file's
      post-processor prepends BOS.
    eos_ids: every id that ends generation (``generation_config.json``'s ``eos_token_id`` list,
      else ``config.json``'s, else the EOS id): pass it as `eos_id` to `specjax.generate` for an
      instruct checkpoint.
    chat_template: the checkpoint's Jinja chat template, or None (`apply_chat_template`).
  """

  def __init__(self, path: str | os.PathLike, *, bos_token: str | None = None,
               eos_token: str | None = None, pad_token: str | None = None):
    """Loads a ``tokenizer.json`` file, or the one in directory `path`.

    Args:
      path: a ``tokenizer.json`` file, or a directory that holds one; the side files are read
        from the same directory when present. Local, or a URL (``gs://...``).
      bos_token, eos_token, pad_token: override the special tokens found in the side files (each
        must be a token of the vocabulary).

    Raises:
      FileNotFoundError: no ``tokenizer.json`` at `path`.
      ValueError: a file is not valid JSON / not a tokenizer, or names a special token not in the
        vocabulary (messages name the file).
      ImportError: the `tokenizers` package is not installed.
    """
    try:
      import tokenizers  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise ImportError("HFTokenizer needs the `tokenizers` package "
                        "(pip install tokenizers)") from e
    path = _files.fspath(path)
    if _files.is_dir(path):
      path = _files.join(path, TOKENIZER_JSON)
    if not _files.is_file(path):
      raise FileNotFoundError(f"tokenizer file not found: {path}")
    self.path = path
    try:
      if os.path.isfile(path):
        self._tok = tokenizers.Tokenizer.from_file(path)
      else:  # a URL
        self._tok = tokenizers.Tokenizer.from_str(_files.read_text(path))
    except Exception as e:  # tokenizers raises a bare Exception.
      raise ValueError(f"{path} is not a valid tokenizer.json: {e}") from None
    vocab = self._tok.get_vocab(with_added_tokens=True)
    if not vocab:
      raise ValueError(f"{path} is not a valid tokenizer.json: it has no "
                       f"tokens")
    self._vocab_size = max(vocab.values()) + 1
    self._resolve_special_tokens(
        {"bos": bos_token, "eos": eos_token, "pad": pad_token})
    directory = _files.parent(path)
    self.eos_ids = read_eos_ids(directory, self._vocab_size, self.eos_id)
    self.chat_template = read_chat_template(directory)

  # --- Loading ---

  def _resolve_special_tokens(self, overrides: dict[str, str | None]) -> None:
    """Sets bos/eos/pad tokens and `add_bos_by_default` from the side files."""
    directory = _files.parent(self.path)
    configs = [(_files.join(directory, name),
                _read_json_object(_files.join(directory, name)))
               for name in _TOKEN_CONFIGS]
    model_path = _files.join(directory, _MODEL_CONFIG)
    model_config = _read_json_object(model_path)
    for name in _SPECIAL_NAMES:
      token = self._find_special(name, overrides[name], configs, model_path,
                                 model_config)
      setattr(self, f"{name}_token", token)
    tokenizer_config = configs[0][1] or {}
    add_bos = tokenizer_config.get("add_bos_token")
    if add_bos is not None and not isinstance(add_bos, bool):
      raise ValueError(f"{configs[0][0]}: add_bos_token must be true, false or"
                       f" null, got {add_bos!r}")
    if self.bos_token is None:
      self.add_bos_by_default = False
    elif add_bos is not None:
      self.add_bos_by_default = add_bos
    else:
      ids = self._tok.encode("", add_special_tokens=True).ids
      self.add_bos_by_default = bool(ids) and ids[0] == self.bos_id

  def _find_special(self, name: str, override: str | None,
                    configs: list[tuple[str, dict[str, Any] | None]],
                    model_path: str, model_config: dict[str, Any] | None
                    ) -> str | None:
    """The `name` ("bos", "eos" or "pad") token, or None; sources in the module doc's order."""
    if override is not None:
      if not isinstance(override, str):
        raise TypeError(f"{name}_token must be a str, got "
                        f"{type(override).__name__}")
      return self._checked_token(override, f"{name}_token argument")
    key = f"{name}_token"
    for config_path, config in configs:
      if config is not None and key in config:
        where = f"{config_path}: {key}"
        token = _token_content(config[key], where)
        return None if token is None else self._checked_token(token, where)
    id_key = f"{name}_token_id"
    if model_config is not None and id_key in model_config:
      where = f"{model_path}: {id_key}"
      value = model_config[id_key]
      if isinstance(value, list):
        value = value[0] if value else None
      if value is None:
        return None
      if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} must be an int, a list of ints or null, "
                         f"got {model_config[id_key]!r}")
      token = self._tok.id_to_token(value)
      if token is None:
        raise ValueError(f"{where} is {value}, which is not an id of the "
                         f"vocabulary of {self.path} (size "
                         f"{self._vocab_size})")
      return token
    if model_config is not None or any(c is not None for _, c in configs):
      return None  # The side files are authoritative: no such token.
    specials = {t.content for t in self._tok.get_added_tokens_decoder().values()
                if t.special}
    for token in _WELL_KNOWN[name]:
      if token in specials:
        return token
    return None

  def _checked_token(self, token: str, where: str) -> str:
    if self._tok.token_to_id(token) is None:
      raise ValueError(f"{where} is {token!r}, which is not a token of "
                       f"{self.path}")
    return token

  def __repr__(self) -> str:
    return (f"HFTokenizer(path={self.path!r}, vocab_size={self.vocab_size}, "
            f"bos={self.bos_token!r}, eos={self.eos_token!r}, "
            f"pad={self.pad_token!r})")

  # --- Properties ---

  @property
  def backend(self) -> "tokenizers.Tokenizer":
    """The underlying ``tokenizers.Tokenizer``."""
    return self._tok

  @property
  def vocab_size(self) -> int:
    """One more than the largest id (added tokens included); a model's embeddings may be larger."""
    return self._vocab_size

  @property
  def bos_id(self) -> int | None:
    """The beginning-of-sequence id, or None when there is no BOS token."""
    return None if self.bos_token is None else self._tok.token_to_id(
        self.bos_token)

  @property
  def eos_id(self) -> int | None:
    """The end-of-sequence id, or None when there is no EOS token."""
    return None if self.eos_token is None else self._tok.token_to_id(
        self.eos_token)

  @property
  def pad_id(self) -> int:
    """The id batches are padded with: the pad token's, else the EOS id, else 0. Only a real pad
    token (`pad_token` not None) is dropped by ``decode``; otherwise rely on ``lengths``."""
    if self.pad_token is not None:
      return self._tok.token_to_id(self.pad_token)
    eos = self.eos_id
    return 0 if eos is None else eos

  @property
  def unk_id(self) -> int | None:
    """The unknown-token id of the model, or None (byte-level BPE has none)."""
    unk = getattr(self._tok.model, "unk_token", None)
    return None if unk is None else self._tok.token_to_id(unk)

  def id_to_token(self, token_id: int) -> str | None:
    """The token string of `token_id`, or None for an unused id.

    Raises:
      TypeError: `token_id` is not an int (a float, a bool).
      ValueError: `token_id` is outside ``[0, vocab_size)``.
    """
    return self._tok.id_to_token(read_id("token_id", token_id, self._vocab_size, self.path))

  def token_to_id(self, token: str) -> int | None:
    """The id of `token`, or None when it is not in the vocabulary (TypeError: not a str)."""
    if not isinstance(token, str):
      raise TypeError(f"token must be a str, got {token!r:.80} ({type(token).__name__})")
    return self._tok.token_to_id(token)

  def tokens(self) -> list[str | None]:
    """All token strings by id (``vocab_size`` entries, None for unused ids)."""
    out: list[str | None] = [None] * self._vocab_size
    for token, i in self._tok.get_vocab(with_added_tokens=True).items():
      out[i] = token
    return out

  # --- Single sequences ---

  def apply_chat_template(self, messages: Sequence[dict[str, Any]], *,
                          add_generation_prompt: bool = True, tokenize: bool = True,
                          **variables: Any) -> list[int] | str:
    """A conversation as the model's prompt: `messages` (``[{"role": "user", "content": "..."},
    ...]``) rendered by `chat_template` as transformers' ``apply_chat_template`` does, then
    (`tokenize`) encoded without adding BOS / EOS (the template writes its own). `variables`
    reach the template (``tools``, ``date_string``, ...).

    Raises:
      ValueError: no chat template, or the template refused the conversation.
    """
    if self.chat_template is None:
      raise ValueError(f"{self.path} has no chat template (no chat_template in "
                       "tokenizer_config.json, no chat_template.jinja): not an instruct "
                       "checkpoint? Encode the prompt text with encode()")
    text = render_chat(self.chat_template, messages,
                       add_generation_prompt=add_generation_prompt,
                       special_tokens={f"{n}_token": getattr(self, f"{n}_token")
                                       for n in _SPECIAL_NAMES}, **variables)
    if not tokenize:
      return text
    return self._tok.encode(text, add_special_tokens=False).ids

  def _specials_for(self, add_bos: bool | None, add_eos: bool
                    ) -> tuple[list[int], list[int]]:
    """(prefix, suffix) ids for the `add_bos` / `add_eos` options."""
    check_bool("add_eos", add_eos)
    if add_bos is not None:
      check_bool("add_bos", add_bos)
    if add_bos is None:
      add_bos = self.add_bos_by_default
    prefix, suffix = [], []
    if add_bos:
      if self.bos_id is None:
        raise ValueError(f"add_bos=True but {self.path} has no BOS token (none"
                         f" in {', '.join(_TOKEN_CONFIGS)} or {_MODEL_CONFIG});"
                         f" pass bos_token=... to HFTokenizer or add_bos=False")
      prefix = [self.bos_id]
    if add_eos:
      if self.eos_id is None:
        raise ValueError(f"add_eos=True but {self.path} has no EOS token (none"
                         f" in {', '.join(_TOKEN_CONFIGS)} or {_MODEL_CONFIG});"
                         f" pass eos_token=... to HFTokenizer or add_eos=False")
      suffix = [self.eos_id]
    return prefix, suffix

  def encode(self, text: str, add_eos: bool = True,
             add_bos: bool | None = None) -> list[int]:
    """Token ids of `text`.

    Args:
      text: the string; special tokens written in it (``<|eot_id|>``) become their ids.
      add_eos: append EOS.
      add_bos: prepend BOS; None: `add_bos_by_default`.

    Raises:
      TypeError: `text` is not a str, or a flag is not a bool (or None for `add_bos`).
      ValueError: BOS / EOS asked for but the tokenizer has none.
    """
    if not isinstance(text, str):
      raise TypeError(f"text must be a str (ids are decoded with decode), got {text!r:.80} "
                      f"({type(text).__name__})")
    prefix, suffix = self._specials_for(add_bos, add_eos)
    ids = self._tok.encode(text, add_special_tokens=False).ids
    return prefix + ids + suffix

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = True
             ) -> str:
    """Text of `ids`: stops at the first EOS and drops the pad token's ids.

    Args:
      ids: one sequence of token ids: a list or iterable of ints, or a 1-D integer array (numpy
        or jax, any integer dtype); one int is a sequence of one.
      skip_special_tokens: leave special tokens (BOS, chat markers...) out of the text.

    Raises:
      TypeError: `ids` is None, a string, or holds a non-integer (a float, a bool, None); the
        message names the position. `skip_special_tokens` is not a bool.
      ValueError: `ids` is nested (ragged lists, or a 2-D batch: `decode_batch`), or an id
        before the first EOS is outside ``[0, vocab_size)``.
    """
    return self._decode(ids, "ids", skip_special_tokens)

  def _decode(self, ids, name: str, skip_special_tokens: bool) -> str:
    check_bool("skip_special_tokens", skip_special_tokens)
    pad = None if self.pad_token is None else self.pad_id
    kept = read_ids(ids, vocab_size=self._vocab_size, stop_id=self.eos_id, skip_id=pad,
                    source=self.path, name=name)
    return self._tok.decode(kept, skip_special_tokens=bool(skip_special_tokens))

  # --- Batches ---

  def encode_batch(self, texts: Sequence[str], max_len: int, *,
                   add_eos: bool = True, add_bos: bool | None = None,
                   truncate: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Encodes `texts` into a right-padded batch.

    Args:
      texts: B strings.
      max_len: P, the padded length.
      add_eos: append EOS to every row.
      add_bos: prepend BOS to every row; None: `add_bos_by_default`.
      truncate: cut longer rows to `max_len` tokens (BOS kept); with `add_eos` the last kept token
        is replaced by EOS, so every row still ends with EOS.

    Returns:
      ``tokens [B, P]`` (np.int32, `pad_id` after the last token) and ``lengths [B]`` (np.int32,
      real tokens per row, BOS / EOS included).

    Raises:
      TypeError: `texts` is one string or holds a non-string, or `max_len` is not an int.
      ValueError: `max_len` < 1, or a row is longer than `max_len` and `truncate` is False (the
        message names the row and its length).
    """
    if isinstance(texts, str):
      raise TypeError("texts must be a sequence of strings, not one string")
    texts = text_list(texts)
    max_len = check_int("max_len", max_len, 1)
    check_bool("truncate", truncate)
    prefix, suffix = self._specials_for(add_bos, add_eos)
    encodings = self._tok.encode_batch(texts, add_special_tokens=False)
    tokens_bp = np.full((len(texts), max_len), self.pad_id, dtype=np.int32)
    lengths_b = np.zeros((len(texts),), dtype=np.int32)
    for row, enc in enumerate(encodings):
      ids = prefix + enc.ids + suffix
      if len(ids) > max_len:
        if not truncate:
          raise ValueError(
              f"row {row} has {len(ids)} tokens (BOS included: {bool(prefix)}"
              f", EOS included: {bool(suffix)}), more than max_len={max_len};"
              f" raise max_len or pass truncate=True (text starts "
              f"{texts[row][:60]!r})")
        ids = ids[:max_len]
        if suffix:
          ids[-1] = suffix[0]
      tokens_bp[row, :len(ids)] = ids
      lengths_b[row] = len(ids)
    return tokens_bp, lengths_b

  def decode_batch(self, tokens_bn: np.ndarray,
                   lengths_b: np.ndarray | Sequence[int] | None = None, *,
                   skip_special_tokens: bool = True) -> list[str]:
    """Decodes each row of `tokens_bn` into B strings.

    Args:
      tokens_bn: ``[B, N]`` token ids (any integer array-like).
      lengths_b: ``[B]`` tokens to read per row (default: the whole row); a row also stops at
        its first EOS.
      skip_special_tokens: as in `decode`.

    Raises:
      TypeError / ValueError: as `decode` (naming the row), or `lengths_b` not integers in
        ``[0, N]`` of shape ``[B]``.
    """
    tokens_bn, lengths_b = token_rows(tokens_bn, lengths_b)
    return [self._decode(tokens_bn[b, :int(lengths_b[b])], f"tokens[{b}]", skip_special_tokens)
            for b in range(tokens_bn.shape[0])]


# --- Loading either kind ---


def load_tokenizer(path: str | os.PathLike, *, require_t5_ids: bool = True
                   ) -> AnyTokenizer:
  """The tokenizer stored at `path`, SentencePiece or Hugging Face.

  Args:
    path: a ``*.json`` file → `HFTokenizer`; a ``*.model`` SentencePiece file →
      `SentencePieceTokenizer`; or a directory holding ``tokenizer.json`` (preferred when both
      kinds are there), ``spiece.model`` or ``tokenizer.model``. Local, or a URL (``gs://...``).
    require_t5_ids: passed to `SentencePieceTokenizer` (pad 0 / EOS 1).

  Raises:
    FileNotFoundError: `path` does not exist, or the directory holds none of the files above.
    ValueError: `path` is a file of another kind, or a broken tokenizer file.
  """
  path = _files.fspath(path)
  if _files.is_dir(path):
    if _files.is_file(_files.join(path, TOKENIZER_JSON)):
      return HFTokenizer(path)
    for name in SENTENCEPIECE_NAMES:
      candidate = _files.join(path, name)
      if _files.is_file(candidate):
        return SentencePieceTokenizer(candidate, require_t5_ids=require_t5_ids)
    raise FileNotFoundError(
        f"no tokenizer in directory {path}: looked for {TOKENIZER_JSON} "
        f"(Hugging Face tokenizers) and {' / '.join(SENTENCEPIECE_NAMES)} "
        f"(SentencePiece)")
  if not _files.exists(path):
    raise FileNotFoundError(f"tokenizer not found: {path}")
  if path.endswith(".json"):
    return HFTokenizer(path)
  if path.endswith(".model"):
    return SentencePieceTokenizer(path, require_t5_ids=require_t5_ids)
  raise ValueError(
      f"cannot tell the tokenizer kind of {path}: expected a *.json "
      f"Hugging Face tokenizer file, a *.model SentencePiece file, or a "
      f"directory holding {TOKENIZER_JSON}, {' or '.join(SENTENCEPIECE_NAMES)}")


# --- Draft / target compatibility ---


def _as_tokenizer(value: Any, name: str) -> AnyTokenizer:
  if isinstance(value, (HFTokenizer, SentencePieceTokenizer)):
    return value
  if isinstance(value, (str, os.PathLike)):
    return load_tokenizer(value, require_t5_ids=False)
  raise TypeError(f"{name} must be an HFTokenizer, a SentencePieceTokenizer or"
                  f" a path to one, got {type(value).__name__}")


def _token_list(tok: AnyTokenizer) -> list[str | None]:
  if isinstance(tok, HFTokenizer):
    return tok.tokens()
  sp = tok.processor
  return [sp.id_to_piece(i) for i in range(tok.vocab_size)]


def _special_ids(tok: AnyTokenizer) -> dict[str, int | None]:
  # SentencePieceTokenizer (T5 conventions) has no BOS.
  return {name: getattr(tok, name, None)
          for name in ("bos_id", "eos_id", "pad_id")}


def _show(token: str | None) -> str:
  return "(no token)" if token is None else repr(token)


def check_tokenizers_compatible(draft: AnyTokenizer | str | os.PathLike,
                                target: AnyTokenizer | str | os.PathLike
                                ) -> None:
  """Checks that `draft` and `target` map ids to the same tokens (returns None when they do).

  Speculative decoding feeds the target the draft's token ids, so both must agree on every id:
  the vocabularies are compared id by id (token strings, added tokens included), then their
  sizes, then the BOS / EOS / pad ids. Tokenizers are compared, not models (an embedding table
  may be padded past the vocabulary); normalizers and merges are not compared.

  Args:
    draft, target: `HFTokenizer` / `SentencePieceTokenizer` objects, or paths `load_tokenizer`
      accepts (SentencePiece files load without the T5 id requirement).

  Raises:
    ValueError: the first id whose tokens differ (naming both), ids in one vocabulary only, or a
      special id that differs.
    TypeError: an argument is neither a tokenizer nor a path.
  """
  draft = _as_tokenizer(draft, "draft")
  target = _as_tokenizer(target, "target")
  where = f" (draft: {draft.path}, target: {target.path})"
  draft_tokens, target_tokens = _token_list(draft), _token_list(target)
  if draft_tokens != target_tokens:
    for i, (a, b) in enumerate(zip(draft_tokens, target_tokens)):
      if a != b:
        raise ValueError(f"draft and target vocabularies differ at id {i}: "
                         f"draft {_show(a)}, target {_show(b)}{where}")
    n_draft, n_target = len(draft_tokens), len(target_tokens)
    n, longer, tokens = ((n_target, "draft", draft_tokens)
                         if n_draft > n_target
                         else (n_draft, "target", target_tokens))
    raise ValueError(
        f"draft and target vocabularies differ in size: draft has "
        f"{n_draft} ids, target {n_target}; ids {n}..{len(tokens) - 1} exist "
        f"only in the {longer} (first: id {n} {_show(tokens[n])}){where}")
  draft_ids, target_ids = _special_ids(draft), _special_ids(target)
  for name in draft_ids:
    if draft_ids[name] != target_ids[name]:
      raise ValueError(f"draft and target special ids differ: {name} is "
                       f"{draft_ids[name]} in the draft, {target_ids[name]} "
                       f"in the target{where}")
