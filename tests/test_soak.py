"""A long-lived process: 100 decoding calls over 10 shapes and 4 drafters
(and plain decoding) in one process keep their memory bounded, and the
library's cache policy (`specjax.compiled`) releases compiled programs.

XLA:CPU maps ~200 regions per compiled program; a process that piles up
programs runs out of mappings (`vm.max_map_count`) and crashes. Measured
here: the process's mappings (/proc/self/maps) and RSS. Linux only.
"""

import os
import sys

import jax
import numpy as np
import pytest

import specjax
from specjax.drafters import LayerSkip, PromptLookup
from specjax.models.ngram import BigramLM
from tiny import VOCAB, small_draft
from tree_drafters import TableTree

from specjax.tree import TokenTree

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or
                                not os.path.exists("/proc/self/maps"),
                                reason="reads /proc/self/maps and /proc/self/status")

SHAPES = [(b, p) for b in (1, 2) for p in (3, 4, 5, 6, 7)]  # 10 (batch, prompt length)
KINDS = ("ar", "draft_model", "prompt_lookup", "layer_skip", "tree")  # 5 divides 10
CALLS = 100


def _maps() -> int:
  with open("/proc/self/maps") as f:
    return sum(1 for _ in f)


def _rss_mb() -> float:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  raise AssertionError("no VmRSS in /proc/self/status")


def _call(k, lm, params, table):
  b, p = SHAPES[k % len(SHAPES)]
  kind = KINDS[k % len(KINDS)]
  rng = np.random.default_rng(k)
  prompts = rng.integers(6, VOCAB, size=(b, p)).astype(np.int32)
  lengths = rng.integers(1, p + 1, size=b).astype(np.int32)
  kw = dict(max_new_tokens=6, sampling=specjax.SamplingConfig(1.0), key=jax.random.key(k))
  if kind == "ar":
    out = specjax.generate(lm, params, prompts, lengths, **kw)
  else:
    draft, draft_params = {
        "draft_model": (BigramLM(VOCAB), table),
        "prompt_lookup": (PromptLookup(), None),
        "layer_skip": (LayerSkip(lm, (0,)), None),
        "tree": (TableTree(TokenTree.from_paths([(0,), (1,), (0, 0)])), table),
    }[kind]
    out = specjax.speculative_generate(lm, params, draft, draft_params, prompts, lengths,
                                       gamma=2, **kw)
  tokens = np.asarray(out.tokens)
  assert tokens.shape == (b, 6) and tokens.min() >= 0 and tokens.max() < VOCAB


def test_100_calls_keep_memory_bounded_and_clear_compiled_releases_it():
  lm, params = small_draft()  # a 1-layer decoder: the target here
  table = {"logits": jax.random.normal(jax.random.key(3), (VOCAB, VOCAB))}
  specjax.clear_compiled()
  maps0, rss0 = _maps(), _rss_mb()
  for k in range(len(SHAPES)):  # every program compiled once
    _call(k, lm, params, table)
  assert specjax.compiled_programs() == len(SHAPES)
  maps1, rss1 = _maps(), _rss_mb()
  per_program = (maps1 - maps0) / len(SHAPES)
  for k in range(len(SHAPES), CALLS):  # the same 10 programs, 90 more calls
    _call(k, lm, params, table)
  maps2, rss2 = _maps(), _rss_mb()
  assert specjax.compiled_programs() == len(SHAPES)  # nothing retraced
  assert maps2 - maps1 <= 64, (maps1, maps2)  # no mappings per call
  assert rss2 - rss1 <= 64, (rss1, rss2)  # MB
  assert specjax.clear_compiled() == len(SHAPES)
  maps3, rss3 = _maps(), _rss_mb()
  assert specjax.compiled_programs() == 0
  assert maps3 - maps0 <= 0.25 * (maps1 - maps0), (maps0, maps1, maps3)
  assert rss3 <= rss2 + 16, (rss2, rss3)
  print(f"maps {maps0} → {maps1} ({len(SHAPES)} programs, {per_program:.0f} each) → {maps2} after "
        f"{CALLS} calls → {maps3} cleared; RSS MB {rss0:.0f} → {rss1:.0f} → {rss2:.0f} → "
        f"{rss3:.0f}")

  # The policy: at most 3 programs kept; a 4th releases them all.
  previous = specjax.set_max_compiled_programs(3)
  counts = []
  try:
    for n in range(2, 10):  # 8 new programs
      specjax.generate(lm, params, np.full((1, 3), 9, np.int32), max_new_tokens=n,
                       sampling=specjax.GREEDY)
      counts.append(specjax.compiled_programs())
    assert counts == [1, 2, 3, 0] * 2  # the 4th program released all four
    assert _maps() - maps3 <= 4 * per_program + 64
  finally:
    specjax.set_max_compiled_programs(previous)


def test_policy_arguments_are_checked():
  with pytest.raises(ValueError, match="n must be an int >= 0, got -1"):
    specjax.set_max_compiled_programs(-1)
  with pytest.raises(TypeError, match="n must be an int"):
    specjax.set_max_compiled_programs(2.5)
  with pytest.raises(TypeError, match="jax.jit-compiled function"):
    specjax.compiled.register(lambda x: x)
  assert specjax.max_compiled_programs() >= 0
