"""The memory a draft needs, in closed form: a classic draft model and an EAGLE-3 head.

`classic_draft_memory` counts a whole Llama-style decoder (the classic draft of Leviathan et al.
/ Chen et al.); `eagle3_head_memory` one EAGLE-3 head layer on the target (Li et al. 2025). Both
return parameters, weight bytes and KV bytes per token with a breakdown by part; a whole run's
memory plan on a mesh is `specjax.planning.memory`.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from specjax._checks import check_bool, check_int, check_real

__all__ = ["classic_draft_memory", "eagle3_head_memory"]


def _bytes_per_param(value: Any) -> float:
  return check_real("bytes_per_param", value, 0.0, lo_open=True)


def _memory(breakdown: Dict[str, int], kv_layers: int, num_kv_heads: int, head_dim: int,
            bytes_per_param: float, notes: str) -> Dict[str, Any]:
  params = int(sum(breakdown.values()))
  kv_per_token = 2 * kv_layers * num_kv_heads * head_dim * bytes_per_param
  return {"params": params, "weight_bytes": params * bytes_per_param,
          "kv_bytes_per_token": kv_per_token, "kv_layers": kv_layers,
          "bytes_per_param": bytes_per_param, "breakdown": dict(breakdown), "notes": notes}


def _attention_mlp(width_in: int, hidden: int, num_heads: int, num_kv_heads: int,
                   head_dim: int, intermediate: int) -> Dict[str, int]:
  """Parameters of one Llama layer's projections (no biases), q / k / v reading `width_in`."""
  return {
      "q_proj": width_in * num_heads * head_dim,
      "k_proj": width_in * num_kv_heads * head_dim,
      "v_proj": width_in * num_kv_heads * head_dim,
      "o_proj": num_heads * head_dim * hidden,
      "mlp": 3 * hidden * intermediate,  # gate, up (hidden → I) and down (I → hidden)
  }


def _shape_args(**named: Any) -> Dict[str, int]:
  out = {name: check_int(name, value, 1) for name, value in named.items()}
  if out["num_heads"] % out["num_kv_heads"]:
    raise ValueError(f"num_heads must be a multiple of num_kv_heads (grouped-query attention), "
                     f"got num_heads={out['num_heads']} and num_kv_heads={out['num_kv_heads']}")
  return out


def classic_draft_memory(hidden: int, num_layers: int, num_heads: int, num_kv_heads: int,
                         head_dim: int, intermediate: int, vocab: int,
                         tied_embeddings: bool = True,
                         bytes_per_param: float = 2.0) -> Dict[str, Any]:
  """Parameters, weight bytes and KV bytes per token of a Llama-style decoder.

  A classic draft is a whole small model of the target's family with its own KV cache. Counted
  (Llama 3, no biases): the embedding V·E; per layer the q/k/v/o projections (E·H·D, 2·E·K·D,
  H·D·E), the gated MLP 3·E·I and two RMSNorm scales; the final norm; an output head V·E unless
  tied. The KV cache holds 2·L·K·D values per token.

  Args:
    hidden, num_layers, num_heads, num_kv_heads, head_dim, intermediate, vocab: E, L, H, K (H a
      multiple of K), D, the MLP width I and V, integers >= 1.
    tied_embeddings: whether the output head reuses the embedding.
    bytes_per_param: bytes per weight and per cached value, > 0 (2 for bf16).

  Returns:
    A dict: "params" (int), "weight_bytes", "kv_bytes_per_token", "kv_layers",
    "bytes_per_param", "breakdown" {part: params} and "notes".
  """
  d = _shape_args(hidden=hidden, num_layers=num_layers, num_heads=num_heads,
                  num_kv_heads=num_kv_heads, head_dim=head_dim, intermediate=intermediate,
                  vocab=vocab)
  check_bool("tied_embeddings", tied_embeddings)
  b = _bytes_per_param(bytes_per_param)
  e, n = d["hidden"], d["num_layers"]
  layer = _attention_mlp(e, e, d["num_heads"], d["num_kv_heads"], d["head_dim"],
                         d["intermediate"])
  breakdown = {"embedding": d["vocab"] * e}
  breakdown.update({f"layers.{k}": n * v for k, v in layer.items()})
  breakdown["norms"] = (2 * n + 1) * e
  breakdown["lm_head"] = 0 if tied_embeddings else d["vocab"] * e
  return _memory(breakdown, n, d["num_kv_heads"], d["head_dim"], b,
                 "whole model; lm_head tied to the embedding" if tied_embeddings
                 else "whole model; own lm_head")


