"""Output quality of a trained model from greedy decodes: BLEU and ROUGE.

`greedy_decode` encodes text prompts, decodes them with `specjax.generate` (temperature 0) and
returns the texts; `generation_quality` scores them against references with sacrebleu (corpus
BLEU, 0-100) and / or rouge-score (mean F1 of rouge1 / rouge2 / rougeL, 0-1, stemmed), each
imported only when asked for.

Prompts are cut as training rows are: seq2seq inputs get EOS and are cut to `max_prompt_len`
(the last kept token becomes EOS); decoder-only prompts get no EOS and are cut from the left.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from specjax.api import generate
from specjax.sampling import GREEDY

__all__ = ["greedy_decode", "generation_quality"]


def _encode_prompts(tokenizer, texts: Sequence[str], seq2seq: bool, max_prompt_len: int):
  rows = []
  for ids in tokenizer.processor.encode(list(texts), out_type=int):
    ids = list(ids)
    if seq2seq:
      ids = ids[:max_prompt_len - 1] + [tokenizer.eos_id]
    else:
      ids = ids[-max_prompt_len:] or [tokenizer.eos_id]
    rows.append(ids)
  p = max(len(r) for r in rows)
  tokens = np.zeros((len(rows), p), np.int32)
  lengths = np.zeros((len(rows),), np.int32)
  for i, r in enumerate(rows):
    tokens[i, :len(r)] = r
    lengths[i] = len(r)
  return tokens, lengths


def greedy_decode(model, params, tokenizer, prompts: Sequence[str], *, seq2seq: bool,
                  max_new_tokens: int = 64, batch_size: int = 16,
                  max_prompt_len: int = 256) -> list[str]:
  """Greedy continuations of `prompts` (texts), decoded to text (EOS stops a row)."""
  out = []
  for i in range(0, len(prompts), batch_size):
    chunk = list(prompts[i:i + batch_size])
    n = len(chunk)
    chunk += [chunk[-1]] * (batch_size - n)  # One shape for every chunk: one compilation.
    tokens, lengths = _encode_prompts(tokenizer, chunk, seq2seq, max_prompt_len)
    tokens = np.pad(tokens, ((0, 0), (0, max_prompt_len - tokens.shape[1])))
    res = generate(model, params, tokens, lengths, max_new_tokens=max_new_tokens,
                           sampling=GREEDY, eos_id=tokenizer.eos_id,
                           pad_id=tokenizer.pad_id)
    texts = tokenizer.decode_batch(np.asarray(res.tokens), np.asarray(res.lengths))
    out += texts[:n]
  return out


def generation_quality(model, params, tokenizer, records: Sequence[Mapping[str, Any]], *,
                       seq2seq: bool, prompt_template: str, reference_field: str = "targets",
                       bleu: bool = False, rouge: bool = False, max_new_tokens: int = 64,
                       batch_size: int = 16, max_prompt_len: int = 256) -> dict:
  """Greedy-decodes `records` and scores them; returns metrics and a few samples."""
  records = list(records)
  if not records:
    raise ValueError("generation_quality needs at least one record")
  prompts = [prompt_template.format(**r) for r in records]
  refs = [str(r[reference_field]) for r in records]
  hyps = greedy_decode(model, params, tokenizer, prompts, seq2seq=seq2seq,
                       max_new_tokens=max_new_tokens, batch_size=batch_size,
                       max_prompt_len=max_prompt_len)
  result: dict = {"num_examples": len(records),
                  "samples": [{"prompt": p[-200:], "reference": r, "output": h}
                              for p, r, h in list(zip(prompts, refs, hyps))[:3]]}
  if bleu:
    import sacrebleu  # pylint: disable=g-import-not-at-top
    result["bleu"] = float(sacrebleu.corpus_bleu(hyps, [refs]).score)
  if rouge:
    from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    scores = [scorer.score(r, h) for r, h in zip(refs, hyps)]
    for name in ("rouge1", "rouge2", "rougeL"):
      result[name] = float(np.mean([s[name].fmeasure for s in scores]))
  return result
