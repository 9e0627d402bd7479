"""T5 against transformers' T5ForConditionalGeneration (random tiny models, fp32,
offline): logits, checkpoint import/export, greedy and assisted generation."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5_helpers import (B, P, ROW_LENGTHS, S, SPEC_N, T, extend_with_hidden, hf_t5, prefill,
                        ragged_inputs, spec_setup, tiny_config)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specjax  # noqa: E402
from specjax import SamplingConfig  # noqa: E402
from specjax.checkpoints.hf_t5 import (  # noqa: E402
    export_hf_t5, hf_config_from_t5, hf_t5_shapes, import_hf_t5, t5_config_from_hf)
from specjax.models.t5 import T5, relative_position_bucket  # noqa: E402

GREEDY = SamplingConfig(temperature=0.0)
VERSIONS = ["1.0", "1.1"]


def _state(model):
  return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _import(model):
  params, cfg = import_hf_t5(model.state_dict(), t5_config_from_hf(model.config.to_dict()))
  return T5(cfg), params


def _hf_logits(model, inputs, lengths, dec):
  mask = (np.arange(inputs.shape[1])[None] < lengths[:, None]).astype(np.int64)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(inputs, dtype=torch.long),
                attention_mask=torch.tensor(mask), decoder_input_ids=torch.tensor(
                    dec, dtype=torch.long))
  return out.logits.numpy()


@pytest.fixture(scope="module", params=VERSIONS)
def pair(request):
  hf = hf_t5(request.param, seed=100 + VERSIONS.index(request.param))
  model, params = _import(hf)
  assert model.config == tiny_config(request.param)
  return request.param, hf, model, params


def test_relative_buckets_match_transformers():
  from transformers.models.t5.modeling_t5 import T5Attention
  rel = np.arange(-1500, 1501)
  for nb, md in [(32, 128), (8, 12), (16, 64), (4, 3), (64, 256)]:
    for bidirectional in (True, False):
      want = T5Attention._relative_position_bucket(torch.tensor(rel), bidirectional, nb, md)
      got = relative_position_bucket(jnp.asarray(rel), bidirectional, nb, md)
      np.testing.assert_array_equal(got, want.numpy(), err_msg=f"{nb} {md} {bidirectional}")


def test_logit_parity_forward_and_incremental(pair):
  version, hf, model, params = pair
  rng = np.random.default_rng(0)
  inputs, lengths = ragged_inputs(rng, ROW_LENGTHS, P, model.vocab_size)
  dec = rng.integers(2, model.vocab_size, (B, T)).astype(np.int32)
  dec[:, 0] = 0
  ref = _hf_logits(hf, inputs, lengths, dec)

  full = np.asarray(model.forward(params, inputs, lengths, dec))
  forward_diff = float(np.abs(full - ref).max())

  cache = model.init_cache(B, S, P)
  logits, _, cache = prefill(model, params, jnp.asarray(inputs), jnp.asarray(lengths), cache)
  steps = [np.asarray(logits)[:, None]]
  pos = 1
  for t in (3, 1, 3, 3, 3):
    logits, _, cache = extend_with_hidden(model, params, jnp.asarray(dec[:, pos:pos + t]), cache)
    steps.append(np.asarray(logits))
    pos += t
  assert pos == T
  incremental_diff = float(np.abs(np.concatenate(steps, 1) - ref).max())
  print(f"\nT5 v{version} max |logit diff| vs transformers: forward {forward_diff:.2e}, "
        f"incremental {incremental_diff:.2e} (logit scale {np.abs(ref).max():.1f})")
  assert forward_diff <= 1e-4 and incremental_diff <= 1e-4


def test_import_export_round_trip(pair, tmp_path):
  version, hf, model, params = pair
  export_hf_t5(params, model.config, tmp_path)
  again, cfg = import_hf_t5(tmp_path)  # Config read from the exported config.json.
  assert cfg == model.config
  assert jax.tree.structure(again) == jax.tree.structure(params)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               params, again)
  # Every exported tensor is bit-identical to transformers' own.
  from safetensors.numpy import load_file
  exported, original = load_file(str(tmp_path / "model.safetensors")), _state(hf)
  assert set(exported) == set(hf_t5_shapes(model.config))
  for name, value in exported.items():
    np.testing.assert_array_equal(value, original[name], err_msg=name)
  # transformers loads the folder offline and computes the same logits.
  reloaded = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
  assert reloaded.config.scale_decoder_outputs == (version == "1.0")
  rng = np.random.default_rng(1)
  inputs, lengths = ragged_inputs(rng, ROW_LENGTHS, P, model.vocab_size)
  dec = rng.integers(0, model.vocab_size, (B, T))
  np.testing.assert_array_equal(_hf_logits(reloaded, inputs, lengths, dec),
                                _hf_logits(hf, inputs, lengths, dec))
  config_json = json.loads((tmp_path / "config.json").read_text())
  assert config_json == hf_config_from_t5(model.config)
  assert config_json["feed_forward_proj"] == ("relu" if version == "1.0" else "gated-gelu")


def _hf_generate(model, inputs, lengths, n, eos, **kw):
  mask = (np.arange(inputs.shape[1])[None] < lengths[:, None]).astype(np.int64)
  with torch.no_grad():
    out = model.generate(input_ids=torch.tensor(inputs, dtype=torch.long),
                         attention_mask=torch.tensor(mask), do_sample=False, num_beams=1,
                         max_new_tokens=n, min_new_tokens=0, eos_token_id=eos, pad_token_id=0,
                         decoder_start_token_id=0, **kw)
  return out.numpy()[:, 1:]  # Drop the decoder start token.


def _cut(tokens_N, eos, n):
  """A generated row up to and including its first EOS (or all n tokens)."""
  tokens_N = list(np.asarray(tokens_N)[:n])
  return tokens_N[:tokens_N.index(eos) + 1] if eos in tokens_N else tokens_N


@pytest.fixture(scope="module")
def exported_pair(tmp_path_factory):
  """test_t5's greedy target / draft, exported and loaded by transformers."""
  st = spec_setup()
  hf = []
  for name, model, params in (("target", st.target, st.tp), ("draft", st.draft, st.dp)):
    folder = tmp_path_factory.mktemp(name)
    export_hf_t5(params, model.config, folder)
    hf.append(transformers.T5ForConditionalGeneration.from_pretrained(str(folder)).eval())
  return st, hf[0], hf[1]


