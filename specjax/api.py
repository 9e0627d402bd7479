"""`generate` and `speculative_generate`: validated entry points.

Every shape and value is checked here, on the host, before the jitted loop runs, so misuse gets a
ValueError/TypeError naming the argument rather than an XLA error (or a silent clamp).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import warnings
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from specjax._checks import INT32_MAX, check_int, check_memory, check_prompts, is_concrete
from specjax.adaptive import (Acceptance, AdaptiveGamma, check_acceptance, check_costs,
                              prior_may_draft, probe_due)
from specjax.calibration import resolve_gamma_costs
from specjax.compiled import enforce_limit
from specjax.drafters.model import ModelDrafter
from specjax.drafters.suffix import SuffixCorpus
from specjax.drafting import Drafter
from specjax.generation import (AutoregressiveDecoder, EosIds, GenerationOutput, Prefill,
                                PrefillOrigin, SpeculativeDecoder, check_adaptive,
                                check_verify_fn, run_prefill)
from specjax.parallel.sharding import decode_mesh, params_mesh, place_cache_like, place_state
from specjax.protocol import check_model, check_params, required_cache_len
from specjax.sampling import SamplingConfig
from specjax.verify import rejection_verify

__all__ = ["generate", "speculative_generate", "plan_speculative", "SpeculativePlan", "prefill",
           "required_cache_len"]

_NONFINITE = ("raise", "warn", "ignore")
_MAX_SLOTS = INT32_MAX  # cache positions and lengths are int32
_DEFAULT_GAMMA = 4  # `speculative_generate`'s γ when none is given (and the drafter fixes none)
_MEMORY_ADVICE = ("Lower max_new_tokens, cache_len or the batch, or state the memory the call may "
                  "use in SPECJAX_MEMORY_LIMIT_BYTES")


@functools.lru_cache(maxsize=64)
def _default_keys(batch: int) -> jax.Array:
  """Greedy decoding's keys (unused by its draws): made once per batch size."""
  return jax.random.split(jax.random.key(0), batch)


def _row_keys(key, batch: int, sampling: SamplingConfig) -> jax.Array:
  if key is None:
    if not sampling.is_greedy:
      raise ValueError("key is required when sampling (temperature > 0); pass "
                       "jax.random.key(seed) or one key per row")
    return _default_keys(batch)
  if not isinstance(key, jax.Array):
    try:
      key = jnp.asarray(key)
    except (TypeError, ValueError):
      raise TypeError(f"key must be a PRNG key (jax.random.key / PRNGKey) or one per row, got "
                      f"{key!r} ({type(key).__name__})") from None
  if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    if key.dtype != jnp.uint32 or key.ndim not in (1, 2):
      raise TypeError(f"key must be a PRNG key (jax.random.key / PRNGKey) or one per row, got "
                      f"dtype {key.dtype} shape {tuple(key.shape)}")
    try:
      key = jax.random.wrap_key_data(key)
    except (TypeError, ValueError):  # not the default PRNG's key shape
      one = tuple(jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))).shape)
      raise TypeError(f"key must be a PRNG key (jax.random.key / PRNGKey) or one per row: "
                      f"uint32 key data of shape {one} or {(batch,) + one}, got shape "
                      f"{tuple(key.shape)}") from None
  if key.ndim == 0:
    return jax.random.split(key, batch)
  if key.shape == (batch,):
    return key
  raise ValueError(f"key must be a single key or one key per row (shape ({batch},)), "
                   f"got key shape {tuple(key.shape)}")


def _check_cache(name, model, cache, batch, prompt_len, max_new, gamma, cache_len, params=None,
                 allocate: bool = True):
  """`cache` checked, or (None) one allocated for these sizes (`allocate` False: only
  `cache_len` checked and the slots to allocate returned)."""
  need = required_cache_len(model, prompt_len, max_new, gamma)
  if cache is None:
    if need > _MAX_SLOTS:
      raise ValueError(
          f"prompt ({prompt_len} tokens → {model.prefill_positions(prompt_len)} positions) + "
          f"max_new_tokens ({max_new}) + gamma ({gamma}) needs {need} cache slots, more than "
          f"the {_MAX_SLOTS} (2**31 - 1) that int32 positions can index")
    if cache_len is None:
      cache_len = need
    cache_len = check_int("cache_len", cache_len, 1)
    if cache_len > _MAX_SLOTS:
      raise ValueError(f"cache_len must be at most {_MAX_SLOTS} (2**31 - 1: positions are "
                       f"int32), got {cache_len}")
    if cache_len < need:
      raise ValueError(
          f"cache_len={cache_len} is too short: prompt ({prompt_len} tokens → "
          f"{model.prefill_positions(prompt_len)} positions) + max_new_tokens ({max_new}) "
          f"+ gamma ({gamma}) needs {need} slots")
    if not allocate:
      return cache_len
    # Placed like the params: on their mesh, split, never whole on every device.
    return place_cache_like(model.init_cache(batch, cache_len, prompt_len), params)
  if np.ndim(getattr(cache, "lengths", None)) != 1 or not hasattr(cache, "max_len"):
    raise TypeError(f"{name} must be a cache from {type(model).__name__}.init_cache, got "
                    f"{type(cache).__name__}")
  if cache_len is not None and cache_len != cache.max_len:
    raise ValueError(f"cache_len={cache_len!r} contradicts the {cache.max_len} slots of {name}: "
                     f"pass a cache or cache_len (the slots to allocate), not both")
  cache_b = cache.lengths.shape[0]
  if cache_b != batch:
    raise ValueError(f"{name} has batch {cache_b}, prompts have batch {batch}")
  if cache.max_len < need:
    raise ValueError(
        f"{name} has {cache.max_len} slots; prompt ({prompt_len} tokens) + max_new_tokens "
        f"({max_new}) + gamma ({gamma}) needs {need}")
  _check_cache_fits(name, model, cache, prompt_len)
  return cache


