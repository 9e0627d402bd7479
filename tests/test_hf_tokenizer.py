"""Tests of specjax.tokenizers.hf: HF tokenizer.json files, the loader for
either kind, and the draft/target compatibility check."""

import json
import os
import pickle
import shutil

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")
import sentencepiece as spm  # noqa: E402

from specjax.tokenizers.hf import (  # noqa: E402
    HFTokenizer, check_tokenizers_compatible, load_tokenizer)
from specjax.tokenizers.sentencepiece import SentencePieceTokenizer  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "data")
SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>"]  # ids 0, 1, 2
TEXTS = ["The cat sleeps.", "Die Katze schläft auf dem Sofa.", "",
         "naïve café — 😀 emoji", "  leading and trailing spaces  "]


def _corpus_lines():
  with open(os.path.join(FIXTURES, "tokenizer_corpus.txt"),
            encoding="utf-8") as f:
    return [line.strip() for line in f if line.strip()]


def _byte_level_bpe(bos_template: bool = True) -> "tokenizers.Tokenizer":
  """A byte-level BPE (as Llama 3 / Qwen) trained on the fixture corpus;
  with `bos_template` its post-processor prepends BOS (as Llama 3's)."""
  from tokenizers import decoders, models, pre_tokenizers, processors, trainers
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=400, special_tokens=SPECIALS, show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(_corpus_lines(), trainer)
  if bos_template:
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", special_tokens=[("<|bos|>", 0)])
  return tok


def _word_level(tokens, unk="<unk>") -> "tokenizers.Tokenizer":
  """A word-level tokenizer whose token `i` is ``tokens[i]``."""
  from tokenizers import models, pre_tokenizers
  tok = tokenizers.Tokenizer(models.WordLevel(
      {t: i for i, t in enumerate(tokens)}, unk_token=unk))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  return tok


def _save(directory, tok, **side_files) -> str:
  """Saves `tok` as directory/tokenizer.json and each keyword as a JSON side
  file (``tokenizer_config={...}`` → tokenizer_config.json)."""
  os.makedirs(directory, exist_ok=True)
  tok.save(os.path.join(directory, "tokenizer.json"))
  for name, content in side_files.items():
    with open(os.path.join(directory, name + ".json"), "w",
              encoding="utf-8") as f:
      json.dump(content, f)
  return str(directory)


LLAMA_LIKE = {"bos_token": "<|bos|>",
              "eos_token": {"content": "<|eos|>", "special": True}}


@pytest.fixture(scope="module")
def bpe():
  return _byte_level_bpe()


@pytest.fixture(scope="module")
def llama_dir(bpe, tmp_path_factory):
  """Llama 3 style: BOS added by the post-processor, EOS, no pad token."""
  return _save(tmp_path_factory.mktemp("llama"), bpe,
               tokenizer_config=LLAMA_LIKE)


@pytest.fixture(scope="module")
def tok(llama_dir):
  return HFTokenizer(llama_dir)


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
  prefix = str(tmp_path_factory.mktemp("spm") / "spiece")
  spm.SentencePieceTrainer.train(
      input=os.path.join(FIXTURES, "tokenizer_corpus.txt"),
      model_prefix=prefix, vocab_size=100, pad_id=0, eos_id=1, unk_id=2,
      bos_id=-1, num_threads=1, minloglevel=2)
  return prefix + ".model"


# -----------------------------------------------------------------------------
# HFTokenizer.
# -----------------------------------------------------------------------------


def test_special_ids_from_config_and_round_trip(tok, llama_dir):
  assert tok.path == os.path.join(llama_dir, "tokenizer.json")
  assert (tok.bos_id, tok.eos_id) == (0, 1)
  assert tok.pad_token is None and tok.pad_id == tok.eos_id == 1
  assert tok.unk_id is None
  assert tok.vocab_size == 400 and tok.id_to_token(2) == "<|pad|>"
  assert tok.add_bos_by_default  # from the post-processor.
  for text in TEXTS:
    ids = tok.encode(text)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.bos_id not in ids[1:-1] and tok.eos_id not in ids[1:-1]
    assert tok.decode(ids) == text
    assert tok.encode(text, add_eos=False, add_bos=False) == ids[1:-1]
  assert tok.decode([5, 6, tok.eos_id, 7, 8]) == tok.decode([5, 6])
  with pytest.raises(ValueError, match="token id 400 is outside"):
    tok.decode([5, 400])
  with pytest.raises(TypeError, match="text must be a str"):
    tok.encode(b"bytes")
  again = pickle.loads(pickle.dumps(tok))
  assert again.encode(TEXTS[1]) == tok.encode(TEXTS[1])


