"""Both paper presets end to end on tiny random-init checkpoints in transformers
format (8 CPU devices): local JSONL data, bf16, a data=2 x model=4 mesh, and
greedy outputs equal to greedy decoding of the same bf16 weights on one device.

Chen: a Llama-format target + draft with a byte-level BPE `tokenizer.json`
(as Llama 3 ships); Leviathan: a T5 v1.1 target + one draft with the
target's `spiece.model`.
"""

import json
import os
import random

import pytest
import sentencepiece as spm
import tokenizers
import torch
import transformers

from configs import chen_chinchilla as chen_config
from configs import leviathan_t5 as leviathan_config
import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.checkpoints.hf_llama import import_hf_decoder
from specjax.checkpoints.hf_t5 import import_hf_t5
from experiments.programs import chen, leviathan
from experiments.programs.speed import sweep_cache_len
from experiments.programs.stages import Stages


WORDS = ("the package provides a library for reading and writing files with support for "
         "compressed archives network tools command line utility python module data").split()
GERMAN = ("das paket bietet eine bibliothek zum lesen und schreiben von dateien mit "
          "unterstuetzung fuer archive netzwerk werkzeuge").split()


def _sentences(rng, words, n):
  return [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) + "." for _ in range(n)]


def _write_jsonl(path, rows):
  with open(path, "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")


def _randomize(model, seed, std=0.3):
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen) if "norm" in name
              else std * torch.randn(p.shape, generator=gen))


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
  root = tmp_path_factory.mktemp("paper")
  rng = random.Random(0)
  # XSum-like and CNN/DM-like summaries, WMT-like pairs, with their splits.
  xsum, cnn, wmt = [], [], []
  for split, n in (("train", 20), ("validation", 4), ("test", 6)):
    for i in range(n):
      doc = " ".join(_sentences(rng, WORDS, 3))
      xsum.append({"document": doc, "summary": doc.split(".")[0], "split": split})
      cnn.append({"article": doc, "highlights": doc.split(".")[0], "split": split})
      en = _sentences(rng, WORDS, 1)[0]
      wmt.append({"en": en, "de": _sentences(rng, GERMAN, 1)[0], "split": split})
  for name, rows in (("xsum", xsum), ("cnn", cnn), ("wmt", wmt)):
    _write_jsonl(root / f"{name}.jsonl", rows)
  corpus = [r["document"] for r in xsum] + [r["de"] for r in wmt]
  (root / "corpus.txt").write_text("\n".join(corpus))

  # Chen: a byte-level BPE tokenizer.json shared by a Llama-format target and draft.
  from tokenizers import decoders, models, pre_tokenizers, trainers
  bpe = tokenizers.Tokenizer(models.BPE())
  bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.decoder = decoders.ByteLevel()
  bpe.train_from_iterator(corpus, trainers.BpeTrainer(
      vocab_size=320, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
      show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  vocab = bpe.get_vocab_size()
  for name, layers, seed in (("target", 2, 0), ("draft", 1, 1)):
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        bos_token_id=0, eos_token_id=1, tie_word_embeddings=name == "draft")
    model = transformers.LlamaForCausalLM(config).eval()
    _randomize(model, seed)
    model.save_pretrained(root / f"llama_{name}")
    bpe.save(str(root / f"llama_{name}" / "tokenizer.json"))

  # Leviathan: T5 v1.1 target + draft with the target's spiece.model.
  prefix = str(root / "spiece")
  spm.SentencePieceTrainer.train(input=str(root / "corpus.txt"), model_prefix=prefix,
                                 vocab_size=64, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                 num_threads=1, minloglevel=2)
  for name, layers, seed in (("target", 2, 2), ("small", 1, 3)):
    config = transformers.T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64,
                                   num_layers=layers, num_decoder_layers=layers, num_heads=4,
                                   feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = transformers.T5ForConditionalGeneration(config).eval()
    _randomize(model, seed, std=0.2)
    model.save_pretrained(root / f"t5_{name}")
    with open(prefix + ".model", "rb") as f:
      (root / f"t5_{name}" / "spiece.model").write_bytes(f.read())
  return root


def _chen_config(root, workdir, mesh):
  c = chen_config.get_config("paper")
  c.workdir = str(workdir)
  c.mesh = mesh
  c.models.target_dir = str(root / "llama_target")
  c.models.draft_dir = str(root / "llama_draft")
  c.data.cache_dir = str(root / "data_chen")
  c.data.summarize_source = f"jsonl:{root / 'xsum.jsonl'}"
  c.eval.ks = [0, 2]
  c.eval.headline_k = 2
  c.eval.max_new_tokens = 8
  c.eval.xsum_prompts = 2
  c.eval.humaneval_prompts = 2
  c.eval.xsum_prompt_len = 48
  c.eval.humaneval_prompt_len = 48
  c.eval.chunk = 2
  c.eval.alpha_batch = 2
  c.eval.bootstrap = 20
  c.eval.humaneval_harness = "off"
  c.eval.auto = False   # gamma="auto" on a mesh: test_sharding (its calibration is costly here)
  return c


def _ar_outputs(workdir, prefix):
  """The stored greedy AR outputs of a sweep, in prompt order."""
  stages, out, k = Stages(os.path.join(workdir, "stages")), [], 0
  while True:
    entry = stages._load(f"{prefix}/chunk{k}/ar")
    if entry is None:
      return out
    out += entry["value"]["outputs"]
    k += 1


def _one_device_greedy(model, params, prompts, lengths, max_new, cache_len, eos_id):
  """Greedy AR on one device, prompt by prompt (batch 1, as the sweeps)."""
  out = []
  for x, n in zip(prompts, lengths):
    res = specjax.generate(model, params, jnp.asarray(x[None]), jnp.asarray([n]),
                           max_new_tokens=max_new, sampling=specjax.GREEDY, eos_id=eos_id,
                           pad_id=0, cache_len=cache_len, key=jax.random.PRNGKey(0)[None])
    out.append(np.asarray(res.tokens)[0, :int(res.lengths[0])].tolist())
  return out


def test_chen_paper_preset_on_a_mesh_equals_one_device(assets, tmp_path):
  cfg = _chen_config(assets, tmp_path / "mesh", "2x4")
  cfg.profile_steps = 2
  on_mesh = chen.run(cfg)
  assert on_mesh["mesh"] == {"data": 2, "model": 4, "dtype": "bfloat16", "source": "hf"}
  # The same greedy outputs as one device, from the same bf16 weights.
  tok, target, draft, dirs = chen.load_pretrained_configs(cfg)
  tp, _ = import_hf_decoder(dirs["target"], target.config)
  prompts, lengths, _, _ = chen.task_prompts(cfg, tok, "xsum")
  cache_len = sweep_cache_len(target, [draft], prompts.shape[1], 8, 2)
  want = _one_device_greedy(target, tp, prompts, lengths, 8, cache_len, None)
  assert _ar_outputs(tmp_path / "mesh", "xsum_greedy/k") == want
  # Greedy speculative == greedy AR within the run (bf16 on the mesh).
  assert on_mesh["settings"]["xsum_greedy"]["cells"]["draft/g2"]["identical_fraction"] == 1.0
  md = (tmp_path / "mesh" / "results" / "results.md").read_text()
  assert "8 x cpu (mesh data=2 x model=4, bfloat16)" in md  # the hardware is named
  # The profile of a few decode iterations and the TensorBoard scalars.
  traces = [f for _, _, fs in os.walk(tmp_path / "mesh" / "profile") for f in fs]
  assert any(f.endswith(".xplane.pb") for f in traces)
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "mesh" / "tb"))


