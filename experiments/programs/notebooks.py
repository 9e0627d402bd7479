"""Helpers the `colab/` notebooks call, so their cells stay short.

* `runtime()`: what JAX runs on here (TPU / GPU / CPU) and how big a preset
  it can take, `runtime_summary(rt)` that as lines for the notebook (with how
  to switch a Colab CPU runtime to a TPU); `smoke()`: whether the smallest
  settings are forced (`SPECJAX_NOTEBOOK_SMOKE=1`, what CI sets when it
  executes the notebooks); `in_colab()`;
* `show_progress()`: absl INFO lines (training steps, `Progress` ETAs) in the
  running cell, outside `app.run`;
* `workdir(name, root)`: a run's folder under a Drive / `gs://` root, else a
  local scratch folder (`scratch(name)`); `drive_mount()`, `drive_root()`,
  `on_drive(path)`: where Colab mounts Google Drive and the notebooks' folder
  on it; `data_cache(workdir)`: where a run's data cache goes (in the run
  folder, so it outlives the runtime, except on `gs://`: see there);
* `tiny_trained_pair(steps)`: a target and a draft trained in seconds on a
  synthetic copy task (the draft accepts, unlike a random pair);
* `exact_second_token(...)`: the target's exact distribution of the second
  generated token, to hold sampled histograms against;
* `write_sample_tasks(root)`: small local task files (EN→DE-like pairs,
  description → synopsis pairs, a few standard-library modules) for the
  reproductions' micro presets when the real data is not built.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from typing import Dict

import jax
import jax.numpy as jnp
import numpy as np
from specjax import training as tr
from experiments.data import code as code_lib
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.sampling import process_logits

__all__ = ["runtime", "runtime_summary", "smoke", "in_colab", "show_progress", "scratch",
           "workdir", "drive_mount", "drive_root", "on_drive", "data_cache", "tiny_trained_pair",
           "exact_second_token", "write_sample_tasks"]


def smoke() -> bool:
  """True when `SPECJAX_NOTEBOOK_SMOKE=1`: every notebook uses its smallest settings."""
  return os.environ.get("SPECJAX_NOTEBOOK_SMOKE", "") == "1"


def in_colab() -> bool:
  """True inside a Google Colab runtime (`google.colab` is importable)."""
  if "google.colab" in sys.modules:
    return True
  try:
    import google.colab  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True


def show_progress() -> None:
  """Shows absl INFO lines (training steps, `common.Progress` ETAs, stage
  reuse) in the running notebook cell, as `app.run` would in a script: INFO
  verbosity, and absl's handler on the root logger. Before absl's flags are
  parsed (a notebook never parses them) that handler writes each record to
  the current `sys.stderr`, which in a kernel is the executing cell's."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logging.use_absl_handler()
  absl_logging.set_verbosity(absl_logging.INFO)
  handler = absl_logging.get_absl_handler()
  handler.python_handler.stream = sys.stderr  # used once the flags are parsed


def scratch(name: str) -> str:
  """A local working folder for notebook `name`: under
  `$SPECJAX_NOTEBOOK_WORKDIR` when set (CI points it at a fresh folder),
  else under the system's temporary directory."""
  root = os.environ.get("SPECJAX_NOTEBOOK_WORKDIR") or tempfile.gettempdir()
  return os.path.join(root, f"specjax_nb_{name}")


def runtime() -> Dict[str, object]:
  """{"backend", "devices", "kind", "large"}: large is True on TPU / GPU
  (the notebooks then offer the bigger presets) unless `smoke()`."""
  devs = jax.devices()
  backend = jax.default_backend()
  return {"backend": backend, "devices": len(devs), "kind": devs[0].device_kind,
          "large": backend in ("tpu", "gpu") and not smoke()}


def workdir(name: str, root: str = "") -> str:
  """Notebook `name`'s run folder: `<root>/<name>` when `root` is set (a
  mounted Google Drive folder or a `gs://` bucket, which outlive the runtime:
  a rerun resumes from its finished stages), else `scratch(name)`."""
  if not root:
    return scratch(name)
  return root.rstrip("/") + "/" + name


def drive_mount() -> str:
  """Where Colab mounts Google Drive: /content/drive (`$SPECJAX_NOTEBOOK_DRIVE`
  when set: the tests of the Colab cells point it at a temporary folder)."""
  return os.environ.get("SPECJAX_NOTEBOOK_DRIVE") or "/content/drive"


def drive_root() -> str:
  """The notebooks' root folder on a mounted Drive: <mount>/MyDrive/specjax."""
  return drive_mount().rstrip("/") + "/MyDrive/specjax"


def on_drive(path: str) -> bool:
  """True when `path` lies on the mounted Google Drive (under `drive_mount()`)."""
  mount = drive_mount().rstrip("/")
  return path == mount or path.startswith(mount + "/")


def data_cache(workdir: str) -> str:
  """Where a run in `workdir` keeps its data cache (`cfg.data.cache_dir`):
  `<workdir>/data_cache`, so on Drive it outlives the runtime and a rerun
  after a disconnect reuses it instead of rebuilding it. On `gs://` a local
  folder (`scratch("data_cache")`) instead: the data builders
  (`experiments.data`) read and write local files only, so there a new
  runtime rebuilds the cache (the run's stages on `gs://` are kept)."""
  if workdir.startswith("gs://"):
    return scratch("data_cache")
  return os.path.join(workdir, "data_cache")