def test_batches_padding_lengths_and_truncation(tok):
  texts = TEXTS[:3]
  singles = [tok.encode(t) for t in texts]
  max_len = max(map(len, singles)) + 2
  tokens_bp, lengths_b = tok.encode_batch(texts, max_len)
  assert tokens_bp.dtype == np.int32 and tokens_bp.shape == (3, max_len)
  assert lengths_b.dtype == np.int32
  assert lengths_b.tolist() == [len(s) for s in singles]
  for row, ids in enumerate(singles):
    assert tokens_bp[row, :len(ids)].tolist() == ids
    assert (tokens_bp[row, len(ids):] == tok.pad_id).all()  # EOS-padded.
  assert tok.decode_batch(tokens_bp, lengths_b) == texts
  assert tok.decode_batch(tokens_bp) == texts

  short = len(singles[1]) - 1
  with pytest.raises(ValueError, match=rf"row 1 has {len(singles[1])} tokens"):
    tok.encode_batch(texts, short)
  cut_bp, cut_b = tok.encode_batch(texts, short, truncate=True)
  assert cut_b[1] == short and cut_bp[1, -1] == tok.eos_id
  assert cut_bp[1, :-1].tolist() == singles[1][:short - 1]
  assert cut_bp[1, 0] == tok.bos_id

  plain_bp, plain_b = tok.encode_batch(texts, max_len, add_eos=False,
                                       add_bos=False)
  assert plain_b.tolist() == [len(s) - 2 for s in singles]
  assert plain_bp[0, :plain_b[0]].tolist() == singles[0][1:-1]
  with pytest.raises(ValueError, match="max_len must be an int >= 1, got 0"):
    tok.encode_batch(texts, 0)
  with pytest.raises(TypeError, match="not one string"):
    tok.encode_batch("abc", 8)
  with pytest.raises(TypeError, match=r"texts\[1\] must be a str"):
    tok.encode_batch(["a", 3], 8)
  with pytest.raises(TypeError, match="max_len must be an int"):
    tok.encode_batch(texts, 8.0)


def test_qwen_style_pad_token_and_no_bos(bpe, tmp_path):
  path = _save(tmp_path / "qwen", _byte_level_bpe(bos_template=False),
               tokenizer_config={"bos_token": None, "eos_token": "<|eos|>",
                                 "pad_token": "<|pad|>"},
               # Lower priority than tokenizer_config.json: ignored.
               special_tokens_map={"bos_token": "<|bos|>"})
  tok = HFTokenizer(path)
  assert tok.bos_id is None and not tok.add_bos_by_default
  assert (tok.eos_id, tok.pad_id) == (1, 2)
  tokens_bp, lengths_b = tok.encode_batch(["The cat", "The cat sleeps."], 12)
  assert tokens_bp[0, lengths_b[0]:].tolist() == [2] * (12 - lengths_b[0])
  assert tokens_bp[0, 0] != 0  # no BOS.
  assert tok.decode([2] + tok.encode("The cat", add_eos=False) + [2]) == \
      "The cat"  # real pad ids are dropped.
  with pytest.raises(ValueError, match="add_bos=True but .* has no BOS"):
    tok.encode("x", add_bos=True)


