"""Loading from where checkpoints live: transformers-format directories (a Llama-style decoder,
sharded; T5; a PyTorch pickle), tokenizers (tokenizer.json with its side files, SentencePiece),
orbax params and a draft head, all from `gs://` (served from memory: tests/memgcs.py for fsspec,
tests/memgcs_http.py for orbax's tensorstore) and equal to the local loads, bit for bit; the
bytes a gs:// import reads; a PyTorch pickle without torch named with its extra.

Random-init tiny models, never a hub download."""

import json
import os
import struct
import sys

import jax
import numpy as np
import pytest
from etils import epath

from specjax.checkpoints import (export_hf_decoder, export_hf_t5, import_hf_decoder,
                                 import_hf_t5, restore_params, save_params, streaming)
from specjax.checkpoints.hf_common import load_state_dict, save_safetensors
from specjax.checkpoints.heads import load_eagle_head, read_agreement
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.models.eagle_head import EagleConfig, init_eagle
from specjax.models.t5 import T5
from specjax.models.t5_config import t5_config
from specjax.tokenizers import HFTokenizer, SentencePieceTokenizer, load_tokenizer
from specjax.tokenizers.hf import check_tokenizers_compatible

from memgcs import MemGCS, objects
from memgcs_http import memgcs, memgcs_http  # noqa: F401  (the gs:// fixtures)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "data")


def _upload(local_dir, url: str) -> None:
  """Copies every file under `local_dir` to `url` (the same relative names)."""
  for base, _, files in os.walk(local_dir):
    for name in files:
      rel = os.path.relpath(os.path.join(base, name), local_dir)
      with open(os.path.join(base, name), "rb") as f:
        (epath.Path(url) / rel).write_bytes(f.read())


def _random_params(model, seed: int):
  """Random float32 params of `model`'s layout (shapes from `jax.eval_shape` of its init, values
  drawn with numpy: the eager init costs seconds on 8 host devices)."""
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(seed))
  return jax.tree_util.tree_map(
      lambda s: (0.1 * rng.standard_normal(s.shape)).astype(s.dtype), shapes)


def _assert_same_tree(a, b) -> None:
  """Same structure, dtypes, shapes and values."""
  flat_a, tree_a = jax.tree_util.tree_flatten(a)
  flat_b, tree_b = jax.tree_util.tree_flatten(b)
  assert tree_a == tree_b
  for x, y in zip(flat_a, flat_b):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(x, y)


class _CountingFile:
  """A file object that records the size of every read."""

  def __init__(self, f, log: list, path: str):
    self._f, self._log, self._path = f, log, path

  def read(self, n=-1):
    data = self._f.read(n)
    self._log.append((self._path, len(data)))
    return data

  def __getattr__(self, name):
    return getattr(self._f, name)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._f.close()


class _Init:
  """A model-like holder of an init function (for `_random_params`)."""

  def __init__(self, init):
    self.init = init


@pytest.fixture
def reads(monkeypatch):
  """[(object, bytes)] of every read of a gs:// file opened for reading during the test."""
  log = []
  opened = MemGCS._open

  def counting_open(self, path, mode="rb", *args, **kwargs):
    f = opened(self, path, mode, *args, **kwargs)
    return _CountingFile(f, log, path) if "r" in mode else f
  monkeypatch.setattr(MemGCS, "_open", counting_open)
  return log


