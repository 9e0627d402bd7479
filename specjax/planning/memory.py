"""The memory plan: the bytes each device of a mesh holds, before anything is loaded.

* `memory_plan`: the target's params and KV cache, the draft's (replicated unless split like
  the target), and an estimate of one call's activations per device of a (`data`, `model`)
  mesh, in exactly the layouts `specjax.parallel.sharding` gives them; shapes come from
  `jax.eval_shape`, nothing is allocated.
* `device_memory_bytes` reads a device's capacity where the backend reports it (GPU, TPU);
  `check_fits` refuses a plan that exceeds it. `planning.mesh.choose_mesh` picks a mesh with it.

Example (before loading a 70B target on 8 accelerators):

  capacity = device_memory_bytes()
  plan = memory_plan(target_cfg, draft_cfg, mesh_shape=(1, 8), batch_size=8, cache_len=2048)
  print(plan.describe(capacity))

Bytes are reported in decimal units (1 GB = 10**9 bytes).
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import Any, Optional, Sequence, Tuple, Union

import jax
import numpy as np
from jax.sharding import AbstractMesh

from specjax._checks import check_bool, check_int, format_bytes, memory_stats_of
from specjax.models import attention_kernel
from specjax.models.decoder import DecoderConfig, DecoderLM
from specjax.parallel.rules import GATHER_MAX_BYTES
from specjax.models.t5 import T5
from specjax.models.t5_config import T5Config
from specjax.parallel.sharding import DATA, MODEL, cache_spec, kv_head_repeats, param_spec

__all__ = ["MemoryPlan", "memory_plan", "device_memory_bytes", "check_fits", "format_bytes",
           "mesh_pair", "prompt_feature_bytes"]

ModelConfig = Union[DecoderConfig, T5Config]

# Activation estimate: buffers of one call alive at once (see `memory_plan`).
_HIDDEN_BUFFERS = 4   # residual stream, its normed copy, attention output, the call's input
_MLP_BUFFERS = 3      # gate, up and their product (relu MLPs: fewer, counted the same)
_SCORE_BUFFERS = 2    # float32 attention scores and their softmax, one layer at a time


def _as_config(config: Any, name: str) -> ModelConfig:
  """A DecoderConfig / T5Config, or the `.config` of a DecoderLM / T5."""
  if isinstance(config, (DecoderLM, T5)):
    config = config.config
  if not isinstance(config, (DecoderConfig, T5Config)):
    raise TypeError(f"{name} must be a DecoderConfig or a T5Config (or a DecoderLM / T5), "
                    f"got {type(config).__name__}")
  return config


def _model(config: ModelConfig):
  return DecoderLM(config) if isinstance(config, DecoderConfig) else T5(config)


def _abstract_mesh(data: int, model: int) -> AbstractMesh:
  """A mesh of shapes only: plans for devices that need not be attached."""
  return AbstractMesh((data, model), (DATA, MODEL))


@functools.lru_cache(maxsize=32)
def _param_shapes(config: ModelConfig) -> Tuple[Tuple[Tuple[str, ...], Tuple[int, ...], int], ...]:
  """(path, shape, itemsize) of every parameter, from `jax.eval_shape(init)`."""
  tree = jax.eval_shape(_model(config).init, jax.random.PRNGKey(0))
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return tuple((tuple(str(getattr(k, "key", k)) for k in path), tuple(x.shape),
                np.dtype(x.dtype).itemsize) for path, x in leaves)


@functools.lru_cache(maxsize=64)
def _cache_shapes(config: ModelConfig, batch_size: int, cache_len: int,
                  prompt_len: int) -> Tuple[jax.ShapeDtypeStruct, ...]:
  """Every buffer of `init_cache(batch_size, cache_len, prompt_len)`, abstractly."""
  model = _model(config)
  tree = jax.eval_shape(lambda: model.init_cache(batch_size, cache_len, prompt_len))
  return tuple(jax.tree_util.tree_leaves(tree))


def _shard_bytes(shape: Sequence[int], itemsize: int, spec, mesh: AbstractMesh) -> int:
  """Bytes of one device's shard of an array of `shape` laid out by `spec`."""
  n = itemsize
  for axis, size in enumerate(shape):
    name = spec[axis] if axis < len(spec) else None
    n *= size // mesh.shape[name] if name is not None else size
  return n


def _fitted(config: ModelConfig, mesh: AbstractMesh) -> ModelConfig:
  """The config as `parallel.sharding.fit_to_mesh` lays it out (kv heads repeated)."""
  if not isinstance(config, DecoderConfig):
    return config
  r = kv_head_repeats(config.num_heads, config.num_kv_heads, mesh.shape[MODEL])
  return config if r == 1 else config.replace(num_kv_heads=config.num_kv_heads * r)


