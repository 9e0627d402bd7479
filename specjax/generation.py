"""Autoregressive and speculative generation: one jit, one `lax.while_loop`.

Both decoders are frozen (hashable) dataclasses of static choices; `init_state` / `step` /
`finalize` are pure functions of explicit state, and `run` (jitted, caches donated) is
init + while_loop + finalize. Decoding state per row b (see `protocol` for the stream):

  * `seq_len[b]`: committed decoder positions held in the caches;
  * `pending[b]`: the last committed token, not yet fed to the target;
  * `prev[b]`: the token at position seq_len - 1 (the draft re-feeds it);
  * `out_len[b]`: generated tokens so far; `done[b]`: EOS or max reached.

The first token comes from the target's prefill logits. A speculative iteration, all rows at once:

  1. the drafter proposes (`specjax.drafters`): a draft model (`ModelDrafter`) sets its length
     to seq_len - 1 and feeds [prev, pending] (one T=2 call: it sees the last iteration's
     corrected / bonus token), then G - 1 single-token calls in a `lax.scan`; other drafters
     copy n-grams, run the target's own weights, or build a token tree. The proposal is the
     target call's tokens plus, for drafts with distributions, those distributions;
  2. the target sets its length to seq_len and runs the call once (the drafter's `CallLayout`:
     [pending, d_1..d_G] causally, or a tree / lookahead block with positions and a mask);
  3. verification (`verify_fn` for a chain with distributions, `candidates_verify` for
     deterministic chains and candidate sets, `tree_verify` for trees): n accepted + the next;
  4. commit n + 1 tokens per row (fewer at EOS / max_new_tokens) and roll the caches back per
     row by lengths alone; accepted tokens not right after the pending token (candidates, tree
     branches) have their keys and values moved there (`copy_slots`, ≤ N slots per layer);
  5. the drafter's `update` sees the commit (and, if asked, the target's hidden state at the
     last accepted token).

Randomness: row b draws from its own key: the prefill token from fold_in(key_b, 0), iteration
i from fold_in(key_b, i + 1) (split in two: the draft's G uniforms in one PRNG call, the
verifier's in another), so a row's output does not depend on the rest of the batch. Greedy
decoding draws nothing: with the default verifier `greedy_verify` makes the rejection rule's
decisions on one-hot distributions. PRNG calls per iteration stay constant in G (each is a
rolled loop on XLA:CPU).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, List, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax import adaptive as adapt_lib
from specjax._checks import is_concrete
from specjax.adaptive import AdaptiveGamma
from specjax.drafting import CallLayout, DraftFeedback, DraftInput, Drafter, Proposal
from specjax.parallel.sharding import decode_mesh
from specjax.sampling import SamplingConfig, argmax_first, draw, process_logits, row_uniforms
from specjax.tree import TokenTree, dynamic_tree_arrays
from specjax.verify import (candidates_verify, greedy_candidates_verify, greedy_verify,
                            rejection_verify, tree_verify)

__all__ = [
    "DecodeStats", "GenerationOutput", "DecodeState", "AutoregressiveDecoder",
    "SpeculativeDecoder", "Prefill", "PrefillOrigin", "run_prefill", "autoregressive_loop",
    "speculative_loop", "EosIds", "is_eos", "check_verify_fn", "verify_takes_num_valid",
    "call_verify", "check_verify_result",
]

# End-of-sequence ids: none, one, or a tuple (instruct checkpoints end on any of several).
EosIds = Optional[Union[int, Tuple[int, ...]]]


def is_eos(tokens: jax.Array, eos_id: EosIds) -> jax.Array:
  """bool, `tokens`' shape: where a token is one of the EOS ids (`eos_id` not None)."""
  ids = (eos_id,) if isinstance(eos_id, int) else tuple(eos_id)
  hit = tokens == ids[0]
  for e in ids[1:]:
    hit = hit | (tokens == e)
  return hit


@struct.dataclass
class DecodeStats:
  """Per-row counters (only iterations in which the row was still active).

  Attributes:
    target_calls: `[B]` target forward passes, the prefill included.
    draft_calls: `[B]` draft forward passes after prefill (G per iteration).
    drafted: `[B]` draft tokens proposed.
    accepted: `[B]` draft tokens accepted.
    accepted_hist: `[B, G + 1]` iterations that accepted exactly k drafts:
      P(position i accepted) = sum(hist[k] for k >= i) / sum(hist).
    nonfinite: `[B]` target calls (prefill included) whose logits held a NaN or +inf, or no
      finite value, at some position, or (T > 0) whose processed distribution (temperature,
      top-k, top-p) did (a broken checkpoint, a bfloat16 overflow): their tokens
      mean nothing. `generate` / `speculative_generate` raise on it by default (`nonfinite=`).
    gamma_trace: for `gamma="auto"` (`specjax.adaptive`): int32 `[max_new_tokens]`, the γ of
      each iteration's call (-1 past the last); in per-row mode (`AdaptiveGamma(per_row=True)`)
      int32 `[B, max_new_tokens]`, the γ row b chose in iteration i (its valid drafts: at most
      its γ where the drafter offered fewer, e.g. prompt lookup; 0: a plain step; -1 once the
      row finished, or past the last), the same whether the row is decoded alone or in a
      batch. None otherwise.
    acceptance: for `gamma="auto"`: the final acceptance estimate (`specjax.Acceptance`), to
      start the next call of a series from (`acceptance=`); None otherwise.
  """

  target_calls: jax.Array
  draft_calls: jax.Array
  drafted: jax.Array
  accepted: jax.Array
  accepted_hist: jax.Array
  nonfinite: jax.Array
  gamma_trace: Optional[jax.Array] = None
  acceptance: Optional[adapt_lib.Acceptance] = None

  @classmethod
  def zeros(cls, batch: int, gamma: int) -> "DecodeStats":
    z = jnp.zeros((batch,), jnp.int32)
    return cls(z, z, z, z, jnp.zeros((batch, gamma + 1), jnp.int32), z)

  @classmethod
  def from_histogram(cls, accepted_hist: Any, drafted: Any = 0) -> "DecodeStats":
    """Stats of one row holding totals of an accepted-length histogram `[..., G + 1]` (leading
    axes summed) and the drafted tokens, so stored records read back into τ / α. Call
    counters are 0."""
    hist = np.asarray(accepted_hist)
    if hist.ndim < 1 or hist.shape[-1] < 1 or hist.dtype.kind not in "iuf":
      raise ValueError(f"accepted_hist must be a histogram [..., G + 1] of counts, got "
                       f"{accepted_hist!r}")
    hist = hist.reshape(-1, hist.shape[-1]).sum(0, keepdims=True)   # [1, G + 1]
    z = np.zeros((1,), np.int64)
    return cls(z, z, np.reshape(np.sum(drafted), (1,)), (hist * np.arange(hist.shape[1])).sum(1),
               hist, z)

  @property
  def iterations(self) -> int:
    """Speculative iterations, all rows together (the histogram's count)."""
    return int(_host_sum(self.accepted_hist))

  @property
  def tokens_per_iteration(self) -> float:
    """τ: mean tokens per speculative iteration (accepted drafts + 1) over every row's
    iterations, before EOS / max_new_tokens cuts; NaN without one
    (measured `theory.expected_tokens_per_call`)."""
    hist = _host_sum(self.accepted_hist, last=True)
    n = hist.sum()
    return float((hist * np.arange(1, hist.size + 1)).sum() / n) if n else float("nan")

  def alpha(self, gamma: Optional[int] = None) -> float:
    """α: accepted / drafted tokens, all rows together; with a fixed `gamma`, accepted /
    (γ · iterations), missing drafts (e.g. no prompt-lookup match) counted as rejected:
    Leviathan et al.'s α at that γ. NaN when nothing was drafted."""
    if gamma is not None and (isinstance(gamma, bool) or not isinstance(gamma, int)
                              or gamma < 1):
      raise ValueError(f"gamma must be None or an integer >= 1, got {gamma!r}")
    drafted = _host_sum(self.drafted) if gamma is None else gamma * self.iterations
    return float(_host_sum(self.accepted) / drafted) if drafted else float("nan")

  @property
  def acceptance_by_position(self) -> np.ndarray:
    """float64 `[G]`: P(draft position i accepted), i = 1..G, = Σ_{k ≥ i} hist[k] / Σ hist
    over every row's iterations (NaN without one)."""
    hist = _host_sum(self.accepted_hist, last=True)
    n = hist.sum()
    return np.cumsum(hist[::-1])[::-1][1:] / n if n else np.full(hist.size - 1, np.nan)


