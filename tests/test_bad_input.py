"""Bad input is refused by name, not computed on: token ids, non-finite
logits, params that are not the model's, γ beyond what can be used.

Most cases raise before anything is traced (no compilation); the decoding
ones run table models (`BigramLM`), whose loops compile in about a second.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import _checks
from specjax.api import usable_gamma
from specjax.drafters import ModelDrafter, PromptLookup
from specjax.models import cast_params
from specjax.models.ngram import BigramLM, UnigramLM
from specjax.protocol import check_params
from tiny import VOCAB, ragged_prompts, small_draft, target
from tree_drafters import TableTree

from specjax.tree import TokenTree

GREEDY = specjax.GREEDY
BAD = 7  # the table target's logits after token BAD are broken
SINK = 10  # what the table target emits after any other token


def _table(broken=None):
  """Bigram logits: every token → SINK (by a margin of 35 nats), except
  `broken`, a function that spoils row BAD."""
  logits = np.full((VOCAB, VOCAB), -30.0, np.float32)
  logits[:, SINK] = 5.0
  if broken is not None:
    broken(logits[BAD])
  return {"logits": jnp.asarray(logits)}


def _prompts():
  """Four rows of length 3; row 1 ends with BAD (its prefill logits are the broken row)."""
  p = np.full((4, 5), 12, np.int32)
  p[1, 2] = BAD
  return p, np.full((4,), 3, np.int32)


# ---------------------------------------------------------------- token ids
@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("bad_id", [VOCAB + 5, -3])
def test_token_ids_outside_the_vocabulary_are_named(device, bad_id):
  lm, params = target()
  prompts, lengths = ragged_prompts(batch=4, seed=3)
  prompts = np.array(prompts)
  prompts[2, 1] = bad_id
  if device:
    prompts = jnp.asarray(prompts)
  want = f"row 2 position 1 holds {bad_id}"
  with pytest.raises(ValueError, match=want):
    specjax.generate(lm, params, prompts, lengths, max_new_tokens=4, sampling=GREEDY)
  draft, draft_params = small_draft()
  with pytest.raises(ValueError, match=want):
    specjax.speculative_generate(lm, params, draft, draft_params, prompts, lengths,
                                 max_new_tokens=4, gamma=2, sampling=GREEDY)
  with pytest.raises(ValueError, match=want):
    specjax.prefill(lm, params, prompts, lengths, max_new_tokens=4)


def test_token_ids_in_the_padding_are_not_read():
  target_lm = BigramLM(VOCAB)
  prompts, lengths = _prompts()
  prompts[:, 3:] = 999  # past every row's length: padding, never read
  out = specjax.generate(target_lm, _table(), prompts, lengths, max_new_tokens=3,
                         sampling=GREEDY)
  np.testing.assert_array_equal(out.tokens, np.full((4, 3), SINK))


# ---------------------------------------------------------------- non-finite logits
@pytest.mark.parametrize("broken, flagged", [
    (lambda row: row.__setitem__(slice(None), np.nan), True),
    (lambda row: row.__setitem__(3, np.nan), True),
    (lambda row: row.__setitem__(3, np.inf), True),
    (lambda row: row.__setitem__(slice(None), -np.inf), True),  # no finite logit at all
    (lambda row: row.__setitem__(slice(0, 5), -np.inf), False),  # tokens ruled out: fine
], ids=["all-nan", "one-nan", "plus-inf", "all-minus-inf", "some-minus-inf"])
def test_nonfinite_logits_are_counted_per_row(broken, flagged):
  prompts, lengths = _prompts()
  out = specjax.generate(BigramLM(VOCAB), _table(broken), prompts, lengths, max_new_tokens=4,
                         sampling=GREEDY, nonfinite="ignore")
  # Only row 1's prefill reads the broken row (no row draws BAD afterwards).
  np.testing.assert_array_equal(out.stats.nonfinite, [0, int(flagged), 0, 0])


def test_nonfinite_logits_raise_naming_the_rows_or_warn():
  prompts, lengths = _prompts()
  table = _table(lambda row: row.__setitem__(slice(None), np.nan))
  with pytest.raises(FloatingPointError, match=r"1 of 4 rows \(row 1: 1 of 4 calls\).*params"):
    specjax.generate(BigramLM(VOCAB), table, prompts, lengths, max_new_tokens=4,
                     sampling=GREEDY)
  with pytest.warns(RuntimeWarning, match="row 1"):
    out = specjax.generate(BigramLM(VOCAB), table, prompts, lengths, max_new_tokens=4,
                           sampling=GREEDY, nonfinite="warn")
  assert out.tokens.shape == (4, 4)
  with pytest.raises(ValueError, match="nonfinite must be one of"):
    specjax.generate(BigramLM(VOCAB), table, prompts, lengths, max_new_tokens=4,
                     sampling=GREEDY, nonfinite="skip")


@pytest.mark.parametrize("sampling", [GREEDY, specjax.SamplingConfig(1.0, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_speculative_counts_every_target_call(sampling):
  """NaN everywhere: every target call of every row is counted, greedy and
  sampled alike, and the call raises naming target_params."""
  prompts, lengths = _prompts()
  nan_table = {"logits": jnp.full((VOCAB, VOCAB), jnp.nan)}
  draft = BigramLM(VOCAB)
  kw = dict(max_new_tokens=5, gamma=2, sampling=sampling, key=jax.random.key(0))
  out = specjax.speculative_generate(BigramLM(VOCAB), nan_table, draft, _table(), prompts,
                                     lengths, nonfinite="ignore", **kw)
  np.testing.assert_array_equal(out.stats.nonfinite, out.stats.target_calls)
  assert np.all(np.asarray(out.stats.target_calls) >= 2)
  with pytest.raises(FloatingPointError, match="4 of 4 rows.*target_params"):
    specjax.speculative_generate(BigramLM(VOCAB), nan_table, draft, _table(), prompts,
                                 lengths, **kw)


def test_a_shared_prefill_carries_its_count():
  prompts, lengths = _prompts()
  table = _table(lambda row: row.__setitem__(3, np.inf))
  pre = specjax.prefill(BigramLM(VOCAB), table, prompts, lengths, max_new_tokens=3,
                        sampling=GREEDY)
  np.testing.assert_array_equal(pre.nonfinite, [0, 1, 0, 0])
  with pytest.raises(FloatingPointError, match="row 1"):
    specjax.generate(BigramLM(VOCAB), table, prompts, lengths, max_new_tokens=3,
                     sampling=GREEDY, prefilled=pre)


# ---------------------------------------------------------------- params
def _drop(tree, path):
  tree = jax.tree.map(lambda x: x, tree)  # a copy of the dicts
  node = tree
  for k in path[:-1]:
    node = node[k]
  del node[path[-1]]
  return tree


def test_params_of_another_shape_name_the_first_differing_path():
  lm, params = target()
  _, draft_params = small_draft()
  prompts, lengths = ragged_prompts(batch=4, seed=3)
  with pytest.raises(ValueError, match=r"target_params do not match the model \(DecoderLM.*"
                     r"\['embed'\]\['embedding'\] has shape \(64, 16\) float32, expected "
                     r"\(64, 32\) float32 \(and \d+ more differing leaves\)"):
    specjax.speculative_generate(lm, draft_params, lm, params, prompts, lengths,
                                 max_new_tokens=4, gamma=2, sampling=GREEDY)
  with pytest.raises(ValueError, match=r"draft_params do not match.*\['embed'\]"):
    specjax.speculative_generate(lm, params, small_draft()[0], params, prompts, lengths,
                                 max_new_tokens=4, gamma=2, sampling=GREEDY)
  with pytest.raises(ValueError, match=r"^params do not match"):
    specjax.generate(lm, draft_params, prompts, lengths, max_new_tokens=4, sampling=GREEDY)


def test_missing_extra_and_integer_leaves_are_named():
  lm, params = target()
  layer = sorted(k for k in params if k.startswith("layer_"))[0]
  name = sorted(params[layer])[0]
  missing = _drop(params, (layer, name))
  with pytest.raises(ValueError, match=rf"\['{layer}'\]\['{name}'\].* is missing"):
    check_params(lm, missing, "params")
  extra = {**params, "lora": {"a": jnp.zeros((2, 2))}}
  with pytest.raises(ValueError, match=r"\['lora'\]\['a'\] is not a parameter \(extra leaf"):
    check_params(lm, extra, "params")
  ints = {**params, "embed": {"embedding": params["embed"]["embedding"].astype(jnp.int32)}}
  with pytest.raises(ValueError, match=r"\['embed'\]\['embedding'\] has shape .* int32"):
    check_params(lm, ints, "params")
  with pytest.raises(TypeError, match="params must be the parameter tree of DecoderLM"):
    check_params(lm, None, "params")


def test_other_layouts_and_float_dtypes_of_the_same_tree_pass():
  lm, params = target()
  check_params(lm, lm.pack_params(params), "params")  # the packed decode layout
  check_params(lm, cast_params(params, "bfloat16"), "params")
  check_params(lm, jax.tree.map(np.asarray, params), "params")  # host arrays
  check_params(BigramLM(VOCAB), {"logits": np.zeros((VOCAB, VOCAB))}, "params")
  with pytest.raises(ValueError, match=r"\['logits'\] has shape \(64,\)"):
    check_params(BigramLM(VOCAB), {"logits": np.zeros((VOCAB,))}, "params")
  check_params(UnigramLM(VOCAB), {"logits": np.zeros((VOCAB,))}, "params")


def test_t5_params_are_checked():
  t5 = specjax.T5(specjax.t5_config("t5-tiny"))
  params = t5.init(jax.random.PRNGKey(0))
  check_params(t5, params, "params")
  with pytest.raises(ValueError, match="params do not match the model \\(T5"):
    check_params(t5, {**params, "shared": {"embedding": jnp.zeros((3, 3))}}, "params")


# ---------------------------------------------------------------- gamma beyond use
def test_gamma_beyond_max_new_tokens_is_lowered_with_a_warning():
  lm, params = target()
  draft, draft_params = small_draft()
  prompts, lengths = ragged_prompts(batch=4, seed=3)
  with pytest.warns(UserWarning, match="gamma=1000 is more than the 3 drafts per iteration "
                    "that max_new_tokens=4 can use .*using gamma=3"):
    out = specjax.speculative_generate(lm, params, draft, draft_params, prompts, lengths,
                                       max_new_tokens=4, gamma=1000, sampling=GREEDY)
  assert out.stats.accepted_hist.shape == (4, 4)  # γ = 3
  assert out.target_cache.max_len == specjax.required_cache_len(lm, prompts.shape[1], 4, 3)
  ar = specjax.generate(lm, params, prompts, lengths, max_new_tokens=4, sampling=GREEDY)
  np.testing.assert_array_equal(out.tokens, ar.tokens)


def test_gamma_within_use_is_kept_silently():
  lm, _ = target()
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert usable_gamma(lm, ModelDrafter(small_draft()[0]), 3, 4) == 3  # d_3 replaces the bonus
    assert usable_gamma(lm, ModelDrafter(small_draft()[0]), 1, 1) == 1  # γ 1 is the least
    assert usable_gamma(lm, PromptLookup(), 7, 8) == 7
  with pytest.warns(UserWarning, match="using gamma=7"):
    assert usable_gamma(lm, PromptLookup(), 8, 8) == 7


def test_a_tree_deeper_than_useful_warns_and_is_kept():
  lm, _ = target()
  tree = TableTree(TokenTree.from_paths([(0,), (0, 0), (0, 0, 0), (1,)]))
  with pytest.warns(UserWarning, match="TableTree drafts 3 deep .*never committed"):
    assert usable_gamma(lm, tree, 3, 3) == 3


def test_draft_heads_params_are_checked():
  """EAGLE and Medusa params: {"head"/"heads": ..., "target": ...}, each part checked."""
  from specjax.drafters import Eagle, EagleConfig, Medusa, MedusaConfig, init_eagle
  from specjax.models.medusa_head import init_heads
  lm, params = target()
  config = EagleConfig(d_model=lm.config.d_model, vocab_size=lm.vocab_size, num_heads=2,
                       mlp_dim=64)
  eagle = Eagle(config, TokenTree.chain(2), lm)
  head = init_eagle(config, jax.random.key(0))
  eagle.check_params({"head": head, "target": params})
  with pytest.raises(TypeError, match=r"draft_params must be a dict with keys \['head', "
                     r"'target'\] \(what load_eagle returns\), got \['head'\]"):
    eagle.check_params({"head": head})
  name = sorted(head)[0]
  with pytest.raises(ValueError, match=rf"draft_params\['head'\] do not match the EAGLE head.*"
                     rf"\['{name}'\]"):
    eagle.check_params({"head": {**head, name: jnp.zeros((3,))}, "target": params})
  with pytest.raises(ValueError, match=r"draft_params\['target'\] do not match the model"):
    eagle.check_params({"head": head, "target": small_draft()[1]})

  mconfig = MedusaConfig(num_heads=2, d_model=lm.config.d_model, vocab_size=lm.vocab_size)
  heads = init_heads(mconfig, lm, params)
  medusa = Medusa(mconfig, TokenTree.chain(2))
  medusa.check_params({"heads": heads, "target": None})
  with pytest.raises(ValueError, match=r"draft_params\['heads'\] do not match the Medusa heads"
                     r".*\['lm_head'\] has shape \(2, 32, 63\)"):
    medusa.check_params({"heads": {**heads, "lm_head": heads["lm_head"][..., :63]},
                         "target": None})
  shared = Medusa(MedusaConfig(2, lm.config.d_model, lm.vocab_size, share_lm_head=True),
                  TokenTree.chain(2), lm)
  with pytest.raises(TypeError, match=r"draft_params\['target'\] must be the target's params"):
    shared.check_params({"heads": {"w": heads["w"], "b": heads["b"]}, "target": None})
  prompts, lengths = ragged_prompts(batch=2, seed=3)
  with pytest.raises(TypeError, match="draft_params must be a dict with keys"):
    specjax.speculative_generate(lm, params, medusa, heads, prompts, lengths,
                                 max_new_tokens=4, sampling=GREEDY)


# ------------------------------------------------- the argument checks (specjax._checks)

@pytest.mark.parametrize("call, error, pattern", [
    (lambda: _checks.check_int("n", True), TypeError, r"n must be an int, got True \(bool\)"),
    (lambda: _checks.check_int("n", 2.0, 1), TypeError, r"n must be an int >= 1, got 2.0"),
    (lambda: _checks.check_int("n", 0, 1), ValueError, r"n must be an int >= 1, got 0"),
    (lambda: _checks.check_int("n", -1, 0, 2**31), ValueError,
     r"n must be an int in \[0, 2147483648\], got -1"),
    (lambda: _checks.check_int("k", -1, 0, note=" (0 disables)"), ValueError,
     r"k must be an int >= 0 \(0 disables\), got -1"),
    (lambda: _checks.check_real("x", True), TypeError, r"x must be a real number, got True"),
    (lambda: _checks.check_real("x", "1", 0.0), TypeError,
     r"x must be a real number >= 0, got '1' \(str\)"),
    (lambda: _checks.check_real("x", float("nan"), 0.0), ValueError,
     r"x must be a finite number >= 0, got nan"),
    (lambda: _checks.check_real("x", float("inf")), ValueError,
     r"x must be a finite number, got inf"),
    (lambda: _checks.check_real("x", 0.0, 0.0, lo_open=True), ValueError,
     r"x must be a finite number > 0, got 0.0"),
    (lambda: _checks.check_real("t", -1, 0.0, note=" (0 = greedy)"), ValueError,
     r"t must be a finite number >= 0 \(0 = greedy\), got -1"),
    (lambda: _checks.check_probability("p", 1.0, hi_open=True), ValueError,
     r"p must be a probability in \[0, 1\), got 1.0"),
    (lambda: _checks.check_probability("p", 0, lo_open=True), ValueError,
     r"p must be a probability in \(0, 1\], got 0"),
    (lambda: _checks.check_probability("p", np.nan), ValueError,
     r"p must be a probability in \[0, 1\], got nan"),
    (lambda: _checks.check_probability("p", np.True_), TypeError,
     r"p must be a real number in \[0, 1\], got np.True_"),
    (lambda: _checks.check_bool("b", 1), TypeError, r"b must be a bool, got 1 \(int\)"),
    (lambda: _checks.check_real_array("a", [0.5, 2.0], 0.0, 1.0), ValueError,
     r"a must lie in \[0, 1\], got 2.0 at index \(1,\) \(1 invalid entries\)"),
    (lambda: _checks.check_real_array("a", [[0.5], [np.inf]]), ValueError,
     r"a must be finite, got inf at index \(1, 0\)"),
    (lambda: _checks.check_real_array("a", -1, 0.0), ValueError, r"a must be >= 0, got -1.0"),
    (lambda: _checks.check_real_array("a", 0, 0.0, lo_open=True), ValueError,
     r"a must be > 0, got 0.0"),
    (lambda: _checks.check_real_array("a", [True, False]), TypeError,
     r"a must be a real number or an array-like of them \(int or float dtype\), got "
     r"\[True, False\] with dtype bool"),
    (lambda: _checks.check_real_array("a", "0.5"), TypeError, r"a must be a real number .*string"),
    (lambda: _checks.check_real_array("a", [1, [2]]), ValueError,
     r"a must be a real number or a rectangular array-like"),
    (lambda: _checks.check_int_array("g", True, 1), TypeError,
     r"g must be an integer >= 1, got the bool True"),
    (lambda: _checks.check_int_array("g", [1, 2.5], 1), TypeError,
     r"g must be an integer >= 1 or an array-like of them \(integer dtype\), got \[1, 2.5\]"),
    (lambda: _checks.check_int_array("g", [[1, 0]], 1), ValueError,
     r"g must be an integer >= 1, got 0 at index \(0, 1\) \(1 invalid entries\)"),
])
def test_checks_name_the_argument_the_value_and_what_is_allowed(call, error, pattern):
  with pytest.raises(error, match=pattern):
    call()


def test_checks_return_the_value_normalised():
  for v in (3, np.int64(3), np.uint8(3)):
    assert type(_checks.check_int("n", v, 0, 3)) is int and _checks.check_int("n", v) == 3
  assert _checks.check_optional_int("n", None, 1) is None
  for v in (0.25, 1, np.float32(0.25), np.float64(0.25), np.int32(0)):
    got = _checks.check_real("x", v, 0.0, 1.0)
    assert type(got) is float and got == float(v)
  assert np.isnan(_checks.check_real("x", float("nan"), 0.0, 1.0, allow_nan=True))
  assert _checks.check_optional_real("x", None) is None
  assert _checks.check_probability("p", np.float32(0.5), lo_open=True, hi_open=True) == 0.5
  assert _checks.check_probability("p", 1) == 1.0 and _checks.check_probability("p", 0) == 0.0
  assert _checks.check_bool("b", np.True_) is True
  arr = _checks.check_real_array("a", [[0, 1], [0.5, 1.0]], 0.0, 1.0)
  assert arr.dtype == np.float64 and arr.tolist() == [[0.0, 1.0], [0.5, 1.0]]
  assert _checks.check_real_array("a", np.float32(2.5), 0.0, lo_open=True).ndim == 0
  ints = _checks.check_int_array("g", np.array([1, 4], np.int32), 1)
  assert ints.dtype == np.int64 and ints.tolist() == [1, 4]
