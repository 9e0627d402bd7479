"""specjax against its peers on the same weights: the pieces of `benchmarks/peers_bench.py`.

Everything here measures greedy decoding of a target/draft pair, side by side
in one process, on the same prompts:

* `PairSpec` / `load_pair`: a pair from orbax model directories (trained runs)
  or random initialisation of the same kind (the fallback, said so in the
  output); `pair_prompts`: fixed prompts from the pair's test split, or random
  tokens;
* `specjax_runner` / `hf_runner`: one system at one batch size and γ, as a
  callable the timing loop calls (`interleaved_times` alternates them);
  `specjax_runner(..., mesh=...)`: the same on a `model`-axis mesh (target
  split Megatron-style, draft replicated: every CPU core on the target);
* `SpecjaxStream` (`specjax.streaming.stream`: a host timestamp after each
  iteration) and `TimingStreamer` (a transformers `BaseStreamer` that
  timestamps `put`) give token arrival events; `specjax.measure.latency`
  turns them into TTFT and inter-token latencies (the n + 1 tokens one
  iteration commits all arrive at its timestamp);
* `loop_prediction`: autoregressive / speculative wall time predicted from
  the in-graph component times (`specjax.measure.timing.step_times`) and the measured
  iterations; measured vs predicted is the loop's overhead;
  `paired_loop_overhead` measures it in rounds, loops and components
  moments apart;
* `memory_job` (run as `python -m experiments.programs.peers --memory_job
  JSON`) / `measure_memory`: one system in a fresh process: peak RSS during a
  steady generation call (the kernel's high-water mark reset through
  /proc/self/clear_refs after a warm-up call and a `malloc_trim`) and peak RSS
  including loading and compilation, both minus the process's idle RSS after
  its imports;
* `cost_growth`: time per token as the generated length and, separately, the
  static cache buffer grow.

Shapes follow `specjax.protocol`: B rows, P prompt tokens, N new tokens.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.checkpoints.hf_llama import export_hf_decoder
from specjax.checkpoints.hf_t5 import export_hf_t5
from specjax.checkpoints.orbax_io import model_for_config, restore_model
from experiments.data import load_task
from specjax.drafters import ModelDrafter
from experiments.programs.common import find_tokenizer
from specjax.generation import AutoregressiveDecoder, SpeculativeDecoder
from specjax.measure.calls import model_call_loop
from specjax.measure.timing import (StepTimer, floor_step_seconds, interleaved_rounds, now,
                                    time_call)
from specjax.models.decoder import DecoderConfig, DecoderLM
from specjax.models.t5 import T5
from specjax.models.t5_config import T5Config
from specjax.parallel import sharding
from specjax.sampling import GREEDY
from specjax.streaming import stream

__all__ = [
    "PairSpec", "Pair", "fallback_spec", "load_pair", "pair_prompts", "Runner", "specjax_runner",
    "HFPair", "hf_runner", "interleaved_times", "SpecjaxStream", "TimingStreamer",
    "loop_prediction", "overhead_fields", "paired_loop_overhead", "memory_job", "measure_memory",
    "cost_growth", "token_agreement",
]

# Prompt formats of the reproductions (experiments.programs.leviathan / chen).
T5_TASK, T5_PREFIX = "translate_en_de", "translate English to German: "
DECODER_TASK, DECODER_TEMPLATE = "summarize_debian", "{inputs} Summary:"


# --------------------------------------------------------------------------- pairs


@dataclasses.dataclass
class PairSpec:
  """How to build a pair (JSON-able, so a subprocess can rebuild it).

  Attributes:
    name: label in the report ("t5", "decoder").
    kind: "t5" (encoder-decoder) or "decoder" (decoder-only).
    target_dir, draft_dir: orbax model directories (`restore_params`), or ""
      for random initialisation from the fallback configs.
    target_config, draft_config: config fields used when the dirs are empty.
    seed: random-init seed (target seed, draft seed + 1).
    packed: decoder pairs only: both models' params in the packed decode
      layout (`DecoderLM.pack_params`) for every specjax measurement (the
      transformers export unpacks them: the same weights).
    target_matvec_rows, draft_matvec_rows: decoder pairs only: each model's
      `DecoderConfig.matvec_max_rows` (None: the config's own, e.g. the
      library default; the suite fills them from `specjax.tune_matvec_rows`).
  """

  name: str
  kind: str
  target_dir: str = ""
  draft_dir: str = ""
  target_config: Dict[str, Any] = dataclasses.field(default_factory=dict)
  draft_config: Dict[str, Any] = dataclasses.field(default_factory=dict)
  seed: int = 0
  packed: bool = True
  target_matvec_rows: Optional[int] = None
  draft_matvec_rows: Optional[int] = None

  @property
  def trained(self) -> bool:
    return bool(self.target_dir and self.draft_dir)


def fallback_spec(name: str, kind: str, size: str = "full", target_dir: str = "",
                  draft_dir: str = "") -> PairSpec:
  """A spec with random-init configs shaped like the reproductions' `full`
  models (size "full": Leviathan's T5 v1.1 target and small draft, Chen's
  target and latency-first draft) or tiny ones (size "tiny", for smoke runs)."""
  if kind == "t5":
    common = dict(feed_forward="gated-gelu", tie_word_embeddings=False)
    if size == "tiny":
      tiny = dict(vocab_size=128, relative_attention_num_buckets=8,
                  relative_attention_max_distance=16, **common)
      t = dict(d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=1, **tiny)
      d = dict(d_model=16, d_kv=8, num_heads=2, d_ff=32, num_layers=1, **tiny)
    else:
      t = dict(vocab_size=4096, d_model=384, d_kv=64, num_heads=6, d_ff=1024, num_layers=4,
               **common)
      d = dict(vocab_size=4096, d_model=16, d_kv=8, num_heads=2, d_ff=32, num_layers=1,
               **common)
  elif kind == "decoder":
    if size == "tiny":
      t = dict(vocab_size=64, d_model=32, num_layers=1, num_heads=4, num_kv_heads=4,
               head_dim=8, mlp_dim=64)
      d = dict(vocab_size=64, d_model=16, num_layers=1, num_heads=2, num_kv_heads=2,
               head_dim=8, mlp_dim=32, tie_embeddings=True)
    else:
      t = dict(vocab_size=4096, d_model=384, num_layers=8, num_heads=6, num_kv_heads=6,
               head_dim=64, mlp_dim=1024)
      d = dict(vocab_size=4096, d_model=160, num_layers=1, num_heads=4, num_kv_heads=4,
               head_dim=40, mlp_dim=448, tie_embeddings=True)
  else:
    raise ValueError(f"kind must be 't5' or 'decoder', got {kind!r}")
  return PairSpec(name=name, kind=kind, target_dir=target_dir, draft_dir=draft_dir,
                  target_config=t, draft_config=d)


@dataclasses.dataclass
class Pair:
  spec: PairSpec
  target: Any
  tp: Any
  draft: Any
  dp: Any

  @property
  def kind(self) -> str:
    return self.spec.kind


def load_pair(spec: PairSpec) -> Pair:
  """Restores both models (trained) or initialises them (random, seeded)."""
  packed = spec.kind == "decoder" and spec.packed
  if spec.trained:
    target, tp = restore_model(spec.target_dir, packed)
    draft, dp = restore_model(spec.draft_dir, packed)
  else:
    cls = T5Config if spec.kind == "t5" else DecoderConfig
    target = model_for_config(cls(**spec.target_config))
    draft = model_for_config(cls(**spec.draft_config))
    tp = jax.jit(target.init)(jax.random.PRNGKey(spec.seed))
    dp = jax.jit(draft.init)(jax.random.PRNGKey(spec.seed + 1))
  kinds = {type(target), type(draft)}
  if kinds != {T5 if spec.kind == "t5" else DecoderLM}:
    raise ValueError(f"pair {spec.name!r} is of kind {spec.kind!r} but holds "
                     f"{type(target).__name__} / {type(draft).__name__}")
  if target.vocab_size != draft.vocab_size:
    raise ValueError(f"pair {spec.name!r}: target vocab {target.vocab_size} != draft vocab "
                     f"{draft.vocab_size}")
  if packed and not spec.trained:
    tp, dp = target.pack_params(tp), draft.pack_params(dp)
  if spec.kind == "decoder":
    target, draft = (m if rows is None else DecoderLM(m.config.replace(matvec_max_rows=rows))
                     for m, rows in ((target, spec.target_matvec_rows),
                                     (draft, spec.draft_matvec_rows)))
  return Pair(spec, target, tp, draft, dp)


def pair_prompts(pair: Pair, n: int, prompt_len: int, data_cache: str = "data_cache",
                 seed: int = 0) -> Tuple[np.ndarray, np.ndarray, str]:
  """`n` prompts `[n, P]` (int32, right-padded), their lengths and where they came from.

  A trained pair gets the first test examples of its reproduction's task
  (Leviathan: EN→DE with the T5 prefix, EOS kept on truncation, right-padded;
  Chen: "<description> Summary:", the last P tokens of examples at least P
  long, so decoder prompts need no padding and transformers can batch them
  without left padding). Random pairs, or a missing vocabulary / task cache,
  get uniform random tokens of full length P."""
  vocab = pair.target.vocab_size
  why = "random-init pair"
  workdir = os.path.dirname(os.path.dirname(os.path.abspath(pair.spec.target_dir or ".")))
  if pair.spec.trained:
    try:
      if pair.kind == "t5":
        tok, path = find_tokenizer(data_cache, "leviathan", vocab, workdir)
        if tok is None:
          raise FileNotFoundError(f"no leviathan vocabulary of size {vocab} in {data_cache}")
        rows = []
        for r in load_task(T5_TASK, "test", data_cache)[:n]:
          ids = tok.encode(T5_PREFIX + r["inputs"])
          rows.append(ids[:prompt_len - 1] + [tok.eos_id] if len(ids) > prompt_len else ids)
        source = f"{T5_TASK} test[:{n}], '{T5_PREFIX}' prefix, tokenizer {path}"
      else:
        tok, path = find_tokenizer(data_cache, "chen", vocab, workdir)
        if tok is None:
          raise FileNotFoundError(f"no chen vocabulary of size {vocab} in {data_cache}")
        rows = []
        for r in load_task(DECODER_TASK, "test", data_cache):
          ids = tok.encode(DECODER_TEMPLATE.format(**r), add_eos=False)
          if len(ids) >= prompt_len:
            rows.append(ids[-prompt_len:])
          if len(rows) == n:
            break
        source = (f"{DECODER_TASK} test, first {n} examples of >= {prompt_len} tokens, "
                  f"'{DECODER_TEMPLATE}', last {prompt_len} tokens, tokenizer {path}")
      if len(rows) < n:
        raise ValueError(f"only {len(rows)} usable test prompts, need {n}")
      prompts = np.zeros((n, prompt_len), np.int32)
      lengths = np.zeros((n,), np.int32)
      for i, ids in enumerate(rows):
        prompts[i, :len(ids)] = ids
        lengths[i] = len(ids)
      return prompts, lengths, source
    except (OSError, ValueError, KeyError) as e:
      why = f"test prompts unavailable: {e}"
  rng = np.random.default_rng(seed)
  prompts = rng.integers(3, vocab, size=(n, prompt_len)).astype(np.int32)
  return prompts, np.full((n,), prompt_len, np.int32), f"uniform random tokens ({why})"


def groups(batch: int, b1_prompts: int) -> List[Tuple[int, int]]:
  """Row ranges one timed call runs: batch 1 cycles over `b1_prompts`
  prompts (one request each, served one after another), batch B > 1 runs
  prompts 0..B-1 at once."""
  return [(i, i + 1) for i in range(b1_prompts)] if batch == 1 else [(0, batch)]


# --------------------------------------------------------------------------- streams


class SpecjaxStream:
  """One configuration of a pair decoded through `specjax.streaming.stream`
  (jitted `init_state` / `step`, caches and state donated, the committed
  tokens fetched to the host after each iteration, as a streaming server
  would). `gamma` 0: autoregressive."""

  def __init__(self, pair: Pair, gamma: int, max_new: int, cache_len: int):
    self.pair, self.gamma, self.max_new, self.cache_len = pair, gamma, max_new, cache_len
    if gamma == 0:
      self.decoder = AutoregressiveDecoder(pair.target, GREEDY, max_new)
    else:
      self.decoder = SpeculativeDecoder(pair.target, ModelDrafter(pair.draft), gamma, GREEDY,
                                        max_new)

  def run(self, prompts: np.ndarray, lengths: np.ndarray):
    """One request. Returns (t0, events, tokens `[B, N]`)."""
    p = self.pair
    b, plen = prompts.shape
    tc = p.target.init_cache(b, self.cache_len, plen)
    kw = {}
    if self.gamma:
      kw = dict(draft_params=p.dp, draft_cache=p.draft.init_cache(b, self.cache_len, plen))
    keys = jax.random.split(jax.random.key(0), b)
    res = stream(self.decoder, p.tp, jnp.asarray(prompts), jnp.asarray(lengths), keys, tc,
                 clock=now, **kw)
    return res.start, res.events, res.tokens_BN


try:
  from transformers.generation.streamers import BaseStreamer as _BaseStreamer
except ImportError:  # transformers is optional for the library.
  _BaseStreamer = object


class TimingStreamer(_BaseStreamer):
  """A transformers streamer that timestamps every `put`. The first put is
  the prompt (decoder-only) or the decoder start token (T5) and is skipped;
  later puts hold one token per row (`[B]`) or several for one row (`[1, k]`,
  assisted generation / prompt lookup)."""

  def __init__(self):
    self.events: List[Tuple[float, np.ndarray]] = []
    self.puts = 0
    self._cum: Optional[np.ndarray] = None

  def put(self, value):
    t = now()
    self.puts += 1
    if self.puts == 1:
      return
    shape = tuple(value.shape)
    new = np.full((shape[0],), shape[1]) if len(shape) == 2 else np.ones((shape[0],), np.int64)
    self._cum = new if self._cum is None else self._cum + new
    self.events.append((t, self._cum.copy()))

  def end(self):
    pass


# --------------------------------------------------------------------------- runners


@dataclasses.dataclass
class Runner:
  """One system at one configuration. `fn()` serves every request group once
  and returns the generated tokens `[rows, N]` (groups concatenated) plus
  per-call details; `stream()` (optional) returns latency events."""

  system: str
  batch: int
  gamma: int
  fn: Callable[[], Tuple[np.ndarray, Dict[str, Any]]]
  framework: str = "specjax"
  note: str = ""
  devices: int = 1                 # > 1: model-parallel over this many devices
  last: Dict[str, Any] = dataclasses.field(default_factory=dict)
  latency_events: List[Tuple[float, list]] = dataclasses.field(default_factory=list)


def decode(pair: "Pair", prompts, lengths, gamma: int, **kw):
  """specjax speculative (γ = `gamma`) or autoregressive (γ = 0) decoding of
  one batch, waited for; `kw` goes to `generate` / `speculative_generate`."""
  if gamma:
    out = specjax.speculative_generate(pair.target, pair.tp, pair.draft, pair.dp, prompts,
                                       lengths, gamma=gamma, **kw)
  else:
    out = specjax.generate(pair.target, pair.tp, prompts, lengths, **kw)
  out.tokens.block_until_ready()
  return out


def specjax_runner(pair: Pair, prompts: np.ndarray, lengths: np.ndarray, row_groups,
                   gamma: int, max_new: int, cache_len: int,
                   mesh: Optional[jax.sharding.Mesh] = None) -> Runner:
  """The fused loop (`specjax.generate` / `speculative_generate`), greedy, no
  EOS stop; requests served one after another, each blocked on.

  With a `mesh`, the target's params are split over its `model` axis
  (`sharding.shard_params`), the draft's replicated (`sharding.replicate`: a
  small draft's steps then need no collectives), and each request gets
  fresh caches placed the same way (inside the timed call, as `generate`
  allocates its own); the system is named "..., model-parallel ×<devices>".
  """
  name = "specjax " + ("speculative" if gamma else "autoregressive")
  kw = dict(max_new_tokens=max_new, sampling=GREEDY)
  if mesh is None:
    run_pair, devices = pair, 1
    data = [(jnp.asarray(prompts[a:b]), jnp.asarray(lengths[a:b])) for a, b in row_groups]
    kw["cache_len"] = cache_len
  else:
    devices = mesh.devices.size
    name += f", model-parallel ×{devices}"
    run_pair = dataclasses.replace(pair, tp=sharding.shard_params(pair.tp, mesh),
                                   dp=sharding.replicate(pair.dp, mesh))
    data = [sharding.shard_batch(mesh, np.asarray(prompts[a:b]), np.asarray(lengths[a:b]))
            for a, b in row_groups]
  runner = Runner(name, row_groups[0][1] - row_groups[0][0], gamma, fn=None, devices=devices)

  def caches(x):
    if mesh is None:
      return {}
    b, p = x.shape
    tc = sharding.sharded_cache(pair.target, mesh, b, cache_len, p)
    if not gamma:
      return {"cache": tc}
    return {"target_cache": tc,
            "draft_cache": sharding.replicate(pair.draft.init_cache(b, cache_len, p), mesh)}

  def fn():
    outs = [decode(run_pair, x, n, gamma, **kw, **caches(x)) for x, n in data]
    tokens = np.concatenate([np.asarray(o.tokens) for o in outs])
    stats = {
        "iterations": [int(jnp.max(o.stats.target_calls)) - 1 for o in outs],
        "drafted": sum(int(jnp.sum(o.stats.drafted)) for o in outs),
        "accepted": sum(int(jnp.sum(o.stats.accepted)) for o in outs),
        "hist": np.sum([np.asarray(jnp.sum(o.stats.accepted_hist, 0)) for o in outs], 0).tolist(),
    }
    return tokens, stats

  runner.fn = fn
  return runner


class HFPair:
  """The pair exported with `export_hf_t5` / `export_hf_decoder` and loaded by
  transformers (float32, eval mode), EOS disabled so every system generates
  exactly N tokens."""

  def __init__(self, pair: Pair, directory: str, threads: Optional[int] = None):
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    if threads:
      torch.set_num_threads(threads)
    self.kind = pair.kind
    self.dirs = {"target": os.path.join(directory, "target"),
                 "draft": os.path.join(directory, "draft")}
    if pair.kind == "t5":
      cls, export = transformers.T5ForConditionalGeneration, export_hf_t5
    else:
      cls, export = transformers.LlamaForCausalLM, export_hf_decoder
    for (name, folder), (model, params) in zip(self.dirs.items(),
                                               ((pair.target, pair.tp), (pair.draft, pair.dp))):
      if not os.path.exists(os.path.join(folder, "config.json")):
        export(params, model.config, folder)
    self.target, self.draft = (self.load(cls, self.dirs[k]) for k in ("target", "draft"))
    self.pad_id = pair.target.config.pad_id if pair.kind == "t5" else 0

  @staticmethod
  def load(cls, folder):
    model = cls.from_pretrained(folder).eval()
    model.generation_config.eos_token_id = None
    return model

  def configure_assistant(self, gamma: Optional[int]) -> None:
    """γ drafts per iteration, always (constant schedule, no confidence
    cut-off); None restores transformers' own defaults."""
    g = self.draft.generation_config
    if gamma is None:
      g.num_assistant_tokens = g.num_assistant_tokens_schedule = None
      g.assistant_confidence_threshold = None
    else:
      g.num_assistant_tokens, g.num_assistant_tokens_schedule = gamma, "constant"
      g.assistant_confidence_threshold = 0.0

  def generate(self, prompts: np.ndarray, lengths: np.ndarray, max_new: int, mode: str = "greedy",
               gamma: Optional[int] = None, streamer=None) -> np.ndarray:
    """`mode`: "greedy", "assisted" (the draft model, `gamma` tokens or the
    defaults) or "lookup" (prompt lookup, `gamma` tokens). Returns `[B, N]`."""
    import torch
    ids = torch.as_tensor(prompts, dtype=torch.long)
    mask = torch.as_tensor(np.arange(prompts.shape[1])[None] < lengths[:, None], dtype=torch.long)
    kw = {}
    if mode == "assisted":
      self.configure_assistant(gamma)
      kw["assistant_model"] = self.draft
    elif mode == "lookup":
      kw["prompt_lookup_num_tokens"] = gamma
    elif mode != "greedy":
      raise ValueError(f"mode must be greedy, assisted or lookup, got {mode!r}")
    with torch.inference_mode():
      out = self.target.generate(input_ids=ids, attention_mask=mask, do_sample=False, num_beams=1,
                                 max_new_tokens=max_new, pad_token_id=self.pad_id,
                                 streamer=streamer, **kw)
    start = 1 if self.kind == "t5" else prompts.shape[1]
    return out[:, start:].numpy()


