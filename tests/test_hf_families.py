"""Today's decoder checkpoints against transformers on random-init tiny configs.

Llama 3.x (rope "llama3", tied embeddings), Llama with linear and yarn
rotary scaling, Mistral (sliding window), Qwen2 (q/k/v biases; tied and
untied), Qwen3 (q/k norms; head_dim != hidden / heads): float32 logit parity
<= 1e-4 on sequences longer than `original_max_position_embeddings` (and
than the sliding window), through the full forward and the cached
prefill + extend path; the export round trip; a same-family draft / target
pair whose greedy speculative output equals transformers' greedy `generate`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from specjax import GREEDY, DecoderLM, generate, speculative_generate
from specjax.checkpoints.hf_llama import (decoder_config_from_hf, export_hf_decoder,
                                          hf_config_from_decoder, import_hf_decoder)

SEQ = 40          # longer than ORIGINAL (rotary scaling matters) and than WINDOW
ORIGINAL = 16
WINDOW = 7

_BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-6, attn_implementation="eager")

FAMILIES = {
    "llama3_tied": (transformers.LlamaConfig, dict(
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": ORIGINAL})),
    "llama_linear": (transformers.LlamaConfig, dict(
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})),
    "llama_yarn": (transformers.LlamaConfig, dict(
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": ORIGINAL})),
    "mistral": (transformers.MistralConfig, dict(sliding_window=WINDOW, head_dim=16)),
    "qwen2_tied": (transformers.Qwen2Config, dict(tie_word_embeddings=True)),
    "qwen2_untied": (transformers.Qwen2Config, dict(tie_word_embeddings=False)),
    "qwen3": (transformers.Qwen3Config, dict(head_dim=24, tie_word_embeddings=True)),
}


def _randomize(model: torch.nn.Module, seed: int, std: float = 0.08) -> None:
  """Every parameter random (biases and norm scales included, so that each
  of them matters for parity)."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
      else:
        p.copy_(std * torch.randn(p.shape, generator=gen))


def hf_model(family: str, seed: int = 0, std: float = 0.08, **changes):
  cls, extra = FAMILIES[family]
  config = cls(**{**_BASE, **extra, **changes})
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config).eval()
  _randomize(model, seed, std)
  if config.tie_word_embeddings:
    model.tie_weights()
  return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """family → (directory, transformers model), written once for the module."""
  out = {}
  for i, family in enumerate(FAMILIES):
    model = hf_model(family, seed=i)
    directory = tmp_path_factory.mktemp(family)
    model.save_pretrained(directory)
    out[family] = (str(directory), model)
  return out


def _tokens(batch=2, seq=SEQ, seed=0):
  return np.random.default_rng(seed).integers(0, _BASE["vocab_size"], (batch, seq))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logit_parity_full_and_cached(saved, family):
  directory, model = saved[family]
  params, config = import_hf_decoder(directory)
  if family == "mistral":
    assert config.sliding_window == WINDOW
  if family.startswith("qwen2"):
    assert config.qkv_bias and "bias" in params["layer_0"]["q"]
  if family == "qwen3":
    assert config.qk_norm and config.head_dim == 24 and "q_norm" in params["layer_1"]
  if family.startswith("llama"):
    assert config.rope_scaling is not None
  lm = DecoderLM(config)
  tokens = _tokens()
  with torch.no_grad():
    want = model(torch.as_tensor(tokens)).logits.numpy()
  got = np.asarray(lm.forward(params, jnp.asarray(tokens, jnp.int32)))
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
  # The cached path: a prefill of 12, then calls of 1, 5 and the rest.
  cache = lm.init_cache(2, SEQ)
  logits, _, cache = lm.prefill(params, jnp.asarray(tokens[:, :12], jnp.int32),
                                jnp.array([12, 12]), cache)
  np.testing.assert_allclose(np.asarray(logits), want[:, 11], atol=1e-4, rtol=0)
  at = 12
  for n in (1, 5, SEQ - 18):
    logits, cache = lm.extend(params, jnp.asarray(tokens[:, at:at + n], jnp.int32), cache)
    np.testing.assert_allclose(np.asarray(logits), want[:, at:at + n], atol=1e-4, rtol=0)
    at += n