def _host_sum(x: Any, last: bool = False) -> np.ndarray:
  """float64 on the host: `x` summed over every axis (`last`: all but the last, `[..., K]` →
  `[K]`), on the device for a jax.Array (rows split over hosts)."""
  axes = tuple(range(np.ndim(x) - 1)) if last else None
  x = jnp.sum(x, axis=axes) if isinstance(x, jax.Array) else np.sum(x, axis=axes)
  return np.asarray(x, np.float64)


@struct.dataclass
class GenerationOutput:
  """What `generate` / `speculative_generate` return.

  Attributes:
    tokens: int32 `[B, max_new_tokens]`; slots past `lengths` hold pad_id.
    lengths: int32 `[B]` generated tokens per row (EOS included).
    stats: `DecodeStats`.
    target_cache / draft_cache: the final caches (donated inputs come back here, for the next
      call); draft_cache is None for autoregressive decoding.
  """

  tokens: jax.Array
  lengths: jax.Array
  stats: DecodeStats
  target_cache: Any = None
  draft_cache: Any = None

  @property
  def acceptance_rate(self) -> float:
    """Accepted / drafted over the whole batch (`DecodeStats.alpha`)."""
    return self.stats.alpha()

  @property
  def mean_tokens_per_iteration(self) -> float:
    """`DecodeStats.tokens_per_iteration`: mean (accepted + 1) per iteration."""
    return self.stats.tokens_per_iteration

  @property
  def tokens_per_target_call(self) -> float:
    """Generated tokens / target forward passes (prefill included), whole batch."""
    return float(jnp.sum(self.lengths)) / float(jnp.sum(self.stats.target_calls))


@struct.dataclass
class DecodeState:
  """Loop state shared by both decoders (shapes per `protocol`).

  tokens `[B, N + C]` output buffer (C = tokens one step can commit), out_len / seq_len /
  pending / prev `[B]` int32, done `[B]` bool, keys `[B]` typed PRNG keys, step `[]` int32.
  """

  step: jax.Array
  tokens: jax.Array
  out_len: jax.Array
  seq_len: jax.Array
  pending: jax.Array
  prev: jax.Array
  done: jax.Array
  keys: jax.Array
  target_cache: Any
  draft_cache: Any
  stats: DecodeStats
  adapt: Optional[adapt_lib.AdaptState] = None  # gamma="auto" only


def nonfinite_rows(logits_BV: jax.Array, probs_BV: Optional[jax.Array] = None) -> jax.Array:
  """int32 `[B]`: 1 where row b's logits (`[B, V]` or `[B, T, V]`) hold a NaN or +inf, or no
  finite value, at some position; -inf alone (a token ruled out) is fine. One max over V per
  position (NaN propagates). With `probs_BV` (the processed distributions of these logits,
  same shape): also where one of them is not finite (one sum over V per position)."""
  b = logits_BV.shape[0]
  bad = ~jnp.isfinite(jnp.max(logits_BV, axis=-1).reshape(b, -1))
  if probs_BV is not None:
    bad = bad | ~jnp.isfinite(jnp.sum(probs_BV, axis=-1).reshape(b, -1))
  return jnp.any(bad, axis=1).astype(jnp.int32)


def _count_nonfinite(dec, logits_BTV: jax.Array, probs_BTV: Optional[jax.Array] = None):
  """One target call's `DecodeStats.nonfinite` count: its raw logits and, at T > 0, the
  processed distributions drawn from (greedy's one-hot is finite by construction)."""
  if not dec.count_nonfinite:
    return 0
  return nonfinite_rows(logits_BTV, None if dec.sampling.is_greedy else probs_BTV)


def _fold_keys(keys_B: jax.Array, data) -> jax.Array:
  return jax.vmap(lambda k: jax.random.fold_in(k, data))(keys_B)


def _commit(state: DecodeState, new_BC: jax.Array, count_B: jax.Array, max_new: int,
            eos_id: EosIds) -> Tuple[DecodeState, jax.Array]:
  """Appends the first count_B[b] of new_BC[b] to each active row's output, cut at EOS and
  max_new. Returns the state (caches untouched) and the committed counts (0 for done rows)."""
  c = new_BC.shape[1]
  j_C = jnp.arange(c)
  if eos_id is not None:
    is_eos_BC = is_eos(new_BC, eos_id) & (j_C[None] < count_B[:, None])
    first_eos_B = jnp.argmax(is_eos_BC, axis=1)
    count_B = jnp.where(jnp.any(is_eos_BC, axis=1), first_eos_B + 1, count_B)
    hit_eos_B = jnp.any(is_eos_BC, axis=1)
  else:
    hit_eos_B = jnp.zeros_like(state.done)
  count_B = jnp.minimum(count_B, max_new - state.out_len)
  count_B = jnp.where(state.done, 0, count_B).astype(jnp.int32)
  tokens = jax.vmap(lambda row, upd, s: jax.lax.dynamic_update_slice(row, upd, (s,)))(
      state.tokens, new_BC.astype(state.tokens.dtype), state.out_len)
  out_len = state.out_len + count_B
  done = state.done | (hit_eos_B & (count_B > 0)) | (out_len >= max_new)
  last_B = jnp.take_along_axis(new_BC, jnp.maximum(count_B - 1, 0)[:, None], axis=1)[:, 0]
  before_last_B = jnp.take_along_axis(new_BC, jnp.maximum(count_B - 2, 0)[:, None], axis=1)[:, 0]
  prev = jnp.where(count_B >= 2, before_last_B, jnp.where(count_B == 1, state.pending, state.prev))
  pending = jnp.where(count_B >= 1, last_B, state.pending)
  state = state.replace(tokens=tokens, out_len=out_len, done=done, pending=pending,
                        prev=prev, seq_len=state.seq_len + count_B)
  return state, count_B


# Per-position multipliers of the prompt fingerprint (odd, fixed): a row's fingerprint is
# Σ_j (id_j + 1) · w_j mod 2**64 over its first `length` ids, mixed with the length.
_FINGERPRINT_SEED = 0x5EC7A5


@functools.lru_cache(maxsize=16)
def _fingerprint_weights(prompt_len: int) -> np.ndarray:
  rng = np.random.default_rng(_FINGERPRINT_SEED)
  return rng.integers(0, 2**63, size=prompt_len, dtype=np.uint64) * 2 + 1


def _row_fingerprints(prompts_BP, lengths_B) -> Optional[Tuple[int, ...]]:
  """One 64-bit fingerprint per row of its ids within its length (padding not read), read on
  the host; None for tracers (inside an outer `jit`) and multi-host arrays."""
  if not (is_concrete(prompts_BP) and is_concrete(lengths_B)):
    return None
  t = np.asarray(prompts_BP).astype(np.uint64)
  lens = np.asarray(lengths_B).astype(np.int64)
  inside = np.arange(t.shape[1])[None] < lens[:, None]
  with np.errstate(over="ignore"):
    h = np.sum(np.where(inside, t + np.uint64(1), np.uint64(0)) * _fingerprint_weights(t.shape[1]),
               axis=1, dtype=np.uint64)
    h ^= lens.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
  return tuple(int(x) for x in h)


