"""The demo job: what speculative decoding buys on this machine, measured.

A small decoder is trained here on Python code (the standard library's own
sources, `experiments.data.code`; resumable, cached in the workdir: about a
minute on 2 CPU cores the first time, nothing after) and asked to continue
long prompts of code it never saw — held-out packages of the standard
library, batch 1, greedy. Code repeats itself (identifiers, call patterns,
whole lines), so prompt lookup's copied drafts get accepted for real. Side
by side, interleaved run by run: plain decoding, prompt lookup at a fixed γ,
and prompt lookup with `gamma="auto"` (γ chosen per iteration, 0 included:
it drafts where copying pays and falls back to plain steps where it does
not). Every output is checked token for token against plain greedy
decoding. Printed: α, tokens per target call, ms per token of each, the
speedups, and the γ `auto` chose.
"""

from __future__ import annotations

import os
import time
from typing import Dict

import jax
import numpy as np
from absl import logging

import specjax
from specjax.atomic_io import atomic_write_json
from specjax.measure.provenance import provenance
from specjax.drafters import PromptLookup
from experiments.programs import long_context, report
from experiments.programs.chen import decoder
from experiments.programs.common import open_workdir, train_config, train_or_restore
from experiments.programs.long_context_measure import repo_prompts
from specjax.measure.timing import count_params, now
from specjax.training import LMSource, lm_examples

__all__ = ["train_target", "run"]


def train_target(cfg, tok, records, workdir: str):
  """(model, params): the demo's target, trained on packed code rows (or
  restored from `workdir/target` when a finished run left it)."""
  model = decoder(cfg.model, tok.vocab_size)
  examples = {}

  def source():
    examples.setdefault("ex", lm_examples(records, tok, None, "{inputs}"))
    return LMSource(examples["ex"], int(cfg.train_seq_len), packing=True)

  t0 = time.time()
  params = train_or_restore(model, source, train_config(cfg.train),
                            os.path.join(workdir, "target"))
  logging.info("target ready in %.1f s (%.2fM params)", time.time() - t0,
               count_params(params) / 1e6)
  return model, params


def _timed(fn):
  t0 = now()
  out = fn()
  jax.block_until_ready(out.tokens)
  return out, now() - t0


