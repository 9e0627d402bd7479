"""transformers Llama checkpoints ↔ specjax DecoderLM: logit and greedy parity
with `LlamaForCausalLM` (random tiny configs, never a hub), export/import
round trips, speculative decoding with real-format models, error messages."""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specjax  # noqa: E402
from specjax.checkpoints import hf_llama  # noqa: E402
from specjax.checkpoints.hf_common import load_state_dict  # noqa: E402
from specjax.checkpoints.hf_llama import (decoder_config_from_hf, export_hf_decoder,  # noqa: E402
                                          hf_config_from_decoder, import_hf_decoder)
from specjax.models.decoder import DecoderLM, decoder_config  # noqa: E402
from specjax.sampling import GREEDY  # noqa: E402

TOL = 1e-4
VOCAB = 96
PAD = 0

# Tiny Llama shapes: multi-head + untied; grouped-query (4 query heads on 1 kv
# head) + tied embeddings + head_dim != hidden / heads; and a smaller draft.
HF_SHAPES = {
    "mha": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, rope_theta=500.0, rms_norm_eps=1e-5),
    "gqa-tied": dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                     tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-6),
    "draft": dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, tie_word_embeddings=True),
}


def _hf_config(name):
  kw = dict(HF_SHAPES[name])
  rope_theta = kw.pop("rope_theta", 10000.0)
  return transformers.LlamaConfig(
      vocab_size=VOCAB, max_position_embeddings=128, initializer_range=0.1,
      rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
      pad_token_id=PAD, bos_token_id=None, eos_token_id=None, **kw)


@functools.lru_cache(maxsize=None)
def torch_model(name):
  """A random-init `LlamaForCausalLM` (fp32, eager attention, eval mode)."""
  torch.manual_seed(sorted(HF_SHAPES).index(name))
  config = _hf_config(name)
  config._attn_implementation = "eager"
  model = transformers.LlamaForCausalLM(config).eval()
  with torch.no_grad():  # norm weights start at 1: perturb them so a swapped norm shows
    for key, p in model.named_parameters():
      if key.endswith("norm.weight"):
        p.mul_(1.0 + 0.3 * torch.randn_like(p))
  return model


@functools.lru_cache(maxsize=None)
def imported(name):
  model = torch_model(name)
  params, config = import_hf_decoder(model.state_dict(),
                                     decoder_config_from_hf(model.config.to_dict()))
  return DecoderLM(config), params


_forward = jax.jit(lambda lm, params, toks: lm.forward(params, toks), static_argnums=0)


def _tokens(seed, shape=(3, 13)):
  return np.random.default_rng(seed).integers(1, VOCAB, size=shape).astype(np.int64)


def _torch_logits(model, toks):
  with torch.no_grad():
    return model(torch.as_tensor(toks)).logits.numpy()


def _max_diff(a, b):
  return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


# --------------------------------------------------------------------------- parity


@pytest.mark.parametrize("name", ["mha", "gqa-tied"])
def test_logit_parity_with_transformers(name):
  model = torch_model(name)
  lm, params = imported(name)
  assert lm.config.tie_embeddings == bool(model.config.tie_word_embeddings)
  assert lm.config.head_dim == model.config.head_dim
  toks = _tokens(0)
  ref = _torch_logits(model, toks)
  got = np.asarray(_forward(lm, params, jnp.asarray(toks, jnp.int32)))
  diff = _max_diff(got, ref)
  print(f"\n[{name}] specjax vs transformers logits: max abs diff {diff:.3g} "
        f"(logit scale {np.abs(ref).max():.3g})")
  assert np.abs(ref).max() > 0.5  # the comparison is not vacuous
  assert diff <= TOL


