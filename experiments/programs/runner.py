"""The standalone training job behind `experiments/train.py`.

`run(config, workdir)` builds everything from an experiment config
(`configs/train.py`): the tokenizer, the model (kind + named size +
overrides; vocab_size from the tokenizer), the training rows from built tasks
(`experiments.data.load_task`) or a synthetic task, an optional frozen teacher
(a `save_params` directory) for distillation, then calls `train_model` and,
behind `config.eval.bleu` / `config.eval.rouge`, scores greedy decodes of a
validation sample. Results go to `<workdir>/quality.json`.

Row formats per model kind:

  * t5: seq2seq, encoder input `input_template` (default: T5's task prefix),
    target "{targets}";
  * decoder: "prompt + target" (`prompt_template`, default per task, e.g.
    "{inputs} Summary:"), padded one per row; or documents for
    `DOCUMENT_TASKS` (code): "{inputs}" with EOS, packed (`data.packing`:
    "documents" packs document tasks only, "all" every task, "none" none).

`data.tasks` is one task or a weighted mixture "summarize_debian:0.7,code_python:0.3".
Synthetic tasks ("synthetic_copy", "synthetic_reverse", "synthetic_sorted")
need no tokenizer or cache (ids below the model's vocab_size).
"""

from __future__ import annotations

import os
from typing import Any

import jax
from absl import logging

from specjax import atomic_io
from specjax.checkpoints.orbax_io import restore_params
from experiments.data import load_task
from specjax.models.decoder import DecoderConfig, DecoderLM, decoder_config
from specjax.models.t5 import T5, t5_config
from specjax.tokenizers.sentencepiece import SentencePieceTokenizer
from specjax.training import batching
from specjax.training.config import validate_config
from specjax.training.loop import train_model
from specjax.training.quality import generation_quality

__all__ = ["run", "build_model", "parse_tasks", "templates_for", "DOCUMENT_TASKS"]

DOCUMENT_TASKS = ("code_python",)
SYNTHETIC_PREFIX = "synthetic_"

# (T5 encoder input, decoder-only prompt) per task; targets are "{targets}".
_TEMPLATES = {
    "translate_en_de": ("translate English to German: {inputs}", "English: {inputs} German:"),
    "wmt14_translate/de-en": ("translate English to German: {inputs}",
                              "English: {inputs} German:"),
    "summarize_debian": ("summarize: {inputs}", "{inputs} Summary:"),
    "xsum": ("summarize: {inputs}", "{inputs} Summary:"),
    "cnn_dailymail": ("summarize: {inputs}", "{inputs} Summary:"),
    "humaneval": ("{inputs}", "{inputs}"),
}


def parse_tasks(spec: str) -> list[tuple[str, float]]:
  """"a:0.7,b:0.3" → [("a", 0.7), ("b", 0.3)]; a bare name has weight 1."""
  out = []
  for part in [p.strip() for p in spec.split(",") if p.strip()]:
    name, sep, weight = part.rpartition(":") if ":" in part else (part, "", "1")
    if not sep:
      name = part
    try:
      w = float(weight)
    except ValueError:
      raise ValueError(f"config.data.tasks: bad weight {weight!r} in {part!r}") from None
    out.append((name, w))
  if not out:
    raise ValueError("config.data.tasks is empty")
  return out


def templates_for(task: str, kind: str, data_config) -> tuple[str, str]:
  """(prompt / input template, target template) for a task and model kind."""
  target = data_config.target_template or "{targets}"
  if data_config.prompt_template:
    return data_config.prompt_template, target
  if kind == "decoder" and task in DOCUMENT_TASKS:
    return "", data_config.target_template or "{inputs}"
  t5_input, lm_prompt = _TEMPLATES.get(task, ("{inputs}", "{inputs}"))
  return (t5_input if kind == "t5" else lm_prompt), target


def build_model(kind: str, name: str, overrides: dict):
  """A `DecoderLM` or `T5` from a named config with fields replaced."""
  if kind == "decoder":
    return DecoderLM(decoder_config(name, **overrides))
  if kind == "t5":
    return T5(t5_config(name, **overrides))
  raise ValueError(f"config.model.kind must be 'decoder' or 't5', got {kind!r}")


def _model_from_saved(path: str):
  params, cfg = restore_params(path)
  if isinstance(cfg, DecoderConfig):
    return DecoderLM(cfg), params
  return T5(cfg), params


PACKING = ("none", "documents", "all")