def hf_runner(hf: HFPair, prompts: np.ndarray, lengths: np.ndarray, row_groups, mode: str,
              gamma: Optional[int], max_new: int) -> Runner:
  """transformers `generate`, one request group after another, each with a
  `TimingStreamer` (its events are kept for the latency summary)."""
  name = {"greedy": "transformers greedy", "assisted": "transformers assisted",
          "lookup": "transformers prompt lookup"}[mode]
  runner = Runner(name, row_groups[0][1] - row_groups[0][0], gamma or 0, fn=None,
                  framework="transformers",
                  note="transformers defaults" if mode == "assisted" and gamma is None else "")

  def fn():
    toks, events, puts = [], [], []
    for a, b in row_groups:
      streamer = TimingStreamer()
      t0 = now()
      toks.append(hf.generate(prompts[a:b], lengths[a:b], max_new, mode, gamma, streamer))
      events.append((t0, streamer.events))
      puts.append(streamer.puts - 1)
    return np.concatenate(toks), {"events": events, "iterations": [p - 1 for p in puts]}

  runner.fn = fn
  return runner


def interleaved_times(runners: Sequence[Runner], repeats: int, log=None) -> None:
  """Calls every runner once (warm-up: compilation for specjax), then
  `repeats` rounds over all of them, the order rotated each round
  (`interleaved_rounds`). Fills `runner.last` with first_s, runs (seconds),
  median_s, tokens, stats; keeps transformers' stream events of the timed
  rounds."""
  for r in runners:
    t0 = now()
    tokens, stats = r.fn()
    r.last = {"first_s": now() - t0, "runs": [], "tokens": tokens, "stats": stats}
    if log:
      log(f"  warm {r.system} B={r.batch} γ={r.gamma}: {r.last['first_s']:.2f}s")
  if repeats < 1:
    for r in runners:
      r.last["median_s"] = r.last["first_s"]
    return

  def timed(r: Runner):
    tokens, stats = r.fn()
    r.latency_events.extend(stats.get("events", ()))
    return tokens, stats
  rounds = interleaved_rounds({i: functools.partial(timed, r) for i, r in enumerate(runners)},
                              repeats)
  for i, r in enumerate(runners):
    r.last.update(runs=rounds.seconds[i], median_s=rounds.median(i), tokens=rounds.last[i][0],
                  stats=rounds.last[i][1])


