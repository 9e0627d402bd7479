"""specjax.planning: the memory plan (checked against hand counts) and the mesh
choice; specjax.parallel.distributed: processes (two real CPU processes);
specjax.measure.tensorboard: scalars and profiler traces."""

import dataclasses
import glob
import os
import re
import struct
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.measure.tensorboard import ScalarWriter, maybe_profile, profile_decode
from specjax.parallel.distributed import initialize_distributed, is_main_process
from specjax.planning.memory import (MemoryPlan, check_fits, device_memory_bytes, format_bytes,
                                     memory_plan)
from specjax.models.decoder import DecoderConfig
from specjax.models.t5 import t5_config
from specjax.planning.mesh import choose_mesh
from multiprocess import run_two_processes

F32 = 4

# Target: V=64, E=32, L=2, H=4, K=2, D=8, F=64, untied.
TARGET = DecoderConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=8, mlp_dim=64)
# Draft: V=64, E=16, L=1, H=2, K=1, D=8, F=32, tied embeddings.
DRAFT = DecoderConfig(vocab_size=64, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1,
                      head_dim=8, mlp_dim=32, tie_embeddings=True)


def _target_param_elems(model: int) -> int:
  """The target's parameters on one device of a model axis of 1, 2 or 4, by hand:
  final norm [E] and the layer norms [E] are whole; q / o over H = 4 heads,
  k / v over K = 2 heads (at model=4, which K does not divide, each kv head is
  stored twice — `fit_to_mesh` — so one head per device), gate / up / down over
  F = 64, lm_head [E, V] and embed [V, E] over V = 64 (vocab-parallel)."""
  v, e, l, h, k, d, f = 64, 32, 2, 4, 2, 8, 64
  kv_per_device = k // model if k % model == 0 else 1
  layer = (2 * e * h * d // model       # q [E, H, D], o [H, D, E]
           + 2 * e * kv_per_device * d  # k, v [E, K, D]
           + 3 * e * f // model         # gate, up [E, F], down [F, E]
           + 2 * e)                     # attn_norm, mlp_norm
  return v * e // model + l * layer + e + e * v // model


def test_target_params_match_hand_count():
  assert _target_param_elems(1) == TARGET.num_params() == 22688
  assert _target_param_elems(2) == 11424 and _target_param_elems(4) == 6304
  for data, model in ((1, 1), (1, 2), (1, 4), (2, 2), (4, 1)):
    plan = memory_plan(TARGET, mesh_shape=(data, model), batch_size=4, cache_len=16)
    assert plan.target_params == _target_param_elems(model) * F32, (data, model)
    assert plan.unsharded[0] == TARGET.num_params() * F32
  half = TARGET.replace(param_dtype="bfloat16")
  plan = memory_plan(half, mesh_shape=(1, 2), batch_size=4, cache_len=16)
  assert plan.target_params == _target_param_elems(2) * 2


