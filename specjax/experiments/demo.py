"""The demo job: one target, autoregressive vs speculative decoding, side by side.

Two drafters on the same random-weight target and the same prompts: prompt
lookup (`specjax.drafters.PromptLookup`) on prompts that repeat themselves —
a random model's greedy continuation of a repeated block tends to repeat it
again, so lookups get accepted — and a random draft model, which rarely
agrees with the target (a trained pair comes with the reproductions). The
walltime is measured honestly, AR and speculative interleaved: on a 2-core
CPU a verify of γ+1 tokens costs more than one decode step, so the speedup
needs many accepted tokens per call (benchmarks/README.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

import specjax
from specjax import drafters
from specjax.measure.timing import count_params, time_call
from specjax.models.decoder import DecoderLM, decoder_config


def build_pair(config):
  """Target and draft `DecoderLM`s with random weights, from a demo config."""
  target = DecoderLM(decoder_config(config.target, vocab_size=config.vocab_size))
  key_t, key_d = jax.random.split(jax.random.PRNGKey(config.seed))
  target_params = jax.jit(target.init)(key_t)
  if config.draft == "self":
    return target, target_params, target, target_params
  draft = DecoderLM(decoder_config(config.draft, vocab_size=config.vocab_size))
  return target, target_params, draft, jax.jit(draft.init)(key_d)


def demo_prompts(config) -> jax.Array:
  """`[B, P]` prompts: a random block of P/2 tokens, twice."""
  rng = np.random.default_rng(config.seed)
  half = rng.integers(2, config.vocab_size, size=(config.batch_size, config.prompt_len // 2))
  return jnp.asarray(np.concatenate([half, half], axis=1), jnp.int32)


def _measure(config, target, tp, drafter, dp, prompts, common, gamma) -> dict:
  ar_out, sp_out = {}, {}

  def ar():
    ar_out["o"] = specjax.generate(target, tp, prompts, **common)
    return ar_out["o"].tokens

  def sp():
    sp_out["o"] = specjax.speculative_generate(target, tp, drafter, dp, prompts, gamma=gamma,
                                               **common)
    return sp_out["o"].tokens
  first_ar, first_sp = time_call(ar, repeats=1), time_call(sp, repeats=1)
  t_ar, t_sp = [], []
  for _ in range(config.repeats):  # interleaved: machine noise hits both alike
    t_ar.append(time_call(ar, repeats=1, warmup=0)["median_s"])
    t_sp.append(time_call(sp, repeats=1, warmup=0)["median_s"])
  ar_s, sp_s = float(np.median(t_ar)), float(np.median(t_sp))
  out = sp_out["o"]
  n_tokens = int(jnp.sum(out.lengths))
  result = {
      "gamma": gamma, "acceptance_rate": out.acceptance_rate,
      "mean_tokens_per_iteration": out.mean_tokens_per_iteration,
      "tokens_per_target_call": out.tokens_per_target_call,
      "autoregressive_ms_per_token": 1e3 * ar_s / n_tokens * config.batch_size,
      "speculative_ms_per_token": 1e3 * sp_s / n_tokens * config.batch_size,
      "speedup": ar_s / sp_s,
      "compile_s": {"autoregressive": first_ar["first_s"], "speculative": first_sp["first_s"]},
  }
  if common["sampling"].is_greedy:
    result["greedy_outputs_identical"] = bool(jnp.all(ar_out["o"].tokens == out.tokens))
  return result


def run(config) -> dict:
  """Runs the demo and prints a summary per drafter; returns the numbers."""
  target, tp, draft, dp = build_pair(config)
  sampling = specjax.SamplingConfig(config.temperature, config.top_k, config.top_p)
  prompts = demo_prompts(config)
  key = jax.random.split(jax.random.key(config.seed), config.batch_size)
  common = dict(max_new_tokens=config.max_new_tokens, sampling=sampling, key=key)
  logging.info("target %s: %.2fM params; draft %s: %.2fM params", config.target,
               count_params(tp) / 1e6, config.draft, count_params(dp) / 1e6)
  choices = {"prompt_lookup": (drafters.PromptLookup(max_ngram=config.lookup_max_ngram), None,
                               config.lookup_gamma),
             "model": (draft, dp, config.gamma)}
  names = [n.strip() for n in str(config.drafters).split(",") if n.strip()]
  unknown = [n for n in names if n not in choices]
  if unknown or not names:
    raise ValueError(f"config.drafters must name some of {sorted(choices)}, got "
                     f"{config.drafters!r}")
  result = {"target_params": count_params(tp), "draft_params": count_params(dp),
            "batch_size": config.batch_size, "drafters": {}}
  lines = [f"target {config.target} ({result['target_params'] / 1e6:.2f}M, random weights) | "
           f"batch {config.batch_size} | prompts: a random block of {config.prompt_len // 2} "
           f"tokens, twice | temperature {config.temperature}"]
  for name in names:
    d, params, gamma = choices[name]
    r = _measure(config, target, tp, d, params, prompts, common, gamma)
    result["drafters"][name] = r
    label = (f"prompt lookup (n <= {config.lookup_max_ngram})" if name == "prompt_lookup" else
             f"draft model {config.draft} ({result['draft_params'] / 1e6:.2f}M, random weights)")
    lines += [f"-- {label}, gamma {gamma}",
              f"   acceptance rate          {r['acceptance_rate']:.3f}",
              f"   tokens per target call   {r['tokens_per_target_call']:.3f}"
              f" (per iteration {r['mean_tokens_per_iteration']:.3f})",
              f"   autoregressive           {r['autoregressive_ms_per_token']:.2f} ms/token per row",
              f"   speculative              {r['speculative_ms_per_token']:.2f} ms/token per row",
              f"   speedup (measured)       {r['speedup']:.2f}x"]
    if "greedy_outputs_identical" in r:
      lines.append(f"   greedy outputs identical {r['greedy_outputs_identical']}")
  # The first drafter's numbers at the top level, as before.
  result.update(result["drafters"][names[0]])
  print("\n".join(lines))
  return result
