"""Autoregressive and speculative generation: one jit, one `lax.while_loop`.

Both decoders are frozen (hashable) dataclasses holding the static choices;
their `init_state` / `step` / `finalize` are pure functions of explicit
state, and `run` (jitted, caches donated) is init + while_loop + finalize.
`specjax.generate` / `specjax.speculative_generate` validate the inputs and
call `run`.

Decoding state, per row b (see `protocol` for the decoder stream):

  * `seq_len[b]`: committed decoder positions held in the caches;
  * `pending[b]`: the last committed token, not yet fed to the target;
  * `prev[b]`: the token at position seq_len - 1 (the draft re-feeds it);
  * `out_len[b]`: generated tokens so far; `done[b]`: EOS or max reached.

The first token comes from the target's prefill logits. A speculative
iteration then, for all rows at once:

  1. draft: sets the draft's length to seq_len - 1 and feeds [prev, pending]
     (one T=2 call: the draft sees the corrected / bonus token of the last
     iteration and re-writes `prev`, which it may not hold yet), then G - 1
     single-token calls in a `lax.scan`; G drafts and their distributions;
  2. target: sets its length to seq_len and feeds [pending, d_1..d_G] once;
  3. `verify_fn` keeps n ≤ G drafts and gives the next token;
  4. commits n + 1 tokens per row (fewer at EOS / max_new_tokens), rolls both
     caches back per row by lengths alone — nothing is copied.

Randomness: row b draws everything from its own key: the prefill token from
fold_in(key_b, 0), iteration i from fold_in(key_b, i + 1) (split in two: the
draft's G uniforms in one PRNG call, the verifier's in another). With one key
per row, a row's output therefore does not depend on the rest of the batch.
Greedy decoding uses no random numbers: tokens are argmaxes, and with the
default verifier `greedy_verify` makes the same decisions as the rejection
rule on one-hot distributions. Each PRNG call is a rolled loop on XLA:CPU,
so the number of calls per iteration is kept constant (not growing with G).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Optional, Tuple

import jax
import jax.numpy as jnp
from flax import struct

from specjax.sampling import SamplingConfig, process_logits, row_uniforms, sample_from_uniform
from specjax.verify import greedy_verify, rejection_verify

__all__ = [
    "DecodeStats", "GenerationOutput", "DecodeState", "AutoregressiveDecoder",
    "SpeculativeDecoder", "trace_counts",
]

# How often each decoder's run was traced (a test asserts no retrace).
trace_counts: collections.Counter = collections.Counter()


@struct.dataclass
class DecodeStats:
  """Per-row counters (only iterations in which the row was still active).

  Attributes:
    target_calls: `[B]` target forward passes, the prefill included.
    draft_calls: `[B]` draft forward passes after prefill (G per iteration).
    drafted: `[B]` draft tokens proposed.
    accepted: `[B]` draft tokens accepted.
    accepted_hist: `[B, G + 1]` iterations that accepted exactly k drafts —
      the acceptance per draft position: P(position i accepted) =
      sum(hist[k] for k >= i) / sum(hist).
  """

  target_calls: jax.Array
  draft_calls: jax.Array
  drafted: jax.Array
  accepted: jax.Array
  accepted_hist: jax.Array

  @classmethod
  def zeros(cls, batch: int, gamma: int) -> "DecodeStats":
    z = jnp.zeros((batch,), jnp.int32)
    return cls(z, z, z, z, jnp.zeros((batch, gamma + 1), jnp.int32))


@struct.dataclass
class GenerationOutput:
  """What `generate` / `speculative_generate` return.

  Attributes:
    tokens: int32 `[B, max_new_tokens]`; slots past `lengths` hold pad_id.
    lengths: int32 `[B]` generated tokens per row (EOS included).
    stats: `DecodeStats`.
    target_cache / draft_cache: the final caches (donated inputs come back
      here and can be passed to the next call); draft_cache is None for
      autoregressive decoding.
  """

  tokens: jax.Array
  lengths: jax.Array
  stats: DecodeStats
  target_cache: Any = None
  draft_cache: Any = None

  @property
  def acceptance_rate(self) -> float:
    """Accepted / drafted over the whole batch."""
    drafted = int(jnp.sum(self.stats.drafted))
    return float(jnp.sum(self.stats.accepted)) / drafted if drafted else float("nan")

  @property
  def mean_tokens_per_iteration(self) -> float:
    """Mean of (accepted + 1) over speculative iterations: the measured
    counterpart of theory.expected_tokens_per_call (before EOS/max cuts)."""
    hist = jnp.sum(self.stats.accepted_hist, axis=0)
    n = int(jnp.sum(hist))
    return float(jnp.sum(hist * (jnp.arange(hist.shape[0]) + 1))) / n if n else float("nan")

  @property
  def tokens_per_target_call(self) -> float:
    """Generated tokens / target forward passes (prefill included), whole batch."""
    return float(jnp.sum(self.lengths)) / float(jnp.sum(self.stats.target_calls))


@struct.dataclass
class DecodeState:
  """Loop state shared by both decoders (shapes per `protocol`).

  tokens `[B, N + C]` output buffer (C = tokens one step can commit),
  out_len / seq_len / pending / prev `[B]` int32, done `[B]` bool,
  keys `[B]` typed PRNG keys, step `[]` int32, caches, stats.
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