def eagle3_head_memory(hidden: int, num_heads: int, num_kv_heads: int, head_dim: int,
                       intermediate: int, vocab: int, draft_vocab: Optional[int] = None,
                       fused_layers: int = 3, attention_input_factor: int = 2,
                       bytes_per_param: float = 2.0) -> Dict[str, Any]:
  """Parameters, weight bytes and KV bytes per token of an EAGLE-3 draft head.

  The head (Li et al. 2025) is one decoder layer at the target's width E on top of the target:

    * fc: the hidden states of `fused_layers` target layers (3·E features) mapped to E (no bias);
    * one Llama decoder layer whose q / k / v read `attention_input_factor`·E inputs (EAGLE-3
      concatenates the token's embedding with the fused feature: 2·E), with the target's heads,
      head dimension and MLP width;
    * RMSNorm scales: input, feature ("hidden_norm"), post-attention and final (4·E);
    * the token embedding: the target's, shared;
    * the output head: the target's, shared, when `draft_vocab` is None; else its own
      E·draft_vocab head over a reduced draft vocabulary (its id lookup tables not counted).

  The head's KV cache has one layer: 2·K·D values per token. Not counted: the target's hidden
  states the head reads (transient) and the target's own weights and cache.

  Args:
    hidden, num_heads, num_kv_heads, head_dim, intermediate: the target's E, H, K (H a multiple
      of K), D and MLP width I, integers >= 1.
    vocab: the target's vocabulary (only checked against draft_vocab).
    draft_vocab: None (share the target's head) or the head's own vocabulary size, 1..vocab.
    fused_layers: target layers whose features are fused, an integer >= 1.
    attention_input_factor: the attention's input width in units of E, an integer >= 1.
    bytes_per_param: bytes per weight and per cached value, > 0 (2 for bf16).

  Returns: the dict of `classic_draft_memory`.
  """
  d = _shape_args(hidden=hidden, num_heads=num_heads, num_kv_heads=num_kv_heads,
                  head_dim=head_dim, intermediate=intermediate, vocab=vocab,
                  fused_layers=fused_layers, attention_input_factor=attention_input_factor)
  if draft_vocab is not None:
    dv = check_int("draft_vocab", draft_vocab, 1)
    if dv > d["vocab"]:
      raise ValueError(f"draft_vocab must lie in [1, vocab={d['vocab']}] (a subset of the "
                       f"target's vocabulary), got {dv}")
  b = _bytes_per_param(bytes_per_param)
  e = d["hidden"]
  breakdown = {"fc": d["fused_layers"] * e * e}
  breakdown.update(_attention_mlp(d["attention_input_factor"] * e, e, d["num_heads"],
                                  d["num_kv_heads"], d["head_dim"], d["intermediate"]))
  breakdown["norms"] = 4 * e
  breakdown["embedding"] = 0
  breakdown["lm_head"] = 0 if draft_vocab is None else dv * e
  notes = ("one layer; embedding shared with the target; "
           + ("lm_head shared with the target" if draft_vocab is None
              else f"own lm_head over {dv} draft tokens"))
  return _memory(breakdown, 1, d["num_kv_heads"], d["head_dim"], b, notes)