@functools.lru_cache(maxsize=64)
def _abstract_caches(model, batch: int, slots: int, prompt_len: int):
  """The model's cache for these sizes and for one more prompt position, as
  `jax.ShapeDtypeStruct`s (traced once per model and sizes)."""
  return tuple(jax.eval_shape(lambda p=p: model.init_cache(batch, slots, p))
               for p in (prompt_len, prompt_len + 1))


def _check_cache_fits(name, model, cache, prompt_len) -> None:
  """ValueError naming `name` when `cache`'s buffers are not those `model.init_cache` makes for
  its batch and slots (another model's cache would fail inside the trace). Compared abstractly;
  axes that follow the prompt length (T5's encoder positions) and dtypes are not compared."""
  want, longer = _abstract_caches(model, cache.lengths.shape[0], cache.max_len, prompt_len)
  got, got_tree = jax.tree_util.tree_flatten_with_path(cache)
  want_leaves, want_tree = jax.tree_util.tree_flatten(want)
  what = f"{name} is not a cache of this {type(model).__name__} (from its init_cache)"
  if got_tree != want_tree:
    raise ValueError(f"{what}: a {type(cache).__name__} of {len(got)} arrays, the model's is "
                     f"a {type(want).__name__} of {len(want_leaves)}")
  for (path, x), w, w_longer in zip(got, want_leaves, jax.tree_util.tree_leaves(longer)):
    shape = tuple(np.shape(x))
    if len(shape) != len(w.shape) or any(  # axes that change with the prompt length: skipped
        g != n and n == n_longer for g, n, n_longer in zip(shape, w.shape, w_longer.shape)):
      raise ValueError(f"{what}: {jax.tree_util.keystr(path)} has shape {shape}, the model's "
                       f"{tuple(w.shape)} (another model's cache?)")


def _tree_bytes(tree) -> int:
  """Bytes of the arrays (or `jax.ShapeDtypeStruct`s) of `tree`."""
  return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize
             for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "dtype"))


@functools.lru_cache(maxsize=64)
def _cache_bytes(model, batch: int, slots: int, prompt_len: int) -> int:
  """Bytes of `model.init_cache(batch, slots, prompt_len)`, from its shapes (`jax.eval_shape`:
  nothing allocated)."""
  return _tree_bytes(jax.eval_shape(lambda: model.init_cache(batch, slots, prompt_len)))


@functools.lru_cache(maxsize=64)
def _state_bytes(drafter: Drafter, batch: int, prompt_len: int, slots: int, gamma: int) -> int:
  """Bytes of `drafter.alloc(...)`'s state, from its shapes."""
  return _tree_bytes(jax.eval_shape(lambda: drafter.alloc(batch, prompt_len, slots, gamma)))


def _token_buffers(batch: int, max_new: int, width: int) -> Tuple[str, int]:
  """The loop's int32 token buffer `[B, N + width]` and the output `[B, N]`."""
  return (f"token buffers (batch {batch} x {max_new} tokens)",
          4 * batch * (2 * max_new + width))


def _devices_of(params) -> list:
  """The devices the caches of a call over `params` are placed on (`place_cache_like`)."""
  mesh = params_mesh(params)
  if mesh is not None:
    return list(mesh.devices.flat)
  for x in jax.tree_util.tree_leaves(params):
    if isinstance(x, jax.Array) and is_concrete(x):
      return sorted(x.devices(), key=lambda d: d.id)[:1]
  return jax.local_devices()[:1]


def _cache_part(name: str, model, batch: int, slots: int, prompt_len: int) -> Tuple[str, int]:
  return (f"{name} (batch {batch} x {slots} slots)",
          _cache_bytes(model, batch, slots, prompt_len))


def _check_common(max_new_tokens, sampling, eos_id, pad_id, vocab_size, nonfinite="raise"):
  if not isinstance(nonfinite, str) or nonfinite not in _NONFINITE:
    raise ValueError(f"nonfinite must be one of {_NONFINITE}, got {nonfinite!r}")
  max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
  if not isinstance(sampling, SamplingConfig):
    raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
  eos_id = _check_eos(eos_id, vocab_size)
  pad_id = check_int("pad_id", pad_id, 0, INT32_MAX, note=" (the output tokens are int32)")
  return max_new_tokens, eos_id, pad_id


