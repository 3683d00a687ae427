"""Monte Carlo predictive averaging and the uncertainty it measures.

With ``S`` posterior samples of a classifier's log-probabilities
``log p_s(y | x)`` (stacked on a leading axis), the Bayesian model average is
``p(y | x) = (1/S) sum_s p_s(y | x)``. Its entropy (total uncertainty) splits
into the mean entropy of the samples (aleatoric) and the mutual information
between the prediction and the weights (epistemic).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

Array = jax.Array


def sample_outputs(fn: Callable[[Array], Array], key: Array, num_samples: int) -> Array:
  """``fn(key_s)`` for ``num_samples`` independent keys, stacked on axis 0.

  The samples run one after another (``lax.map``), so memory holds one forward
  pass at a time.

  Args:
    fn: maps a PRNG key to outputs, e.g.
      ``lambda k: model.apply(variables, x, rngs={'sample': k})``.
    key: PRNG key.
    num_samples: number of posterior samples (>= 1).

  Returns:
    ``[num_samples, ...]`` outputs.
  """
  if num_samples < 1:
    raise ValueError(f"sample_outputs: num_samples={num_samples!r} must be >= 1")
  return jax.lax.map(fn, jax.random.split(key, num_samples))


def model_average(log_probs: Array) -> Array:
  """Log-probabilities of the Bayesian model average, ``log mean_s p_s``.

  Args:
    log_probs: ``[S, ..., classes]`` per-sample log-probabilities.

  Returns:
    ``[..., classes]``, computed stably with logsumexp.

  >>> import jax.numpy as jnp
  >>> lp = jnp.log(jnp.array([[[0.9, 0.1]], [[0.5, 0.5]]]))
  >>> jnp.exp(model_average(lp))
  Array([[0.7..., 0.3...]], dtype=float32)
  """
  return jax.nn.logsumexp(log_probs, axis=0) - math.log(log_probs.shape[0])


def entropy(log_probs: Array) -> Array:
  """Entropy in nats over the last axis of normalized log-probabilities."""
  return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)


def mutual_information(log_probs: Array) -> Array:
  """Epistemic uncertainty: ``H[mean_s p_s] - mean_s H[p_s]`` (>= 0), in nats.

  Args:
    log_probs: ``[S, ..., classes]`` per-sample log-probabilities.

  Returns:
    ``[...]`` mutual information between the label and the weights.
  """
  return entropy(model_average(log_probs)) - jnp.mean(entropy(log_probs), axis=0)


def streaming_model_average(log_prob_fn: Callable[[Array], Array], keys: Array
                            ) -> tuple[Array, Array]:
  """The model average and mutual information of ``log_prob_fn(key)`` over ``keys``,
  holding one sample at a time (memory of one forward pass, not ``S``).

  Args:
    log_prob_fn: maps a PRNG key to normalized ``[..., classes]`` log-probabilities.
    keys: ``[S]`` PRNG keys, one per posterior sample.

  Returns:
    ``(log mean_s p_s  [..., classes], mutual information [...])``, equal to
    ``model_average`` and ``mutual_information`` of the stacked samples.
  """
  first = log_prob_fn(keys[0])

  def add(carry, key):
    log_sum, entropy_sum = carry
    log_probs = log_prob_fn(key)
    return (jnp.logaddexp(log_sum, log_probs), entropy_sum + entropy(log_probs)), None

  (log_sum, entropy_sum), _ = jax.lax.scan(add, (first, entropy(first)), keys[1:])
  num_samples = keys.shape[0]
  average = log_sum - math.log(num_samples)
  return average, entropy(average) - entropy_sum / num_samples
