"""Measuring how well a draft matches a target: α from exact distributions.

Leviathan et al. define α = E[β] with β = Σ_x min(p(x), q(x)) over the positions the target
generates. `measure_beta` teacher-forces both models on given continuations and returns β at
every position; `alpha_vs_kl` computes α and a pair's KL divergences exactly from their logits
over a temperature sweep.
"""

from __future__ import annotations

import functools
from typing import Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from specjax.protocol import required_cache_len
from specjax.sampling import SamplingConfig, process_logits

__all__ = ["position_distributions", "measure_beta", "alpha_vs_kl"]


@functools.partial(jax.jit, static_argnames=("model", "sampling"))
def position_distributions(model, params, prompts_BP, prompt_lengths_B, tokens_BN,
                           sampling: SamplingConfig) -> jax.Array:
  """Processed next-token distributions `[B, N, V]` of `model` at the N positions where
  tokens_BN[b, :] were generated after prompt b (the prefill, then one extend over
  tokens[:, :-1]). Jitted; `model` and `sampling` are static."""
  b, p = prompts_BP.shape
  n = tokens_BN.shape[1]
  cache = model.init_cache(b, required_cache_len(model, p, n), p)
  first_BV, _, cache = model.prefill(params, prompts_BP, prompt_lengths_B, cache)
  if n > 1:
    rest_BTV, _ = model.extend(params, tokens_BN[:, :-1], cache)
    logits = jnp.concatenate([first_BV[:, None], rest_BTV], axis=1)
  else:
    logits = first_BV[:, None]
  return process_logits(logits, sampling)


def measure_beta(target, target_params, draft, draft_params, prompts_BP, prompt_lengths_B,
                 tokens_BN, token_lengths_B, sampling: SamplingConfig
                 ) -> Tuple[jax.Array, jax.Array]:
  """β = Σ min(p, q) at each generated position.

  Returns `(beta_BN, mask_BN)`; mask marks the positions < token_lengths_B. α is
  `sum(beta * mask) / sum(mask)`. Greedy: β is 1 where the argmaxes agree, else 0.
  """
  q = position_distributions(target, target_params, prompts_BP, prompt_lengths_B, tokens_BN,
                             sampling)
  p = position_distributions(draft, draft_params, prompts_BP, prompt_lengths_B, tokens_BN,
                             sampling)
  beta = jnp.sum(jnp.minimum(p, q), axis=-1)
  mask = jnp.arange(tokens_BN.shape[1])[None] < token_lengths_B[:, None]
  return beta, mask


def _log_softmax(x: np.ndarray) -> np.ndarray:
  """log softmax over the last axis in float64; -inf logits stay -inf."""
  m = np.max(x, axis=-1, keepdims=True)
  z = x - m
  return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def _kl(logp_a: np.ndarray, logp_b: np.ndarray) -> np.ndarray:
  """KL(a‖b) over the last axis (0·log 0 = 0; +inf where b = 0 < a)."""
  pa = np.exp(logp_a)
  with np.errstate(invalid="ignore"):
    terms = np.where(pa > 0, pa * (logp_a - logp_b), 0.0)
  return np.sum(terms, axis=-1)