def _check_eos(eos_id, vocab_size: int) -> EosIds:
  """None, one id, or a sorted tuple of ≥ 2 distinct ids, each in [0, vocab)."""
  if eos_id is None:
    return None
  if isinstance(eos_id, (str, bytes)) or not (
      isinstance(eos_id, (numbers.Integral, np.ndarray, jax.Array, list, tuple, set, frozenset))):
    raise TypeError(f"eos_id must be a token id or a sequence of token ids, got {eos_id!r} "
                    f"({type(eos_id).__name__})")
  if np.ndim(eos_id) == 0 and not isinstance(eos_id, (set, frozenset)):
    ids = [check_int("eos_id", eos_id.item() if hasattr(eos_id, "item") else eos_id, 0)]
  else:
    values = list(np.asarray(eos_id).reshape(-1)) if hasattr(eos_id, "shape") else list(eos_id)
    if not values:
      raise ValueError("eos_id must be a token id or a non-empty sequence of ids, got an empty "
                       f"{type(eos_id).__name__}")
    ids = [check_int("eos_id", v.item() if hasattr(v, "item") else v, 0) for v in values]
  bad = [i for i in ids if i >= vocab_size]
  if bad:
    raise ValueError(f"eos_id must lie in [0, {vocab_size}) (the vocabulary), got {bad[0]}")
  ids = sorted(set(ids))
  return ids[0] if len(ids) == 1 else tuple(ids)


def generate(model, params, prompts, prompt_lengths=None, *, max_new_tokens: int,
             sampling: SamplingConfig = SamplingConfig(), key=None,
             eos_id: Union[None, int, Sequence[int]] = None,
             pad_id: int = 0, cache=None, cache_len: Optional[int] = None,
             prefilled: Optional[Prefill] = None, nonfinite: str = "raise") -> GenerationOutput:
  """Autoregressive decoding, one jitted `lax.while_loop`.

  Args:
    model: a `specjax.protocol.LanguageModel` (e.g. `DecoderLM`, `T5`).
    params: its parameters.
    prompts: int `[B, P]` right-padded prompts (encoder inputs for T5).
    prompt_lengths: int `[B]` in [1, P]; default all P.
    max_new_tokens: N, tokens to generate per row (EOS included).
    sampling: a `SamplingConfig` (temperature 0 = greedy).
    key: a PRNG key, or one per row (`[B]`) for batch-independent rows; required unless greedy.
    eos_id: a row stops after emitting it (EOS included in its tokens), or any id of a sequence
      (instruct checkpoints: `HFTokenizer.eos_ids`); None: rows run to N.
    pad_id: fills output slots past each row's length.
    cache: a cache from `model.init_cache` to reuse (donated); or
    cache_len: slots of the cache to allocate (default: the minimum).
    prefilled: a `Prefill` of these prompts (`specjax.prefill`, donated): decoding starts from
      it (`cache` must be None), with the tokens `generate` would give with the same key.
    nonfinite: when the target's logits held a NaN or +inf (`DecodeStats.nonfinite`): "raise"
      (default) a `FloatingPointError` naming the rows, "warn", or "ignore". Checking waits for
      the result; inside an outer `jit` nothing can be raised (read the stats).

  Returns:
    `GenerationOutput` (tokens `[B, N]`, lengths `[B]`, stats, final cache).

  Raises:
    ValueError: a value out of range, named with the argument: token ids outside [0, vocab)
      within the prompt lengths (row, position and id named), lengths, sizes, keys or caches.
    TypeError: an argument of the wrong kind, named: params that are not the model's tree
      (`protocol.check_params`), arrays of the wrong dtype, a sampling that is not a
      `SamplingConfig`.
  """
  check_model(model, "model")
  max_new_tokens, eos_id, pad_id = _check_common(max_new_tokens, sampling, eos_id, pad_id,
                                                 model.vocab_size, nonfinite)
  check_params(model, params, "params")
  prompts, prompt_lengths = check_prompts(prompts, prompt_lengths, model.vocab_size)
  b, p = prompts.shape
  keys = _row_keys(key, b, sampling)
  parts = [_token_buffers(b, max_new_tokens, 1)]
  if prefilled is None:
    slots = _check_cache("cache", model, cache, b, p, max_new_tokens, 0, cache_len,
                         allocate=False)
    if cache is None:
      parts.insert(0, _cache_part("cache", model, b, slots, p))
  else:
    _check_prefilled(prefilled, cache, model, b, p, max_new_tokens, 0, prompts, prompt_lengths,
                     sampling, keys)
  check_memory("generate", parts, _devices_of(params), _MEMORY_ADVICE)
  if prefilled is None and cache is None:
    # Placed like the params: on their mesh, split, never whole on every device.
    cache = place_cache_like(model.init_cache(b, slots, p), params)
  dec = AutoregressiveDecoder(model, sampling, max_new_tokens, eos_id, pad_id)
  out = dec.run(params, prompts, prompt_lengths, keys, cache, prefilled)
  enforce_limit()
  return _check_finite(out, nonfinite, "params")


