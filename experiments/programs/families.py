"""The drafter families side by side on one trained target (CPU): the
machinery of `benchmarks/drafters_bench.py` and `experiments/families.py`.

On the Chen reproduction's trained decoder pair (target + its draft model,
`FamilyOptions.chen_dir`), for each drafter — the classic draft model,
prompt lookup, suffix drafting (`SuffixDraft`), layer skip (layers chosen
by `specjax.measure.layers.choose_layers` on validation prompts), the
windowed-KV self-draft, lookahead decoding and,
when trained heads are given, Medusa (chain and trees), EAGLE-1 (chain and a
static tree), EAGLE-2 (EAGLE-1's head with the dynamic tree) and EAGLE-3 —
on the tasks:

* `code`: HumanEval prompts (the last P tokens of each problem);
* `summarize`: the XSum-like task ("<description> Summary:"), where copying
  from the input is what prompt lookup is for;
* `free_text`: package descriptions, first half, continued as plain text;
* `code_repeat`: a repetitive editing workload — a block of standard-library
  code, then its first half again: the continuation re-emits the rest.

at the given temperatures and batch sizes: α (E[β] along the target's own
greedy tokens, for the drafters with distributions; for the windowed
draft stepwise through its ring), accepted / drafted, mean tokens per
target call (τ), the in-graph cost of the drafter's target call relative to
a one-token step, ms per token and the walltime speedup over autoregressive
decoding measured in the same run (every drafter interleaved with AR batch
by batch), whether greedy outputs equal AR's, the drafter's memory (its own
parameters and per-row state bytes) and the compilations made while timing
(must be 0). Spec-Bench's numbers (Vicuna-7B, greedy, batch 1, GPU) are
printed beside.

Each finished (task, temperature, batch) cell is kept under `work_dir`,
keyed by the models' parameter digests, the prompts and the settings: a
killed run resumes at the first unfinished cell, and a cell whose file is
unreadable is named in the log and measured again.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

import specjax
from specjax import drafters
from specjax._checks import check_int
from specjax.adaptive import AdaptiveGamma
from specjax.atomic_io import atomic_write_text
from specjax.checkpoints import params_digest
from specjax.checkpoints.heads import final_dir, load_eagle_head, read_agreement
from specjax.checkpoints.orbax_io import restore_model
from experiments.data import load_task
from specjax.drafters.eagle import DynamicTree, Eagle
from specjax.drafters.medusa import Medusa, choose_tree
from specjax.drafting import Drafter
from experiments.programs.common import copy_results, find_tokenizer, open_workdir, pad_batch
from experiments.programs.report import save, subplots
from experiments.programs.speed import call_order
from experiments.programs.stages import Stages, array_digest
from specjax.measure.beta import measure_beta, position_distributions
from specjax.measure.compiles import DECODE_LOOPS, TraceCounter
from specjax.measure.layers import choose_layers
from specjax.measure.provenance import machine_line, provenance, provenance_sentence
from specjax.measure.timing import (StepTimer, count_params, floor_step_seconds,
                                    interleaved_rounds, now)
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.models.eagle_head import EagleConfig, init_eagle
from specjax.models.medusa_head import MedusaConfig, init_heads
from specjax.sampling import GREEDY, SamplingConfig, process_logits
from specjax.tree import TokenTree

__all__ = ["FamilyOptions", "options", "run", "run_options", "render", "goals", "measure_cell",
           "task_prompts",
           "build_drafters", "SPEC_BENCH"]


@dataclasses.dataclass
class FamilyOptions:
  """What to compare and where (the benchmark's flags, the experiment's config).

  Learned drafters: `medusa_dir` (Medusa heads; `medusa_trees`: "chain" or
  node counts), `eagle_dir` (an EAGLE-1 head: "EAGLE-1 chain" of γ,
  "EAGLE-1 tree" of `eagle_tree_nodes` from its agreement, and "EAGLE-2" with
  the dynamic tree `eagle_dynamic` = (top_k, depth, nodes)), `eagle3_dir`
  (an EAGLE-3 head with the same dynamic tree), `block_dir` (a block head,
  DFlash-style: "block chain" of its slots and "block tree" of
  `eagle_tree_nodes` from its agreement, each drafted in one head call),
  `pard_dir` (a PARD draft, the classic draft trained with mask slots:
  "PARD chain" of γ, drafted in one draft call; the smoke test's random
  draft stands in for it).
  `eagle_shapes`: more EAGLE-2 rows, (top_k, depth, nodes, expand) each,
  sampled at T > 0 ("EAGLE-2 k/d/n expand e"). `only`: the rows to measure
  (names; empty: all). The static trees' children
  are the heads' top-k; `sampled_children` ("iid" or "without"; "" for
  none): the same trees again with children drawn from the head's
  distribution ("... sampled" rows; EAGLE-2 / -3: the sampled dynamic
  tree). The EAGLE-1 chain takes `Eagle`'s default (a sampled child at
  T > 0)."""

  out_dir: str = "benchmarks/results"
  name: str = "drafters"
  chen_dir: str = "runs/chen_full"
  data_cache: str = "data_cache"
  work_dir: str = "runs/drafters_bench"
  smoke: bool = False
  prompts: int = 16
  prompt_len: int = 128
  max_new: int = 64
  batches: Tuple[int, ...] = (1, 8)
  temperatures: Tuple[float, ...] = (0.0, 1.0)
  tasks: Tuple[str, ...] = ("code", "summarize", "code_repeat")
  gamma: int = 4
  lookup_gamma: int = 8
  window: int = 64
  sinks: int = 4
  skip_layers: int = 0
  lookahead: Tuple[int, int, int] = (4, 4, 4)
  medusa_dir: str = ""
  medusa_trees: Tuple[str, ...] = ("chain", "4", "8", "16", "32", "64")
  eagle_dir: str = ""
  eagle3_dir: str = ""
  block_dir: str = ""
  pard_dir: str = ""
  eagle_shapes: Tuple[Tuple[int, int, int, int], ...] = ()
  only: Tuple[str, ...] = ()
  # Also rows with gamma="auto": the classic draft, prompt lookup, PARD, EAGLE-1's chain
  # (of 8: Γ up to 8) and static tree (Γ up to its depth); `eagle_stop` > 0: the chain
  # again with that confidence stop.
  auto: bool = False
  eagle_stop: float = 0.0
  auto_series: bool = False   # each auto row again as a series ("... series", `SERIES`)
  # The auto rows of trained drafters with a recorded agreement (EAGLE-1, PARD:
  # `read_agreement`) start from its first entry as the prior (`auto_gamma`).
  agreement_prior: bool = True
  timing_repeats: int = 1   # rounds of each batch's calls (rotating order), medians kept
  eagle_dynamic: Tuple[int, int, int] = (4, 4, 16)
  eagle_tree_nodes: int = 16
  sampled_children: str = "without"


SPEC_BENCH = {"EAGLE-2": 2.25, "EAGLE": 2.16, "classic draft": 1.83, "prompt lookup": 1.55,
              "prompt lookup (summarisation)": 2.31, "Medusa": 1.44, "lookahead": 1.08}


def _pair(opts: "FamilyOptions"):
  smoke = opts.smoke
  if smoke:
    target = DecoderLM(decoder_config("tiny", vocab_size=64, num_layers=2, matvec_max_rows=0))
    draft = DecoderLM(decoder_config("tiny", vocab_size=64, num_layers=1, d_model=16,
                                     num_heads=2, num_kv_heads=1, mlp_dim=32))
    return (target, target.init(jax.random.PRNGKey(0))), (draft, draft.init(
        jax.random.PRNGKey(1))), None, "tiny random-init pair"
  workdir = os.path.abspath(opts.chen_dir)
  target, tp = restore_model(os.path.join(workdir, "target", "final"))
  draft, dp = restore_model(os.path.join(workdir, "draft", "final"))
  tok, path = find_tokenizer(opts.data_cache, "chen", target.vocab_size, workdir)
  if tok is None:
    raise FileNotFoundError(f"no Chen vocabulary of size {target.vocab_size} under "
                            f"{opts.data_cache}/vocab (build the Chen experiment first)")
  return (target, tp), (draft, dp), tok, f"trained Chen pair in {opts.chen_dir}; tokenizer {path}"


def task_prompts(opts: "FamilyOptions", task: str, tok, vocab: int, n: int, p: int,
                 seed: int = 0):
  """(prompts [n, P], lengths [n], source). Prompts keep their last P tokens."""
  if tok is None:
    rng = np.random.default_rng(seed)
    half = rng.integers(3, vocab, size=(n, p // 2)).astype(np.int32)
    prompts = np.concatenate([half, half], axis=1)  # repetitive: lookups can match
    return prompts, np.full((n,), prompts.shape[1], np.int32), "random tokens, repeated"
  rows = []
  if task == "code":
    for r in load_task("humaneval", "test", opts.data_cache):
      rows.append(tok.encode(r["inputs"], add_eos=False)[-p:])
    source = "HumanEval prompts"
  elif task == "summarize":
    for r in load_task("summarize_debian", "test", opts.data_cache):
      rows.append(tok.encode(f"{r['inputs']} Summary:", add_eos=False)[-p:])
    source = "summarize_debian test ('<description> Summary:')"
  elif task == "free_text":
    for r in load_task("summarize_debian", "test", opts.data_cache):
      ids = tok.encode(r["inputs"], add_eos=False)
      rows.append(ids[:max(len(ids) // 2, 8)][-p:])
    source = "summarize_debian test descriptions, first half (continued as free text)"
  else:
    block = (p * 2) // 3
    for r in load_task("code_python", "test", opts.data_cache):
      ids = tok.encode(r["inputs"], add_eos=False)
      for s in range(0, len(ids) - block, block):
        chunk = ids[s:s + block]
        rows.append(chunk + chunk[:p - block])
        if len(rows) >= n:
          break
      if len(rows) >= n:
        break
    source = f"code_python test: a {block}-token block, then its first {p - block} tokens again"
  rows = [r for r in rows if len(r) >= 8][:n]
  if len(rows) < n:
    raise ValueError(f"task {task}: only {len(rows)} prompts, need {n}")
  prompts, lengths = pad_batch(rows, p)
  return prompts, lengths, source


def build_drafters(opts: "FamilyOptions", target, tp, draft, dp, prompts, lengths,
                   stages: Optional[Stages] = None):
  """{name: (drafter, draft params, γ)} and the layer-skip choice (a stage of
  `stages` when given: a resumed run does not search the layers again)."""
  smoke = opts.smoke
  g = opts.gamma
  keep = opts.skip_layers or max(target.config.num_layers // 2, 1)
  max_new = 8 if smoke else 32
  search = lambda: choose_layers(target, tp, prompts[:4], lengths[:4], keep,
                                 max_new_tokens=max_new, log=logging.info)
  if stages is None:
    choice = search()
  else:
    choice = stages.run("layer_skip_choice", search, {
        "target": params_digest(tp), "prompts": array_digest(prompts[:4], lengths[:4]),
        "keep": keep, "max_new": max_new})
  w, n, c = (int(x) for x in opts.lookahead)
  window = min(opts.window, 8) if smoke else opts.window
  medusa = {}
  if opts.medusa_dir or smoke:
    if smoke:  # random heads on the tiny target
      cfg = MedusaConfig(2, target.config.d_model, target.vocab_size)
      heads = init_heads(cfg, target, tp)
      heads["w"] = 0.3 * jax.random.normal(jax.random.PRNGKey(5), heads["w"].shape)
      medusa = {"Medusa chain": (Medusa(cfg, TokenTree.chain(2)), {"heads": heads, "target": None},
                                 None),
                "Medusa tree 6": (Medusa(cfg, TokenTree.from_paths(
                    [(0,), (1,), (0, 0), (0, 1), (1, 0)])), {"heads": heads, "target": None},
                                  None)}
    else:
      for spec in opts.medusa_trees:
        tree = "chain" if spec == "chain" else int(spec)
        d, mp = drafters.load_medusa(opts.medusa_dir, target, tp, tree)
        name = "Medusa chain" if tree == "chain" else f"Medusa tree {tree}"
        medusa[name] = (d, mp, None)
        if opts.sampled_children and tree != "chain":
          medusa[name + " sampled"] = (dataclasses.replace(d, children=opts.sampled_children),
                                       mp, None)
  pard = {}
  if smoke:
    pard["PARD chain"] = (drafters.ParallelDraft(draft, 0), dp, g)
  elif opts.pard_dir:
    pd, pp = drafters.load_parallel_draft(opts.pard_dir)
    pard["PARD chain"] = (pd, pp, min(g, pd.slots + 1))
    if opts.auto:
      pard["PARD chain auto"] = (pd, pp, auto_gamma(opts, read_agreement(opts.pard_dir)))
  entries = {
      "classic draft": (draft, dp, g),
      **pard,
      "prompt lookup": (drafters.PromptLookup(max_ngram=3, min_ngram=1), None,
                        opts.lookup_gamma),
      "layer skip": (drafters.LayerSkip(target, choice["layers"]), None, g),
      "windowed KV": (drafters.WindowedKV.of(target, window=window, sinks=opts.sinks,
                                             gamma=g), None, g),
      "lookahead": (drafters.Lookahead(window=w, ngram=n, candidates=c), None, None),
      "suffix": (drafters.SuffixDraft(nodes=4, depth=2, occurrences=4) if smoke
                 else drafters.SuffixDraft(), None, None),
      # SuffixDecoding's job corpus: each call's outputs are added for the next calls of
      # the cell (`measure_cell` starts every cell from this empty corpus).
      "suffix + job corpus": (drafters.SuffixDraft(nodes=4, depth=2, occurrences=4) if smoke
                              else drafters.SuffixDraft(),
                              drafters.SuffixCorpus.build([], size=512 if smoke else 8192,
                                                          vocab_size=target.vocab_size), None),
      **({"classic draft auto": (draft, dp, "auto"),
          "prompt lookup auto": (drafters.PromptLookup(max_ngram=3, min_ngram=1), None, "auto")}
         if opts.auto else {}),
      **medusa,
      **_eagle_entries(opts, target, tp),
  }
  if opts.auto_series:   # each "auto" row again with its estimate carried through the cell
    entries.update({f"{name} series": (d, p, SERIES)
                    for name, (d, p, gam) in list(entries.items()) if _is_auto(gam)})
  return entries, choice


def eagle_static_tree(agreement, nodes: int):
  """A static tree for an EAGLE-1 head from its top-1 agreement by depth
  (`agreement.json`): rank r at depth d taken as agreement[d] · (1 −
  agreement[d])^r (the next ranks share what rank 0 misses), then Medusa's
  greedy construction (`choose_tree`)."""
  a = np.clip(np.asarray(agreement, np.float64), 1e-3, 1 - 1e-3)
  acc = a[:, None] * (1 - a[:, None]) ** np.arange(8)[None]
  return choose_tree(acc, nodes)[0]


def _eagle_entries(opts: "FamilyOptions", target, tp) -> dict:
  """EAGLE rows: trained heads from `eagle_dir` / `eagle3_dir`, or random
  heads on the smoke test's tiny target."""
  out = {}
  dyn = DynamicTree(*(int(x) for x in opts.eagle_dynamic))
  if opts.smoke:
    dyn = DynamicTree(2, 2, 4)
    for version, layers in ((1, ()), (3, (0, 1))):
      cfg = EagleConfig(target.config.d_model, target.vocab_size, num_heads=2,
                        feature_layers=layers)
      dp = {"head": init_eagle(cfg, jax.random.PRNGKey(6)), "target": tp}
      out[f"EAGLE-{2 if version == 1 else 3}"] = (Eagle(cfg, dyn, target, "top_k"), dp, None)
    return out
  if opts.eagle_dir:
    cfg, head = load_eagle_head(opts.eagle_dir)
    dp = {"head": head, "target": tp}
    agreement = _agreement(opts.eagle_dir)
    out["EAGLE-1 chain"] = (Eagle(cfg, TokenTree.chain(opts.gamma), target), dp, None)
    static = eagle_static_tree(agreement, opts.eagle_tree_nodes)
    out[f"EAGLE-1 tree {opts.eagle_tree_nodes}"] = (Eagle(cfg, static, target, "top_k"), dp,
                                                     None)
    if opts.sampled_children:
      out[f"EAGLE-1 tree {opts.eagle_tree_nodes} sampled"] = (
          Eagle(cfg, static, target, opts.sampled_children), dp, None)
    if opts.auto:
      chain = TokenTree.chain(AdaptiveGamma().max_gamma)
      auto = auto_gamma(opts, agreement)
      out["EAGLE-1 chain auto"] = (Eagle(cfg, chain, target), dp, auto)
      out[f"EAGLE-1 tree {opts.eagle_tree_nodes} auto"] = (
          Eagle(cfg, static, target, "top_k"), dp, auto)
      if opts.eagle_stop:
        out["EAGLE-1 chain auto stop"] = (Eagle(cfg, chain, target, stop_below=opts.eagle_stop),
                                          dp, auto)
    out["EAGLE-2"] = (Eagle(cfg, dyn, target, "top_k"), dp, None)
    if opts.sampled_children:
      out["EAGLE-2 sampled"] = (Eagle(cfg, dyn, target, opts.sampled_children), dp, None)
    for k, d, n, e in opts.eagle_shapes:
      out[f"EAGLE-2 {k}/{d}/{n} expand {e}"] = (
          Eagle(cfg, DynamicTree(k, d, n, expand=e), target, opts.sampled_children or "without"),
          dp, None)
  if opts.eagle3_dir:
    cfg, head = load_eagle_head(opts.eagle3_dir)
    dp = {"head": head, "target": tp}
    out["EAGLE-3"] = (Eagle(cfg, dyn, target, "top_k"), dp, None)
    if opts.sampled_children:
      out["EAGLE-3 sampled"] = (Eagle(cfg, dyn, target, opts.sampled_children), dp, None)
  if opts.block_dir:
    cfg, head = load_eagle_head(opts.block_dir)
    if not cfg.block:
      raise ValueError(f"block_dir={opts.block_dir!r} holds an autoregressive EAGLE head "
                       f"(EagleConfig.block = 0), not a block head")
    dp = {"head": head, "target": tp}
    agreement = _agreement(opts.block_dir)
    out["block chain"] = (Eagle(cfg, TokenTree.chain(cfg.block), target), dp, None)
    static = eagle_static_tree(agreement, opts.eagle_tree_nodes)
    out[f"block tree {opts.eagle_tree_nodes}"] = (Eagle(cfg, static, target, "top_k"), dp, None)
    if opts.sampled_children:
      out[f"block tree {opts.eagle_tree_nodes} sampled"] = (
          Eagle(cfg, static, target, opts.sampled_children), dp, None)
  return out


