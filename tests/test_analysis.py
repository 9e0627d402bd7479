"""α measurement from exact distributions."""

import jax.numpy as jnp
import numpy as np

from reference import processed_probs
from specjax.measure.beta import measure_beta
from specjax.models.ngram import BigramLM
from specjax.sampling import GREEDY, SamplingConfig


def test_measure_beta_matches_hand_computation():
  v = 7
  rng = np.random.default_rng(0)
  t_table, d_table = rng.normal(size=(v, v)), rng.normal(size=(v, v))
  prompts = jnp.array([[1, 2, 3], [4, 0, 0]], jnp.int32)
  plens = jnp.array([3, 1])
  tokens = jnp.array([[5, 6, 0, 2], [3, 3, 1, 0]], jnp.int32)
  tlens = jnp.array([4, 3])
  for cfg in (SamplingConfig(1.0), SamplingConfig(0.7, top_p=0.8), GREEDY):
    beta, mask = measure_beta(BigramLM(v), {"logits": jnp.asarray(t_table, jnp.float32)},
                              BigramLM(v), {"logits": jnp.asarray(d_table, jnp.float32)},
                              prompts, plens, tokens, tlens, cfg)
    q = processed_probs(t_table, cfg.temperature, cfg.top_k, cfg.top_p)
    p = processed_probs(d_table, cfg.temperature, cfg.top_k, cfg.top_p)
    prev = [[3, 5, 6, 0], [4, 3, 3, 1]]
    want = np.array([[np.minimum(p[a], q[a]).sum() for a in row] for row in prev])
    np.testing.assert_allclose(beta, want, atol=1e-5)
    np.testing.assert_array_equal(mask, [[1, 1, 1, 1], [1, 1, 1, 0]])
    if cfg.is_greedy:
      assert set(np.unique(np.asarray(beta))) <= {0.0, 1.0}