def _key_fingerprints(keys_B) -> Optional[Tuple[bytes, ...]]:
  """Each row's key data as bytes (None for tracers and multi-host arrays)."""
  if not is_concrete(keys_B):
    return None
  data = np.asarray(jax.random.key_data(keys_B))
  return tuple(row.tobytes() for row in data.reshape(data.shape[0], -1))


def _rows(rows: List[int]) -> str:
  shown = ", ".join(str(r) for r in rows[:8])
  return f"row{'s' if len(rows) > 1 else ''} {shown}{', ...' if len(rows) > 8 else ''}"


@dataclasses.dataclass(frozen=True)
class PrefillOrigin:
  """What a `Prefill` was made from (`specjax.prefill`), so that a decoding call it does not
  belong to is refused: the target, batch B and padded length P, each row's prompt
  fingerprint (its ids within its length; None where unread) and length, the sampling, each
  row's key data (None where unread) and the `max_new_tokens` / `gamma` it was sized for.
  Static (not traced): a decoder drops it before its jitted program (one compilation for
  every prefill of a shape)."""

  model: Any
  batch_size: int
  prompt_len: int
  prompts: Optional[Tuple[int, ...]]
  lengths: Optional[Tuple[int, ...]]
  sampling: SamplingConfig
  keys: Optional[Tuple[bytes, ...]]
  max_new_tokens: int
  gamma: int

  @classmethod
  def of(cls, model, prompts_BP, lengths_B, sampling: SamplingConfig, keys_B, max_new_tokens: int,
         gamma: int) -> "PrefillOrigin":
    """The origin of a prefill (or a call) with these checked arguments."""
    b, p = prompts_BP.shape
    lengths = (tuple(int(n) for n in np.asarray(lengths_B)) if is_concrete(lengths_B)
               else None)
    return cls(model=model, batch_size=int(b), prompt_len=int(p),
               prompts=_row_fingerprints(prompts_BP, lengths_B), lengths=lengths,
               sampling=sampling, keys=_key_fingerprints(keys_B),
               max_new_tokens=int(max_new_tokens), gamma=int(gamma))

  def differences(self, call: "PrefillOrigin") -> List[str]:
    """What differs between this prefill's origin and `call`'s (empty: it belongs to the
    call), one phrase each. Token budgets are not compared: the cache's slots are."""
    out = []
    if call.model != self.model:
      out.append(f"it was made with another target ({type(self.model).__name__}), not this "
                 f"{type(call.model).__name__}")
    if (call.batch_size, call.prompt_len) != (self.batch_size, self.prompt_len):
      out.append(f"prompts have shape {(call.batch_size, call.prompt_len)}, the prefill's "
                 f"{(self.batch_size, self.prompt_len)}")
      return out   # rows do not correspond
    if self.lengths is not None and call.lengths is not None:
      rows = [r for r, (a, b) in enumerate(zip(self.lengths, call.lengths)) if a != b]
      if rows:
        r = rows[0]
        out.append(f"prompt_lengths differ in {_rows(rows)} (row {r}: {call.lengths[r]}, the "
                   f"prefill's {self.lengths[r]})")
    if self.prompts is not None and call.prompts is not None:
      rows = [r for r, (a, b) in enumerate(zip(self.prompts, call.prompts)) if a != b]
      if rows:
        out.append(f"prompts differ in {_rows(rows)} (their ids within the lengths)")
    if call.sampling != self.sampling:
      out.append(f"sampling is {call.sampling}, the prefill's {self.sampling}")
    elif (not self.sampling.is_greedy and self.keys is not None and call.keys is not None):
      rows = [r for r, (a, b) in enumerate(zip(self.keys, call.keys)) if a != b]
      if rows:   # the first token was drawn with the prefill's keys
        out.append(f"key differs in {_rows(rows)} (the first token was drawn with the "
                   f"prefill's key)")
    return out


@struct.dataclass
class Prefill:
  """A target's prefill, done once and decoded from by any decoder.

  first `[B]` int32: the first generated token (drawn with the rows' keys, as a decoder's own
  prefill draws it); last `[B]` int32: each prompt's last token; cache: the target's cache
  holding the prompts; nonfinite `[B]` int32: 1 where the prefill logits were not finite;
  origin: what `specjax.prefill` made it from (`PrefillOrigin`; static, kept by
  `jax.tree.map` copies), None for a `run_prefill` of one's own (then nothing is compared)."""

  first: jax.Array
  last: jax.Array
  cache: Any
  nonfinite: jax.Array
  origin: Optional[PrefillOrigin] = struct.field(pytree_node=False, default=None)


def _without_origin(prefilled: Optional[Prefill]) -> Optional[Prefill]:
  """`prefilled` as its jitted program takes it: one compilation for every origin."""
  if prefilled is None or prefilled.origin is None:
    return prefilled
  return prefilled.replace(origin=None)


def _prefill(model, params, sampling, prompts_BP, lengths_B, cache, keys_B, prefilled=None):
  if prefilled is not None:
    return prefilled.first, prefilled.last, prefilled.cache, prefilled.nonfinite
  logits_BV, last_B, cache = model.prefill(params, prompts_BP, lengths_B, cache)
  first_B, bad_B = _first_token(logits_BV, sampling, keys_B)
  return first_B, last_B, cache, bad_B


def _first_token(logits_BV, sampling, keys_B):
  """The first generated token, drawn from the prefill's logits, and `nonfinite_rows` of the
  logits and (T > 0) of the distribution it was drawn from."""
  u_B = row_uniforms(_fold_keys(keys_B, 0), 1)[:, 0]
  probs_BV = process_logits(logits_BV, sampling)
  bad_B = nonfinite_rows(logits_BV, None if sampling.is_greedy else probs_BV)
  return draw(u_B, probs_BV, sampling), bad_B


@jax.jit(static_argnums=(0, 2), donate_argnames=("cache",))
def run_prefill(model, params, sampling: SamplingConfig, prompts_BP, lengths_B, keys_B,
                cache) -> Prefill:
  """The target's prefill and first token as a decoder computes them (jitted)."""
  return Prefill(*_prefill(model, params, sampling, prompts_BP, lengths_B, cache, keys_B))


def _initial_state(first_B, last_B, target_cache, draft_cache, keys_B, max_new, width,
                   gamma, pad_id, eos_id, nonfinite_B) -> DecodeState:
  b = first_B.shape[0]
  tokens = jnp.full((b, max_new + width), pad_id, jnp.int32).at[:, 0].set(first_B)
  done = jnp.full((b,), max_new <= 1)
  if eos_id is not None:
    done = done | is_eos(first_B, eos_id)
  stats = DecodeStats.zeros(b, gamma)
  stats = stats.replace(target_calls=stats.target_calls + 1, nonfinite=nonfinite_B)
  return DecodeState(
      step=jnp.zeros((), jnp.int32), tokens=tokens, out_len=jnp.ones((b,), jnp.int32),
      seq_len=target_cache.lengths.astype(jnp.int32), pending=first_B, prev=last_B,
      done=done, keys=keys_B, target_cache=target_cache, draft_cache=draft_cache,
      stats=stats)


