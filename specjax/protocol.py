"""The small protocol a model follows to be decoded by specjax.

`specjax.generate` and `specjax.speculative_generate` never look inside a model: they call four
pure functions on a hashable model object (a jit static argument) and read / write one field of
its cache. Any model following it can be a target or a draft: the decoder-only LM, T5, an n-gram
table, a rigged model in a test.

Shapes, also name suffixes (`tokens_BT`): B batch, P padded prompt, T tokens fed in one call, S
cache slots, V vocabulary (the rest: docs/architecture.md, "Shape convention").

A row's decoder stream is the tokens its cache holds at positions 0, 1, ...: the prompt then the
generated tokens (decoder-only), or the decoder start token then the generated tokens
(encoder-decoder; the prompt goes to the encoder).

A cache is a pytree (a `flax.struct.dataclass`) with

  * `lengths`: int32 `[B]`, the valid positions of each row; every slot at or past it is masked
    and may hold stale values, overwritten later. Rolling a row back is setting its length —
    nothing is copied;
  * `max_len`: a Python int property, the static number of slots S;
  * `replace(**fields)` (flax.struct gives it).

Protocol (all functions pure and jit-traceable):

  vocab_size: int
  init_cache(batch_size, max_len, prompt_len) -> cache
      An empty cache (lengths 0) with S = max_len decoder slots; prompt_len is the padded P (an
      encoder-decoder model sizes its cross-attention buffer with it).
  prefill_positions(prompt_len) -> int
      How many decoder slots a prompt of this length occupies after prefill.
  prefill(params, prompts_BP, prompt_lengths_B, cache) -> (logits_BV, last_token_B, cache)
      Processes right-padded prompts (row b's tokens are prompts_BP[b, :len_b]); returns each
      row's next-token logits, the token at its last filled decoder position (the draft re-feeds
      it), and the cache with lengths = filled positions.
  extend(params, tokens_BT, cache) -> (logits_BTV, cache)
      Writes row b's token t at slot lengths[b] + t, attending to every valid slot and causally
      among the T new ones; returns the T positions' logits and the cache with lengths + T.

Optional, for drafters whose target call is not a plain chain (trees, lookahead; `DecoderLM` and
`T5` implement them):

  extend(params, tokens_BT, cache, positions_BT=None, mask_TT=None)
      `positions_BT`: the tokens' positions in their sequences (default: their slots); `mask_TT`
      (bool `[T, T]` or `[B, T, T]`): which new tokens each new token attends to (default causal).
  copy_slots(cache, src_BN, dst_B) -> cache
      Row b's slots src_BN[b, i] copied to dst_B[b] + i (a tree's accepted path made contiguous).
  extend_with_hidden(params, tokens_BT, cache, ...) -> (logits_BTV, hidden_BTE, cache)
      Also the final hidden states (draft heads read them).

Optional, declared by `DecoderLM`, `T5` and the table models (`DeclaresParams`):

  expected_params(params) -> a pytree of `jax.ShapeDtypeStruct`
      The parameter tree the model takes, in `params`' layout (e.g. `DecoderLM`'s packed one):
      the params given are checked against it (`check_params`) before anything is traced.
"""

from __future__ import annotations

from typing import Any, Protocol, Tuple, runtime_checkable

import jax
import numpy as np

__all__ = ["LanguageModel", "DeclaresParams", "check_model", "check_params", "check_tree",
           "required_cache_len"]

Params = Any
Cache = Any


@runtime_checkable
class LanguageModel(Protocol):
  """What `generate` and `speculative_generate` need from a model (see module doc)."""

  vocab_size: int

  def init_cache(self, batch_size: int, max_len: int, prompt_len: int) -> Cache:
    ...

  def prefill_positions(self, prompt_len: int) -> int:
    ...

  def prefill(
      self, params: Params, prompts_BP: jax.Array, prompt_lengths_B: jax.Array, cache: Cache
  ) -> Tuple[jax.Array, jax.Array, Cache]:
    ...

  def extend(self, params: Params, tokens_BT: jax.Array, cache: Cache) -> Tuple[jax.Array, Cache]:
    ...