def _fold_keys(keys_B: jax.Array, data) -> jax.Array:
  return jax.vmap(lambda k: jax.random.fold_in(k, data))(keys_B)


def _draw(u_B: jax.Array, probs_BV: jax.Array, sampling: SamplingConfig) -> jax.Array:
  """One token per row: the argmax for greedy (the one-hot's only token; no
  random numbers are then computed at all), else an inverse-CDF draw."""
  if sampling.is_greedy:
    return jnp.argmax(probs_BV, axis=-1).astype(jnp.int32)
  return sample_from_uniform(u_B, probs_BV)


def _commit(state: DecodeState, new_BC: jax.Array, count_B: jax.Array, max_new: int,
            eos_id: Optional[int]) -> Tuple[DecodeState, jax.Array]:
  """Appends the first count_B[b] of new_BC[b] to each active row's output,
  cut at EOS and at max_new. Returns the state (caches untouched) and the
  committed counts (0 for done rows)."""
  c = new_BC.shape[1]
  j_C = jnp.arange(c)
  if eos_id is not None:
    is_eos_BC = (new_BC == eos_id) & (j_C[None] < count_B[:, None])
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


def _prefill(model, params, sampling, prompts_BP, lengths_B, cache, keys_B):
  logits_BV, last_B, cache = model.prefill(params, prompts_BP, lengths_B, cache)
  u_B = row_uniforms(_fold_keys(keys_B, 0), 1)[:, 0]
  first_B = _draw(u_B, process_logits(logits_BV, sampling), sampling)
  return first_B, last_B, cache


def _initial_state(first_B, last_B, target_cache, draft_cache, keys_B, max_new, width,
                   gamma, pad_id, eos_id) -> DecodeState:
  b = first_B.shape[0]
  tokens = jnp.full((b, max_new + width), pad_id, jnp.int32).at[:, 0].set(first_B)
  done = jnp.full((b,), max_new <= 1)
  if eos_id is not None:
    done = done | (first_B == eos_id)
  stats = DecodeStats.zeros(b, gamma)
  stats = stats.replace(target_calls=stats.target_calls + 1)
  return DecodeState(
      step=jnp.zeros((), jnp.int32), tokens=tokens, out_len=jnp.ones((b,), jnp.int32),
      seq_len=target_cache.lengths.astype(jnp.int32), pending=first_B, prev=last_B,
      done=done, keys=keys_B, target_cache=target_cache, draft_cache=draft_cache,
      stats=stats)