def _source(kind: str, task: str, examples, data_config):
  if kind == "t5":
    return batching.Seq2SeqSource(examples, data_config.input_len, data_config.target_len,
                                  overlong=data_config.overlong)
  if data_config.packing not in PACKING:
    raise ValueError(f"config.data.packing must be one of {PACKING}, got "
                     f"{data_config.packing!r}")
  packing = (data_config.packing == "all"
             or (data_config.packing == "documents" and task in DOCUMENT_TASKS))
  return batching.LMSource(examples, data_config.seq_len, packing=packing,
                           overlong=data_config.overlong)


def _examples(task: str, split: str, kind: str, config, tokenizer, vocab_size: int, limit: int):
  d = config.data
  if task.startswith(SYNTHETIC_PREFIX):
    n = limit or d.synthetic_examples
    seed = {"train": 0, "validation": 1, "test": 2}[split] + 1000 * config.train.seed
    ex = batching.synthetic_examples(task[len(SYNTHETIC_PREFIX):], n, vocab_size,
                                     d.synthetic_min_len, d.synthetic_max_len, seed=seed)
    if kind == "decoder":  # Prompt, then a separator (EOS), then the target.
      ex = [batching.Example(list(e.prompt) + [batching.EOS_ID], e.target) for e in ex]
    return ex, None
  records = load_task(task, split, d.cache_dir)
  if limit:
    records = records[:limit]
  prompt_t, target_t = templates_for(task, kind, d)
  if kind == "t5":
    return batching.seq2seq_examples(records, tokenizer, prompt_t, target_t), records
  return batching.lm_examples(records, tokenizer, prompt_t or None, target_t), records


def run(config, workdir: str, stop_at_step: int | None = None) -> dict:
  """Trains (or resumes) the configured model; returns a result summary."""
  validate_config(config.train)  # Fail before loading any data.
  kind = config.model.kind
  tasks = parse_tasks(config.data.tasks)
  synthetic = all(t.startswith(SYNTHETIC_PREFIX) for t, _ in tasks)
  tokenizer = None
  overrides = dict(config.model.overrides)
  if not synthetic:
    tokenizer = SentencePieceTokenizer(config.data.tokenizer)
    overrides.setdefault("vocab_size", tokenizer.vocab_size)
  model = build_model(kind, config.model.name, overrides)
  init_params = None
  if config.model.init_from:
    init_params, _ = restore_params(config.model.init_from, model.config)
  teacher = None
  if config.teacher.path:
    teacher = _model_from_saved(config.teacher.path)
  n_params = sum(x.size for x in jax.tree_util.tree_leaves(
      jax.eval_shape(model.init, jax.random.PRNGKey(0))))
  logging.info("model %s %s: %.2fM params; tasks %s", kind, config.model.name, n_params / 1e6,
               tasks)

  sources, eval_sources, eval_records = [], {}, {}
  for task, weight in tasks:
    ex, _ = _examples(task, "train", kind, config, tokenizer, model.vocab_size,
                      config.data.max_train_examples)
    sources.append((_source(kind, task, ex, config.data), weight))
    if config.train.eval_batches:
      ex, recs = _examples(task, config.eval.split, kind, config, tokenizer, model.vocab_size,
                           config.train.eval_batches * config.train.batch_size)
      if ex:
        eval_sources[task] = _source(kind, task, ex, config.data)
        eval_records[task] = recs
  params = train_model(model, init_params, sources, config.train, workdir, teacher=teacher,
                       eval_dataset=eval_sources or None, stop_at_step=stop_at_step)
  result: dict[str, Any] = {"params": n_params, "workdir": str(atomic_io.as_path(workdir))}
  want = config.eval.bleu or config.eval.rouge
  done = stop_at_step is None or stop_at_step >= config.train.steps
  if want and done and tokenizer is not None:
    for task, recs in eval_records.items():
      recs = (recs or [])[:config.eval.num_examples]
      if not recs:
        continue
      prompt_t, _ = templates_for(task, kind, config.data)
      q = generation_quality(
          model, params, tokenizer, recs, seq2seq=kind == "t5", prompt_template=prompt_t,
          bleu=config.eval.bleu, rouge=config.eval.rouge,
          max_new_tokens=config.eval.max_new_tokens, batch_size=config.eval.batch_size,
          max_prompt_len=config.data.input_len if kind == "t5" else config.data.seq_len)
      logging.info("%s quality: %s", task, {k: v for k, v in q.items() if k != "samples"})
      result[task] = q
    atomic_io.atomic_write_json(os.path.join(workdir, "quality.json"), result, default=str)
  return result