def _finalize(state: DecodeState, max_new: int, pad_id: int) -> GenerationOutput:
  tokens = state.tokens[:, :max_new]
  tokens = jnp.where(jnp.arange(max_new)[None] < state.out_len[:, None], tokens, pad_id)
  stats = state.stats
  if state.adapt is not None:
    stats = stats.replace(gamma_trace=state.adapt.gamma_trace(),
                          acceptance=state.adapt.pooled())
  return GenerationOutput(tokens=tokens, lengths=state.out_len, stats=stats,
                          target_cache=state.target_cache, draft_cache=state.draft_cache)


def _loop(step_fn, state: DecodeState, max_iters: int) -> DecodeState:
  return jax.lax.while_loop(
      lambda s: (s.step < max_iters) & ~jnp.all(s.done), step_fn, state)


@dataclasses.dataclass(frozen=True)
class AutoregressiveDecoder:
  """Plain decoding: one target call per token. Static configuration.

  `count_nonfinite`: count each call's non-finite logits in `DecodeStats.nonfinite` (False:
  only the prefill's; for measuring what the count costs).
  """

  model: Any
  sampling: SamplingConfig
  max_new_tokens: int
  eos_id: EosIds = None
  pad_id: int = 0
  count_nonfinite: bool = True
  # Report stats as an adaptive loop with this Γ that never drafted (gamma="auto" where drafting
  # cannot pay runs this program; `_as_plain_adaptive`).
  report_adaptive: Optional[AdaptiveGamma] = None

  def init_state(self, params, prompts_BP, lengths_B, keys_B, cache,
                 prefilled: Optional[Prefill] = None) -> DecodeState:
    first_B, last_B, cache, bad_B = _prefill(self.model, params, self.sampling, prompts_BP,
                                             lengths_B, cache, keys_B, prefilled)
    return _initial_state(first_B, last_B, cache, None, keys_B, self.max_new_tokens, 1, 0,
                          self.pad_id, self.eos_id, bad_B)

  def step(self, params, state: DecodeState) -> DecodeState:
    active_B = ~state.done
    cache = state.target_cache.replace(lengths=state.seq_len)
    logits_B1V, cache = self.model.extend(params, state.pending[:, None], cache)
    u_B = row_uniforms(_fold_keys(state.keys, state.step + 1), 1)[:, 0]
    q_BV = process_logits(logits_B1V[:, 0], self.sampling)
    next_B = draw(u_B, q_BV, self.sampling)
    state, _ = _commit(state, next_B[:, None], jnp.ones_like(next_B), self.max_new_tokens,
                       self.eos_id)
    a = active_B.astype(jnp.int32)
    stats = state.stats.replace(target_calls=state.stats.target_calls + a,
                                nonfinite=state.stats.nonfinite
                                + _count_nonfinite(self, logits_B1V, q_BV[:, None]) * a)
    return state.replace(step=state.step + 1, target_cache=cache, stats=stats)

  def run(self, params, prompts_BP, lengths_B, keys_B, cache,
          prefilled: Optional[Prefill] = None,
          acceptance: Optional[adapt_lib.Acceptance] = None) -> GenerationOutput:
    """`prefilled` (donated): decode from it (`cache` None). `acceptance`: with
    `report_adaptive`, the carried estimate to idle."""
    if acceptance is not None and self.report_adaptive is None:
      raise ValueError("acceptance is reported by a decoder with report_adaptive set")
    with decode_mesh(params):
      return autoregressive_loop(self, params, prompts_BP, lengths_B, keys_B, cache,
                                 _without_origin(prefilled), acceptance)


