"""The rollout gate on a built-in tiny random pair: `specjax-rollout` (`python -m
specjax.cli.rollout`).

`specjax.measure.gate` end to end (`measure` a baseline and a drafter, `gate`, `write_plan`:
rollout.md + rollout.json) on a pair small enough to run anywhere in seconds.
"""

from __future__ import annotations

import functools
import os
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from specjax import drafters
from specjax import cli
from specjax.measure.gate import gate, measure, write_plan
from specjax.models import decoder as dec_lib
from specjax.sampling import SamplingConfig

__all__ = ["DRAFTERS", "tiny_pair", "main", "run"]


DRAFTERS = ("noisy", "small", "prompt_lookup")


@functools.lru_cache(maxsize=8)
def tiny_pair(drafter: str = "noisy", noise: float = 0.15, seed: int = 0, vocab_size: int = 64):
  """(target, target_params, draft, draft_params): a tiny random `DecoderLM` target and a
  drafter: "noisy" the target with perturbed weights (high α), "small" a smaller random model
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


_PROG = "specjax-rollout"


def _define_flags(fv: flags.FlagValues) -> list[str]:
  """Defines the CLI's flags on `fv`; returns their names. Defined on demand, not at import:
  `specjax.cli.pick` has flags of the same names, and importing both must work."""
  holders = [
      flags.DEFINE_integer("batch", 4, "requests decoded together", flag_values=fv),
      flags.DEFINE_integer("prompts", 8, "number of prompts", flag_values=fv),
      flags.DEFINE_integer("prompt_len", 16, "tokens per prompt", flag_values=fv),
      flags.DEFINE_integer("max_new", 32, "tokens generated per request", flag_values=fv),
      flags.DEFINE_integer("gamma", 4, "drafts per iteration", flag_values=fv),
      flags.DEFINE_enum("drafter", "noisy", DRAFTERS, "built-in drafter", flag_values=fv),
      flags.DEFINE_float("temperature", 0.0, "0: greedy", flag_values=fv),
      flags.DEFINE_float("min_alpha", 0.55, "the α gate", flag_values=fv),
      flags.DEFINE_float("p99_margin", 0.10, "allowed P99 ITL regression", flag_values=fv),
      flags.DEFINE_float("min_throughput_gain", 0.0, "relative tokens/s gain required",
                         flag_values=fv),
      flags.DEFINE_integer("seed", 0, "seed of the pair, the prompts and the sampling",
                           flag_values=fv),
      flags.DEFINE_string("out_dir", os.path.join("runs", "rollout"),
                          "where rollout.md and rollout.json go", flag_values=fv),
  ]
  return [h.name for h in holders]


def _rollout(a: flags.FlagValues) -> None:
  """Tiny pair → `measure` → `gate` → `write_plan` for the parsed flags `a`; prints it."""
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


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The CLI (`_rollout`); returns the exit status. `argv`: the flags without the program name
  (default `sys.argv[1:]`), parsed into a fresh `FlagValues` (absl's global FLAGS untouched).
  Bad flags raise `absl.flags.Error`."""
  return cli.call(_PROG, _define_flags, _rollout, argv)


def run() -> None:
  """The command line through absl's `app.run` (--help, --flagfile, usage errors)."""
  cli.run(_define_flags, _rollout, __doc__)


if __name__ == "__main__":
  run()
