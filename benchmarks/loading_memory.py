"""Peak host memory while loading a transformers-format checkpoint onto 8 devices.

  python benchmarks/loading_memory.py            # ~3 min: a 166M-parameter Llama (332 MB bf16)
  python benchmarks/loading_memory.py --quick    # a 20M-parameter one (smoke run)

Writes a Llama-format checkpoint with random weights in bfloat16 as sharded
safetensors (+ index) under --work_dir, then loads it in fresh processes
(8 CPU devices: `XLA_FLAGS=--xla_force_host_platform_device_count=8`),
each reporting its resident set before loading and its peak (`VmHWM`) after:

* `streamed_mesh`: `import_hf_decoder(dir, mesh=1x8, dtype=bfloat16)` —
  memory-mapped tensors, each device's slice read and converted on its own;
* `streamed`: the same onto one device;
* `eager_f32`: what loading was before: every tensor read into a float32
  host array (`load_state_dict`), converted, then `shard_params` onto the
  same mesh.

On a CPU the "devices" are host memory, so the placed arrays themselves
count in the resident set; the overhead of loading is the peak minus the
baseline minus the placed bytes. Streamed, it must stay near the largest
tensor (a slice at a time is converted); eager, it is the float32 copy of
the whole model. Writes `loading_memory.json` / `.md` into --out_dir.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags

flags.DEFINE_bool("quick", False, "a 20M-parameter model instead of 166M")
flags.DEFINE_string("work_dir", "runs/loading_memory", "where the checkpoint is written")
flags.DEFINE_string("out_dir", "benchmarks/results", "where the JSON / markdown go")
flags.DEFINE_string("child", "", "internal: run one loading mode and print a JSON line")
FLAGS = flags.FLAGS

SIZES = {  # Llama-format shapes (vocab, hidden, layers, heads, kv heads, mlp)
    "full": dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=8,
                 num_attention_heads=16, num_key_value_heads=8, intermediate_size=2816),
    "quick": dict(vocab_size=8192, hidden_size=512, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, intermediate_size=1408),
}
MODES = ("streamed_mesh", "streamed", "eager_f32")


def _status_kb(field: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  raise RuntimeError(f"/proc/self/status has no {field}")


def _write_checkpoint(directory: str, size: str) -> dict:
  """Random bf16 weights in transformers' Llama layout, 4 safetensors shards."""
  import ml_dtypes
  import numpy as np
  from specjax.atomic_io import atomic_write_json
  from specjax.checkpoints.hf_llama import hf_config_from_decoder, hf_llama_shapes
  from specjax.checkpoints.hf_llama import decoder_config_from_hf
  from safetensors.numpy import save_file
  hf = dict(SIZES[size], model_type="llama", max_position_embeddings=2048, rms_norm_eps=1e-6,
            tie_word_embeddings=False)
  config = decoder_config_from_hf(hf)
  shapes = hf_llama_shapes(config)
  names = list(shapes)
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(0)
  groups = [names[i::4] for i in range(4)]
  weight_map = {}
  for i, group in enumerate(groups):
    file = f"model-{i + 1:05d}-of-00004.safetensors"
    tensors = {n: (0.02 * rng.standard_normal(shapes[n], np.float32)).astype(ml_dtypes.bfloat16)
               for n in group}
    save_file(tensors, os.path.join(directory, file), metadata={"format": "pt"})
    weight_map.update({n: file for n in group})
    del tensors
  atomic_write_json(os.path.join(directory, "model.safetensors.index.json"),
                    {"metadata": {}, "weight_map": weight_map}, indent=2)
  atomic_write_json(os.path.join(directory, "config.json"),
                    hf_config_from_decoder(config, max_position_embeddings=2048), indent=2)
  return {"params": config.num_params()}


