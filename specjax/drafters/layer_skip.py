"""Self-speculative drafting by layer skipping (Draft & Verify, SWIFT, LayerSkip).

The draft is the target run through a static subset of its layers (embedding, the chosen blocks
in order, final norm, LM head), on the target's own parameters (no second set of weights). It
keeps its own small KV cache for the layers it runs and drafts a chain like any draft model
(`ModelDrafter`), so sampling stays exact by the rejection rule. Pass `draft_params=None`;
`specjax.measure.layers.choose_layers` picks the subset on validation prompts by measured α.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Dict, Sequence, Tuple

from specjax.drafters.model import ModelDrafter
from specjax.models.decoder import DecoderLM
from specjax.models.layers import KVCache

__all__ = ["LayerSkipLM", "LayerSkip"]


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
  """The target `DecoderLM` through `layers` only, on the target's params (a `LanguageModel`)."""

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


@dataclasses.dataclass(frozen=True, init=False)
class LayerSkip(ModelDrafter):
  """A `ModelDrafter` over `LayerSkipLM(target, layers)` on the target's params (pass
  `draft_params=None`)."""

  def __init__(self, target: DecoderLM, layers: Sequence[int]):
    object.__setattr__(self, "model", LayerSkipLM(target, tuple(layers)))
    object.__setattr__(self, "uses_target_params", True)

  @property
  def target(self) -> DecoderLM:
    return self.model.target

  @property
  def layers(self) -> Tuple[int, ...]:
    return self.model.layers
