"""Leviathan et al. 2023 reproduction: T5 v1.1 target, small/base/large drafts,
EN→DE and summarisation, temperature 0 and 1, γ sweep, batch 1.

Run (from the repository root):
  python experiments/leviathan_t5.py --config=configs/leviathan_t5.py:quick \
      --config.workdir=runs/leviathan_quick          # ~25 min from a fresh clone (2 cores)
  python experiments/leviathan_t5.py --config=configs/leviathan_t5.py:full \
      --config.workdir=runs/leviathan_full           # ≤ 3 h on 2 CPU cores, resumable
  python experiments/leviathan_t5.py --config=configs/leviathan_t5.py:micro \
      --config.workdir=/tmp/lev_micro --config.data.translate_source=jsonl:... \
      --config.data.summarize_source=jsonl:...       # seconds; CI end-to-end test

  python experiments/leviathan_t5.py --config=configs/leviathan_t5.py:paper \
      --config.models.target_dir=/ckpt/t5-v1_1-xxl --config.models.draft_dirs.small=/ckpt/t5-v1_1-small \
      --config.models.draft_dirs.base=/ckpt/t5-v1_1-base --config.models.draft_dirs.large=/ckpt/t5-v1_1-large \
      --config.workdir=runs/leviathan_paper        # real checkpoints, bf16, on the mesh ("auto")

Launch recipes for the paper preset (the same command on every host of a slice):
  * TPU v4-8 VM (one host, 4 chips): the command above, as is.
  * v4-32 pod slice (4 hosts): gcloud compute tpus tpu-vm ssh NAME --zone=ZONE --worker=all \
      --command="cd specjax && python experiments/leviathan_t5.py \
      --config=configs/leviathan_t5.py:paper --config.distributed=True ..."
  * one 8-GPU host: the command above; --config.mesh=1x8 splits the target over all eight.

A rerun with the same workdir reuses the data, vocabulary, trained models,
compiled executables and finished measurements. Results (JSON, markdown, PNG)
go to `<workdir>/results/` and, with --config.results_dir, also there.

Model sizes (T5 v1.1: gated-GELU, untied head) follow the paper's ratios as
far as this CPU allows: T5-XXL : small ≈ 140, : base ≈ 44, : large ≈ 14.
"""

import functools
import os
import runpy

import ml_collections

# configs/common.py, read by its path (see there why).
_COMMON = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "common.py"))


def _t5(d_model, d_kv, num_heads, d_ff, num_layers, num_decoder_layers=0):
  """A T5 v1.1 shape; `num_decoder_layers` 0: as many as `num_layers` (the encoder's)."""
  return ml_collections.ConfigDict(dict(d_model=d_model, d_kv=d_kv, num_heads=num_heads,
                                        d_ff=d_ff, num_layers=num_layers,
                                        num_decoder_layers=num_decoder_layers))


_train = functools.partial(_COMMON["train"], checkpoints=6, evals=3, distill_weight=0.0)