def token_agreement(tokens: np.ndarray, reference: np.ndarray) -> Dict[str, Any]:
  """Rows identical to the reference, and the first differing position."""
  same = np.all(tokens == reference, axis=1)
  diff = np.nonzero(np.any(tokens != reference, axis=0))[0]
  return {"identical_rows": int(same.sum()), "rows": int(same.size),
          "identical": bool(same.all()), "first_mismatch": int(diff[0]) if diff.size else None}


# --------------------------------------------------------------------------- predictions


def _prefill_call(model, params, prompts: np.ndarray, lengths: np.ndarray,
                  cache_len: int) -> Callable[[], Any]:
  """A call of one jitted prefill of these prompts, blocked on (not yet compiled)."""
  b, plen = prompts.shape
  fn = jax.jit(lambda p, x, n, c: model.prefill(p, x, n, c)[0])
  cache = model.init_cache(b, cache_len, plen)
  x, n = jnp.asarray(prompts), jnp.asarray(lengths)
  return lambda: fn(params, x, n, cache).block_until_ready()


def prefill_time(model, params, prompts: np.ndarray, lengths: np.ndarray, cache_len: int,
                 repeats: int = 3) -> float:
  """Median seconds of one jitted prefill of these prompts."""
  call = _prefill_call(model, params, prompts, lengths, cache_len)
  return time_call(call, repeats=repeats)["median_s"]