def _params_bytes(config: ModelConfig, mesh: AbstractMesh) -> int:
  config = _fitted(config, mesh)
  return sum(_shard_bytes(shape, itemsize, param_spec(path, shape, mesh), mesh)
             for path, shape, itemsize in _param_shapes(config))


def _cache_bytes(config: ModelConfig, mesh: AbstractMesh, batch_size: int, cache_len: int,
                 prompt_len: int) -> int:
  config = _fitted(config, mesh)
  return sum(_shard_bytes(x.shape, np.dtype(x.dtype).itemsize, cache_spec(x, mesh), mesh)
             for x in _cache_shapes(config, batch_size, cache_len, prompt_len))


def _split(n: int, mesh: AbstractMesh, axis: str) -> int:
  """`n` over the mesh axis `axis` where it divides, else whole (replicated)."""
  size = mesh.shape[axis]
  return n // size if n % size == 0 else n


def _activation_bytes(config: ModelConfig, mesh: AbstractMesh, batch_size: int, tokens: int,
                      context: int, logit_tokens: Optional[int] = None) -> int:
  """The activation estimate of one call (see `memory_plan`)."""
  if isinstance(config, DecoderConfig):
    width, hidden, heads = config.d_model, config.mlp_dim, config.num_heads
  else:
    width, hidden, heads = config.d_model, config.d_ff, config.num_heads
  itemsize = np.dtype(config.dtype).itemsize
  rows = _split(batch_size, mesh, DATA) * tokens
  logits = _split(batch_size, mesh, DATA) * (tokens if logit_tokens is None else logit_tokens) \
      * config.vocab_size * 4
  if logits > GATHER_MAX_BYTES:   # left split over the vocabulary (`rules.whole_vocab`)
    logits = logits // mesh.shape[MODEL] if config.vocab_size % mesh.shape[MODEL] == 0 \
        else logits
  states = _HIDDEN_BUFFERS * rows * width * itemsize
  mlp = _MLP_BUFFERS * rows * _split(hidden, mesh, MODEL) * itemsize
  heads = _split(heads, mesh, MODEL)
  if (isinstance(config, DecoderConfig) and config.attention_kernel != "xla"
      and attention_kernel.fits(context, config.head_dim)):
    # Fused kernel: only the new tokens' [T, T] scores and its float32 partial output remain.
    scores = rows * heads * (_SCORE_BUFFERS * tokens + config.head_dim) * 4
  else:
    scores = _SCORE_BUFFERS * rows * heads * context * 4
  return logits + states + mlp + scores


def prompt_feature_bytes(batch_size: int, tokens: int, d_model: int, feature_width: int,
                         itemsize: int, data: int = 1) -> int:
  """The activation estimate of a head absorbing one prefill chunk of the target's features
  (`Drafter.absorb`: EAGLE), beside the target's own: B' rows (B over `data` where it divides)
  x T positions of the features `[X]` in the target's dtype (itemsize s), plus in float32 the
  head's fused feature (E), pair input (2 E) and the pair's keys and values (at most E):
  B' T (X s + 16 E) bytes per device."""
  batch_size, tokens = check_int("batch_size", batch_size, 1), check_int("tokens", tokens, 1)
  d_model = check_int("d_model", d_model, 1)
  feature_width = check_int("feature_width", feature_width, 1)
  itemsize = check_int("itemsize", itemsize, 1)
  rows = _split(batch_size, _abstract_mesh(check_int("data", data, 1), 1), DATA)
  return rows * tokens * (feature_width * itemsize + 4 * d_model * 4)


