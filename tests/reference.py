"""Independent numpy references used by the tests (not the code under test)."""

import numpy as np
from scipy import stats


def softmax(x):
  x = np.asarray(x, np.float64)
  z = np.exp(x - x.max(axis=-1, keepdims=True))
  return z / z.sum(axis=-1, keepdims=True)


def processed_probs(logits, temperature=1.0, top_k=0, top_p=1.0):
  """Temperature → top-k → top-p, one distribution at a time, in float64."""
  logits = np.asarray(logits, np.float64)
  out = np.zeros_like(logits)
  flat_in = logits.reshape(-1, logits.shape[-1])
  flat_out = out.reshape(-1, logits.shape[-1])
  for row, res in zip(flat_in, flat_out):
    if temperature == 0:
      res[np.argmax(row)] = 1.0
      continue
    z = row / temperature
    if top_k:
      kth = np.sort(z)[::-1][top_k - 1]
      z = np.where(z >= kth, z, -np.inf)
    p = softmax(z)
    if top_p < 1.0:
      order = np.argsort(-p, kind="stable")
      kept, mass = [], 0.0
      for i in order:
        if mass >= top_p:
          break
        kept.append(i)
        mass += p[i]
      thr = p[kept].min()
      p = np.where(p >= thr, p, 0.0)
      p = p / p.sum()
    res[:] = p
  return out


def chi_square_pvalue(observed_counts, expected_probs, min_expected=5.0):
  """Pearson chi-square p-value. Cells with expected count < min_expected are
  pooled into one cell; cells with zero probability must be empty (else 0)."""
  observed = np.asarray(observed_counts, np.float64).ravel()
  probs = np.asarray(expected_probs, np.float64).ravel()
  n = observed.sum()
  if np.any(observed[probs <= 0] > 0):
    return 0.0
  expected = probs * n
  big = expected >= min_expected
  obs = list(observed[big])
  exp = list(expected[big])
  if (~big).any() and expected[~big].sum() > 0:
    obs.append(observed[~big & (probs > 0)].sum())
    exp.append(expected[~big].sum())
  return float(stats.chisquare(obs, exp).pvalue)