def overhead_fields(pred: Dict[str, float], ar_s: float, sp_s: float) -> Dict[str, float]:
  """Measured speedup and loop overheads of AR / speculative wall times
  `ar_s` / `sp_s` against their `loop_prediction` `pred`."""
  measured = ar_s / sp_s
  return {"measured_speedup": measured,
          "loop_overhead": pred["predicted_speedup"] / measured - 1,
          "ar_loop_overhead": ar_s / pred["ar_predicted_s"] - 1,
          "sp_loop_overhead": sp_s / pred["sp_predicted_s"] - 1}


def call_loop_fields(pred: Dict[str, float], ar_s: float, sp_s: float, ar_calls_s: float,
                     sp_calls_s: float) -> Dict[str, float]:
  """Splits the loop overhead of `overhead_fields` in two with the wall times
  of the model-call loops (`specjax.measure.calls.model_call_loop`, same
  requests and iterations): `logic_overhead` = model-call speedup / measured
  speedup − 1 (what verify, commit, stopping, statistics and the API's host
  work cost the speedup) and `composition_overhead` = predicted speedup /
  model-call speedup − 1 (what composing the components into one loop costs
  against timing each in its own: draft and target one after another,
  positions that advance); (1 + the two) multiply to
  1 + loop_overhead. Per loop: `ar_logic` / `sp_logic` = wall / model-call
  loop − 1, `ar_composition` / `sp_composition` = model-call loop /
  prediction − 1."""
  calls_speedup = ar_calls_s / sp_calls_s
  return {"calls_speedup": calls_speedup,
          "logic_overhead": calls_speedup / (ar_s / sp_s) - 1,
          "composition_overhead": pred["predicted_speedup"] / calls_speedup - 1,
          "ar_logic": ar_s / ar_calls_s - 1, "sp_logic": sp_s / sp_calls_s - 1,
          "ar_composition": ar_calls_s / pred["ar_predicted_s"] - 1,
          "sp_composition": sp_calls_s / pred["sp_predicted_s"] - 1}