def _agreement(directory: str):
  agreement = read_agreement(directory)
  if agreement is None:
    raise ValueError(f"{final_dir(directory)} holds no agreement.json (the validation "
                     "agreement by depth a head's training records): train it with "
                     "experiments/train_drafter.py")
  return agreement


def auto_gamma(opts: "FamilyOptions", agreement):
  """An auto row's γ: "auto", or with `opts.agreement_prior` and a
  drafter's recorded agreement by depth, `AdaptiveGamma` whose prior is its
  first entry (a first draft's greedy acceptance on the head's validation
  data; clipped into [0.05, 0.95]), so a head that accepts drafts from
  the call's first iteration where the default prior (0.5) would not. At
  T > 0 (`_run`) it stays the prior of drafts drawn from the head's
  distribution (accepted with probability Σ min(p, q): the EAGLE-1 chain
  accepts 0.70-0.75 of its drafts at T = 1 against a greedy agreement of
  0.79); a deterministic drafter (`Drafter.deterministic`: top-k tree
  children, accepted with the target's probability of the token, 0.16-0.23
  here) takes the default prior (on the agreement the top-k tree drafted
  at T = 1 and ran 0.86-0.88x AR)."""
  if not opts.agreement_prior or agreement is None:
    return "auto"
  return AdaptiveGamma(prior_alpha=min(max(float(agreement[0]), 0.05), 0.95))


