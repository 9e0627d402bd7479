"""What refusing bad input costs: the non-finite count in the loop, the checks per call.

  python benchmarks/bad_input_cost.py            # ~4 min on 2 cores
  python benchmarks/bad_input_cost.py --quick    # smoke run (tiny model, few repeats)

Three things `specjax.generate` / `speculative_generate` now do that they did
not (docs/library.md, "Bad input and non-finite logits"):

* `loop`: every target call counts its rows whose logits held NaN / +inf
  (`DecodeStats.nonfinite`: one max over V per call position). Measured
  side by side: the same decoder with `count_nonfinite=True` and `False`,
  whole `run` calls (prefill + loop) interleaved round by round, medians;
  the ratio is what the count costs per call of the loop;
* `checks`: the host-side checks per call: `check_params` on the
  `cpu-target-27m` tree (real arrays) and on an abstract `llama-7b-like`
  tree (its `jax.eval_shape`; the model's expected tree cached after the
  first call), the token-id check of host and of device prompts.

Writes `bad_input_cost.json` and `bad_input_cost.md` into --out_dir.
"""

import json
import os

import jax
import numpy as np
from absl import app, flags, logging

from specjax import DecoderLM, GREEDY, decoder_config
from specjax._checks import check_token_ids
from specjax.atomic_io import atomic_write_text
from specjax.drafters import ModelDrafter
from specjax.generation import AutoregressiveDecoder, SpeculativeDecoder
from specjax.measure.provenance import machine_line, provenance, provenance_sentence
from specjax.measure.timing import interleaved_rounds, now, time_call
from specjax.protocol import check_params

_OUT = flags.DEFINE_string("out_dir", "benchmarks/results", "Where the JSON and markdown go.")
_QUICK = flags.DEFINE_bool("quick", False, "Tiny model, few repeats (smoke run).")
_REPEATS = flags.DEFINE_integer("repeats", 9, "Interleaved rounds per cell.")

MAX_NEW = 64
GAMMA = 4


def _decoders(target, draft, kind, count):
  if kind == "ar":
    return AutoregressiveDecoder(target, GREEDY, MAX_NEW, count_nonfinite=count)
  return SpeculativeDecoder(target, ModelDrafter(draft), GAMMA, GREEDY, MAX_NEW,
                            count_nonfinite=count)


def loop_cost(target, tp, draft, dp, batch, repeats):
  """Median seconds of a whole decode with and without the count, interleaved."""
  prompts = jax.random.randint(jax.random.key(batch), (batch, 16), 6, target.vocab_size)
  lengths = np.full((batch,), 16, np.int32)
  keys = jax.random.split(jax.random.key(0), batch)
  rows = []
  for kind in ("ar", "speculative"):
    runs = {}
    for count in (True, False):
      dec = _decoders(target, draft, kind, count)
      slots = 16 + MAX_NEW + (GAMMA if kind != "ar" else 0)

      def call(dec=dec, kind=kind):
        cache = target.init_cache(batch, slots, 16)
        if kind == "ar":
          return dec.run(tp, prompts, lengths, keys, cache).tokens
        return dec.run(tp, dp, prompts, lengths, keys, cache,
                       draft.init_cache(batch, slots, 16)).tokens
      call().block_until_ready()  # compile
      runs[count] = call
    timed = interleaved_rounds(runs, repeats)
    on, off = timed.median(True), timed.median(False)
    rows.append({"kind": kind, "batch": batch, "with_count_ms": 1e3 * on,
                 "without_count_ms": 1e3 * off, "ratio": on / off})
    logging.info("%s batch %d: %.2f ms with the count, %.2f without (%.3fx)", kind, batch,
                 1e3 * on, 1e3 * off, on / off)
  return rows


def check_costs(target, tp, quick):
  out = {}
  out["check_params_27m_ms"] = 1e3 * time_call(
      lambda: check_params(target, tp, "params"), repeats=20)["median_s"]
  if not quick:
    big = DecoderLM(decoder_config("llama-7b-like"))
    abstract = jax.eval_shape(big.init, jax.random.PRNGKey(0))
    first = now()
    check_params(big, abstract, "params")
    out["check_params_7b_first_ms"] = 1e3 * (now() - first)
    out["check_params_7b_ms"] = 1e3 * time_call(
        lambda: check_params(big, abstract, "params"), repeats=20)["median_s"]
  host = np.random.default_rng(0).integers(0, 32000, size=(8, 2048)).astype(np.int32)
  device = jax.device_put(host)
  lengths = np.full((8,), 2048, np.int32)
  out["token_ids_host_8x2048_ms"] = 1e3 * time_call(
      lambda: check_token_ids("prompts", host, lengths, 32000), repeats=20)["median_s"]
  out["token_ids_device_8x2048_ms"] = 1e3 * time_call(
      lambda: check_token_ids("prompts", device, lengths, 32000), repeats=20)["median_s"]
  return out


def to_markdown(result):
  meta = result["meta"]
  lines = [
      "# What refusing bad input costs",
      "",
      f"{meta['machine']}; jax {meta['jax']}; target `{meta['target']}`, draft "
      f"`{meta['draft']}`, greedy, {MAX_NEW} new tokens, prompts of 16, γ = {GAMMA}; whole "
      f"`run` calls with and without the non-finite count, interleaved, median of "
      f"{meta['repeats']} rounds." + provenance_sentence(result),
      "",
      "| decoder | batch | with the count (ms) | without (ms) | ratio |",
      "|---|---|---|---|---|",
  ]
  for r in result["loop"]:
    lines.append(f"| {r['kind']} | {r['batch']} | {r['with_count_ms']:.2f} | "
                 f"{r['without_count_ms']:.2f} | {r['ratio']:.3f} |")
  lines += ["", "Checks per call (host, ms, median of 20):", "",
            "| check | ms |", "|---|---|"]
  lines += [f"| {k[:-3]} | {v:.3f} |" for k, v in result["checks"].items()]
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  quick = _QUICK.value
  names = ("tiny", "tiny") if quick else ("cpu-target-27m", "cpu-draft-1m")
  target, draft = (DecoderLM(decoder_config(n)) for n in names)
  tp, dp = target.init(jax.random.PRNGKey(0)), draft.init(jax.random.PRNGKey(1))
  repeats = 2 if quick else _REPEATS.value
  loop = []
  for batch in ((1,) if quick else (1, 8)):
    loop += loop_cost(target, tp, draft, dp, batch, repeats)
  result = {
      "provenance": provenance(),
      "meta": {"machine": machine_line(), "jax": jax.__version__, "target": names[0],
               "draft": names[1],
               "repeats": repeats, "load_average_at_start": os.getloadavg()[0]},
      "loop": loop, "checks": check_costs(target, tp, quick)}
  os.makedirs(_OUT.value, exist_ok=True)
  atomic_write_text(os.path.join(_OUT.value, "bad_input_cost.json"),
                    json.dumps(result, indent=1) + "\n")
  md = to_markdown(result)
  atomic_write_text(os.path.join(_OUT.value, "bad_input_cost.md"), md)
  print(md)


if __name__ == "__main__":
  app.run(main)