def _child(mode: str, directory: str) -> None:
  import jax
  import numpy as np
  from specjax.checkpoints import streaming
  from specjax.checkpoints.hf_common import load_state_dict
  from specjax.checkpoints.hf_llama import import_hf_decoder
  from specjax.parallel.sharding import make_mesh, shard_params
  jax.devices()
  baseline = _status_kb("VmRSS")
  total, largest = streaming.stored_bytes(streaming.open_tensors(directory))
  mesh = make_mesh(data=1, model=8)
  start = time.perf_counter()
  if mode == "streamed_mesh":
    params, _ = import_hf_decoder(directory, mesh=mesh, dtype="bfloat16")
  elif mode == "streamed":
    params, _ = import_hf_decoder(directory, dtype="bfloat16")
  else:
    import jax.numpy as jnp
    from specjax.checkpoints.hf_llama import _entries, decoder_config_from_hf
    from specjax.checkpoints.hf_common import read_json
    config = decoder_config_from_hf(read_json(os.path.join(directory, "config.json")))
    host = load_state_dict(directory)      # the whole model as float32 host arrays
    params = {}
    for entry, _, _ in _entries(config):
      node = params
      for key in entry.path[:-1]:
        node = node.setdefault(key, {})
      node[entry.path[-1]] = np.ascontiguousarray(entry.view(host[entry.name])).astype(
          jnp.bfloat16)
    params = shard_params(params, mesh)
  jax.block_until_ready(params)
  seconds = time.perf_counter() - start
  placed = sum(sum(s.data.nbytes for s in x.addressable_shards)
               for x in jax.tree_util.tree_leaves(params))
  peak = _status_kb("VmHWM")
  print(json.dumps({"mode": mode, "baseline_mb": baseline / 1024, "peak_mb": peak / 1024,
                    "placed_mb": placed / 2 ** 20, "stored_mb": total / 2 ** 20,
                    "largest_tensor_mb": largest / 2 ** 20, "seconds": seconds,
                    "overhead_mb": (peak - baseline) / 1024 - placed / 2 ** 20}))


def main(argv):
  del argv
  size = "quick" if FLAGS.quick else "full"
  directory = os.path.join(FLAGS.work_dir, size)
  if FLAGS.child:
    _child(FLAGS.child, directory)
    return
  if not os.path.exists(os.path.join(directory, "config.json")):
    print(f"writing a {size} checkpoint to {directory} ...", flush=True)
    info = _write_checkpoint(directory, size)
  else:
    from specjax.checkpoints.hf_llama import decoder_config_from_hf
    from specjax.checkpoints.hf_common import read_json
    info = {"params": decoder_config_from_hf(
        read_json(os.path.join(directory, "config.json"))).num_params()}
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu")
  rows = []
  for i, mode in enumerate(MODES):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), f"--child={mode}",
                          f"--work_dir={FLAGS.work_dir}"] + (["--quick"] if FLAGS.quick else []),
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode:
      raise SystemExit(f"{mode} failed:\n{out.stderr[-3000:]}")
    rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"[{i + 1}/{len(MODES)}] {mode}: peak {rows[-1]['peak_mb']:.0f} MB, overhead "
          f"{rows[-1]['overhead_mb']:.0f} MB, {rows[-1]['seconds']:.1f} s", flush=True)
  result = {"size": size, "shapes": SIZES[size], "params": info["params"],
            "devices": 8, "dtype_on_disk": "bfloat16", "rows": rows}
  from specjax.atomic_io import atomic_write_json, atomic_write_text
  from specjax.measure.provenance import provenance, provenance_sentence
  result["provenance"] = provenance()
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  stem = "loading_memory" if size == "full" else "loading_memory_quick"
  atomic_write_json(os.path.join(FLAGS.out_dir, stem + ".json"), result, indent=2)
  lines = [f"# Peak host memory while loading ({info['params'] / 1e6:.0f}M params, bf16 on "
           f"disk, 4 safetensors shards, 8 CPU devices)", "",
           "`python benchmarks/loading_memory.py" + (" --quick" if FLAGS.quick else "") + "`"
           + provenance_sentence(result["provenance"]),
           "", "| mode | baseline MB | peak MB | placed MB | overhead MB | largest tensor MB "
           "| stored MB | s |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['mode']} | {r['baseline_mb']:.0f} | {r['peak_mb']:.0f} | "
                 f"{r['placed_mb']:.0f} | {r['overhead_mb']:.0f} | {r['largest_tensor_mb']:.0f} | "
                 f"{r['stored_mb']:.0f} | {r['seconds']:.1f} |")
  lines += ["", "overhead = peak − baseline − placed (on a CPU the devices' arrays are host "
            "memory). Streamed loading converts one slice at a time from memory-mapped files; "
            "eager loading held the whole model as float32 host arrays first."]
  atomic_write_text(os.path.join(FLAGS.out_dir, stem + ".md"), "\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
