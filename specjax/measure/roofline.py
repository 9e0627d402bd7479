"""Memory roofline of a decode / verify step, and the measurements around it.

A decode step at small batch reads every weight it uses once and the KV cache, with little
arithmetic per byte, so its floor is bytes read and written per step / memory bandwidth.
`step_bytes` counts those bytes for `DecoderLM` and `T5` from the config and parameter shapes:

* weights: every parameter a decoder step touches (`decode_reads`);
* KV read: the self-attention cache's keys and values, 2 · L · B · ctx · K · D elements, for the
  valid context ctx (what any implementation must read) and for the whole static buffer S (what
  a static-shape step reads: every slot, masked); T5 adds its cross-attention K/V over the P
  encoder positions;
* KV write: the T new positions, 2 · L · B · T · K · D elements.

Activations and the float32 logits are left out: at the batch sizes where the roofline matters
they are a rounding error next to the weights. `copy_bandwidth` measures the bandwidth with one
large elementwise pass; `random_params` builds random weights on the device (no host copy).
"""

from __future__ import annotations

import math
from typing import Any, Dict

import jax
import jax.numpy as jnp
import numpy as np

from specjax import theory
from specjax.measure.timing import now, step_times, time_call
from specjax.models.decoder import decoder_config, DecoderLM
from specjax.models.t5 import T5, t5_config

__all__ = ["param_shapes", "step_bytes", "copy_bandwidth", "random_params", "roofline_s"]


def param_shapes(model) -> Any:
  """The model's parameter tree as `jax.ShapeDtypeStruct`s (nothing allocated)."""
  return jax.eval_shape(model.init, jax.random.PRNGKey(0))


def _flat(tree) -> Dict[str, Any]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(str(getattr(k, "key", k)) for k in path): leaf for path, leaf in leaves}