@pytest.mark.parametrize("family", ["llama3_tied", "mistral", "qwen2_untied", "qwen3"])
def test_export_round_trip_loads_in_transformers(saved, family, tmp_path):
  directory, model = saved[family]
  params, config = import_hf_decoder(directory)
  export_hf_decoder(params, config, str(tmp_path))
  back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  assert type(back) is type(model)
  tokens = torch.as_tensor(_tokens(seed=1))
  with torch.no_grad():
    np.testing.assert_allclose(back(tokens).logits.numpy(), model(tokens).logits.numpy(),
                               atol=1e-5, rtol=0)
  again, config2 = import_hf_decoder(str(tmp_path))
  assert config2 == config
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(again)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_config_round_trip_names_the_family():
  for family, (cls, extra) in FAMILIES.items():
    hf = cls(**{**_BASE, **extra}).to_dict()
    config = decoder_config_from_hf(hf)
    back = hf_config_from_decoder(config, max_position_embeddings=64)
    assert back["model_type"] == hf["model_type"], family
    assert decoder_config_from_hf(back) == config, family
    assert decoder_config_from_hf(cls(**back).to_dict()) == config, family


@pytest.mark.parametrize("changes, message", [
    (dict(model_type="qwen2", use_sliding_window=True, sliding_window=8,
          max_window_layers=1), "mix of sliding and full layers"),
    (dict(model_type="qwen3", attention_bias=True), "attention_bias"),
    (dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}),
     "rope_type 'dynamic'"),
])
def test_refused_features_are_named(changes, message):
  hf = {**_BASE, "model_type": "llama", **changes}
  with pytest.raises(ValueError, match=message):
    decoder_config_from_hf(hf)


def test_qwen_sliding_window_on_every_layer_is_read():
  hf = {**_BASE, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 8,
        "max_window_layers": 0}
  assert decoder_config_from_hf(hf).sliding_window == 8
  hf["use_sliding_window"] = False
  assert decoder_config_from_hf(hf).sliding_window is None


@pytest.mark.parametrize("family", ["llama3_tied", "qwen2_tied"])
def test_same_family_pair_greedy_equals_transformers_generate(family, tmp_path):
  """A 1-layer draft of the same family drafts for a 2-layer target: greedy
  speculative output == transformers' greedy generate on the target."""
  # Weights of std 0.3: greedy text that does not collapse into one repeated token.
  target_hf = hf_model(family, seed=10, std=0.3)
  draft_hf = hf_model(family, seed=11, std=0.3, num_hidden_layers=1)
  for name, m in (("target", target_hf), ("draft", draft_hf)):
    m.save_pretrained(tmp_path / name)
  tp, tc = import_hf_decoder(str(tmp_path / "target"))
  dp, dc = import_hf_decoder(str(tmp_path / "draft"))
  target, draft = DecoderLM(tc), DecoderLM(dc)
  prompts = _tokens(batch=2, seq=6, seed=3)
  lengths = np.array([6, 4])
  new = 24  # positions run past ORIGINAL: the scaled frequencies are used
  want = []
  for row, n in zip(prompts, lengths):
    with torch.no_grad():
      out = target_hf.generate(torch.as_tensor(row[None, :n]), max_new_tokens=new,
                               do_sample=False, eos_token_id=None, pad_token_id=0,
                               attention_mask=torch.ones(1, n, dtype=torch.long))
    want.append(out[0, n:].numpy())
    assert len(set(want[-1].tolist())) >= 8  # a real continuation, not one repeated token
  jp, jl = jnp.asarray(prompts, jnp.int32), jnp.asarray(lengths, jnp.int32)
  spec = speculative_generate(target, tp, draft, dp, jp, jl, max_new_tokens=new, gamma=3,
                              sampling=GREEDY, key=jax.random.PRNGKey(0))
  ar = generate(target, tp, jp, jl, max_new_tokens=new, sampling=GREEDY,
                key=jax.random.PRNGKey(0))
  for b in range(2):
    np.testing.assert_array_equal(np.asarray(spec.tokens)[b, :new], want[b])
    np.testing.assert_array_equal(np.asarray(ar.tokens)[b, :new], want[b])
