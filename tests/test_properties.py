"""Property-based safety net for restructuring: exactness and batch independence.

Hypothesis draws ragged batches of prompts that repeat a short motif (so prompt
lookup and lookahead find matches), their lengths and the PRNG keys; each case
fixes a drafter, γ, sampling and EOS id (None, or a token the tiny target
emits, so rows end at drawn places). Properties, for the drafter families:

  1. greedy speculative decoding == greedy autoregressive decoding token for
     token: `specjax.generate` without EOS, cut after the first EOS and
     padded on the host (the documented semantics; one compiled AR loop
     serves every EOS id);
  2. a row decoded alone (batch 1, key[b:b + 1]) gives the tokens and length
     it has inside the batch (one key per row), greedy and sampled.

Compilation dominates (~2-9 s per decoding loop on 2 CPU cores): a case is
compiled once for batch 3 (and batch 1 for property 2); the drawn values are
arrays and reuse it. The cases cover every family (a separate draft model,
prompt lookup, layer skip, windowed KV, lookahead, a Medusa tree, EAGLE's
chain, static tree and dynamic tree) and so every verification path (chains
with draft distributions, deterministic chains, lookahead's candidates,
static and dynamic trees), and batch independence greedy and sampled
(~50 s). Sampled exactness of each family is the chi-square tests' job.
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specjax
import specjax.drafters as drafters
from tiny import EOS, VOCAB, target

from specjax.tree import TokenTree

B, P, N = 3, 12, 12  # batch, padded prompt length, new tokens: static, one value each
PAD = 0
EMITTED = 41  # a token the target often samples (greedy often emits EOS = 5)
GREEDY = specjax.GREEDY
T1 = specjax.SamplingConfig(1.0)
TREE = TokenTree.from_paths([(0,), (1,), (0, 0)])
EXAMPLES = settings(max_examples=8, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


def _draft_model():
  """The target with a perturbed LM head, a separate draft model: it accepts
  0-2 of 2 drafts (tiny.noisy_draft's eager per-leaf noise compiles for ~5 s)."""
  lm, params = target()
  kernel = params["lm_head"]["kernel"]
  noise = jax.random.normal(jax.random.key(7), kernel.shape)
  return lm, {**params, "lm_head": {"kernel": kernel + 0.2 * jnp.std(kernel) * noise}}


def _medusa(tree):
  lm, params = target()
  config = drafters.MedusaConfig(num_heads=2, d_model=lm.config.d_model, vocab_size=VOCAB)
  heads = drafters.init_heads(config, lm, params)
  heads["w"] = 0.5 * jax.random.normal(jax.random.key(1), heads["w"].shape)
  return drafters.Medusa(config, tree), {"heads": heads, "target": None}


def _eagle(tree):
  lm, params = target()
  config = drafters.EagleConfig(d_model=lm.config.d_model, vocab_size=VOCAB, num_heads=2,
                                mlp_dim=64)
  return drafters.Eagle(config, tree, lm), {"head": drafters.init_eagle(config, jax.random.key(3)),
                                            "target": params}


DRAFTERS = {  # name: () -> (draft, draft params)
    "model": _draft_model,  # a LanguageModel as `draft`: wrapped in a ModelDrafter
    "prompt_lookup": lambda: (drafters.PromptLookup(max_ngram=3, min_ngram=1), None),
    "layer_skip": lambda: (drafters.LayerSkip(target()[0], (0,)), None),
    "windowed_kv": lambda: (drafters.WindowedKV.of(target()[0], window=4, sinks=2, gamma=2), None),
    "lookahead": lambda: (drafters.Lookahead(window=2, ngram=3, candidates=2, pool_size=8), None),
    "medusa_tree": lambda: _medusa(TREE),
    "eagle_chain": lambda: _eagle(TokenTree.chain(2)),
    "eagle_tree": lambda: _eagle(TREE),
    "eagle2_dynamic": lambda: _eagle(drafters.DynamicTree(top_k=2, depth=2, nodes=3)),
}


class Case(NamedTuple):
  drafter: str
  gamma: Optional[int]  # None: the drafter fixes its own (lookahead, trees)
  sampling: specjax.SamplingConfig
  eos_id: Optional[int]
  alone: bool  # property 2 (greedy cases: property 1 as well)


CASES = {
    "model": Case("model", 2, GREEDY, EOS, False),
    "prompt_lookup": Case("prompt_lookup", 3, GREEDY, None, True),
    "layer_skip": Case("layer_skip", 2, GREEDY, EOS, False),
    "windowed_kv": Case("windowed_kv", 2, GREEDY, EOS, False),
    "lookahead": Case("lookahead", None, GREEDY, EOS, False),
    "medusa_tree": Case("medusa_tree", None, GREEDY, EOS, False),
    "eagle_chain": Case("eagle_chain", None, GREEDY, None, False),
    "eagle_tree": Case("eagle_tree", None, GREEDY, EOS, False),
    "eagle2_dynamic": Case("eagle2_dynamic", None, GREEDY, EOS, False),
    "layer_skip-T1": Case("layer_skip", 2, T1, EMITTED, True),
}
GREEDY_CASES = [n for n, c in CASES.items() if c.sampling.is_greedy]
ALONE_CASES = [n for n, c in CASES.items() if c.alone]

built = functools.lru_cache(maxsize=None)(lambda name: DRAFTERS[name]())


@st.composite
def ragged_batches(draw):
  """B right-padded prompts, each a motif of 1-5 tokens repeated to a drawn length."""
  prompts_BP = np.full((B, P), PAD, np.int32)
  lengths_B = np.zeros((B,), np.int32)
  for b in range(B):
    motif = draw(st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=5))
    lengths_B[b] = draw(st.integers(1, P))
    prompts_BP[b, :lengths_B[b]] = np.resize(motif, lengths_B[b])
  return jnp.asarray(prompts_BP), jnp.asarray(lengths_B)


