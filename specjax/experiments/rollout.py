"""The rollout gate on a built-in tiny random pair: `python -m specjax.experiments.rollout`.

Measures a baseline and a drafter (`specjax.measure.gate.measure`), gates
(`gate`) and writes the plan (`write_plan`: rollout.md + rollout.json) — the
whole procedure of `specjax.measure.gate` end to end, on a pair small enough
to run anywhere in seconds.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import drafters
from specjax.measure.gate import gate, measure, write_plan
from specjax.models import decoder as dec_lib
from specjax.sampling import SamplingConfig

__all__ = ["DRAFTERS", "tiny_pair", "main"]


DRAFTERS = ("noisy", "small", "prompt_lookup")


@functools.lru_cache(maxsize=8)
def tiny_pair(drafter: str = "noisy", noise: float = 0.15, seed: int = 0, vocab_size: int = 64):
  """(target, target_params, draft, draft_params): a tiny random `DecoderLM`
  target (2 layers, width 32) and a drafter: "noisy" its own architecture
  with perturbed weights (high, varied α), "small" a smaller random model
  (low α), "prompt_lookup" `drafters.PromptLookup` (no weights)."""
  if drafter not in DRAFTERS:
    raise ValueError(f"drafter must be one of {DRAFTERS}, got {drafter!r}")
  target = dec_lib.DecoderLM(dec_lib.decoder_config("tiny", vocab_size=vocab_size, num_layers=2))
  key_t, key_d = jax.random.split(jax.random.key(seed))
  tp = jax.jit(target.init)(key_t)  # one compiled call: eager init is op-by-op slow
  if drafter == "prompt_lookup":
    return target, tp, drafters.PromptLookup(max_ngram=3), None
  if drafter == "small":
    draft = dec_lib.DecoderLM(dec_lib.decoder_config(
        "tiny", vocab_size=vocab_size, num_layers=1, d_model=16, num_heads=2, num_kv_heads=1,
        mlp_dim=32, tie_embeddings=True))
    return target, tp, draft, jax.jit(draft.init)(key_d)
  rng = np.random.default_rng(seed + 1)  # on the host: no compilation for a tiny tree
  noisy = jax.tree_util.tree_map(
      lambda x: jnp.asarray(np.asarray(x) + noise * np.std(np.asarray(x))
                            * rng.standard_normal(x.shape), x.dtype), tp)
  return target, tp, target, noisy


def _parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(prog="python -m specjax.experiments.rollout", description=(
      "Measure a baseline and a drafter on a built-in tiny random pair, gate, write the plan."))
  ap.add_argument("--batch", type=int, default=4, help="requests decoded together")
  ap.add_argument("--prompts", type=int, default=8, help="number of prompts")
  ap.add_argument("--prompt_len", type=int, default=16, help="tokens per prompt")
  ap.add_argument("--max_new", type=int, default=32, help="tokens generated per request")
  ap.add_argument("--gamma", type=int, default=4, help="drafts per iteration")
  ap.add_argument("--drafter", choices=DRAFTERS, default="noisy", help="built-in drafter")
  ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
  ap.add_argument("--min_alpha", type=float, default=0.55, help="the α gate")
  ap.add_argument("--p99_margin", type=float, default=0.10, help="allowed P99 ITL regression")
  ap.add_argument("--min_throughput_gain", type=float, default=0.0,
                  help="relative tokens/s gain required")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--out_dir", default=os.path.join("runs", "rollout"),
                  help="where rollout.md and rollout.json go")
  return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The CLI: tiny pair → `measure` → `gate` → `write_plan`; prints the verdict."""
  a = _parser().parse_args(argv)
  target, tp, draft, dp = tiny_pair(a.drafter, seed=a.seed)
  rng = np.random.default_rng(a.seed)
  half = rng.integers(2, target.vocab_size, size=(a.prompts, max(a.prompt_len // 2, 1)))
  prompts = np.concatenate([half, half], axis=1)[:, :a.prompt_len]  # repeats: lookup hits
  m = measure(target, tp, draft, dp, prompts, batch_size=a.batch, max_new_tokens=a.max_new,
              gamma=a.gamma, sampling=SamplingConfig(a.temperature), seed=a.seed)
  context = dict(m.context, drafter=f"{a.drafter} ({m.context['drafter']})",
                 tokens_per_call=round(m.tokens_per_call, 3),
                 outputs_identical=m.outputs_identical)
  v = gate(m.baseline, m.candidate, m.alpha, min_alpha=a.min_alpha, p99_margin=a.p99_margin,
           min_throughput_gain=a.min_throughput_gain, context=context)
  md, js = write_plan(v, a.out_dir)
  print(f"{v.verdict}: α {m.alpha:.3f}, P99 ITL {m.baseline.itl_p99_ms:.2f} → "
        f"{m.candidate.itl_p99_ms:.2f} ms, {m.baseline.tokens_per_s:.0f} → "
        f"{m.candidate.tokens_per_s:.0f} tokens/s; wrote {md} and {js}")
  for r in v.reasons:
    print(f"  - {r}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