def runtime_summary(rt: Dict[str, object]) -> str:
  """What `runtime()` found, as the notebook prints it; on a CPU runtime in
  Colab, how to switch to a TPU (the CPU presets still run)."""
  lines = [f"JAX {jax.__version__} on {rt['backend']}: {rt['devices']} x {rt['kind']}"
           + (" — larger presets available" if rt["large"] else " — smallest settings")]
  if rt["backend"] == "cpu" and in_colab():
    lines.append("This Colab runtime has no accelerator: Runtime → Change runtime type → TPU "
                 "(then rerun from the top) for the larger presets. The CPU presets still run "
                 "here, only slower.")
  return "\n".join(lines)


def tiny_trained_pair(steps: int = 60, workdir: str = "", seed: int = 0):
  """((target, params), (draft, params)) trained on a synthetic copy task:
  a 2-layer target and a 1-layer draft distilled from it (vocabulary 32),
  in `workdir` (default: a scratch folder per `steps` and `seed`, which a
  second call reuses)."""
  vocab = 32
  target = DecoderLM(decoder_config("tiny", vocab_size=vocab, num_layers=2, d_model=64,
                                    num_heads=4, num_kv_heads=4, head_dim=16, mlp_dim=128))
  draft = DecoderLM(decoder_config("tiny", vocab_size=vocab, num_layers=1, d_model=32,
                                   num_heads=2, num_kv_heads=2, head_dim=16, mlp_dim=64))
  ex = tr.synthetic_examples("copy", 512, vocab, 3, 8, seed=seed)
  ex = [tr.Example(np.append(e.prompt, tr.EOS_ID), e.target) for e in ex]
  source = tr.LMSource(ex, 24)

  def config(n, distill=0.0):
    c = tr.default_config()
    c.steps, c.batch_size, c.learning_rate, c.warmup_steps = n, 16, 3e-3, max(n // 10, 1)
    c.checkpoint_every, c.log_every, c.eval_every, c.eval_batches = n, max(n // 2, 1), 0, 0
    c.distill_weight = distill
    return c
  # Finished runs are reused (train_model resumes, here from the last step): the
  # notebooks that train the same pair share it.
  workdir = workdir or scratch(f"pair_steps{steps}_seed{seed}")
  tp = tr.train_model(target, None, source, config(steps), os.path.join(workdir, "target"))
  dp = tr.train_model(draft, None, source, config(steps, 0.5), os.path.join(workdir, "draft"),
                      teacher=(target, tp))
  return (target, tp), (draft, dp)


def exact_second_token(target, params, prompt, sampling) -> np.ndarray:
  """P(second generated token) `[V]` of the processed target after `prompt`:
  Σ_t1 q(t1 | prompt) q(t2 | prompt, t1), the target run on every t1."""
  v = target.vocab_size
  seqs = np.concatenate([np.tile(np.asarray(prompt, np.int32), (v, 1)),
                         np.arange(v, dtype=np.int32)[:, None]], axis=1)
  q = np.asarray(process_logits(jax.jit(target.forward)(params, jnp.asarray(seqs)), sampling),
                 np.float64)
  first = q[0, len(prompt) - 1]
  return (first[:, None] * q[:, len(prompt)]).sum(axis=0)


_WORDS = ("the file could not be opened save open close window new folder print error message "
          "directory package provides library reading writing support").split()


def write_sample_tasks(root: str) -> Dict[str, str]:
  """Writes small local task files under `root`; returns config overrides
  ({"translate": jsonl source, "summarize": ..., "code": dir source,
  "summarize_chen": ...}) for the micro presets."""
  os.makedirs(root, exist_ok=True)
  rng = random.Random(0)
  for split, n in (("train", 240), ("validation", 24), ("test", 24)):
    with open(os.path.join(root, f"tr_{split}.jsonl"), "w", encoding="utf-8") as f:
      for i in range(n):
        s = [rng.choice(_WORDS) for _ in range(rng.randint(2, 6))]
        f.write(json.dumps({"en": " ".join(s) + f" {i}", "de": " ".join(w[::-1] for w in s)})
                + "\n")
    with open(os.path.join(root, f"su_{split}.jsonl"), "w", encoding="utf-8") as f:
      for i in range(n):
        s = [rng.choice(_WORDS) for _ in range(rng.randint(10, 18))]
        f.write(json.dumps({"document": " ".join(s) + f" {i}.", "summary": " ".join(s[:4])})
                + "\n")
  with open(os.path.join(root, "summ.jsonl"), "w", encoding="utf-8") as f:
    for split, n in (("train", 200), ("validation", 20), ("test", 20)):
      for i in range(n):
        s = [rng.choice(_WORDS) for _ in range(rng.randint(10, 20))]
        f.write(json.dumps({"document": " ".join(s) + f" {i}.", "summary": " ".join(s[:4]),
                            "split": split}) + "\n")
  code_dir = os.path.join(root, "code")
  os.makedirs(code_dir, exist_ok=True)
  for name in ("colorsys.py", "bisect.py", "keyword.py", "fnmatch.py", "this.py", "stat.py",
               "glob.py", "shlex.py"):
    shutil.copy(os.path.join(code_lib.stdlib_dir(), name), os.path.join(code_dir, name))
  return {"translate": f"jsonl:{root}/tr_{{split}}.jsonl",
          "summarize": f"jsonl:{root}/su_{{split}}.jsonl",
          "summarize_chen": f"jsonl:{root}/summ.jsonl", "code": f"dir:{code_dir}"}
