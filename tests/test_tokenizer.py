"""Tests of specjax.tokenizers.sentencepiece and the SentencePiece training in experiments.data."""

import json
import os
import pickle

import numpy as np
import pytest
import sentencepiece as spm

from experiments import data
from specjax.tokenizers.sentencepiece import SentencePieceTokenizer

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "data")
VOCAB_SIZE = 150


def _corpus_lines():
  with open(os.path.join(FIXTURES, "tokenizer_corpus.txt"),
            encoding="utf-8") as f:
    return [line.strip() for line in f if line.strip()]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """A cache with one task built from the fixture corpus, and its vocab."""
  cache = tmp_path_factory.mktemp("cache")
  lines = _corpus_lines()
  jsonl = cache / "pairs.jsonl"
  with open(jsonl, "w", encoding="utf-8") as f:
    for en, de in zip(lines[0::2], lines[1::2]):
      f.write(json.dumps({"en": en, "de": de}) + "\n")
  data.build_task("wmt14_translate/de-en", cache, source=f"jsonl:{jsonl}",
                  validation_fraction=0.0, test_fraction=0.0,
                  show_progress=False)
  path = data.train_sentencepiece(["wmt14_translate/de-en"], cache,
                                  vocab_size=VOCAB_SIZE)
  return cache, path


@pytest.fixture(scope="module")
def tok(built):
  return SentencePieceTokenizer(built[1])


def test_trained_model_location_and_info(built):
  cache, path = built
  assert path == os.path.join(str(cache), "vocab",
                              f"spm{VOCAB_SIZE}_wmt14_translate__de-en",
                              "spiece.model")
  with open(os.path.join(os.path.dirname(path), "spiece.json")) as f:
    info = json.load(f)
  assert info["config"]["vocab_size"] == VOCAB_SIZE
  assert info["num_lines"] == len(_corpus_lines())  # inputs + targets
  with open(os.path.join(os.path.dirname(path), "spiece.vocab"),
            encoding="utf-8") as f:
    pieces = [line.split("\t")[0] for line in f]
  assert pieces[:3] == ["<pad>", "</s>", "<unk>"] and len(pieces) == VOCAB_SIZE
  assert not [n for n in os.listdir(os.path.dirname(path))
              if n.startswith(".tmp")]


def test_t5_special_ids(tok):
  assert tok.pad_id == 0
  assert tok.eos_id == 1
  assert tok.unk_id == 2
  assert tok.decoder_start_id == 0
  assert tok.vocab_size == VOCAB_SIZE
  assert tok.processor.bos_id() == -1
  assert tok.processor.id_to_piece(1) == "</s>"


@pytest.mark.parametrize("text", [
    "The cat sleeps on the warm sofa.",
    "Die Datei konnte nicht geöffnet werden.",
    "Wo ist der Bahnhof?",
    "",
])
def test_round_trip(tok, text):
  ids = tok.encode(text)
  assert ids[-1] == tok.eos_id
  assert tok.eos_id not in ids[:-1] and tok.pad_id not in ids
  assert tok.decode(ids) == text
  assert tok.encode(text, add_eos=False) == ids[:-1]


def test_decode_stops_at_eos_and_drops_pad(tok):
  a = tok.encode("Where is the station?", add_eos=False)
  b = tok.encode("Wir öffnen morgens das Fenster.", add_eos=False)
  assert tok.decode([0] + a + [0, 0]) == "Where is the station?"
  assert tok.decode(a + [tok.eos_id] + b) == "Where is the station?"
  with pytest.raises(ValueError, match="outside the vocabulary"):
    tok.decode([VOCAB_SIZE + 5])


def test_encode_batch_pads_right_and_counts(tok):
  texts = ["Where is the station?", "The printer is out of paper.", ""]
  tokens_bp, lengths_b = tok.encode_batch(texts, max_len=24)
  assert tokens_bp.dtype == np.int32 and lengths_b.dtype == np.int32
  assert tokens_bp.shape == (3, 24)
  for row, text in enumerate(texts):
    ids = tok.encode(text)
    assert lengths_b[row] == len(ids)
    assert tokens_bp[row, :len(ids)].tolist() == ids
    assert (tokens_bp[row, len(ids):] == tok.pad_id).all()
  assert lengths_b[2] == 1  # only EOS
  assert tok.decode_batch(tokens_bp, lengths_b) == texts
  assert tok.decode_batch(tokens_bp) == texts
  no_eos, lengths = tok.encode_batch(texts[:1], max_len=24, add_eos=False)
  assert lengths[0] == lengths_b[0] - 1
  assert tok.eos_id not in no_eos[0].tolist()


