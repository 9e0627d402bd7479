"""Streamed, sharded loading of transformers-format checkpoints (8 CPU devices).

Sharded safetensors (with their index) in bfloat16, read tensor by tensor
from memory maps and placed directly into `NamedSharding`s: equal to the
unsharded import, each device asked only for its own slice; T5 alike;
damaged files named.
"""

import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers

from specjax import DecoderLM, T5
from specjax.checkpoints import streaming
from specjax.checkpoints.hf_llama import import_hf_decoder
from specjax.checkpoints.hf_t5 import import_hf_t5
from specjax.parallel.sharding import MODEL, make_mesh


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
  """A tiny Llama saved in bfloat16 as several safetensors shards + index."""
  config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=2, num_attention_heads=8,
                                    num_key_value_heads=4, max_position_embeddings=64)
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(config).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(0.1 * torch.randn(p.shape))
  model = model.to(torch.bfloat16)
  directory = tmp_path_factory.mktemp("llama_bf16")
  model.save_pretrained(directory, max_shard_size="20KB")
  return str(directory), model


def test_sharded_bf16_index_is_read_and_placed_on_the_mesh(llama_dir):
  directory, model = llama_dir
  index = os.path.join(directory, "model.safetensors.index.json")
  with open(index) as f:
    shards = set(json.load(f)["weight_map"].values())
  assert len(shards) > 2                      # really sharded on disk
  tensors = streaming.open_tensors(directory)
  assert tensors["model.embed_tokens.weight"].dtype == ml_dtypes.bfloat16
  mesh = make_mesh(data=2, model=4)
  sharded, config = import_hf_decoder(directory, mesh=mesh, dtype="bfloat16")
  plain, _ = import_hf_decoder(directory, dtype="bfloat16")
  assert config.param_dtype == "bfloat16"
  q = sharded["layer_0"]["q"]["kernel"]
  assert q.dtype == jnp.bfloat16 and q.sharding.spec[1] == MODEL
  assert sharded["layer_1"]["down"]["kernel"].sharding.spec[0] == MODEL
  assert len(q.addressable_shards) == 8 and q.addressable_shards[0].data.shape == (64, 2, 8)
  for a, b in zip(jax.tree_util.tree_leaves(sharded), jax.tree_util.tree_leaves(plain)):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
  # bf16 on disk → bf16 params: the same bits as torch's weights.
  want = model.model.layers[0].mlp.up_proj.weight.detach().float().numpy().T
  np.testing.assert_array_equal(np.asarray(plain["layer_0"]["up"]["kernel"], np.float32), want)
  # And the model runs on the mesh with the same logits as on one device.
  lm = DecoderLM(config.replace(dtype="bfloat16"))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 128, (2, 9)), jnp.int32)
  np.testing.assert_allclose(np.asarray(lm.forward(sharded, tokens)),
                             np.asarray(lm.forward(plain, tokens)), atol=5e-2)


class _Recorder:
  """Stands in for a stored tensor's view: records every slice asked for."""

  def __init__(self, array):
    self.array, self.asked = array, []
    self.shape, self.dtype = array.shape, array.dtype

  def __getitem__(self, index):
    self.asked.append(index)
    return self.array[index]


def test_each_device_reads_only_its_slice():
  mesh = make_mesh(data=2, model=4)
  kernel = np.arange(16 * 8 * 4, dtype=np.float32).reshape(16, 8, 4)   # [E, H, D]
  recorder = _Recorder(kernel)
  tensors = streaming.lazy_from_mapping({"w": kernel})
  entry = streaming.Entry("w", ("layer_0", "q", "kernel"), lambda _: recorder)
  from specjax.parallel.sharding import param_spec
  params = streaming.place(
      [entry], tensors, "float32",
      lambda path, shape: jax.sharding.NamedSharding(mesh, param_spec(path, shape, mesh)))
  placed = params["layer_0"]["q"]["kernel"]
  np.testing.assert_array_equal(np.asarray(placed), kernel)
  assert recorder.asked, "no slice was read"
  for index in recorder.asked:          # a quarter of the heads, never the whole tensor
    assert kernel[index].shape == (16, 2, 4)


def test_damaged_safetensors_are_named(tmp_path, llama_dir):
  directory, _ = llama_dir
  index = os.path.join(directory, "model.safetensors.index.json")
  with open(index) as f:
    first = sorted(set(json.load(f)["weight_map"].values()))[0]
  with open(os.path.join(directory, first), "rb") as f:
    data = f.read()
  bad = tmp_path / "model.safetensors"
  bad.write_bytes(data[: len(data) - 100])
  with pytest.raises(ValueError, match=r"model\.safetensors is truncated"):
    streaming.open_tensors(str(bad))
  bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
  with pytest.raises(ValueError, match="unreadable header"):
    streaming.open_tensors(str(bad))
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="holds no model.safetensors"):
    streaming.open_tensors(str(tmp_path / "empty"))


def test_missing_shard_is_named(tmp_path):
  (tmp_path / "model.safetensors.index.json").write_text(
      json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}))
  with pytest.raises(FileNotFoundError, match="names shards that do not exist"):
    streaming.open_tensors(str(tmp_path))


def test_t5_sharded_import_equals_unsharded(tmp_path):
  config = transformers.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                 num_decoder_layers=2, num_heads=4,
                                 feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                 decoder_start_token_id=0)
  torch.manual_seed(1)
  model = transformers.T5ForConditionalGeneration(config).eval()
  model.save_pretrained(tmp_path, max_shard_size="40KB")
  assert (tmp_path / "model.safetensors.index.json").exists()
  mesh = make_mesh(data=2, model=4)
  sharded, cfg = import_hf_t5(str(tmp_path), mesh=mesh)
  plain, _ = import_hf_t5(str(tmp_path))
  leaf = sharded["encoder"]["layers_0"]["attn"]["q"]["kernel"]
  assert leaf.sharding.spec[1] == MODEL
  for a, b in zip(jax.tree_util.tree_leaves(sharded), jax.tree_util.tree_leaves(plain)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert isinstance(T5(cfg), T5)