def _finalize(state: DecodeState, max_new: int, pad_id: int) -> GenerationOutput:
  tokens = state.tokens[:, :max_new]
  tokens = jnp.where(jnp.arange(max_new)[None] < state.out_len[:, None], tokens, pad_id)
  return GenerationOutput(tokens=tokens, lengths=state.out_len, stats=state.stats,
                          target_cache=state.target_cache, draft_cache=state.draft_cache)


def _loop(step_fn, state: DecodeState, max_iters: int) -> DecodeState:
  return jax.lax.while_loop(
      lambda s: (s.step < max_iters) & ~jnp.all(s.done), step_fn, state)


@dataclasses.dataclass(frozen=True)
class AutoregressiveDecoder:
  """Plain decoding: one target call per token. Static configuration."""

  model: Any
  sampling: SamplingConfig
  max_new_tokens: int
  eos_id: Optional[int] = None
  pad_id: int = 0

  def init_state(self, params, prompts_BP, lengths_B, keys_B, cache) -> DecodeState:
    first_B, last_B, cache = _prefill(self.model, params, self.sampling, prompts_BP,
                                      lengths_B, cache, keys_B)
    return _initial_state(first_B, last_B, cache, None, keys_B, self.max_new_tokens, 1, 0,
                          self.pad_id, self.eos_id)

  def step(self, params, state: DecodeState) -> DecodeState:
    active_B = ~state.done
    cache = state.target_cache.replace(lengths=state.seq_len)
    logits_B1V, cache = self.model.extend(params, state.pending[:, None], cache)
    u_B = row_uniforms(_fold_keys(state.keys, state.step + 1), 1)[:, 0]
    next_B = _draw(u_B, process_logits(logits_B1V[:, 0], self.sampling), self.sampling)
    state, _ = _commit(state, next_B[:, None], jnp.ones_like(next_B), self.max_new_tokens,
                       self.eos_id)
    a = active_B.astype(jnp.int32)
    stats = state.stats.replace(target_calls=state.stats.target_calls + a)
    return state.replace(step=state.step + 1, target_cache=cache, stats=stats)

  def run(self, params, prompts_BP, lengths_B, keys_B, cache) -> GenerationOutput:
    return _run_autoregressive(self, params, prompts_BP, lengths_B, keys_B, cache)