def test_special_tokens_from_side_files_and_overrides(bpe, tmp_path):
  # config.json only: ids, a list of EOS ids (the first is used).
  path = _save(tmp_path / "cfg", bpe,
               config={"bos_token_id": 0, "eos_token_id": [2, 1]})
  tok = HFTokenizer(path)
  assert (tok.bos_id, tok.eos_id, tok.pad_token) == (0, 2, None)
  # special_tokens_map.json beats config.json.
  path = _save(tmp_path / "map", bpe, config={"eos_token_id": 2},
               special_tokens_map={"eos_token": "<|eos|>"})
  assert HFTokenizer(path).eos_id == 1
  # Keyword overrides beat everything.
  assert HFTokenizer(path, eos_token="<|pad|>").eos_id == 2
  # Side files that do not name a token: none, though "<|pad|>" exists.
  assert HFTokenizer(path).pad_token is None
  # A bare tokenizer.json: well-known names only; "<|pad|>" here.
  bare = HFTokenizer(_save(tmp_path / "bare", bpe))
  assert (bare.bos_id, bare.eos_id, bare.pad_id) == (None, None, 2)
  with pytest.raises(ValueError, match="add_eos=True but .* has no EOS"):
    bare.encode("x")
  assert bare.encode("x", add_eos=False) == bpe.encode(
      "x", add_special_tokens=False).ids  # BOS unknown: not added.
  named = HFTokenizer(_save(tmp_path / "named", _word_level(
      ["<unk>", "<s>", "</s>", "a", "b"])))
  assert (named.bos_id, named.eos_id, named.unk_id) == (None, None, 0)
  # A tokenizer.json whose "</s>" is special is found by name.
  special = _word_level(["<unk>", "<s>", "</s>", "a", "b"])
  special.add_special_tokens(["<s>", "</s>"])
  named = HFTokenizer(_save(tmp_path / "special", special))
  assert (named.bos_id, named.eos_id) == (1, 2)


def test_missing_and_broken_files(bpe, tmp_path):
  missing = tmp_path / "nope" / "tokenizer.json"
  with pytest.raises(FileNotFoundError, match=str(missing)):
    HFTokenizer(missing)
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError,
                     match=str(tmp_path / "empty" / "tokenizer.json")):
    HFTokenizer(tmp_path / "empty")
  corrupt = tmp_path / "corrupt.json"
  corrupt.write_text('{"version": "1.0", "model": ')
  with pytest.raises(ValueError, match="corrupt.json is not a valid"):
    HFTokenizer(corrupt)
  path = _save(tmp_path / "badcfg", bpe)
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    f.write("{not json")
  with pytest.raises(ValueError, match="tokenizer_config.json is not valid"):
    HFTokenizer(path)
  path = _save(tmp_path / "unknown", bpe,
               tokenizer_config={"eos_token": "<|nope|>"})
  with pytest.raises(ValueError, match=r"eos_token is '<\|nope\|>', which is "
                                       r"not a token"):
    HFTokenizer(path)
  path = _save(tmp_path / "badid", bpe, config={"eos_token_id": 4000})
  with pytest.raises(ValueError, match="eos_token_id is 4000"):
    HFTokenizer(path)


def test_ids_match_transformers(tok):
  transformers = pytest.importorskip("transformers")
  hf = transformers.PreTrainedTokenizerFast(tokenizer_file=tok.path)
  for text in TEXTS + ["<|eos|> written out <|pad|>"]:
    ids = hf(text)["input_ids"]
    assert ids == tok.encode(text, add_eos=False)  # BOS from the template.
    assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(
        text, add_eos=False, add_bos=False)
    if tok.eos_id in ids:  # tok.decode stops there; transformers does not.
      assert ids[1] == tok.eos_id and tok.decode(ids) == ""
      continue
    assert hf.decode(ids, skip_special_tokens=True) == tok.decode(ids)
    assert hf.decode(ids) == tok.decode(ids, skip_special_tokens=False)


# -----------------------------------------------------------------------------
# load_tokenizer.
# -----------------------------------------------------------------------------


def test_load_tokenizer_dispatch(llama_dir, sp_model, tmp_path):
  assert isinstance(load_tokenizer(llama_dir), HFTokenizer)
  hf = load_tokenizer(os.path.join(llama_dir, "tokenizer.json"))
  assert isinstance(hf, HFTokenizer) and hf.eos_id == 1
  sp = load_tokenizer(sp_model)
  assert isinstance(sp, SentencePieceTokenizer) and sp.eos_id == 1
  only_sp = tmp_path / "llama2"
  only_sp.mkdir()
  shutil.copy(sp_model, only_sp / "tokenizer.model")
  assert isinstance(load_tokenizer(only_sp), SentencePieceTokenizer)
  both = tmp_path / "both"
  shutil.copytree(llama_dir, both)
  shutil.copy(sp_model, both / "spiece.model")
  assert isinstance(load_tokenizer(both), HFTokenizer)  # tokenizer.json wins.
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="looked for tokenizer.json .*"
                                              "spiece.model / tokenizer.model"):
    load_tokenizer(tmp_path / "empty")
  with pytest.raises(FileNotFoundError, match="nothing-here"):
    load_tokenizer(tmp_path / "nothing-here.json")
  other = tmp_path / "vocab.txt"
  other.write_text("a\nb\n")
  with pytest.raises(ValueError, match="cannot tell the tokenizer kind of"):
    load_tokenizer(other)