def _check_finite(out: GenerationOutput, nonfinite: str, params_name: str,
                  stacklevel: int = 3) -> GenerationOutput:
  """Raises / warns (per `nonfinite`) when some row's target logits were not finite."""
  if nonfinite == "ignore" or not is_concrete(out.stats.nonfinite):
    return out
  bad = np.asarray(out.stats.nonfinite)
  rows = np.nonzero(bad)[0]
  if rows.size == 0:
    return out
  calls = np.asarray(out.stats.target_calls)
  shown = ", ".join(f"row {r}: {bad[r]} of {calls[r]} calls" for r in rows[:8])
  msg = (f"the target's logits held NaN or inf in {rows.size} of {bad.size} rows ({shown}"
         f"{', ...' if rows.size > 8 else ''}): the tokens drawn from them mean nothing. "
         f"Check {params_name} (a broken or overflowed checkpoint; bfloat16 overflows "
         "where float32 does not); nonfinite='warn' returns the output anyway")
  if nonfinite == "raise":
    raise FloatingPointError(msg)
  warnings.warn(msg, RuntimeWarning, stacklevel=stacklevel)
  return out


def _check_prefilled(prefilled, cache, model, batch, prompt_len, max_new, gamma, prompts,
                     prompt_lengths, sampling, keys) -> None:
  """ValueError / TypeError naming `prefilled` when it is not a prefill of this call: made
  (`specjax.prefill`, `Prefill.origin`) from other prompts or lengths, another target, sampling
  or key, or sized for fewer tokens than the call needs; every difference is listed."""
  if not isinstance(prefilled, Prefill):
    raise TypeError(f"prefilled must be a specjax.Prefill (from specjax.prefill), got "
                    f"{type(prefilled).__name__}")
  if cache is not None:
    raise ValueError("pass either a cache to prefill into or prefilled (already prefilled), "
                     "not both")
  origin = prefilled.origin
  if origin is not None:
    call = PrefillOrigin.of(model, prompts, prompt_lengths, sampling, keys, max_new, gamma)
    diffs = origin.differences(call)
    if diffs:
      raise ValueError("prefilled is not a prefill of this call (specjax.prefill it with the "
                       "call's arguments): " + "; ".join(diffs))
  try:
    _check_cache("prefilled.cache", model, prefilled.cache, batch, prompt_len, max_new, gamma,
                 None)
  except ValueError as e:
    if origin is None:
      raise
    raise ValueError(f"{e} (prefilled was made with max_new_tokens={origin.max_new_tokens}, "
                     f"gamma={origin.gamma}: prefill with this call's max_new_tokens and "
                     "gamma)") from None


def prefill(model, params, prompts, prompt_lengths=None, *, max_new_tokens: int,
            gamma: int = 0, sampling: SamplingConfig = SamplingConfig(), key=None,
            cache_len: Optional[int] = None) -> Prefill:
  """Prefills `model` with the prompts once, to decode from it several times.

  `generate(..., prefilled=p)` and `speculative_generate(..., prefilled=p)` then skip their
  prefill and give the tokens they would give on their own with the same `key` and `sampling`
  (the first token is drawn here). A decoder donates the `Prefill`: decode from a copy
  (`jax.tree.map(jnp.copy, p)`) to use it again. The cache is sized for `max_new_tokens` and
  `gamma` (the largest γ, or the drafter's call length − 1, it will serve; default:
  autoregressive), or `cache_len` slots. For long prompts set `DecoderConfig.prefill_chunk`.

  The `Prefill` records what it was made from (`Prefill.origin`: the target, a fingerprint
  of each row's prompt ids and length, the sampling, the rows' keys, `max_new_tokens` and
  `gamma`); a decoding call whose target, prompts, lengths, sampling or key (when sampling)
  differ, or that needs more tokens or a larger γ, refuses it naming each difference. A
  copy keeps the record.

  Returns:
    `Prefill` (first token `[B]`, last prompt token `[B]`, the cache, its origin).
  """
  check_model(model, "model")
  max_new_tokens, _, _ = _check_common(max_new_tokens, sampling, None, 0, model.vocab_size)
  gamma = check_int("gamma", gamma, 0)
  check_params(model, params, "params")
  prompts, prompt_lengths = check_prompts(prompts, prompt_lengths, model.vocab_size)
  b, p = prompts.shape
  keys = _row_keys(key, b, sampling)
  slots = _check_cache("cache", model, None, b, p, max_new_tokens, gamma, cache_len,
                       allocate=False)
  check_memory("prefill", [_cache_part("cache", model, b, slots, p)], _devices_of(params),
               _MEMORY_ADVICE)
  cache = place_cache_like(model.init_cache(b, slots, p), params)
  with decode_mesh(params):
    out = run_prefill(model, params, sampling, prompts, prompt_lengths, keys, cache)
  enforce_limit()
  return out.replace(origin=PrefillOrigin.of(model, prompts, prompt_lengths, sampling, keys,
                                             max_new_tokens, gamma))