def loop_prediction(max_new: int, gamma: int, iterations: Sequence[int], t_target: Dict[int, float],
                    t_draft: Dict[int, float], prefill_target_s: float,
                    prefill_draft_s: float) -> Dict[str, float]:
  """Wall seconds the fused loops would take if they cost exactly their
  components, summed over the request groups (`iterations`: the speculative
  while-loop iterations of each group).

  autoregressive: prefill + (N - 1) target steps (T = 1);
  speculative: both prefills + per iteration the draft's T = 2 step,
  γ - 1 draft steps (T = 1) and one target verify (T = γ + 1)."""
  groups_n = len(iterations)
  ar = groups_n * (prefill_target_s + (max_new - 1) * t_target[1])
  per_iter = t_draft[2] + (gamma - 1) * t_draft[1] + t_target[gamma + 1]
  sp = sum(prefill_target_s + prefill_draft_s + it * per_iter for it in iterations)
  return {"ar_predicted_s": ar, "sp_predicted_s": sp, "iteration_predicted_s": per_iter,
          "predicted_speedup": ar / sp}


def paired_loop_overhead(pair: Pair, ar: "Runner", sp: "Runner", prompts: np.ndarray,
                         lengths: np.ndarray, cache_len: int, max_new: int, rounds: int,
                         steps: int = 32, min_loop_seconds: float = 0.0,
                         max_rounds: Optional[int] = None,
                         model_calls: bool = True) -> Dict[str, Any]:
  """The loop overhead of speculative runner `sp` against autoregressive
  runner `ar` (both built by `specjax_runner`, same requests), measured in
  `rounds` rounds that each time both loops once and, right after, every
  component once: the target's step at T = 1 and T = γ + 1, the draft's at
  T = 1 and 2 (`StepTimer`), both prefills (the first request group's
  prompts). Each round gives predicted speedup (`loop_prediction`) / measured
  speedup − 1 from numbers taken seconds apart, so a slow phase of a noisy
  machine moves both sides; the result is the median over rounds, with
  every round kept.

  Short loops are noisy one call at a time (a 0.2 s call varies by ±35% on
  a busy 2-core machine), so after `rounds` rounds more are run until the
  loops' summed wall time (AR + speculative, all rounds) reaches
  `min_loop_seconds`, up to `max_rounds` (default 4 × `rounds`): every batch
  size gets about the same measured time, whatever its loops cost.

  With `model_calls`, each round also times the two loops' model calls alone
  (`specjax.measure.calls.model_call_loop`: same requests, the round's
  iteration counts) and splits the overhead into the decoding logic's and
  the composition's part (`call_loop_fields`). The request groups are
  consecutive row blocks of the runners' batch (`groups`)."""
  if rounds < 1:
    raise ValueError(f"rounds must be >= 1, got {rounds}")
  if max_rounds is None:
    max_rounds = 4 * rounds
  if max_rounds < rounds:
    raise ValueError(f"max_rounds must be >= rounds ({rounds}), got {max_rounds}")
  if not min_loop_seconds >= 0:
    raise ValueError(f"min_loop_seconds must be >= 0, got {min_loop_seconds}")
  if ar.gamma != 0 or sp.gamma < 1:
    raise ValueError(f"ar must be autoregressive (γ 0) and sp speculative (γ ≥ 1), got γ "
                     f"{ar.gamma} and {sp.gamma}")
  g, b, plen = sp.gamma, ar.batch, prompts.shape[1]
  target = StepTimer(pair.target, pair.tp, b, cache_len, plen, [1, g + 1], steps)
  draft = StepTimer(pair.draft, pair.dp, b, cache_len, plen, [1, 2], steps)
  prefills = [_prefill_call(m, p, prompts[:b], lengths[:b], cache_len)
              for m, p in ((pair.target, pair.tp), (pair.draft, pair.dp))]
  for call in prefills:
    call()  # compile
  call_loops = _call_loops(pair, prompts, lengths, b, g, cache_len) if model_calls else None

  def seconds(fn):
    t0 = now()
    result = fn()
    return now() - t0, result

  out, loop_s, r = [], 0.0, 0
  while r < rounds or (loop_s < min_loop_seconds and r < max_rounds):
    wall, stats = {}, {}
    for run in ([ar, sp] if r % 2 == 0 else [sp, ar]):
      wall[run.gamma], (_, stats[run.gamma]) = seconds(run.fn)
    tt = {t: floor_step_seconds(v) for t, v in target.measure(1).items()}
    td = {t: floor_step_seconds(v) for t, v in draft.measure(1).items()}
    pt, pd = (seconds(f)[0] for f in prefills)
    pred = loop_prediction(max_new, g, stats[g]["iterations"], tt, td, pt, pd)
    row = dict(pred, ar_s=wall[0], sp_s=wall[g], **overhead_fields(pred, wall[0], wall[g]),
               target_ms={t: 1e3 * v for t, v in tt.items()},
               draft_ms={t: 1e3 * v for t, v in td.items()},
               prefill_ms={"target": 1e3 * pt, "draft": 1e3 * pd})
    if call_loops:
      iters = {0: [max_new - 1] * len(stats[g]["iterations"]), g: stats[g]["iterations"]}
      calls = {}
      for gamma in ([0, g] if r % 2 else [g, 0]):
        calls[gamma] = seconds(lambda: call_loops(gamma, iters[gamma]))[0]
      row.update(ar_calls_s=calls[0], sp_calls_s=calls[g],
                 **call_loop_fields(pred, wall[0], wall[g], calls[0], calls[g]))
    out.append(row)
    loop_s, r = loop_s + wall[0] + wall[g], r + 1
  med = lambda key: statistics.median(o[key] for o in out)
  ovh = [o["loop_overhead"] for o in out]
  keys = ["predicted_speedup", "measured_speedup", "ar_loop_overhead", "sp_loop_overhead"]
  if call_loops:
    keys += ["calls_speedup", "logic_overhead", "composition_overhead", "ar_logic", "sp_logic",
             "ar_composition", "sp_composition"]
  return {"batch": b, "gamma": g, "rounds": out, "loop_seconds": loop_s,
          "loop_overhead": med("loop_overhead"),
          "loop_overhead_min": min(ovh), "loop_overhead_max": max(ovh),
          **{key: med(key) for key in keys}}


