"""The programs of a run, lowered with abstract, sharded arguments (nothing allocated).

`abstract_params` / `abstract_cache` give `jax.ShapeDtypeStruct` trees carrying the
`NamedSharding`s a run gives the real arrays (`parallel.sharding`). The `lower_*` functions
lower the very jitted functions a run executes (prefill, the autoregressive and speculative
loops, the sharded train steps), so `.compile()` compiles for whatever devices the mesh holds
(a TPU topology from `aot.chips.topology_devices`, or the local devices).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.layout import Format, Layout
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from specjax import generation
from specjax.measure.roofline import decode_reads
from specjax.models.eagle_head import init_eagle, shared_weights
from specjax.parallel.sharding import cache_spec, fsdp_spec, param_spec, rows_spec, state_spec
from specjax.sampling import SamplingConfig
from specjax.training.eagle import EagleLoss, _step_fn as eagle_step_fn
from specjax.training.mesh import sharded_jit, sharded_train_step, state_shardings
from specjax.training.optim import OptimizerSpec, make_optimizer
from specjax.training.steps import StepSpec, init_state

__all__ = ["abstract_params", "abstract_cache", "abstract_rows", "Lowered", "lower_prefill",
           "lower_ar_loop", "lower_speculative_loop", "lower_train_step",
           "lower_eagle_train_step", "lower_plan", "place_weights"]


def _struct(x, sharding) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


PARAM_LAYOUTS = ("default", "auto")


def _lower(jitted, static: Tuple[int, ...], donate: Tuple[str, ...], params_at: Tuple[int, ...],
           args, param_layouts: str = "default"):
  """`jitted.lower(*args)` (`static`: its static argument positions).

  `param_layouts="auto"`: the arguments at `params_at` in layouts the compiler chooses
  (`Layout.AUTO`, shardings kept): the program of a deployment that places its weights in the
  compiled `input_formats`, so no call copies a weight into the layout its loop wants."""
  if param_layouts not in PARAM_LAYOUTS:
    raise ValueError(f"param_layouts must be one of {PARAM_LAYOUTS}, got {param_layouts!r}")
  if param_layouts == "default":
    return jitted.lower(*args)
  shardings = tuple(
      jax.tree_util.tree_map(lambda x: Format(Layout.AUTO, x.sharding) if i in params_at
                             else x.sharding, a)
      for i, a in enumerate(args) if i not in static)
  return jax.jit(jitted.__wrapped__, static_argnums=static, donate_argnames=donate,
                 in_shardings=shardings).lower(*args)


def abstract_params(model, mesh: Mesh, replicated: bool = False):
  """`jax.eval_shape(model.init)` with the run's shardings (`replicated`: whole everywhere)."""
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  if replicated:
    return jax.tree_util.tree_map(lambda x: _struct(x, NamedSharding(mesh, P())), shapes)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: _struct(x, NamedSharding(mesh, param_spec(path, x.shape, mesh))), shapes)


def abstract_cache(model, mesh: Mesh, batch_size: int, cache_len: int, prompt_len: int,
                   replicated: bool = False):
  """`model.init_cache(...)`'s shapes with the run's shardings (`cache_spec`)."""
  shapes = jax.eval_shape(lambda: model.init_cache(batch_size, cache_len, prompt_len))
  spec = (lambda x: rows_spec(x.shape, mesh)) if replicated else (lambda x: cache_spec(x, mesh))
  return jax.tree_util.tree_map(lambda x: _struct(x, NamedSharding(mesh, spec(x))), shapes)


def _rows(mesh: Mesh, shape, dtype) -> jax.ShapeDtypeStruct:
  """An abstract array of rows `[B, ...]` laid out by `sharding.rows_spec`."""
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, rows_spec(shape, mesh)))


def abstract_rows(mesh: Mesh, batch_size: int, prompt_len: int):
  """(prompts `[B, P]` int32, lengths `[B]` int32, keys `[B, 2]` uint32), rows over `data`."""
  return (_rows(mesh, (batch_size, prompt_len), jnp.int32), _rows(mesh, (batch_size,), jnp.int32),
          _rows(mesh, (batch_size, 2), jnp.uint32))


