"""A subset of `benchmarks/bad_input_probe.py` (the calls that compile nothing, and a few that
compile tiny programs): each is refused by name or accepted with a verified result; and the
probe's classifier tells a silent wrong result and an error from outside specjax apart."""

import functools
import importlib.util
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def probe():
  spec = importlib.util.spec_from_file_location(
      "bad_input_probe", os.path.join(ROOT, "benchmarks", "bad_input_probe.py"))
  mod = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = mod   # its dataclasses look their module up
  spec.loader.exec_module(mod)
  return mod


@pytest.fixture(scope="module")
def all_cases(tmp_path_factory):
  mod = probe()
  fx = mod.Fixtures(str(tmp_path_factory.mktemp("probe")))
  return {c.name: c for c in mod.cases(fx, quick=True)}


# Refusals (host checks only) and the fixes of the probe's first run.
SUBSET = [
    "prompts float32 with fractions", "prompts id == vocab", "prompts id beyond int32",
    "prompts 3-D", "prompts ragged lists", "prompts None", "prompt_lengths 0",
    "prompt_lengths int64 wrapping to 3", "prompt_lengths a string", "max_new_tokens 0",
    "max_new_tokens needs 100 GB", "SamplingConfig temperature NaN", "SamplingConfig top_p 0",
    "sampling a dict", "key None while sampling", "eos_id vocab", "gamma -5", "gamma 'fast'",
    "gamma_costs a string", "gamma_costs NaN", "AdaptiveGamma duplicates",
    "Lookahead with gamma -5", "cache_len needs 100 GB", "a cache and cache_len that disagree",
    "params None", "a kernel transposed", "int32 params", "verify_fn not callable",
    "verify_fn of one argument", "a four-argument rule, direct SpeculativeDecoder per row",
    "PromptLookup max_ngram 0", "ModelDrafter of a string", "PromptLookup with params given",
    "SuffixCorpus beyond the target's vocabulary", "DecoderConfig rope_theta 0",
    "DecoderConfig norm_eps NaN", "DecoderConfig kv heads not dividing heads",
    "T5Config layer_norm_epsilon NaN", "decoder_config unknown field", "decode float ids",
    "decode id beyond vocab", "encode None", "load_tokenizer None",
    "load_tokenizer invalid JSON", "prefill gamma -1",
]


@pytest.mark.parametrize("name", SUBSET)
def test_probe_case_is_refused_by_name_or_verified(all_cases, name):
  rec = probe().classify(all_cases[name])
  assert rec["outcome"] in ("named_refusal", "correct_acceptance"), rec


def test_the_subset_names_existing_cases(all_cases):
  assert len(all_cases) > 300
  assert not [n for n in SUBSET if n not in all_cases]


def test_the_classifier_catches_what_it_must():
  mod = probe()
  def outside():
    return np.asarray("x", np.float64)   # numpy's ValueError, nothing of specjax's
  def specjax_unnamed():
    from specjax._checks import check_int
    check_int("something_else", -1, 0)
  cases = {
      "silent_wrong": mod.Case("t", "wrong", lambda: "tokens differ", ("x",)),
      "outside_error": mod.Case("t", "outside", outside, ("x",)),
      "unnamed_refusal": mod.Case("t", "unnamed", specjax_unnamed, ("gamma",)),
      "named_refusal": mod.Case("t", "named", specjax_unnamed, ("something_else",)),
      "correct_acceptance": mod.Case("t", "fine", lambda: True, ("x",)),
  }
  for expected, case in cases.items():
    assert mod.classify(case)["outcome"] == expected, (expected, mod.classify(case))