def test_greedy_generate_matches_transformers(exported_pair):
  """Same weights, a batch of padded inputs, rows ending by EOS at different
  steps or by the length limit: specjax greedy == transformers greedy."""
  st, target_hf, _ = exported_pair
  ours = np.asarray(specjax.generate(st.target, st.tp, st.inputs, st.lengths,
                                     max_new_tokens=SPEC_N, sampling=GREEDY).tokens)
  theirs = _hf_generate(target_hf, st.inputs, st.lengths, SPEC_N, st.eos)
  for b in range(len(st.lengths)):
    assert _cut(ours[b], st.eos, SPEC_N) == _cut(theirs[b], st.eos, SPEC_N), f"row {b}"
  assert st.by_eos.any() and (~st.by_eos).any()


def test_assisted_generation_matches_speculative_greedy(exported_pair):
  """transformers' assisted generation (batch 1, one row at a time) on the
  exported weights gives specjax's speculative greedy tokens."""
  st, target_hf, draft_hf = exported_pair
  spec = specjax.speculative_generate(st.target, st.tp, st.draft, st.dp, st.inputs, st.lengths,
                                      max_new_tokens=SPEC_N, gamma=3, sampling=GREEDY,
                                      eos_id=st.eos)
  ours = np.asarray(spec.tokens)
  for b in range(len(st.lengths)):
    row, row_len = st.inputs[b:b + 1, :st.lengths[b]], st.lengths[b:b + 1]
    assisted = _hf_generate(target_hf, row, row_len, SPEC_N, st.eos,
                            assistant_model=draft_hf)[0]
    assert _cut(assisted, st.eos, SPEC_N) == list(ours[b, :spec.lengths[b]]), f"row {b}"


def test_assisted_generation_is_batch_one_only(exported_pair):
  """transformers 5 refuses batched assisted generation (specjax's reason to exist)."""
  _, target_hf, draft_hf = exported_pair
  inputs = np.full((2, 4), 5, np.int64)
  with pytest.raises(ValueError, match="batch_size = 1"):
    _hf_generate(target_hf, inputs, np.array([4, 4]), 4, 1, assistant_model=draft_hf)


# --- import errors ------------------------------------------------------------

@pytest.fixture(scope="module")
def v11_state():
  hf = hf_t5("1.1", seed=105)
  return _state(hf), t5_config_from_hf(hf.config.to_dict())


def test_import_missing_tensor(v11_state):
  state, cfg = v11_state
  name = "decoder.block.1.layer.1.EncDecAttention.k.weight"
  broken = {k: v for k, v in state.items() if k != name}
  with pytest.raises(ValueError, match="missing tensors: " + name.replace(".", r"\.")):
    import_hf_t5(broken, cfg)
  broken = {k: v for k, v in state.items() if k != "lm_head.weight"}
  with pytest.raises(ValueError, match=r"lm_head\.weight"):
    import_hf_t5(broken, cfg)