def _deterministic(d) -> bool:
  """Whether a row's drafter sends drafts without distributions (a model
  drafter: never)."""
  return isinstance(d, Drafter) and d.deterministic


def _is_auto(g) -> bool:
  return g == "auto" or isinstance(g, AdaptiveGamma)


def _room(g) -> int:
  """The γ an entry's buffers are sized for: its own, 4 for drafters that
  fix theirs (None), max Γ for gamma="auto"."""
  if g is None:
    return 4
  if isinstance(g, AdaptiveGamma):
    return g.max_gamma
  return AdaptiveGamma().max_gamma if g in ("auto", SERIES) else int(g)


def drafter_memory(target, entry, batch: int, prompt_len: int, cache_len: int) -> dict:
  """The drafter's own parameters (not the target's, which self-drafts and
  heads share: count and bytes) and its state bytes per row for `cache_len`
  positions, and per position (what `specjax.planning.picker` reads)."""
  d, dp, g = entry
  g = _room(g)
  nbytes = lambda tree: int(sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(
      tree)))
  if not isinstance(d, Drafter):  # a draft model: its params and KV cache
    own = dp
    per_row = nbytes(jax.eval_shape(lambda: d.init_cache(1, cache_len, prompt_len)))
  else:
    own = {}
    if isinstance(dp, dict):
      own = {k: v for k, v in dp.items() if k != "target" and v is not None}
    per_row = nbytes(jax.eval_shape(lambda: d.alloc(batch, prompt_len, cache_len, g))) // max(
        batch, 1)
  return {"params": count_params(own), "params_bytes": nbytes(own),
          "state_bytes_per_row": per_row, "cache_len": cache_len,
          "state_bytes_per_token": per_row / max(cache_len, 1)}


