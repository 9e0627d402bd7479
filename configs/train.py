"""Training presets for `experiments/train.py` (see `experiments.programs.runner`).

Run:
  python experiments/train.py --config=configs/train.py:tiny --workdir=/tmp/train_tiny
  python experiments/train.py --config=configs/train.py:summarize-draft --workdir=/tmp/sum_draft
  python experiments/train.py --config=configs/train.py:translate-t5-draft \
      --workdir=/tmp/t5_draft --config.train.steps=2000 --config.eval.bleu=True
  # Distil a draft from a trained target (its <workdir>/final):
  python experiments/train.py --config=configs/train.py:summarize-draft --workdir=/tmp/sum_distil \
      --config.teacher.path=/tmp/sum_target/final --config.train.distill_weight=0.5

Killed and restarted with the same command, a run resumes from its last
checkpoint and ends with the same parameters (a damaged checkpoint is set aside
and the one before used). A NaN / infinite loss or gradient norm stops the run
by name with its good checkpoints kept (`--config.train.on_nonfinite=stop`, the
default); `--config.train.on_nonfinite=skip_step` drops such updates instead
(`--config.train.max_skipped_steps` in a row still stop it). Data: build the tasks first
(`python -m experiments.data.build --task=... --cache_dir=/tmp/specjax_data
--spm_vocab_size=8000`) and point `data.tokenizer` at the vocabulary.

Presets: tiny, tiny-t5 (synthetic, seconds); summarize-draft / summarize-target
(decoder, Debian descriptions, XSum-like); code-draft (decoder, packed stdlib);
chen-draft (decoder, 0.7 summarize + 0.3 code); translate-t5-draft /
translate-t5-target (T5, EN-DE gettext pairs).
"""

import ml_collections

from specjax.training.config import default_config

_VOCAB = "/tmp/specjax_data/vocab/spm8000_translate_en_de+summarize_debian/spiece.model"


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.model = ml_collections.ConfigDict()
  c.model.kind = "decoder"          # "decoder" | "t5"
  c.model.name = "cpu-draft-1m"     # a DECODER_CONFIGS / T5_CONFIGS name
  c.model.overrides = ml_collections.ConfigDict()  # fields replaced (vocab_size: the tokenizer's)
  c.model.init_from = ""            # a save_params directory to start from

  c.teacher = ml_collections.ConfigDict()
  c.teacher.path = ""               # a save_params directory (e.g. a target's <workdir>/final)

  c.data = ml_collections.ConfigDict()
  c.data.tasks = "summarize_debian"  # a task, or "a:0.7,b:0.3"
  c.data.cache_dir = "/tmp/specjax_data"
  c.data.tokenizer = _VOCAB
  c.data.seq_len = 128              # decoder: T
  c.data.packing = "documents"      # decoder: pack "none" | "documents" (code) | "all" tasks
  c.data.input_len = 128            # t5: encoder length P
  c.data.target_len = 64            # t5: target length T
  c.data.overlong = "truncate"      # "truncate" | "drop"
  c.data.prompt_template = ""       # "" = the task's default
  c.data.target_template = ""       # "" = "{targets}" ("{inputs}" for code)
  c.data.max_train_examples = 0     # 0 = all
  c.data.synthetic_examples = 4096
  c.data.synthetic_min_len = 2
  c.data.synthetic_max_len = 12

  c.train = default_config()
  c.train.steps = 2000
  c.train.batch_size = 16
  c.train.learning_rate = 1e-3
  c.train.warmup_steps = 100
  c.train.log_every = 50
  c.train.eval_every = 500
  c.train.checkpoint_every = 250

  c.eval = ml_collections.ConfigDict()
  c.eval.split = "validation"
  c.eval.bleu = False               # sacrebleu on greedy decodes (translation)
  c.eval.rouge = False              # rouge-score on greedy decodes (summaries)
  c.eval.num_examples = 64
  c.eval.max_new_tokens = 48
  c.eval.batch_size = 16

  if arg in ("tiny", "tiny-t5"):   # synthetic sequences reversed, a 32-token vocabulary
    c.model.overrides.vocab_size = 32
    c.data.tasks = "synthetic_reverse"
    c.train.steps = 200
    c.train.learning_rate = 3e-3
    c.train.warmup_steps = 20
    c.train.log_every = 20
    c.train.eval_every = 100
    c.train.checkpoint_every = 50
    c.train.eval_batches = 2
    if arg == "tiny":
      c.model.name = "tiny"
      c.data.seq_len = 32
    else:
      c.model.kind = "t5"
      c.model.name = "t5-tiny"
      c.data.input_len = 16
      c.data.target_len = 16
  elif arg == "summarize-draft":
    c.eval.rouge = True
  elif arg == "summarize-target":
    c.model.name = "cpu-target-27m"
    c.train.learning_rate = 5e-4
    c.eval.rouge = True
  elif arg == "code-draft":
    c.data.tasks = "code_python"
  elif arg == "chen-draft":
    c.data.tasks = "summarize_debian:0.7,code_python:0.3"
    c.eval.rouge = True
  elif arg in ("translate-t5-draft", "translate-t5-target"):
    c.model.kind = "t5"
    c.model.name = "t5-cpu-draft" if arg.endswith("draft") else "t5-cpu-target"
    c.data.tasks = "translate_en_de"
    c.data.input_len = 64
    c.data.target_len = 64
    c.eval.bleu = True
    if arg.endswith("target"):
      c.train.learning_rate = 5e-4
  else:
    raise ValueError(
        f"unknown train preset {arg!r}; known: tiny, tiny-t5, summarize-draft, summarize-target, "
        "code-draft, chen-draft, translate-t5-draft, translate-t5-target")
  return c
