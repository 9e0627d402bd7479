"""Suffix drafting against prompt lookup on the workloads it is for
(`SuffixDraft`, SuffixDecoding: arXiv 2411.04975): one request after
another at batch 1, greedy, every drafter interleaved with plain decoding
request by request, every output checked token for token against it.

Tasks:

* `code_edits`: agent-like edit sessions over held-out code — a file window
  (the demo's held-out packages and its trained code decoder,
  `experiments.programs.demo`), then the same file again after each of
  `turns - 1` small edits (a few tokens of it rewritten with code from
  elsewhere); each request asks the model to continue the current version.
  Requests of one session are near-duplicates, as an agent's are.
* `summarize`: the families comparison's summarisation prompts
  ("<description> Summary:", Debian package descriptions) on the Chen
  reproduction's trained decoder (`chen_dir`, after
  `experiments/chen_chinchilla.py`): summaries copy phrases from the input
  and share boilerplate with each other.

Drafters: prompt lookup at γ = 8 and 16 (the last n-gram's most recent
continuation), `SuffixDraft` over the request alone, and `SuffixDraft` with
the job's corpus (`SuffixCorpus`: every earlier output of this run). Reported:
tokens per target call (τ), accepted / drafted (for a tree: / its deepest
path), ms per token, the speedup
over plain decoding measured in the same run, and τ relative to prompt
lookup's.
"""

from __future__ import annotations

import os
from typing import Dict, List, Tuple

import jax
import numpy as np
from absl import logging

import specjax
from specjax.atomic_io import atomic_write_json, atomic_write_text
from specjax.checkpoints.orbax_io import restore_model
from experiments.data import load_task
from specjax.drafters import PromptLookup, SuffixCorpus, SuffixDraft, outputs_of
from experiments.programs import long_context, report
from experiments.programs.common import find_tokenizer, open_workdir, pad_batch
from experiments.programs.demo import train_target
from experiments.programs.long_context_measure import repo_prompts
from specjax.measure.provenance import provenance, provenance_sentence
from specjax.measure.timing import now

__all__ = ["edit_sessions", "measure_task", "render", "run"]


def edit_sessions(streams: Dict[str, np.ndarray], sessions: int, turns: int, prompt_len: int,
                  edit_max: int = 8, seed: int = 0) -> List[np.ndarray]:
  """`sessions × turns` requests (int32 `[prompt_len]` each, in order): a
  file window of the held-out streams, then `turns - 1` versions of it, each
  the last with one edit — `k` ≤ `edit_max` consecutive tokens, in its first
  90%, replaced by `k` tokens from elsewhere in the streams (deterministic)."""
  rng = np.random.default_rng(seed)
  donor = np.concatenate([v for _, v in sorted(streams.items())]).astype(np.int32)
  out = []
  for base in repo_prompts(streams, prompt_len, sessions, 1):
    version = base.copy()
    out.append(version.copy())
    for _ in range(turns - 1):
      k = int(rng.integers(1, edit_max + 1))
      at = int(rng.integers(0, max(int(0.9 * prompt_len) - k, 1)))
      src = int(rng.integers(0, len(donor) - k))
      version[at:at + k] = donor[src:src + k]
      out.append(version.copy())
  return out


def _drafters(cfg) -> Dict[str, Tuple[object, object]]:
  """{name: (drafter, gamma)}; the corpus row's params come from the run."""
  suffix = SuffixDraft(max_match=int(cfg.max_match), nodes=int(cfg.nodes),
                       depth=int(cfg.depth), factor=float(cfg.factor),
                       min_prob=float(cfg.min_prob))
  lookup = PromptLookup(max_ngram=int(cfg.lookup_max_ngram))
  return {f"prompt lookup γ={g}": (lookup, int(g)) for g in cfg.lookup_gammas} | {
      "suffix": (suffix, None), "suffix + job corpus": (suffix, None)}