@dataclasses.dataclass(frozen=True)
class SpeculativeDecoder:
  """Draft-then-verify decoding. Static configuration.

  `drafter` is a `specjax.drafting.Drafter` (`specjax.drafters`: a draft model in
  `ModelDrafter`, prompt lookup, self-speculative, lookahead, Medusa, EAGLE, ...). One
  iteration is the module docstring's five steps; verification is exact (`specjax.verify`).
  """

  target: Any
  drafter: Drafter
  gamma: int
  sampling: SamplingConfig
  max_new_tokens: int
  eos_id: EosIds = None
  pad_id: int = 0
  verify_fn: Callable = rejection_verify
  # The rules for deterministic drafts / candidate sets and for token trees.
  candidates_fn: Callable = candidates_verify
  tree_fn: Callable = tree_verify
  count_nonfinite: bool = True  # as in AutoregressiveDecoder
  # gamma="auto" (`specjax.adaptive`): γ chosen per iteration from Γ (`gamma` = max Γ).
  adaptive: Optional[AdaptiveGamma] = None

  def __post_init__(self):
    if not isinstance(self.drafter, Drafter):
      raise TypeError(f"drafter must be a specjax.drafting.Drafter (wrap a draft model in "
                      f"specjax.drafters.ModelDrafter), got {type(self.drafter).__name__}")
    # Rows propose fewer drafts than the call holds in per-row mode, or where the drafter
    # offers less (a lookup): there a rule must be told (num_valid_B).
    uneven = self.adaptive is not None and (self.adaptive.per_row or self.drafter.offers_room)
    check_verify_fn(self.drafter, self.gamma, self.verify_fn,
                    self.adaptive if uneven else None)
    if self.adaptive is not None:
      check_adaptive(self.drafter, self.adaptive)
      if self.gamma != self.adaptive.max_gamma:
        raise ValueError(f"an adaptive decoder's gamma must be max Γ "
                         f"({self.adaptive.max_gamma}), got {self.gamma}")

  @property
  def layout(self) -> CallLayout:
    return self.drafter.layout(self.gamma)

  def init_state(self, target_params, draft_params, prompts_BP, lengths_B, keys_B,
                 target_cache, draft_cache, prefilled: Optional[Prefill] = None,
                 acceptance: Optional[adapt_lib.Acceptance] = None) -> DecodeState:
    """`acceptance`: an adaptive decoder's carried estimate (None: the prior)."""
    drafter = self.drafter
    if drafter.needs_prompt_hidden:
      # The drafter reads the target's hidden states over the prompt (EAGLE).
      if prefilled is not None:
        raise ValueError(f"{type(drafter).__name__} reads the target's hidden states over the "
                         "prompt, which a shared prefill does not keep: decode it from its own "
                         "prefill (prefilled=None)")
      def absorb(state, start, hidden_BCX):
        return drafter.absorb(draft_params, state, prompts_BP, lengths_B, start, hidden_BCX)
      logits_BV, last_B, target_cache, draft_cache = self.target.prefill_with_hidden(
          target_params, prompts_BP, lengths_B, target_cache, layers=drafter.hidden_layers,
          fold=(absorb, draft_cache))
      first_B, bad_B = _first_token(logits_BV, self.sampling, keys_B)
      draft_state = drafter.start(draft_params, draft_cache, prompts_BP, lengths_B, first_B,
                                  target_cache)
    else:
      first_B, last_B, target_cache, bad_B = _prefill(
          self.target, target_params, self.sampling, prompts_BP, lengths_B, target_cache,
          keys_B, prefilled)
      draft_state = drafter.start(draft_params, draft_cache, prompts_BP, lengths_B, first_B,
                                  target_cache)
    n = self.layout.chain_len
    state = _initial_state(first_B, last_B, target_cache, draft_state, keys_B,
                           self.max_new_tokens, n + 1, n, self.pad_id, self.eos_id, bad_B)
    if self.adaptive is not None:
      # The drafter's prefill holds positions < seq_len. Rows that stopped drafting retry,
      # unless plain steps observe the drafts anyway (a drafter that previews them).
      adapt = adapt_lib.AdaptState.zeros(first_B.shape[0], self.max_new_tokens, acceptance,
                                         retries=not drafter.offers_room,
                                         per_row=self.adaptive.per_row)
      state = state.replace(adapt=adapt.replace(synced_B=state.seq_len))
    return state

  @property
  def _verify(self) -> Callable:
    # Temperature 0 with the default rule: the same decisions without random numbers.
    if self.sampling.is_greedy and self.verify_fn is rejection_verify:
      return greedy_verify
    return self.verify_fn

  def _verify_call(self, key_B, proposal: Proposal, q_BTV, children_BTC=None):
    """(slots_BN, accepted_B, next_B, chain_B): the accepted tokens' call positions (the first
    accepted_B per row), the token after them and their chain (0 for trees).
    `children_BTC`: a dynamic tree's per-row children."""
    lay = self.layout
    chains = jnp.asarray(np.asarray(lay.chains_KN), jnp.int32)
    if lay.is_tree:
      if lay.dynamic_tree is not None:
        children, depth = children_BTC, lay.dynamic_tree[0]
      else:
        tree = TokenTree(tuple(int(p) for p in np.asarray(lay.parents_T)))
        children, depth = jnp.asarray(tree.children), tree.depth
      path_BD, n_B, next_B = self.tree_fn(
          key_B, proposal.tokens_BT, proposal.node_valid_BT, q_BTV, children, depth,
          proposal.node_probs_BTV, greedy=self.sampling.is_greedy)
      return path_BD, n_B, next_B, jnp.zeros_like(n_B)
    chain_B, n_B, next_B = self._verify_chains(key_B, proposal, q_BTV)
    return chains[chain_B], n_B, next_B, chain_B

  def _verify_chains(self, key_B, proposal: Proposal, q_BTV):
    """(chain_B, accepted_B, next_B) for one target call's distributions."""
    lay = self.layout
    chains = np.asarray(lay.chains_KN)
    cands_BKN = proposal.tokens_BT[:, chains]
    valid_BKN = proposal.valid_BKN
    if proposal.probs_BGV is not None and lay.num_chains == 1:
      drafts_BG = cands_BKN[:, 0]
      q_BG1V = jnp.concatenate([q_BTV[:, :1], q_BTV[:, chains[0]]], axis=1)
      # Every rule that takes num_valid_B gets it, the built-in ones and custom ones alike
      # (`verify_takes_num_valid`): rows proposing fewer than G drafts stay exact.
      num_valid_B = jnp.sum(valid_BKN[:, 0], axis=1).astype(jnp.int32)
      n_B, next_B = call_verify(self._verify, (key_B, drafts_BG, proposal.probs_BGV, q_BG1V),
                                num_valid_B)
      return jnp.zeros_like(n_B), n_B, next_B
    if proposal.probs_BGV is not None:
      raise ValueError("proposal distributions are supported for one chain only (K = 1)")
    if self.sampling.is_greedy:
      best_BT = argmax_first(q_BTV)
      return greedy_candidates_verify(cands_BKN, valid_BKN, best_BT[:, 0], best_BT[:, chains])
    return self.candidates_fn(key_B, cands_BKN, valid_BKN, q_BTV[:, 0], q_BTV[:, chains])

  def step(self, target_params, draft_params, state: DecodeState,
           gamma_costs: Optional[jax.Array] = None) -> DecodeState:
    """One iteration; `gamma_costs` (`[len(Γ)]`) for an adaptive decoder (which runs the
    branch its state chose, then chooses the next)."""
    if self.adaptive is None:
      return self._iterate(target_params, draft_params, state)[0]
    if gamma_costs is None:
      raise ValueError("an adaptive decoder's step needs gamma_costs (one per γ of Γ)")

    def one(i, st):
      if self.adaptive.gammas[i]:
        st = self.catch_up(draft_params, st)
      return self._adaptive_iteration(i, target_params, draft_params, st, gamma_costs)

    return jax.lax.switch(state.adapt.branch, [
        functools.partial(one, i) for i in range(len(self.adaptive.gammas))], state)

  def catch_up(self, draft_params, state: DecodeState) -> DecodeState:
    """A drafter that `catches_up` reads the committed tokens it missed during plain steps, in
    calls of max Γ + 1 tokens (the writes stay within the room the caches keep for one
    iteration's drafts); others are returned as they are."""
    drafter = self.drafter
    if not drafter.catches_up:
      return state
    width = self.adaptive.max_gamma + 1
    buf = state.tokens.shape[1]

    def lagging(st):
      return ~st.done & (st.adapt.synced_B < st.seq_len - 1)

    def feed(st):
      start_B = st.adapt.synced_B
      # Generated token j sits at stream position seq_len - out_len + 1 + j.
      j_BC = start_B[:, None] - (st.seq_len - st.out_len + 1)[:, None] + jnp.arange(width)[None]
      tokens_BC = jnp.take_along_axis(st.tokens, jnp.clip(j_BC, 0, buf - 1), axis=1)
      lag_B = lagging(st)
      draft_state = drafter.feed(draft_params, st.draft_cache, tokens_BC, start_B)
      synced_B = jnp.where(lag_B, jnp.minimum(start_B + width, st.seq_len - 1), start_B)
      stats = st.stats.replace(draft_calls=st.stats.draft_calls + lag_B.astype(jnp.int32))
      return st.replace(draft_cache=draft_state, stats=stats,
                        adapt=st.adapt.replace(synced_B=synced_B))

    return jax.lax.while_loop(lambda st: jnp.any(lagging(st)), feed, state)

  def choose(self, draft_params, state: DecodeState, gamma_costs: jax.Array) -> DecodeState:
    """The state with the next γ (`state.adapt.branch`) and each row's valid drafts
    (`limit_B`), chosen from the state alone."""
    ad = self.adaptive
    left_B = self.max_new_tokens - state.out_len   # the batch's "finish" objective
    if not self.drafter.offers_room:
      branch, limit_B = adapt_lib.choose(ad, state.adapt, gamma_costs, ~state.done,
                                         left_B=left_B)
      return state.replace(adapt=state.adapt.replace(branch=branch, limit_B=limit_B))
    # The drafts each row would send, one past max Γ: they size the call, and the one after the
    # row's valid drafts is kept to compare with the target's token (`adaptive.observe`).
    room_B, drafts_BW = self.drafter.preview(draft_params, state.draft_cache,
                                             _draft_input(state), ad.max_gamma + 1)
    branch, limit_B = adapt_lib.choose(ad, state.adapt, gamma_costs, ~state.done,
                                       jnp.minimum(room_B, ad.max_gamma), left_B)
    peek_B = jnp.where(room_B > limit_B,
                       jnp.take_along_axis(drafts_BW, limit_B[:, None], axis=1)[:, 0], -1)
    return state.replace(adapt=state.adapt.replace(branch=branch, limit_B=limit_B,
                                                   peek_B=peek_B.astype(jnp.int32)))

  def _adaptive_iteration(self, index: int, target_params, draft_params, state: DecodeState,
                          gamma_costs: jax.Array) -> DecodeState:
    """One iteration at γ = Γ[index] (static), its observation, the next choice."""
    ad = self.adaptive
    g = ad.gammas[index]
    active_B = ~state.done
    if g == 0:
      new, n_B, valid_B = self._plain_iterate(target_params, draft_params, state)
      synced_B = state.adapt.synced_B
    else:
      dec = dataclasses.replace(self, gamma=g, adaptive=None)
      new, n_B, valid_B = dec._iterate(target_params, draft_params, state, state.adapt.limit_B)
      synced_B = new.seq_len - 1   # a proposal leaves the drafter holding all but the last
    # The target's token after the accepted drafts (unknown where the row finished).
    next_B = jnp.where(new.done, -1, new.pending) if self.drafter.offers_room else None
    adapt = adapt_lib.observe(ad, state.adapt, n_B, valid_B, active_B, state.step, next_B)
    new = new.replace(adapt=adapt.replace(synced_B=synced_B))
    return self.choose(draft_params, new, gamma_costs)

  def adaptive_loop(self, target_params, draft_params, state: DecodeState,
                    gamma_costs: jax.Array) -> DecodeState:
    """The adaptive decoder's loop, in segments: an outer `while_loop` dispatches
    (`lax.switch`) to an inner `while_loop` at one γ, which runs while the choice stays there.
    Inside a segment the caches are updated in place; XLA copies loop-carried buffers that a
    conditional's branch writes, so only a change of γ pays a copy of the caches.

    At γ = 0 nothing is observed, so the choice changes only through the idle decay (and rows
    finishing): the segment runs blocks of up to `plain_block` plain steps and revisits the
    choice after each, with the whole block's decay. A drafter that `offers_room` (prompt
    lookup) is asked at every step, each plain step observing whether its first draft would
    have been accepted. Where drafting cannot pay even at the estimate's ceiling
    (`adaptive.may_draft`), the block runs to the end or to the next retry
    (`adaptive.steps_to_retry`)."""
    max_iters = self.max_new_tokens
    ad = self.adaptive
    n = len(ad.gammas)

    def running(s):
      return (s.step < max_iters) & ~jnp.all(s.done)

    block = ad.plain_block

    def plain_block(st):
      if self.drafter.offers_room:
        # Its drafts change token by token: one observed step at a time.
        return self._adaptive_iteration(ad.gammas.index(0), target_params, draft_params, st,
                                        gamma_costs)
      start, calls_B = st.step, st.stats.target_calls
      # No γ > 0 can pay even at the estimate's ceiling: plain decoding to the end.
      end = jnp.where(adapt_lib.may_draft(ad, st.adapt, gamma_costs, ~st.done,
                                          max_iters - st.step),
                      start + block, max_iters)
      # ... until a row's retry falls due (`adaptive.steps_to_retry`).
      end = jnp.minimum(end, start + jnp.maximum(
          adapt_lib.steps_to_retry(ad, st.adapt, gamma_costs, ~st.done), 1))
      st = jax.lax.while_loop(
          lambda x: running(x) & (x.step < end),
          lambda x: self._plain_iterate(target_params, draft_params, x)[0], st)
      return self.choose(draft_params, st.replace(adapt=adapt_lib.idle_block(
          ad, st.adapt, start, st.step, st.stats.target_calls - calls_B)), gamma_costs)

    def segment(index):
      def run(s):
        if not ad.gammas[index]:
          return jax.lax.while_loop(lambda st: running(st) & (st.adapt.branch == index),
                                    plain_block, s)
        s = self.catch_up(draft_params, s)
        return jax.lax.while_loop(
            lambda st: running(st) & (st.adapt.branch == index),
            functools.partial(self._adaptive_iteration, index, target_params, draft_params,
                              gamma_costs=gamma_costs), s)
      return run

    state = self.choose(draft_params, state, gamma_costs)
    if ad.gammas[0] == 0:
      # A first plain segment outside the dispatch: a run that never drafts copies no caches.
      state = segment(0)(state)
    return jax.lax.while_loop(
        running, lambda s: jax.lax.switch(s.adapt.branch, [segment(i) for i in range(n)], s),
        state)

  def _plain_iterate(self, target_params, draft_params, state: DecodeState):
    """γ = 0 of an adaptive loop: one target step; the drafter sees the commit (`update`)
    unless it `catches_up` later. Returns (state, accepted_B, valid_B) as `_iterate`."""
    drafter = self.drafter
    active_B = ~state.done
    keys_B2 = _iteration_keys(state)
    draft_state = state.draft_cache
    target_cache = state.target_cache.replace(lengths=state.seq_len)
    hidden_B1X = None
    if drafter.needs_hidden:   # the drafter's update reads the target's state at the token
      kw = {"layers": drafter.hidden_layers} if drafter.hidden_layers else {}
      logits_B1V, hidden_B1X, target_cache = self.target.extend_with_hidden(
          target_params, state.pending[:, None], target_cache, **kw)
    else:
      logits_B1V, target_cache = self.target.extend(target_params, state.pending[:, None],
                                                    target_cache)
    # The verifier's first uniform, as a row with no valid drafts draws in any branch.
    u_B = row_uniforms(keys_B2[:, 1], 1)[:, 0]
    q_BV = process_logits(logits_B1V[:, 0], self.sampling)
    next_B = draw(u_B, q_BV, self.sampling)
    state, count_B = _commit(state, next_B[:, None], jnp.ones_like(next_B),
                             self.max_new_tokens, self.eos_id)
    zero_B = jnp.zeros_like(count_B)
    feedback = DraftFeedback(
        committed_BC=next_B[:, None], count_B=count_B, seq_len_B=state.seq_len,
        pending_B=state.pending, target_argmax_BT=argmax_first(logits_B1V), chain_B=zero_B,
        accepted_B=zero_B, target_hidden_BE=None if hidden_B1X is None else hidden_B1X[:, 0],
        target_hidden_BCX=hidden_B1X)
    if not drafter.catches_up:
      draft_state = drafter.update(draft_params, draft_state, feedback)
    a = active_B.astype(jnp.int32)
    s = state.stats
    stats = s.replace(
        target_calls=s.target_calls + a,
        draft_calls=s.draft_calls + drafter.calls_per_iteration(0) * a,
        accepted_hist=s.accepted_hist.at[:, 0].add(a),
        nonfinite=s.nonfinite + _count_nonfinite(self, logits_B1V, q_BV[:, None]) * a)
    state = state.replace(step=state.step + 1, target_cache=target_cache,
                          draft_cache=draft_state, stats=stats)
    return state, zero_B, zero_B

  def _iterate(self, target_params, draft_params, state: DecodeState,
               limit_B: Optional[jax.Array] = None):
    """One iteration at `self.gamma`; row b proposes at most `limit_B[b]` drafts (None: all).
    Returns (state, accepted_B, valid_B)."""
    lay, drafter = self.layout, self.drafter
    n = lay.chain_len
    active_B = ~state.done
    keys_B2 = _iteration_keys(state)
    # A chain drafter draws token j with u[:, j]; a tree drafter one per node.
    u_BG = (None if drafter.deterministic else
            row_uniforms(keys_B2[:, 0], lay.length if lay.is_tree else n))
    proposal, draft_state = drafter.propose(draft_params, state.draft_cache, _draft_input(state),
                                            u_BG, self.sampling, self.gamma)
    if limit_B is not None and proposal.valid_BKN is None:   # a static tree: its top levels
      depth_T = jnp.asarray(np.asarray(lay.offsets_T), jnp.int32)
      proposal = proposal.replace(
          node_valid_BT=proposal.node_valid_BT & (depth_T[None, :] <= limit_B[:, None]))
    elif limit_B is not None:
      keep_BKN = jnp.arange(n)[None, None, :] < limit_B[:, None, None]
      proposal = proposal.replace(valid_BKN=proposal.valid_BKN & keep_BKN)
    target_cache = state.target_cache.replace(lengths=state.seq_len)
    kw = {}
    depths_BT = children_BTC = None
    if lay.dynamic_tree is not None:  # each row's own tree
      depths_BT, kw["mask_TT"], children_BTC = dynamic_tree_arrays(proposal.node_parents_BT,
                                                                   lay.dynamic_tree[1])
      kw["positions_BT"] = state.seq_len[:, None] + depths_BT
    if lay.offsets_T is not None:
      kw["positions_BT"] = state.seq_len[:, None] + jnp.asarray(lay.offsets_T, jnp.int32)[None]
    if lay.mask_TT is not None:
      kw["mask_TT"] = jnp.asarray(lay.mask_TT, bool)
    hidden_BTE = None
    if drafter.needs_hidden:
      if drafter.hidden_layers:
        kw["layers"] = drafter.hidden_layers
      logits_BTV, hidden_BTE, target_cache = self.target.extend_with_hidden(
          target_params, proposal.tokens_BT, target_cache, **kw)
    else:
      logits_BTV, target_cache = self.target.extend(target_params, proposal.tokens_BT,
                                                    target_cache, **kw)
    q_BTV = process_logits(logits_BTV, self.sampling)
    slots_BN, n_B, next_B, chain_B = self._verify_call(keys_B2[:, 1], proposal, q_BTV,
                                                       children_BTC)
    chain_tokens_BN = jnp.take_along_axis(proposal.tokens_BT, slots_BN, axis=1)
    j_N1 = jnp.arange(n + 1)[None]
    new_BN1 = jnp.where(j_N1 < n_B[:, None], jnp.pad(chain_tokens_BN, ((0, 0), (0, 1))),
                        next_B[:, None])
    seq_before_B = state.seq_len
    state, count_B = _commit(state, new_BN1, n_B + 1, self.max_new_tokens, self.eos_id)
    if not lay.is_plain_chain:
      # Move the accepted tokens' keys and values from their call slots to right after the
      # pending token (rows with nothing to move copy onto themselves or past their length).
      target_cache = self.target.copy_slots(target_cache, seq_before_B[:, None] + slots_BN,
                                            seq_before_B + 1)
    last_hidden = path_hidden = None
    if hidden_BTE is not None:  # at the root, then at each accepted token
      at_BC = jnp.concatenate([jnp.zeros_like(slots_BN[:, :1]), slots_BN], axis=1)
      path_hidden = jnp.take_along_axis(hidden_BTE, at_BC[:, :, None], axis=1)
      last_hidden = jnp.take_along_axis(path_hidden, n_B[:, None, None], axis=1)[:, 0]
    feedback = DraftFeedback(
        committed_BC=new_BN1, count_B=count_B, seq_len_B=state.seq_len, pending_B=state.pending,
        target_argmax_BT=argmax_first(logits_BTV), chain_B=chain_B,
        accepted_B=n_B, target_hidden_BE=last_hidden, target_hidden_BCX=path_hidden)
    draft_state = drafter.update(draft_params, draft_state, feedback)
    a = active_B.astype(jnp.int32)
    if lay.is_tree:  # the deepest valid node
      depths = (depths_BT if depths_BT is not None
                else jnp.asarray(np.asarray(lay.offsets_T), jnp.int32)[None])
      drafted_B = jnp.max(jnp.where(proposal.node_valid_BT, depths, 0), axis=1)
    else:
      drafted_B = jnp.max(jnp.sum(proposal.valid_BKN, axis=2), axis=1)
    drafted_B = drafted_B.astype(jnp.int32)
    calls = drafter.calls_per_iteration(self.gamma)
    s = state.stats
    stats = s.replace(
        target_calls=s.target_calls + a, draft_calls=s.draft_calls + calls * a,
        drafted=s.drafted + drafted_B * a, accepted=s.accepted + n_B * a,
        accepted_hist=s.accepted_hist + jax.nn.one_hot(
            n_B, s.accepted_hist.shape[1], dtype=jnp.int32) * a[:, None],
        nonfinite=s.nonfinite + _count_nonfinite(self, logits_BTV, q_BTV) * a)
    state = state.replace(step=state.step + 1, target_cache=target_cache,
                          draft_cache=draft_state, stats=stats)
    return state, n_B, drafted_B

  def run(self, target_params, draft_params, prompts_BP, lengths_B, keys_B, target_cache,
          draft_cache, prefilled: Optional[Prefill] = None,
          gamma_costs: Optional[jax.Array] = None,
          acceptance: Optional[adapt_lib.Acceptance] = None) -> GenerationOutput:
    """`prefilled` (donated): decode from it (`target_cache` None). `gamma_costs`: an adaptive
    decoder's cost per iteration at each γ of Γ (data: new costs reuse the compiled program);
    `acceptance`: its carried estimate (`specjax.adaptive`; None: the prior)."""
    if self.adaptive is not None:
      if gamma_costs is None:
        raise ValueError(f"an adaptive decoder needs gamma_costs: one cost per γ of "
                         f"{self.adaptive.gammas} (specjax.calibration)")
      gamma_costs = jnp.asarray(adapt_lib.check_costs(self.adaptive, gamma_costs))
    elif gamma_costs is not None or acceptance is not None:
      raise ValueError("gamma_costs and acceptance are for an adaptive decoder "
                       "(adaptive=AdaptiveGamma(...))")
    with decode_mesh(target_params):
      return speculative_loop(self, target_params, draft_params, prompts_BP, lengths_B, keys_B,
                              target_cache, draft_cache, _without_origin(prefilled),
                              gamma_costs, acceptance)