@dataclasses.dataclass
class Lowered:
  """A lowered program and what it was lowered for.

  Attributes:
    name: e.g. "ar", "prefill target", "speculative draft-small γ=7".
    lowered: the `jax.stages.Lowered`.
    kind: "prefill" | "ar" | "speculative" | "train".
    tokens_per_call: T of the target call of one iteration (1 for AR).
    draft_calls: draft (or head) calls per iteration.
    draft_model: the model whose weights each draft call reads (None: e.g. prompt lookup).
    draft_replicated: whether the draft's weights are whole on every device.
    shared_args: (i, j, bytes per device) of flat argument leaves j passed again as leaf i
      (an EAGLE / Medusa drafter's params hold the target's: one buffer the compiler counts
      once per argument).
    prompt_hidden_width: X, the target features a drafter absorbs per prompt position during
      the prefill (`Drafter.needs_prompt_hidden`; else 0).
  """

  name: str
  lowered: Any
  kind: str
  tokens_per_call: int = 1
  draft_calls: int = 0
  draft_model: Any = None
  draft_replicated: bool = True
  slices: dict = dataclasses.field(default_factory=dict)
  shared_args: Tuple[Tuple[int, int, int], ...] = ()
  prompt_hidden_width: int = 0


def shared_leaves(*args) -> Tuple[Tuple[int, int, int], ...]:
  """(first index, repeated index, bytes per device) of every leaf object repeated in `args`."""
  first, out = {}, []
  for i, x in enumerate(jax.tree_util.tree_leaves(args)):
    if id(x) in first:
      out.append((first[id(x)], i, device_bytes(x)))
    else:
      first[id(x)] = i
  return tuple(out)


def device_bytes(tree) -> int:
  """Bytes one device holds of a tree of sharded `ShapeDtypeStruct`s (largest shards)."""
  total = 0
  for x in jax.tree_util.tree_leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
    total += int(np.prod(shape, dtype=np.int64)) * jnp.dtype(x.dtype).itemsize
  return total


@functools.partial(jax.jit, static_argnums=(0, 2), donate_argnames=("cache",))
def _prefill(model, params, sampling, prompts_BP, lengths_B, keys_B, cache):
  # The cache donated as `specjax.prefill` donates it (else the program holds two).
  return generation.run_prefill(model, params, sampling, prompts_BP, lengths_B, keys_B, cache)


def lower_prefill(model, mesh: Mesh, *, batch_size: int, prompt_len: int, cache_len: int,
                  sampling: SamplingConfig = SamplingConfig(), name: str = "prefill target",
                  replicated: bool = False, param_layouts: str = "default") -> Lowered:
  """The prefill of `model` on `[B, P]` prompts into `cache_len` slots (`param_layouts`:
  `_lower`)."""
  params = abstract_params(model, mesh, replicated)
  cache = abstract_cache(model, mesh, batch_size, cache_len, prompt_len, replicated)
  prompts, lengths, keys = abstract_rows(mesh, batch_size, prompt_len)
  with jax.set_mesh(mesh):
    lowered = _lower(_prefill, (0, 2), ("cache",), (1,),
                     (model, params, sampling, prompts, lengths, keys, cache), param_layouts)
  return Lowered(name, lowered, "prefill", tokens_per_call=prompt_len,
                 slices={"target_params": device_bytes(params),
                         "target_cache": device_bytes(cache)})


def lower_ar_loop(model, mesh: Mesh, *, batch_size: int, prompt_len: int, max_new_tokens: int,
                  cache_len: int, sampling: SamplingConfig = SamplingConfig(),
                  eos_id: Optional[int] = None, param_layouts: str = "default") -> Lowered:
  """`generation.autoregressive_loop` (`param_layouts`: `_lower`)."""
  dec = generation.AutoregressiveDecoder(model, sampling, max_new_tokens, eos_id, 0)
  params = abstract_params(model, mesh)
  cache = abstract_cache(model, mesh, batch_size, cache_len, prompt_len)
  prompts, lengths, keys = abstract_rows(mesh, batch_size, prompt_len)
  with jax.set_mesh(mesh):   # as `generate` traces it on a mesh (`sharding.decode_mesh`)
    lowered = _lower(generation.autoregressive_loop, (0,), ("cache", "prefilled"), (1,),
                     (dec, params, prompts, lengths, keys, cache), param_layouts)
  return Lowered("ar", lowered, "ar",
                 slices={"target_params": decode_bytes(params),
                         "target_cache": device_bytes(cache)})