def resolve_drafter(target, target_params, draft, draft_params, gamma, adaptive: bool = False):
  """`(drafter, draft_params, gamma)` for a draft model (wrapped in `ModelDrafter`) or a drafter.

  `gamma` None: 4, or the γ of a drafter that fixes its own (lookahead, trees, suffix); such a
  drafter refuses any other γ by name (`adaptive`: `gamma` is max Γ, which such a drafter
  replaces). γ (int >= 1) and the drafter are checked against the target; self-drafters get
  the target's params when `draft_params` is None; token ids in the drafter's params (a
  `SuffixCorpus`) must lie in the target's vocabulary.
  """
  if isinstance(draft, Drafter):
    drafter = draft
  else:
    try:
      check_model(draft, "draft")
    except TypeError as e:
      raise TypeError(f"draft must be a draft model (a specjax LanguageModel) or a drafter "
                      f"(specjax.drafters), got {type(draft).__name__}: {e}") from None
    drafter = ModelDrafter(draft)
  fixed = drafter.fixed_gamma
  if fixed is not None:
    if gamma is not None and not adaptive and (
        isinstance(gamma, (bool, np.bool_)) or not isinstance(gamma, numbers.Integral)
        or gamma != fixed):
      raise (ValueError if isinstance(gamma, numbers.Integral) else TypeError)(
          f"gamma must be None (omitted) or {fixed} for {type(drafter).__name__}, which fixes "
          f"its own γ = {fixed}, got gamma={gamma!r}")
    gamma = fixed
  elif gamma is None:
    gamma = _DEFAULT_GAMMA
  gamma = check_int("gamma", gamma, 1)
  if gamma > INT32_MAX:
    raise ValueError(f"gamma must be at most {INT32_MAX} (2**31 - 1) drafts per iteration, got "
                     f"{gamma}")
  drafter.check(target, gamma)
  if drafter.uses_target_params and draft_params is None:
    draft_params = target_params
  drafter.check_params(draft_params)
  if isinstance(draft_params, SuffixCorpus):
    draft_params.check_vocab(target.vocab_size, "draft_params")
  return drafter, draft_params, gamma


def usable_gamma(target, drafter: Drafter, gamma: int, max_new_tokens: int) -> int:
  """γ, or the largest γ whose drafts can all be used, with a warning.

  After the prefill's token N - 1 tokens remain, so a chain drafter's γ beyond max(1, N - 1)
  only drafts tokens that are always cut: it is lowered to that value (greedy output unchanged,
  a sampled output keeps its law) with a warning. A deeper tree, or a drafter that fixes its own
  γ, is kept and warned about."""
  useful = max(1, max_new_tokens - 1)
  what = (f"the {useful} drafts per iteration that max_new_tokens={max_new_tokens} can use "
          f"(max(1, max_new_tokens - 1))")
  if drafter.fixed_gamma is None and gamma > useful:
    # Lowered before the layout at γ is built: a γ of 2**31 would allocate its whole chain.
    low = drafter.layout(useful)
    if not low.is_tree and low.num_chains == 1 and low.chain_len == useful:
      try:
        drafter.check(target, useful)
      except ValueError:
        pass
      else:
        warnings.warn(f"gamma={gamma} is more than {what}: using gamma={useful}", UserWarning,
                      stacklevel=4)
        return useful
  lay = drafter.layout(gamma)
  if lay.chain_len <= useful:
    return gamma
  warnings.warn(f"{type(drafter).__name__} drafts {lay.chain_len} deep (gamma={gamma}), more "
                f"than {what}: the deeper drafts are computed and never committed",
                UserWarning, stacklevel=4)
  return gamma


_DEFAULT_ADAPTIVE = AdaptiveGamma()


@dataclasses.dataclass(frozen=True)
class SpeculativePlan:
  """What one `speculative_generate` call runs, decided on the host before anything is traced.

  `speculative_generate` is validate → plan → decode: the plan fixes every choice that follows
  from the checked arguments and `decoder()` runs it; equal plans run the same compiled program.

  Attributes:
    target: the target model.
    drafter: where the drafts come from (a draft model is a `ModelDrafter`).
    gamma: the largest γ an iteration drafts: the fixed γ (after `usable_gamma`), or max Γ.
    adaptive: the `AdaptiveGamma` rule, its Γ capped at the drafter's `gamma_limit` and at
      max(1, max_new_tokens - 1); None for a fixed γ.
    call_len: tokens in one target call (`drafter.layout(gamma).length`).
    batch_size, prompt_len, max_new_tokens: the call's sizes (B, P, N).
    cache_len: slots of the target's cache.
    draft_cache_len: slots of a draft model's cache (`drafter.owns_model`), else None (the
      drafter sizes its state by the target's cache).
    gamma_costs: with `adaptive`: the cost of one iteration at each γ of Γ (given, stored or
      measured: `specjax.calibration`); else None.
    plain: run plain decoding's program (`generate`'s very tokens): with `adaptive`, where no
      γ > 0 can pay and no probe falls due.
    sampling, eos_id, pad_id, verify_fn, nonfinite: the checked arguments.
    mesh: the `jax.sharding.Mesh` the target's weights lie on (decoding traces under it and
      places every cache on it), or None: one device.
  """

  target: Any
  drafter: Drafter
  gamma: int
  adaptive: Optional[AdaptiveGamma]
  call_len: int
  batch_size: int
  prompt_len: int
  max_new_tokens: int
  cache_len: int
  draft_cache_len: Optional[int]
  gamma_costs: Optional[Tuple[float, ...]]
  plain: bool
  sampling: SamplingConfig
  eos_id: EosIds
  pad_id: int
  verify_fn: Callable
  nonfinite: str
  mesh: Any = None

  def decoder(self) -> Union[AutoregressiveDecoder, SpeculativeDecoder]:
    """The decoder that runs this plan (plain decoding's where `plain`)."""
    if self.plain:
      return AutoregressiveDecoder(self.target, self.sampling, self.max_new_tokens, self.eos_id,
                                   self.pad_id, report_adaptive=self.adaptive)
    return SpeculativeDecoder(self.target, self.drafter, self.gamma, self.sampling,
                              self.max_new_tokens, self.eos_id, self.pad_id, self.verify_fn,
                              adaptive=self.adaptive)


