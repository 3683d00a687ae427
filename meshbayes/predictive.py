"""Monte Carlo predictive averaging and the uncertainty it measures.

Inputs are ``S`` samples of log-probabilities stacked on a leading axis (weight samples,
ensemble members or dropout masks alike); the model average is ``log mean_s p_s``. The
measures are Malinin and Gales's (ICLR 2021), in nats, per token, per sequence
(length-normalized) and over a beam: definitions in docs/measures.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from meshbayes.field_checks import positive_int, positive_number
from meshbayes.metrics import measures as registry

Array = jax.Array
# The measures' names, as the registry orders them (meshbayes.metrics.measures).
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

  With ``P(y) = mean_s P_s(y | x)``, weights ``pi_b = P(y_b)^(1/T) / sum_k P(y_k)^(1/T)``
  and ``w_sb`` the same weights under each sample's ``P_s``, ``L_b`` the tokens of ``y_b``:
  ``beam_total_uncertainty = -sum_b pi_b log P(y_b) / L_b`` (the paper's ``H_S-IW``);
  ``beam_data_uncertainty = -mean_s sum_b w_sb log P_s(y_b) / L_b``;
  ``beam_mutual_information`` total minus data; ``beam_epkl`` is
  ``-sum_b pi_b mean_s log P_s(y_b) / L_b`` minus data;
  ``beam_reverse_mutual_information = sum_b pi_b (log P(y_b) - mean_s log P_s(y_b)) / L_b``
  (``M_S-IW``). With the whole support as the beam and ``T = 1`` each is its exact
  definition; with ``B = 1`` they reduce to ``sequence_measures`` (docs/measures.md).

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