def lower_speculative_loop(target, drafter, mesh: Mesh, *, gamma: int, batch_size: int,
                           prompt_len: int, max_new_tokens: int, cache_len: int,
                           draft_params_fn: Optional[Callable] = None,
                           draft_replicated: bool = True,
                           sampling: SamplingConfig = SamplingConfig(),
                           eos_id: Optional[int] = None, name: Optional[str] = None,
                           param_layouts: str = "default",
                           decoder: Optional[generation.SpeculativeDecoder] = None,
                           draft_cache_len: Optional[int] = None) -> Lowered:
  """`generation.speculative_loop` for a drafter and γ.

  `drafter`: a `specjax.drafting.Drafter`. Its params: a `ModelDrafter`'s model's (replicated
  or split per `draft_replicated`); otherwise `draft_params_fn(target_params)` builds the
  abstract tree (e.g. EAGLE's {"head": ..., "target": target_params}; None: no params); its
  state is laid out by `sharding.state_spec`. `param_layouts`: `_lower` (both models' params).
  `decoder`: the `SpeculativeDecoder` to lower (a plan's) instead of one built from the
  arguments; `draft_cache_len`: a draft model's cache slots (default `cache_len`).
  """
  tp = abstract_params(target, mesh)
  call_len = drafter.layout(gamma).length
  tcache = abstract_cache(target, mesh, batch_size, cache_len, prompt_len)
  if drafter.owns_model:
    dp = abstract_params(drafter.model, mesh, draft_replicated)
    dcache = abstract_cache(drafter.model, mesh, batch_size, draft_cache_len or cache_len,
                            prompt_len, draft_replicated)
    draft_model = drafter.model
  else:
    dp = draft_params_fn(tp) if draft_params_fn is not None else None
    shapes = jax.eval_shape(lambda: drafter.alloc(batch_size, prompt_len, cache_len, gamma))
    dcache = jax.tree_util.tree_map_with_path(lambda path, x: _struct(x, NamedSharding(
        mesh, state_spec(path, x.shape, mesh, drafter.splits_state))), shapes)
    draft_model = None
  prompts, lengths, keys = abstract_rows(mesh, batch_size, prompt_len)
  dec = decoder or generation.SpeculativeDecoder(target, drafter, gamma, sampling,
                                                 max_new_tokens, eos_id, 0)
  args = (dec, tp, dp, prompts, lengths, keys, tcache, dcache)
  if dec.adaptive is not None:   # no prefill given; the cost table over Γ, replicated
    args += (None, _struct(np.zeros(len(dec.adaptive.gammas), np.float32),
                           NamedSharding(mesh, P())))
  with jax.set_mesh(mesh):
    lowered = _lower(generation.speculative_loop, (0,),
                     ("target_cache", "draft_cache", "prefilled"), (1, 2), args,
                     param_layouts)
  width = 0
  if drafter.needs_prompt_hidden:
    width = target.config.d_model * max(1, len(drafter.hidden_layers or ()))
  return Lowered(name or f"speculative {type(drafter).__name__} γ={gamma}", lowered,
                 "speculative", tokens_per_call=call_len,
                 draft_calls=drafter.calls_per_iteration(gamma), draft_model=draft_model,
                 draft_replicated=draft_replicated,
                 shared_args=shared_leaves(tp, dp, prompts, lengths, keys, tcache, dcache),
                 prompt_hidden_width=width,
                 slices={"target_params": decode_bytes(tp), "target_cache": device_bytes(tcache),
                         "draft_params": _own_bytes(dp, tp), "draft_cache": device_bytes(dcache),
                         "draft_shared": (lm_head_bytes(tp) if drafter.reads_target_lm_head
                                          else 0)})


def lower_plan(plan, mesh: Mesh, *, draft_params_fn: Optional[Callable] = None,
               draft_replicated: bool = True, param_layouts: str = "default",
               name: Optional[str] = None) -> Lowered:
  """The program a `specjax.SpeculativePlan` runs, lowered for `mesh` (a TPU slice's devices,
  or this machine's): the plan's own decoder over its batch, prompt, token and cache sizes, so
  the program checked for a slice is the program the plan runs; with `param_layouts="auto"`
  its compiled `input_formats` say where the weights go (`place_weights`). `draft_params_fn`,
  `draft_replicated`: as in `lower_speculative_loop`. A `plain` plan: `lower_ar_loop`."""
  if plan.plain:
    raise ValueError("plan.plain: the plan runs plain decoding's program (lower_ar_loop), "
                     "not a speculative loop")
  return lower_speculative_loop(
      plan.target, plan.drafter, mesh, gamma=plan.gamma, batch_size=plan.batch_size,
      prompt_len=plan.prompt_len, max_new_tokens=plan.max_new_tokens, cache_len=plan.cache_len,
      draft_params_fn=draft_params_fn, draft_replicated=draft_replicated,
      sampling=plan.sampling, eos_id=plan.eos_id, name=name, param_layouts=param_layouts,
      decoder=plan.decoder(), draft_cache_len=plan.draft_cache_len)


def place_weights(compiled, target_params, draft_params=None):
  """`(target_params, draft_params)` placed in the formats (layout and sharding) a compiled
  speculative program takes them in (`compiled.input_formats`, e.g. of `lower_plan(...,
  param_layouts="auto")`), so no call copies them into the layouts its loop wants."""
  formats = compiled.input_formats[0]
  if len(formats) < 2:
    raise ValueError(f"compiled must be a speculative program (target and draft params "
                     f"first), got one taking {len(formats)} arguments")
  placed_target = jax.device_put(target_params, formats[0])
  placed_draft = None if draft_params is None else jax.device_put(draft_params, formats[1])
  return placed_target, placed_draft