def _gamma_rule(draft, gamma, gamma_costs, acceptance):
  """`(adaptive, given, gamma)`: the AdaptiveGamma asked for (capped at a drafter's
  `gamma_limit`), the one given and γ = max Γ; or None, None and the fixed γ."""
  if isinstance(gamma, str):
    if gamma != "auto":
      raise ValueError(f"gamma must be an int >= 1, 'auto' or a specjax.AdaptiveGamma, "
                       f"got {gamma!r}")
    gamma = _DEFAULT_ADAPTIVE
  if not isinstance(gamma, AdaptiveGamma):
    for name, value in (("gamma_costs", gamma_costs), ("acceptance", acceptance)):
      if value is not None:
        raise ValueError(f"{name} is for gamma='auto' (or an AdaptiveGamma); gamma={gamma!r} "
                         "is fixed")
    return None, None, gamma
  adaptive = gamma
  if isinstance(draft, Drafter) and draft.gamma_limit is not None:
    adaptive = adaptive.capped_at(draft.gamma_limit)   # e.g. a tree's depth caps Γ
  return adaptive, gamma, adaptive.max_gamma


def _validate_and_plan(target, target_params, draft, draft_params, prompts, prompt_lengths, *,
                       max_new_tokens, gamma, sampling, key, eos_id, pad_id, target_cache,
                       draft_cache, cache_len, verify_fn, prefilled, nonfinite, gamma_costs,
                       acceptance):
  """The plan and the checked arguments of a `speculative_generate` call: `(plan, (draft_params,
  prompts, prompt_lengths, keys, target_cache, draft_cache, acceptance))`."""
  check_model(target, "target")
  check_params(target, target_params, "target_params")
  adaptive, given, gamma = _gamma_rule(draft, gamma, gamma_costs, acceptance)
  if acceptance is not None:
    acceptance = check_acceptance(acceptance)
  drafter, draft_params, gamma = resolve_drafter(target, target_params, draft, draft_params,
                                                 gamma, adaptive=adaptive is not None)
  if not callable(verify_fn):
    raise TypeError(f"verify_fn must be callable, got {verify_fn!r}")
  max_new_tokens, eos_id, pad_id = _check_common(max_new_tokens, sampling, eos_id, pad_id,
                                                 target.vocab_size, nonfinite)
  if adaptive is not None:
    check_adaptive(drafter, adaptive)
    adaptive = adaptive.limited_to(max(1, max_new_tokens - 1))
    gamma = adaptive.max_gamma
    if gamma_costs is not None:  # costs of the Γ given, kept for the γ kept
      gamma_costs = given.costs_of(adaptive, check_costs(given, gamma_costs))
  else:
    gamma = usable_gamma(target, drafter, gamma, max_new_tokens)
  check_verify_fn(drafter, gamma, verify_fn, adaptive)
  prompts, prompt_lengths = check_prompts(prompts, prompt_lengths, target.vocab_size)
  b, p = prompts.shape
  call_len = drafter.layout(gamma).length
  keys = _row_keys(key, b, sampling)
  try:
    if prefilled is not None:
      _check_prefilled(prefilled, target_cache, target, b, p, max_new_tokens, call_len - 1,
                       prompts, prompt_lengths, sampling, keys)
    else:
      _check_cache("target_cache", target, target_cache, b, p, max_new_tokens, call_len - 1,
                   cache_len, target_params, allocate=False)
  except ValueError as e:
    if call_len == gamma + 1:
      raise
    raise ValueError(f"{e} (the drafter's target call holds {call_len} tokens: "
                     f"{type(drafter).__name__} needs {call_len - 1} slots past the pending "
                     "token, not gamma)") from None
  draft_cache_len = None
  if drafter.owns_model:
    _check_cache("draft_cache", drafter.model, draft_cache, b, p, max_new_tokens, gamma,
                 cache_len, draft_params, allocate=False)
    draft_cache_len = (draft_cache.max_len if draft_cache is not None
                       else int(cache_len) if cache_len is not None
                       else required_cache_len(drafter.model, p, max_new_tokens, gamma))
  elif draft_cache is not None:
    raise ValueError(f"draft_cache is for a draft model; {type(drafter).__name__} allocates "
                     "its own state (pass draft_cache=None)")
  given_cache = prefilled.cache if prefilled is not None else target_cache
  slots = (given_cache.max_len if given_cache is not None
           else int(cache_len) if cache_len is not None
           else required_cache_len(target, p, max_new_tokens, call_len - 1))
  costs, plain = None, False
  if adaptive is not None:
    costs = tuple(np.asarray(resolve_gamma_costs(
        target, target_params, drafter, draft_params, adaptive, batch_size=b, prompt_len=p,
        cache_len=slots, sampling=sampling, gamma_costs=gamma_costs).seconds,
                             np.float32).tolist())
    # No γ > 0 pays at the prior's (or carried) acceptance, plain steps observe nothing and no
    # probe falls due: the rule would run plain steps to the end.
    if acceptance is None:
      plain = not drafter.offers_room and not _prior_may_draft(adaptive, costs)
    else:
      plain = not (drafter.offers_room or probe_due(adaptive, acceptance, max_new_tokens)
                   or prior_may_draft(adaptive, np.asarray(costs, np.float32), acceptance))
    if plain and given_cache is None and cache_len is None:
      slots = required_cache_len(target, p, max_new_tokens, 0)  # no room for drafts
  _check_decode_memory(target, target_params, drafter, b, p, max_new_tokens, gamma, slots,
                       draft_cache_len, plain, given_cache is None, draft_cache is None)
  plan = SpeculativePlan(
      target=target, drafter=drafter, gamma=gamma, adaptive=adaptive, call_len=call_len,
      batch_size=b, prompt_len=p, max_new_tokens=max_new_tokens, cache_len=slots,
      draft_cache_len=draft_cache_len, gamma_costs=costs, plain=plain, sampling=sampling,
      eos_id=eos_id, pad_id=pad_id, verify_fn=verify_fn, nonfinite=nonfinite,
      mesh=params_mesh(target_params))
  return plan, (draft_params, prompts, prompt_lengths, keys, target_cache, draft_cache,
                acceptance)