# --------------------------------------------------------------------------- transformers format


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
  """(directory, params, config): a random-init Llama-style decoder exported, then split into two
  safetensors shards with an index (as `save_pretrained(max_shard_size=...)` writes)."""
  config = decoder_config("tiny", qkv_bias=True)  # Qwen2-style biases: one more tensor kind
  params = _random_params(DecoderLM(config), 0)
  directory = tmp_path_factory.mktemp("llama")
  export_hf_decoder(params, config, str(directory), model_type="qwen2")
  tensors = load_state_dict(str(directory))
  os.remove(directory / "model.safetensors")
  names = sorted(tensors)
  weight_map = {}
  for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
    shard = f"model-0000{i + 1}-of-00002.safetensors"
    save_safetensors({n: tensors[n] for n in part}, str(directory / shard))
    weight_map.update({n: shard for n in part})
  (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  return str(directory), params, config


def test_sharded_decoder_from_gs_equals_local_and_reads_each_byte_once(memgcs, llama, reads,
                                                                       monkeypatch):
  directory, params, config = llama
  url = "gs://bucket/models/qwen-tiny"
  _upload(directory, url)
  local, local_config = import_hf_decoder(directory)
  remote, remote_config = import_hf_decoder(url)
  assert remote_config == local_config
  _assert_same_tree(remote, local)
  _assert_same_tree(local, params)
  # Headers and tensors, each byte of every shard read once (no whole-file copy, no re-read).
  for shard in sorted(set(json.loads(open(os.path.join(
      directory, "model.safetensors.index.json")).read())["weight_map"].values())):
    key = f"bucket/models/qwen-tiny/{shard}"
    assert sum(n for p, n in reads if p == key) == MemGCS.store[key].getbuffer().nbytes
  # In pieces of REMOTE_CHUNK_BYTES at most, with the same result.
  reads.clear()
  monkeypatch.setattr(streaming, "REMOTE_CHUNK_BYTES", 1000)
  _assert_same_tree(import_hf_decoder(url, dtype="bfloat16")[0],
                    import_hf_decoder(directory, dtype="bfloat16")[0])
  for path, n in reads:  # tensor reads of 1000 bytes at most (a header is read whole)
    if path.endswith(".safetensors"):
      header = struct.unpack("<Q", MemGCS.store[path].getbuffer()[:8])[0]
      assert n <= 1000 or n == header, (path, n)
  # The file, the index, an export straight to gs://, and names of what is missing.
  _assert_same_tree(import_hf_decoder(f"{url}/model.safetensors.index.json")[0], local)
  export_hf_decoder(params, config, "gs://bucket/exported", model_type="qwen2")
  _assert_same_tree(import_hf_decoder("gs://bucket/exported")[0], local)
  with pytest.raises(FileNotFoundError, match="gs://bucket/nothing"):
    import_hf_decoder("gs://bucket/nothing/model.safetensors")
  epath.Path("gs://bucket/empty/README").write_text("no weights")
  with pytest.raises(FileNotFoundError, match="gs://bucket/empty holds no model.safetensors"):
    streaming.open_tensors("gs://bucket/empty")


def test_t5_from_gs_equals_local(memgcs, tmp_path):
  config = t5_config("t5-v1_1-tiny")
  params = _random_params(T5(config), 1)
  export_hf_t5(params, config, str(tmp_path))
  _upload(tmp_path, "gs://bucket/t5")
  local, local_config = import_hf_t5(str(tmp_path))
  remote, remote_config = import_hf_t5("gs://bucket/t5")
  assert remote_config == local_config
  _assert_same_tree(remote, local)
  _assert_same_tree(local, params)


def test_pytorch_pickle_from_gs_equals_local(memgcs, llama, tmp_path):
  torch = pytest.importorskip("torch")
  directory, _, _ = llama
  tensors = load_state_dict(directory)
  torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, tmp_path / "pytorch_model.bin")
  (tmp_path / "config.json").write_bytes(open(os.path.join(directory, "config.json"), "rb").read())
  _upload(tmp_path, "gs://bucket/bin")
  _assert_same_tree(import_hf_decoder("gs://bucket/bin")[0], import_hf_decoder(directory)[0])


def test_pytorch_pickle_without_torch_names_the_extra_and_the_file(tmp_path, monkeypatch):
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 8,
                                                    "hidden_size": 8, "num_hidden_layers": 1,
                                                    "num_attention_heads": 2,
                                                    "intermediate_size": 16}))
  (tmp_path / "pytorch_model.bin").write_bytes(b"never unpickled")
  monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails as when not installed
  for load in (streaming.open_tensors, load_state_dict, import_hf_decoder, import_hf_t5):
    with pytest.raises(streaming.MissingTorchError) as info:
      load(str(tmp_path))
    message = str(info.value)
    assert 'pip install "specjax[torch]"' in message, message
    assert str(tmp_path / "pytorch_model.bin") in message, message
    assert isinstance(info.value, ImportError) and info.value.name == "torch"


