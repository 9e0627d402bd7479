"""Fuzzing the boundary of the public entry points: misuse is a named error.

`specjax.generate`, `specjax.speculative_generate` (with a separate draft
model and with `PromptLookup`) and `specjax.prefill` promise that every bad
argument is a ValueError / TypeError raised by specjax itself, naming the
argument, before anything is traced: not an XLA or numpy error from deep
inside, not an AttributeError, and never a silent result (an id outside the
vocabulary would be clamped by the embedding lookup, a too-short cache
clamped by its writes).

Hypothesis draws a valid call (batch, ragged prompts whose padding may hold
any id, lengths, max_new_tokens, γ, greedy or sampled with one key or a key
per row, EOS and pad ids, host or device arrays) and ONE malformation of it:
a wrong shape, dtype or type, a value out of range, None where an array
belongs, a batch that differs between prompts, lengths, keys and caches, a
cache too short or of another model, params of another model or with a leaf
deleted, cast or reshaped, a bad `nonfinite`. Each mutation kind is a test
case (so every kind runs); the variants and their values are drawn. Each
example asserts that:

  1. the valid call gets through every check (to the decoding loop);
  2. the malformed call raises ValueError or TypeError, from a frame of the
     specjax package, whose message names the argument.

The decoding loops (`AutoregressiveDecoder.run`, `SpeculativeDecoder.run`,
`run_prefill`) are replaced by a stub that raises `_ReachedLoop`: nothing is
compiled (only small helpers: the device id check, cache zeros), and a
malformed call that reaches the stub is a check that is missing (it would
have failed inside the trace, or silently returned tokens). 35 kinds x 16
examples, ~20 s on 2 CPU cores (~8 s of it the first case: model set-up).

What it caught, now checked at the boundary: ragged nested lists as prompts
or lengths (numpy's error, naming nothing); int64 host ids outside int32
with device lengths (wrapped into the vocabulary: a silent result); a key
that is a string or raw uint32 data of the wrong shape (JAX's error); a
cache that is not a cache (AttributeError) or another model's (a shape
error inside the trace); `nonfinite` an array (numpy's ambiguous truth
value); max_new_tokens, gamma or cache_len past int32 (out of memory).
"""

import os
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specjax
import specjax.api
from specjax.drafters import PromptLookup
from specjax.models.decoder import DecoderLM, decoder_config
from tiny import VOCAB, small_draft, target