@dataclasses.dataclass(frozen=True)
class SpeculativeDecoder:
  """Draft-then-verify decoding with γ = `gamma` drafts per iteration."""

  target: Any
  draft: Any
  gamma: int
  sampling: SamplingConfig
  max_new_tokens: int
  eos_id: Optional[int] = None
  pad_id: int = 0
  verify_fn: Callable = rejection_verify

  def init_state(self, target_params, draft_params, prompts_BP, lengths_B, keys_B,
                 target_cache, draft_cache) -> DecodeState:
    first_B, last_B, target_cache = _prefill(self.target, target_params, self.sampling,
                                             prompts_BP, lengths_B, target_cache, keys_B)
    _, _, draft_cache = self.draft.prefill(draft_params, prompts_BP, lengths_B, draft_cache)
    return _initial_state(first_B, last_B, target_cache, draft_cache, keys_B,
                          self.max_new_tokens, self.gamma + 1, self.gamma, self.pad_id,
                          self.eos_id)

  @property
  def _verify(self) -> Callable:
    # Temperature 0 with the default rule: the same decisions without random numbers.
    if self.sampling.is_greedy and self.verify_fn is rejection_verify:
      return greedy_verify
    return self.verify_fn

  def draft_tokens(self, draft_params, state: DecodeState, u_BG):
    """Runs the draft γ steps (draft i drawn with the uniform `u_BG[:, i]`);
    returns drafts `[B, G]`, their distributions `[B, G, V]` and the draft
    cache."""
    g = self.gamma
    cache = state.draft_cache.replace(lengths=state.seq_len - 1)
    logits_B2V, cache = self.draft.extend(
        draft_params, jnp.stack([state.prev, state.pending], axis=1), cache)
    p1_BV = process_logits(logits_B2V[:, 1], self.sampling)
    d1_B = _draw(u_BG[:, 0], p1_BV, self.sampling)

    def one_step(carry, u_B):
      tok_B, c = carry
      logits_B1V, c = self.draft.extend(draft_params, tok_B[:, None], c)
      p_BV = process_logits(logits_B1V[:, 0], self.sampling)
      d_B = _draw(u_B, p_BV, self.sampling)
      return (d_B, c), (d_B, p_BV)

    (_, cache), (ds_GB, ps_GBV) = jax.lax.scan(
        one_step, (d1_B, cache), jnp.swapaxes(u_BG[:, 1:g], 0, 1))
    drafts_BG = jnp.concatenate([d1_B[:, None], jnp.swapaxes(ds_GB, 0, 1)], axis=1)
    probs_BGV = jnp.concatenate([p1_BV[:, None], jnp.swapaxes(ps_GBV, 0, 1)], axis=1)
    return drafts_BG, probs_BGV, cache

  def step(self, target_params, draft_params, state: DecodeState) -> DecodeState:
    g = self.gamma
    active_B = ~state.done
    # Per row and iteration: one key for the draft's G uniforms, one for the verifier.
    keys_B2 = jax.vmap(lambda k: jax.random.split(k, 2))(_fold_keys(state.keys, state.step + 1))
    u_BG = row_uniforms(keys_B2[:, 0], g)
    drafts_BG, p_BGV, draft_cache = self.draft_tokens(draft_params, state, u_BG)
    target_cache = state.target_cache.replace(lengths=state.seq_len)
    logits_BG1V, target_cache = self.target.extend(
        target_params, jnp.concatenate([state.pending[:, None], drafts_BG], axis=1), target_cache)
    q_BG1V = process_logits(logits_BG1V, self.sampling)
    n_B, next_B = self._verify(keys_B2[:, 1], drafts_BG, p_BGV, q_BG1V)
    j_G1 = jnp.arange(g + 1)[None]
    new_BG1 = jnp.where(j_G1 < n_B[:, None], jnp.pad(drafts_BG, ((0, 0), (0, 1))), next_B[:, None])
    state, _ = _commit(state, new_BG1, n_B + 1, self.max_new_tokens, self.eos_id)
    a = active_B.astype(jnp.int32)
    s = state.stats
    stats = s.replace(
        target_calls=s.target_calls + a, draft_calls=s.draft_calls + g * a,
        drafted=s.drafted + g * a, accepted=s.accepted + n_B * a,
        accepted_hist=s.accepted_hist + jax.nn.one_hot(n_B, g + 1, dtype=jnp.int32) * a[:, None])
    return state.replace(step=state.step + 1, target_cache=target_cache,
                         draft_cache=draft_cache, stats=stats)

  def run(self, target_params, draft_params, prompts_BP, lengths_B, keys_B, target_cache,
          draft_cache) -> GenerationOutput:
    return _run_speculative(self, target_params, draft_params, prompts_BP, lengths_B, keys_B,
                            target_cache, draft_cache)


@jax.jit(static_argnums=0, donate_argnames=("cache",))
def _run_autoregressive(dec: AutoregressiveDecoder, params, prompts_BP, lengths_B, keys_B,
                        cache) -> GenerationOutput:
  trace_counts["generate"] += 1
  state = dec.init_state(params, prompts_BP, lengths_B, keys_B, cache)
  state = _loop(lambda s: dec.step(params, s), state, dec.max_new_tokens)
  return _finalize(state, dec.max_new_tokens, dec.pad_id)


@jax.jit(static_argnums=0, donate_argnames=("target_cache", "draft_cache"))
def _run_speculative(dec: SpeculativeDecoder, target_params, draft_params, prompts_BP,
                     lengths_B, keys_B, target_cache, draft_cache) -> GenerationOutput:
  trace_counts["speculative_generate"] += 1
  state = dec.init_state(target_params, draft_params, prompts_BP, lengths_B, keys_B,
                         target_cache, draft_cache)
  state = _loop(lambda s: dec.step(target_params, draft_params, s), state, dec.max_new_tokens)
  return _finalize(state, dec.max_new_tokens, dec.pad_id)