def _speculative(case, prompts_BP, lengths_B, key_B=None):
  lm, params = target()
  draft, draft_params = built(case.drafter)
  gamma = {} if case.gamma is None else {"gamma": case.gamma}
  return specjax.speculative_generate(lm, params, draft, draft_params, prompts_BP, lengths_B,
                                      max_new_tokens=N, sampling=case.sampling, key=key_B,
                                      eos_id=case.eos_id, pad_id=PAD, **gamma)


def _greedy_reference(prompts_BP, lengths_B, eos_id):
  """(tokens [B, N], lengths [B]) of greedy AR decoding that stops after `eos_id`."""
  lm, params = target()
  ref = specjax.generate(lm, params, prompts_BP, lengths_B, max_new_tokens=N,
                         sampling=GREEDY)  # one compiled loop for every EOS id
  tokens_BN = np.asarray(ref.tokens)
  np.testing.assert_array_equal(ref.lengths, N)
  if eos_id is None:
    return tokens_BN, np.full((B,), N)
  hit_BN = tokens_BN == eos_id
  lengths_B = np.where(hit_BN.any(1), hit_BN.argmax(1) + 1, N)
  return np.where(np.arange(N)[None] < lengths_B[:, None], tokens_BN, PAD), lengths_B


@pytest.mark.parametrize("name", GREEDY_CASES)
@EXAMPLES
@given(batch=ragged_batches())
def test_greedy_speculative_equals_greedy_autoregressive(name, batch):
  case = CASES[name]
  prompts_BP, lengths_B = batch
  tokens_BN, ref_lengths_B = _greedy_reference(prompts_BP, lengths_B, case.eos_id)
  out = _speculative(case, prompts_BP, lengths_B)
  np.testing.assert_array_equal(out.tokens, tokens_BN)
  np.testing.assert_array_equal(out.lengths, ref_lengths_B)


@pytest.mark.parametrize("name", ALONE_CASES)
@EXAMPLES
@given(batch=ragged_batches(), seed=st.integers(0, 2**31 - 1))
def test_a_row_alone_equals_the_row_in_the_batch(name, batch, seed):
  case = CASES[name]
  prompts_BP, lengths_B = batch
  key_B = jax.random.split(jax.random.key(seed), B)
  full = _speculative(case, prompts_BP, lengths_B, key_B)
  for b in range(B):
    alone = _speculative(case, prompts_BP[b:b + 1], lengths_B[b:b + 1], key_B[b:b + 1])
    np.testing.assert_array_equal(alone.tokens[0], full.tokens[b], err_msg=f"row {b}")
    assert int(alone.lengths[0]) == int(full.lengths[b]), f"row {b}"