def alpha_vs_kl(p_logits: ArrayLike, q_logits: ArrayLike, temperatures: Sequence[float],
                weights: Optional[ArrayLike] = None) -> Dict[str, np.ndarray]:
  """α = E[Σ min(p, q)] and the KL divergences of a pair over a temperature sweep.

  At each temperature T both models' logits are divided by T (p the draft's, q the target's,
  as in `specjax.theory`); per context β = Σ_x min(p(x), q(x)) (the acceptance probability,
  Leviathan et al. Theorem 3.5), KL(p‖q) = Σ p log(p/q), KL(q‖p) = Σ q log(q/p), averaged over
  the contexts with `weights`. β = 1 exactly when p = q, i.e. when either KL is 0; Pinsker's
  inequality gives 1 − β = TV(p, q) <= sqrt(KL / 2), so α >= 1 − sqrt(E[KL]/2). Computed in
  float64 from the logits (no sampling), the same T for draft and target.

  Args:
    p_logits: the draft's logits `[..., V]`.
    q_logits: the target's logits `[..., V]`; the two broadcast together (a unigram draft `[V]`
      against a bigram target `[V, V]`: one context per previous token). -inf entries are
      allowed, but every context needs a finite logit in each model.
    temperatures: one or more temperatures, each > 0.
    weights: non-negative weights of the contexts (the broadcast shape without the vocabulary
      axis), not all 0; default uniform.

  Returns:
    A dict of float arrays `[num_temperatures]`: "temperature", "alpha", "kl_pq" (KL(p‖q),
    draft‖target) and "kl_qp" (KL(q‖p)); KL is +inf where one model gives probability 0 to a
    token the other can emit.
  """
  arrs = {}
  for name, value in (("p_logits", p_logits), ("q_logits", q_logits)):
    if isinstance(value, (str, bytes)):
      raise TypeError(f"{name} must be an array of real logits, got the string {value!r}")
    arr = np.asarray(value)
    if arr.dtype.kind not in "iuf":
      raise TypeError(f"{name} must hold real logits (int or float dtype), got dtype "
                      f"{arr.dtype}")
    arr = arr.astype(np.float64)
    if arr.ndim == 0:
      raise ValueError(f"{name} must have a vocabulary axis (at least 1-D), got a scalar")
    if np.isnan(arr).any() or np.isposinf(arr).any():
      raise ValueError(f"{name} must be finite or -inf (a masked token), got NaN or +inf")
    if not np.isfinite(arr).any(axis=-1).all():
      raise ValueError(f"{name} must have a finite logit in every context (a row of -inf is "
                       "no distribution)")
    arrs[name] = arr
  try:
    p_arr, q_arr = np.broadcast_arrays(arrs["p_logits"], arrs["q_logits"])
  except ValueError:
    raise ValueError(f"p_logits and q_logits must broadcast together, got shapes "
                     f"{arrs['p_logits'].shape} and {arrs['q_logits'].shape}") from None
  temps = np.atleast_1d(np.asarray(temperatures))
  if temps.dtype.kind not in "iuf" or temps.ndim != 1 or temps.size == 0:
    raise ValueError(f"temperatures must be one or more real numbers, got {temperatures!r}")
  temps = temps.astype(np.float64)
  if not (np.isfinite(temps) & (temps > 0)).all():
    raise ValueError(f"temperatures must be finite and > 0, got {temps.tolist()!r}")
  contexts = p_arr.shape[:-1]
  if weights is None:
    w = np.ones(contexts, np.float64)
  else:
    w = np.asarray(weights)
    if w.dtype.kind not in "iuf":
      raise TypeError(f"weights must be real numbers, got dtype {w.dtype}")
    w = w.astype(np.float64)
    if w.shape != contexts:
      raise ValueError(f"weights must have the contexts' shape {contexts} (the logits' "
                       f"broadcast shape without the vocabulary axis), got {w.shape}")
    if not np.isfinite(w).all() or (w < 0).any() or not w.sum() > 0:
      raise ValueError("weights must be finite, >= 0 and not all 0, got "
                       f"min {w.min() if w.size else None!r} and sum {w.sum()!r}")
  w = w / w.sum()
  out = {"temperature": temps, "alpha": np.empty_like(temps), "kl_pq": np.empty_like(temps),
         "kl_qp": np.empty_like(temps)}
  for i, t in enumerate(temps):
    logp, logq = _log_softmax(p_arr / t), _log_softmax(q_arr / t)
    beta = np.clip(np.sum(np.minimum(np.exp(logp), np.exp(logq)), axis=-1), 0.0, 1.0)
    out["alpha"][i] = np.sum(w * beta)
    with np.errstate(invalid="ignore"):
      out["kl_pq"][i] = np.sum(np.where(w > 0, w * _kl(logp, logq), 0.0))
      out["kl_qp"][i] = np.sum(np.where(w > 0, w * _kl(logq, logp), 0.0))
  return out