def _nbytes(leaf) -> int:
  return int(math.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize


def decode_reads(names, tied: bool) -> str:
  """How one decode step reads the parameter at path `names`: "whole"; "rows" (an untied input
  embedding: a step gathers B·T rows; a tied one is the output layer, read whole); "none" (the
  encoder and the cross-attention key / value kernels, used once by the prefill). The one rule
  for `step_bytes` and `specjax.aot`'s per-device accounting."""
  names = [str(n) for n in names]
  if names and names[0] == "encoder":
    return "none"
  if "cross_attn" in names and len(names) >= 2 and names[-2] in ("k", "v"):
    return "none"
  if names[-1] == "embedding" and not tied:
    return "rows"
  return "whole"


def step_bytes(model, batch: int, tokens: int, context: int, cache_len: int,
               encoder_len: int = 0, shapes: Any = None) -> Dict[str, int]:
  """Bytes one `extend` call of `tokens` tokens per row reads and writes.

  Args:
    model: a `DecoderLM` or `T5`.
    batch: B rows.
    tokens: T tokens fed per row.
    context: valid cache positions before the call (the step attends to context + T).
    cache_len: S, the static buffer's slots.
    encoder_len: P, T5's encoder positions (cross-attention), else ignored.
    shapes: the parameter tree (arrays or ShapeDtypeStructs); default `param_shapes(model)`.

  Returns:
    weights, kv_read (valid context), kv_read_buffer (all S slots; T5's cross K/V in both),
    kv_write, total (weights + kv_read + kv_write), total_buffer (with kv_read_buffer).
  """
  flat = _flat(shapes if shapes is not None else param_shapes(model))
  c = model.config
  cache_item = jnp.dtype(c.dtype).itemsize
  if isinstance(model, T5):
    tied = c.tie_word_embeddings
    layers, kv_heads, head_dim = c.num_decoder_layers, c.num_heads, c.d_kv
    cross = 2 * layers * batch * encoder_len * kv_heads * head_dim * cache_item
  elif isinstance(model, DecoderLM):
    tied = c.tie_embeddings
    layers, kv_heads, head_dim = c.num_layers, c.num_kv_heads, c.head_dim
    cross = 0
  else:
    raise TypeError(f"step_bytes knows DecoderLM and T5, got {type(model).__name__}")
  weights = 0
  for k, x in flat.items():
    how = decode_reads(k.split("/"), tied)
    if how == "whole":
      weights += _nbytes(x)
    elif how == "rows":
      weights += batch * tokens * (_nbytes(x) // x.shape[0])
  per_slot = 2 * layers * batch * kv_heads * head_dim * cache_item
  kv_read = per_slot * (context + tokens) + cross
  kv_read_buffer = per_slot * cache_len + cross
  kv_write = per_slot * tokens
  return {"weights": weights, "kv_read": kv_read, "kv_read_buffer": kv_read_buffer,
          "kv_write": kv_write, "total": weights + kv_read + kv_write,
          "total_buffer": weights + kv_read_buffer + kv_write}


def roofline_s(nbytes: int, bandwidth: float) -> float:
  """Seconds to move `nbytes` at `bandwidth` bytes/s."""
  return nbytes / bandwidth


def copy_bandwidth(nbytes: int = 2 << 30, dtype=jnp.bfloat16,
                   repeats: int = 5) -> Dict[str, float]:
  """Default-device memory bandwidth from `y = x + 1` over `nbytes`: 2 · nbytes / median time."""
  n = nbytes // jnp.dtype(dtype).itemsize
  x = jnp.ones((n,), dtype)
  fn = jax.jit(lambda x: x + jnp.asarray(1, dtype))
  t = time_call(lambda: fn(x), repeats=repeats, warmup=2)
  del x
  moved = 2 * n * jnp.dtype(dtype).itemsize
  return {"bytes_moved": moved, "median_s": t["median_s"], "min_s": t["min_s"],
          "bandwidth": moved / t["median_s"], "peak_bandwidth": moved / t["min_s"]}


def _fill(key, shape, dtype, kind: str):
  if kind == "ones":
    return jnp.ones(shape, dtype)
  std = 1.0 if kind == "embedding" or len(shape) < 2 else shape[0] ** -0.5
  return (jax.random.normal(key, shape, jnp.float32) * std).astype(dtype)


_fill_jit = jax.jit(_fill, static_argnums=(1, 2, 3))


def random_params(model, key: jax.Array, shapes: Any = None) -> Any:
  """Random parameters of the model's shapes and dtypes, leaf by leaf on the default device
  (norm scales 1, embeddings N(0, 1), kernels N(0, 1/fan_in)): for timing, never quality."""
  shapes = shapes if shapes is not None else param_shapes(model)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  out = []
  for i, (path, leaf) in enumerate(leaves):
    name = str(getattr(path[-1], "key", path[-1]))
    kind = "ones" if name == "scale" else "embedding" if name == "embedding" else "normal"
    out.append(_fill_jit(jax.random.fold_in(key, i), tuple(leaf.shape), np.dtype(leaf.dtype), kind))
  return jax.tree_util.tree_unflatten(treedef, out)


# --------------------------------------------------------------------------- GPU benchmark

# Leviathan's T5-XXL with T5-small/base/large drafts (v1.1), a 7B-class decoder with a ~0.5B
# draft; tiny ones for the CPU smoke run.
FAMILIES = {
    "t5": ("t5-v1_1-xxl", {"small": "t5-v1_1-small", "base": "t5-v1_1-base",
                           "large": "t5-v1_1-large"}),
    "decoder": ("llama-7b-like", {"0.5b": "draft-0.5b-like"}),
}
SMOKE_FAMILIES = {
    "t5": ("t5-v1_1-tiny", {"tiny-draft": ("t5-v1_1-tiny", dict(d_model=16, num_heads=2))}),
    "decoder": ("tiny", {"tiny-draft": ("tiny", dict(num_layers=1))}),
}


def build_model(family: str, spec, dtype: str = "bfloat16"):
  """A model from a config name (or (name, overrides)), `dtype` for compute and parameters."""
  name, overrides = (spec, {}) if isinstance(spec, str) else spec
  kw = dict(overrides, dtype=dtype, param_dtype=dtype)
  if family == "t5":
    return T5(t5_config(name, **kw))
  return DecoderLM(decoder_config(name, **kw))


def measure_model(family: str, name: str, role: str, model, *, batch: int, prompt_len: int,
                  cache_len: int, token_counts, bandwidth: float, steps: int, repeats: int,
                  seed: int = 0, packed: bool = True, log=print):
  """Step latency of `model` at every T in `token_counts` (`timing.step_times`) next to its
  roofline, on random weights made on the device and freed afterwards. `packed`: a decoder's
  params in the packed decode layout (`DecoderLM.pack_params`; the same bytes)."""
  shapes = param_shapes(model)
  t0 = now()
  params = jax.block_until_ready(random_params(model, jax.random.PRNGKey(seed), shapes))
  packed = packed and isinstance(model, DecoderLM)
  if packed:
    params = jax.block_until_ready(model.pack_params(params))
  n_params = sum(int(math.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))
  log(f"{family}/{name} ({role}): {n_params / 1e9:.3f}B params on device in "
      f"{now() - t0:.1f}s; timing T = {list(token_counts)}")
  t0 = now()
  times = step_times(model, params, batch, cache_len, prompt_len, list(token_counts), steps=steps,
                     repeats=repeats)
  log(f"  step times {({t: round(1e3 * v, 3) for t, v in times.items()})} ms "
      f"({now() - t0:.0f}s with compilation)")
  del params
  context = model.prefill_positions(prompt_len)
  enc = prompt_len if isinstance(model, T5) else 0
  rows = []
  for t, sec in times.items():
    b = step_bytes(model, batch, t, context, cache_len, enc, shapes)
    roof, roof_buf = roofline_s(b["total"], bandwidth), roofline_s(b["total_buffer"], bandwidth)
    rows.append({"family": family, "model": name, "role": role, "params": n_params,
                 "layout": "packed" if packed else "standard",
                 "batch": batch, "T": t, "context": context, "cache_len": cache_len,
                 "step_ms": 1e3 * sec, "bytes": b, "roofline_ms": 1e3 * roof,
                 "roofline_buffer_ms": 1e3 * roof_buf,
                 "x_roofline": sec / roof_buf if roof_buf else float("nan"),
                 "x_roofline_ideal": sec / roof if roof else float("nan")})
  return rows


def summarize(rows, gammas, alphas=(0.6, 0.7, 0.75, 0.9), goal: float = 1.3,
              batch_goal=(8, 0.7, 1.5)):
  """Per family: c of each draft, the target's verify cost per γ, the speedup the components
  predict at a few α, and the goals: the target step (T = 1) ≤ `goal`× its roofline and, at batch
  `batch_goal[0]`, the best draft and γ predicting ≥ `batch_goal[2]`× at α = `batch_goal[1]`."""
  goal_batch, goal_alpha, goal_speedup = batch_goal
  alphas = tuple(sorted(set(alphas) | {goal_alpha}))
  out, goals = [], []
  for family in sorted({r["family"] for r in rows}):
    fam = [r for r in rows if r["family"] == family]
    target = {r["T"]: r for r in fam if r["role"] == "target"}
    if 1 not in target:
      continue
    t1 = target[1]["step_ms"]
    goals.append({"goal": f"{family}: target step (T = 1) ≤ {goal:g}× its roofline",
                  "status": "PASS" if target[1]["x_roofline"] <= goal else "FAIL",
                  "detail": f"{target[1]['step_ms']:.3f} ms = {target[1]['x_roofline']:.2f}× the "
                            f"{target[1]['roofline_buffer_ms']:.3f} ms roofline"})
    for draft in sorted({r["model"] for r in fam if r["role"] == "draft"}):
      d = {r["T"]: r for r in fam if r["model"] == draft and r["role"] == "draft"}
      c = d[1]["step_ms"] / t1
      for g in gammas:
        if g + 1 not in target:
          continue
        verify = target[g + 1]["step_ms"]
        draft_iter = (d[2]["step_ms"] if 2 in d else d[1]["step_ms"]) + (g - 1) * d[1]["step_ms"]
        pred = {f"{a:g}": theory.walltime_improvement_from_times(
            theory.expected_tokens_per_call(a, g), t1, draft_iter + verify) for a in alphas}
        out.append({"family": family, "draft": draft, "gamma": g, "c": c,
                    "verify_cost": verify / t1, "predicted_speedup": pred})
    cells = [s for s in out if s["family"] == family]
    if target[1]["batch"] == goal_batch and cells:
      best = max(cells, key=lambda s: s["predicted_speedup"][f"{goal_alpha:g}"])
      v = best["predicted_speedup"][f"{goal_alpha:g}"]
      goals.append({"goal": f"{family}: speculative ≥ {goal_speedup:g}× autoregressive at batch "
                            f"{goal_batch} when α = {goal_alpha:g} (predicted from the components)",
                    "status": "PASS" if v >= goal_speedup else "FAIL",
                    "detail": f"{v:.2f}× ({best['draft']} draft, γ = {best['gamma']}: verify "
                              f"{best['verify_cost']:.2f}× a T = 1 step, c {best['c']:.4f})"})
  return out, goals


def format_table(rows, summary, goals, bandwidth) -> str:
  lines = [f"measured copy bandwidth: {bandwidth / 1e9:.0f} GB/s", "",
           f"{'family':8} {'model':16} {'role':6} {'params':>8} {'T':>3} {'step ms':>9} "
           f"{'weights GB':>10} {'KV MB':>8} {'roof ms':>8} {'x roof':>7}"]
  for r in rows:
    lines.append(
        f"{r['family']:8} {r['model']:16} {r['role']:6} {r['params'] / 1e9:7.3f}B {r['T']:>3} "
        f"{r['step_ms']:9.3f} {r['bytes']['weights'] / 1e9:10.3f} "
        f"{(r['bytes']['kv_read_buffer'] + r['bytes']['kv_write']) / 1e6:8.2f} "
        f"{r['roofline_buffer_ms']:8.3f} {r['x_roofline']:7.2f}")
  lines += ["", f"{'family':8} {'draft':12} {'γ':>2} {'c':>7} {'verify×':>8}  "
                "predicted speedup at α"]
  for s in summary:
    pred = "  ".join(f"α={a}: {v:.2f}x" for a, v in s["predicted_speedup"].items())
    lines.append(f"{s['family']:8} {s['draft']:12} {s['gamma']:>2} {s['c']:7.4f} "
                 f"{s['verify_cost']:8.2f}  {pred}")
  lines += [""] + [f"{g['status']}: {g['goal']} — {g['detail']}" for g in goals]
  return "\n".join(lines)
