"""Per-source evaluation items made up for tests: random token statistics, references from
a small vocabulary and outputs of a chosen quality (``make_items``)."""

import numpy as np

from meshbayes import metrics
from meshbayes.evaluation.items import SourceItems

WORDS = "le chat noir dort sur un tapis rouge ce soir".split()


def token_statistics(rng, n):
  """Per-source token statistics of random predictive distributions (rows summed)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  log_probs = np.log(rng.dirichlet(np.full(5, 0.5), size=(n, 4)))
  targets = rng.integers(0, 5, size=(n, 4))
  per_source = [metrics.token_calibration_statistics(jnp.asarray(log_probs[i:i + 1]),
                                                     jnp.asarray(targets[i:i + 1]),
                                                     jnp.ones((1, 4))) for i in range(n)]
  return {k: np.stack([np.asarray(s[k], np.float64) for s in per_source]) for k in per_source[0]}


def make_items(seed, n=60, quality=0.5):
  rng = np.random.default_rng(seed)
  statistics = token_statistics(rng, n)  # drawn first: the same for any quality
  references, predictions = [], []
  for k in range(n):
    ref = " ".join(rng.choice(WORDS, size=5))
    references.append([ref] + ([ref.replace("chat", "chien")] if k % 3 == 0 else []))
    words = ref.split()
    predictions.append(" ".join(w if rng.random() < quality else rng.choice(WORDS)
                                for w in words))
  log_probs = np.log(rng.uniform(0.01, 0.9, size=n))
  return SourceItems([f"source {k}" for k in range(n)], statistics, references,
                     predictions, log_probs, rng.integers(3, 9, size=n),
                     {"total_uncertainty": rng.random(n), "mutual_information": rng.random(n)})