@pytest.mark.parametrize("name", ["mha", "gqa-tied"])
def test_export_loads_in_transformers_and_round_trips(name, tmp_path):
  model = torch_model(name)
  lm, params = imported(name)
  out = tmp_path / "exported"
  export_hf_decoder(params, lm.config, str(out))
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
  reloaded = transformers.LlamaForCausalLM.from_pretrained(
      str(out), local_files_only=True, attn_implementation="eager").eval()
  assert reloaded.dtype == torch.float32
  toks = _tokens(1)
  ref = _torch_logits(model, toks)
  np.testing.assert_array_equal(_torch_logits(reloaded, toks), ref)  # same weights exactly
  got = np.asarray(_forward(lm, params, jnp.asarray(toks, jnp.int32)))
  assert _max_diff(got, ref) <= TOL

  # The exported tensors are the original ones, bit for bit.
  written = load_state_dict(str(out))
  original = {k: v.numpy() for k, v in model.state_dict().items()}
  if lm.config.tie_embeddings:
    assert "lm_head.weight" not in written
    original.pop("lm_head.weight")
  assert sorted(written) == sorted(original)
  for key, value in original.items():
    np.testing.assert_array_equal(written[key], value, err_msg=key)

  # The packed decode layout: the same logits as transformers, the same tensors exported.
  packed = lm.pack_params(params)
  got = np.asarray(_forward(lm, packed, jnp.asarray(toks, jnp.int32)))
  assert _max_diff(got, ref) <= TOL
  export_hf_decoder(packed, lm.config, str(tmp_path / "from_packed"))
  from_packed = load_state_dict(str(tmp_path / "from_packed"))
  assert sorted(from_packed) == sorted(written)
  for key, value in written.items():
    np.testing.assert_array_equal(from_packed[key], value, err_msg=key)

  # import (config.json beside the weights) → export → import: bit-exact.
  params2, config2 = import_hf_decoder(str(out))
  assert config2 == lm.config
  export_hf_decoder(params2, config2, str(tmp_path / "again"))
  params3, config3 = import_hf_decoder(str(tmp_path / "again" / "model.safetensors"))
  assert config3 == lm.config
  for p in (params2, params3):
    assert jax.tree_util.tree_structure(p) == jax.tree_util.tree_structure(params)
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(p)):
      assert a.dtype == b.dtype
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_params_tree_matches_decoder_init():
  for name in ("mha", "gqa-tied"):
    lm, params = imported(name)
    shapes = jax.eval_shape(lm.init, jax.random.PRNGKey(0))
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(shapes)
    for a, s in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(shapes)):
      assert a.shape == s.shape and a.dtype == s.dtype


# Ragged batch of 8 over one padded prompt length (so `generate` compiles once
# for both the transformers comparison and the speculative comparison).
PROMPT_LEN, NEW = 6, 10


def test_greedy_generate_matches_transformers():
  model = torch_model("mha")
  lm, params = imported("mha")
  prompts = _tokens(2, (8, PROMPT_LEN))
  with torch.no_grad():
    ref = model.generate(torch.as_tensor(prompts), attention_mask=torch.ones(prompts.shape,
                                                                             dtype=torch.long),
                         max_new_tokens=NEW, do_sample=False, pad_token_id=PAD,
                         eos_token_id=None)
  ref = ref[:, PROMPT_LEN:].numpy()
  assert ref.shape == (8, NEW)
  out = specjax.generate(lm, params, jnp.asarray(prompts, jnp.int32), max_new_tokens=NEW,
                         sampling=GREEDY, pad_id=PAD)
  np.testing.assert_array_equal(np.asarray(out.tokens), ref)


def test_several_eos_ids_stop_where_transformers_stops():
  """An instruct checkpoint ends on any of several ids (generation_config's
  eos_token_id list): `eos_id=(a, b)` stops every row where transformers'
  `generate(eos_token_id=[a, b])` does, EOS included, pad after."""
  model = torch_model("mha")
  lm, params = imported("mha")
  prompts = _tokens(2, (8, PROMPT_LEN))
  free = np.asarray(specjax.generate(lm, params, jnp.asarray(prompts, jnp.int32),
                                     max_new_tokens=NEW, sampling=GREEDY, pad_id=PAD).tokens)
  eos = [int(free[0, 3]), int(free[1, 6])]  # tokens the rows do emit, at different places
  with torch.no_grad():
    ref = model.generate(torch.as_tensor(prompts), attention_mask=torch.ones(
        prompts.shape, dtype=torch.long), max_new_tokens=NEW, do_sample=False,
                         pad_token_id=PAD, eos_token_id=eos)
  ref = ref[:, PROMPT_LEN:].numpy()
  ref = np.pad(ref, ((0, 0), (0, NEW - ref.shape[1])), constant_values=PAD)
  out = specjax.generate(lm, params, jnp.asarray(prompts, jnp.int32), max_new_tokens=NEW,
                         sampling=GREEDY, pad_id=PAD, eos_id=eos)
  np.testing.assert_array_equal(np.asarray(out.tokens), ref)
  lengths = np.asarray(out.lengths)
  assert lengths[0] <= 4 and lengths[1] <= 7 and np.any(lengths < NEW)


