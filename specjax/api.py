"""`generate` and `speculative_generate`: validated entry points.

Everything shape- or value-related is checked here, on the host, before the
jitted loop runs, so misuse gets a ValueError/TypeError naming the argument
rather than an XLA error (or a silent clamp) from deep inside.
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from specjax._checks import check_int, check_prompts
from specjax.drafters.model import ModelDrafter
from specjax.drafting import Drafter
from specjax.generation import (AutoregressiveDecoder, GenerationOutput, Prefill,
                                SpeculativeDecoder, run_prefill)
from specjax.parallel.sharding import place_cache_like
from specjax.protocol import check_model, required_cache_len
from specjax.sampling import SamplingConfig
from specjax.verify import rejection_verify

__all__ = ["generate", "speculative_generate", "prefill", "required_cache_len"]


def _row_keys(key, batch: int, sampling: SamplingConfig) -> jax.Array:
  if key is None:
    if not sampling.is_greedy:
      raise ValueError("key is required when sampling (temperature > 0); pass "
                       "jax.random.key(seed) or one key per row")
    key = jax.random.key(0)
  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    if key.dtype != jnp.uint32 or key.ndim not in (1, 2):
      raise TypeError(f"key must be a PRNG key (jax.random.key / PRNGKey) or one per row, got "
                      f"dtype {key.dtype} shape {tuple(key.shape)}")
    key = jax.random.wrap_key_data(key)
  if key.ndim == 0:
    return jax.random.split(key, batch)
  if key.shape == (batch,):
    return key
  raise ValueError(f"key must be a single key or one key per row (shape ({batch},)), "
                   f"got key shape {tuple(key.shape)}")


def _check_cache(name, model, cache, batch, prompt_len, max_new, gamma, cache_len, params=None):
  need = required_cache_len(model, prompt_len, max_new, gamma)
  if cache is None:
    if cache_len is None:
      cache_len = need
    cache_len = check_int("cache_len", cache_len, 1)
    if cache_len < need:
      raise ValueError(
          f"cache_len={cache_len} is too short: prompt ({prompt_len} tokens → "
          f"{model.prefill_positions(prompt_len)} positions) + max_new_tokens ({max_new}) "
          f"+ gamma ({gamma}) needs {need} slots")
    # Placed like the params: on their mesh, split, never whole on every device.
    return place_cache_like(model.init_cache(batch, cache_len, prompt_len), params)
  cache_b = cache.lengths.shape[0]
  if cache_b != batch:
    raise ValueError(f"{name} has batch {cache_b}, prompts have batch {batch}")
  if cache.max_len < need:
    raise ValueError(
        f"{name} has {cache.max_len} slots; prompt ({prompt_len} tokens) + max_new_tokens "
        f"({max_new}) + gamma ({gamma}) needs {need}")
  return cache


def _check_common(max_new_tokens, sampling, eos_id, pad_id, vocab_size):
  max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
  if not isinstance(sampling, SamplingConfig):
    raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
  if eos_id is not None:
    eos_id = check_int("eos_id", eos_id, 0)
    if eos_id >= vocab_size:
      raise ValueError(f"eos_id must lie in [0, {vocab_size}) (the vocabulary), got {eos_id}")
  pad_id = check_int("pad_id", pad_id, 0)
  return max_new_tokens, eos_id, pad_id


def generate(model, params, prompts, prompt_lengths=None, *, max_new_tokens: int,
             sampling: SamplingConfig = SamplingConfig(), key=None, eos_id: Optional[int] = None,
             pad_id: int = 0, cache=None, cache_len: Optional[int] = None,
             prefilled: Optional[Prefill] = None) -> GenerationOutput:
  """Autoregressive decoding, one jitted `lax.while_loop`.

  Args:
    model: a `specjax.protocol.LanguageModel` (e.g. `DecoderLM`, `T5`).
    params: its parameters.
    prompts: int `[B, P]` right-padded prompts (encoder inputs for T5).
    prompt_lengths: int `[B]` in [1, P]; default all P.
    max_new_tokens: N, tokens to generate per row (EOS included).
    sampling: a `SamplingConfig` (temperature 0 = greedy).
    key: a PRNG key, or one per row (`[B]`) for batch-independent rows;
      required unless greedy.
    eos_id: a row stops after emitting it; None: rows run to N.
    pad_id: fills output slots past each row's length.
    cache: a cache from `model.init_cache` to reuse (donated); or
    cache_len: slots of the cache to allocate (default: the minimum).
    prefilled: a `Prefill` of these prompts (`specjax.prefill`, donated):
      decoding starts from it instead of prefilling (`cache` must be None);
      the tokens are those `generate` would give with the same key.

  Returns:
    `GenerationOutput` (tokens `[B, N]`, lengths `[B]`, stats, final cache).
  """
  check_model(model, "model")
  max_new_tokens, eos_id, pad_id = _check_common(max_new_tokens, sampling, eos_id, pad_id,
                                                 model.vocab_size)
  prompts, prompt_lengths = check_prompts(prompts, prompt_lengths)
  b, p = prompts.shape
  if prefilled is None:
    cache = _check_cache("cache", model, cache, b, p, max_new_tokens, 0, cache_len, params)
  else:
    _check_prefilled(prefilled, cache, model, b, p, max_new_tokens, 0)
  keys = _row_keys(key, b, sampling)
  dec = AutoregressiveDecoder(model, sampling, max_new_tokens, eos_id, pad_id)
  return dec.run(params, prompts, prompt_lengths, keys, cache, prefilled)


def _check_prefilled(prefilled, cache, model, batch, prompt_len, max_new, gamma) -> None:
  if not isinstance(prefilled, Prefill):
    raise TypeError(f"prefilled must be a specjax.Prefill (from specjax.prefill), got "
                    f"{type(prefilled).__name__}")
  if cache is not None:
    raise ValueError("pass either a cache to prefill into or prefilled (already prefilled), "
                     "not both")
  _check_cache("prefilled.cache", model, prefilled.cache, batch, prompt_len, max_new, gamma,
               None)


def prefill(model, params, prompts, prompt_lengths=None, *, max_new_tokens: int,
            gamma: int = 0, sampling: SamplingConfig = SamplingConfig(), key=None,
            cache_len: Optional[int] = None) -> Prefill:
  """Prefills `model` with the prompts once, to decode from it several times.

  `generate(..., prefilled=p)` and `speculative_generate(..., prefilled=p)`
  then skip their prefill and give the tokens they would give on their own
  with the same `key` and `sampling` (the first token is drawn here). A
  decoder donates the `Prefill` it is given: decode from a copy
  (`jax.tree.map(jnp.copy, p)`) to use it again. The cache is sized for
  `max_new_tokens` and `gamma` (the largest γ, or the drafter's call length
  − 1, it will serve; default: autoregressive), or `cache_len` slots. For
  long prompts set the model's `prefill_chunk` (`DecoderConfig`).

  Returns:
    `Prefill` (first token `[B]`, last prompt token `[B]`, the cache).
  """
  check_model(model, "model")
  max_new_tokens, _, _ = _check_common(max_new_tokens, sampling, None, 0, model.vocab_size)
  gamma = check_int("gamma", gamma, 0)
  prompts, prompt_lengths = check_prompts(prompts, prompt_lengths)
  b, p = prompts.shape
  cache = _check_cache("cache", model, None, b, p, max_new_tokens, gamma, cache_len, params)
  return run_prefill(model, params, sampling, prompts, prompt_lengths,
                     _row_keys(key, b, sampling), cache)


def resolve_drafter(target, target_params, draft, draft_params, gamma):
  """`(drafter, draft_params, gamma)` for a draft model or a drafter: a model
  is wrapped in `ModelDrafter`; a drafter that fixes its own γ (lookahead)
  overrides `gamma`; γ is checked (int >= 1) and the drafter checked against
  the target; self-drafters get the target's params when `draft_params` is
  None."""
  if isinstance(draft, Drafter):
    drafter = draft
  elif hasattr(draft, "extend") and hasattr(draft, "prefill"):
    drafter = ModelDrafter(draft)
  else:
    raise TypeError(f"draft must be a draft model (a specjax LanguageModel) or a drafter "
                    f"(specjax.drafters), got {type(draft).__name__}")
  if drafter.fixed_gamma is not None:
    gamma = drafter.fixed_gamma
  gamma = check_int("gamma", gamma, 1)
  drafter.check(target, gamma)
  if drafter.uses_target_params and draft_params is None:
    draft_params = target_params
  return drafter, draft_params, gamma


def speculative_generate(target, target_params, draft, draft_params, prompts,
                         prompt_lengths=None, *, max_new_tokens: int, gamma: int = 4,
                         sampling: SamplingConfig = SamplingConfig(), key=None,
                         eos_id: Optional[int] = None, pad_id: int = 0, target_cache=None,
                         draft_cache=None, cache_len: Optional[int] = None,
                         verify_fn: Callable = rejection_verify,
                         prefilled: Optional[Prefill] = None) -> GenerationOutput:
  """Exact speculative decoding (draft, verify once per iteration), one jitted while_loop.

  The output has exactly the distribution of `generate(target, ...)` with the
  same `sampling` (greedy: the very same tokens). Every row accepts its own
  number of drafts per iteration and rolls back its own caches.

  Args:
    target, target_params: the model whose distribution is sampled.
    draft, draft_params: where the drafts come from — a draft model
      (a `LanguageModel` with the target's vocabulary, and its params) or a
      drafter (`specjax.drafters`: `PromptLookup`, `LayerSkip`, `WindowedKV`,
      `Lookahead`, `ModelDrafter`, ...; `draft_params` None for drafters
      that need none or run on the target's weights).
    prompts, prompt_lengths, max_new_tokens, sampling, key, eos_id, pad_id:
      as in `generate`.
    gamma: γ ≥ 1 drafted tokens per iteration (static: one compilation per
      value); lookahead decoding fixes its own (`Lookahead.chain_len`).
    target_cache, draft_cache: caches to reuse (donated; `draft_cache` only
      for a draft model), or `cache_len` for both (default: the minimum).
    verify_fn: the accept/reject rule for drafts with distributions
      (`specjax.verify`); the default is exact.
    prefilled: a `Prefill` of the target on these prompts (`specjax.prefill`
      with `gamma`, donated): decoding starts from it (`target_cache` must be
      None); a draft model still prefills its own cache.

  Returns:
    `GenerationOutput` with acceptance statistics; its `draft_cache` is the
    drafter's final state (a draft model's cache).
  """
  check_model(target, "target")
  drafter, draft_params, gamma = resolve_drafter(target, target_params, draft, draft_params,
                                                 gamma)
  if not callable(verify_fn):
    raise TypeError(f"verify_fn must be callable, got {verify_fn!r}")
  max_new_tokens, eos_id, pad_id = _check_common(max_new_tokens, sampling, eos_id, pad_id,
                                                 target.vocab_size)
  prompts, prompt_lengths = check_prompts(prompts, prompt_lengths)
  b, p = prompts.shape
  call_len = drafter.layout(gamma).length
  try:
    if prefilled is not None:
      _check_prefilled(prefilled, target_cache, target, b, p, max_new_tokens, call_len - 1)
    else:
      target_cache = _check_cache("target_cache", target, target_cache, b, p, max_new_tokens,
                                  call_len - 1, cache_len, target_params)
  except ValueError as e:
    if call_len == gamma + 1:
      raise
    raise ValueError(f"{e} (the drafter's target call holds {call_len} tokens: "
                     f"{type(drafter).__name__} needs {call_len - 1} slots past the pending "
                     "token, not gamma)") from None
  if isinstance(drafter, ModelDrafter) and not drafter.shares_target_params:
    draft_cache = _check_cache("draft_cache", drafter.model, draft_cache, b, p, max_new_tokens,
                               gamma, cache_len, draft_params)
  else:
    if draft_cache is not None and not isinstance(drafter, ModelDrafter):
      raise ValueError(f"draft_cache is for a draft model; {type(drafter).__name__} allocates "
                       "its own state (pass draft_cache=None)")
    if draft_cache is None:
      slots = (prefilled.cache if prefilled is not None else target_cache).max_len
      draft_cache = drafter.alloc(b, p, slots, gamma)
  keys = _row_keys(key, b, sampling)
  dec = SpeculativeDecoder(target, drafter, gamma, sampling, max_new_tokens, eos_id, pad_id,
                           verify_fn)
  return dec.run(target_params, draft_params, prompts, prompt_lengths, keys, target_cache,
                 draft_cache, prefilled)