def decode_bytes(params) -> int:
  """Per-device bytes of the params one decode step reads whole (`roofline.decode_reads`: no
  encoder, no cross-attention key / value kernels, no untied embedding's gathered rows)."""
  tied = not (isinstance(params, dict) and "lm_head" in params)
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  return device_bytes([x for path, x in leaves
                       if decode_reads([getattr(k, "key", k) for k in path], tied) == "whole"])


def lm_head_bytes(params) -> int:
  """Per-device bytes of a decoder's output head `[E, V]` (tied: the embedding)."""
  tied = not (isinstance(params, dict) and "lm_head" in params)
  return device_bytes(params["embed"]["embedding"] if tied else params["lm_head"]["kernel"])


def _own_bytes(draft_params, target_params) -> int:
  """Per-device bytes of a drafter's params not shared with the target (EAGLE / Medusa)."""
  if draft_params is None:
    return 0
  if isinstance(draft_params, dict) and "encoder" in draft_params:  # a T5 draft model
    return decode_bytes(draft_params)
  shared = {id(x) for x in jax.tree_util.tree_leaves(target_params)}
  return device_bytes([x for x in jax.tree_util.tree_leaves(draft_params) if id(x) not in shared])


def lower_train_step(model, mesh: Mesh, *, batch_size: int, seq_len: int,
                     name: str = "train draft") -> Lowered:
  """The sharded train step of `model` (`training.mesh.sharded_train_step`) on `[B, T]` token
  batches (T5: T encoder and T decoder positions)."""
  spec = StepSpec(model, OptimizerSpec())
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  state = jax.eval_shape(lambda p: init_state(spec, p, 0), params)
  shardings = state_shardings(state, mesh)
  state = jax.tree_util.tree_map(_struct, state, shardings)
  rows = functools.partial(_rows, mesh)
  tokens = rows((batch_size, seq_len), jnp.int32)
  batch = {"targets": tokens, "loss_mask": rows((batch_size, seq_len), jnp.float32)}
  if hasattr(model.config, "d_kv"):  # T5: encoder inputs, their lengths, decoder inputs
    batch.update(inputs=tokens, input_lengths=rows((batch_size,), jnp.int32),
                 decoder_inputs=tokens)
  else:
    batch["tokens"] = tokens
  step = sharded_train_step(spec, mesh, state)
  return Lowered(name, step.lower(state, batch, None), "train", tokens_per_call=seq_len,
                 slices={"train_state": device_bytes(state)})


def lower_eagle_train_step(target, config, mesh: Mesh, *, batch_size: int, seq_len: int,
                           name: str = "train EAGLE head") -> Lowered:
  """The EAGLE head's sharded train step (`training.eagle`: head, optimizer state and the
  target's shared embedding / LM head fsdp over `model`) on `[B, L]` rows of target features."""
  loss = EagleLoss.for_version(config.version)
  spec = OptimizerSpec()
  head = jax.eval_shape(lambda: init_eagle(config, jax.random.key(0)))
  opt = jax.eval_shape(make_optimizer(spec).init, head)
  rep = NamedSharding(mesh, P())
  fsdp = lambda tree: jax.tree_util.tree_map(
      lambda x: _struct(x, NamedSharding(mesh, fsdp_spec(x.shape, mesh))), tree)
  state = {"step": jax.ShapeDtypeStruct((), jnp.int32, sharding=rep), "params": fsdp(head),
           "opt_state": fsdp(opt)}
  tp = jax.eval_shape(target.init, jax.random.PRNGKey(0))
  shared = fsdp(jax.eval_shape(lambda p: shared_weights(target, p), tp))
  rows = functools.partial(_rows, mesh)
  c = target.config
  width = c.d_model * max(len(config.feature_layers), 1)
  act = jnp.dtype(c.dtype)
  feats = rows((batch_size, seq_len, width), act)
  final = rows((batch_size, seq_len, c.d_model), act)
  tokens = rows((batch_size, seq_len), jnp.int32)
  valid = rows((batch_size, seq_len), jnp.bool_)
  layout = jax.tree_util.tree_map(lambda x: x.sharding, state)
  step = sharded_jit(eagle_step_fn, (config, loss, spec), (layout, rep))
  return Lowered(name, step.lower(state, shared, feats, final, tokens, valid), "train",
                 tokens_per_call=seq_len,
                 slices={"train_state": device_bytes(state) + device_bytes(shared)})