def _uncached_takes_num_valid(fn: Callable) -> Optional[str]:
  try:
    sig = inspect.signature(fn)
  except (TypeError, ValueError):   # no signature to read: called with the four arguments
    return None
  for mode, args, kw in (("keyword", (0,) * 4, {"num_valid_B": 0}), ("positional", (0,) * 5, {})):
    try:
      sig.bind(*args, **kw)
    except TypeError:
      continue
    return mode
  return None


@functools.lru_cache(maxsize=256)
def _cached_takes_num_valid(fn: Callable) -> Optional[str]:
  return _uncached_takes_num_valid(fn)


def verify_takes_num_valid(fn: Callable) -> Optional[str]:
  """How the verify rule `fn` takes `num_valid_B` (the protocol of `specjax.verify`, as
  `rejection_verify` takes it): "keyword" where it accepts `num_valid_B=` (a parameter of that
  name or **kwargs), "positional" where it accepts a fifth positional argument (e.g.
  `lambda *a: rejection_verify(*a)`), None where it takes only the four (it then sees every
  row's G drafts as proposed)."""
  try:
    return _cached_takes_num_valid(fn)
  except TypeError:  # unhashable callable
    return _uncached_takes_num_valid(fn)


def call_verify(fn: Callable, args: tuple, num_valid_B: jax.Array):
  """`fn(*args)` with `num_valid_B` passed as `fn` takes it (`verify_takes_num_valid`); its
  result checked (`check_verify_result`)."""
  mode = verify_takes_num_valid(fn)
  if mode == "keyword":
    out = fn(*args, num_valid_B=num_valid_B)
  elif mode == "positional":
    out = fn(*args, num_valid_B)
  else:
    out = fn(*args)
  return check_verify_result(fn, out, args[1].shape[0], args[1].shape[1])


