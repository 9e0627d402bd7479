"""What the experiment configs share: the decoder shape and training-schedule sections, and the
paper reproductions' (configs/leviathan_t5.py, configs/chen_chinchilla.py) run fields and
`paper` preset placement.

Not a config itself (no get_config). A config reads it by its path,

  _COMMON = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "common.py"))

because `--config=configs/<name>.py` loads the file outside any package (a sibling
import would not resolve), while the tests and notebooks import it as `configs.<name>`.
"""

import ml_collections


def decoder(d_model, num_layers, num_heads, head_dim, mlp_dim, tie_embeddings=False):
  """A `specjax.models.decoder` shape section (multi-head attention: as many KV heads)."""
  return ml_collections.ConfigDict(dict(
      d_model=d_model, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_heads,
      head_dim=head_dim, mlp_dim=mlp_dim, tie_embeddings=tie_embeddings))


def train(steps, batch_size, lr, warmup, *, checkpoints, evals, eval_batches=4, log_every=50,
          **fields):
  """A training section: `steps` steps of `batch_size` rows at peak `lr` after `warmup`
  steps, `checkpoints` checkpoints and `evals` evaluations (`eval_batches` batches each) over
  the run; `fields` (e.g. distill_weight) set after warmup_steps."""
  c = ml_collections.ConfigDict()
  c.steps = steps
  c.batch_size = batch_size
  c.learning_rate = lr
  c.warmup_steps = warmup
  for k, v in fields.items():
    c[k] = v
  c.checkpoint_every = max(steps // checkpoints, 1)
  c.eval_every = max(steps // evals, 1)
  c.eval_batches = eval_batches
  c.log_every = log_every
  return c


def paper_run(preset: str, name: str) -> ml_collections.ConfigDict:
  """A paper reproduction's config before its data / models / train / eval sections: the
  preset, the compile-only fields, `runs/<name>_<preset>` and where it runs."""
  c = ml_collections.ConfigDict()
  c.preset = preset
  # Compile-only run for a TPU slice instead of running (`python -m specjax.aot`):
  # --config.aot_topology=v5e:4x4 compiles every program of this config there and exits.
  c.aot_topology = ""
  c.aot = ml_collections.ConfigDict()
  c.aot.target = ""                   # named shapes for checkpoints not read (paper presets)
  c.aot.drafts = ml_collections.ConfigDict()
  c.workdir = f"runs/{name}_{preset}"
  c.results_dir = ""                  # also copy results here (e.g. results/leviathan_t5)
  c.seed = 0

  # Where it runs (experiments.programs.placement): "DxM" data x model axes or "auto" (the
  # fewest model-axis devices whose memory plan fits); the CPU presets fit one device.
  c.mesh = "1x1"
  c.distributed = False               # True: jax.distributed.initialize() (pods, multi-host)
  c.profile_steps = 0                 # > 0: a jax.profiler trace of that many decode
                                      # iterations in <workdir>/profile (TensorBoard / Perfetto)
  c.dtype = "float32"                 # params + compute of imported checkpoints (paper: bf16)
  return c


def paper_checkpoints(c, target: str, drafts: dict) -> None:
  """The `paper` preset's models: real checkpoints (models.source "hf") in bf16 on the mesh
  that fits ("auto"); `target` / `drafts` ({draft: name}) the named shapes a compile-only run
  uses without reading them."""
  c.models.source = "hf"
  c.mesh = "auto"
  c.dtype = "bfloat16"
  c.aot.target = target
  c.aot.drafts = ml_collections.ConfigDict(drafts)