def _stepwise_windowed_alpha(target, tp, wd, prompts, lengths, tokens, token_lengths, sampling):
  """E[β] of the windowed draft: its distribution at each generated position
  with the true prefix fed one token at a time through its ring."""
  q = position_distributions(target, tp, prompts, lengths, tokens, sampling)
  b, p = prompts.shape
  n = tokens.shape[1]
  lm = wd.model

  @jax.jit
  def run(tp, prompts, lengths, tokens):
    cache = target.init_cache(b, specjax.required_cache_len(target, p, n), p)
    _, _, cache = target.prefill(tp, prompts, lengths, cache)
    ring = lm.start_from(cache, lm.init_cache(b))

    def step(ring, tok_B):
      logits, ring = lm.extend(tp, tok_B[:, None], ring)
      return ring, process_logits(logits[:, 0], sampling)
    _, p_NBV = jax.lax.scan(step, ring, jnp.swapaxes(tokens[:, :-1], 0, 1))
    return jnp.swapaxes(p_NBV, 0, 1)
  p_draft = run(tp, prompts, lengths, tokens)
  beta = jnp.sum(jnp.minimum(p_draft, q[:, 1:]), axis=-1)
  mask = jnp.arange(1, n)[None] < token_lengths[:, None]
  return float(jnp.sum(beta * mask) / jnp.maximum(jnp.sum(mask), 1))


def _alpha(name, entry, target, tp, prompts, lengths, ar_tokens, ar_lengths, sampling):
  drafter, dparams, _ = entry
  args = (jnp.asarray(prompts), jnp.asarray(lengths), jnp.asarray(ar_tokens),
          jnp.asarray(ar_lengths))
  if name == "windowed KV":
    return _stepwise_windowed_alpha(target, tp, drafter, *args, sampling)
  if name in ("classic draft", "layer skip"):
    model = drafter if name == "classic draft" else drafter.model
    params = dparams if dparams is not None else tp
    beta, mask = measure_beta(target, tp, model, params, *args, sampling)
    beta, mask = np.asarray(beta), np.asarray(mask)
    return float((beta * mask).sum() / max(mask.sum(), 1))
  return None  # deterministic drafts: no proposal distribution


SERIES = "auto series"   # an entry's γ: gamma="auto", the estimate carried from call to call
_NOTHING_PAYS = specjax.Acceptance(np.zeros(2, np.float32), np.full(2, 1e3, np.float32))


def _run(target, tp, entry, x, n, key, sampling, max_new, acceptance=None):
  if entry is None:
    out = specjax.generate(target, tp, x, n, max_new_tokens=max_new, sampling=sampling, key=key)
  else:
    d, dp, g = entry
    kw = {}
    if isinstance(g, AdaptiveGamma) and not sampling.is_greedy and _deterministic(d):
      g = "auto"   # the agreement overstates a one-hot draft's acceptance (`auto_gamma`)
    if g == SERIES:
      g, kw = "auto", {"acceptance": acceptance or specjax.Acceptance.fresh()}
    out = specjax.speculative_generate(target, tp, d, dp, x, n, max_new_tokens=max_new,
                                       gamma=g, sampling=sampling,
                                       key=key, **kw)
  out.tokens.block_until_ready()
  return out