def check_verify_result(fn: Callable, out: Any, batch: int, gamma: int):
  """`out` when it is what a verify rule returns: `(accepted_B, next_B)`, two integer arrays of
  shape `[B]` (accepted counts in [0, G], the token after them); else a ValueError / TypeError
  naming `verify_fn` and what it returned (shapes and dtypes are static: checked at trace time)."""
  name = _fn_name(fn)
  if not isinstance(out, (tuple, list)) or len(out) != 2:
    what = (f"{len(out)} values" if isinstance(out, (tuple, list))
            else f"{type(out).__name__} {getattr(out, 'shape', '')}".strip())
    raise TypeError(f"verify_fn={name} must return (accepted_B, next_B), two int arrays of "
                    f"shape [{batch}], got {what}")
  for what, x in zip(("accepted_B", "next_B"), out):
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape != (batch,) or dtype is None or not jnp.issubdtype(dtype, jnp.integer):
      raise ValueError(f"verify_fn={name} must return (accepted_B, next_B), two int arrays of "
                       f"shape [{batch}] (accepted_B in [0, {gamma}]), got {what} of shape "
                       f"{shape} and dtype {dtype}")
  return out[0].astype(jnp.int32), out[1].astype(jnp.int32)


def _fn_name(fn: Callable) -> str:
  return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def check_verify_fn(drafter: Drafter, gamma: int, verify_fn: Callable,
                    adaptive: Optional[AdaptiveGamma] = None) -> None:
  """ValueError naming `verify_fn` where a rule other than `rejection_verify` would be ignored:
  the drafter's call at `gamma` is a token tree (`tree_fn` verifies it), several candidate
  chains or deterministic drafts (`candidates_fn`); or, with `adaptive` (rows may propose
  fewer drafts than γ), where the rule takes no `num_valid_B` (`verify_takes_num_valid`)."""
  if verify_fn is rejection_verify:
    return
  if not callable(verify_fn):
    raise TypeError(f"verify_fn must be callable, got {verify_fn!r}")
  try:
    inspect.signature(verify_fn).bind(*(0,) * 4)
  except TypeError:
    raise TypeError(f"verify_fn={_fn_name(verify_fn)} must take the four arguments (keys_B, "
                    "drafts_BG, draft_probs_BGV, target_probs_BG1V) and optionally num_valid_B "
                    "(specjax.rejection_verify's signature)") from None
  except ValueError:   # no signature to read (a builtin): called as it is
    pass
  name = type(drafter).__name__
  lay = drafter.layout(gamma)
  if lay.is_tree or drafter.deterministic or lay.num_chains != 1:
    what = ("a token tree" if lay.is_tree
            else "deterministic drafts (no proposal distributions)" if drafter.deterministic
            else f"{lay.num_chains} candidate chains")
    rule, default = (("tree_fn", "tree_verify") if lay.is_tree
                     else ("candidates_fn", "candidates_verify"))
    raise ValueError(
        f"verify_fn={_fn_name(verify_fn)} cannot apply to {name}: its call holds {what}, "
        f"verified by specjax.verify.{default}, never by verify_fn. Pass verify_fn only with a "
        "chain drafter whose drafts have distributions (a draft model, LayerSkip, WindowedKV, "
        f"PARD); to replace {name}'s rule use SpeculativeDecoder({rule}=...)")
  if adaptive is not None and verify_takes_num_valid(verify_fn) is None:
    raise ValueError(
        f"verify_fn={_fn_name(verify_fn)} takes no num_valid_B: with gamma='auto' a row may "
        "propose fewer drafts than the call holds, and a rule that cannot be told would verify "
        "the drafts it did not propose. Give it a num_valid_B parameter (int32 [B], None: all "
        "G valid) as specjax.rejection_verify has, or accept *args")


