"""Training: deterministic batching, optax optimizers, distillation, exact resume.

  from specjax import training
  source = training.LMSource(training.lm_examples(records, tok, "{inputs} Summary:"), seq_len=128)
  config = training.default_config(); config.steps = 2000
  params = training.train_model(model, None, source, config, "/tmp/run")

The modules (`batching`, `optim`, `steps`, `checkpoint`, `loop`, `mesh`, `parallel`, `quality`,
`nonfinite`, `rewind`) are described in docs/training.md. The errors a run can stop with:
`NonFiniteTrainingError` (a FloatingPointError: a NaN / infinite loss, gradient norm or state,
raised before anything is written or rotated) and `CheckpointWriteError` (an OSError carrying
the cause's errno: a step checkpoint could not be written; the earlier ones are untouched).
"""

from specjax.training.batching import (EOS_ID, Example, LMSource, Mixture, PAD_ID, Seq2SeqSource,
                                       Source, SourceStats, as_mixture, eval_batches, lm_examples,
                                       seq2seq_examples, synthetic_examples)
from specjax.training.checkpoint import CheckpointWriteError
from specjax.training.config import default_config, validate_config
from specjax.training.loop import evaluate_loss, train_model
from specjax.training.nonfinite import ON_NONFINITE, NonFiniteTrainingError
from specjax.training.optim import OptimizerSpec, make_optimizer, make_schedule
from specjax.training.parallel import ParallelObjective, parallel_logits
from specjax.training.steps import StepSpec, TrainState, model_logits, token_losses

__all__ = [
    "EOS_ID", "Example", "LMSource", "Mixture", "PAD_ID", "Seq2SeqSource", "Source",
    "SourceStats", "as_mixture", "eval_batches", "lm_examples", "seq2seq_examples",
    "synthetic_examples", "default_config", "validate_config", "evaluate_loss", "train_model",
    "OptimizerSpec", "make_optimizer", "make_schedule", "StepSpec", "TrainState",
    "model_logits", "token_losses", "ParallelObjective", "parallel_logits",
    "NonFiniteTrainingError", "CheckpointWriteError", "ON_NONFINITE",
]