def run(cfg) -> dict:
  """Trains (or reuses) the target, decodes, prints the comparison; returns
  the numbers (also written to `<workdir>/demo.json`)."""
  names = [n.strip() for n in str(cfg.drafters).split(",") if n.strip()]
  allowed = ("lookup", "lookup_auto", "lookup_series")
  if not names or any(n not in allowed for n in names):
    raise ValueError(f"config.drafters must name some of {list(allowed)}, got "
                     f"{cfg.drafters!r}")
  workdir = open_workdir(cfg.workdir)
  tok, records, streams = long_context.prepare(cfg)
  target, tp = train_target(cfg, tok, records, workdir)
  prompts = repo_prompts(streams, int(cfg.prompt_len), int(cfg.num_prompts),
                         int(cfg.max_new_tokens))
  common = dict(max_new_tokens=int(cfg.max_new_tokens), sampling=specjax.GREEDY,
                eos_id=None)
  lookup = PromptLookup(max_ngram=int(cfg.lookup_max_ngram))
  runs = {
      "lookup": lambda x: specjax.speculative_generate(target, tp, lookup, None, x,
                                                       gamma=int(cfg.gamma), **common),
      "lookup_auto": lambda x: specjax.speculative_generate(target, tp, lookup, None, x,
                                                            gamma="auto", **common),
      # The prompts as one series: each call starts from what the last learned.
      "lookup_series": lambda x: specjax.speculative_generate(
          target, tp, lookup, None, x, gamma="auto", acceptance=carried[0], **common),
  }
  carried = [specjax.Acceptance.fresh()]
  t_cal = now()
  for x in prompts[:1]:   # compile everything (and measure auto's γ costs) outside the timings
    x = x[None]
    _timed(lambda: specjax.generate(target, tp, x, **common))
    for n in names:
      _timed(lambda n=n: runs[n](x))
  carried[0] = specjax.Acceptance.fresh()
  setup_s = now() - t_cal
  seconds = {"ar": 0.0, **{n: 0.0 for n in names}}
  stats: Dict[str, dict] = {n: {"drafted": 0, "accepted": 0, "tokens": 0, "calls": 0,
                                "identical": True, "gamma": {}} for n in names}
  tokens = 0
  for _ in range(int(cfg.repeats)):
    for x in prompts:
      x = x[None]
      ar, t = _timed(lambda: specjax.generate(target, tp, x, **common))
      seconds["ar"] += t
      tokens += int(ar.lengths.sum())
      for n in names:
        out, t = _timed(lambda n=n: runs[n](x))
        if n == "lookup_series":
          carried[0] = out.stats.acceptance
        seconds[n] += t
        s = stats[n]
        s["drafted"] += int(out.stats.drafted.sum())
        s["accepted"] += int(out.stats.accepted.sum())
        s["tokens"] += int(out.lengths.sum())
        s["calls"] += int(out.stats.target_calls.sum())
        s["identical"] &= bool(np.array_equal(np.asarray(out.tokens), np.asarray(ar.tokens)))
        if out.stats.gamma_trace is not None:
          trace = np.asarray(out.stats.gamma_trace)
          for g in trace[trace >= 0].tolist():
            s["gamma"][str(g)] = s["gamma"].get(str(g), 0) + 1
  ar_ms = 1e3 * seconds["ar"] / tokens
  result = {"target_params": count_params(tp), "prompt_len": int(cfg.prompt_len),
            "num_prompts": int(len(prompts)), "max_new_tokens": int(cfg.max_new_tokens),
            "repeats": int(cfg.repeats), "setup_s": setup_s,
            "autoregressive_ms_per_token": ar_ms, "drafters": {}}
  lines = [f"target: {result['target_params'] / 1e6:.2f}M-parameter decoder trained here on "
           f"Python code | {len(prompts)} prompts of {cfg.prompt_len} tokens from held-out "
           f"packages | batch 1, greedy, {cfg.max_new_tokens} new tokens",
           f"   autoregressive           {ar_ms:.2f} ms/token"]
  for n in names:
    s = stats[n]
    ms = 1e3 * seconds[n] / s["tokens"]
    r = {"acceptance_rate": s["accepted"] / max(s["drafted"], 1),
         "tokens_per_target_call": s["tokens"] / s["calls"], "ms_per_token": ms,
         "speedup": ar_ms / ms, "greedy_outputs_identical": s["identical"],
         "gamma": int(cfg.gamma) if n == "lookup" else "auto"}
    if s["gamma"]:
      r["gamma_chosen"] = dict(sorted(s["gamma"].items(), key=lambda kv: int(kv[0])))
    result["drafters"][n] = r
    label = {"lookup": f"prompt lookup, gamma {cfg.gamma}",
             "lookup_auto": "prompt lookup, gamma='auto'",
             "lookup_series": "prompt lookup, gamma='auto', one series"}[n]
    lines += [f"-- {label}",
              f"   acceptance rate          {r['acceptance_rate']:.3f}",
              f"   tokens per target call   {r['tokens_per_target_call']:.3f}",
              f"   speculative              {ms:.2f} ms/token",
              f"   speedup (measured)       {r['speedup']:.2f}x",
              f"   greedy outputs identical {r['greedy_outputs_identical']}"]
    if "gamma_chosen" in r:
      lines.append("   gamma chosen (iterations) " + ", ".join(
          f"{g}: {c}" for g, c in r["gamma_chosen"].items()))
  lines.append(f"(compilation and auto's one-time cost calibration: {setup_s:.1f} s, outside "
               "the timings)")
  result.update(result["drafters"][names[0]])   # the first drafter's numbers at the top level
  result["machine"] = report.machine_info()
  result["provenance"] = provenance()
  atomic_write_json(os.path.join(workdir, "demo.json"), result)
  print("\n".join(lines))
  return result