def test_encode_batch_overlong(tok):
  long_text = "The network connection was lost. " * 5
  n = len(tok.encode(long_text))
  with pytest.raises(ValueError, match=rf"row 1 has {n} tokens.*max_len=8"):
    tok.encode_batch(["ok", long_text], max_len=8)
  tokens_bp, lengths_b = tok.encode_batch(["ok", long_text], max_len=8,
                                          truncate=True)
  assert lengths_b[1] == 8
  assert tokens_bp[1, 7] == tok.eos_id
  assert tokens_bp[1, :7].tolist() == tok.encode(long_text)[:7]
  with pytest.raises(ValueError, match="max_len"):
    tok.encode_batch(["x"], max_len=0)
  with pytest.raises(TypeError):
    tok.encode_batch("not a list", max_len=8)


def test_decode_batch_checks_shapes(tok):
  tokens_bp, lengths_b = tok.encode_batch(["a b", "c"], max_len=6)
  with pytest.raises(ValueError, match=r"shape \[B, N\]"):
    tok.decode_batch(tokens_bp[0], lengths_b)
  with pytest.raises(ValueError, match="lengths"):
    tok.decode_batch(tokens_bp, np.array([7, 1]))
  assert tok.decode_batch(tokens_bp, [0, 0]) == ["", ""]


def test_missing_and_invalid_model_files(tmp_path):
  missing = tmp_path / "nope" / "spiece.model"
  with pytest.raises(FileNotFoundError, match=str(missing)):
    SentencePieceTokenizer(missing)
  garbage = tmp_path / "garbage.model"
  garbage.write_bytes(b"this is not a sentencepiece model")
  with pytest.raises(ValueError, match="garbage.model"):
    SentencePieceTokenizer(garbage)


def test_non_t5_ids_are_rejected(tmp_path):
  corpus = os.path.join(FIXTURES, "tokenizer_corpus.txt")
  prefix = str(tmp_path / "default_ids")
  spm.SentencePieceTrainer.train(input=corpus, model_prefix=prefix,
                                 vocab_size=100, minloglevel=2)
  with pytest.raises(ValueError, match=r"pad_id=-1 \(want 0\)"):
    SentencePieceTokenizer(prefix + ".model")
  lax = SentencePieceTokenizer(prefix + ".model", require_t5_ids=False)
  assert lax.eos_id == 2


def test_training_is_deterministic_and_cached(built, tmp_path):
  cache, path = built
  mtime = os.path.getmtime(path)
  again = data.train_sentencepiece(["wmt14_translate/de-en"], cache,
                                   vocab_size=VOCAB_SIZE)
  assert again == path and os.path.getmtime(path) == mtime
  other = data.train_sentencepiece(["wmt14_translate/de-en"], cache,
                                   vocab_size=VOCAB_SIZE, name="second")
  assert other != path
  with open(path, "rb") as f1, open(other, "rb") as f2:
    assert f1.read() == f2.read()
  with pytest.raises(FileNotFoundError, match="experiments.data.build"):
    data.train_sentencepiece(["xsum"], cache, vocab_size=VOCAB_SIZE)


def test_pickle_round_trip(tok):
  clone = pickle.loads(pickle.dumps(tok))
  text = "Wo ist der Bahnhof?"
  assert clone.encode(text) == tok.encode(text)
  assert clone.path == tok.path


def test_rebuilt_task_invalidates_vocab(tmp_path):
  jsonl = tmp_path / "pairs.jsonl"
  lines = _corpus_lines()
  jsonl.write_text("".join(json.dumps({"en": a, "de": b}) + "\n"
                           for a, b in zip(lines[0::2], lines[1::2])),
                   encoding="utf-8")
  kwargs = dict(source=f"jsonl:{jsonl}", validation_fraction=0.0,
                test_fraction=0.0, show_progress=False)
  data.build_task("wmt14_translate/de-en", tmp_path, **kwargs)
  path = data.train_sentencepiece("wmt14_translate/de-en", tmp_path,
                                  vocab_size=100)
  info = os.path.join(os.path.dirname(path), "spiece.json")
  first = os.path.getmtime(info)
  data.train_sentencepiece("wmt14_translate/de-en", tmp_path, vocab_size=100)
  assert os.path.getmtime(info) == first
  data.build_task("wmt14_translate/de-en", tmp_path, overwrite=True, **kwargs)
  os.utime(info, (0, 0))
  data.train_sentencepiece("wmt14_translate/de-en", tmp_path, vocab_size=100)
  assert os.path.getmtime(info) > 0  # retrained and rewritten