def test_target_cache_matches_hand_count():
  l, b, k, d, s = 2, 4, 2, 8, 16
  cases = {(1, 1): 2 * l * b * k * d * s * F32 + b * 4,
           (2, 2): 2 * l * (b // 2) * (k // 2) * d * s * F32 + (b // 2) * 4,
           # K = 2 heads do not divide a model axis of 4: each stored twice, one per device
           # (before `fit_to_mesh`, the whole cache was on every device).
           (1, 4): 2 * l * b * 1 * d * s * F32 + b * 4,
           # 4 rows do not divide a data axis of 3: replicated.
           (3, 2): 2 * l * b * (k // 2) * d * s * F32 + b * 4}
  for mesh, expected in cases.items():
    plan = memory_plan(TARGET, mesh_shape=mesh, batch_size=b, cache_len=s)
    assert plan.target_cache == expected, mesh
  plan = memory_plan(TARGET.replace(dtype="bfloat16"), mesh_shape=(1, 1), batch_size=b,
                     cache_len=s)
  assert plan.target_cache == 2 * l * b * k * d * s * 2 + b * 4  # int32 lengths


def test_activation_estimate_matches_its_definition():
  b, t, s, v, e, f, h = 4, 3, 16, 64, 32, 64, 4
  plan = memory_plan(TARGET, mesh_shape=(2, 2), batch_size=b, cache_len=s, activation_tokens=t)
  rows = (b // 2) * t
  expected = (rows * v * F32                    # float32 logits, vocabulary whole
              + 4 * rows * e * F32              # hidden states
              + 3 * rows * (f // 2) * F32       # MLP hidden units over model
              + 2 * rows * (h // 2) * s * F32)  # scores and softmax of one layer
  assert plan.activations == expected
  assert plan.activation_tokens == t
  default = memory_plan(TARGET, mesh_shape=(1, 1), batch_size=b, cache_len=s)
  assert default.activation_tokens == s  # the whole context by default
  assert plan.per_device_bytes == (plan.target_params + plan.target_cache + plan.activations)


def test_logits_above_the_gather_limit_are_planned_split_over_the_vocabulary():
  """Logits of more than `rules.GATHER_MAX_BYTES` per device stay split over the
  vocabulary (`rules.whole_vocab`): the plan counts 1/model of them; up to the limit
  they are whole on every device."""
  from specjax.parallel.rules import GATHER_MAX_BYTES
  v, rows = 2 ** 15, 32                     # 32 rows per device x V float32 = the limit
  assert rows * v * F32 == GATHER_MAX_BYTES
  big = dataclasses.replace(TARGET, vocab_size=v)
  kw = dict(mesh_shape=(2, 4), batch_size=2 * rows, cache_len=16)
  for t, logits in ((1, rows * v * F32), (2, rows * 2 * v * F32 // 4)):
    # Only the logits depend on the vocabulary: the difference to a 64-token plan.
    diff = (memory_plan(big, activation_tokens=t, **kw).activations
            - memory_plan(TARGET, activation_tokens=t, **kw).activations)
    assert diff == logits - rows * t * 64 * F32, t


def test_a_fused_attention_kernel_keeps_the_cached_scores_off_the_plan():
  """With `attention_kernel="pallas"` on a cache the kernel takes (slots and
  head_dim multiples of 128) the score term is the new tokens' block and the
  kernel's output, not T x C; a cache it does not take keeps XLA's term."""
  b, t, s, h, d = 4, 3, 256, 4, 128
  wide = dataclasses.replace(TARGET, head_dim=d)
  kw = dict(mesh_shape=(2, 2), batch_size=b, activation_tokens=t)
  rows, heads = (b // 2) * t, h // 2
  xla = memory_plan(wide, cache_len=s, **kw).activations
  fused = memory_plan(dataclasses.replace(wide, attention_kernel="pallas"), cache_len=s,
                      **kw).activations
  assert xla - fused == 2 * rows * heads * s * F32 - rows * heads * (2 * t + d) * F32
  odd = memory_plan(dataclasses.replace(wide, attention_kernel="pallas"), cache_len=s + 8, **kw)
  assert odd.activations == memory_plan(wide, cache_len=s + 8, **kw).activations


def test_draft_replicated_or_split():
  v, e, h, k, d, f, b, s = 64, 16, 2, 1, 8, 32, 4, 16
  whole = v * e + (2 * e * h * d + 2 * e * k * d + 3 * e * f + 2 * e) + e
  assert whole == DRAFT.num_params()
  # On model=2: q / o, the MLP and the tied embedding split; k / v (K = 1) stored twice
  # (`fit_to_mesh`), one copy per device.
  split = v * e // 2 + (2 * e * h * d // 2 + 2 * e * k * d + 3 * e * f // 2 + 2 * e) + e
  cache_whole = 2 * b * k * d * s * F32 + b * 4
  cache_split = 2 * (b // 2) * k * d * s * F32 + (b // 2) * 4  # batch over data=2

  replicated = memory_plan(TARGET, DRAFT, mesh_shape=(2, 2), batch_size=b, cache_len=s)
  # Replicated: the weights whole on every device, the cache's rows over data like every cache.
  assert (replicated.draft_params, replicated.draft_cache) == (whole * F32, cache_split)
  assert replicated.unsharded[3] == cache_whole
  sharded = memory_plan(TARGET, DRAFT, mesh_shape=(2, 2), batch_size=b, cache_len=s,
                        draft_sharded=True)
  assert (sharded.draft_params, sharded.draft_cache) == (split * F32, cache_split)
  assert sharded.target_params == replicated.target_params == _target_param_elems(2) * F32
  assert sharded.per_device_bytes < replicated.per_device_bytes
  assert "draft replicated" in replicated.describe()
  assert "draft split" in sharded.describe()
  no_draft = memory_plan(TARGET, mesh_shape=(2, 2), batch_size=b, cache_len=s)
  assert (no_draft.draft_params, no_draft.draft_cache, no_draft.has_draft) == (0, 0, False)
  assert "draft" not in no_draft.describe()


def test_t5_cache_holds_cross_attention():
  c = t5_config("t5-tiny")
  l, b, h, d, s, p = c.num_decoder_layers, 2, c.num_heads, c.d_kv, 16, 8
  plan = memory_plan(c, mesh_shape=(1, 1), batch_size=b, cache_len=s, prompt_len=p)
  self_kv, cross_kv = 2 * l * b * h * d * s * F32, 2 * l * b * h * d * p * F32
  assert plan.target_cache == self_kv + cross_kv + 2 * b * 4  # + lengths, encoder lengths
  assert plan.target_params == c.num_params() * F32
  split = memory_plan(c, mesh_shape=(2, 2), batch_size=b, cache_len=s, prompt_len=p)
  assert split.target_cache == (self_kv + cross_kv) // 4 + 2 * (b // 2) * 4


def test_describe_lists_components_totals_and_capacity():
  plan = memory_plan(TARGET, DRAFT, mesh_shape=(1, 2), batch_size=2, cache_len=8)
  text = plan.describe(10 ** 9)
  for word in ("data=1 x model=2", "target params", "target KV cache", "draft params",
               "draft KV cache", "activations (estimate)", "total", "1.0 GB", "spare"):
    assert word in text, word
  assert "unknown" in plan.describe()
  assert "short by" in plan.describe(1000)


def test_check_fits_names_the_mesh_and_the_shortfall():
  plan = memory_plan(TARGET, mesh_shape=(1, 2), batch_size=1, cache_len=8,
                     activation_tokens=1)
  need = plan.per_device_bytes
  assert check_fits(plan, need) == 0
  assert check_fits(plan, need + 7) == 7
  assert check_fits(plan, None) is None
  with pytest.raises(ValueError, match=re.escape(
      f"the target does not fit a data=1 x model=2 mesh: {format_bytes(need)} per "
      f"device needed, {format_bytes(need - 2500)} available (short by 2.5 KB); "
      "use more model-axis devices (config.mesh)")):
    check_fits(plan, need - 2500)
  both = memory_plan(TARGET, DRAFT, mesh_shape=(1, 2), batch_size=1, cache_len=8)
  with pytest.raises(ValueError, match="the target and draft do not fit a data=1 x model=2"):
    check_fits(both, 1000)
  with pytest.raises(ValueError, match="capacity_bytes must be an int >= 1, got 0"):
    check_fits(plan, 0)
  assert format_bytes(34.2e9) == "34.2 GB"
  assert format_bytes(512) == "512 B"


def test_choose_mesh_auto_takes_the_fewest_model_devices_that_fit():
  kw = dict(num_devices=4, batch_size=1, cache_len=8, activation_tokens=1)
  need = {m: memory_plan(TARGET, mesh_shape=(1, m), batch_size=1, cache_len=8,
                         activation_tokens=1).per_device_bytes for m in (1, 2, 4)}
  assert need[1] > need[2] > need[4]
  assert choose_mesh(TARGET, capacity_bytes=need[1], **kw) == (1, 1)
  assert choose_mesh(TARGET, capacity_bytes=need[1] - 1, **kw) == (1, 2)
  assert choose_mesh(TARGET, capacity_bytes=need[2] - 1, **kw) == (1, 4)
  with pytest.raises(ValueError, match=r"no mesh of 4 device\(s\) fits.*data=1 x model=4 mesh.*"
                                       r"\(short by 1 B\)"):
    choose_mesh(TARGET, capacity_bytes=need[4] - 1, **kw)
  # Rows split evenly over data: the largest divisor of the batch that the devices allow.
  plan8 = memory_plan(TARGET, mesh_shape=(4, 2), batch_size=8, cache_len=8)
  assert choose_mesh(TARGET, num_devices=8, batch_size=8, cache_len=8,
                     capacity_bytes=plan8.per_device_bytes) == (4, 2)


def test_choose_mesh_without_capacity_uses_the_data_axis():
  kw = dict(cache_len=8, capacity_bytes=None)
  assert choose_mesh(TARGET, DRAFT, num_devices=8, batch_size=16, **kw) == (8, 1)
  assert choose_mesh(TARGET, DRAFT, num_devices=8, batch_size=6, **kw) == (6, 1)
  assert choose_mesh(TARGET, DRAFT, num_devices=8, batch_size=1, **kw) == (1, 1)
  assert choose_mesh(TARGET, DRAFT, num_devices=8, batch_size=1, mesh=(2, 4), **kw) == (2, 4)


def test_choose_mesh_checks_a_given_mesh():
  kw = dict(num_devices=8, batch_size=2, cache_len=8, capacity_bytes=None)
  for bad in ((0, 2), (2,), (2, 2, 2), (True, 1), (1.0, 2), "2x2", None):
    with pytest.raises(ValueError, match="mesh must be"):
      choose_mesh(TARGET, mesh=bad, **kw)
  with pytest.raises(ValueError, match="mesh data=4 x model=4 needs 16 devices, 8 are available"):
    choose_mesh(TARGET, mesh=(4, 4), **kw)
  with pytest.raises(ValueError, match="does not fit a data=2 x model=2 mesh"):
    choose_mesh(TARGET, mesh=(2, 2), **dict(kw, capacity_bytes=1000))
  with pytest.raises(ValueError, match="num_devices must be an int >= 1, got 0"):
    choose_mesh(TARGET, **dict(kw, num_devices=0))


def test_memory_plan_validates_its_arguments():
  kw = dict(mesh_shape=(1, 1), batch_size=2, cache_len=8)
  with pytest.raises(ValueError, match="mesh_shape must be a \\(data, model\\) pair"):
    memory_plan(TARGET, **dict(kw, mesh_shape=(1, 0)))
  with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
    memory_plan(TARGET, **dict(kw, batch_size=0))
  with pytest.raises(ValueError, match="cache_len must be an int >= 1, got -1"):
    memory_plan(TARGET, **dict(kw, cache_len=-1))
  with pytest.raises(ValueError, match="activation_tokens must be an int >= 1"):
    memory_plan(TARGET, activation_tokens=0, **kw)
  with pytest.raises(TypeError, match="draft_sharded must be a bool, got 1"):
    memory_plan(TARGET, DRAFT, draft_sharded=1, **kw)
  with pytest.raises(TypeError, match="target_config must be a DecoderConfig or a T5Config"):
    memory_plan({"vocab_size": 8}, **kw)
  assert isinstance(memory_plan(TARGET, **kw), MemoryPlan)


class _FakeDevice:
  def __init__(self, stats):
    self.stats = stats

  def memory_stats(self):
    if isinstance(self.stats, Exception):
      raise self.stats
    return self.stats


def test_device_memory_bytes():
  assert device_memory_bytes() is None  # the CPU backend reports no limit
  assert device_memory_bytes(_FakeDevice({"bytes_limit": 16 * 10 ** 9})) == 16 * 10 ** 9
  assert device_memory_bytes(_FakeDevice(None)) is None
  assert device_memory_bytes(_FakeDevice({"bytes_in_use": 5})) is None
  assert device_memory_bytes(_FakeDevice(NotImplementedError("no stats"))) is None


def test_initialize_distributed_disabled_is_a_no_op():
  assert initialize_distributed(False) is False
  assert not jax.distributed.is_initialized()
  assert jax.process_count() == 1 and is_main_process()
  with pytest.raises(TypeError, match="enabled .* must be a bool, got 'yes'"):
    initialize_distributed("yes")


def _read_records(path):
  """TFRecord framing (length, masked CRC32C of it, data, masked CRC32C of
  the data), checked, → the records' bytes."""
  from tensorboardX.crc32c import crc32c

  def masked(data):
    x = crc32c(data) & 0xFFFFFFFF
    return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF

  with open(path, "rb") as f:
    blob = f.read()
  records, at = [], 0
  while at < len(blob):
    header = blob[at:at + 8]
    (length,) = struct.unpack("<Q", header)
    (length_crc,) = struct.unpack("<I", blob[at + 8:at + 12])
    assert length_crc == masked(header)
    data = blob[at + 12:at + 12 + length]
    (data_crc,) = struct.unpack("<I", blob[at + 12 + length:at + 16 + length])
    assert data_crc == masked(data)
    records.append(data)
    at += 16 + length
  return records


def test_scalar_writer_events_read_back(tmp_path):
  from tensorboardX.proto import event_pb2

  with ScalarWriter(str(tmp_path / "tb")) as tb:
    tb.write(1, {"tokens_per_s": 812.5, "acceptance": np.float32(0.75)})
    tb.write(2, {"tokens_per_s": jnp.asarray(900.0)})
    with pytest.raises(ValueError, match="step must be an int >= 0, got -1"):
      tb.write(-1, {"x": 1.0})
    with pytest.raises(ValueError, match="scalar 'x' must be a number"):
      tb.write(3, {"x": "fast"})
  files = glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))
  assert len(files) == 1
  events = [event_pb2.Event.FromString(r) for r in _read_records(files[0])]
  assert events[0].file_version.startswith("brain.Event:")
  scalars = [(e.step, v.tag, v.simple_value) for e in events for v in e.summary.value]
  assert scalars == [(1, "tokens_per_s", 812.5), (1, "acceptance", 0.75),
                     (2, "tokens_per_s", 900.0)]
  with pytest.raises(ValueError, match="is closed"):
    tb.write(4, {"x": 1.0})
  quiet = ScalarWriter(str(tmp_path / "off"), enabled=False)
  quiet.write(1, {"x": 1.0})
  quiet.close()
  assert not os.path.exists(tmp_path / "off")


def test_profile_decode_writes_a_trace(tmp_path):
  step = jax.jit(lambda x: jnp.tanh(x @ x))
  x = jnp.ones((32, 32))
  step(x).block_until_ready()
  out = profile_decode(lambda: step(x), str(tmp_path / "prof"), steps=2)
  np.testing.assert_allclose(out, np.tanh(np.ones((32, 32)) * 32), rtol=1e-6)
  traces = [p for p in glob.glob(str(tmp_path / "prof" / "plugins" / "profile" / "*" / "*"))
            if os.path.getsize(p) > 0]
  assert any(p.endswith(".xplane.pb") for p in traces), traces
  with maybe_profile(str(tmp_path / "none"), enabled=False):
    step(x).block_until_ready()
  assert not os.path.exists(tmp_path / "none")
  with pytest.raises(ValueError, match="steps \\(config.profile_steps\\) must be an int >= 1"):
    profile_decode(lambda: step(x), str(tmp_path / "p2"), steps=0)


_WORKER = textwrap.dedent("""
    import json, os, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from specjax.measure.tensorboard import ScalarWriter
    from specjax.parallel.distributed import initialize_distributed, is_main_process

    pid, port, logdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kw = dict(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    first = initialize_distributed(True, **kw)
    again = initialize_distributed(True, **kw)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    full = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    x = jax.make_array_from_callback(full.shape, NamedSharding(mesh, P("data", "model")),
                                     lambda index: full[index])
    whole = NamedSharding(mesh, P())
    total = jax.jit(lambda a: jnp.sum(a * a), out_shardings=whole)(x)
    gram = jax.jit(lambda a: a @ a.T, out_shardings=whole)(x)
    with ScalarWriter(logdir) as tb:
      tb.write(0, {"process": float(pid)})
    # A sharded generate: both checkpoints streamed onto the global mesh (each process
    # reads its own devices' slices), rows over data, heads over model.
    import specjax
    from specjax.checkpoints.hf_llama import import_hf_decoder
    from jax.experimental import multihost_utils
    ckpt = os.path.join(os.path.dirname(logdir), "ckpt")
    tp, tc = import_hf_decoder(os.path.join(ckpt, "target"), mesh=mesh)
    dp, dc = import_hf_decoder(os.path.join(ckpt, "draft"), mesh=mesh)
    prompts = np.array([[3, 4, 5, 6], [7, 8, 9, 0]], np.int32)
    rows = NamedSharding(mesh, P("data"))
    put = lambda a: jax.make_array_from_callback(a.shape, rows, lambda i: a[i])
    out = specjax.speculative_generate(
        specjax.DecoderLM(tc), tp, specjax.DecoderLM(dc), dp, put(prompts),
        put(np.array([4, 3], np.int32)), max_new_tokens=12, gamma=3, sampling=specjax.GREEDY)
    tokens = multihost_utils.process_allgather(out.tokens, tiled=True)
    print("RESULT " + json.dumps(dict(
        first=first, again=again, main=is_main_process(),
        processes=jax.process_count(), devices=jax.device_count(),
        local=jax.local_device_count(), total=float(total),
        gram=np.asarray(gram).tolist(), tokens=np.asarray(tokens).tolist())), flush=True)
    jax.distributed.shutdown()
    """)


def test_two_processes_share_one_mesh(tmp_path):
  """Two local CPU processes of 4 devices each: one 2 x 4 mesh over all 8
  devices, a jitted computation over an array split across both processes,
  and a greedy speculative generate from checkpoints streamed onto that mesh
  (each process reading its own slices) equal to one process's."""
  import jax
  import specjax
  from specjax.checkpoints.hf_llama import export_hf_decoder
  models = {}
  for name, layers, seed in (("target", 2, 0), ("draft", 1, 1)):
    lm = specjax.DecoderLM(specjax.decoder_config("tiny", num_layers=layers))
    params = lm.init(jax.random.PRNGKey(seed))
    export_hf_decoder(params, lm.config, str(tmp_path / "ckpt" / name))
    models[name] = (lm, params)
  (target, tp), (draft, dp) = models["target"], models["draft"]
  import jax.numpy as jnp
  want = specjax.speculative_generate(
      target, tp, draft, dp, jnp.array([[3, 4, 5, 6], [7, 8, 9, 0]]), jnp.array([4, 3]),
      max_new_tokens=12, gamma=3, sampling=specjax.GREEDY).tokens
  logdir = str(tmp_path / "tb")
  results = run_two_processes(_WORKER, tmp_path, logdir, timeout=120)
  full = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
  for pid, r in enumerate(results):
    assert (r["first"], r["again"], r["main"]) == (True, False, pid == 0)
    assert (r["processes"], r["devices"], r["local"]) == (2, 8, 4)
    assert r["total"] == float((full * full).sum())
    np.testing.assert_allclose(np.asarray(r["gram"]), full @ full.T)
    np.testing.assert_array_equal(np.asarray(r["tokens"]), np.asarray(want))
  assert len(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))) == 1  # process 0 only
