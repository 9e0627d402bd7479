"""A probe of malformed and adversarial calls through specjax's public API, as an outsider makes them.

  python benchmarks/bad_input_probe.py            # a few minutes on 2 cores
  python benchmarks/bad_input_probe.py --quick    # every case but the slow loaders'

Each case makes one call (`specjax.generate`, `speculative_generate`, `prefill`, `SamplingConfig`,
the drafters, `AdaptiveGamma`, the configs, the tokenizers and the loaders on small files written
to a temporary directory) and is classified by what came back:

  named_refusal       a ValueError / TypeError (or FloatingPointError, OSError) raised by
                      specjax's own code whose message names the argument at fault;
  correct_acceptance  the call returned and its result was checked: the greedy reference's
                      tokens (a plain loop of full prefills, and `generate` on clean input),
                      or tokens finite and in the vocabulary, the same for the same key;
  silent_wrong        the call returned a result that is not what was asked for (or accepted
                      what it should have refused: a contradicting argument, ignored);
  unnamed_refusal     specjax raised, but the message does not name the argument (or the
                      exception is of another kind);
  outside_error       an exception raised outside specjax's code (XLA, jax, numpy, the
                      standard library), which names nothing of the call.

The cases were written from the public docstrings, the README and docs/ alone. Writes
`bad_input_probe.json` (every case, its class and the first line of what it said) and
`bad_input_probe.md` into --out_dir, both atomically and with the run's provenance.
`cases(fixtures)` is importable: `tests/test_bad_input_probe.py` runs a subset.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import struct
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

os.environ.setdefault("JAX_TRACEBACK_FILTERING", "off")   # see where an error was raised

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import specjax  # noqa: E402
from specjax import GREEDY, SamplingConfig  # noqa: E402

CLASSES = ("named_refusal", "correct_acceptance", "silent_wrong", "unnamed_refusal",
           "outside_error")
_SPECJAX_DIR = os.path.dirname(os.path.abspath(specjax.__file__))
_REFUSALS = (ValueError, TypeError, FloatingPointError, OSError)

_DEFAULT = object()   # an argument left at the standard call's value
V = 64        # the tiny models' vocabulary
N = 8         # max_new_tokens of the standard call
B, P = 2, 6   # the standard batch


@dataclasses.dataclass(frozen=True)
class Case:
  """One call. `fn()` returns True when it returned a verified result, else a string saying
  what is wrong with what it returned; `names`: what a refusal must name (any of them)."""

  group: str
  name: str
  fn: Callable[[], Any]
  names: Tuple[str, ...]


class Fixtures:
  """The tiny models, params, prompts and references every case shares (built once)."""

  def __init__(self, tmp: str):
    self.tmp = tmp
    self.target = specjax.DecoderLM(specjax.decoder_config("tiny"))
    self.draft = specjax.DecoderLM(specjax.decoder_config(
        "tiny", num_layers=1, d_model=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32))
    self.tp = self.target.init(jax.random.PRNGKey(0))
    self.dp = self.draft.init(jax.random.PRNGKey(1))
    self.prompts = np.array([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]], np.int32)
    self.lengths = np.array([6, 3], np.int32)
    self.keys = jax.random.split(jax.random.key(0), B)
    self._bigram = None

  # The references, computed when a case first needs them (refusals need none).
  @functools.cached_property
  def ref(self):
    return specjax.generate(self.target, self.tp, self.prompts, self.lengths, max_new_tokens=N,
                            sampling=GREEDY)

  @functools.cached_property
  def ref_tokens(self) -> np.ndarray:
    return np.asarray(self.ref.tokens)

  @functools.cached_property
  def ref_lengths(self) -> np.ndarray:
    return np.asarray(self.ref.lengths)

  @functools.cached_property
  def naive(self) -> np.ndarray:
    return naive_greedy(self.target, self.tp, self.prompts, self.lengths, N)

  def bigram(self):
    """A bigram target and draft whose argmax cycles agree on half the vocabulary."""
    if self._bigram is None:
      def table(agree):
        t = np.full((V, V), -20.0, np.float32)
        for a in range(V):
          half, base = (0, 0) if a < V // 2 else (1, V // 2)
          step = 1 if (agree or half == 0) else 5
          t[a, base + (a - base + step) % (V // 2)] = 0.0
        return {"logits": jnp.asarray(t)}
      self._bigram = (specjax.BigramLM(V), table(True), table(False))
    return self._bigram


def naive_greedy(model, params, prompts, lengths, n: int) -> np.ndarray:
  """Greedy tokens by a full causal forward of the growing sequence at every step (no cache;
  one fixed-width buffer, so one compiled program)."""
  forward = jax.jit(model.forward)
  out = np.zeros((len(prompts), n), np.int32)
  for r in range(len(prompts)):
    length = int(lengths[r])
    buf = np.zeros((1, prompts.shape[1] + n), np.int32)
    buf[0, :length] = np.asarray(prompts[r, :length])
    for i in range(n):
      logits = np.asarray(forward(params, jnp.asarray(buf)))
      out[r, i] = int(np.argmax(logits[0, length - 1]))
      buf[0, length] = out[r, i]
      length += 1
  return out


# --- verdicts -------------------------------------------------------------------------------


def same_as_ref(fx: Fixtures, out, tokens=None, lengths=None) -> Any:
  """True when `out` holds the greedy reference's tokens."""
  tokens = fx.ref_tokens if tokens is None else tokens
  lengths = fx.ref_lengths if lengths is None else lengths
  got_t, got_l = np.asarray(out.tokens), np.asarray(out.lengths)
  if got_t.shape != tokens.shape or not np.array_equal(got_t, tokens):
    return f"tokens differ from the greedy reference: {got_t.tolist()} vs {tokens.tolist()}"
  if not np.array_equal(got_l, lengths):
    return f"lengths {got_l.tolist()} vs {lengths.tolist()}"
  return True


def sane(out, n: int = N, vocab: int = V, batch: int = B) -> Any:
  """True when `out` has `batch` rows of tokens in [0, vocab), lengths in [1, n], no
  non-finite call."""
  t, lens = np.asarray(out.tokens), np.asarray(out.lengths)
  if t.shape != (batch, n):
    return f"tokens of shape {t.shape}, expected {(batch, n)}"
  if t.min() < 0 or t.max() >= vocab:
    return f"tokens outside [0, {vocab}): {t.tolist()}"
  if lens.min() < 1 or lens.max() > n:
    return f"lengths outside [1, {n}]: {lens.tolist()}"
  if np.asarray(out.stats.nonfinite).any():
    return f"non-finite calls {np.asarray(out.stats.nonfinite).tolist()}"
  return True


def should_refuse(what: str) -> str:
  """The verdict of a call that returned where it should have refused."""
  return f"accepted: {what}"


def both(*verdicts) -> Any:
  for v in verdicts:
    if v is not True:
      return v
  return True


# --- classification -------------------------------------------------------------------------


def _raised_by_specjax(err: BaseException) -> bool:
  """Whether `err` was raised by a `raise` statement in specjax's own code (not by jax / numpy /
  the standard library under a specjax frame)."""
  tb = err.__traceback__
  last = None
  while tb is not None:
    last = tb
    tb = tb.tb_next
  if last is None:
    return False
  filename = os.path.abspath(last.tb_frame.f_code.co_filename)
  if not filename.startswith(_SPECJAX_DIR + os.sep):
    return False
  return any(a <= last.tb_lineno <= b for a, b in _raise_spans(filename))


