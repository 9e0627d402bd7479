"""What gamma="auto" costs per iteration: the adaptive loop against fixed γ and AR.

  python benchmarks/adaptive_cost.py            # ~3 min on 2 cores
  python benchmarks/adaptive_cost.py --quick    # smoke run (tiny models, few repeats)

An adaptive loop (`specjax.adaptive`) that always chooses one γ must cost
what a fixed-γ loop costs (and, at γ = 0, what plain decoding costs): its
choice per iteration, its observation, its segments and the draft model's
catching up are the overhead. Measured on two pairs with random weights
(the cost of an iteration does not depend on the weights): the main job's
`quick` T5 pair (6.95M target, 0.07M draft) and `cpu-target-27m` +
`cpu-draft-1m`, and the long-context grid's `quick` shapes at a 512-token
prompt. For each: plain decoding, speculative decoding at γ = 1 and
4, and `gamma="auto"` with the cost table rigged so that it always chooses 0,
1 or 4 (`gamma_costs`: that γ cheap, the others prohibitive; rigged to 0, no
γ pays at the rule's prior, so the call runs plain decoding's program). Each program
is run with 64 and with 2 new tokens, interleaved round by round; decode
time per iteration = (median(64) - median(2)) / the difference in
iterations (the prefill cancels). Prompt lookup at γ = 4 and under `auto`
rigged to 0: it never runs plain decoding's program (a match may appear at
any token), so its plain step also matches, previews and observes.

Writes `adaptive_cost.json` and `adaptive_cost.md` into --out_dir.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import specjax
from specjax.adaptive import AdaptiveGamma
from specjax.atomic_io import atomic_write_text
from specjax.measure.provenance import machine_line, provenance, provenance_sentence
from specjax.measure.timing import interleaved_rounds
from specjax.models.t5_config import T5Config

_OUT = flags.DEFINE_string("out_dir", "benchmarks/results", "Where the JSON and markdown go.")
_QUICK = flags.DEFINE_bool("quick", False, "Tiny models, few repeats (smoke run).")
_REPEATS = flags.DEFINE_integer("repeats", 9, "Interleaved rounds.")

LONG, SHORT = 64, 2


def _pairs(quick: bool):
  if quick:
    t = specjax.DecoderLM(specjax.decoder_config("tiny"))
    d = specjax.DecoderLM(specjax.decoder_config("tiny", num_layers=1))
    return {"tiny decoder": (t, t.init(jax.random.PRNGKey(0)), d, d.init(jax.random.PRNGKey(1)),
                             8)}
  t5t, t5d = _quick_t5(256, 32, 8, 768, 3), _quick_t5(16, 8, 2, 32, 1)
  dt = specjax.DecoderLM(specjax.decoder_config("cpu-target-27m"))
  dd = specjax.DecoderLM(specjax.decoder_config("cpu-draft-1m"))
  return {"T5 quick (6.95M + 0.07M), prompt 64": (t5t, t5t.init(jax.random.PRNGKey(0)), t5d,
                                                   t5d.init(jax.random.PRNGKey(1)), 64),
          "cpu-target-27m + cpu-draft-1m, prompt 32": (dt, dt.init(jax.random.PRNGKey(0)), dd,
                                                       dd.init(jax.random.PRNGKey(1)), 32),
          "long-context quick (4.2M + 0.3M), prompt 512": _long_context_pair()}


def _long_context_pair():
  """configs/long_context.py:quick's shapes: where prompt lookup's plain step matches over
  ~580 history positions against a step of under a millisecond (0.36 ms trained, 512 × 1)."""
  def lm(d_model, layers, heads, head_dim, mlp, tie):
    return specjax.DecoderLM(specjax.DecoderConfig(
        vocab_size=2048, d_model=d_model, num_layers=layers, num_heads=heads,
        num_kv_heads=heads, head_dim=head_dim, mlp_dim=mlp, tie_embeddings=tie))
  t, d = lm(256, 4, 4, 64, 704, False), lm(96, 1, 2, 48, 256, True)
  return t, t.init(jax.random.PRNGKey(0)), d, d.init(jax.random.PRNGKey(1)), 512


def _quick_t5(d_model, d_kv, num_heads, d_ff, num_layers) -> specjax.T5:
  """A T5 of configs/leviathan_t5.py:quick's shapes (its 2048-piece vocabulary)."""
  return specjax.T5(T5Config(vocab_size=2048, d_model=d_model, d_kv=d_kv, num_heads=num_heads,
                             d_ff=d_ff, num_layers=num_layers, feed_forward="gated-gelu",
                             tie_word_embeddings=False))


def _forced(index: int):
  costs = [1e9] * len(AdaptiveGamma().gammas)
  costs[index] = 1.0
  return costs