# -----------------------------------------------------------------------------
# check_tokenizers_compatible.
# -----------------------------------------------------------------------------

WORDS = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(14)] + ["ab", "cd"]
CONFIG = {"bos_token": "<s>", "eos_token": "</s>"}


def test_compatible_tokenizers(llama_dir, tmp_path):
  copy = shutil.copytree(llama_dir, tmp_path / "copy")
  assert check_tokenizers_compatible(llama_dir, copy) is None
  assert check_tokenizers_compatible(HFTokenizer(llama_dir),
                                     HFTokenizer(copy)) is None
  a = _save(tmp_path / "a", _word_level(WORDS), tokenizer_config=CONFIG)
  assert check_tokenizers_compatible(a, a) is None


def test_incompatible_vocabularies(tmp_path):
  draft = _save(tmp_path / "draft", _word_level(WORDS), tokenizer_config=CONFIG)
  changed = list(WORDS)
  changed[17] = "ba"
  target = _save(tmp_path / "target", _word_level(changed),
                 tokenizer_config=CONFIG)
  with pytest.raises(ValueError, match="draft and target vocabularies differ "
                                       "at id 17: draft 'ab', target 'ba'"):
    check_tokenizers_compatible(draft, target)
  longer = _save(tmp_path / "longer", _word_level(WORDS + ["ef", "gh"]),
                 tokenizer_config=CONFIG)
  with pytest.raises(ValueError, match=r"differ in size: draft has 19 ids, "
                                       r"target 21; ids 19\.\.20 exist only in"
                                       r" the target \(first: id 19 'ef'\)"):
    check_tokenizers_compatible(draft, longer)
  with pytest.raises(ValueError, match="ids 19..20 exist only in the draft"):
    check_tokenizers_compatible(longer, draft)
  other_eos = _save(tmp_path / "other_eos", _word_level(WORDS),
                    tokenizer_config={"bos_token": "<s>", "eos_token": "cd"})
  with pytest.raises(ValueError, match="eos_id is 2 in the draft, 18 in the "
                                       "target"):
    check_tokenizers_compatible(draft, other_eos)
  with pytest.raises(TypeError, match="target must be an HFTokenizer"):
    check_tokenizers_compatible(draft, 3)


def test_sentencepiece_against_hf(sp_model, tmp_path):
  sp = SentencePieceTokenizer(sp_model)
  pieces = [sp.processor.id_to_piece(i) for i in range(sp.vocab_size)]
  # The same vocabulary as a tokenizer.json with T5's special tokens.
  same = _save(tmp_path / "same", _word_level(pieces),
               tokenizer_config={"eos_token": "</s>", "pad_token": "<pad>"})
  assert check_tokenizers_compatible(sp, same) is None
  assert check_tokenizers_compatible(sp_model, same) is None
  swapped = list(pieces)
  swapped[10], swapped[11] = swapped[11], swapped[10]
  other = _save(tmp_path / "other", _word_level(swapped),
                tokenizer_config={"eos_token": "</s>", "pad_token": "<pad>"})
  with pytest.raises(ValueError, match=f"differ at id 10: draft "
                                       f"'{pieces[10]}', target "
                                       f"'{pieces[11]}'"):
    check_tokenizers_compatible(sp, other)


# -----------------------------------------------------------------------------
# Instruct checkpoints: several EOS ids, chat templates; AutoTokenizer parity.
# -----------------------------------------------------------------------------

CHAT_SPECIALS = ["<|start|>", "<|end|>", "<|eot|>"]
# A Llama-3-style template: BOS, a header per turn, the content trimmed, an
# end-of-turn token, a default system message, the assistant header to
# continue from, and a refusal that goes through raise_exception.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] != 'system' %}<|start|>system<|end|>\n\n"
    "You are terse.<|eot|>{% endif %}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
    "<|start|>{{ message['role'] }}<|end|>\n\n{{ message['content'] | trim }}<|eot|>"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant<|end|>\n\n{% endif %}")
MESSAGES = [{"role": "user", "content": "  Where does the cat sleep? "},
            {"role": "assistant", "content": "On the sofa."},
            {"role": "user", "content": "naïve café — 😀"}]