def measure_cell(target, tp, entries, prompts, lengths, batch, temp, max_new,
                 repeats: int = 1) -> dict:
  """AR and every drafter on the same batches, interleaved batch by batch;
  `repeats`: the batch's calls run in that many rounds, each call's median
  time kept. The order rotates by one from round to round and batch to
  batch (`call_order`), so each row is timed in several positions even in
  a cell of one batch (at batch 8 a call timed once, or always after the
  same other one, moved ±10% between runs)."""
  repeats = check_int("timing_repeats", repeats, 1)
  sampling = GREEDY if temp == 0 else SamplingConfig(float(temp))
  nb = len(prompts) // batch
  batches = [(jnp.asarray(prompts[i * batch:(i + 1) * batch]),
              jnp.asarray(lengths[i * batch:(i + 1) * batch]),
              jax.random.split(jax.random.key(1000 + i), batch)) for i in range(nb)]
  names = ["autoregressive"] + list(entries)
  call_tokens = {"autoregressive": 1}
  for name, (d, _, g) in entries.items():
    lay = (d if isinstance(d, Drafter) else drafters.ModelDrafter(d)).layout(_room(g))
    call_tokens[name] = lay.length
  call_cost = _call_costs(target, tp, batch, prompts.shape[1], max_new,
                          sorted(set(call_tokens.values())))
  compile_s = {}
  with TraceCounter() as warmup:
    for name in names:  # compile each once, outside the timings
      t0 = now()
      _run(target, tp, entries.get(name), *batches[0], sampling, max_new)
      if name != "autoregressive" and entries[name][2] == SERIES:
        # and the program of a call whose carried estimate says nothing pays
        _run(target, tp, entries[name], *batches[0], sampling, max_new, _NOTHING_PAYS)
      compile_s[name] = now() - t0
  warmup_traces = warmup.decode_loops  # 0: programs reused
  rec = {name: {"seconds": 0.0, "tokens": 0, "calls": 0, "accepted": 0, "drafted": 0,
                "identical": True} for name in names}
  ar_tokens, ar_lengths = [], []
  entries = dict(entries)   # rows with a job corpus grow their own copy, cell by cell
  carried = {}   # "auto series" rows: the estimate each call leaves, from a fresh one per cell
  with TraceCounter() as timed:  # nothing may compile while timing
    for i, (x, n, k) in enumerate(batches):
      ref = None

      def call(name):
        return _run(target, tp, entries.get(name), x, n, k, sampling, max_new, carried.get(name))
      # Round r runs the calls in call_order(·, i · repeats + r).
      order = [names[j + 1] for j in call_order(len(names) - 1, i * repeats)]
      rounds = interleaved_rounds({name: functools.partial(call, name) for name in order},
                                  repeats)
      for name in names:   # in row order: AR's tokens first, for the identity check
        out, r = rounds.last[name], rec[name]
        r["seconds"] += rounds.median(name)
        if name != "autoregressive" and entries[name][2] == SERIES:
          carried[name] = out.stats.acceptance
        if name != "autoregressive" and isinstance(entries[name][1], drafters.SuffixCorpus):
          d, corpus, g = entries[name]   # the job's earlier outputs, for its later calls
          entries[name] = (d, corpus.add(drafters.outputs_of(out), target.vocab_size), g)
        toks, lens = np.asarray(out.tokens), np.asarray(out.lengths)
        r["tokens"] += int(lens.sum())
        r["calls"] += int(np.asarray(out.stats.target_calls).sum())
        r["accepted"] += int(np.asarray(out.stats.accepted).sum())
        r["drafted"] += int(np.asarray(out.stats.drafted).sum())
        if name == "autoregressive":
          ref = toks
          ar_tokens.append(toks)
          ar_lengths.append(lens)
        elif temp == 0:
          r["identical"] = r["identical"] and bool(np.array_equal(toks, ref))
  retraced = {k: v for k, v in timed.counts.items() if k in DECODE_LOOPS}
  ar_tokens, ar_lengths = np.concatenate(ar_tokens), np.concatenate(ar_lengths)
  n_rows = nb * batch
  ar = rec["autoregressive"]
  rows = []
  mem = {name: drafter_memory(target, entries[name], batch, prompts.shape[1],
                              prompts.shape[1] + max_new + call_tokens[name])
         for name in entries}
  for name in names:
    r = rec[name]
    row = {"drafter": name, "ms_per_token": 1e3 * r["seconds"] / r["tokens"],
           "memory": mem.get(name),
           "speedup": (ar["seconds"] / ar["tokens"]) / (r["seconds"] / r["tokens"]),
           "tokens_per_call": r["tokens"] / r["calls"], "compile_s": compile_s[name],
           "call_tokens": call_tokens[name], "call_cost": call_cost[call_tokens[name]]}
    if name != "autoregressive":
      row["draft_params_bytes"] = mem[name]["params_bytes"]
      row["draft_cache_bytes_per_token"] = mem[name]["state_bytes_per_token"]
      row["accepted_per_drafted"] = r["accepted"] / r["drafted"] if r["drafted"] else None
      row["identical"] = r["identical"] if temp == 0 else None
      if batch == 1 or name in ("classic draft", "layer skip", "windowed KV"):
        row["alpha"] = _alpha(name, entries[name], target, tp, prompts[:n_rows],
                              lengths[:n_rows], ar_tokens, ar_lengths, sampling)
    rows.append(row)
  return {"batch": batch, "temperature": temp, "prompts": n_rows, "rows": rows,
          "warmup_traces": warmup_traces, "retraced_while_timing": retraced}


def _call_costs(target, tp, batch, prompt_len, max_new, tokens) -> dict:
  """{T: in-graph cost of a target call on T tokens / a one-token step}
  (`StepTimer`, a causal block: a tree's mask does not change the work)."""
  cache_len = prompt_len + max_new + max(tokens)
  timer = StepTimer(target, tp, batch, cache_len, prompt_len, tokens, steps=8)
  per = {t: [] for t in tokens}
  for _ in range(3):
    for t, v in timer.measure(1).items():
      per[t].extend(v)
  med = {t: floor_step_seconds(v) for t, v in per.items()}
  return {t: med[t] / med[1] for t in tokens}


def _f(x, fmt="{:.2f}"):
  return "—" if x is None else fmt.format(x)


def _mem(x, unit, suffix):
  return "—" if x is None else f"{x / unit:.2f}{suffix}"


