"""Shared helpers of the T5 tests: tiny configs, rigged EOS, transformers models."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np

from specjax.models.t5 import T5Config

# Tiny shapes: 3 encoder / 2 decoder layers (transformers 5.24's generate
# breaks when the decoder is the deeper stack: its cache is sized by
# num_layers), buckets small enough that the logarithmic bins and the
# max-distance bucket are reached by short inputs.
TINY = dict(vocab_size=96, d_model=48, d_kv=8, num_heads=4, d_ff=80, num_layers=3,
            num_decoder_layers=2, relative_attention_num_buckets=8,
            relative_attention_max_distance=12)


def tiny_config(version: str, **overrides) -> T5Config:
  """A tiny v1.0 ("1.0": relu, tied) or v1.1 ("1.1": gated-gelu, untied) config."""
  ff, tied = {"1.0": ("relu", True), "1.1": ("gated-gelu", False)}[version]
  return T5Config(**{**TINY, "feed_forward": ff, "tie_word_embeddings": tied, **overrides})


def ragged_inputs(rng: np.random.Generator, lengths, width: int, vocab: int, pad_id: int = 0,
                  garbage: bool = False):
  """Right-padded encoder inputs `[B, width]` (tokens in [2, vocab)) and lengths `[B]`.
  With `garbage`, the padding holds random tokens instead of pad_id."""
  lengths = np.asarray(lengths, np.int32)
  tokens = rng.integers(2, vocab, size=(len(lengths), width)).astype(np.int32)
  pad = np.arange(width)[None, :] >= lengths[:, None]
  if not garbage:
    tokens[pad] = pad_id
  return tokens, lengths


def pick_eos(tokens_BN: np.ndarray, skip=()):
  """A token that some rows emit and others never do — rigs EOS so that rows
  end at different steps, some by EOS and some by the length limit. Prefers
  tokens whose first occurrence is late (so those rows still speculate)."""
  tokens_BN = np.asarray(tokens_BN)
  best, best_score = None, -1
  for tok in np.unique(tokens_BN):
    if tok in skip:
      continue
    hit = (tokens_BN == tok)
    rows = hit.any(axis=1)
    if rows.all() or not rows.any():
      continue
    first = np.argmax(hit[rows], axis=1)
    score = min(rows.sum(), (~rows).sum()) * 10 + len(np.unique(first)) + first.min()
    if score > best_score:
      best, best_score = int(tok), score
  if best is None:
    raise AssertionError("no token splits the rows; pick another seed")
  return best


def hf_t5(version: str, seed: int, **overrides):
  """A random transformers T5ForConditionalGeneration (eval, fp32) of the tiny
  shape, re-initialised with larger weights so greedy outputs vary and the
  relative bias matters; v1.1 gets a separate (untied) lm_head."""
  import torch
  import transformers

  c = tiny_config(version, **overrides)
  hc = transformers.T5Config(
      vocab_size=c.vocab_size, d_model=c.d_model, d_kv=c.d_kv, num_heads=c.num_heads,
      d_ff=c.d_ff, num_layers=c.num_layers, num_decoder_layers=c.num_decoder_layers,
      relative_attention_num_buckets=c.relative_attention_num_buckets,
      relative_attention_max_distance=c.relative_attention_max_distance,
      feed_forward_proj=c.feed_forward, tie_word_embeddings=c.tie_word_embeddings,
      dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
  torch.manual_seed(seed)
  model = transformers.T5ForConditionalGeneration(hc)
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "layer_norm" in name:
        p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
      elif "relative_attention_bias" in name:
        p.copy_(torch.randn(p.shape, generator=gen))
      elif name == "shared.weight":
        p.copy_(torch.randn(p.shape, generator=gen))
      else:  # Linear [out, in].
        p.copy_(torch.randn(p.shape, generator=gen) * p.shape[1] ** -0.5)
    if not c.tie_word_embeddings:
      # transformers 5 ties T5's head to shared even for v1.1; untie it.
      model.lm_head.weight = torch.nn.Parameter(
          2.0 * torch.randn((c.vocab_size, c.d_model), generator=gen) * c.d_model ** -0.5)
  return model.eval()


def random_params(model, seed: int, residual_scale: float = 1.0, head_scale: float = 1.0):
  """Random parameters for a specjax T5 drawn with numpy (no compilation):
  N(0, 1) embedding and relative-bias tables, norm scales near 1, kernels
  N(0, 1/fan_in). Attention-output and feed-forward-output kernels are
  multiplied by `residual_scale` (small: the residual stream carries mostly
  the token embedding, so models sharing embedding and head agree often),
  the lm_head kernel by `head_scale`."""
  import jax

  shapes = _param_shapes(model)
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    names = [getattr(k, "key", "") for k in path]
    shape = leaf.shape
    if names[-1] == "scale":
      x = 1.0 + 0.1 * rng.standard_normal(shape)
    elif names[-1] in ("embedding", "relpos_bias"):
      x = rng.standard_normal(shape)
    else:
      fan_in = shape[0] * shape[1] if names[-2] == "o" else shape[0]
      x = rng.standard_normal(shape) * fan_in ** -0.5
      if names[-2] in ("o", "wo"):
        x = x * residual_scale
      if names[-2] == "lm_head":
        x = x * head_scale
    return np.asarray(x, np.float32)

  return jax.tree_util.tree_map_with_path(draw, shapes)


_SHAPES = {}


def _param_shapes(model):
  import jax

  if model not in _SHAPES:
    _SHAPES[model] = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  return _SHAPES[model]


# Jitted protocol calls shared by the tests (one compilation per config and shape).
def _prefill(model, params, inputs, lengths, cache):
  return model.prefill(params, inputs, lengths, cache)


def _extend_with_hidden(model, params, tokens, cache):
  return model.extend_with_hidden(params, tokens, cache)


def _jit():
  import jax
  return (jax.jit(_prefill, static_argnums=0), jax.jit(_extend_with_hidden, static_argnums=0))


prefill, extend_with_hidden = _jit()

# Standard test shapes (shared compilations): B rows, P encoder width,
# T decoder inputs for the full forward, S decoder slots.
B, P, T, S = 4, 9, 14, 20
ROW_LENGTHS = (9, 4, 1, 6)


# --- the greedy target / draft pair shared by test_t5 and test_t5_hf ----------

SPEC_N = 24  # max_new_tokens of the greedy generation tests.


def _spec_setup():
  import types

  import specjax
  from specjax.models.t5 import T5

  target = T5(tiny_config("1.1"))
  draft = T5(tiny_config("1.0", num_heads=2, d_ff=32, num_layers=1, num_decoder_layers=1,
                         tie_word_embeddings=False))
  # Small residual branches and a shared embedding and head: the models agree
  # often but not always (acceptance strictly between 0 and 1).
  tp = random_params(target, 10, residual_scale=0.15)
  dp = random_params(draft, 11, residual_scale=0.15)
  dp = dict(dp, shared=tp["shared"], lm_head=tp["lm_head"])
  inputs, lengths = ragged_inputs(np.random.default_rng(12), [11, 3, 7, 1, 9, 5, 11, 2, 6, 4],
                                  11, target.vocab_size)
  free = specjax.generate(target, tp, inputs, lengths, max_new_tokens=SPEC_N,
                          sampling=specjax.SamplingConfig(temperature=0.0))
  free_tokens = np.asarray(free.tokens)
  eos = pick_eos(free_tokens, skip=(0,))
  # Greedy decoding with EOS is the free run cut after the first EOS.
  hit = free_tokens == eos
  lengths_out = np.where(hit.any(1), np.argmax(hit, 1) + 1, SPEC_N)
  tokens_out = np.where(np.arange(SPEC_N)[None] < lengths_out[:, None], free_tokens, 0)
  return types.SimpleNamespace(
      target=target, tp=tp, draft=draft, dp=dp, inputs=inputs, lengths=lengths, eos=eos,
      free_tokens=free_tokens, greedy_tokens=tokens_out, greedy_lengths=lengths_out,
      by_eos=hit.any(1))


_SPEC = []


def spec_setup():
  """Target (tiny v1.1) and draft (1-layer v1.0, untied) T5 with their params,
  10 ragged prompts, a rigged EOS and the target's greedy output (cached)."""
  if not _SPEC:
    _SPEC.append(_spec_setup())
  return _SPEC[0]
