"""Tokenizers refuse malformed ids and texts by name, and decode every legitimate input.

Property tests (hypothesis) over `decode`, `decode_batch`, `id_to_token`, `encode` and
`encode_batch` of a tiny word-level `HFTokenizer` and a tiny SentencePiece model: every call
either returns what an independent oracle says it must, or raises a TypeError / ValueError whose
message names the argument; never another exception type, never a silent truncation of a float
or a bool read as an id.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

tokenizers = pytest.importorskip("tokenizers")
import sentencepiece as spm  # noqa: E402

from specjax.tokenizers.hf import HFTokenizer  # noqa: E402
from specjax.tokenizers.sentencepiece import SentencePieceTokenizer  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "data")
WORDS = ["<pad>", "</s>", "<unk>", "the", "cat", "sat", "on", "a", "mat", "dog"]
SETTINGS = settings(max_examples=50, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@pytest.fixture(scope="module")
def hf_tok(tmp_path_factory):
  from tokenizers import models, pre_tokenizers, decoders
  tok = tokenizers.Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)},
                                              unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
  directory = tmp_path_factory.mktemp("wordlevel")
  tok.save(str(directory / "tokenizer.json"))
  (directory / "tokenizer_config.json").write_text(
      '{"eos_token": "</s>", "pad_token": "<pad>", "bos_token": null}')
  return HFTokenizer(str(directory))


@pytest.fixture(scope="module")
def sp_tok(tmp_path_factory):
  prefix = str(tmp_path_factory.mktemp("spm") / "spiece")
  spm.SentencePieceTrainer.train(
      input=os.path.join(FIXTURES, "tokenizer_corpus.txt"), model_prefix=prefix,
      vocab_size=100, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, num_threads=1, minloglevel=2)
  return SentencePieceTokenizer(prefix + ".model")


def _oracle(ids, vocab, eos, pad):
  """The ids a decode of `ids` must read (before the first EOS, pads dropped), or None when the
  call must be refused. Written without the library's helpers."""
  if isinstance(ids, np.ndarray):
    if ids.dtype.kind not in "iu" or ids.ndim > 1:
      return None
    seq = ids.reshape(-1).tolist()
  elif isinstance(ids, (list, tuple)):
    if not all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
               for x in ids):
      return None
    seq = [int(x) for x in ids]
  elif isinstance(ids, (int, np.integer)) and not isinstance(ids, (bool, np.bool_)):
    seq = [int(ids)]
  else:
    return None
  kept = []
  for x in seq:
    if x == eos:
      break
    if not 0 <= x < vocab:
      return None
    if x != pad:
      kept.append(x)
  return kept


def _scalars(vocab):
  return st.one_of(
      st.integers(0, vocab - 1), st.integers(0, vocab - 1), st.integers(-5, vocab + 5),
      st.integers(-2**80, 2**80), st.booleans(), st.floats(allow_nan=True),
      st.just(None), st.text(max_size=3), st.just(2.0),
      st.integers(0, vocab - 1).map(np.int64), st.integers(0, vocab - 1).map(np.uint16))


_INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint32", "uint64"]
_OTHER_DTYPES = ["float32", "float64", "bool", "float16"]


def _arrays(vocab):
  one_d = st.lists(st.integers(0, min(vocab + 3, 127)), max_size=8)
  return st.one_of(
      st.tuples(one_d, st.sampled_from(_INT_DTYPES)).map(lambda t: np.asarray(t[0], t[1])),
      st.tuples(one_d, st.sampled_from(_OTHER_DTYPES)).map(lambda t: np.asarray(t[0], t[1])),
      st.tuples(st.integers(0, 3), st.integers(1, 3)).map(lambda s: np.full(s, 3, np.int32)),
      st.integers(0, vocab + 2).map(lambda x: np.asarray(x, np.int32)),  # 0-d
      st.lists(st.integers(0, vocab - 1), max_size=6).map(lambda x: np.asarray(x, np.int64)))


def _malformed_ids(vocab):
  return st.one_of(
      _scalars(vocab),
      _arrays(vocab),
      st.lists(_scalars(vocab), max_size=6),
      st.lists(st.integers(0, vocab - 1), max_size=8),
      st.lists(st.integers(0, vocab - 1), max_size=8).map(tuple),
      st.lists(st.lists(st.integers(0, vocab - 1), max_size=3), min_size=1, max_size=3),
      st.lists(st.integers(0, vocab - 1), max_size=4).map(set),
      st.just({1: 2}), st.just(b"\x01\x02"), st.just(object()))


