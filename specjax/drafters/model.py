"""The classic drafter: a separate (small) language model proposes a chain.

`ModelDrafter(model)` wraps any `LanguageModel` with the target's vocabulary; its state is the
draft's KV cache. Each iteration it sets the cache's length to seq_len - 1 and feeds [prev,
pending] in one T = 2 call (so the draft sees the last iteration's corrected / bonus token and
re-writes `prev`, which it may not hold yet), then γ - 1 single-token calls in a `lax.scan`,
drawing draft j from its processed distribution with u_BG[:, j]. Rolling back is setting
lengths. The self-speculative drafters (`LayerSkip`, `WindowedKV`) are model drafters over
models sharing the target's weights.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Tuple

import jax
import jax.numpy as jnp

from specjax.drafting import (CallLayout, DraftFeedback, DraftInput, Drafter, Proposal,
                              chain_layout)
from specjax._checks import check_bool
from specjax.protocol import check_model, check_params
from specjax.sampling import SamplingConfig, draw, process_logits

__all__ = ["ModelDrafter", "check_draft_model"]


def check_draft_model(model: Any, target: Any) -> None:
  """Checks that a draft model follows the protocol and shares the target's vocabulary (named
  TypeError / ValueError otherwise)."""
  check_model(model, "draft")
  if model.vocab_size != target.vocab_size:
    raise ValueError(
        f"draft vocab_size ({model.vocab_size}) must equal target vocab_size "
        f"({target.vocab_size}): both must share one tokenizer")


@dataclasses.dataclass(frozen=True)
class ModelDrafter(Drafter):
  """A separate draft model (see the module doc).

  Attributes:
    model: the draft, a `LanguageModel` with the target's vocabulary.
    uses_target_params: the model runs on the target's parameters (`LayerSkip`, `WindowedKV`),
      which `speculative_generate` passes; the drafter then owns no model (`owns_model`).
  """

  model: Any
  uses_target_params: bool = False

  deterministic = False
  adaptive = True
  catches_up = True

  def __post_init__(self):
    check_model(self.model, "model")
    check_bool("uses_target_params", self.uses_target_params)

  @property
  def owns_model(self) -> bool:
    return not self.uses_target_params

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  def check(self, target: Any, gamma: int) -> None:
    check_draft_model(self.model, target)

  def check_params(self, params: Any) -> None:
    if self.owns_model:  # the target's were checked as target_params
      check_params(self.model, params, "draft_params")

  def layout(self, gamma: int) -> CallLayout:
    return chain_layout(gamma)

  def alloc(self, batch_size: int, prompt_len: int, cache_len: int, gamma: int) -> Any:
    return self.model.init_cache(batch_size, cache_len, prompt_len)

  def start(self, params, state, prompts_BP, lengths_B, first_B, target_cache) -> Any:
    del first_B, target_cache
    _, _, state = self.model.prefill(params, prompts_BP, lengths_B, state)
    return state

  def propose(self, params, state, inp: DraftInput, u_BG: jax.Array, sampling: SamplingConfig,
              gamma: int) -> Tuple[Proposal, Any]:
    cache = state.replace(lengths=inp.seq_len_B - 1)
    logits_B2V, cache = self.model.extend(params, jnp.stack([inp.prev_B, inp.pending_B], axis=1),
                                          cache)
    p1_BV = process_logits(logits_B2V[:, 1], sampling)
    d1_B = draw(u_BG[:, 0], p1_BV, sampling)

    def one_step(carry, u_B):
      tok_B, c = carry
      logits_B1V, c = self.model.extend(params, tok_B[:, None], c)
      p_BV = process_logits(logits_B1V[:, 0], sampling)
      d_B = draw(u_B, p_BV, sampling)
      return (d_B, c), (d_B, p_BV)

    (_, cache), (ds_GB, ps_GBV) = jax.lax.scan(
        one_step, (d1_B, cache), jnp.swapaxes(u_BG[:, 1:gamma], 0, 1))
    drafts_BG = jnp.concatenate([d1_B[:, None], jnp.swapaxes(ds_GB, 0, 1)], axis=1)
    probs_BGV = jnp.concatenate([p1_BV[:, None], jnp.swapaxes(ps_GBV, 0, 1)], axis=1)
    b = drafts_BG.shape[0]
    proposal = Proposal(tokens_BT=jnp.concatenate([inp.pending_B[:, None], drafts_BG], axis=1),
                        valid_BKN=jnp.ones((b, 1, gamma), bool), probs_BGV=probs_BGV)
    return proposal, cache

  def update(self, params, state, feedback: DraftFeedback) -> Any:
    del params, feedback  # The next proposal rolls the cache back by its length.
    return state

  def feed(self, params, state, tokens_BT: jax.Array, start_B: jax.Array) -> Any:
    """Writes the committed tokens the draft missed (adaptive plain steps) in one call."""
    _, cache = self.model.extend(params, tokens_BT, state.replace(lengths=start_B))
    return cache

  def calls_per_iteration(self, gamma: int) -> int:
    """Draft forward passes per iteration (for the statistics)."""
    return gamma