# --------------------------------------------------------------------------- tokenizers


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory):
  """(hf directory, sentencepiece directory): a word-level tokenizer.json with an instruct
  checkpoint's side files, and a trained spiece.model."""
  tokenizers = pytest.importorskip("tokenizers")
  import sentencepiece as spm
  from tokenizers import models, pre_tokenizers
  words = ["<unk>", "<s>", "</s>", "<|eot|>", "the", "cat", "sleeps", "user", "assistant", ":"]
  tok = tokenizers.Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)},
                                              unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.add_special_tokens(["<s>", "</s>", "<|eot|>"])
  hf = tmp_path_factory.mktemp("hf_tok")
  tok.save(str(hf / "tokenizer.json"))
  (hf / "tokenizer_config.json").write_text(json.dumps({
      "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
      "chat_template": "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} <|eot|> "
                       "{% endfor %}"}))
  (hf / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 2]}))
  sp = tmp_path_factory.mktemp("sp_tok")
  spm.SentencePieceTrainer.train(
      input=os.path.join(FIXTURES, "tokenizer_corpus.txt"), model_prefix=str(sp / "spiece"),
      vocab_size=100, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, num_threads=1, minloglevel=2)
  os.remove(sp / "spiece.vocab")
  return str(hf), str(sp)


def test_tokenizers_from_gs_equal_local(memgcs, tokenizer_dirs):
  hf_dir, sp_dir = tokenizer_dirs
  _upload(hf_dir, "gs://bucket/tok/hf")
  _upload(sp_dir, "gs://bucket/tok/sp")
  local, remote = HFTokenizer(hf_dir), load_tokenizer("gs://bucket/tok/hf")
  assert isinstance(remote, HFTokenizer) and remote.path == "gs://bucket/tok/hf/tokenizer.json"
  assert remote.tokens() == local.tokens()
  assert (remote.bos_id, remote.eos_id, remote.pad_id, remote.eos_ids, remote.add_bos_by_default) \
      == (local.bos_id, local.eos_id, local.pad_id, local.eos_ids, local.add_bos_by_default) \
      == (1, 2, 2, (3, 2), True)
  assert remote.chat_template == local.chat_template
  messages = [{"role": "user", "content": "the cat"}]
  assert remote.apply_chat_template(messages) == local.apply_chat_template(messages)
  assert remote.encode("the cat sleeps") == local.encode("the cat sleeps") == [1, 4, 5, 6, 2]
  check_tokenizers_compatible(remote, hf_dir)
  sp_local = SentencePieceTokenizer(os.path.join(sp_dir, "spiece.model"))
  sp_remote = load_tokenizer("gs://bucket/tok/sp")
  assert isinstance(sp_remote, SentencePieceTokenizer)
  assert sp_remote.path == "gs://bucket/tok/sp/spiece.model"
  text = "The cat sleeps on the sofa."
  assert sp_remote.encode(text) == sp_local.encode(text)
  assert sp_remote.vocab_size == sp_local.vocab_size
  with pytest.raises(FileNotFoundError, match="no tokenizer in directory gs://bucket/tok"):
    load_tokenizer("gs://bucket/tok")
  with pytest.raises(FileNotFoundError, match="gs://bucket/none/tokenizer.json"):
    HFTokenizer("gs://bucket/none/tokenizer.json")


# --------------------------------------------------------------------------- orbax and heads


def test_orbax_params_and_a_head_from_gs_equal_local(memgcs_http, tmp_path):
  config = decoder_config("tiny", num_layers=1)
  params = _random_params(DecoderLM(config), 2)
  save_params(str(tmp_path / "model"), params, config)
  save_params("gs://bucket/run/model", params, config)
  local, local_config = restore_params(str(tmp_path / "model"), config)
  remote, remote_config = restore_params("gs://bucket/run/model", config)
  assert remote_config == local_config == config
  _assert_same_tree(remote, local)
  _assert_same_tree(remote, params)
  # A draft head as experiments/train_drafter.py leaves it: <dir>/final with its agreement.
  head_config = EagleConfig(d_model=32, vocab_size=64, num_heads=4, mlp_dim=64)
  head = _random_params(_Init(lambda key: init_eagle(head_config, key)), 3)
  for root in (str(tmp_path / "eagle"), "gs://bucket/run/eagle"):
    save_params(f"{root}/final", head, head_config)
    epath.Path(f"{root}/final/agreement.json").write_text(
        json.dumps({"agreement_by_step": [0.5, 0.25]}))
  local_head = load_eagle_head(str(tmp_path / "eagle"))
  remote_head = load_eagle_head("gs://bucket/run/eagle")
  assert remote_head[0] == local_head[0] == head_config
  _assert_same_tree(remote_head[1], local_head[1])
  _assert_same_tree(remote_head[1], head)
  assert read_agreement("gs://bucket/run/eagle") == (0.5, 0.25)
  assert "gs://bucket/run/eagle/final/config.json" in objects()