def _check_decode(tok, ids, decode, reference):
  expected = _oracle(ids, tok.vocab_size, tok.eos_id, tok.pad_id)
  try:
    text = decode(ids)
  except (TypeError, ValueError) as e:
    assert "ids" in str(e), str(e)
    assert expected is None, f"{ids!r} refused ({e}) but should decode {expected}"
    return
  assert expected is not None, f"{ids!r} decoded to {text!r} instead of being refused"
  assert text == reference(expected)


@SETTINGS
@given(data=st.data())
def test_hf_decode_refuses_or_decodes(hf_tok, data):
  ids = data.draw(_malformed_ids(hf_tok.vocab_size))
  _check_decode(hf_tok, ids, hf_tok.decode, hf_tok.backend.decode)


@SETTINGS
@given(data=st.data())
def test_sentencepiece_decode_refuses_or_decodes(sp_tok, data):
  ids = data.draw(_malformed_ids(sp_tok.vocab_size))
  _check_decode(sp_tok, ids, sp_tok.decode, sp_tok.processor.decode)


@SETTINGS
@given(data=st.data())
def test_decode_batch_refuses_or_decodes(hf_tok, sp_tok, data):
  tok = data.draw(st.sampled_from([hf_tok, sp_tok]))
  vocab = tok.vocab_size
  rows = data.draw(st.integers(1, 3))
  width = data.draw(st.integers(1, 4))
  dtype = data.draw(st.sampled_from(_INT_DTYPES + _OTHER_DTYPES + ["object"]))
  values = data.draw(st.lists(st.integers(0, vocab + 2), min_size=rows * width,
                              max_size=rows * width))
  tokens = np.asarray(values, dtype=np.int64).reshape(rows, width)
  if dtype == "object":
    tokens = [[int(x) for x in row] for row in tokens] + data.draw(
        st.sampled_from([[], [[1]], [[1.5] * width], [[None] * width]]))
  else:
    tokens = tokens.astype(dtype)
  lengths = data.draw(st.one_of(
      st.none(), st.lists(st.integers(-1, width + 1), min_size=rows, max_size=rows),
      st.lists(st.floats(0, width), min_size=rows, max_size=rows),
      st.lists(st.integers(0, width), min_size=rows + 1, max_size=rows + 1),
      st.just("3"), st.just([[1], [1, 2]])))
  try:
    texts = tok.decode_batch(tokens, lengths)
  except (TypeError, ValueError) as e:
    assert "tokens" in str(e) or "lengths" in str(e), str(e)
    return
  arr = np.asarray(tokens)
  assert arr.dtype.kind in "iu" and arr.ndim == 2, f"{tokens!r} accepted"
  lens = [arr.shape[1]] * arr.shape[0] if lengths is None else lengths
  assert all(isinstance(n, int) and 0 <= n <= arr.shape[1] for n in lens), f"{lengths!r}"
  for b, text in enumerate(texts):
    assert text == tok.decode(arr[b, :lens[b]].tolist())


@SETTINGS
@given(value=st.one_of(st.text(max_size=8), _scalars(10), st.lists(st.text(max_size=3),
                                                                   max_size=3)))
def test_encode_refuses_non_strings(hf_tok, sp_tok, value):
  for tok in (hf_tok, sp_tok):
    try:
      ids = tok.encode(value, add_eos=False)
    except (TypeError, ValueError) as e:
      assert "text" in str(e) and not isinstance(value, str), str(e)
      continue
    assert isinstance(value, str) and all(isinstance(i, int) for i in ids)


@SETTINGS
@given(texts=st.one_of(st.lists(st.one_of(st.text(max_size=5), _scalars(10)), max_size=3),
                       st.none(), st.integers(), st.text(max_size=4)),
       max_len=st.one_of(st.integers(-1, 12), st.floats(0, 12), st.just("8"), st.none()))
def test_encode_batch_refuses_by_name(hf_tok, sp_tok, texts, max_len):
  for tok in (hf_tok, sp_tok):
    try:
      tokens, lengths = tok.encode_batch(texts, max_len, truncate=True)
    except (TypeError, ValueError) as e:
      assert "texts" in str(e) or "max_len" in str(e), str(e)
      continue
    assert isinstance(texts, list) and all(isinstance(t, str) for t in texts)
    assert isinstance(max_len, int) and tokens.shape == (len(texts), max_len)