def render(results: dict) -> str:
  m = results["meta"]
  lines = ["# Drafter families side by side (CPU)", "",
           f"{m['machine']}; jax {m['jax']}; {m['pair']}; target {m['target_params'] / 1e6:.1f}M "
           f"params, draft {m['draft_params'] / 1e6:.2f}M; {m['prompts']} prompts per task, "
           f"P = {m['prompt_len']}, {m['max_new']} new tokens; γ = {m['gamma']} (prompt lookup "
           f"{m['lookup_gamma']}); layer skip keeps layers {m['layer_skip']['layers']} (α "
           f"{m['layer_skip']['alpha']:.3f} on validation prompts); windowed KV: {m['sinks']} "
           f"sinks + {m['window']} recent; lookahead W/N/G = {m['lookahead']}; load average at "
           f"start {m['load_average_at_start']:.2f}. α = E[β] along the target's greedy tokens "
           "(drafters with distributions); τ = tokens per target call; speedup = AR ms/token ÷ "
           "drafter ms/token, measured in the same run, batch by batch."
           + provenance_sentence(results),
           "", "## Goals", "",
           "| goal | measured | status |", "|---|---|---|"]
  for g in results["goals"]:
    lines.append(f"| {g['goal']} | {g['measured']} | {g['status']} |")
  for task, cells in results["tasks"].items():
    lines += ["", f"## {task}: {results['sources'][task]}", ""]
    for cell in cells:
      lines += [f"### T = {cell['temperature']}, batch {cell['batch']}", "",
                "| drafter | α | accepted / drafted | τ | call tokens | call cost | ms / token "
                "| speedup | greedy = AR | draft params | state / row |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
      for r in cell["rows"]:
        same = r.get("identical")
        mem = r.get("memory") or {}
        lines.append(f"| {r['drafter']} | {_f(r.get('alpha'), '{:.3f}')} | "
                     f"{_f(r.get('accepted_per_drafted'), '{:.3f}')} | "
                     f"{r['tokens_per_call']:.2f} | "
                     f"{r['call_tokens']} | {r['call_cost']:.2f}× | "
                     f"{r['ms_per_token']:.2f} | {r['speedup']:.2f}× | "
                     f"{'—' if same is None else ('yes' if same else 'NO')} | "
                     f"{_mem(mem.get('params'), 1e6, 'M')} | "
                     f"{_mem(mem.get('state_bytes_per_row'), 2 ** 20, ' MiB')} |")
      lines.append("")
  lines += spec_bench_table(results)
  lines += ["## Spec-Bench for reference (Vicuna-7B, greedy, batch 1, RTX 3090 / A100)", "",
            "| method | speedup |", "|---|---|"]
  lines += [f"| {k} | {v:.2f}× |" for k, v in SPEC_BENCH.items()]
  return "\n".join(lines) + "\n"


def _spec_bench_name(drafter: str):
  for key in ("EAGLE-2", "classic draft", "prompt lookup", "lookahead"):
    if drafter == key:
      return key
  if drafter.startswith("EAGLE-1"):
    return "EAGLE"
  if drafter.startswith("Medusa"):
    return "Medusa"
  return None


def spec_bench_table(results: dict) -> list:
  """Spec-Bench's layout: greedy, batch 1 (else the smallest measured), a
  speedup column per task, the mean accepted tokens per target call (MAT =
  τ) and the overall speedup
  (mean over tasks), with the leaderboard's number beside."""
  greedy = {t: [c for c in cells if c["temperature"] == 0]
            for t, cells in results["tasks"].items()}
  tasks = [t for t, cells in greedy.items() if cells]
  if not tasks:
    return []
  batch = min(c["batch"] for t in tasks for c in greedy[t])  # 1 unless not measured
  tasks = [t for t in tasks if any(c["batch"] == batch for c in greedy[t])]
  cells = {t: next(c for c in greedy[t] if c["batch"] == batch) for t in tasks}
  names = [r["drafter"] for r in cells[tasks[0]]["rows"] if r["drafter"] != "autoregressive"]
  lines = [f"## In Spec-Bench's layout (greedy, batch {batch}, this CPU)", "",
           "| method | " + " | ".join(tasks) + " | MAT (τ) | overall | Spec-Bench (Vicuna-7B) |",
           "|---" * (len(tasks) + 4) + "|"]
  for name in names:
    rows = [next((r for r in cells[t]["rows"] if r["drafter"] == name), None) for t in tasks]
    if any(r is None for r in rows):
      continue
    sb = _spec_bench_name(name)
    lines.append(f"| {name} | " + " | ".join(f"{r['speedup']:.2f}×" for r in rows)
                 + f" | {np.mean([r['tokens_per_call'] for r in rows]):.2f} | "
                 f"{np.mean([r['speedup'] for r in rows]):.2f}× | "
                 + (f"{SPEC_BENCH[sb]:.2f}×" if sb else "—") + " |")
  return lines + [""]


def plot(results: dict, path: str):
  """τ (tokens per target call) and walltime speedup per drafter, one
  column of panels per task, rows T = 0 / T = 1 (batch 1, or the smallest
  batch measured): horizontal bars, AR's 1.0 marked. Returns the Figure."""
  tasks = list(results["tasks"])
  temps = sorted({c["temperature"] for cells in results["tasks"].values() for c in cells})
  fig, axes = subplots(len(temps), 2 * len(tasks), squeeze=False,
                       figsize=(3.4 * 2 * len(tasks), 0.35 * 14 * len(temps) + 1))
  for i, temp in enumerate(temps):
    for j, task in enumerate(tasks):
      cells = [c for c in results["tasks"][task] if c["temperature"] == temp]
      if not cells:
        continue
      cell = min(cells, key=lambda c: c["batch"])
      rows = [r for r in cell["rows"] if r["drafter"] != "autoregressive"]
      names = [r["drafter"] for r in rows]
      for k, (key, label) in enumerate((("tokens_per_call", "τ (tokens / call)"),
                                        ("speedup", "speedup vs AR"))):
        ax = axes[i][2 * j + k]
        ax.barh(names, [r[key] for r in rows], color="C0" if k == 0 else "C1")
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(f"{task}, T={temp:g}, batch {cell['batch']}", fontsize=9)
        ax.set_xlabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        if k:
          ax.set_yticklabels([])
  return save(fig, path)


def goals(results: dict) -> list:
  out = []
  summ = [c for c in results["tasks"].get("summarize", []) if c["temperature"] == 0
          and c["batch"] == 1]
  for c in summ:
    r = next((r for r in c["rows"] if r["drafter"] == "prompt lookup"), None)
    if r is None:   # a run of selected rows (`only`)
      continue
    out.append({"goal": "prompt lookup ≥ 1.5 tokens per target call, summarisation, greedy",
                "measured": f"{r['tokens_per_call']:.2f}",
                "status": "PASS" if r["tokens_per_call"] >= 1.5 else "FAIL"})
  for task, cells in results["tasks"].items():
    for c in cells:
      if c["temperature"] == 0 and c["batch"] == 1:
        r = next((r for r in c["rows"] if r["drafter"] == "windowed KV"), None)
        if r is not None and r.get("alpha") is not None:
          ok = r["alpha"] >= 0.8
          out.append({"goal": f"windowed self-draft α ≥ 0.8 at T=0, W = {results['meta']['window']}"
                              f", {task} (prompts up to {results['meta']['prompt_len']} tokens)",
                      "measured": f"{r['alpha']:.3f}", "status": "PASS" if ok else "FAIL"})
  for c in results["tasks"].get("code", []):
    med = [r for r in c["rows"] if r["drafter"].startswith("Medusa")]
    if c["temperature"] == 0 and c["batch"] == 1 and med:
      best = max(med, key=lambda r: r["tokens_per_call"])
      out.append({"goal": "Medusa τ ≥ 2.0 at T=0 on code (best of chain and trees)",
                  "measured": f"{best['tokens_per_call']:.2f} ({best['drafter']})",
                  "status": "PASS" if best["tokens_per_call"] >= 2.0 else "FAIL"})
  for task, cells in results["tasks"].items():
    for c in cells:
      if c["temperature"] != 0 or c["batch"] != 1:
        continue
      tau = {r["drafter"]: r["tokens_per_call"] for r in c["rows"]}
      if "EAGLE-2" in tau:
        others = {k: v for k, v in tau.items()
                  if k == "classic draft" or k.startswith("Medusa")}
        if others:
          best = max(others, key=others.get)
          out.append({"goal": f"EAGLE-2 τ above the classic draft's and Medusa's, {task}, T=0",
                      "measured": f"{tau['EAGLE-2']:.2f} vs {others[best]:.2f} ({best})",
                      "status": "PASS" if tau["EAGLE-2"] > others[best] else "FAIL"})
      blocks = {k: v for k, v in tau.items() if k.startswith("block")}
      if blocks and "EAGLE-2" in tau:
        best = max(blocks, key=blocks.get)
        out.append({"goal": f"block drafter τ ≥ EAGLE-2's, {task}, T=0 (one head call)",
                    "measured": f"{blocks[best]:.2f} ({best}) vs {tau['EAGLE-2']:.2f}",
                    "status": "PASS" if blocks[best] >= tau["EAGLE-2"] else "FAIL"})
      if "EAGLE-3" in tau and "EAGLE-2" in tau:
        out.append({"goal": f"EAGLE-3 τ ≥ EAGLE-2's, {task}, T=0",
                    "measured": f"{tau['EAGLE-3']:.2f} vs {tau['EAGLE-2']:.2f}",
                    "status": "PASS" if tau["EAGLE-3"] >= tau["EAGLE-2"] else "FAIL"})
  for task, cells in results["tasks"].items():
    tau_at = {c["temperature"]: {r["drafter"]: r["tokens_per_call"] for r in c["rows"]}
              for c in cells if c["batch"] == 1}
    greedy, hot = tau_at.get(0.0, {}), tau_at.get(1.0, {})
    if "EAGLE-2 sampled" in hot and "EAGLE-2" in greedy and "classic draft" in hot:
      t1, t0, cl = hot["EAGLE-2 sampled"], greedy["EAGLE-2"], hot["classic draft"]
      out.append({"goal": f"EAGLE-2 sampled τ at T=1 ≥ 0.8× EAGLE-2's at T=0 and above the "
                          f"classic draft's at T=1, {task}, batch 1",
                  "measured": f"{t1:.2f} = {t1 / t0:.2f}× {t0:.2f}; classic {cl:.2f}",
                  "status": "PASS" if t1 >= 0.8 * t0 and t1 > cl else "FAIL"})
  for task, cells in results["tasks"].items():
    for c in cells:
      speed = {r["drafter"]: r["speedup"] for r in c["rows"]}
      blocks = {k: v for k, v in speed.items() if k.startswith("block")}
      if c["batch"] == 1 and blocks and "EAGLE-1 chain" in speed:
        best = max(blocks, key=blocks.get)
        out.append({"goal": f"block drafter walltime above the EAGLE-1 chain's, {task}, "
                            f"T={c['temperature']:g}, batch 1",
                    "measured": f"{blocks[best]:.2f}x ({best}) vs {speed['EAGLE-1 chain']:.2f}x",
                    "status": "PASS" if blocks[best] > speed["EAGLE-1 chain"] else "FAIL"})
  retraced = [(t, c["batch"], c["temperature"], c["retraced_while_timing"])
              for t, cells in results["tasks"].items() for c in cells
              if c["retraced_while_timing"]]
  out.append({"goal": "one compilation per (drafter, γ, bucket): no trace while timing",
              "measured": "none" if not retraced else str(retraced),
              "status": "PASS" if not retraced else "FAIL"})
  exact = [(t, c["batch"], r["drafter"]) for t, cells in results["tasks"].items() for c in cells
           for r in c["rows"] if r.get("identical") is False]
  out.append({"goal": "every drafter exact: greedy output identical to AR",
              "measured": "all identical" if not exact else str(exact),
              "status": "PASS" if not exact else "FAIL"})
  return out


def run_options(opts: "FamilyOptions") -> dict:
  """Measures every cell (reusing finished ones), writes `<name>.json` / `.md`
  into `opts.out_dir` and returns the results."""
  smoke = opts.smoke
  (target, tp), (draft, dp), tok, pair = _pair(opts)
  n = 4 if smoke else opts.prompts
  p = 24 if smoke else opts.prompt_len
  max_new = 8 if smoke else opts.max_new
  batches = [2] if smoke else [int(b) for b in opts.batches]
  temps = [0.0] if smoke else [float(t) for t in opts.temperatures]
  tasks = ["summarize", "code"] if smoke else list(opts.tasks)
  t_start = time.time()
  prompts = {t: task_prompts(opts, t, tok, target.vocab_size, n, p, seed=i)
             for i, t in enumerate(tasks)}
  first = prompts[tasks[0]]
  stages = Stages(os.path.join(opts.work_dir, "smoke" if smoke else "cells"))
  entries, choice = build_drafters(opts, target, tp, draft, dp, first[0], first[1], stages)
  if opts.only:
    unknown = sorted(set(opts.only) - set(entries))
    if unknown:
      raise ValueError(f"only names rows {unknown} that this run does not have; its rows: "
                       f"{sorted(entries)}")
    entries = {k: v for k, v in entries.items() if k in opts.only}
  results = {"provenance": provenance(), "meta": {
      "machine": machine_line(), "jax": jax.__version__, "pair": pair,
      "target_params": specjax.measure.timing.count_params(tp),
      "draft_params": specjax.measure.timing.count_params(dp), "prompts": n, "prompt_len": p,
      "max_new": max_new, "gamma": opts.gamma, "lookup_gamma": opts.lookup_gamma,
      "window": min(opts.window, 8) if smoke else opts.window, "sinks": opts.sinks,
      "lookahead": "/".join(str(x) for x in opts.lookahead),
      "eagle_dynamic": list(opts.eagle_dynamic),
      "layer_skip": {"layers": list(choice["layers"]), "alpha": choice["alpha"]},
      "load_average_at_start": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d %H:%M")},
      "tasks": {}, "sources": {t: v[2] for t, v in prompts.items()}}
  models = {"target": params_digest(tp), **{
      name: [repr(e[0]) if isinstance(e[0], Drafter) else repr(e[0].config),
             None if e[1] is None else params_digest(e[1]),
             repr(e[2]) if isinstance(e[2], AdaptiveGamma) else e[2]]
      for name, e in entries.items()}}
  # Tasks innermost: the prompts of every task share one shape, so the cells of one
  # (temperature, batch) run the same executables; they are freed (XLA:CPU keeps memory
  # mappings per executable) only when the setting changes.
  todo = [(task, temp, b) for temp in temps for b in batches if b <= n for task in tasks]
  t_cells, done, compiled = now(), 0, False
  for i, (task, temp, b) in enumerate(todo):
    x, lens, _ = prompts[task]
    deps = {"models": models, "prompts": array_digest(x, lens), "max_new": max_new,
            "temperature": temp, "batch": b,
            **({"repeats": opts.timing_repeats} if opts.timing_repeats > 1 else {})}
    key = f"{task}/T{temp:g}_B{b}"
    before = len(stages.computed)
    cell = stages.run(key, lambda: measure_cell(target, tp, entries, x, lens, b, temp, max_new,
                                                opts.timing_repeats), deps)
    measured = len(stages.computed) > before
    results["tasks"].setdefault(task, []).append(cell)
    done += measured
    rate = (now() - t_cells) / max(done, 1)
    logging.info("cell %d/%d %s T=%g B=%d (%s; ETA %.0f min): %s", i + 1, len(todo), task, temp,
                 b, "measured" if measured else "reused", rate * (len(todo) - i - 1) / 60,
                 ", ".join(f"{r['drafter']} τ {r['tokens_per_call']:.2f} {r['speedup']:.2f}x"
                           for r in cell["rows"]))
    compiled = compiled or measured
    if compiled and (i + 1 == len(todo) or todo[i + 1][1:] != (temp, b)):
      jax.clear_caches()
      compiled = False
  results["goals"] = goals(results)
  results["meta"]["seconds"] = time.time() - t_start
  name = opts.name + ("_smoke" if smoke else "")
  open_workdir(opts.out_dir)
  atomic_write_text(os.path.join(opts.out_dir, name + ".json"), json.dumps(results, indent=1))
  md = render(results)
  plot(results, os.path.join(opts.out_dir, name + ".png"))
  md += f"\n![τ and speedup per drafter]({name}.png)\n"
  atomic_write_text(os.path.join(opts.out_dir, name + ".md"), md)
  print(md)
  return results

def options(cfg) -> FamilyOptions:
  """The config as `FamilyOptions` (a learned drafter whose directory does
  not exist is left out, with a warning naming it)."""
  dirs = {}
  for key in ("medusa_dir", "eagle_dir", "eagle3_dir", "block_dir", "pard_dir"):
    d = cfg.get(key) or ""
    if d and not os.path.exists(d):
      logging.warning("%s=%s does not exist: its rows are left out (train it with "
                      "experiments/train_drafter.py)", key, d)
      d = ""
    dirs[key] = d
  return FamilyOptions(
      out_dir=os.path.join(cfg.workdir, "results"), name="families", chen_dir=cfg.chen_dir,
      data_cache=cfg.data_cache, work_dir=os.path.join(cfg.workdir, "cells"), smoke=cfg.smoke,
      prompts=int(cfg.prompts), prompt_len=int(cfg.prompt_len), max_new=int(cfg.max_new),
      batches=tuple(int(b) for b in cfg.batches),
      temperatures=tuple(float(t) for t in cfg.temperatures), tasks=tuple(cfg.tasks),
      gamma=int(cfg.gamma), lookup_gamma=int(cfg.lookup_gamma), window=int(cfg.window),
      medusa_trees=tuple(str(t) for t in cfg.medusa_trees),
      eagle_dynamic=tuple(int(x) for x in cfg.eagle_dynamic),
      eagle_tree_nodes=int(cfg.eagle_tree_nodes), auto=bool(cfg.get("auto", False)),
      eagle_stop=float(cfg.get("eagle_stop", 0.0)),
      auto_series=bool(cfg.get("auto_series", False)),
      agreement_prior=bool(cfg.get("agreement_prior", True)),
      timing_repeats=int(cfg.get("timing_repeats", 1)),
      sampled_children=str(cfg.get("sampled_children", "without")),
      only=tuple(str(x) for x in cfg.get("only", ())),
      eagle_shapes=tuple(tuple(int(v) for v in x) for x in cfg.get("eagle_shapes", ())),
      **dirs)


def run(cfg) -> dict:
  """Measures (resuming finished cells) and writes families.{json,md}."""
  opts = options(cfg)
  results = run_options(opts)
  if cfg.get("results_dir"):
    name = opts.name + ("_smoke" if opts.smoke else "")
    copy_results(opts.out_dir, cfg.results_dir, [name + ext for ext in (".json", ".md", ".png")])
  return results