def check_adaptive(drafter: Drafter, ad: AdaptiveGamma) -> None:
  """Raises naming the drafter when it cannot change γ per iteration (cached per drafter and
  Γ: both static and hashable)."""
  if not isinstance(ad, AdaptiveGamma):
    raise TypeError(f"adaptive must be a specjax.adaptive.AdaptiveGamma, got {ad!r}")
  _check_adaptive_drafter(drafter, ad)


@functools.lru_cache(maxsize=256)
def _check_adaptive_drafter(drafter: Drafter, ad: AdaptiveGamma) -> None:
  name = type(drafter).__name__
  if not drafter.adaptive:
    raise ValueError(f"gamma='auto' needs a drafter that can change γ per iteration (a draft "
                     f"model, LayerSkip, WindowedKV, PromptLookup, PARD, Medusa, EAGLE over a "
                     f"static tree); {name} fixes its own call (a dynamic tree, a head or a γ "
                     "of its own): give it a fixed gamma")
  if drafter.gamma_limit is not None and ad.max_gamma > drafter.gamma_limit:
    raise ValueError(f"gamma='auto': Γ {ad.gammas} goes beyond the {drafter.gamma_limit} "
                     f"drafts {name} can make per iteration: use γ <= {drafter.gamma_limit}")
  for g in ad.gammas:
    lay = drafter.layout(g) if g else None
    if g and (lay.dynamic_tree is not None or lay.chain_len != g):
      raise ValueError(f"gamma='auto' needs a drafter whose call at γ drafts γ deep; {name}'s "
                       f"call at γ={g} drafts {lay.chain_len} deep")


def _draft_input(state: DecodeState) -> DraftInput:
  return DraftInput(seq_len_B=state.seq_len, pending_B=state.pending, prev_B=state.prev,
                    done_B=state.done, step=state.step)


def _iteration_keys(state: DecodeState) -> jax.Array:
  """`[B, 2]` per row and iteration: the drafter's key and the verifier's."""
  return jax.vmap(lambda k: jax.random.split(k, 2))(_fold_keys(state.keys, state.step + 1))


@jax.jit(static_argnums=0, donate_argnames=("cache", "prefilled"))
def autoregressive_loop(dec: AutoregressiveDecoder, params, prompts_BP, lengths_B, keys_B,
                        cache, prefilled=None, acceptance=None) -> GenerationOutput:
  """The jitted program of `AutoregressiveDecoder.run` (prefill, loop, finalize); `acceptance`:
  with `report_adaptive`, the carried estimate to report after the idle decay (None: prior)."""
  state = dec.init_state(params, prompts_BP, lengths_B, keys_B, cache, prefilled)
  state = _loop(lambda s: dec.step(params, s), state, dec.max_new_tokens)
  out = _finalize(state, dec.max_new_tokens, dec.pad_id)
  if dec.report_adaptive is not None:
    out = out.replace(stats=_as_plain_adaptive(out.stats, dec.report_adaptive,
                                               dec.max_new_tokens, acceptance))
  return out


def _as_plain_adaptive(stats: DecodeStats, ad: AdaptiveGamma, iterations: int,
                       acceptance: Optional[adapt_lib.Acceptance]) -> DecodeStats:
  """Plain decoding's stats as an adaptive loop that stayed at γ = 0 reports them: 0 of 0
  drafts accepted per iteration, γ 0 in the trace (`[iterations]`, -1 past the last; per-row
  mode: `[B, iterations]`, -1 past each row's last), the estimate idled."""
  it_B = stats.target_calls - 1    # the prefill is a target call
  hist = jnp.zeros((it_B.shape[0], ad.max_gamma + 1), jnp.int32).at[:, 0].set(it_B)
  if ad.per_row:
    trace = jnp.where(jnp.arange(iterations)[None] < it_B[:, None], 0, -1).astype(jnp.int32)
  else:
    trace = jnp.where(jnp.arange(iterations) < jnp.max(it_B), 0, -1).astype(jnp.int32)
  if acceptance is None:
    acceptance = adapt_lib.Acceptance.fresh()
  acceptance = adapt_lib.after_idle(ad, acceptance, it_B)
  return stats.replace(accepted_hist=hist, gamma_trace=trace, acceptance=acceptance)


@jax.jit(static_argnums=0, donate_argnames=("target_cache", "draft_cache", "prefilled"))
def speculative_loop(dec: SpeculativeDecoder, target_params, draft_params, prompts_BP,
                     lengths_B, keys_B, target_cache, draft_cache,
                     prefilled=None, gamma_costs=None, acceptance=None) -> GenerationOutput:
  """The jitted program of `SpeculativeDecoder.run` (prefill, loop, finalize)."""
  state = dec.init_state(target_params, draft_params, prompts_BP, lengths_B, keys_B,
                         target_cache, draft_cache, prefilled, acceptance)
  if dec.adaptive is not None:
    state = dec.adaptive_loop(target_params, draft_params, state, gamma_costs)
  else:
    state = _loop(lambda s: dec.step(target_params, draft_params, s), state,
                  dec.max_new_tokens)
  return _finalize(state, dec.max_new_tokens, dec.pad_id)