def _call_loops(pair: Pair, prompts: np.ndarray, lengths: np.ndarray, batch: int, gamma: int,
                cache_len: int) -> Callable[[int, Sequence[int]], None]:
  """`run(γ, iterations)`: the model-call loops (γ 0: autoregressive, else
  speculative at `gamma`) of request groups 0, 1, ... (rows i·B..(i+1)·B),
  group i running iterations[i], each blocked on; caches made per call as
  the fused loops make theirs. Compiled here."""
  loops = {0: model_call_loop(pair.target, None, 0),
           gamma: model_call_loop(pair.target, pair.draft, gamma)}
  plen = prompts.shape[1]
  data = [(jnp.asarray(prompts[i:i + batch]), jnp.asarray(lengths[i:i + batch]))
          for i in range(0, len(prompts) - batch + 1, batch)]

  def run(g: int, iterations: Sequence[int]) -> None:
    if len(iterations) > len(data):
      raise ValueError(f"{len(iterations)} request groups of {batch} rows, but only "
                       f"{len(prompts)} prompts")
    for (x, n), it in zip(data, iterations):
      tc = pair.target.init_cache(batch, cache_len, plen)
      dc = pair.draft.init_cache(batch, cache_len, plen) if g else None
      loops[g](pair.tp, pair.dp, x, n, tc, dc, jnp.int32(it))[0].block_until_ready()

  for g in loops:
    run(g, [1])  # compile
  return run


