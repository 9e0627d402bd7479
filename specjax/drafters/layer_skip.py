"""Self-speculative drafting by layer skipping (Draft & Verify, SWIFT, LayerSkip).

The draft is the target itself run through a static subset of its layers —
the embedding, the chosen blocks in order, the final norm and the LM head,
all with the target's own parameters (no second set of weights in memory).
It keeps its own small KV cache for the layers it runs and drafts a chain
like any draft model (`ModelDrafter`), so sampling stays exact by the
rejection rule.

  drafter = LayerSkip(target, layers=(0, 1, 2, 5))
  out = specjax.speculative_generate(target, tp, drafter, None, prompts, ...)

`choose_layers` picks the subset on validation prompts by measured α
(greedy backward elimination: drop, one at a time, the layer whose removal
keeps α highest), and reports every step.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters.model import ModelDrafter
from specjax.models.decoder import DecoderLM
from specjax.models.layers import KVCache

__all__ = ["LayerSkipLM", "LayerSkip", "choose_layers"]


def _check_layers(target: Any, layers: Sequence[int]) -> Tuple[int, ...]:
  if not isinstance(target, DecoderLM):
    raise TypeError(f"layer skipping runs a subset of a DecoderLM's layers; target is a "
                    f"{type(target).__name__}")
  n = target.config.num_layers
  try:
    layers = tuple(layers)
  except TypeError:
    raise TypeError(f"layers must be a sequence of layer indices, got {layers!r}") from None
  if not layers:
    raise ValueError("layers must name at least one of the target's layers, got an empty subset")
  bad = [l for l in layers if isinstance(l, bool) or not isinstance(l, numbers.Integral)
         or not 0 <= l < n]
  if bad:
    raise ValueError(f"layers must be indices in [0, {n}) (the target has {n} layers), got "
                     f"{list(layers)}")
  if list(layers) != sorted(set(layers)):
    raise ValueError(f"layers must be strictly increasing (each layer once, in order), got "
                     f"{list(layers)}")
  return tuple(int(l) for l in layers)


@dataclasses.dataclass(frozen=True)
class LayerSkipLM:
  """The target `DecoderLM` through `layers` only, on the target's params
  (a `specjax.protocol.LanguageModel`)."""

  target: DecoderLM
  layers: Tuple[int, ...]

  def __post_init__(self):
    object.__setattr__(self, "layers", _check_layers(self.target, self.layers))

  @property
  def sub(self) -> DecoderLM:
    return DecoderLM(self.target.config.replace(num_layers=len(self.layers)))

  @property
  def vocab_size(self) -> int:
    return self.target.vocab_size

  def sub_params(self, params: Dict[str, Any]) -> Dict[str, Any]:
    """The target's params relabelled for the subset (no copy)."""
    out = {k: v for k, v in params.items() if not k.startswith("layer_")}
    for j, i in enumerate(self.layers):
      out[f"layer_{j}"] = params[f"layer_{i}"]
    return out

  def init_cache(self, batch_size: int, max_len: int, prompt_len: int = 0) -> KVCache:
    return self.sub.init_cache(batch_size, max_len, prompt_len)

  def prefill_positions(self, prompt_len: int) -> int:
    return prompt_len

  def prefill(self, params, prompts_BP, prompt_lengths_B, cache):
    return self.sub.prefill(self.sub_params(params), prompts_BP, prompt_lengths_B, cache)

  def extend(self, params, tokens_BT, cache, positions_BT=None, mask_TT=None):
    return self.sub.extend(self.sub_params(params), tokens_BT, cache, positions_BT, mask_TT)

  def forward(self, params, tokens_BT):
    return self.sub.forward(self.sub_params(params), tokens_BT)


def LayerSkip(target: DecoderLM, layers: Sequence[int]) -> ModelDrafter:  # pylint: disable=invalid-name
  """The layer-skip drafter: a `ModelDrafter` over `LayerSkipLM(target,
  layers)` that runs on the target's params (pass `draft_params=None`)."""
  return ModelDrafter(LayerSkipLM(target, tuple(layers)), shares_target_params=True)


def choose_layers(target: DecoderLM, params, prompts_BP, lengths_B, num_layers: int, *,
                  max_new_tokens: int = 32, sampling=None,
                  log: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
  """Picks `num_layers` of the target's layers for a layer-skip draft by α.

  The target's own greedy continuations of the validation prompts are the
  positions; α of a subset is the mean of Σ_x min(p, q) there
  (`specjax.measure_beta`; with a greedy `sampling`, the share of positions
  where the subset's argmax equals the target's). Starting from all layers,
  the layer whose removal keeps α highest is dropped, until `num_layers`
  remain. Returns {"layers": chosen, "alpha": its α, "steps": [each
  removal: layer, α after, the candidates' α]}.
  """
  from specjax.analysis import measure_beta  # pylint: disable=g-import-not-at-top
  from specjax.api import generate  # pylint: disable=g-import-not-at-top
  from specjax.sampling import GREEDY  # pylint: disable=g-import-not-at-top
  total = target.config.num_layers
  if isinstance(num_layers, bool) or not isinstance(num_layers, numbers.Integral) or \
      not 1 <= num_layers < total:
    raise ValueError(f"num_layers must be an int in [1, {total}) (the target has {total} "
                     f"layers), got {num_layers!r}")
  sampling = GREEDY if sampling is None else sampling
  prompts_BP, lengths_B = jnp.asarray(prompts_BP, jnp.int32), jnp.asarray(lengths_B, jnp.int32)
  out = generate(target, params, prompts_BP, lengths_B, max_new_tokens=max_new_tokens,
                 sampling=GREEDY)
  tokens_BN, token_lengths_B = out.tokens, out.lengths

  def alpha(layers):
    beta, mask = measure_beta(target, params, LayerSkipLM(target, layers), params, prompts_BP,
                              lengths_B, tokens_BN, token_lengths_B, sampling)
    beta, mask = np.asarray(beta), np.asarray(mask)
    return float((beta * mask).sum() / max(mask.sum(), 1))

  current: List[int] = list(range(total))
  steps = []
  while len(current) > num_layers:
    scores = {l: alpha(tuple(x for x in current if x != l)) for l in current}
    drop = max(scores, key=lambda l: (scores[l], l))
    current.remove(drop)
    steps.append({"dropped": drop, "alpha": scores[drop], "candidates": scores})
    if log:
      log(f"layer skip: dropped layer {drop}, α = {scores[drop]:.3f} with layers {current}")
  return {"layers": tuple(current), "alpha": steps[-1]["alpha"], "steps": steps}