def measure_task(cfg, model, params, requests: List[Tuple[np.ndarray, int]],
                 max_new: int, eos_id=None) -> dict:
  """Every request (tokens, length) in order through plain decoding and each
  drafter; the job corpus grows by each request's output."""
  drafters = _drafters(cfg)
  common = dict(max_new_tokens=max_new, sampling=specjax.GREEDY, eos_id=eos_id)
  vocab = model.vocab_size

  def call(name, x, n, corpus):
    if name == "ar":
      return specjax.generate(model, params, x, n, **common)
    d, g = drafters[name]
    dp = corpus if name.endswith("corpus") else None
    return specjax.speculative_generate(model, params, d, dp, x, n, gamma=g, **common)

  def timed(name, x, n, corpus):
    t0 = now()
    out = call(name, x, n, corpus)
    jax.block_until_ready(out.tokens)
    return out, now() - t0

  empty = SuffixCorpus.build([], int(cfg.corpus_size), vocab)
  t0 = now()
  x0, n0 = requests[0]
  for name in ["ar", *drafters]:   # compile outside the timings
    timed(name, x0[None], np.asarray([n0], np.int32), empty)
  setup_s = now() - t0
  names = ["ar", *drafters]
  tot = {k: {"s": 0.0, "tokens": 0, "calls": 0, "drafted": 0, "accepted": 0, "identical": True}
         for k in names}
  corpus = empty
  for i, (x, n) in enumerate(requests):
    x, n = x[None], np.asarray([n], np.int32)
    ref = None
    for name in names:
      out, s = timed(name, x, n, corpus)
      t = tot[name]
      t["s"] += s
      t["tokens"] += int(out.lengths.sum())
      if name == "ar":
        ref = out
        continue
      t["calls"] += int(out.stats.target_calls.sum())
      t["drafted"] += int(out.stats.drafted.sum())
      t["accepted"] += int(out.stats.accepted.sum())
      t["identical"] &= bool(np.array_equal(np.asarray(out.tokens), np.asarray(ref.tokens)))
    corpus = corpus.add(outputs_of(ref), vocab)
    if (i + 1) % max(len(requests) // 4, 1) == 0:
      done = sum(v["s"] for v in tot.values())
      logging.info("%d/%d requests, %.2f requests/s, ETA %.0f s", i + 1, len(requests),
                   (i + 1) / done, done / (i + 1) * (len(requests) - i - 1))
  ar_ms = 1e3 * tot["ar"]["s"] / tot["ar"]["tokens"]
  rows = {}
  for name in drafters:
    t = tot[name]
    ms = 1e3 * t["s"] / t["tokens"]
    rows[name] = {"tokens_per_call": t["tokens"] / t["calls"],
                  "accepted_per_drafted": t["accepted"] / max(t["drafted"], 1),
                  "ms_per_token": ms, "speedup": ar_ms / ms,
                  "greedy_outputs_identical": t["identical"],
                  "call_tokens": drafters[name][0].layout(drafters[name][1] or 1).length}
  base = max(rows[k]["tokens_per_call"] for k in rows if k.startswith("prompt lookup"))
  for r in rows.values():
    r["tau_vs_best_lookup"] = r["tokens_per_call"] / base
  return {"requests": len(requests), "max_new": max_new, "ar_ms_per_token": ar_ms,
          "tokens": tot["ar"]["tokens"], "setup_s": setup_s, "rows": rows}


def _code_task(cfg):
  if cfg.smoke:
    from specjax.models.decoder import DecoderLM, decoder_config
    model = DecoderLM(decoder_config("tiny", vocab_size=64, num_layers=2))
    params = model.init(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    streams = {"a": rng.integers(3, 64, size=400).astype(np.int32)}
    streams["a"][200:] = streams["a"][:200]
    source = "tiny random-init decoder; random repeated tokens"
  else:
    tok, records, streams = long_context.prepare(cfg.code)
    model, params = train_target(cfg.code, tok, records, open_workdir(cfg.code.workdir))
    source = (f"the demo's code decoder ({sum(x.size for x in jax.tree.leaves(params)) / 1e6:.1f}M"
              f" params); held-out packages {list(cfg.code.data.heldout)}")
  reqs = edit_sessions(streams, int(cfg.sessions), int(cfg.turns), int(cfg.prompt_len),
                       int(cfg.edit_max), int(cfg.seed))
  return model, params, [(r, len(r)) for r in reqs], source


def _summarize_task(cfg):
  if cfg.smoke:
    from specjax.models.decoder import DecoderLM, decoder_config
    model = DecoderLM(decoder_config("tiny", vocab_size=64, num_layers=2))
    params = model.init(jax.random.PRNGKey(1))
    rng = np.random.default_rng(1)
    # The code task's prompt length: the smoke run's two tasks share their programs.
    rows = [list(np.tile(rng.integers(3, 64, size=8), int(cfg.prompt_len) // 8))
            for _ in range(int(cfg.summaries))]
    return model, params, rows, None, "tiny random-init decoder; random repeated tokens"
  chen = os.path.abspath(cfg.chen_dir)
  final = os.path.join(chen, "target", "final")
  if not os.path.isdir(final):
    raise FileNotFoundError(f"no trained Chen target at {final}: run experiments/"
                            f"chen_chinchilla.py first (or set --config.chen_dir, or drop "
                            f"'summarize' from --config.tasks)")
  model, params = restore_model(final)
  tok, path = find_tokenizer(cfg.data_cache, "chen", model.vocab_size, chen)
  if tok is None:
    raise FileNotFoundError(f"no Chen vocabulary of size {model.vocab_size} under "
                            f"{cfg.data_cache}/vocab")
  p = int(cfg.summary_prompt_len)
  rows = [tok.encode(f"{r['inputs']} Summary:", add_eos=False)[-p:]
          for r in load_task("summarize_debian", "test", cfg.data_cache)[:int(cfg.summaries)]]
  return (model, params, rows, tok.eos_id,
          f"summarize_debian test ('<description> Summary:') on the Chen target in "
          f"{cfg.chen_dir}; tokenizer {path}")


def render(res: dict) -> str:
  lines = ["# Suffix drafting vs prompt lookup", "",
           "Batch 1, greedy; each drafter interleaved with plain decoding request by request; "
           "τ = tokens per target call." + provenance_sentence(res), ""]
  for task, r in res["tasks"].items():
    lines += [f"## {task}: {r['source']}", "",
              f"{r['requests']} requests, {r['max_new']} new tokens at most; plain decoding "
              f"{r['ar_ms_per_token']:.2f} ms/token.", "",
              "| drafter | call tokens | τ | τ / best prompt lookup | accepted / deepest draft | "
              "ms/token | speedup | greedy identical |", "|---" * 8 + "|"]
    for name, x in r["rows"].items():
      lines.append(f"| {name} | {x['call_tokens']} | {x['tokens_per_call']:.2f} | "
                   f"{x['tau_vs_best_lookup']:.2f}× | {x['accepted_per_drafted']:.3f} | "
                   f"{x['ms_per_token']:.2f} | {x['speedup']:.2f}× | "
                   f"{x['greedy_outputs_identical']} |")
    lines.append("")
  return "\n".join(lines)


def run(cfg) -> dict:
  """Measures every task of `cfg.tasks`; writes suffix.{json,md} to the
  workdir (and `cfg.results_dir` when set)."""
  tasks = [t.strip() for t in cfg.tasks]
  unknown = [t for t in tasks if t not in ("code_edits", "summarize")]
  if not tasks or unknown:
    raise ValueError(f"config.tasks must name some of ['code_edits', 'summarize'], got "
                     f"{list(cfg.tasks)}")
  workdir = open_workdir(cfg.workdir)
  res = {"tasks": {}, "config": cfg.to_dict(), "machine": report.machine_info(),
         "provenance": provenance()}
  for task in tasks:
    if task == "code_edits":
      model, params, reqs, source = _code_task(cfg)
      max_new = int(cfg.max_new)
      eos_id = None
    else:
      model, params, rows, eos_id, source = _summarize_task(cfg)
      prompts, lengths = pad_batch(rows, max(len(r) for r in rows))
      reqs = list(zip(prompts, lengths.tolist()))
      max_new = int(cfg.summary_max_new)
    logging.info("%s: %d requests (%s)", task, len(reqs), source)
    res["tasks"][task] = {"source": source,
                          **measure_task(cfg, model, params, reqs, max_new, eos_id)}
  text = render(res)
  for d in [workdir] + ([cfg.results_dir] if cfg.results_dir else []):
    os.makedirs(d, exist_ok=True)
    atomic_write_json(os.path.join(d, "suffix.json"), res)
    atomic_write_text(os.path.join(d, "suffix.md"), text)
  print(text)
  return res

