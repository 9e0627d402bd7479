"""Training entry points (the implementation lives in `specjax.training`).

  from specjax.train import train_model, default_config, LMSource, Seq2SeqSource
  params = train_model(model, None, source, config, workdir, teacher=(target, target_params))

See `specjax.training` for the modules and `experiments/train.py` for the
standalone job.
"""

from specjax.training import *  # noqa: F401,F403
from specjax.training import __all__  # noqa: F401
