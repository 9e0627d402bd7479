"""Training: deterministic batching, optax optimizers, distillation, exact resume.

  from specjax import training
  source = training.LMSource(training.lm_examples(records, tok, "{inputs} Summary:"), seq_len=128)
  config = training.default_config(); config.steps = 2000
  params = training.train_model(model, None, source, config, "/tmp/run")

Modules: `batching` (examples → fixed-shape batches, a pure function of
(seed, step)), `optim` (schedules, AdamW / Adafactor), `steps` (losses, jitted
train / eval steps), `checkpoint` (orbax train-state checkpoints, atomic final
params), `loop` (`train_model`), `mesh` (the step over a data x model device
mesh: `config.mesh_data`, `config.mesh_model`), `parallel` (PARD's mask-slot
objective: `config.parallel_slots`), `quality` (BLEU / ROUGE from
greedy decodes). The standalone job behind `experiments/train.py` is
`experiments.programs.runner`.
"""

from specjax.training.batching import (EOS_ID, Example, LMSource, Mixture, PAD_ID, Seq2SeqSource,
                                       Source, SourceStats, as_mixture, eval_batches, lm_examples,
                                       seq2seq_examples, synthetic_examples)
from specjax.training.config import default_config, validate_config
from specjax.training.loop import evaluate_loss, train_model
from specjax.training.optim import OptimizerSpec, make_optimizer, make_schedule
from specjax.training.parallel import ParallelObjective, parallel_logits
from specjax.training.steps import StepSpec, TrainState, model_logits, token_losses

__all__ = [
    "EOS_ID", "Example", "LMSource", "Mixture", "PAD_ID", "Seq2SeqSource", "Source",
    "SourceStats", "as_mixture", "eval_batches", "lm_examples", "seq2seq_examples",
    "synthetic_examples", "default_config", "validate_config", "evaluate_loss", "train_model",
    "OptimizerSpec", "make_optimizer", "make_schedule", "StepSpec", "TrainState",
    "model_logits", "token_losses", "ParallelObjective", "parallel_logits",
]