def measure_pair(target, tp, draft, dp, prompt_len: int, repeats: int) -> dict:
  prompts = jnp.asarray(np.random.default_rng(0).integers(3, target.vocab_size,
                                                          (1, prompt_len)), jnp.int32)
  ad = AdaptiveGamma()
  g = specjax.GREEDY
  lookup = specjax.drafters.PromptLookup()

  def cells(n):
    sp = lambda **kw: specjax.speculative_generate(target, tp, draft, dp, prompts,
                                                   max_new_tokens=n, sampling=g, **kw)
    lk = lambda **kw: specjax.speculative_generate(target, tp, lookup, None, prompts,
                                                   max_new_tokens=n, sampling=g, **kw)
    return {
        "autoregressive": lambda: specjax.generate(target, tp, prompts, max_new_tokens=n,
                                                   sampling=g),
        "fixed γ=1": lambda: sp(gamma=1),
        "fixed γ=4": lambda: sp(gamma=4),
        "auto, always 0": lambda: sp(gamma=ad, gamma_costs=_forced(ad.gammas.index(0))),
        "auto, always 1": lambda: sp(gamma=ad, gamma_costs=_forced(ad.gammas.index(1))),
        "auto, always 4": lambda: sp(gamma=ad, gamma_costs=_forced(ad.gammas.index(4))),
        # Prompt lookup never falls back to plain decoding's program (a match may appear at
        # any token): its plain step also matches the history and observes its preview.
        "prompt lookup, fixed γ=4": lambda: lk(gamma=4),
        "prompt lookup auto, always 0": lambda: lk(gamma=ad,
                                                   gamma_costs=_forced(ad.gammas.index(0))),
    }

  runs = {LONG: cells(LONG), SHORT: cells(SHORT)}
  iters = {}
  for n, fns in runs.items():   # compile, and count iterations (greedy: deterministic)
    for name, fn in fns.items():
      out = fn()
      iters[(name, n)] = int(np.asarray(out.stats.target_calls).max()) - 1
  # Each cell's long and short call side by side, the order reversed every other round.
  timed = interleaved_rounds({(name, n): runs[n][name] for name in runs[LONG]
                              for n in (LONG, SHORT)}, repeats, reverse=True)
  rows = {}
  for name in runs[LONG]:
    long_s, short_s = (timed.median((name, n)) for n in (LONG, SHORT))
    it = iters[(name, LONG)] - iters[(name, SHORT)]
    rows[name] = {"decode_ms_per_iteration": 1e3 * (long_s - short_s) / it,
                  "iterations": iters[(name, LONG)], "call_ms_2_tokens": 1e3 * short_s}
  base = rows["autoregressive"]["decode_ms_per_iteration"]
  for name, r in rows.items():
    r["x_ar_step"] = r["decode_ms_per_iteration"] / base
  for g_name, auto_name in (("fixed γ=1", "auto, always 1"), ("fixed γ=4", "auto, always 4"),
                            ("autoregressive", "auto, always 0"),
                            ("autoregressive", "prompt lookup auto, always 0")):
    rows[auto_name]["x_its_fixed"] = (rows[auto_name]["decode_ms_per_iteration"]
                                      / rows[g_name]["decode_ms_per_iteration"])
  return rows


def render(res: dict) -> str:
  lines = ["# gamma=\"auto\": what the adaptive loop costs per iteration", "",
           f"{res['machine']}, jax {jax.__version__}, {res['repeats']} interleaved rounds."
           + provenance_sentence(res), "",
           "Decode time per iteration = (median of a 64-token call − median of a 2-token "
           "call) / the difference in iterations (the prefill cancels); random weights; "
           "`auto, always γ`: the adaptive loop with its cost table rigged to choose γ at "
           "every iteration.", ""]
  for pair, rows in res["pairs"].items():
    lines += [f"**{pair}**", "", "| loop | ms / iteration | × AR step | × its fixed-γ loop "
              "| a 2-token call, ms |", "|---|---|---|---|---|"]
    for name, r in rows.items():
      fixed = r.get("x_its_fixed")
      lines.append(f"| {name} | {r['decode_ms_per_iteration']:.3f} | {r['x_ar_step']:.2f} | "
                   f"{'' if fixed is None else f'{fixed:.2f}'} | {r['call_ms_2_tokens']:.2f} |")
    lines.append("")
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  quick = _QUICK.value
  repeats = 2 if quick else _REPEATS.value
  res = {"machine": machine_line(), "repeats": repeats, "pairs": {},
         "provenance": provenance()}
  for name, (t, tp, d, dp, p) in _pairs(quick).items():
    res["pairs"][name] = measure_pair(t, tp, d, dp, p, repeats)
  os.makedirs(_OUT.value, exist_ok=True)
  stem = "adaptive_cost_quick" if quick else "adaptive_cost"
  atomic_write_text(os.path.join(_OUT.value, stem + ".json"), json.dumps(res, indent=1))
  md = render(res)
  atomic_write_text(os.path.join(_OUT.value, stem + ".md"), md)
  print(md)


if __name__ == "__main__":
  app.run(main)
