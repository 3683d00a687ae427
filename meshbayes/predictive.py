"""Monte Carlo predictive averaging and the uncertainty it measures.

With ``S`` posterior samples of a classifier's log-probabilities
``log p_s(y | x)`` (stacked on a leading axis; weight samples, ensemble
members or dropout masks alike), the Bayesian model average is
``p(y | x) = (1/S) sum_s p_s(y | x)``. The measures of Malinin and Gales
(ICLR 2021, "Uncertainty estimation in autoregressive structured
prediction", Sections 3-4), all in nats, with ``pbar`` the average:

Per token (the next-token distribution given the prefix; ``token_measures``):

- ``total_uncertainty``: ``H[pbar]``.
- ``data_uncertainty``: expected data uncertainty, ``mean_s H[p_s]``.
- ``mutual_information``: ``H[pbar] - mean_s H[p_s]`` (knowledge uncertainty).
- ``expected_pairwise_kl``: ``mean_{s,s'} KL(p_s || p_s')``.
- ``reverse_mutual_information``: ``mean_s KL(pbar || p_s)``; and
  ``expected_pairwise_kl = mutual_information + reverse_mutual_information``.

Per sequence ``y`` of ``L`` tokens, two aggregations. Token level: the mean
of the token measures over ``y``'s tokens (``y`` fed as the prefix). Sequence
level (``sequence_measures``), from each sample's ``log P_s(y | x)``:
``sequence_total_uncertainty = -(1/L) log mean_s P_s(y)``,
``sequence_data_uncertainty = -(1/L) mean_s log P_s(y)`` and their
difference ``sequence_reverse_mutual_information`` (>= 0): the Monte Carlo
estimate of the sequence-level reverse mutual information with ``y`` drawn
from the average, which is why the paper introduces that measure (the
mutual information itself would need outputs drawn from every ``p_s``).
Everything is length-normalized by ``L``.

Over the ``B`` hypotheses of a beam (``beam_sequence_measures``): the paper's
importance-weighted estimators (Section 4), each hypothesis weighted by its
probability normalized over the beam, and length-normalized on its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from meshbayes.field_checks import positive_int, positive_number
from meshbayes.metrics import measures as registry

Array = jax.Array
# The names of the measures above, as the registry orders them (meshbayes.metrics.measures).
TOKEN_MEASURES = registry.names(kind=registry.UNCERTAINTY, level=registry.TOKEN)
SEQUENCE_MEASURES = registry.names(kind=registry.UNCERTAINTY, level=registry.SEQUENCE)
BEAM_MEASURES = registry.names(kind=registry.UNCERTAINTY, level=registry.BEAM)


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
  positive_int("sample_outputs", "num_samples", num_samples)
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


def _measures(average: Array, mean_entropy: Array, mean_log_probs: Array) -> dict[str, Array]:
  """The token measures from ``log pbar``, ``mean_s H[p_s]`` and ``mean_s log p_s``."""
  total = entropy(average)
  cross = jnp.sum(jnp.exp(average) * mean_log_probs, axis=-1)  # sum_v pbar mean_s log p_s
  return {"total_uncertainty": total, "data_uncertainty": mean_entropy,
          "mutual_information": total - mean_entropy,
          "expected_pairwise_kl": -mean_entropy - cross,
          "reverse_mutual_information": -total - cross}


def token_measures(log_probs: Array) -> dict[str, Array]:
  """Every measure of ``TOKEN_MEASURES`` for stacked samples.

  Args:
    log_probs: ``[S, ..., classes]`` per-sample log-probabilities (finite).

  Returns:
    ``{name: [...]}``.
  """
  return _measures(model_average(log_probs), jnp.mean(entropy(log_probs), axis=0),
                   jnp.mean(log_probs, axis=0))


def streaming_token_measures(log_prob_fn: Callable[[Array], Array], keys: Array,
                             targets: Array | None = None
                             ) -> tuple[Array, dict[str, Array], Array | None]:
  """``model_average`` and ``token_measures`` of ``log_prob_fn(key)`` over ``keys``,
  holding one sample at a time (memory of one forward pass, not ``S``).

  Args:
    log_prob_fn: maps a PRNG key to normalized ``[..., classes]`` log-probabilities.
    keys: ``[S]`` PRNG keys, one per posterior sample.
    targets: optional ``[...]`` class ids whose per-sample log-probabilities to keep.

  Returns:
    ``(log pbar [..., classes], {name: [...]}, [S, ...] target log-probabilities
    of each sample, or None)``.
  """
  def one(key):
    log_probs = log_prob_fn(key)
    picked = (None if targets is None else
              jnp.take_along_axis(log_probs, targets[..., None], -1)[..., 0])
    return log_probs, picked

  def add(carry, key):
    log_sum, entropy_sum, log_probs_sum = carry
    log_probs, picked = one(key)
    return (jnp.logaddexp(log_sum, log_probs), entropy_sum + entropy(log_probs),
            log_probs_sum + log_probs), picked

  first, first_picked = one(keys[0])
  (log_sum, entropy_sum, log_probs_sum), picked = jax.lax.scan(
      add, (first, entropy(first), first), keys[1:])
  num_samples = keys.shape[0]
  average = log_sum - math.log(num_samples)
  measures = _measures(average, entropy_sum / num_samples, log_probs_sum / num_samples)
  if targets is not None:
    picked = jnp.concatenate([first_picked[None], picked])
  return average, measures, picked


def sequence_measures(sample_log_probs: Array, lengths: Array) -> dict[str, Array]:
  """``SEQUENCE_MEASURES`` from each sample's log-probability of the same outputs.

  Args:
    sample_log_probs: ``[S, ...]`` ``log P_s(y | x)`` of each output ``y``.
    lengths: ``[...]`` tokens of each output (clipped to at least 1).

  Returns:
    ``{name: [...]}``, length-normalized.
  """
  lengths = jnp.maximum(lengths, 1).astype(jnp.float32)
  total = -model_average(sample_log_probs[..., None])[..., 0] / lengths
  data = -jnp.mean(sample_log_probs, axis=0) / lengths
  return {"sequence_total_uncertainty": total, "sequence_data_uncertainty": data,
          "sequence_reverse_mutual_information": data - total}


def beam_sequence_measures(sample_log_probs: Array, lengths: Array,
                           temperature: float = 1.0) -> dict[str, Array]:
  """``BEAM_MEASURES``: the sequence measures over a beam's ``B`` hypotheses ``y_b``,
  importance-weighted (Malinin and Gales, ICLR 2021, Section 4).

  With ``P(y) = mean_s P_s(y | x)`` (as in ``sequence_measures``), the weights of the
  average ``pi_b = P(y_b)^(1/T) / sum_k P(y_k)^(1/T)`` (the paper's importance weights)
  and of each sample ``w_sb = P_s(y_b)^(1/T) / sum_k P_s(y_k)^(1/T)``, and ``L_b`` the
  tokens of ``y_b``:

  - ``beam_total_uncertainty = -sum_b pi_b log P(y_b) / L_b``: the paper's ``H_S-IW``
    (its importance-weighted sequence entropy of the predictive).
  - ``beam_data_uncertainty = -mean_s sum_b w_sb log P_s(y_b) / L_b``: ``mean_s H[P_s]``,
    each sample's expectation weighted by its own probabilities.
  - ``beam_mutual_information``: total minus data uncertainty.
  - ``beam_epkl = -sum_b pi_b mean_s log P_s(y_b) / L_b`` minus data uncertainty
    (``mean_{s,s'} KL(P_s || P_s')``; = mutual information + reverse mutual information).
  - ``beam_reverse_mutual_information = sum_b pi_b (log P(y_b) - mean_s log P_s(y_b)) /
    L_b``: the paper's ``M_S-IW``.

  At ``T = 1`` with the beam the whole support of every ``P_s``, ``pi_b = P(y_b)`` and
  ``w_sb = P_s(y_b)``: each is exactly the expectation of its length-normalized
  definition. With ``B = 1``, total, data and reverse mutual information are
  ``sequence_measures``'; the mutual information is then minus the reverse one and the
  EPKL 0 (one hypothesis cannot show where the samples put their mass).

  Args:
    sample_log_probs: ``[S, ..., B]`` ``log P_s(y_b | x)``. ``-inf`` under every sample
      marks an absent hypothesis (padding, a repeat), weighted 0; each ``[...]`` needs a
      present one (else NaN).
    lengths: ``[..., B]`` tokens of each hypothesis (clipped to at least 1).
    temperature: ``T`` of the importance weights (1: the probabilities).

  Returns:
    ``{name: [...]}``.
  """
  sample_log_probs, lengths = jnp.asarray(sample_log_probs), jnp.asarray(lengths)
  if sample_log_probs.ndim < 2 or sample_log_probs.shape[1:] != lengths.shape:
    raise ValueError(f"beam_sequence_measures: sample_log_probs of shape "
                     f"{sample_log_probs.shape} and lengths of shape {lengths.shape} must be "
                     "[S, ..., B] and [..., B]")
  positive_number("beam_sequence_measures", "temperature", temperature)
  lengths = jnp.maximum(lengths, 1).astype(jnp.float32)

  def weighted_sum(weights, values):  # sum_b weights * values / L_b; absent ones add 0
    return jnp.sum(jnp.where(weights > 0, weights * values, 0.0) / lengths, axis=-1)

  average = model_average(sample_log_probs)  # log P(y_b), [..., B]
  average_weights = jax.nn.softmax(average / temperature, axis=-1)
  sample_weights = jax.nn.softmax(sample_log_probs / temperature, axis=-1)
  total = -weighted_sum(average_weights, average)
  data = -jnp.mean(weighted_sum(sample_weights, sample_log_probs), axis=0)
  cross = -weighted_sum(average_weights, jnp.mean(sample_log_probs, axis=0))
  return {"beam_total_uncertainty": total, "beam_data_uncertainty": data,
          "beam_mutual_information": total - data, "beam_epkl": cross - data,
          "beam_reverse_mutual_information": cross - total}