@SETTINGS
@given(value=_scalars(len(WORDS)))
def test_id_to_token_refuses_by_name(hf_tok, value):
  try:
    token = hf_tok.id_to_token(value)
  except (TypeError, ValueError) as e:
    assert "token_id" in str(e), str(e)
    assert (isinstance(value, (bool, float, str, type(None)))
            or not 0 <= int(value) < hf_tok.vocab_size), str(e)
    return
  assert token == WORDS[int(value)]


def test_named_refusals_and_legitimate_inputs(hf_tok, sp_tok):
  import jax.numpy as jnp
  cat, sat = hf_tok.token_to_id("cat"), hf_tok.token_to_id("sat")
  expected = hf_tok.backend.decode([cat, sat])
  for ok in ([cat, sat], (cat, sat), np.asarray([cat, sat], np.int64),
             np.asarray([cat, sat], np.uint64), jnp.asarray([cat, sat]), iter([cat, sat]),
             [np.int32(cat), np.int64(sat)], [cat, sat, 1, 2.5, None]):  # after EOS: unread
    if isinstance(ok, list) and None in ok:
      with pytest.raises(TypeError, match=r"ids\[3\] must be an integer in \[0, 10\), got 2.5"):
        hf_tok.decode(ok)
      continue
    assert hf_tok.decode(ok) == expected
  assert hf_tok.decode(cat) == "cat" and hf_tok.decode([]) == ""
  with pytest.raises(TypeError, match=r"ids\[1\] must be an integer in \[0, 10\), got the bool"):
    hf_tok.decode([cat, True])
  with pytest.raises(TypeError, match="ids must hold integer token ids, got an array of dtype "
                                      "float32"):
    hf_tok.decode(np.asarray([3.0, 4.0], np.float32))
  with pytest.raises(TypeError, match="ids must be a sequence of integer token ids"):
    hf_tok.decode(None)
  with pytest.raises(TypeError, match="got 'the cat'"):
    sp_tok.decode("the cat")
  with pytest.raises(ValueError, match=r"ids\[0\]: token id 1208925819614629174706176 is "
                                       r"outside the vocabulary \[0, 10\)"):
    hf_tok.decode([2**80])
  with pytest.raises(ValueError, match=r"ids\[1\]: token id -1 is outside"):
    sp_tok.decode([5, -1])
  with pytest.raises(ValueError, match="nested list at ids"):
    hf_tok.decode([[3, 4], [5]])
  with pytest.raises(ValueError, match=r"shape \(2, 2\); decode a batch \[B, N\] with "
                                       "decode_batch"):
    hf_tok.decode(np.ones((2, 2), np.int32))
  with pytest.raises(ValueError, match=r"tokens\[1\]\[0\]: token id 99 is outside"):
    hf_tok.decode_batch(np.asarray([[3, 4], [99, 4]]))
  with pytest.raises(TypeError, match="lengths must be integers"):
    hf_tok.decode_batch(np.asarray([[3, 4]]), [1.5])
  with pytest.raises(ValueError, match="tokens must be integer token ids of shape"):
    sp_tok.decode_batch([[3, 4], [5]])
  with pytest.raises(TypeError, match="unordered set"):
    hf_tok.decode({3, 4})
  with pytest.raises(TypeError, match="skip_special_tokens must be a bool"):
    hf_tok.decode([3], skip_special_tokens="no")
  with pytest.raises(TypeError, match=r"texts\[1\] must be a str, got 5"):
    hf_tok.encode_batch(["the cat", 5], 8)
  with pytest.raises(TypeError, match="texts must be a sequence of strings, got None"):
    sp_tok.encode_batch(None, 8)
  with pytest.raises(TypeError, match="max_len must be an int >= 1"):
    sp_tok.encode_batch(["a"], 8.0)
  with pytest.raises(TypeError, match="text must be a str .*got \\[3, 4\\]"):
    hf_tok.encode([3, 4])
  with pytest.raises(ValueError, match=r"token_id must be an integer in \[0, 10\)"):
    hf_tok.id_to_token(10)
  with pytest.raises(TypeError, match="token_id must be an integer"):
    hf_tok.id_to_token(3.0)
  with pytest.raises(TypeError, match="token must be a str"):
    hf_tok.token_to_id(3)