def _leviathan_config(root, workdir, mesh):
  c = leviathan_config.get_config("paper")
  c.workdir = str(workdir)
  c.mesh = mesh
  c.models.target_dir = str(root / "t5_target")
  c.models.draft_dirs.small = str(root / "t5_small")
  c.data.cache_dir = str(root / "data_leviathan")
  c.data.translate_source = f"jsonl:{root / 'wmt.jsonl'}"
  c.data.summarize_source = f"jsonl:{root / 'cnn.jsonl'}"
  c.eval.drafts = ["small"]
  c.eval.num_prompts = 2
  c.eval.gammas = [2]
  c.eval.temperatures = [0.0]
  c.eval.translate_prompt_len = 32
  c.eval.summarize_prompt_len = 32
  c.eval.translate_max_new = 8
  c.eval.summarize_max_new = 8
  c.eval.chunk = 2
  c.eval.auto = False   # as the Chen preset's test
  return c


def test_leviathan_paper_preset_on_a_mesh_equals_one_device(assets, tmp_path):
  cfg = _leviathan_config(assets, tmp_path / "mesh", "2x4")
  on_mesh = leviathan.run(cfg)
  assert on_mesh["mesh"] == {"data": 2, "model": 4, "dtype": "bfloat16", "source": "hf"}
  tok, target, drafts, dirs = leviathan.load_pretrained_configs(cfg)
  tp, _ = import_hf_t5(dirs["target"], target.config)
  for task in ("translate", "summarize"):
    p_len = cfg.eval[f"{task}_prompt_len"]
    prompts, lengths, _ = leviathan.test_prompts(cfg, tok, task, p_len)
    cache_len = sweep_cache_len(target, list(drafts.values()), p_len, 8, 2)
    want = _one_device_greedy(target, tp, prompts, lengths, 8, cache_len, tok.eos_id)
    assert _ar_outputs(tmp_path / "mesh", f"{task}/t0") == want, task
    cells = on_mesh["tasks"][task]["temperatures"]["0"]["cells"]
    assert cells["small/g2"]["identical_fraction"] == 1.0
  md = (tmp_path / "mesh" / "results" / "results.md").read_text()
  assert "8 x cpu (mesh data=2 x model=4, bfloat16)" in md  # the hardware is named


def test_paper_presets_need_their_checkpoint_dirs(tmp_path):
  c = chen_config.get_config("paper")
  c.workdir = str(tmp_path / "w")
  c.data.summarize_source = "jsonl:/nonexistent"
  with pytest.raises(ValueError, match="config.models.target_dir"):
    chen.load_pretrained_configs(c)
  c = leviathan_config.get_config("paper")
  c.models.target_dir = str(tmp_path)
  with pytest.raises(FileNotFoundError, match="config.models.target_dir"):
    leviathan.load_pretrained_configs(c)
