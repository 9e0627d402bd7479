"""Loaders refuse what they would misread, by name.

Tiny transformers-format checkpoints written here (random tensors from the importers' own shape
tables, no model init, no transformers) and a tiny orbax model directory: an integer or bool
tensor where a float weight is expected, unknown classes / architectures / model types, invalid
JSON, out-of-domain config values (rope_theta, eps, heads, sizes, flags), and model directories
without an integrity digest (a warning; strict=True refuses).
"""

import json
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specjax.checkpoints import CheckpointError, restore_params, save_params, streaming
from specjax.checkpoints.hf_common import save_safetensors
from specjax.checkpoints.hf_llama import (decoder_config_from_hf, hf_config_from_decoder,
                                          hf_llama_shapes, import_hf_decoder)
from specjax.checkpoints.hf_t5 import hf_config_from_t5, hf_t5_shapes, import_hf_t5
from specjax.checkpoints.integrity import MANIFEST, UnverifiedCheckpointWarning
from specjax.checkpoints.orbax_io import read_config
from specjax.models.decoder import DecoderConfig, decoder_config
from specjax.models.t5_config import T5Config

CONFIG = decoder_config("tiny", vocab_size=64, num_layers=1)
T5_CONFIG = T5Config(vocab_size=48, d_model=16, d_kv=4, num_heads=2, d_ff=24, num_layers=1,
                     relative_attention_num_buckets=8, relative_attention_max_distance=16)
TENSOR = "model.layers.0.mlp.up_proj.weight"