_COMPONENTS = ("target params", "target KV cache", "draft params", "draft KV cache",
               "activations (estimate)")


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  """Bytes per device of a speculative-decoding run on a (`data`, `model`) mesh.

  Attributes:
    mesh_shape: (data, model) axis sizes.
    batch_size, cache_len: B and the cache's S slots the plan is for.
    prompt_len: encoder positions held for cross-attention (T5), else unused.
    activation_tokens: T, the tokens of the call the activation estimate is for.
    has_draft: whether a draft is part of the plan.
    draft_sharded: the draft is split like the target (False: replicated).
    target_params, target_cache, draft_params, draft_cache, activations: bytes on one device
      (the largest shard; activations: an estimate, see `memory_plan`).
    unsharded: the same five components on a single device (a 1 x 1 mesh), in that order.
  """

  mesh_shape: Tuple[int, int]
  batch_size: int
  cache_len: int
  prompt_len: int
  activation_tokens: int
  has_draft: bool
  draft_sharded: bool
  target_params: int
  target_cache: int
  draft_params: int
  draft_cache: int
  activations: int
  unsharded: Tuple[int, int, int, int, int]

  @property
  def per_device_bytes(self) -> int:
    """Everything one device holds: params, caches and the activation estimate."""
    return (self.target_params + self.target_cache + self.draft_params + self.draft_cache
            + self.activations)

  @property
  def unsharded_bytes(self) -> int:
    """The same total on a single device."""
    return sum(self.unsharded)

  @property
  def mesh_name(self) -> str:
    """"data=D x model=M"."""
    return f"data={self.mesh_shape[0]} x model={self.mesh_shape[1]}"

  def components(self) -> Tuple[Tuple[str, int, int], ...]:
    """(name, bytes per device, bytes on a single device) of each component."""
    per_device = (self.target_params, self.target_cache, self.draft_params, self.draft_cache,
                  self.activations)
    rows = tuple(zip(_COMPONENTS, per_device, self.unsharded))
    return rows if self.has_draft else tuple(r for r in rows if not r[0].startswith("draft"))

  def describe(self, capacity_bytes: Optional[int] = None) -> str:
    """A readable table: each component per device and on a single device, the totals, and
    with `capacity_bytes` the headroom or shortfall."""
    draft = ("" if not self.has_draft
             else ", draft split" if self.draft_sharded else ", draft replicated")
    lines = [f"memory plan: mesh {self.mesh_name}, batch {self.batch_size}, "
             f"{self.cache_len} cache slots, activations of a {self.activation_tokens}-token "
             f"call{draft}",
             f"  {'component':<24}{'per device':>14}{'single device':>16}"]
    for name, per_device, whole in self.components():
      lines.append(f"  {name:<24}{format_bytes(per_device):>14}{format_bytes(whole):>16}")
    lines.append(f"  {'total':<24}{format_bytes(self.per_device_bytes):>14}"
                 f"{format_bytes(self.unsharded_bytes):>16}")
    if capacity_bytes is None:
      lines.append("  device capacity: unknown (the backend reports none)")
    else:
      spare = capacity_bytes - self.per_device_bytes
      verdict = (f"fits, {format_bytes(spare)} spare" if spare >= 0
                 else f"does not fit, short by {format_bytes(-spare)}")
      lines.append(f"  {'device capacity':<24}{format_bytes(capacity_bytes):>14}  ({verdict})")
    return "\n".join(lines)


def mesh_pair(mesh_shape: Any, name: str = "mesh_shape") -> Tuple[int, int]:
  """A (data, model) pair of ints >= 1, checked."""
  if not isinstance(mesh_shape, (tuple, list)) or len(mesh_shape) != 2:
    raise ValueError(f"{name} must be a (data, model) pair of ints >= 1, got {mesh_shape!r}")
  if any(isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1
         for n in mesh_shape):
    raise ValueError(f"{name} must be a (data, model) pair of ints >= 1, got {mesh_shape!r}")
  return int(mesh_shape[0]), int(mesh_shape[1])