def test_speculative_greedy_with_llama_format_draft(tmp_path):
  target, target_params = imported("mha")
  # The draft goes through a file: safetensors written by transformers itself.
  torch_model("draft").save_pretrained(str(tmp_path / "draft"))
  draft_params, draft_config = import_hf_decoder(str(tmp_path / "draft"))
  draft = DecoderLM(draft_config)
  assert draft_config.num_layers == 1 and draft_config.tie_embeddings

  rng = np.random.default_rng(3)
  lengths = rng.integers(1, PROMPT_LEN + 1, size=8).astype(np.int32)
  lengths[0] = PROMPT_LEN
  prompts = rng.integers(1, VOCAB, size=(8, PROMPT_LEN)).astype(np.int32)
  prompts[np.arange(PROMPT_LEN)[None] >= lengths[:, None]] = PAD
  prompts, lengths = jnp.asarray(prompts), jnp.asarray(lengths)

  ref = specjax.generate(target, target_params, prompts, lengths, max_new_tokens=NEW,
                         sampling=GREEDY, pad_id=PAD)
  out = specjax.speculative_generate(target, target_params, draft, draft_params, prompts, lengths,
                                     max_new_tokens=NEW, gamma=3, sampling=GREEDY, pad_id=PAD)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  np.testing.assert_array_equal(np.asarray(out.lengths), np.full(8, NEW))
  assert int(jnp.sum(out.stats.drafted)) > 0


# --------------------------------------------------------------------------- errors


def _state(name):
  return {k: v.clone() for k, v in torch_model(name).state_dict().items()}


def _config(name):
  return decoder_config_from_hf(torch_model(name).config.to_dict())


def test_missing_unexpected_misshaped_tensors_are_named():
  cfg = _config("mha")
  sd = _state("mha")
  del sd["model.layers.1.mlp.up_proj.weight"]
  with pytest.raises(ValueError, match=r"missing tensors: model\.layers\.1\.mlp\.up_proj\.weight"):
    import_hf_decoder(sd, cfg)

  sd = _state("mha")
  sd["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(32)
  with pytest.raises(ValueError, match=r"unexpected tensors: model\.layers\.0\.self_attn\.q_proj\.bias"):
    import_hf_decoder(sd, cfg)

  sd = _state("mha")
  sd["model.layers.0.mlp.down_proj.weight"] = sd["model.layers.0.mlp.down_proj.weight"].T
  with pytest.raises(ValueError, match=r"mis-shaped tensors: model\.layers\.0\.mlp\.down_proj\.weight: "
                                       r"expected \(32, 64\), got \(64, 32\)"):
    import_hf_decoder(sd, cfg)

  # An untied config needs lm_head.weight.
  sd = _state("mha")
  del sd["lm_head.weight"]
  with pytest.raises(ValueError, match=r"missing tensors: lm_head\.weight"):
    import_hf_decoder(sd, cfg)

  # A checkpoint of another size: every differing tensor is named.
  with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight"):
    import_hf_decoder(_state("mha"), cfg.replace(num_kv_heads=2))


def test_ignored_buffers_and_tied_lm_head():
  cfg = _config("gqa-tied")
  _, reference = imported("gqa-tied")
  sd = _state("gqa-tied")
  assert "lm_head.weight" in sd  # the tied copy, which may be present...
  sd["model.rotary_emb.inv_freq"] = torch.ones(8)  # ...and known buffers are dropped
  sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
  params, _ = import_hf_decoder(sd, cfg)
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(reference)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  del sd["lm_head.weight"]  # ...or absent
  import_hf_decoder(sd, cfg)
  sd["lm_head.weight"] = torch.zeros(VOCAB, 32)  # but not a different matrix
  with pytest.raises(ValueError, match="lm_head.weight differs"):
    import_hf_decoder(sd, cfg)
  assert all(isinstance(p, str) for p in hf_llama.IGNORED_BUFFERS)


def test_torch_bin_and_sharded_checkpoints_load(tmp_path):
  model = torch_model("mha")
  _, reference = imported("mha")
  folder = tmp_path / "bin"
  folder.mkdir()
  torch.save(model.state_dict(), str(folder / "pytorch_model.bin"))
  (folder / "config.json").write_text(model.config.to_json_string())
  for source in (str(folder / "pytorch_model.bin"), str(folder)):
    params, config = import_hf_decoder(source)
    assert config == imported("mha")[0].config
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(reference)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  model.save_pretrained(str(tmp_path / "sharded"), max_shard_size="20KB")
  assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
  params, _ = import_hf_decoder(str(tmp_path / "sharded"))
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(reference)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  with pytest.raises(FileNotFoundError, match="config.json"):
    import_hf_decoder(str(_no_config(tmp_path)))
  with pytest.raises(ValueError, match="config is required"):
    import_hf_decoder(model.state_dict())


def _no_config(tmp_path):
  folder = tmp_path / "no-config"
  folder.mkdir()
  torch.save(torch_model("draft").state_dict(), str(folder / "pytorch_model.bin"))
  return folder / "pytorch_model.bin"


# --------------------------------------------------------------------------- configs


_LLAMA = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=8, num_key_value_heads=2, rms_norm_eps=1e-5)