# --------------------------------------------------------------------------- memory


def _status_kb(field: str) -> Optional[int]:
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1])
  except OSError:
    pass
  return None


def _reset_peak() -> bool:
  """Resets the kernel's peak-RSS mark (VmHWM) of this process (Linux ≥ 4.0)."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


def _trim_heap() -> None:
  """Returns the C heap's free pages to the OS (glibc `malloc_trim`), so that
  memory freed after loading (e.g. host copies of the weights) does not count
  as held; a no-op where there is no glibc."""
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):
    pass


def memory_job(job: Dict[str, Any]) -> Dict[str, Any]:
  """Runs one system in this (fresh) process and reports its memory in MiB.

  idle = RSS after the imports and a first tiny op of the framework;
  `peak_mb` = peak RSS during a steady (second) generation call − idle: the
  weights, caches, compiled code and working memory a server holds;
  `peak_with_load_mb` = peak RSS over loading, compiling and the first
  call − idle; `transient_mb` = peak of the steady call − RSS just before it
  (the call's own working memory); `resident_mb` = RSS after the calls − idle."""
  system, batch, gamma = job["system"], job["batch"], job.get("gamma", 0)
  data = np.load(job["prompts_path"])
  prompts, lengths = data["prompts"][:batch], data["lengths"][:batch]
  spec = PairSpec(**job["pair"])
  if system.startswith("specjax"):
    if spec.trained:
      import orbax.checkpoint  # noqa: F401  (imported before the idle mark)
    jnp.zeros((1,)).block_until_ready()
  else:
    import torch
    import transformers  # noqa: F401
    torch.zeros(1).sum()
  gc.collect()
  idle = _status_kb("VmRSS")
  if system.startswith("specjax"):
    pair = load_pair(spec)
    kw = dict(max_new_tokens=job["max_new"], sampling=GREEDY, cache_len=job["cache_len"])
    x, n = jnp.asarray(prompts), jnp.asarray(lengths)

    call = lambda: decode(pair, x, n, gamma, **kw)
  else:
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(job.get("threads") or os.cpu_count())
    cls = (transformers.T5ForConditionalGeneration if spec.kind == "t5"
           else transformers.LlamaForCausalLM)
    hf = HFPair.__new__(HFPair)
    hf.kind, hf.pad_id = spec.kind, 0
    hf.target = HFPair.load(cls, job["hf_dirs"]["target"])
    hf.draft = HFPair.load(cls, job["hf_dirs"]["draft"]) if job["mode"] == "assisted" else None
    call = lambda: hf.generate(prompts, lengths, job["max_new"], job["mode"], gamma or None)
  call()
  peak_with_load = _status_kb("VmHWM")
  gc.collect()
  _trim_heap()
  before = _status_kb("VmRSS")
  reset = _reset_peak()
  call()
  peak = _status_kb("VmHWM")
  resident = _status_kb("VmRSS")
  mib = lambda kb, ref=idle: None if kb is None or ref is None else (kb - ref) / 1024
  return {"idle_rss_mb": idle / 1024 if idle else None,
          "peak_mb": mib(peak) if reset else None, "peak_with_load_mb": mib(peak_with_load),
          "transient_mb": mib(peak, before) if reset else None,
          "resident_mb": mib(resident), "peak_reset": reset}


def measure_memory(job: Dict[str, Any], timeout_s: float = 600) -> Dict[str, Any]:
  """`memory_job(job)` in a fresh Python process; {"error": ...} on failure."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ)
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  env.setdefault("JAX_PLATFORMS", "cpu")
  cmd = [sys.executable, "-m", "experiments.programs.peers", "--memory_job", json.dumps(job)]
  try:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout_s:.0f}s"}
  lines = [l for l in res.stdout.splitlines() if l.startswith("{")]
  if res.returncode or not lines:
    return {"error": f"exit {res.returncode}: {res.stderr.strip().splitlines()[-1:]}"}
  return json.loads(lines[-1])


# --------------------------------------------------------------------------- cost growth


def cost_growth(pair: Pair, prompts: np.ndarray, lengths: np.ndarray, gamma: int,
                new_tokens: Sequence[int], buffer_factors: Sequence[int], base_new: int,
                repeats: int, log=None, fresh_compile: bool = True) -> List[Dict[str, Any]]:
  """Fused-loop time per generated token (batch = prompts' rows), for
  autoregressive and speculative (γ = `gamma`) decoding:

  * "length": N in `new_tokens`, each with the minimal buffer for N (and γ);
  * "buffer": N = `base_new` with buffers of factor × the minimal one.

  With `fresh_compile`, JAX's in-memory compilation cache is cleared first,
  so every distinct configuration compiles once here and `compile_s` (first
  − median call) is a real compilation; a configuration in both sweeps is
  measured once."""
  target = pair.target
  plen = prompts.shape[1]
  x, n = jnp.asarray(prompts), jnp.asarray(lengths)
  cells = [("length", N, 1) for N in new_tokens] + [("buffer", base_new, f) for f in buffer_factors]
  runs: Dict[Tuple[int, int, int], Dict[str, Any]] = {}
  out = []
  for sweep, N, factor in cells:
    need = specjax.required_cache_len(target, plen, N, gamma)
    for g in (0, gamma):
      key = (N, need * factor, g)
      if key not in runs:
        kw = dict(max_new_tokens=N, sampling=GREEDY, cache_len=need * factor)
        if g:
          fn = lambda kw=kw: specjax.speculative_generate(
              pair.target, pair.tp, pair.draft, pair.dp, x, n, gamma=gamma, **kw).tokens
        else:
          fn = lambda kw=kw: specjax.generate(target, pair.tp, x, n, **kw).tokens
        runs[key] = {"fn": fn, "runs": []}
      out.append({"sweep": sweep, "new_tokens": N, "buffer_factor": factor,
                  "cache_len": need * factor, "needed_cache_len": need, "gamma": g,
                  "batch": int(prompts.shape[0]), "_key": key})
  if fresh_compile:
    jax.clear_caches()
  order = list(runs.values())
  for r in order:
    t0 = now()
    r["fn"]().block_until_ready()
    r["first_s"] = now() - t0
  if repeats:   # rounds over every configuration, the order rotated each round
    timed = interleaved_rounds({i: r["fn"] for i, r in enumerate(order)}, repeats)
    for i, r in enumerate(order):
      r["runs"] = timed.seconds[i]
  for row in out:
    r = runs[row.pop("_key")]
    med = statistics.median(r["runs"]) if r["runs"] else r["first_s"]
    row.update(median_s=med, runs=list(r["runs"]), first_s=r["first_s"],
               ms_per_token=1e3 * med / row["new_tokens"], compile_s=max(r["first_s"] - med, 0.0))
    if log:
      log(f"  growth {row['sweep']} N={row['new_tokens']} S={row['cache_len']} γ={row['gamma']}: "
          f"{row['ms_per_token']:.2f} ms/token, compile {row['compile_s']:.1f}s")
  return out


if __name__ == "__main__":
  if len(sys.argv) == 3 and sys.argv[1] == "--memory_job":
    print(json.dumps(memory_job(json.loads(sys.argv[2]))))
  else:
    sys.exit("usage: python -m experiments.programs.peers --memory_job JSON")