def check_model(model: Any, name: str) -> None:
  """Raises TypeError naming `name` when `model` does not follow the protocol."""
  missing = [
      attr
      for attr in ("vocab_size", "init_cache", "prefill_positions", "prefill", "extend")
      if not hasattr(model, attr)
  ]
  if missing:
    raise TypeError(
        f"{name} must follow specjax.protocol.LanguageModel; "
        f"{type(model).__name__} lacks {', '.join(missing)}"
    )
  try:
    hash(model)
  except TypeError as e:
    raise TypeError(
        f"{name} must be hashable (it is a jit static argument), e.g. a frozen "
        f"dataclass; {type(model).__name__} is not"
    ) from e


def required_cache_len(model: Any, prompt_len: int, max_new_tokens: int, gamma: int = 0) -> int:
  """Slots a cache needs for `max_new_tokens` after a prompt of padded length `prompt_len`, with
  `gamma` drafts per iteration (0 for autoregressive)."""
  return model.prefill_positions(prompt_len) + max_new_tokens + gamma - 1


@runtime_checkable
class DeclaresParams(Protocol):
  """A model that declares its parameter tree (see the module doc)."""

  def expected_params(self, params: Params) -> Any:
    ...


def _leaf_spec(x: Any):
  if not hasattr(x, "shape") or not hasattr(x, "dtype"):
    x = np.asarray(x)
  return tuple(x.shape), np.dtype(x.dtype)


def check_params(model: Any, params: Any, name: str) -> None:
  """Raises naming `name` when `params` is not the tree `model` declares
  (`DeclaresParams.expected_params`; see `check_tree`). Models declaring nothing pass."""
  if not isinstance(model, DeclaresParams):
    return
  if params is None:
    raise TypeError(f"{name} must be the parameter tree of {type(model).__name__} "
                    f"(e.g. its init(key) or a restored checkpoint), got None")
  try:
    expected = model.expected_params(params)
  except ValueError as e:
    raise ValueError(f"{name} is not a parameter tree of this {type(model).__name__}: {e}") \
        from None
  check_tree(expected, params, name, f"the model ({type(model).__name__}")


def check_tree(expected: Any, params: Any, name: str, owner: str) -> None:
  """Raises naming `name` when `params` differs from the tree `expected` (of
  `jax.ShapeDtypeStruct`s or arrays): a leaf missing or extra, of another shape, or of another
  kind of dtype (any floating dtype may stand for another: layers cast their weights). The
  message names `owner` (e.g. "the model (DecoderLM"), the first differing path with both shapes
  and how many leaves differ."""
  if _same_tree(expected, params):  # the common case, without building path names
    return
  keystr = jax.tree_util.keystr
  want = {keystr(p): _leaf_spec(x)
          for p, x in jax.tree_util.tree_flatten_with_path(expected)[0]}
  try:
    got = {keystr(p): _leaf_spec(x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  except (TypeError, ValueError) as e:
    raise TypeError(f"{name} must be a tree of arrays, got a leaf that is not: {e}") from None
  problems = []
  for path, (shape, dtype) in want.items():
    if path not in got:
      problems.append(f"{path} is missing (expected {shape} {dtype})")
      continue
    g_shape, g_dtype = got[path]
    same_kind = g_dtype == dtype or (_is_float(dtype) and _is_float(g_dtype))
    if g_shape != shape or not same_kind:
      problems.append(f"{path} has shape {g_shape} {g_dtype}, expected {shape} {dtype}")
  problems += [f"{path} is not a parameter (extra leaf, shape {got[path][0]})"
               for path in got if path not in want]
  if problems:
    more = f" (and {len(problems) - 1} more differing leaves)" if len(problems) > 1 else ""
    raise ValueError(f"{name} do not match {owner}, {len(want)} parameter arrays): "
                     f"{problems[0]}{more}")


def _same_tree(expected: Any, params: Any) -> bool:
  """Whether `params` has `expected`'s structure and, leaf by leaf, its shape and kind of dtype
  (False also for anything unusual: `check_tree` then names the difference)."""
  want, want_def = jax.tree_util.tree_flatten(expected)
  try:
    got, got_def = jax.tree_util.tree_flatten(params)
  except (TypeError, ValueError):
    return False
  if got_def != want_def:
    return False
  for w, g in zip(want, got):
    if not (hasattr(g, "shape") and hasattr(g, "dtype")) or tuple(g.shape) != tuple(w.shape):
      return False
    if g.dtype != w.dtype and not (_is_float(w.dtype) and _is_float(g.dtype)):
      return False
  return True


def _is_float(dtype) -> bool:
  return bool(jax.numpy.issubdtype(dtype, jax.numpy.floating))