def memory_plan(target_config: Any, draft_config: Any = None, *, mesh_shape: Tuple[int, int],
                batch_size: int, cache_len: int, draft_sharded: bool = False,
                activation_tokens: Optional[int] = None,
                prompt_len: Optional[int] = None,
                logit_tokens: Optional[int] = None) -> MemoryPlan:
  """Per-device bytes of params, caches and activations on a (data, model) mesh.

  Args:
    target_config, draft_config: `DecoderConfig`s or `T5Config`s (or the models); no draft: None.
    mesh_shape: (data, model) axis sizes (the devices need not be attached).
    batch_size: B rows, split over `data` where it divides.
    cache_len: S, the slots of each cache.
    draft_sharded: the draft is split like the target (False: replicated).
    activation_tokens: T, the tokens of the largest call (default: the context,
      `max(cache_len, prompt_len)`, an upper bound; a verification call is gamma + 1).
    prompt_len: encoder positions a T5 cache holds for cross-attention (default: cache_len);
      unused by decoders.
    logit_tokens: the positions of that call whose logits are computed (default: all T; a
      prefill projects only each row's last position: 1).

  Params: every leaf's shape in `param_dtype`, split as `parallel.sharding.param_spec` splits
  it over `model`, after `fit_to_mesh` (kv heads repeated to divide the model axis). Caches:
  `init_cache`'s buffers in `dtype` laid out by `cache_spec` (batch over `data`, heads over
  `model`, where they divide; T5: self- plus cross-attention keys and values).

  Activations, an estimate of one call of T tokens on B' = B / data rows (B when data does
  not divide B), F' / H' the MLP hidden units / heads over `model` where it divides, s the
  itemsize of `dtype`:

    logits         B' T_l V * 4      (float32, T_l = logit_tokens; / model above
                                      `rules.GATHER_MAX_BYTES`, where they stay vocab-split)
    hidden states  4 B' T E * s      (residual, normed, attention out, input)
    MLP            3 B' T F' * s     (gate, up, their product)
    attention      2 B' H' T C * 4   (float32 scores and softmax of one layer over the
                                      C = max(S, P) context; a fused attention kernel that
                                      takes the cache: B' H' T (2 T + D) * 4)

  One layer's buffers count once (the models materialise their residual stream after every
  block, `layers.block_boundary`); the target's and the draft's calls alternate, so the larger
  estimate counts. XLA's workspace (fusion temporaries, collectives) is not included: leave
  headroom.
  """
  target = _as_config(target_config, "target_config")
  draft = None if draft_config is None else _as_config(draft_config, "draft_config")
  data, model = mesh_pair(mesh_shape)
  batch_size = check_int("batch_size", batch_size, 1)
  cache_len = check_int("cache_len", cache_len, 1)
  prompt_len = cache_len if prompt_len is None else check_int("prompt_len", prompt_len, 1)
  check_bool("draft_sharded", draft_sharded)
  context = max(cache_len, prompt_len)
  tokens = context if activation_tokens is None else check_int("activation_tokens",
                                                                activation_tokens, 1)
  if logit_tokens is not None:
    logit_tokens = check_int("logit_tokens", logit_tokens, 1)

  def components(mesh: AbstractMesh, draft_mesh: AbstractMesh) -> Tuple[int, ...]:
    acts = [_activation_bytes(target, mesh, batch_size, tokens, context, logit_tokens)]
    row = [_params_bytes(target, mesh),
           _cache_bytes(target, mesh, batch_size, cache_len, prompt_len), 0, 0]
    if draft is not None:
      row[2] = _params_bytes(draft, draft_mesh)
      row[3] = _cache_bytes(draft, draft_mesh, batch_size, cache_len, prompt_len)
      acts.append(_activation_bytes(draft, draft_mesh, batch_size, tokens, context,
                                    logit_tokens))
    return tuple(row) + (max(acts),)

  mesh = _abstract_mesh(data, model)
  # A replicated draft's weights are whole on every device (`data` x 1); its cache rows split.
  per_device = components(mesh, mesh if draft_sharded else _abstract_mesh(data, 1))
  single = _abstract_mesh(1, 1)
  unsharded = components(single, single)
  return MemoryPlan(mesh_shape=(data, model), batch_size=batch_size, cache_len=cache_len,
                    prompt_len=prompt_len, activation_tokens=tokens,
                    has_draft=draft is not None, draft_sharded=draft_sharded,
                    target_params=per_device[0], target_cache=per_device[1],
                    draft_params=per_device[2], draft_cache=per_device[3],
                    activations=per_device[4], unsharded=unsharded)


def device_memory_bytes(device: Optional[jax.Device] = None) -> Optional[int]:
  """The memory of `device` (default: this process's first) in bytes,
  `memory_stats()["bytes_limit"]`; None where the backend reports none (CPU)."""
  if device is None:
    device = jax.local_devices()[0]
  stats = memory_stats_of(device)
  if not stats or not stats.get("bytes_limit"):
    return None
  return int(stats["bytes_limit"])


def check_fits(plan: MemoryPlan, capacity_bytes: Optional[int]) -> Optional[int]:
  """Raises a ValueError naming the mesh and the shortfall when `plan` needs more than
  `capacity_bytes` per device; returns the spare bytes (None: capacity unknown)."""
  if not isinstance(plan, MemoryPlan):
    raise TypeError(f"plan must be a MemoryPlan, got {type(plan).__name__}")
  if capacity_bytes is None:
    return None
  capacity_bytes = check_int("capacity_bytes", capacity_bytes, 1)
  spare = capacity_bytes - plan.per_device_bytes
  if spare < 0:
    what = "the target and draft do not" if plan.has_draft else "the target does not"
    raise ValueError(
        f"{what} fit a {plan.mesh_name} mesh: {format_bytes(plan.per_device_bytes)} per device "
        f"needed, {format_bytes(capacity_bytes)} available (short by {format_bytes(-spare)}); "
        "use more model-axis devices (config.mesh) or a smaller batch / cache")
  return spare