def get_config(preset: str = "quick") -> ml_collections.ConfigDict:
  c = _COMMON["paper_run"](preset, "leviathan")

  c.data = ml_collections.ConfigDict()
  c.data.cache_dir = "data_cache"     # shared by runs; never committed
  c.data.translate_source = ""       # "" = Debian gettext catalogs; or jsonl:/tsv:/tfds
  c.data.summarize_source = ""       # "" = Debian package descriptions; or jsonl:/tsv:/tfds
  c.data.translate_task = ""          # "" = translate_en_de (Debian catalogs); paper: WMT14
  # The description's lead sentence(s) from the rest of it (XSum's construction; references
  # of ~27 words); paper: cnn_dailymail.
  c.data.summarize_task = "summarize_debian_lead"
  c.data.max_packages = 100           # extra Debian packages to download for catalogs (~30 s)
  # Full sentences (capitalised, final punctuation, no markup) of >= 16 German words, as the
  # paper's WMT sentences are, not the catalogs' short UI strings.
  c.data.translate_sentences_only = True
  c.data.translate_min_target_words = 16
  c.data.apt_update = True            # fetch apt's English descriptions if missing
  c.data.vocab_size = 4096
  c.data.spm_sentences = 200_000
  c.data.input_len = 96               # encoder tokens (longer inputs are truncated)
  c.data.target_len = 48

  c.models = ml_collections.ConfigDict()
  c.models.source = "train"           # "train": trained here; "hf": local checkpoints (paper)
  c.models.target_dir = ""            # source "hf": transformers-format T5 directories
  c.models.draft_dirs = ml_collections.ConfigDict(dict(small="", base="", large=""))
  c.models.tokenizer_dir = ""         # "" = the target's directory (its spiece.model)
  c.models.draft_sharded = False      # False: drafts replicated on every device
  # A 384-wide, 6-head target trained unstably here (loss stuck near 5.6 at lr 1e-3,
  # diverging at 2e-3); this 256-wide, 8-head shape trains well at 2e-3.
  c.models.target = _t5(256, 32, 8, 768, 4)      # ~10M with a 4096 vocab ("XXL")
  c.models.drafts = ml_collections.ConfigDict()
  c.models.drafts.small = _t5(16, 8, 2, 32, 1)   # ~0.14M (1 : 70; paper 1 : 140)
  c.models.drafts.base = _t5(32, 16, 2, 64, 1)   # ~0.29M (1 : 35; paper 1 : 44)
  c.models.drafts.large = _t5(96, 24, 4, 256, 2)  # ~1.3M (1 : 8; paper 1 : 14)

  c.train = ml_collections.ConfigDict()
  c.train.target = _train(2400, 16, 2e-3, 200)
  c.train.draft = _train(800, 16, 3e-3, 80, distill_weight=0.5)

  c.eval = ml_collections.ConfigDict()
  c.eval.num_prompts = 100
  c.eval.gammas = list(range(1, 9))
  # Also a gamma="auto" cell per draft (γ chosen per iteration from {0, 1, 2, 4, 8}).
  c.eval.auto = True
  c.eval.auto_cells = ["auto", "auto_series"]   # each call on its own; the prompts as a series
  c.eval.temperatures = [0.0, 1.0]
  c.eval.drafts = ["small", "base", "large"]
  c.eval.translate_prompt_len = 64
  c.eval.summarize_prompt_len = 96
  c.eval.translate_max_new = 48
  c.eval.summarize_max_new = 32
  c.eval.chunk = 25                   # prompts per resumable measurement chunk
  c.eval.repeats = 1                  # timings per call (the median is kept)
  c.eval.ngram_max_examples = 0       # training examples per task for the n-gram drafts (0: all)

  if preset == "full":
    pass
  elif preset == "quick":
    c.data.vocab_size = 4096
    c.data.spm_sentences = 60_000
    c.data.input_len = 96
    c.data.target_len = 64
    # The paper's regime on a CPU: a decode step that streams its weights from DRAM. The
    # decoder and head (23M float32 = 92 MB, ~3x a 32 MB last-level cache) are what a step
    # reads; the encoder runs once per prompt, so it is kept shallow (2 layers) to spend the
    # training budget where decoding reads.
    c.models.target = _t5(512, 64, 8, 2048, 2, num_decoder_layers=4)      # 33.6M
    c.models.drafts.small = _t5(128, 32, 4, 256, 1)                       # 1.4M
    c.models.drafts.base = _t5(192, 32, 6, 512, 1, num_decoder_layers=2)   # 3.2M
    c.models.drafts.large = _t5(256, 32, 8, 1024, 2)                      # 6.8M
    # Adam at 2e-3 let this target's gradient norm grow 5x and its loss stall (T5 folds the
    # attention scale into q's init, so large steps grow the logits); 1e-3 trains steadily.
    c.train.target = _train(240, 16, 1e-3, 20, log_every=20)
    # Drafts see no more steps than the target: at equal steps the larger model is the better
    # one here, as after full training in the paper (not distilled, as the paper's drafts).
    c.train.draft = _train(200, 16, 3e-3, 20, distill_weight=0.0, log_every=50)
    c.eval.num_prompts = 32
    c.eval.gammas = [3, 6]
    c.eval.auto_cells = ["auto"]
    # One prompt bucket and output length for both tasks: one compilation each.
    c.eval.translate_prompt_len = 96
    c.eval.summarize_prompt_len = 96
    c.eval.translate_max_new = 64
    c.eval.summarize_max_new = 64
    c.eval.chunk = 32
    c.eval.repeats = 1
  elif preset == "micro":
    c.data.apt_update = False
    c.data.summarize_task = "summarize_debian"   # the sources given on the command line, as is
    c.data.vocab_size = 64
    c.data.spm_sentences = 5_000
    c.data.input_len = 32
    c.data.target_len = 16
    c.models.target = _t5(32, 8, 4, 64, 1)
    c.models.drafts.small = _t5(8, 4, 2, 16, 1)
    c.models.drafts.base = _t5(8, 4, 2, 16, 1)
    c.models.drafts.large = _t5(16, 4, 2, 32, 1)
    c.train.target = _train(20, 8, 3e-3, 5, log_every=10)
    c.train.draft = _train(10, 8, 3e-3, 2, distill_weight=0.5, log_every=10)
    c.eval.num_prompts = 3
    c.eval.gammas = [2]
    c.eval.auto = False   # CI's end-to-end run: auto's calibrations would double it
    c.eval.drafts = ["small", "large"]
    c.eval.translate_prompt_len = 32
    c.eval.summarize_prompt_len = 32
    c.eval.translate_max_new = 8
    c.eval.summarize_max_new = 8
    c.eval.chunk = 3
  elif preset == "paper":
    # Leviathan et al.'s setting on the real checkpoints: T5-XXL v1.1 target, T5-small /
    # base / large drafts (same vocabulary), WMT14 EN-DE and CNN/DM, batch 1, T in {0, 1}.
    _COMMON["paper_checkpoints"](c, "t5-v1_1-xxl", dict(
        small="t5-v1_1-small", base="t5-v1_1-base", large="t5-v1_1-large"))
    c.data.translate_task = "wmt14_translate/de-en"
    c.data.summarize_task = "cnn_dailymail"
    c.data.translate_source = "tfds"    # or jsonl:PATH with en / de fields
    c.data.summarize_source = "tfds"    # or jsonl:PATH with article / highlights fields
    c.eval.num_prompts = 500
    c.eval.gammas = [1, 2, 3, 5, 7]     # Table 2's best γ are 3, 5 and 7
    c.eval.translate_prompt_len = 256
    c.eval.summarize_prompt_len = 1024
    c.eval.translate_max_new = 128
    c.eval.summarize_max_new = 128
    c.eval.chunk = 50
    c.eval.ngram_max_examples = 100_000
  elif preset != "full":
    raise ValueError(f"unknown preset {preset!r}; known: quick, full, micro, paper")
  return c
