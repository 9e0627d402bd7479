"""The demo job: one pair, autoregressive vs speculative, side by side."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

import specjax
from specjax.bench.timing import count_params, time_call
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


def run(config) -> dict:
  """Runs the demo and logs/prints a summary table; returns the numbers."""
  target, tp, draft, dp = build_pair(config)
  sampling = specjax.SamplingConfig(config.temperature, config.top_k, config.top_p)
  rng = np.random.default_rng(config.seed)
  prompts = jnp.asarray(rng.integers(2, config.vocab_size,
                                     size=(config.batch_size, config.prompt_len)), jnp.int32)
  key = jax.random.split(jax.random.key(config.seed), config.batch_size)
  common = dict(max_new_tokens=config.max_new_tokens, sampling=sampling, key=key)
  logging.info("target %s: %.2fM params; draft %s: %.2fM params", config.target,
               count_params(tp) / 1e6, config.draft, count_params(dp) / 1e6)

  ar_out = {}
  def ar():
    ar_out["o"] = specjax.generate(target, tp, prompts, **common)
    return ar_out["o"].tokens
  sp_out = {}
  def sp():
    sp_out["o"] = specjax.speculative_generate(target, tp, draft, dp, prompts,
                                               gamma=config.gamma, **common)
    return sp_out["o"].tokens
  # Interleave the two so machine noise hits both alike.
  t_ar, t_sp = [], []
  first_ar = time_call(ar, repeats=1)
  first_sp = time_call(sp, repeats=1)
  for _ in range(config.repeats):
    t_ar.append(time_call(ar, repeats=1, warmup=0)["median_s"])
    t_sp.append(time_call(sp, repeats=1, warmup=0)["median_s"])
  ar_s, sp_s = float(np.median(t_ar)), float(np.median(t_sp))
  out = sp_out["o"]
  n_tokens = int(jnp.sum(out.lengths))
  result = {
      "target_params": count_params(tp), "draft_params": count_params(dp),
      "batch_size": config.batch_size, "gamma": config.gamma,
      "acceptance_rate": out.acceptance_rate,
      "mean_tokens_per_iteration": out.mean_tokens_per_iteration,
      "tokens_per_target_call": out.tokens_per_target_call,
      "autoregressive_ms_per_token": 1e3 * ar_s / n_tokens * config.batch_size,
      "speculative_ms_per_token": 1e3 * sp_s / n_tokens * config.batch_size,
      "speedup": ar_s / sp_s,
      "compile_s": {"autoregressive": first_ar["first_s"], "speculative": first_sp["first_s"]},
  }
  if sampling.is_greedy:
    result["greedy_outputs_identical"] = bool(jnp.all(ar_out["o"].tokens == out.tokens))
  lines = [
      f"target {config.target} ({result['target_params'] / 1e6:.2f}M) | draft {config.draft} "
      f"({result['draft_params'] / 1e6:.2f}M) | batch {config.batch_size} | gamma {config.gamma}"
      f" | temperature {config.temperature}",
      f"acceptance rate          {result['acceptance_rate']:.3f}",
      f"tokens per target call   {result['tokens_per_target_call']:.3f}"
      f" (per iteration {result['mean_tokens_per_iteration']:.3f})",
      f"autoregressive           {result['autoregressive_ms_per_token']:.2f} ms/token per row",
      f"speculative              {result['speculative_ms_per_token']:.2f} ms/token per row",
      f"speedup (measured)       {result['speedup']:.2f}x",
  ]
  if "greedy_outputs_identical" in result:
    lines.append(f"greedy outputs identical {result['greedy_outputs_identical']}")
  print("\n".join(lines))
  return result
