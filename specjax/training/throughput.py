"""Training throughput of a model on this machine (for sizing reproductions).

  python -m specjax.training.throughput --sizes=decoder:cpu-draft-1m,t5:t5-cpu-draft

times the jitted train step (AdamW, float32, no teacher unless asked) on
random full-length batches: compile time, then the median of `repeats`
timings of `steps` chained steps (one host sync per timing). Positions/s
counts decoder positions (B * T); tokens/s for a seq2seq model also counts
the encoder positions (B * (P + T)). The load average is read before and
after, since the machine may be shared.
"""

from __future__ import annotations

import os
import statistics
import time

import jax
import numpy as np

from specjax.training import optim
from specjax.training.steps import StepSpec, init_params, init_state, train_step

__all__ = ["measure_train_throughput", "random_batch"]


def random_batch(model, batch_size: int, seq_len: int, input_len: int = 0, seed: int = 0) -> dict:
  """A full-length batch of random ids (no padding) in the model's layout."""
  rng = np.random.default_rng(seed)
  v = model.vocab_size
  if input_len:
    targets = rng.integers(2, v, (batch_size, seq_len), dtype=np.int32)
    dec = np.concatenate([np.zeros((batch_size, 1), np.int32), targets[:, :-1]], 1)
    return {"inputs": rng.integers(2, v, (batch_size, input_len), dtype=np.int32),
            "input_lengths": np.full((batch_size,), input_len, np.int32),
            "decoder_inputs": dec, "targets": targets,
            "loss_mask": np.ones((batch_size, seq_len), np.float32)}
  seq = rng.integers(2, v, (batch_size, seq_len + 1), dtype=np.int32)
  return {"tokens": seq[:, :-1], "targets": seq[:, 1:],
          "loss_mask": np.ones((batch_size, seq_len), np.float32)}


def measure_train_throughput(model, batch_size: int = 16, seq_len: int = 128, input_len: int = 0,
                             steps: int = 5, repeats: int = 3, teacher=None,
                             optimizer: str = "adamw") -> dict:
  """Times the train step; see the module doc. `teacher`: (model, params)."""
  spec = StepSpec(model=model, optimizer=optim.OptimizerSpec(optimizer=optimizer),
                  teacher=None if teacher is None else teacher[0],
                  distill_weight=0.5 if teacher is not None else 0.0)
  params = init_params(model, 0)
  n_params = sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
  state = init_state(spec, params, 0)
  batch = jax.device_put(random_batch(model, batch_size, seq_len, input_len))
  fn = train_step(spec)
  t_params = None if teacher is None else teacher[1]
  load_before = os.getloadavg()[0]
  t0 = time.perf_counter()
  state, m = fn(state, batch, t_params)
  jax.block_until_ready(m)
  compile_s = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(steps):
      state, m = fn(state, batch, t_params)
    jax.block_until_ready(m)
    times.append((time.perf_counter() - t0) / steps)
  step_s = statistics.median(times)
  positions = batch_size * seq_len
  return {"params": n_params, "batch_size": batch_size, "seq_len": seq_len,
          "input_len": input_len, "compile_s": compile_s, "step_s": step_s,
          "steps_per_s": 1.0 / step_s, "positions_per_s": positions / step_s,
          "tokens_per_s": batch_size * (seq_len + input_len) / step_s,
          "loadavg_1m": [load_before, os.getloadavg()[0]]}


def _main(argv):
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  from specjax.training.runner import build_model  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  for item in f.sizes.split(","):
    kind, name = item.split(":")
    overrides = {"vocab_size": f.vocab_size}
    for kv in filter(None, f.overrides.split(";")):
      k, v = kv.split("=")
      overrides[k] = int(v)
    model = build_model(kind, name, overrides)
    r = measure_train_throughput(model, f.batch_size, f.seq_len,
                                 f.input_len if kind == "t5" else 0, f.steps, f.repeats)
    print(f"{kind}:{name} {r['params'] / 1e6:.2f}M | B {f.batch_size} T {f.seq_len}"
          f"{' P ' + str(f.input_len) if kind == 't5' else ''} | step {r['step_s'] * 1e3:.0f} ms"
          f" | {r['positions_per_s']:.0f} pos/s, {r['tokens_per_s']:.0f} tok/s"
          f" | compile {r['compile_s']:.1f}s | load {r['loadavg_1m'][0]:.2f}->"
          f"{r['loadavg_1m'][1]:.2f}", flush=True)


if __name__ == "__main__":
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string("sizes", "decoder:cpu-draft-1m", "kind:name,...")
  flags.DEFINE_string("overrides", "", "k=v;k=v integer config overrides for every model")
  flags.DEFINE_integer("vocab_size", 8192, "vocabulary size")
  flags.DEFINE_integer("batch_size", 16, "B")
  flags.DEFINE_integer("seq_len", 128, "T (decoder positions)")
  flags.DEFINE_integer("input_len", 128, "P (T5 encoder positions)")
  flags.DEFINE_integer("steps", 5, "steps per timing")
  flags.DEFINE_integer("repeats", 3, "timings (median)")
  app.run(_main)
