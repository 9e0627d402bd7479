"""Choosing a layer-skip draft's layers by measured α (Draft & Verify, SWIFT).

Greedy backward elimination on validation prompts (`choose_layers`); the draft is then
`specjax.drafters.LayerSkip(target, result["layers"])`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import jax.numpy as jnp
import numpy as np

from specjax._checks import check_int
from specjax.api import generate
from specjax.drafters.layer_skip import LayerSkipLM
from specjax.measure.beta import measure_beta
from specjax.models.decoder import DecoderLM
from specjax.sampling import GREEDY

__all__ = ["choose_layers"]


def choose_layers(target: DecoderLM, params, prompts_BP, lengths_B, num_layers: int, *,
                  max_new_tokens: int = 32, sampling=None,
                  log: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
  """Picks `num_layers` of the target's layers for a layer-skip draft by α.

  The positions are the target's greedy continuations of the validation prompts; α of a subset
  is the mean of Σ_x min(p, q) there (`measure_beta`; greedy `sampling`: the share of argmax
  agreement). Starting from all layers, the layer whose removal keeps α highest is dropped
  until `num_layers` remain. Returns {"layers": chosen, "alpha": its α, "steps": [each
  removal: layer, α after, the candidates' α]}.
  """
  if not isinstance(target, DecoderLM):
    raise TypeError(f"target must be a DecoderLM (layer skipping runs a subset of its layers), "
                    f"got {type(target).__name__}")
  total = target.config.num_layers
  num_layers = check_int("num_layers", num_layers, 1, total - 1)
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