@pytest.fixture(scope="module")
def instruct_dir(tmp_path_factory):
  """An instruct checkpoint's tokenizer files: chat specials, a chat template,
  generation_config.json ending on <|eot|> or <|eos|>."""
  tok = _byte_level_bpe()
  tok.add_special_tokens(CHAT_SPECIALS)
  eot = tok.token_to_id("<|eot|>")
  return _save(tmp_path_factory.mktemp("instruct"), tok,
               tokenizer_config={"bos_token": "<|bos|>", "eos_token": "<|eos|>",
                                 "chat_template": CHAT_TEMPLATE},
               generation_config={"bos_token_id": 0, "eos_token_id": [eot, 1]})


def test_eos_ids_from_generation_config_then_config(instruct_dir, bpe, tmp_path):
  tok = HFTokenizer(instruct_dir)
  assert tok.eos_ids == (tok.token_to_id("<|eot|>"), 1) and tok.eos_id == 1
  path = _save(tmp_path / "cfg", bpe, tokenizer_config=LLAMA_LIKE,
               config={"eos_token_id": [2, 1]})
  assert HFTokenizer(path).eos_ids == (2, 1)  # no generation_config.json: config.json's
  assert HFTokenizer(_save(tmp_path / "plain", bpe, tokenizer_config=LLAMA_LIKE)).eos_ids \
      == (1,)
  path = _save(tmp_path / "bad", bpe, generation_config={"eos_token_id": [1, 4000]})
  with pytest.raises(ValueError, match=r"generation_config.json: eos_token_id must be an id "
                     r"in \[0, 400\)"):
    HFTokenizer(path)


def test_tokenizer_matches_autotokenizer_from_the_same_directory(instruct_dir, bpe, tmp_path):
  """transformers reads tokenizer_config.json / special_tokens_map.json too:
  the same special ids, BOS default and ids for every text."""
  transformers = pytest.importorskip("transformers")
  legacy = _save(tmp_path / "legacy", bpe, tokenizer_config={  # Llama 2's serialised form
      "bos_token": {"__type": "AddedToken", "content": "<|bos|>", "special": True},
      "eos_token": {"__type": "AddedToken", "content": "<|eos|>", "special": True}},
      special_tokens_map={"pad_token": "<|pad|>"})
  qwen = _save(tmp_path / "qwen", _byte_level_bpe(bos_template=False),
               tokenizer_config={"bos_token": None, "eos_token": "<|eos|>",
                                 "pad_token": "<|pad|>", "add_bos_token": False})
  for directory in (legacy, instruct_dir, qwen):
    ours = HFTokenizer(directory)
    hf = transformers.AutoTokenizer.from_pretrained(directory)
    assert (hf.bos_token_id, hf.eos_token_id) == (ours.bos_id, ours.eos_id), directory
    assert hf.pad_token_id == (None if ours.pad_token is None else ours.pad_id), directory
    for text in TEXTS:
      assert hf(text)["input_ids"] == ours.encode(text, add_eos=False), (directory, text)


def test_chat_template_matches_transformers(instruct_dir):
  transformers = pytest.importorskip("transformers")
  tok = HFTokenizer(instruct_dir)
  hf = transformers.AutoTokenizer.from_pretrained(instruct_dir)
  for prompt in (True, False):
    for messages in (MESSAGES, MESSAGES[:1], [{"role": "system", "content": "Be kind."}]
                     + MESSAGES):
      text = tok.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=False)
      assert text == hf.apply_chat_template(messages, add_generation_prompt=prompt,
                                            tokenize=False)
      ids = hf.apply_chat_template(messages, add_generation_prompt=prompt)
      ids = ids["input_ids"] if hasattr(ids, "keys") else ids
      assert tok.apply_chat_template(messages, add_generation_prompt=prompt) == list(ids)
  assert text.startswith("<|bos|><|start|>system<|end|>\n\nBe kind.<|eot|>")
  with pytest.raises(ValueError, match="the chat template refused the conversation: "
                     "unknown role tool"):
    tok.apply_chat_template([{"role": "tool", "content": "x"}])
  with pytest.raises(TypeError, match="messages must be a list of"):
    tok.apply_chat_template("hello")


def test_no_chat_template_is_named(llama_dir):
  with pytest.raises(ValueError, match="has no chat template"):
    HFTokenizer(llama_dir).apply_chat_template(MESSAGES)