def _check_decode_memory(target, target_params, drafter: Drafter, b: int, p: int, max_new: int,
                         gamma: int, slots: int, draft_slots: Optional[int], plain: bool,
                         new_target_cache: bool, new_draft_cache: bool) -> None:
  """Refuses (`_checks.check_memory`) a `speculative_generate` whose caches, drafter state and
  token buffers (those `_decode` would allocate) exceed the devices' free memory."""
  lay = drafter.layout(gamma)
  parts = [_token_buffers(b, max_new, (0 if plain else lay.chain_len) + 1)]
  if new_target_cache:
    parts.insert(0, _cache_part("target cache", target, b, slots, p))
  if not plain and new_draft_cache:
    if drafter.owns_model:
      parts.append(_cache_part("draft cache", drafter.model, b, draft_slots, p))
    else:
      parts.append((f"{type(drafter).__name__} state",
                    _state_bytes(drafter, b, p, slots, gamma)))
  check_memory("speculative_generate", parts, _devices_of(target_params), _MEMORY_ADVICE)


def _decode(plan: SpeculativePlan, target_params, draft_params, prompts, prompt_lengths, keys,
            target_cache, draft_cache, prefilled, acceptance) -> GenerationOutput:
  """Allocates the caches the plan sizes (donated ones are reused) and runs its decoder."""
  b, p = plan.batch_size, plan.prompt_len
  if prefilled is None and target_cache is None:
    # Placed like the params: on their mesh, split, never whole on every device.
    target_cache = place_cache_like(plan.target.init_cache(b, plan.cache_len, p), target_params)
  drafter = plan.drafter
  if not plan.plain or draft_cache is not None:
    if draft_cache is None and drafter.owns_model:
      draft_cache = place_cache_like(drafter.model.init_cache(b, plan.draft_cache_len, p),
                                     draft_params)
    elif draft_cache is None:
      slots = (prefilled.cache if prefilled is not None else target_cache).max_len
      draft_cache = drafter.alloc(b, p, slots, plan.gamma)
      if plan.mesh is not None:   # placed like the target's params (`place_cache_like`)
        draft_cache = place_state(draft_cache, plan.mesh, drafter.splits_state)
  dec = plan.decoder()
  if plan.plain:
    out = dec.run(target_params, prompts, prompt_lengths, keys, target_cache, prefilled,
                  acceptance)
    out = out.replace(draft_cache=draft_cache)
  else:
    costs = None if plan.gamma_costs is None else np.asarray(plan.gamma_costs, np.float32)
    out = dec.run(target_params, draft_params, prompts, prompt_lengths, keys, target_cache,
                  draft_cache, prefilled, gamma_costs=costs, acceptance=acceptance)
  enforce_limit()
  return _check_finite(out, plan.nonfinite, "target_params", stacklevel=4)


def plan_speculative(target, target_params, draft, draft_params, prompts, prompt_lengths=None,
                     *, max_new_tokens: int, gamma: Union[None, int, str, AdaptiveGamma] = None,
                     sampling: SamplingConfig = SamplingConfig(), key=None,
                     eos_id: Union[None, int, Sequence[int]] = None, pad_id: int = 0,
                     target_cache=None, draft_cache=None, cache_len: Optional[int] = None,
                     verify_fn: Callable = rejection_verify,
                     prefilled: Optional[Prefill] = None, nonfinite: str = "raise",
                     gamma_costs: Optional[Sequence[float]] = None,
                     acceptance: Optional[Acceptance] = None) -> SpeculativePlan:
  """The `SpeculativePlan` `speculative_generate` would run with these arguments, unrun.

  The arguments are checked as `speculative_generate` checks them (with gamma="auto" a missing
  cost table is measured as it would be).
  """
  return _validate_and_plan(
      target, target_params, draft, draft_params, prompts, prompt_lengths,
      max_new_tokens=max_new_tokens, gamma=gamma, sampling=sampling, key=key, eos_id=eos_id,
      pad_id=pad_id, target_cache=target_cache, draft_cache=draft_cache, cache_len=cache_len,
      verify_fn=verify_fn, prefilled=prefilled, nonfinite=nonfinite, gamma_costs=gamma_costs,
      acceptance=acceptance)[0]