def test_config_from_hf_versions_and_defaults():
  cfg = decoder_config_from_hf({**_LLAMA, "model_type": "llama"})
  assert (cfg.vocab_size, cfg.d_model, cfg.mlp_dim, cfg.num_layers) == (100, 64, 128, 2)
  assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (8, 2, 8)
  assert cfg.rope_theta == 10000.0 and cfg.norm_eps == 1e-5 and not cfg.tie_embeddings
  # transformers < 5: rope_theta at the top level, rope_scaling null.
  old = {**_LLAMA, "rope_theta": 500000.0, "rope_scaling": None, "tie_word_embeddings": True}
  cfg = decoder_config_from_hf(old)
  assert cfg.rope_theta == 500000.0 and cfg.tie_embeddings
  # transformers >= 5: rope_parameters.
  new = {**_LLAMA, "rope_parameters": {"rope_type": "default", "rope_theta": 123.0}, "head_dim": 16}
  cfg = decoder_config_from_hf(new)
  assert cfg.rope_theta == 123.0 and cfg.head_dim == 16
  assert decoder_config_from_hf({**_LLAMA, "num_key_value_heads": None}).num_kv_heads == 8
  assert decoder_config_from_hf(_LLAMA, dtype="bfloat16").dtype == "bfloat16"
  # The real thing: a LlamaConfig's own dict.
  hf = transformers.LlamaConfig(**_LLAMA, rope_parameters={"rope_type": "default",
                                                            "rope_theta": 777.0})
  cfg = decoder_config_from_hf(hf.to_dict())
  assert cfg.rope_theta == 777.0 and cfg.num_kv_heads == 2
  # And back: hf_config_from_decoder is a LlamaConfig that maps to the same config.
  back = hf_config_from_decoder(cfg)
  assert back["architectures"] == ["LlamaForCausalLM"] and back["model_type"] == "llama"
  assert decoder_config_from_hf(back) == cfg
  assert decoder_config_from_hf(transformers.LlamaConfig(**back).to_dict()) == cfg
  json.dumps(back)


@pytest.mark.parametrize("changes, message", [
    (dict(attention_bias=True), "attention_bias"),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(rope_scaling={"type": "dynamic", "factor": 2.0}), "rope_type 'dynamic'"),
    (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0],
                           "long_factor": [2.0]}), "rope_type 'longrope'"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5}),
     "low_freq_factor"),
    (dict(rope_parameters={"rope_type": "su", "rope_theta": 1e4}), "rope_type 'su'"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                           "partial_rotary_factor": 0.5}), "partial_rotary_factor"),
    (dict(model_type="gemma"), "model_type"),
    (dict(hidden_size=60, num_attention_heads=8), "head_dim"),
    (dict(num_key_value_heads=3), "num_kv_heads"),
])
def test_unsupported_config_features(changes, message):
  with pytest.raises(ValueError, match=message):
    decoder_config_from_hf({**_LLAMA, **changes})


def test_config_type_errors_and_unexportable_configs(tmp_path):
  with pytest.raises(TypeError, match="hf_config"):
    decoder_config_from_hf("config.json")
  with pytest.raises(ValueError, match="vocab_size"):
    decoder_config_from_hf({k: v for k, v in _LLAMA.items() if k != "vocab_size"})
  odd = decoder_config("tiny", d_model=30, num_heads=4, num_kv_heads=2, head_dim=8)
  with pytest.raises(ValueError, match="multiple of num_heads"):
    hf_config_from_decoder(odd)
  # Params that do not fit the config are named on export.
  lm, params = imported("mha")
  bad = jax.tree_util.tree_map(lambda x: x, params)
  bad["layer_1"]["up"]["kernel"] = jnp.zeros((32, 65))
  with pytest.raises(ValueError, match=r"layer_1/up/kernel: expected \(32, 64\), got \(32, 65\)"):
    export_hf_decoder(bad, lm.config, str(tmp_path / "x"))
  assert not (tmp_path / "x" / "model.safetensors").exists()


def test_an_exported_file_names_a_flipped_byte(tmp_path):
  """specjax's exports carry their tensors' sha256 in the safetensors metadata: a byte changed
  in the data afterwards is named at import (an untouched export loads bit for bit)."""
  import struct  # pylint: disable=g-import-not-at-top
  lm, params = imported("mha")
  out = tmp_path / "exported"
  export_hf_decoder(params, lm.config, str(out))
  path = out / "model.safetensors"
  again, _ = import_hf_decoder(str(out))
  for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  raw = bytearray(path.read_bytes())
  (n,) = struct.unpack("<Q", bytes(raw[:8]))
  raw[8 + n + (len(raw) - 8 - n) // 2] ^= 0x40   # one bit of a tensor's data
  path.write_bytes(bytes(raw))
  with pytest.raises(ValueError, match=r"model\.safetensors is corrupt: its tensors' sha256"):
    import_hf_decoder(str(out))