@functools.lru_cache(maxsize=None)
def _raise_spans(filename: str) -> Tuple[Tuple[int, int], ...]:
  """The (first, last) lines of every `raise` statement of a source file."""
  import ast
  with open(filename, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  return tuple((n.lineno, n.end_lineno) for n in ast.walk(tree) if isinstance(n, ast.Raise))


def classify(case: Case) -> Dict[str, Any]:
  start = time.perf_counter()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
      verdict = case.fn()
      err = None
    except Exception as e:  # the probe's subject: any exception is classified
      err = e
  said = [str(w.message).splitlines()[0][:200] for w in caught
          if not issubclass(w.category, DeprecationWarning)][:3]
  rec = {"group": case.group, "case": case.name, "seconds": round(time.perf_counter() - start, 3),
         "warnings": said}
  if err is None:
    if verdict is True:
      rec.update(outcome="correct_acceptance", detail="")
    else:
      rec.update(outcome="silent_wrong", detail=str(verdict)[:300])
    return rec
  msg = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
  if not _raised_by_specjax(err):
    where = traceback.extract_tb(err.__traceback__)[-1]
    rec.update(outcome="outside_error",
               detail=f"{msg} (raised at {os.path.basename(where.filename)}:{where.lineno})")
  elif isinstance(err, _REFUSALS) and any(n.lower() in str(err).lower() for n in case.names):
    rec.update(outcome="named_refusal", detail=msg)
  else:
    rec.update(outcome="unnamed_refusal", detail=f"{msg} (should name one of {case.names})")
  return rec


# --- the cases ------------------------------------------------------------------------------


def cases(fx: Fixtures, quick: bool = False) -> List[Case]:
  """Every case of the probe, on the shared fixtures."""
  out: List[Case] = []

  def add(group, name, fn, *names):
    out.append(Case(group, name, fn, tuple(names)))

  t, tp, d, dp = fx.target, fx.tp, fx.draft, fx.dp
  pr, ln = fx.prompts, fx.lengths

  def gen(prompts=_DEFAULT, lengths=_DEFAULT, **kw):
    kw.setdefault("max_new_tokens", N)
    kw.setdefault("sampling", GREEDY)
    return specjax.generate(kw.pop("model", t), kw.pop("params", tp),
                            pr if prompts is _DEFAULT else prompts,
                            ln if lengths is _DEFAULT else lengths, **kw)

  def spec(prompts=_DEFAULT, lengths=_DEFAULT, draft=_DEFAULT, draft_params=_DEFAULT, **kw):
    kw.setdefault("max_new_tokens", N)
    kw.setdefault("sampling", GREEDY)
    kw.setdefault("gamma", 3)
    return specjax.speculative_generate(
        kw.pop("target", t), kw.pop("target_params", tp), d if draft is _DEFAULT else draft,
        dp if draft_params is _DEFAULT else draft_params,
        pr if prompts is _DEFAULT else prompts, ln if lengths is _DEFAULT else lengths, **kw)

  # 0. The references agree (a plain full-prefill loop vs generate vs speculative_generate).
  add("reference", "generate equals a loop of full prefills",
      lambda: same_as_ref(fx, fx.ref, fx.naive), "-")
  add("reference", "speculative greedy equals the reference", lambda: same_as_ref(fx, spec()),
      "-")

  # 1. Prompts: containers, dtypes, shapes, ranges.
  good_like = {
      "python lists": pr.tolist(), "int64 array": pr.astype(np.int64),
      "uint8 array": pr.astype(np.uint8), "int16 array": pr.astype(np.int16),
      "Fortran order": np.asfortranarray(pr), "read-only": _read_only(pr),
      "strided view": np.repeat(pr, 2, axis=1)[:, ::2], "jax device array": jnp.asarray(pr),
      "tuple of tuples": tuple(tuple(r) for r in pr.tolist()),
  }
  for name, value in good_like.items():
    add("prompts", f"prompts as {name}", lambda v=value: same_as_ref(fx, gen(v)), "prompts")
    add("prompts", f"prompts as {name} (speculative)",
        lambda v=value: same_as_ref(fx, spec(v)), "prompts")
  bad_prompts = {
      "float32 with fractions": pr.astype(np.float32) + 0.5,
      "float32 integral": pr.astype(np.float32), "float64": pr.astype(np.float64),
      "bool": pr.astype(bool), "complex": pr.astype(np.complex64),
      "negative id": np.where(pr == 5, -1, pr), "id == vocab": np.where(pr == 5, V, pr),
      "id beyond int32": np.where(pr == 5, 2**40, pr.astype(np.int64)),
      "1-D": pr[0], "3-D": pr[None], "0 rows": pr[:0], "0 columns": pr[:, :0],
      "ragged lists": [[5, 6, 7], [1, 2]], "a string": "hello", "None": None,
      "object array": np.array([[5, "a", 7, 8, 9, 10], [1, 2, 3, 4, 5, 6]], object),
      "NaN floats": np.full((B, P), np.nan, np.float32), "a scalar": 5,
      "dict": {"ids": pr}, "bytes": b"\x05\x06",
  }
  for name, value in bad_prompts.items():
    add("prompts", f"prompts {name}",
        lambda v=value, nm=name: _maybe_exact(fx, lambda: gen(v), nm), "prompts")
    add("prompts", f"prompts {name} (speculative)",
        lambda v=value, nm=name: _maybe_exact(fx, lambda: spec(v), nm), "prompts")
  # Padding past a row's length is never read: any int32 there.
  for name, fill in (("vocab", V), ("-1", -1), ("int32 max", 2**31 - 1), ("int32 min", -2**31)):
    padded = pr.copy()
    padded[1, 3:] = fill
    add("padding", f"padding holds {name}", lambda v=padded: same_as_ref(fx, gen(v)), "prompts")
    add("padding", f"padding holds {name} (speculative)",
        lambda v=padded: same_as_ref(fx, spec(v)), "prompts")
    add("padding", f"padding holds {name} (prompt lookup)",
        lambda v=padded: same_as_ref(fx, spec(v, draft=specjax.drafters.PromptLookup(),
                                              draft_params=None)), "prompts")

  # 2. Prompt lengths.
  bad_lengths = {
      "0": np.array([6, 0]), "above P": np.array([7, 3]), "negative": np.array([6, -2]),
      "float": np.array([6.0, 3.0]), "float fractional": np.array([6.0, 2.5]),
      "bool": np.array([True, True]), "too many": np.array([6, 3, 3]), "2-D": np.array([[6, 3]]),
      "a string": "63", "int64 huge": np.array([6, 2**40], np.int64), "a scalar": 3,
      "int64 wrapping to 3": np.array([6, 2**32 + 3], np.int64),
      "None with padding": None, "NaN": np.array([6.0, np.nan]),
  }
  for name, value in bad_lengths.items():
    if name == "None with padding":   # documented default: all P (the padding read as tokens)
      add("lengths", "prompt_lengths None: all P",
          lambda: same_as_ref(fx, gen(pr[:1], None), *_single_ref(fx, t, tp, pr[:1], P)),
          "prompt_lengths")
      continue
    add("lengths", f"prompt_lengths {name}",
        lambda v=value, nm=name: _maybe_exact(fx, lambda: gen(lengths=v), nm),
        "prompt_lengths", "lengths")
    add("lengths", f"prompt_lengths {name} (speculative)",
        lambda v=value, nm=name: _maybe_exact(fx, lambda: spec(lengths=v), nm),
        "prompt_lengths", "lengths")
  add("lengths", "prompt_lengths as a python list",
      lambda: same_as_ref(fx, gen(lengths=[6, 3])), "prompt_lengths")
  add("lengths", "prompt_lengths as a jax array",
      lambda: same_as_ref(fx, gen(lengths=jnp.asarray(ln))), "prompt_lengths")

  # 3. max_new_tokens.
  for name, value in {"0": 0, "-1": -1, "float": 4.0, "str": "4", "True": True, "None": None,
                      "2**31": 2**31, "2**40": 2**40, "NaN": float("nan"),
                      "needs 100 GB": 2**30}.items():
    add("max_new_tokens", f"max_new_tokens {name}",
        lambda v=value: should_refuse(f"max_new_tokens={v!r}") if gen(max_new_tokens=v) else "",
        "max_new_tokens", "memory", "bytes")
    add("max_new_tokens", f"max_new_tokens {name} (speculative)",
        lambda v=value: should_refuse(f"max_new_tokens={v!r}") if spec(max_new_tokens=v) else "",
        "max_new_tokens", "memory", "bytes")
  add("max_new_tokens", "max_new_tokens 1",
      lambda: same_as_ref(fx, gen(max_new_tokens=1), fx.ref_tokens[:, :1],
                          np.ones(B, np.int32)), "max_new_tokens")
  add("max_new_tokens", "max_new_tokens numpy int",
      lambda: same_as_ref(fx, gen(max_new_tokens=np.int64(N))), "max_new_tokens")
  add("max_new_tokens", "max_new_tokens 2 with gamma 8 (lowered, warned)",
      lambda: same_as_ref(fx, spec(max_new_tokens=2, gamma=8), fx.ref_tokens[:, :2],
                          np.full(B, 2, np.int32)), "gamma")

  # 4. Sampling.
  for name, kw in {"temperature -1": dict(temperature=-1.0),
                   "temperature NaN": dict(temperature=float("nan")),
                   "temperature inf": dict(temperature=float("inf")),
                   "temperature str": dict(temperature="0.7"),
                   "temperature None": dict(temperature=None),
                   "temperature complex": dict(temperature=1j),
                   "top_k -1": dict(top_k=-1), "top_k float": dict(top_k=2.5),
                   "top_k True": dict(top_k=True), "top_p 0": dict(top_p=0.0),
                   "top_p 1.5": dict(top_p=1.5), "top_p NaN": dict(top_p=float("nan")),
                   "top_p -0.1": dict(top_p=-0.1), "top_p str": dict(top_p="0.9")}.items():
    field = name.split()[0]
    add("sampling", f"SamplingConfig {name}",
        lambda kw=kw: should_refuse(f"SamplingConfig({kw})") if SamplingConfig(**kw) else "",
        field)
  for name, value in {"a dict": {"temperature": 0.0}, "None": None, "a string": "greedy",
                      "a float": 0.7}.items():
    add("sampling", f"sampling {name}",
        lambda v=value: should_refuse(f"sampling={v!r}") if gen(sampling=v) else "",
        "sampling")
    add("sampling", f"sampling {name} (speculative)",
        lambda v=value: should_refuse(f"sampling={v!r}") if spec(sampling=v) else "",
        "sampling")
  # Tiny and huge temperatures: the exact law (T -> 0: greedy; the tiny models have no ties).
  for temp in (1e-3, 1e-9, 1e-12, 1e-30, 1e-45):
    s = SamplingConfig(temperature=temp)
    add("sampling", f"temperature {temp:g} gives greedy",
        lambda s=s: same_as_ref(fx, gen(sampling=s, key=fx.keys)), "temperature")
    if temp in (1e-9, 1e-30):   # (one compile each: the speculative loop is the slow one)
      add("sampling", f"temperature {temp:g} gives greedy (speculative)",
          lambda s=s: same_as_ref(fx, spec(sampling=s, key=fx.keys)), "temperature")
  for name, s in {"temperature 1e30": SamplingConfig(temperature=1e30),
                  "temperature 1e38": SamplingConfig(temperature=3e38),
                  "top_k 1 (greedy)": SamplingConfig(temperature=1.0, top_k=1),
                  "top_k > vocab": SamplingConfig(temperature=0.8, top_k=10 * V),
                  "top_p 1e-9 (greedy)": SamplingConfig(temperature=1.0, top_p=1e-9)}.items():
    if "greedy" in name:
      add("sampling", name, lambda s=s: same_as_ref(fx, gen(sampling=s, key=fx.keys)),
          "sampling")
      add("sampling", f"{name} (speculative)",
          lambda s=s: same_as_ref(fx, spec(sampling=s, key=fx.keys)), "sampling")
    else:
      add("sampling", name, lambda s=s: _sampled_ok(fx, lambda **k: gen(sampling=s, **k)),
          "sampling")
      if "1e30" in name:
        add("sampling", f"{name} (speculative)",
            lambda s=s: _sampled_ok(fx, lambda **k: spec(sampling=s, **k)), "sampling")

  # 5. Keys.
  sampled = SamplingConfig(temperature=0.8)
  for name, key in {"None while sampling": None, "too few keys": fx.keys[:1],
                    "too many keys": jax.random.split(jax.random.key(0), 3),
                    "an int": 0, "a float array": np.zeros((B, 2), np.float32),
                    "a string": "seed", "uint32 [B, 3]": np.zeros((B, 3), np.uint32),
                    "a list of ints": [0, 1]}.items():
    add("key", f"key {name}",
        lambda k=key: _sampled_ok(fx, lambda **kk: gen(sampling=sampled, **kk), key=k), "key")
    add("key", f"key {name} (speculative)",
        lambda k=key: _sampled_ok(fx, lambda **kk: spec(sampling=sampled, **kk), key=k), "key")
  add("key", "legacy PRNGKey", lambda: _sampled_ok(
      fx, lambda **k: gen(sampling=sampled, **k), key=jax.random.PRNGKey(3)), "key")
  add("key", "legacy keys per row", lambda: _sampled_ok(
      fx, lambda **k: gen(sampling=sampled, **k),
      key=jax.random.split(jax.random.PRNGKey(3), B)), "key")
  add("key", "greedy with no key", lambda: same_as_ref(fx, gen(key=None)), "key")

  # 6. eos_id / pad_id.
  for name, value in {"-1": -1, "vocab": V, "float": 1.0, "bool": True, "empty tuple": (),
                      "tuple with vocab": (1, V), "2**31": 2**31, "a string": "</s>",
                      "nested": ((1,),), "a numpy float": np.float32(1.0)}.items():
    add("eos_pad", f"eos_id {name}",
        lambda v=value: _maybe_eos(fx, lambda: gen(eos_id=v), v), "eos_id")
    add("eos_pad", f"eos_id {name} (speculative)",
        lambda v=value: _maybe_eos(fx, lambda: spec(eos_id=v), v), "eos_id")
  for name, value in {"-1": -1, "vocab": V, "int32 max": 2**31 - 1, "2**31": 2**31,
                      "float": 0.5, "None": None, "bool": False, "a string": "<pad>",
                      "-2**31 - 1": -2**31 - 1, "a numpy int": np.int64(3)}.items():
    add("eos_pad", f"pad_id {name}",
        lambda v=value: _padded(fx, gen(pad_id=v, eos_id=_stop(fx)), _stop(fx), v), "pad_id")
    add("eos_pad", f"pad_id {name} (speculative)",
        lambda v=value: _padded(fx, spec(pad_id=v, eos_id=_stop(fx)), _stop(fx), v), "pad_id")
  add("eos_pad", "eos_id a numpy array of ids",
      lambda: _eos_stops(fx, gen(eos_id=np.array([_stop(fx), V - 1])), _stop(fx)), "eos_id")
  add("eos_pad", "eos_id an id the reference emits: rows stop there",
      lambda: _eos_stops(fx, gen(eos_id=_stop(fx)), _stop(fx)),
      "eos_id")
  add("eos_pad", "eos_id an id the reference emits (speculative)",
      lambda: _eos_stops(fx, spec(eos_id=_stop(fx)), _stop(fx)),
      "eos_id")

  # 7. gamma.
  for name, value in {"0": 0, "-5": -5, "1.5": 1.5, "True": True, "'fast'": "fast",
                      "'AUTO'": "AUTO", "a list": [1, 2], "NaN": float("nan"),
                      "2**64": 2**64}.items():
    add("gamma", f"gamma {name}",
        lambda v=value: should_refuse(f"gamma={v!r}") if spec(gamma=v) else "", "gamma")
  for name, value in {"2": 2, "numpy int 2": np.int64(2), "None (default)": None,
                      "1000 (lowered, warned)": 1000, "2**31 (lowered, warned)": 2**31}.items():
    add("gamma", f"gamma {name}", lambda v=value: same_as_ref(fx, spec(gamma=v)), "gamma")
  costs = (1.0, 1.05, 1.1, 1.2, 1.3)
  add("gamma", "gamma auto with costs", lambda: same_as_ref(fx, spec(gamma="auto",
                                                                     gamma_costs=costs)),
      "gamma")
  for name, value in {"wrong length": (1.0, 2.0), "negative": (1.0, -1, 1, 1, 1),
                      "NaN": (1.0, float("nan"), 1, 1, 1), "a string": "cheap",
                      "zeros": (0, 0, 0, 0, 0)}.items():
    add("gamma", f"gamma_costs {name}",
        lambda v=value: should_refuse(f"gamma_costs={v!r}") if spec(gamma="auto",
                                                                     gamma_costs=v) else "",
        "gamma_costs", "costs")
  add("gamma", "gamma_costs with a fixed gamma",
      lambda: should_refuse("gamma_costs ignored") if spec(gamma=2, gamma_costs=costs) else "",
      "gamma_costs")
  add("gamma", "acceptance a dict",
      lambda: should_refuse("acceptance") if spec(gamma="auto", gamma_costs=costs,
                                                  acceptance={"a": 1}) else "", "acceptance")
  for name, kw in {"empty": dict(gammas=()), "negative": dict(gammas=(0, -1, 2)),
                   "duplicates": dict(gammas=(1, 1, 2)), "only 0": dict(gammas=(0,)),
                   "floats": dict(gammas=(0, 1.5)), "decay 1": dict(decay=1.0),
                   "prior_alpha 0": dict(prior_alpha=0.0),
                   "batch_objective": dict(batch_objective="fastest"),
                   "per_row str": dict(per_row="yes"), "a string": dict(gammas="0124")}.items():
    field = next(iter(kw))
    add("gamma", f"AdaptiveGamma {name}",
        lambda kw=kw: should_refuse(f"AdaptiveGamma({kw})") if specjax.AdaptiveGamma(**kw)
        else "", field)
  # A drafter that fixes its own γ refuses another.
  look = specjax.drafters.Lookahead(window=2, ngram=3, candidates=2, pool_size=16)
  for value in (-5, 1, 7):
    add("gamma", f"Lookahead with gamma {value}",
        lambda v=value: should_refuse(f"gamma={v} ignored by Lookahead")
        if spec(draft=look, draft_params=None, gamma=v) else "", "gamma")
  add("gamma", "Lookahead with gamma None",
      lambda: same_as_ref(fx, spec(draft=look, draft_params=None, gamma=None)), "gamma")

  # 8. cache_len and caches.
  for name, value in {"too small": 4, "0": 0, "negative": -1, "float": 32.0, "str": "64",
                      "needs 100 GB": 2**31 - 1}.items():
    add("cache", f"cache_len {name}",
        lambda v=value: should_refuse(f"cache_len={v!r}") if gen(cache_len=v) else "",
        "cache_len", "memory", "bytes")
    add("cache", f"cache_len {name} (speculative)",
        lambda v=value: should_refuse(f"cache_len={v!r}") if spec(cache_len=v) else "",
        "cache_len", "memory", "bytes")
  add("cache", "cache_len larger than needed",
      lambda: same_as_ref(fx, gen(cache_len=40)), "cache_len")
  add("cache", "a cache of another batch size",
      lambda: should_refuse("cache batch") if gen(cache=t.init_cache(3, 32, P)) else "", "cache")
  add("cache", "a cache too short",
      lambda: should_refuse("short cache") if gen(cache=t.init_cache(B, 8, P)) else "", "cache")
  add("cache", "the draft's cache for the target",
      lambda: should_refuse("draft cache") if gen(cache=d.init_cache(B, 32, P)) else "", "cache")
  add("cache", "a cache that is a dict",
      lambda: should_refuse("dict cache") if gen(cache={"k": 1}) else "", "cache")
  add("cache", "a cache and cache_len that disagree",
      lambda: should_refuse("cache and cache_len") if gen(cache=t.init_cache(B, 32, P),
                                                          cache_len=64) else "",
      "cache", "cache_len")
  add("cache", "a fresh cache of the right size",
      lambda: same_as_ref(fx, gen(cache=t.init_cache(B, 32, P))), "cache")

  # 9. Params.
  add("params", "params None", lambda: should_refuse("params None") if gen(params=None) else "",
      "params")
  add("params", "the draft's params", lambda: should_refuse("draft params")
      if gen(params=dp) else "", "params")
  add("params", "a leaf missing", lambda: should_refuse("missing leaf")
      if gen(params=_drop_leaf(tp)) else "", "params")
  add("params", "an extra leaf", lambda: should_refuse("extra leaf")
      if gen(params=_extra_leaf(tp)) else "", "params")
  add("params", "a kernel transposed", lambda: should_refuse("transposed kernel")
      if gen(params=_map_first_kernel(tp, lambda x: x.T)) else "", "params")
  add("params", "a kernel with an extra axis", lambda: should_refuse("extra axis")
      if gen(params=_map_first_kernel(tp, lambda x: x[None])) else "", "params")
  add("params", "int32 params", lambda: should_refuse("int params")
      if gen(params=jax.tree.map(lambda x: x.astype(jnp.int32), tp)) else "", "params")
  add("params", "bool params", lambda: should_refuse("bool params")
      if gen(params=jax.tree.map(lambda x: x > 0, tp)) else "", "params")
  add("params", "complex params", lambda: should_refuse("complex params")
      if gen(params=jax.tree.map(lambda x: x.astype(jnp.complex64), tp)) else "", "params")
  add("params", "float64 params as numpy", lambda: same_as_ref(
      fx, gen(params=jax.tree.map(lambda x: np.asarray(x, np.float64), tp))), "params")
  add("params", "bfloat16 params", lambda: sane(
      gen(params=jax.tree.map(lambda x: x.astype(jnp.bfloat16), tp))), "params")
  add("params", "params as a list", lambda: should_refuse("list params")
      if gen(params=jax.tree.leaves(tp)) else "", "params")
  add("params", "NaN params", lambda: should_refuse("NaN params")
      if gen(params=jax.tree.map(lambda x: x * jnp.nan, tp)) else "", "params")
  add("params", "inf params", lambda: should_refuse("inf params")
      if gen(params=_map_first_kernel(tp, lambda x: x.at[0].set(jnp.inf))) else "", "params")
  add("params", "NaN params, nonfinite='ignore', counted", lambda: _nonfinite_counted(
      gen(params=jax.tree.map(lambda x: x * jnp.nan, tp), nonfinite="ignore")), "params")
  add("params", "nonfinite 'maybe'", lambda: should_refuse("nonfinite='maybe'")
      if gen(nonfinite="maybe") else "", "nonfinite")
  add("params", "NaN target params (speculative)", lambda: should_refuse("NaN params")
      if spec(target_params=jax.tree.map(lambda x: x * jnp.nan, tp)) else "", "params")
  add("params", "NaN draft params: the output stays exact",
      lambda: same_as_ref(fx, spec(draft_params=jax.tree.map(lambda x: x * jnp.nan, dp))),
      "draft_params")
  add("params", "draft params None for a draft model", lambda: should_refuse("draft None")
      if spec(draft_params=None) else "", "draft_params")
  add("params", "the target's params as draft params", lambda: should_refuse("swapped")
      if spec(draft_params=tp) else "", "draft_params")
  add("params", "a model that is not a model", lambda: should_refuse("model=str")
      if gen(model="tiny") else "", "model")
  add("params", "a draft that is not a model", lambda: should_refuse("draft=int")
      if spec(draft=3) else "", "draft")
  other_vocab = specjax.DecoderLM(specjax.decoder_config("tiny", vocab_size=2 * V))
  add("params", "a draft of another vocabulary", lambda: should_refuse("vocab mismatch")
      if spec(draft=other_vocab, draft_params=other_vocab.init(jax.random.PRNGKey(2))) else "",
      "vocab")

  # 10. verify_fn.
  from specjax.verify import rejection_verify

  def accept_all(keys_B, drafts_BG, p, q, num_valid_B=None):
    n = jnp.full(drafts_BG.shape[:1], drafts_BG.shape[1], jnp.int32)
    if num_valid_B is not None:
      n = jnp.minimum(n, num_valid_B)
    return n, jnp.zeros(drafts_BG.shape[:1], jnp.int32)

  def four_args(keys_B, drafts_BG, p, q):
    return rejection_verify(keys_B, drafts_BG, p, q)

  def wrong_shape(keys_B, drafts_BG, p, q, num_valid_B=None):
    return jnp.zeros((3,), jnp.int32), jnp.zeros((5,), jnp.int32)

  def float_counts(keys_B, drafts_BG, p, q, num_valid_B=None):
    return jnp.zeros(drafts_BG.shape[:1], jnp.float32), jnp.zeros(drafts_BG.shape[:1], jnp.int32)

  def one_output(keys_B, drafts_BG, p, q, num_valid_B=None):
    return jnp.zeros(drafts_BG.shape[:1], jnp.int32)

  add("verify_fn", "verify_fn not callable", lambda: should_refuse("verify_fn=3")
      if spec(verify_fn=3) else "", "verify_fn")
  add("verify_fn", "verify_fn of one argument", lambda: should_refuse("verify_fn(x)")
      if spec(verify_fn=lambda x: x) else "", "verify_fn")
  add("verify_fn", "verify_fn returning wrong shapes", lambda: should_refuse("wrong shapes")
      if spec(verify_fn=wrong_shape, sampling=sampled, key=fx.keys) else "", "verify_fn")
  add("verify_fn", "verify_fn returning float counts", lambda: should_refuse("float counts")
      if spec(verify_fn=float_counts, sampling=sampled, key=fx.keys) else "", "verify_fn")
  add("verify_fn", "verify_fn returning one array", lambda: should_refuse("one output")
      if spec(verify_fn=one_output, sampling=sampled, key=fx.keys) else "", "verify_fn")
  add("verify_fn", "exact custom rule (lambda *a) keeps greedy output",
      lambda: same_as_ref(fx, spec(verify_fn=lambda *a: rejection_verify(*a))), "verify_fn")
  add("verify_fn", "a broken rule is applied (accept-all changes the output)",
      lambda: True if same_as_ref(fx, spec(verify_fn=accept_all, sampling=sampled,
                                           key=fx.keys)) is not True
      else "the broken rule was not applied", "verify_fn")
  add("verify_fn", "a four-argument rule with gamma auto", lambda: should_refuse("4-arg auto")
      if spec(verify_fn=four_args, gamma="auto", gamma_costs=costs, sampling=sampled,
              key=fx.keys) else "", "verify_fn", "num_valid")
  add("verify_fn", "a four-argument rule, direct SpeculativeDecoder per row",
      lambda: should_refuse("4-arg per-row decoder") if specjax.SpeculativeDecoder(
          t, specjax.drafters.ModelDrafter(d), 4, sampled, N, verify_fn=four_args,
          adaptive=specjax.AdaptiveGamma(gammas=(0, 1, 2, 4), per_row=True)) else "",
      "verify_fn", "num_valid")
  for dname, (dr, drp) in {"PromptLookup": (specjax.drafters.PromptLookup(), None),
                           "Lookahead": (look, None)}.items():
    add("verify_fn", f"a broken rule with {dname}", lambda dr=dr, drp=drp: should_refuse(
        "verify_fn ignored") if spec(draft=dr, draft_params=drp, verify_fn=accept_all,
                                     gamma=None) else "", "verify_fn")
  from specjax.tree import TokenTree
  medusa_cfg = specjax.drafters.MedusaConfig(num_heads=2, d_model=t.config.d_model,
                                             vocab_size=V)
  medusa = specjax.drafters.Medusa(medusa_cfg, TokenTree.chain(2), t)
  heads = {"heads": specjax.drafters.init_heads(medusa_cfg, t, tp), "target": None}
  add("verify_fn", "a broken rule with Medusa", lambda: should_refuse("verify_fn ignored")
      if spec(draft=medusa, draft_params=heads, verify_fn=accept_all, gamma=None) else "",
      "verify_fn")
  add("verify_fn", "Medusa greedy equals the reference",
      lambda: same_as_ref(fx, spec(draft=medusa, draft_params=heads, gamma=None)), "-")

  # 11. Drafters.
  for name, make in {"PromptLookup max_ngram 0": lambda: specjax.drafters.PromptLookup(
                         max_ngram=0),
                     "PromptLookup max_ngram -1": lambda: specjax.drafters.PromptLookup(
                         max_ngram=-1),
                     "PromptLookup max_ngram 1.5": lambda: specjax.drafters.PromptLookup(
                         max_ngram=1.5),
                     "PromptLookup min > max": lambda: specjax.drafters.PromptLookup(
                         max_ngram=2, min_ngram=3),
                     "Lookahead ngram 1": lambda: specjax.drafters.Lookahead(ngram=1),
                     "Lookahead window 0": lambda: specjax.drafters.Lookahead(window=0),
                     "Lookahead pool_size -1": lambda: specjax.drafters.Lookahead(pool_size=-1),
                     "LayerSkip no layers": lambda: specjax.drafters.LayerSkip(t, []),
                     "LayerSkip layer 99": lambda: specjax.drafters.LayerSkip(t, [99]),
                     "LayerSkip layer -1": lambda: specjax.drafters.LayerSkip(t, [-1]),
                     "LayerSkip a string": lambda: specjax.drafters.LayerSkip(t, "0"),
                     "LayerSkip of a T5": lambda: specjax.drafters.LayerSkip("t5", [0]),
                     "WindowedKV window 0": lambda: specjax.drafters.WindowedKV.of(t, 0),
                     "WindowedKV gamma 0": lambda: specjax.drafters.WindowedKV.of(t, 4, gamma=0),
                     "SuffixDraft nodes 0": lambda: specjax.drafters.SuffixDraft(nodes=0),
                     "SuffixDraft factor -1": lambda: specjax.drafters.SuffixDraft(factor=-1.0),
                     "SuffixDraft min_prob 2": lambda: specjax.drafters.SuffixDraft(
                         min_prob=2.0),
                     "MedusaConfig 0 heads": lambda: specjax.drafters.MedusaConfig(
                         num_heads=0, d_model=32, vocab_size=V),
                     "ModelDrafter of a string": lambda: specjax.drafters.ModelDrafter("m"),
                     }.items():
    field = {"PromptLookup min > max": "min_ngram", "LayerSkip no layers": "layers",
             "LayerSkip layer 99": "layer", "LayerSkip layer -1": "layer",
             "LayerSkip a string": "layers", "LayerSkip of a T5": "target",
             "WindowedKV window 0": "window", "WindowedKV gamma 0": "gamma",
             "ModelDrafter of a string": "model"}.get(name, name.split()[1])
    add("drafters", name, lambda make=make, nm=name: should_refuse(nm) if make() is not None
        else "", field)
  corpus_bad = lambda: specjax.drafters.SuffixCorpus.build([[1, 2, 3, 2 * V]], 64, 2 * V)
  add("drafters", "SuffixCorpus beyond the target's vocabulary", lambda: should_refuse(
      "corpus beyond vocab") if spec(draft=specjax.drafters.SuffixDraft(nodes=4, depth=3),
                                     draft_params=corpus_bad(), gamma=None) else "",
      "corpus", "vocab")
  add("drafters", "SuffixCorpus with a negative id", lambda: should_refuse("negative id")
      if specjax.drafters.SuffixCorpus.build([[1, -3, 2]], 64, V) else "", "sequences", "id")
  add("drafters", "SuffixCorpus size 0", lambda: should_refuse("size 0")
      if specjax.drafters.SuffixCorpus.build([[1, 2]], 0, V) else "", "size")
  add("drafters", "SuffixDraft with a corpus: greedy equals the reference",
      lambda: same_as_ref(fx, spec(draft=specjax.drafters.SuffixDraft(nodes=4, depth=3),
                                   draft_params=specjax.drafters.SuffixCorpus.build(
                                       [fx.ref_tokens[0].tolist() * 2], 64, V),
                                   gamma=None)), "-")
  add("drafters", "PromptLookup: greedy equals the reference",
      lambda: same_as_ref(fx, spec(draft=specjax.drafters.PromptLookup(max_ngram=2),
                                   draft_params=None, gamma=4)), "-")
  add("drafters", "PromptLookup with params given", lambda: should_refuse("params ignored")
      if spec(draft=specjax.drafters.PromptLookup(), draft_params=dp) else "", "draft_params")
  add("drafters", "LayerSkip: greedy equals the reference",
      lambda: same_as_ref(fx, spec(draft=specjax.drafters.LayerSkip(t, [0]), draft_params=None,
                                   gamma=2)), "-")
  add("drafters", "LayerSkip of another target", lambda: should_refuse("other target")
      if spec(draft=specjax.drafters.LayerSkip(other_vocab, [0]), draft_params=None) else "",
      "target", "LayerSkip")
  add("drafters", "Lookahead: greedy equals the reference",
      lambda: same_as_ref(fx, spec(draft=look, draft_params=None, gamma=None)), "-")
  add("drafters", "WindowedKV: greedy equals the reference",
      lambda: same_as_ref(fx, spec(draft=specjax.drafters.WindowedKV.of(t, 4, 1, 3),
                                   draft_params=None, gamma=3, cache_len=32)), "-")
  add("drafters", "WindowedKV built for a smaller gamma", lambda: should_refuse("ring slack")
      if spec(draft=specjax.drafters.WindowedKV.of(t, 4, 1, 2), draft_params=None, gamma=3,
              cache_len=32) else "", "gamma")

  # 12. Prefills.
  def pre(**kw):
    kw.setdefault("max_new_tokens", N)
    kw.setdefault("gamma", 3)
    kw.setdefault("sampling", GREEDY)
    return specjax.prefill(t, tp, kw.pop("prompts", pr), kw.pop("lengths", ln), **kw)
  other = pr.copy()
  other[0, 0] = 9
  add("prefill", "a matching prefill: generate", lambda: same_as_ref(fx, gen(prefilled=pre())),
      "prefilled")
  add("prefill", "a matching prefill: speculative",
      lambda: same_as_ref(fx, spec(prefilled=pre())), "prefilled")
  for name, kw, call in (
      ("other prompts", dict(prompts=other), {}), ("other lengths",
                                                   dict(lengths=np.array([5, 3])), {}),
      ("other sampling", dict(sampling=sampled, key=fx.keys), {}),
      ("fewer tokens", dict(max_new_tokens=4), {}), ("a smaller gamma", dict(gamma=1), {}),
      ("another key", dict(sampling=sampled, key=jax.random.split(jax.random.key(9), B)),
       dict(sampling=sampled, key=fx.keys)),
      ("another batch", dict(prompts=pr[:1], lengths=ln[:1]), {})):
    add("prefill", f"a prefill of {name}", lambda kw=kw, call=call: should_refuse(name)
        if spec(prefilled=pre(**kw), **call) else "", "prefilled")
  add("prefill", "prefilled and a cache", lambda: should_refuse("both")
      if gen(prefilled=pre(), cache=t.init_cache(B, 32, P)) else "", "prefilled", "cache")
  add("prefill", "prefilled a dict", lambda: should_refuse("dict")
      if gen(prefilled={"first": 1}) else "", "prefilled")
  add("prefill", "prefill gamma -1", lambda: should_refuse("gamma -1")
      if pre(gamma=-1) else "", "gamma")
  add("prefill", "prefill max_new_tokens 0", lambda: should_refuse("0")
      if pre(max_new_tokens=0) else "", "max_new_tokens")
  add("prefill", "a copied prefill used twice", lambda: _prefill_twice(fx, gen, pre()),
      "prefilled")

  # 13. Configs built directly.
  for name, kw, field in (
      ("rope_theta 0", dict(rope_theta=0.0), "rope_theta"),
      ("rope_theta -1e4", dict(rope_theta=-1e4), "rope_theta"),
      ("rope_theta NaN", dict(rope_theta=float("nan")), "rope_theta"),
      ("rope_theta inf", dict(rope_theta=float("inf")), "rope_theta"),
      ("rope_theta str", dict(rope_theta="1e4"), "rope_theta"),
      ("norm_eps NaN", dict(norm_eps=float("nan")), "norm_eps"),
      ("norm_eps 0", dict(norm_eps=0.0), "norm_eps"),
      ("norm_eps -1e-6", dict(norm_eps=-1e-6), "norm_eps"),
      ("norm_eps inf", dict(norm_eps=float("inf")), "norm_eps"),
      ("kv heads not dividing heads", dict(num_kv_heads=3), "num_kv_heads"),
      ("head_dim odd", dict(head_dim=7), "head_dim"), ("vocab 0", dict(vocab_size=0),
                                                       "vocab_size"),
      ("d_model float", dict(d_model=32.0), "d_model"), ("dtype int8", dict(dtype="int8"),
                                                         "dtype"),
      ("sliding_window 0", dict(sliding_window=0), "sliding_window"),
      ("prefill_chunk -1", dict(prefill_chunk=-1), "prefill_chunk"),
      ("qk_norm str", dict(qk_norm="yes"), "qk_norm"),
      ("rope_scaling bogus", dict(rope_scaling={"rope_type": "bogus"}), "rope"),
      ("attention_kernel bogus", dict(attention_kernel="cuda"), "attention_kernel")):
    add("configs", f"DecoderConfig {name}", lambda kw=kw: should_refuse(str(kw))
        if specjax.decoder_config("tiny", **kw) else "", field)
  for name, kw, field in (
      ("layer_norm_epsilon NaN", dict(layer_norm_epsilon=float("nan")), "layer_norm_epsilon"),
      ("layer_norm_epsilon 0", dict(layer_norm_epsilon=0.0), "layer_norm_epsilon"),
      ("d_kv 0", dict(d_kv=0), "d_kv"), ("feed_forward bogus", dict(feed_forward="swiglu"),
                                         "feed_forward"),
      ("eos_id beyond vocab", dict(eos_id=10**6), "eos_id"),
      ("buckets odd", dict(relative_attention_num_buckets=7),
       "relative_attention_num_buckets")):
    add("configs", f"T5Config {name}", lambda kw=kw: should_refuse(str(kw))
        if specjax.T5Config(**{**_T5_TINY, **kw}) else "", field)
  add("configs", "decoder_config unknown name", lambda: should_refuse("unknown")
      if specjax.decoder_config("huge-9000") else "", "huge-9000", "decoder config")
  add("configs", "decoder_config unknown field", lambda: should_refuse("unknown field")
      if specjax.decoder_config("tiny", heads=3) else "", "heads")

  # 14. Tokenizers (a word-level tokenizer.json written here).
  tok_path = _write_tokenizer(fx.tmp)
  tok = specjax.load_tokenizer(tok_path)
  add("tokenizers", "encode / decode round trip",
      lambda: True if tok.decode(tok.encode("a b c", add_eos=False)) == "a b c"
      else f"round trip gave {tok.decode(tok.encode('a b c', add_eos=False))!r}", "-")
  for name, value in {"float ids": [3.0, 4.0], "fractional ids": [3.7], "None": None,
                      "a string": "3 4", "ragged": [[3], [4, 5]], "2-D array":
                      np.array([[3, 4]]), "id beyond vocab": [3, 10**6], "negative id": [3, -2],
                      "bool ids": [True, False], "id beyond int64": [2**70],
                      "object array": np.array([3, "a"], object), "a dict": {"ids": [3]},
                      "NaN": [float("nan")]}.items():
    add("tokenizers", f"decode {name}", lambda v=value: should_refuse(f"decode({v!r})")
        if tok.decode(v) is not None else "", "ids")
  for name, value in {"an int": 5, "None": None, "bytes": b"a b", "a list": ["a"]}.items():
    add("tokenizers", f"encode {name}", lambda v=value: should_refuse(f"encode({v!r})")
        if tok.encode(v) is not None else "", "text")
  for name, (tokens, lengths) in {"lengths too long": ([[3, 4]], [3]),
                                  "lengths negative": ([[3, 4]], [-1]),
                                  "lengths float": ([[3, 4]], [1.5]),
                                  "1-D tokens": ([3, 4], None),
                                  "float tokens": (np.array([[3.5]]), None)}.items():
    add("tokenizers", f"decode_batch {name}", lambda a=tokens, b=lengths: should_refuse(
        "decode_batch") if tok.decode_batch(a, b) is not None else "", "lengths", "tokens")
  add("tokenizers", "encode_batch max_len 0", lambda: should_refuse("max_len 0")
      if tok.encode_batch(["a"], 0) else "", "max_len")
  add("tokenizers", "encode_batch one string", lambda: should_refuse("one string")
      if tok.encode_batch("a b", 4) else "", "texts")
  add("tokenizers", "id_to_token 10**6", lambda: should_refuse("id 10**6")
      if tok.id_to_token(10**6) is not None else "", "token_id", "id")
  add("tokenizers", "id_to_token a float", lambda: should_refuse("id 3.0")
      if tok.id_to_token(3.0) is not None else "", "token_id", "id")
  for name, content in {"empty file": b"", "invalid JSON": b"{oops", "JSON list": b"[1, 2]",
                        "binary": b"\x00\xff\x10"}.items():
    path = os.path.join(fx.tmp, f"bad_tok_{len(out)}.json")
    with open(path, "wb") as f:
      f.write(content)
    add("tokenizers", f"load_tokenizer {name}", lambda p=path: should_refuse("bad file")
        if specjax.load_tokenizer(p) else "", os.path.basename(path))
  add("tokenizers", "load_tokenizer a missing path", lambda: should_refuse("missing")
      if specjax.load_tokenizer(os.path.join(fx.tmp, "nothing_here")) else "", "nothing_here")
  add("tokenizers", "load_tokenizer None", lambda: should_refuse("None")
      if specjax.load_tokenizer(None) else "", "path")

  # 15. Loaders (files written to the temporary directory).
  if not quick:
    _loader_cases(fx, add)
  return out


_T5_TINY = dict(vocab_size=V, d_model=16, d_kv=4, num_heads=2, d_ff=32, num_layers=1)


def _loader_cases(fx: Fixtures, add) -> None:
  """transformers-format directories and specjax's own params format, intact and damaged."""
  from specjax.checkpoints.orbax_io import restore_params, save_params
  t, tp = fx.target, fx.tp
  good = os.path.join(fx.tmp, "hf_good")
  specjax.export_hf_decoder(tp, t.config, good)

  def params_equal(loaded) -> Any:
    params, config = loaded
    shape = ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim",
             "mlp_dim", "tie_embeddings", "rope_theta", "norm_eps")
    if any(getattr(config, f) != getattr(t.config, f) for f in shape):
      return f"config differs: {config}"
    a, b = jax.tree.leaves(params), jax.tree.leaves(tp)
    if len(a) != len(b) or any(not np.array_equal(np.asarray(x), np.asarray(y))
                               for x, y in zip(a, b)):
      return "params differ from the exported ones"
    return True

  add("loaders", "export then import: the same params",
      lambda: params_equal(specjax.import_hf_decoder(good)), "-")

  def variant(name: str, edit: Callable[[str], None]) -> str:
    path = os.path.join(fx.tmp, "hf_" + name.replace(" ", "_"))
    specjax.export_hf_decoder(tp, t.config, path)
    edit(path)
    return path

  def edit_config(**changes):
    def edit(path):
      with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
      for k, v in changes.items():
        if v is None:
          cfg.pop(k, None)
        else:
          cfg[k] = v
      with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return edit

  def write_config_text(text):
    def edit(path):
      with open(os.path.join(path, "config.json"), "w") as f:
        f.write(text)
    return edit

  def weights_file(path):
    return next(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".safetensors"))

  def truncate(path):
    w = weights_file(path)
    with open(w, "rb+") as f:
      f.truncate(os.path.getsize(w) // 2)

  def flip_data_byte(path):
    w = weights_file(path)
    with open(w, "rb+") as f:
      f.seek(os.path.getsize(w) - 5)
      b = f.read(1)
      f.seek(-1, 1)
      f.write(bytes([b[0] ^ 0x40]))

  def drop_integrity(path):
    for n in os.listdir(path):
      if "integrity" in n:
        os.remove(os.path.join(path, n))

  def retype_tensor(dtype):
    def edit(path):
      w = weights_file(path)
      with open(w, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
      name = next(k for k in header if k != "__metadata__" and "norm" in k)
      header[name]["dtype"] = dtype
      text = json.dumps(header).encode()
      with open(w, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + body)
      drop_integrity(path)
    return edit

  for name, edit, names in (
      ("rope_theta 0", edit_config(rope_theta=0.0), ("rope_theta",)),
      ("rms_norm_eps NaN", edit_config(rms_norm_eps=float("nan")), ("rms_norm_eps",)),
      ("heads not dividing width", edit_config(num_attention_heads=5, head_dim=None),
       ("num_attention_heads", "hidden_size", "head_dim")),
      ("unknown architecture", edit_config(architectures=["GPT2LMHeadModel"]),
       ("architectures",)),
      ("vocab_size negative", edit_config(vocab_size=-1), ("vocab_size",)),
      ("invalid JSON", write_config_text("{oops"), ("config.json",)),
      ("config a list", write_config_text("[1, 2]"), ("config",)),
      ("truncated weights", truncate, ("safetensors", "truncated", "model")),
      ("int32 tensor", retype_tensor("I32"), ("dtype", "int32", "I32")),
      ("bool tensor", retype_tensor("BOOL"), ("dtype", "bool", "BOOL", "safetensors"))):
    add("loaders", f"import_hf_decoder: {name}",
        lambda n=name, e=edit: should_refuse(n) if specjax.import_hf_decoder(variant(n, e))
        else "", *names)

  def flipped_loads():
    path = variant("flipped", flip_data_byte)
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      loaded = specjax.import_hf_decoder(path)
    if params_equal(loaded) is True:
      return True   # the flip fell where nothing is read
    if any("integrity" in str(w.message) or "verif" in str(w.message) for w in caught):
      return True   # loaded with a warning that nothing vouches for the values
    return "a flipped byte loaded different values without a word"
  add("loaders", "import_hf_decoder: a flipped data byte", flipped_loads, "safetensors",
      "digest", "integrity", "model")
  add("loaders", "import_hf_decoder: a missing directory", lambda: should_refuse("missing")
      if specjax.import_hf_decoder(os.path.join(fx.tmp, "no_such_dir")) else "",
      "no_such_dir")
  add("loaders", "import_hf_decoder: a config of another shape", lambda: should_refuse(
      "shape") if specjax.import_hf_decoder(good, t.config.replace(d_model=48)) else "",
      "shape", "d_model")
  add("loaders", "import_hf_decoder: config a T5Config", lambda: should_refuse("T5Config")
      if specjax.import_hf_decoder(good, specjax.T5Config(**_T5_TINY)) else "", "config")

  own = os.path.join(fx.tmp, "own")
  save_params(own, tp, t.config)
  add("loaders", "save_params then restore_params: the same params",
      lambda: params_equal(restore_params(own)), "-")

  def damaged_own(name, damage):
    path = os.path.join(fx.tmp, "own_" + name.replace(" ", "_"))
    save_params(path, tp, t.config)
    damage(path)
    return path

  def flip_largest(path):
    files = [os.path.join(r, n) for r, _, ns in os.walk(path) for n in ns
             if "config" not in n and "integrity" not in n]
    w = max(files, key=os.path.getsize)
    with open(w, "rb+") as f:
      f.seek(os.path.getsize(w) // 2)
      b = f.read(1)
      f.seek(-1, 1)
      f.write(bytes([b[0] ^ 0x01]))

  def stored_field(field, value):
    def damage(path):
      p = os.path.join(path, "config.json")
      with open(p) as f:
        cfg = json.load(f)
      cfg["fields"][field] = value
      with open(p, "w") as f:
        json.dump(cfg, f)
    return damage

  def stored_class(path):
    p = os.path.join(path, "config.json")
    with open(p) as f:
      cfg = json.load(f)
    cfg["class"] = "specjax.models.nothing_here.Config"
    with open(p, "w") as f:
      json.dump(cfg, f)

  for name, damage, names in (
      ("a flipped byte", flip_largest, ("own_a_flipped_byte", "digest", "integrity")),
      ("rope_theta -1 stored", stored_field("rope_theta", -1.0), ("rope_theta",)),
      ("norm_eps NaN stored", stored_field("norm_eps", float("nan")), ("norm_eps",)),
      ("an unknown class", stored_class, ("nothing_here",))):
    add("loaders", f"restore_params: {name}", lambda n=name, dm=damage: should_refuse(n)
        if restore_params(damaged_own(n, dm)) else "", *names)
  add("loaders", "restore_params: another expected config", lambda: should_refuse(
      "config mismatch") if restore_params(own, t.config.replace(num_layers=1)) else "",
      "num_layers", "config")


def _read_only(a: np.ndarray) -> np.ndarray:
  a = a.copy()
  a.setflags(write=False)
  return a


def _single_ref(fx: Fixtures, model, params, prompts, p):
  """The greedy reference of `prompts` with every length P."""
  out = naive_greedy(model, params, prompts, np.full((len(prompts),), p), N)
  return out, np.full((len(prompts),), N, np.int32)


def _maybe_exact(fx: Fixtures, call: Callable, name: str) -> Any:
  """Ill-formed ids / lengths: a call that returns must give the reference (only integral
  values of an exact dtype could), else it decoded something it was not given."""
  out = call()
  verdict = same_as_ref(fx, out) if np.asarray(out.tokens).shape == fx.ref_tokens.shape else (
      "a result of another shape")
  if verdict is True and ("integral" in name or name in ("float64",)):
    return True
  return should_refuse(f"{name}: {verdict if verdict is not True else 'the reference'}")


def _sampled_ok(fx: Fixtures, call: Callable, key: Any = _DEFAULT) -> Any:
  """A sampled call: sane tokens, the same for the same key."""
  k = fx.keys if key is _DEFAULT else key
  a = call(key=k)
  v = sane(a)
  if v is not True:
    return v
  b = call(key=k)
  if not np.array_equal(np.asarray(a.tokens), np.asarray(b.tokens)):
    return "the same key gave other tokens"
  return True


def _maybe_eos(fx: Fixtures, call: Callable, eos) -> Any:
  out = call()
  return should_refuse(f"eos_id={eos!r}: {sane(out)}")


def _eos_stops(fx: Fixtures, out, eos: int) -> Any:
  toks, lens = np.asarray(out.tokens), np.asarray(out.lengths)
  for r in range(B):
    ref = fx.ref_tokens[r].tolist()
    stop = ref.index(eos) + 1 if eos in ref else N
    if lens[r] != stop or toks[r, :stop].tolist() != ref[:stop]:
      return f"row {r}: {toks[r].tolist()} (length {lens[r]}), expected to stop at {stop}"
  return True


def _stop(fx: Fixtures) -> int:
  """An id the reference's row 0 emits early: as eos_id, the row ends early (padding shows)."""
  return int(fx.ref_tokens[0, 2])


def _padded(fx: Fixtures, out, eos: int, pad) -> Any:
  """Rows stopped at `eos` as the reference, `pad` exactly in the slots past their lengths."""
  v = _eos_stops(fx, out, eos)
  if v is not True:
    return v
  toks, lens = np.asarray(out.tokens), np.asarray(out.lengths)
  past = np.arange(N)[None] >= lens[:, None]
  if not past.any():
    return "no padding to check"
  shown = toks[past]
  if isinstance(pad, (bool, np.bool_)) or not isinstance(pad, (int, np.integer)) or \
      not np.all(shown == pad):
    return f"pad_id={pad!r} but the padding holds {sorted(set(shown.tolist()))}"
  return True


def _nonfinite_counted(out) -> Any:
  bad = np.asarray(out.stats.nonfinite)
  return True if bad.all() else f"NaN params but stats.nonfinite = {bad.tolist()}"


def _prefill_twice(fx: Fixtures, gen, pre) -> Any:
  first = gen(prefilled=jax.tree.map(jnp.copy, pre))
  second = gen(prefilled=pre)
  return both(same_as_ref(fx, first), same_as_ref(fx, second))


def _drop_leaf(tree):
  flat = dict(_flat(tree))
  flat.pop(sorted(flat)[-1])
  return _unflat(flat)


def _extra_leaf(tree):
  flat = dict(_flat(tree))
  flat[("extra", "kernel")] = jnp.zeros((2, 2))
  return _unflat(flat)


def _map_first_kernel(tree, fn):
  flat = dict(_flat(tree))
  k = next(k for k in sorted(flat) if k[-1] == "kernel")
  flat[k] = fn(flat[k])
  return _unflat(flat)


def _flat(tree, prefix=()):
  for k, v in tree.items():
    if isinstance(v, dict):
      yield from _flat(v, prefix + (k,))
    else:
      yield prefix + (k,), v


def _unflat(flat):
  out: Dict[str, Any] = {}
  for path, v in flat.items():
    d = out
    for k in path[:-1]:
      d = d.setdefault(k, {})
    d[path[-1]] = v
  return out


def _write_tokenizer(tmp: str) -> str:
  """A word-level tokenizer.json (pad 0, EOS 1, unk 2, then 61 words) in `tmp`."""
  import tokenizers
  from tokenizers import models, pre_tokenizers, decoders
  vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
  for i, w in enumerate("a b c d e f g h i j k l m n o p q r s t u v w x y z".split()):
    vocab[w] = 3 + i
  for i in range(len(vocab), V):
    vocab[f"w{i}"] = i
  tk = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tk.decoder = decoders.WordPiece(prefix="##")
  tk.add_special_tokens(["<pad>", "</s>", "<unk>"])
  path = os.path.join(tmp, "tok")
  os.makedirs(path, exist_ok=True)
  tk.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}, f)
  return path


# --- the run --------------------------------------------------------------------------------


def run(quick: bool = False, only: Optional[Callable[[Case], bool]] = None,
        fx: Optional[Fixtures] = None, verbose: bool = False) -> List[Dict[str, Any]]:
  """Classifies every case (those `only` keeps); returns the records."""
  own = None
  if fx is None:
    own = tempfile.TemporaryDirectory(prefix="bad_input_probe_")
    t0 = time.perf_counter()
    fx = Fixtures(own.name)
    if verbose:
      print(f"fixtures: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
  try:
    records = []
    for c in cases(fx, quick):
      if only is None or only(c):
        records.append(classify(c))
        if verbose:
          r = records[-1]
          print(f"{len(records):4d} {r['seconds']:6.2f}s {r['outcome']:18s} [{r['group']}] "
                f"{r['case']}", file=sys.stderr, flush=True)
    return records
  finally:
    if own is not None:
      own.cleanup()


def summary(records: Sequence[Dict[str, Any]]) -> Dict[str, int]:
  return {c: sum(r["outcome"] == c for r in records) for c in CLASSES}


def render(result: Dict[str, Any]) -> str:
  from specjax.measure.provenance import provenance_sentence
  counts = result["counts"]
  lines = ["# Bad-input probe: malformed and adversarial calls through the public API", "",
           provenance_sentence(result).strip(), "",
           f"{result['cases']} cases in {result['seconds']:.0f} s (tiny models: a {V}-token "
           f"decoder target and draft, B = {B}, P = {P}, N = {N}). Classes: "
           + ", ".join(f"**{c}** {counts[c]}" for c in CLASSES) + ".", "",
           "Written from the public docstrings, README and docs/ without the tests. A refusal "
           "counts as named when specjax's own `raise` produced it and the message names the "
           "argument; an acceptance counts as correct only when its result was checked.", "",
           "| class | group | case | what came back |", "|---|---|---|---|"]
  order = {c: i for i, c in enumerate(("silent_wrong", "outside_error", "unnamed_refusal",
                                       "correct_acceptance", "named_refusal"))}
  for r in sorted(result["records"], key=lambda r: (order[r["outcome"]], r["group"])):
    detail = (r["detail"] or "verified").replace("|", "\\|").replace("\n", " ")
    lines.append(f"| {r['outcome']} | {r['group']} | {r['case']} | {detail[:160]} |")
  return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
  import argparse
  from specjax.atomic_io import atomic_write_text
  from specjax.measure.provenance import provenance
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out_dir", default="benchmarks/results")
  parser.add_argument("--quick", action="store_true", help="skip the loader cases")
  args = parser.parse_args(argv)
  start = time.perf_counter()
  records = run(args.quick, verbose=True)
  result = {"cases": len(records), "seconds": time.perf_counter() - start,
            "counts": summary(records), "quick": args.quick, "records": records,
            "provenance": provenance()}
  for r in records:
    if r["outcome"] not in ("named_refusal", "correct_acceptance"):
      print(f"{r['outcome']}: [{r['group']}] {r['case']}: {r['detail']}", flush=True)
  print(json.dumps(result["counts"]), f"{result['seconds']:.0f} s", flush=True)
  stem = "bad_input_probe" + ("_quick" if args.quick else "")
  os.makedirs(args.out_dir, exist_ok=True)
  atomic_write_text(os.path.join(args.out_dir, stem + ".json"), json.dumps(result, indent=1))
  atomic_write_text(os.path.join(args.out_dir, stem + ".md"), render(result))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