SPECJAX_DIR = os.path.dirname(os.path.abspath(specjax.__file__)) + os.sep
APIS = ("generate", "spec_model", "spec_lookup", "prefill")
EXAMPLES = settings(max_examples=16, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
INT32_MAX = 2**31 - 1


class _ReachedLoop(Exception):
  """Raised by the stubbed decoding loops: every check passed."""


def _stub(*args, **kwargs):
  raise _ReachedLoop()


class Later:
  """A value made inside the checked call (SamplingConfig and drafter
  constructors check their fields: raising there counts)."""

  def __init__(self, make, what):
    self.make, self.what = make, what

  def __repr__(self):
    return self.what


DROP = object()  # an override that removes the argument


# ------------------------------------------------------------------ valid calls
@st.composite
def valid_calls(draw, api):
  """A valid call of `api` as a dict of roles (see `_kwargs`), plus facts
  mutations need (b, p, n, gamma, need)."""
  b = draw(st.integers(1, 3))
  p = draw(st.integers(1, 6))
  n = draw(st.integers(4, 6))
  lengths = np.array(draw(st.lists(st.integers(1, p), min_size=b, max_size=b)), np.int32)
  lengths[0] = p if draw(st.booleans()) else lengths[0]
  ids = draw(st.lists(st.integers(0, VOCAB - 1), min_size=b * p, max_size=b * p))
  pad = draw(st.sampled_from([0, VOCAB - 1, VOCAB + 3, -1]))  # padding is never read
  prompts = np.array(ids, np.int32).reshape(b, p)
  prompts[np.arange(p)[None] >= lengths[:, None]] = pad
  on_device = draw(st.booleans())  # the prompts; the lengths independently
  prompts = jnp.asarray(prompts) if on_device else prompts
  lengths = jnp.asarray(lengths) if draw(st.booleans()) else lengths
  if draw(st.booleans()) and bool(np.all(np.asarray(lengths) == p)):
    lengths = None
  gamma = draw(st.integers(1, max(1, n - 2))) if api.startswith("spec") else 0
  if draw(st.booleans()):
    sampling, key = specjax.GREEDY, draw(st.sampled_from([None, "one"]))
  else:
    sampling = specjax.SamplingConfig(draw(st.sampled_from([0.5, 1.0, 1.7])),
                                      top_k=draw(st.sampled_from([0, 5])),
                                      top_p=draw(st.sampled_from([1.0, 0.9])))
    key = draw(st.sampled_from(["one", "rows", "raw", "raw_rows"]))
  seed = draw(st.integers(0, 2**16))
  key = {None: None, "one": jax.random.key(seed),
         "rows": jax.random.split(jax.random.key(seed), b),
         "raw": jax.random.PRNGKey(seed),
         "raw_rows": jax.random.split(jax.random.PRNGKey(seed), b)}[key]
  call = dict(prompts=prompts, prompt_lengths=lengths, max_new_tokens=n, sampling=sampling,
              key=key)
  if api != "prefill":
    call.update(eos_id=draw(st.sampled_from([None, 0, 5, VOCAB - 1])),
                pad_id=draw(st.sampled_from([0, 3, VOCAB + 10])))
  if api != "generate":
    call["gamma"] = gamma
  if draw(st.booleans()):
    call["cache_len"] = p + n + gamma - 1 + draw(st.integers(0, 3))
  facts = dict(b=b, p=p, n=n, gamma=gamma, need=p + n + gamma - 1, on_device=on_device)
  return call, facts


def _kwargs(api, call):
  """The keyword arguments of `api` for a call of roles (model, params, cache
  are the target's: `target`, `target_params`, `target_cache` for
  speculative_generate)."""
  lm, params = target()
  kw = dict(call)
  model = kw.pop("model", lm)
  params = kw.pop("params", params)
  cache = kw.pop("cache", DROP)
  if api in ("generate", "prefill"):
    kw.update(model=model, params=params)
    if cache is not DROP:
      kw["cache"] = cache
  else:
    if api == "spec_model":
      draft, draft_params = small_draft()
    else:
      draft, draft_params = PromptLookup(max_ngram=2), None
    kw.setdefault("draft", draft)
    kw.setdefault("draft_params", draft_params)
    kw.update(target=model, target_params=params)
    if cache is not DROP:
      kw["target_cache"] = cache
  return kw


def _run(api, call):
  fn = {"generate": specjax.generate, "prefill": specjax.prefill}.get(
      api, specjax.speculative_generate)
  with mock.patch.object(specjax.api.AutoregressiveDecoder, "run", _stub), \
       mock.patch.object(specjax.api.SpeculativeDecoder, "run", _stub), \
       mock.patch.object(specjax.api, "run_prefill", _stub):
    return fn(**_kwargs(api, call))


def _role(api, role):
  """The argument name of a role in `api`."""
  if api.startswith("spec"):
    return {"model": "target", "params": "target_params", "cache": "target_cache"}[role]
  return role


# ------------------------------------------------------------------ mutations
# Each: (apis it applies to, fn(draw, api, call, facts) -> (overrides, names)):
# the call with `overrides` must raise naming one of `names`. A value in
# `overrides` may be `Later(make, what)` or DROP.
MUTATIONS = {}


def mutation(*apis):
  def register(fn):
    MUTATIONS[fn.__name__] = (apis or APIS, fn)
    return fn
  return register


def _np(x):
  return np.asarray(x)


@mutation()
def prompts_ndim(draw, api, call, f):
  x = _np(call["prompts"])
  bad = draw(st.sampled_from([x[0], x[..., None], x[None], x[0, 0]]))
  return dict(prompts=bad), ("prompts",)


@mutation()
def prompts_empty(draw, api, call, f):
  shape = draw(st.sampled_from([(0, f["p"]), (f["b"], 0), (0, 0)]))
  return dict(prompts=np.zeros(shape, np.int32), prompt_lengths=None), ("prompts",)


@mutation()
def prompts_dtype(draw, api, call, f):
  x = _np(call["prompts"])
  kind = draw(st.sampled_from(["f32", "f64", "bool", "complex", "str", "jnp_f32", "list_f"]))
  bad = {"f32": lambda: x.astype(np.float32), "f64": lambda: x.astype(np.float64),
         "bool": lambda: x > 3, "complex": lambda: x.astype(np.complex64),
         "str": lambda: x.astype(str), "jnp_f32": lambda: jnp.asarray(x, jnp.float32),
         "list_f": lambda: (x + 0.5).tolist()}[kind]()
  return dict(prompts=bad), ("prompts",)


@mutation()
def prompts_not_an_array(draw, api, call, f):
  bad = draw(st.sampled_from([None, "hello world", {"ids": 1}, 3,
                              [[1, 2, 3], [4]], [[1, [2]], [3, 4]]]))
  return dict(prompts=bad), ("prompts",)


@mutation()
def prompt_ids_out_of_vocab(draw, api, call, f):
  x = _np(call["prompts"]).copy()
  lengths = np.full(f["b"], f["p"]) if call["prompt_lengths"] is None else _np(
      call["prompt_lengths"])
  row = draw(st.integers(0, f["b"] - 1))
  pos = draw(st.integers(0, int(lengths[row]) - 1))
  if draw(st.booleans()):  # int64 on the host: any int64
    x = x.astype(np.int64)
    x[row, pos] = draw(st.one_of(st.integers(VOCAB, 2**63 - 1), st.integers(-2**63, -1)))
  else:
    x[row, pos] = draw(st.one_of(st.integers(VOCAB, INT32_MAX), st.integers(-2**31, -1)))
    x = jnp.asarray(x) if f["on_device"] else x
  return dict(prompts=x), ("prompts",)


@mutation()
def prompt_lengths_range(draw, api, call, f):
  lengths = np.full(f["b"], f["p"], np.int32) if call["prompt_lengths"] is None else _np(
      call["prompt_lengths"]).copy()
  lengths[draw(st.integers(0, f["b"] - 1))] = draw(
      st.one_of(st.integers(-2**31, 0), st.integers(f["p"] + 1, INT32_MAX)))
  return dict(prompt_lengths=jnp.asarray(lengths) if draw(st.booleans()) else lengths), \
      ("prompt_lengths",)


@mutation()
def prompt_lengths_shape(draw, api, call, f):
  b, p = f["b"], f["p"]
  bad = draw(st.sampled_from([np.full(b + 1, p), np.full((b, 1), p), np.int32(p),
                              np.full(b + 2, 1)] + ([np.full(b - 1, p)] if b > 1 else [])))
  return dict(prompt_lengths=bad), ("prompt_lengths",)


@mutation()
def prompt_lengths_dtype(draw, api, call, f):
  b, p = f["b"], f["p"]
  bad = draw(st.sampled_from([np.full(b, p, np.float32), jnp.full(b, p, jnp.float32),
                              np.ones(b, bool), [float(p)] * b, ["1"] * b]))
  return dict(prompt_lengths=bad), ("prompt_lengths",)


@mutation()
def prompt_lengths_not_an_array(draw, api, call, f):
  bad = draw(st.sampled_from([[[1], [1, 1]], [1, [1]], "3", {"a": 1}]))
  return dict(prompt_lengths=bad), ("prompt_lengths",)


@mutation()
def max_new_tokens_range(draw, api, call, f):
  bad = draw(st.one_of(st.integers(-2**40, 0), st.integers(INT32_MAX + 1, 2**62)))
  return dict(max_new_tokens=bad), ("max_new_tokens",)


@mutation()
def max_new_tokens_type(draw, api, call, f):
  bad = draw(st.sampled_from([4.0, np.float32(4), "4", None, True, np.array([4]),
                              jnp.int32(4), 4.5]))
  return dict(max_new_tokens=bad), ("max_new_tokens",)


@mutation("spec_model", "spec_lookup", "prefill")
def gamma_range(draw, api, call, f):
  if api == "prefill":
    bad = draw(st.one_of(st.integers(-2**40, -1), st.integers(INT32_MAX, 2**62)))
  else:  # too large is lowered with a warning, not an error
    bad = draw(st.integers(-2**40, 0))
  return dict(gamma=bad), ("gamma",)


@mutation("spec_model", "spec_lookup", "prefill")
def gamma_type(draw, api, call, f):
  bad = draw(st.sampled_from(["2", 2.0, None, True, np.float64(1), [2]]))
  return dict(gamma=bad), ("gamma",)


@mutation("generate", "spec_model", "spec_lookup")
def eos_id_bad(draw, api, call, f):
  bad = draw(st.one_of(st.integers(VOCAB, 2**62), st.integers(-2**62, -1),
                       st.sampled_from([5.0, "5", True, np.float32(5)])))
  return dict(eos_id=bad), ("eos_id",)


@mutation("generate", "spec_model", "spec_lookup")
def pad_id_bad(draw, api, call, f):
  bad = draw(st.one_of(st.integers(-2**62, -1), st.sampled_from([0.0, "0", None, False])))
  return dict(pad_id=bad), ("pad_id",)


@mutation()
def sampling_type(draw, api, call, f):
  bad = draw(st.sampled_from([0.5, 0, "greedy", None, {"temperature": 1.0},
                              specjax.SamplingConfig]))
  return dict(sampling=bad), ("sampling",)


@mutation()
def sampling_fields(draw, api, call, f):
  field, value = draw(st.sampled_from([
      ("temperature", -1.0), ("temperature", float("nan")), ("temperature", float("inf")),
      ("temperature", "1"), ("temperature", None), ("top_k", -1), ("top_k", 2.0),
      ("top_p", 0.0), ("top_p", 1.5), ("top_p", float("nan")), ("top_p", -0.1)]))
  return dict(sampling=Later(lambda: specjax.SamplingConfig(**{field: value}),
                             f"SamplingConfig({field}={value!r})")), (field,)


@mutation()
def key_missing(draw, api, call, f):
  return dict(sampling=specjax.SamplingConfig(1.0), key=None), ("key",)


@mutation()
def key_batch(draw, api, call, f):
  b = f["b"]
  other = draw(st.sampled_from([x for x in (1, 2, 3, 4, 5) if x != b]))
  if draw(st.booleans()):
    bad = jax.random.split(jax.random.key(0), other)
  else:
    bad = jax.random.split(jax.random.PRNGKey(0), other)
  if other == 1 and draw(st.booleans()):
    bad = jax.random.split(jax.random.key(0), (b, 1))  # [B, 1]: rank 2
  return dict(key=bad), ("key",)


@mutation()
def key_dtype(draw, api, call, f):
  b = f["b"]
  bad = draw(st.sampled_from([
      np.zeros(2, np.float32), jnp.zeros(2, jnp.float32), np.zeros(2, np.int32),
      np.ones(2, bool), "key", 0, 1.5, np.zeros(3, np.uint32), np.zeros((b, 3), np.uint32),
      np.zeros((b, 2, 2), np.uint32), np.zeros((), np.uint32), [[0, 1], [2]]]))
  return dict(key=bad), ("key",)


@mutation()
def model_bad(draw, api, call, f):
  return dict(model=draw(st.sampled_from([None, object(), "tiny", target()[1]]))), \
      (_role(api, "model"),)


@mutation()
def params_none(draw, api, call, f):
  return dict(params=None), (_role(api, "params"),)


def _leaves(params):
  return jax.tree_util.tree_flatten_with_path(params)


def _rebuild(params, fn):
  """`params` with fn(index, leaf) applied to each leaf (a nested dict)."""
  leaves, tree = jax.tree_util.tree_flatten(params)
  return jax.tree_util.tree_unflatten(tree, [fn(i, x) for i, x in enumerate(leaves)])


def _delete(tree, path):
  if len(path) == 1:
    return {k: v for k, v in tree.items() if k != path[0]}
  return {**tree, path[0]: _delete(tree[path[0]], path[1:])}


@st.composite
def broken_params(draw, params):
  """params of another model, or with one leaf deleted, cast to int32,
  reshaped, or replaced by a non-array; or not a tree at all."""
  how = draw(st.sampled_from(["other", "deleted", "int32", "reshaped", "string", "extra",
                              "empty", "list"]))
  leaves = _leaves(params)[0]
  i = draw(st.integers(0, len(leaves) - 1))
  if how == "other":
    lm_params, draft_params = target()[1], small_draft()[1]
    return draft_params if params is lm_params else lm_params
  if how == "deleted":
    return _delete(params, [k.key for k in leaves[i][0]])
  if how == "int32":
    return _rebuild(params, lambda j, x: x.astype(jnp.int32) if j == i else x)
  if how == "reshaped":
    return _rebuild(params, lambda j, x: x.reshape(-1)[:-1] if j == i else x)
  if how == "string":
    return _rebuild(params, lambda j, x: "weights" if j == i else x)
  if how == "extra":
    return {**params, "extra": {"kernel": jnp.zeros((2, 2))}}
  return {"empty": {}, "list": [x for _, x in leaves]}[how]


@mutation()
def params_broken(draw, api, call, f):
  return dict(params=draw(broken_params(target()[1]))), (_role(api, "params"),)


@mutation("spec_model")
def draft_params_broken(draw, api, call, f):
  bad = draw(st.one_of(st.none(), broken_params(small_draft()[1])))
  return dict(draft_params=bad), ("draft_params",)


@mutation("generate", "spec_model", "spec_lookup")
def cache_batch(draw, api, call, f):
  other = draw(st.sampled_from([x for x in (1, 2, 3, 4) if x != f["b"]]))
  lm = target()[0]
  make = lambda: lm.init_cache(other, f["need"] + 2, f["p"])  # noqa: E731
  return dict(cache=Later(make, f"target cache of batch {other}")), (_role(api, "cache"),)


@mutation("generate", "spec_model", "spec_lookup")
def cache_short(draw, api, call, f):
  lm = target()[0]
  slots = draw(st.integers(1, f["need"] - 1))
  return dict(cache=Later(lambda: lm.init_cache(f["b"], slots, f["p"]), f"{slots} slots"),
              cache_len=DROP), \
      (_role(api, "cache"),)


@mutation("generate", "spec_model", "spec_lookup")
def cache_not_a_cache(draw, api, call, f):
  bad = draw(st.sampled_from(["cache", 3, {"lengths": 1}, [], np.zeros((f["b"], 8))]))
  return dict(cache=bad), (_role(api, "cache"),)


@mutation("generate", "spec_model", "spec_lookup")
def cache_of_another_model(draw, api, call, f):
  """Enough slots, the right batch: another model's layers, heads or head
  size (the cache would fail inside the trace), or a drafter's state."""
  b, p, slots = f["b"], f["p"], f["need"] + draw(st.integers(0, 3))
  other = draw(st.sampled_from(["small_draft", "narrow", "lookup state"]))
  if other == "lookup state":
    make = lambda: PromptLookup().alloc(b, p, slots, 1)  # noqa: E731
  else:
    lm = small_draft()[0] if other == "small_draft" else DecoderLM(decoder_config(
        "tiny", vocab_size=VOCAB, num_layers=2, d_model=16, num_heads=2, num_kv_heads=1,
        mlp_dim=32))  # the target's layers, other heads
    make = lambda: lm.init_cache(b, slots, p)  # noqa: E731
  return dict(cache=Later(make, f"a cache of {other}")), (_role(api, "cache"),)


@mutation("spec_model")
def draft_cache_bad(draw, api, call, f):
  dm, lm = small_draft()[0], target()[0]
  b, need = f["b"], f["need"]
  how = draw(st.sampled_from(["batch", "short", "target's", "string"]))
  bad = {"batch": Later(lambda: dm.init_cache(b + 1, need, f["p"]), f"batch {b + 1}"),
         "short": Later(lambda: dm.init_cache(b, need - 1, f["p"]), f"{need - 1} slots"),
         "target's": Later(lambda: lm.init_cache(b, need, f["p"]), "the target's cache"),
         "string": "cache"}[how]
  return dict(draft_cache=bad, cache_len=DROP), ("draft_cache",)


@mutation("spec_lookup")
def draft_cache_for_lookup(draw, api, call, f):
  lm = target()[0]
  make = lambda: lm.init_cache(f["b"], f["need"], f["p"])  # noqa: E731
  return dict(draft_cache=Later(make, "a cache")), \
      ("draft_cache",)


@mutation()
def cache_len_bad(draw, api, call, f):
  bad = draw(st.one_of(st.integers(-2**40, f["need"] - 1), st.integers(INT32_MAX + 1, 2**62),
                       st.sampled_from([float(f["need"] + 5), "64", np.float64(64), True])))
  return dict(cache_len=bad), ("cache_len",)


@mutation("generate", "spec_model", "spec_lookup")
def nonfinite_bad(draw, api, call, f):
  bad = draw(st.sampled_from(["bogus", "RAISE", None, 1, True, ["raise"],
                              np.array(["raise", "warn"]), ""]))
  return dict(nonfinite=bad), ("nonfinite",)


@mutation("spec_model", "spec_lookup")
def draft_bad(draw, api, call, f):
  how = draw(st.sampled_from(["none", "object", "string", "max_ngram", "min_ngram"]))
  if how == "max_ngram":
    return dict(draft=Later(lambda: PromptLookup(max_ngram=0), "max_ngram=0")), ("max_ngram",)
  if how == "min_ngram":
    return dict(draft=Later(lambda: PromptLookup(max_ngram=2, min_ngram=3), "min_ngram=3")), \
        ("min_ngram",)
  return dict(draft={"none": None, "object": object(), "string": "lookup"}[how]), ("draft",)


@mutation("spec_model", "spec_lookup")
def verify_fn_bad(draw, api, call, f):
  return dict(verify_fn=draw(st.sampled_from([None, "rejection", 3]))), ("verify_fn",)


@mutation("generate", "spec_model", "spec_lookup")
def prefilled_bad(draw, api, call, f):
  lm = target()[0]
  b, p, need = f["b"], f["p"], f["need"]

  def made(batch, slots):
    return Later(lambda: specjax.Prefill(first=jnp.zeros(batch, jnp.int32),
                                         last=jnp.zeros(batch, jnp.int32),
                                         cache=lm.init_cache(batch, slots, p),
                                         nonfinite=jnp.zeros(batch, jnp.int32)),
                 f"Prefill of batch {batch}, {slots} slots")

  how = draw(st.sampled_from(["type", "batch", "short", "and cache"]))
  over = {"type": dict(prefilled=draw(st.sampled_from(["prefill", (1, 2), 0]))),
          "batch": dict(prefilled=made(b + 1, need)),
          "short": dict(prefilled=made(b, need - 1)),
          "and cache": dict(prefilled=made(b, need),
                            cache=Later(lambda: lm.init_cache(b, need, p), "a cache"))}
  return {**over[how], "cache_len": DROP}, ("prefilled",)


# ------------------------------------------------------------------ the test
def _origin(e: BaseException) -> str:
  tb = e.__traceback__
  while tb.tb_next is not None:
    tb = tb.tb_next
  return tb.tb_frame.f_code.co_filename


@pytest.mark.parametrize("kind", sorted(MUTATIONS))
@EXAMPLES
@given(data=st.data())
def test_one_malformed_argument_is_a_named_error(kind, data):
  apis, mutate = MUTATIONS[kind]
  api = data.draw(st.sampled_from(apis), label="api")
  call, facts = data.draw(valid_calls(api), label="valid call")
  if kind in ("prefilled_bad", "cache_batch", "cache_of_another_model", "cache_not_a_cache"):
    call.pop("cache_len", None)  # a cache and cache_len are not both given
  with pytest.raises(_ReachedLoop):  # 1. the valid call passes every check
    _run(api, call)
  overrides, names = mutate(data.draw, api, call, facts)
  bad = {k: v for k, v in {**call, **overrides}.items() if v is not DROP}
  note = f"{api}: {kind} {overrides!r}"
  try:
    _run(api, {k: v.make() if isinstance(v, Later) else v for k, v in bad.items()})
  except _ReachedLoop:
    pytest.fail(f"{note}: passed every check and reached the decoding loop (a silent result "
                "or an error from inside the trace)")
  except (ValueError, TypeError) as e:  # 2. a named error from specjax
    where = _origin(e)
    assert where.startswith(SPECJAX_DIR), \
        f"{note}: {type(e).__name__} raised in {where}, not by specjax: {e}"
    assert any(name in str(e) for name in names), \
        f"{note}: {type(e).__name__} does not name {' / '.join(names)}: {e}"
  except Exception as e:  # noqa: BLE001 - any other kind is the finding
    pytest.fail(f"{note}: {type(e).__name__} (not ValueError / TypeError) from "
                f"{_origin(e)}: {e}")