def _random(shapes, seed=0):
  rng = np.random.default_rng(seed)
  return {k: (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}


def _decoder_tensors():
  shapes = hf_llama_shapes(CONFIG)
  return _random({k: v for k, v in shapes.items()})


def _write_decoder(directory, tensors=None, hf_config=None, config_text=None):
  os.makedirs(directory, exist_ok=True)
  save_safetensors(_decoder_tensors() if tensors is None else tensors,
                   os.path.join(directory, "model.safetensors"))
  with open(os.path.join(directory, "config.json"), "w") as f:
    if config_text is not None:
      f.write(config_text)
    else:
      json.dump(hf_config_from_decoder(CONFIG) if hf_config is None else hf_config, f)
  return str(directory)


@pytest.fixture(scope="module")
def decoder_dir(tmp_path_factory):
  return _write_decoder(tmp_path_factory.mktemp("decoder"))


def test_the_written_checkpoint_imports(decoder_dir):
  params, config = import_hf_decoder(decoder_dir)
  assert config == CONFIG
  assert params["layer_0"]["up"]["kernel"].shape == (CONFIG.d_model, CONFIG.mlp_dim)


# --------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", ["int8", "int32", "uint8", "bool"])
def test_integer_or_bool_tensor_is_refused_by_file_tensor_and_dtype(tmp_path, dtype):
  tensors = _decoder_tensors()
  tensors[TENSOR] = (tensors[TENSOR] * 100).astype(dtype)
  directory = _write_decoder(tmp_path / "m", tensors)
  path = os.path.join(directory, "model.safetensors")
  with pytest.raises(ValueError) as err:
    import_hf_decoder(directory)
  message = str(err.value)
  assert path in message and TENSOR in message and np.dtype(dtype).name in message
  assert "float" in message and "float32" in message
  # The in-memory state dict is named as such; bfloat16 / float16 / float64 tensors still load.
  with pytest.raises(ValueError, match=f"state dict: tensor {TENSOR} is stored as"):
    import_hf_decoder(tensors, CONFIG)
  mixed = _decoder_tensors()
  mixed[TENSOR] = mixed[TENSOR].astype(np.float64)
  mixed["model.norm.weight"] = mixed["model.norm.weight"].astype(np.float16)
  import_hf_decoder(mixed, CONFIG, dtype="bfloat16")


def test_integer_tensor_in_a_shard_names_the_shard(tmp_path):
  tensors = _decoder_tensors()
  tensors[TENSOR] = tensors[TENSOR].astype(np.int16)
  names = sorted(tensors)
  first, second = names[: len(names) // 2], names[len(names) // 2:]
  os.makedirs(tmp_path / "m")
  save_safetensors({k: tensors[k] for k in first}, str(tmp_path / "m" / "a.safetensors"))
  save_safetensors({k: tensors[k] for k in second}, str(tmp_path / "m" / "b.safetensors"))
  weight_map = {k: "a.safetensors" if k in first else "b.safetensors" for k in names}
  with open(tmp_path / "m" / "model.safetensors.index.json", "w") as f:
    json.dump({"weight_map": weight_map}, f)
  shard = str(tmp_path / "m" / weight_map[TENSOR])
  with pytest.raises(ValueError, match=f"{shard}: tensor {TENSOR} is stored as int16"):
    import_hf_decoder(str(tmp_path / "m"), CONFIG)


def test_t5_integer_tensor_is_refused(tmp_path):
  tensors = _random(hf_t5_shapes(T5_CONFIG))
  name = "encoder.block.0.layer.0.SelfAttention.q.weight"
  tensors[name] = tensors[name].astype(np.int32)
  os.makedirs(tmp_path / "t5")
  save_safetensors(tensors, str(tmp_path / "t5" / "model.safetensors"))
  with open(tmp_path / "t5" / "config.json", "w") as f:
    json.dump(hf_config_from_t5(T5_CONFIG), f)
  with pytest.raises(ValueError, match=f"tensor {name} is stored as int32"):
    import_hf_t5(str(tmp_path / "t5"))
  # A tied copy stored as int8 is named, not reported as "differs from shared.weight".
  tensors = _random(hf_t5_shapes(T5_CONFIG))
  tensors["encoder.embed_tokens.weight"] = tensors["shared.weight"].astype(np.int8)
  with pytest.raises(ValueError, match="encoder.embed_tokens.weight is stored as int8"):
    import_hf_t5(tensors, T5_CONFIG)


def test_check_float_tensors_directly():
  lazy = streaming.lazy_from_mapping({"w": np.zeros(3, np.bool_), "x": np.zeros(2, np.float16)})
  streaming.check_float_tensors(lazy, ["x", "absent"], "float32")
  with pytest.raises(ValueError, match="state dict: tensor w is stored as bool"):
    streaming.check_float_tensors(lazy, ["w"], "float32")


# --------------------------------------------------------------------------- config.json


def _hf(**changes):
  hf = hf_config_from_decoder(CONFIG)
  for key, value in changes.items():
    if value is _DROP:
      hf.pop(key, None)
    else:
      hf[key] = value
  return hf


_DROP = object()


@pytest.mark.parametrize("changes, field, shown", [
    (dict(rope_theta=0.0, rope_parameters=None), "rope_theta", "0.0"),
    (dict(rope_theta=-10000.0, rope_parameters=None), "rope_theta", "-10000.0"),
    (dict(rope_theta=float("nan"), rope_parameters=None), "rope_theta", "nan"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": float("inf")}), "rope_theta",
     "inf"),
    (dict(rope_theta="1e4", rope_parameters=None), "rope_theta", "'1e4'"),
    (dict(rms_norm_eps=float("nan")), "rms_norm_eps", "nan"),
    (dict(rms_norm_eps=0.0), "rms_norm_eps", "0.0"),
    (dict(rms_norm_eps=-1e-6), "rms_norm_eps", "-1e-06"),
    (dict(hidden_size=0), "hidden_size", "0"),
    (dict(hidden_size=32.0), "hidden_size", "32.0"),
    (dict(vocab_size=-64), "vocab_size", "-64"),
    (dict(num_hidden_layers=True), "num_hidden_layers", "True"),
    (dict(intermediate_size="64"), "intermediate_size", "'64'"),
    (dict(num_attention_heads=0), "num_attention_heads", "0"),
    (dict(num_key_value_heads=3), "num_key_value_heads", "3"),
    (dict(head_dim=_DROP, hidden_size=30), "hidden_size", "30"),
    (dict(head_dim=7), "head_dim", "7"),
    (dict(tie_word_embeddings="false"), "tie_word_embeddings", "'false'"),
    (dict(architectures=["LlamaForSequenceClassification"]), "architectures",
     "LlamaForSequenceClassification"),
    (dict(architectures="LlamaForCausalLM"), "architectures", "LlamaForCausalLM"),
    (dict(model_type="gpt2"), "model_type", "gpt2"),
])
def test_out_of_domain_config_values_are_named_with_the_file(tmp_path, changes, field, shown):
  with pytest.raises(ValueError) as err:
    decoder_config_from_hf(_hf(**changes))
  assert field in str(err.value) and shown in str(err.value), str(err.value)
  directory = _write_decoder(tmp_path / "m", hf_config=_hf(**changes))
  with pytest.raises(ValueError) as err:
    import_hf_decoder(directory)
  message = str(err.value)
  assert message.startswith(os.path.join(directory, "config.json") + ":"), message
  assert field in message and shown in message
  assert isinstance(err.value.__cause__, ValueError)


def test_invalid_config_json_is_named_with_the_file(tmp_path):
  for text, what in (("{\"vocab_size\": 64,", "not valid JSON"), ("[1, 2]", "JSON object")):
    directory = _write_decoder(tmp_path / "m", config_text=text)
    with pytest.raises(ValueError, match=what) as err:
      import_hf_decoder(directory)
    assert os.path.join(directory, "config.json") in str(err.value)
  with open(os.path.join(directory, "config.json"), "wb") as f:
    f.write(b"\xff\xfe{}")  # not UTF-8
  with pytest.raises(ValueError, match="config.json is not valid JSON"):
    import_hf_decoder(directory)
  directory = _write_decoder(tmp_path / "j", config_text="{oops")
  with pytest.raises(ValueError) as err:
    import_hf_decoder(directory)
  assert isinstance(err.value.__cause__, json.JSONDecodeError)


def test_explicit_decoder_config_out_of_domain_is_refused(decoder_dir):
  for field, value in (("rope_theta", -1.0), ("norm_eps", float("nan")), ("rope_theta", 0.0)):
    # The config itself refuses it, before any loader sees it.
    with pytest.raises(ValueError, match=f"{field} must be a finite number > 0, got {value}"):
      CONFIG.replace(**{field: value})
    # One that got past its constructor (object.__setattr__) is still refused at load.
    bad = CONFIG.replace()
    object.__setattr__(bad, field, value)
    with pytest.raises(ValueError, match=f"{field} must be a finite number > 0, got {value}"):
      import_hf_decoder(decoder_dir, bad)


@pytest.mark.parametrize("changes, field", [
    (dict(layer_norm_epsilon=float("nan")), "layer_norm_epsilon"),
    (dict(layer_norm_epsilon=-1.0), "layer_norm_epsilon"),
    (dict(d_model=0), "d_model"),
    (dict(num_heads=2.5), "num_heads"),
    (dict(eos_token_id=[]), "eos_token_id"),
    (dict(pad_token_id=-1), "pad_token_id"),
    (dict(tie_word_embeddings=1, scale_decoder_outputs=None), "tie_word_embeddings"),
    (dict(architectures=["T5EncoderModel"]), "architectures"),
    (dict(model_type="bart"), "model_type"),
])
def test_t5_config_values_are_named_with_the_file(tmp_path, changes, field):
  tensors = _random(hf_t5_shapes(T5_CONFIG))
  os.makedirs(tmp_path / "t5")
  save_safetensors(tensors, str(tmp_path / "t5" / "model.safetensors"))
  hf = {**hf_config_from_t5(T5_CONFIG), **changes}
  with open(tmp_path / "t5" / "config.json", "w") as f:
    json.dump(hf, f)
  with pytest.raises(ValueError) as err:
    import_hf_t5(str(tmp_path / "t5"))
  assert str(err.value).startswith(str(tmp_path / "t5" / "config.json")) and field in str(
      err.value), str(err.value)
  with open(tmp_path / "t5" / "config.json", "w") as f:
    f.write("{]")
  with pytest.raises(ValueError, match="config.json is not valid JSON"):
    import_hf_t5(str(tmp_path / "t5"))


# --------------------------------------------------------------------------- orbax directories


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A saved model directory (tiny params; restore_params reads whatever tree was saved)."""
  directory = str(tmp_path_factory.mktemp("orbax") / "model")
  params = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(4, np.float32)}
  save_params(directory, params, CONFIG)
  return directory, params


def _copy(saved, tmp_path):
  import shutil
  directory, params = saved
  shutil.copytree(directory, tmp_path / "model")
  return str(tmp_path / "model"), params


def test_missing_integrity_file_warns_and_strict_refuses(saved, tmp_path):
  directory, params = _copy(saved, tmp_path)
  with _no_warning():
    restore_params(directory, strict=True)  # intact, with its manifest: silent
  os.remove(os.path.join(directory, MANIFEST))
  with pytest.warns(UnverifiedCheckpointWarning, match=f"{MANIFEST} is missing"):
    restored, config = restore_params(directory)
  np.testing.assert_array_equal(restored["w"], params["w"])
  with pytest.raises(CheckpointError, match=f"{MANIFEST} is missing") as err:
    restore_params(directory, strict=True)
  assert err.value.kind == "missing" and "strict=False" in str(err.value)
  with _no_warning():
    restore_params(directory, verify=False)  # the caller asked for no verification


def test_manifest_without_digest_warns(saved, tmp_path):
  directory, _ = _copy(saved, tmp_path)
  path = os.path.join(directory, MANIFEST)
  with open(path) as f:
    manifest = json.load(f)
  del manifest["params_sha256"]
  with open(path, "w") as f:
    json.dump(manifest, f)
  with pytest.warns(UnverifiedCheckpointWarning, match="no params_sha256"):
    restore_params(directory)
  with pytest.raises(CheckpointError, match="no params_sha256"):
    restore_params(directory, strict=True)


@pytest.mark.parametrize("cls, expected", [
    ("specjax.models.nothing_here.DecoderConfig", "no module specjax.models.nothing_here"),
    ("specjax.models.decoder.NoSuchConfig", "has no NoSuchConfig"),
    ("specjax.models.decoder.decoder_config", "not a config dataclass"),
    ("os.path.join", "not a specjax config"),
    (None, "must name its class"),
])
def test_unknown_config_class_is_named_with_the_file(saved, tmp_path, cls, expected):
  directory, _ = _copy(saved, tmp_path)
  path = os.path.join(directory, "config.json")
  with open(path) as f:
    stored = json.load(f)
  stored["class"] = cls
  with open(path, "w") as f:
    json.dump(stored, f)
  with pytest.raises(CheckpointError, match=expected) as err:
    read_config(directory)
  assert path in str(err.value) and err.value.kind == "unreadable"
  assert err.value.__cause__ is not None
  if "nothing_here" in expected:
    assert isinstance(err.value.__cause__.__cause__, ModuleNotFoundError)


@pytest.mark.parametrize("field, value", [("rope_theta", -1.0), ("rope_theta", 0.0),
                                          ("norm_eps", float("nan")), ("norm_eps", float("inf"))])
def test_stored_config_out_of_domain_is_refused(saved, tmp_path, field, value):
  directory, _ = _copy(saved, tmp_path)
  path = os.path.join(directory, "config.json")
  with open(path) as f:
    stored = json.load(f)
  stored["fields"][field] = value
  with open(path, "w") as f:
    json.dump(stored, f)
  with pytest.raises(CheckpointError, match=f"{field} must be a finite number > 0") as err:
    restore_params(directory)
  assert path in str(err.value) and (math.isnan(value) or repr(value) in str(err.value))


def test_invalid_stored_config_json_names_the_file(saved, tmp_path):
  directory, _ = _copy(saved, tmp_path)
  path = os.path.join(directory, "config.json")
  with open(path, "w") as f:
    f.write("{\"class\": ")
  with pytest.raises(CheckpointError, match="config.json cannot be read") as err:
    restore_params(directory)
  assert path in str(err.value) and isinstance(err.value.__cause__, json.JSONDecodeError)


class _no_warning:
  """Asserts that the block raises no UnverifiedCheckpointWarning."""

  def __enter__(self):
    import warnings
    self._catch = warnings.catch_warnings(record=True)
    self._seen = self._catch.__enter__()
    warnings.simplefilter("always")
    return self

  def __exit__(self, *exc):
    self._catch.__exit__(*exc)
    bad = [w for w in self._seen if issubclass(w.category, UnverifiedCheckpointWarning)]
    assert not bad, [str(w.message) for w in bad]
    return False


def test_decoder_config_is_still_built_for_valid_values():
  hf = _hf(rope_theta=500000, rope_parameters=None, rms_norm_eps=1e-5,
           tie_word_embeddings=None)
  config = decoder_config_from_hf(hf)
  assert isinstance(config, DecoderConfig) and config.rope_theta == 500000.0
  assert config.norm_eps == 1e-5 and config.tie_embeddings is False


_FIELD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70), st.integers(-2**70, 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
    st.lists(st.integers(0, 4), max_size=2), st.just({}))
_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "head_dim", "intermediate_size", "rope_theta",
           "rms_norm_eps", "tie_word_embeddings", "sliding_window", "architectures",
           "max_position_embeddings")


@settings(max_examples=50, deadline=None, derandomize=True)
@given(changes=st.dictionaries(st.sampled_from(_FIELDS), _FIELD_VALUES, min_size=1, max_size=2))
def test_decoder_config_from_hf_builds_or_names_the_field(changes):
  """Any values of a config.json's fields: a DecoderConfig whose numbers are in their domain, or
  a ValueError / TypeError naming one of the changed fields."""
  hf = {**hf_config_from_decoder(CONFIG), "rope_parameters": None, **changes}
  try:
    config = decoder_config_from_hf(hf)
  except (TypeError, ValueError) as e:
    assert any(field in str(e) for field in changes), (changes, str(e))
    return
  assert math.isfinite(config.rope_theta) and config.rope_theta > 0
  assert math.isfinite(config.norm_eps) and config.norm_eps > 0
  assert config.num_heads % config.num_kv_heads == 0 and config.head_dim % 2 == 0
  for field in ("vocab_size", "d_model", "num_layers", "mlp_dim"):
    assert isinstance(getattr(config, field), int) and getattr(config, field) >= 1