def test_import_unexpected_tensor(v11_state):
  state, cfg = v11_state
  name = "encoder.block.5.layer.0.layer_norm.weight"
  with pytest.raises(ValueError, match="unexpected tensors: " + name.replace(".", r"\.")):
    import_hf_t5({**state, name: np.ones(cfg.d_model, np.float32)}, cfg)
  # A v1.1 checkpoint is not a v1.0 one: the gated weights are unexpected.
  with pytest.raises(ValueError, match=r"wi_0\.weight"):
    import_hf_t5(state, cfg.replace(feed_forward="relu"))


def test_import_misshaped_tensor(v11_state):
  state, cfg = v11_state
  name = "encoder.block.1.layer.1.DenseReluDense.wo.weight"
  with pytest.raises(ValueError, match=name.replace(".", r"\.") + r": expected \(48, 80\)"):
    import_hf_t5({**state, name: state[name].T.copy()}, cfg)
  with pytest.raises(ValueError, match=r"relative_attention_bias"):
    import_hf_t5(state, cfg.replace(relative_attention_num_buckets=16))


def test_import_tied_copies(v11_state):
  state, cfg = v11_state
  # Copies of shared are accepted; a copy that differs is refused.
  import_hf_t5({**state, "decoder.embed_tokens.weight": state["shared.weight"]}, cfg)
  with pytest.raises(ValueError, match=r"encoder\.embed_tokens\.weight differs"):
    import_hf_t5({**state, "encoder.embed_tokens.weight": state["shared.weight"] + 1}, cfg)
  tied = cfg.replace(feed_forward="gated-gelu", tie_word_embeddings=True)
  with pytest.raises(ValueError, match=r"lm_head\.weight differs"):
    import_hf_t5(state, tied)
  params, _ = import_hf_t5({k: v for k, v in state.items() if k != "lm_head.weight"}, tied)
  assert "lm_head" not in params


def test_import_pytorch_bin(v11_state, tmp_path):
  state, cfg = v11_state
  torch.save({k: torch.tensor(v) for k, v in state.items()}, tmp_path / "pytorch_model.bin")
  (tmp_path / "config.json").write_text(json.dumps(hf_config_from_t5(cfg)))
  from_bin, got = import_hf_t5(tmp_path / "pytorch_model.bin")
  assert got == cfg
  from_dict, _ = import_hf_t5(state, cfg)
  jax.tree.map(np.testing.assert_array_equal, from_bin, from_dict)
  with pytest.raises(ValueError, match="config is required"):
    import_hf_t5(state)


def test_import_transformers_save_pretrained(tmp_path):
  """transformers 5 ties a fresh v1.1 model's head to shared and saves only
  shared.weight with tie_word_embeddings: true, scale_decoder_outputs: false."""
  hf = hf_t5("1.1", seed=106)
  hf.lm_head.weight = hf.shared.weight  # As transformers 5 builds it.
  hf.save_pretrained(str(tmp_path))
  params, cfg = import_hf_t5(tmp_path)
  assert not cfg.tie_word_embeddings and cfg.feed_forward == "gated-gelu"
  np.testing.assert_array_equal(params["lm_head"]["kernel"], params["shared"]["embedding"].T)
  rng = np.random.default_rng(2)
  inputs, lengths = ragged_inputs(rng, ROW_LENGTHS, P, cfg.vocab_size)
  dec = rng.integers(0, cfg.vocab_size, (B, T)).astype(np.int32)
  np.testing.assert_allclose(T5(cfg).forward(params, inputs, lengths, dec),
                             _hf_logits(hf, inputs, lengths, dec), atol=1e-4)


def test_config_from_transformers():
  for version in VERSIONS:
    hf = hf_t5(version, seed=107)
    assert t5_config_from_hf(hf.config.to_dict()) == tiny_config(version)
  with pytest.raises(ValueError, match="feed_forward_proj"):
    t5_config_from_hf({"feed_forward_proj": "gated-silu"})
  with pytest.raises(ValueError, match="model_type"):
    t5_config_from_hf({"model_type": "bart"})
  legacy = t5_config_from_hf({"tie_word_embeddings": False, "feed_forward_proj": "gated-gelu",
                              "eos_token_id": [1, 2], "decoder_start_token_id": None})
  assert not legacy.tie_word_embeddings and legacy.eos_id == 1 and legacy.decoder_start_id == 0