def speculative_generate(target, target_params, draft, draft_params, prompts,
                         prompt_lengths=None, *, max_new_tokens: int,
                         gamma: Union[None, int, str, AdaptiveGamma] = None,
                         sampling: SamplingConfig = SamplingConfig(), key=None,
                         eos_id: Union[None, int, Sequence[int]] = None, pad_id: int = 0,
                         target_cache=None, draft_cache=None, cache_len: Optional[int] = None,
                         verify_fn: Callable = rejection_verify,
                         prefilled: Optional[Prefill] = None,
                         nonfinite: str = "raise",
                         gamma_costs: Optional[Sequence[float]] = None,
                         acceptance: Optional[Acceptance] = None) -> GenerationOutput:
  """Exact speculative decoding (draft, verify once per iteration), one jitted while_loop.

  The output has exactly the distribution of `generate(target, ...)` with the same `sampling`
  (greedy: the very same tokens). Every row accepts its own number of drafts per iteration and
  rolls back its own caches.

  Args:
    target, target_params: the model whose distribution is sampled.
    draft, draft_params: a draft model (a `LanguageModel` with the target's vocabulary) and its
      params, or a drafter (`specjax.drafters`: `PromptLookup`, `LayerSkip`, `Lookahead`, ...;
      `draft_params` None for drafters that need none or run on the target's weights).
    prompts, prompt_lengths, max_new_tokens, sampling, key, eos_id, pad_id: as in `generate`.
    gamma: γ ≥ 1 drafted tokens per iteration (static: one compilation per value); None (the
      default): 4, or the γ of a drafter that fixes its own (lookahead, token trees, suffix,
      which refuse any other γ by name). A γ above max(1, max_new_tokens - 1) is lowered to it with a warning
      (`usable_gamma`). `"auto"` (or a `specjax.AdaptiveGamma`): each iteration chooses γ in-graph
      from Γ = {0, 1, 2, 4, 8} (0: a plain target step) by each row's running acceptance and the
      measured cost of each γ (`specjax.adaptive`, `specjax.calibration`; exact, greedy output
      unchanged), Γ capped at `Drafter.gamma_limit`. Where nothing can pay, the call runs
      `generate`'s program and allocates no draft cache (returned as given); docs/adaptive.md.
    target_cache, draft_cache: caches to reuse (donated; `draft_cache` only for a draft model),
      or `cache_len` for both (default: the minimum).
    verify_fn: the accept/reject rule for a chain of drafts with distributions (a draft model,
      LayerSkip, WindowedKV, PARD; `specjax.verify`); the default is exact. A custom rule is
      called as `verify_fn(keys_B, drafts_BG, draft_probs_BGV, target_probs_BG1V, num_valid_B)`
      (`num_valid_B` by keyword where it takes one of that name, else as the fifth positional
      argument where it takes five: row b proposes only its first num_valid_B[b] drafts), or
      without `num_valid_B` where it takes four (refused with gamma="auto", whose rows may
      propose fewer drafts than γ). Drafters whose drafts have no distributions (prompt
      lookup, lookahead, suffix, top-k trees) or form a tree (EAGLE, Medusa) refuse a custom
      rule by name: theirs is `SpeculativeDecoder(candidates_fn=)` / `(tree_fn=)`.
    prefilled: a `Prefill` of the target on these prompts (`specjax.prefill` with `gamma`,
      donated): decoding starts from it (`target_cache` must be None); a draft model still
      prefills its own cache.
    nonfinite: as in `generate` (the target's logits of every call).
    gamma_costs: with gamma="auto": the cost of one iteration at each γ of Γ (any unit), instead
      of the stored or measured table.
    acceptance: with gamma="auto": the estimate earlier calls learned (`out.stats.acceptance` of
      the previous call; `specjax.Acceptance.fresh()` for the first) instead of the prior; rows
      with no evidence then probe (exact: the choice reads only earlier calls' tokens).

  Returns:
    `GenerationOutput` with acceptance statistics; its `draft_cache` is the drafter's final
    state (a draft model's cache).

  Raises:
    ValueError: as `generate`, and a `gamma` that the drafter or the target refuses.
    TypeError: as `generate`, and `draft_params` that are not a draft model's tree.
  """
  plan, (draft_params, prompts, prompt_lengths, keys, target_cache, draft_cache,
         acceptance) = _validate_and_plan(
             target, target_params, draft, draft_params, prompts, prompt_lengths,
             max_new_tokens=max_new_tokens, gamma=gamma, sampling=sampling, key=key,
             eos_id=eos_id, pad_id=pad_id, target_cache=target_cache, draft_cache=draft_cache,
             cache_len=cache_len, verify_fn=verify_fn, prefilled=prefilled,
             nonfinite=nonfinite, gamma_costs=gamma_costs, acceptance=acceptance)
  return _decode(plan, target_params, draft_params, prompts, prompt_lengths, keys,
                 target_cache, draft_cache, prefilled, acceptance)


@functools.lru_cache(maxsize=256)
def _prior_may_draft(adaptive: AdaptiveGamma, costs: tuple) -> bool:
  """`prior_may_draft`, once per (Γ, cost table)."""
  return prior_may_draft(adaptive, costs)

