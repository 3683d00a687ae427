"""Monte Carlo predictive averaging and its uncertainty split, against brute force."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes import predictive


def brute_force(probs):
  """probs: [S, N, C] as numpy; returns (average, total entropy, mutual information)."""
  average = probs.mean(0)
  total = -np.sum(average * np.log(average), -1)
  aleatoric = np.mean(-np.sum(probs * np.log(probs), -1), 0)
  return average, total, total - aleatoric


def test_model_average_entropy_and_mutual_information():
  rng = np.random.default_rng(0)
  probs = rng.dirichlet(np.ones(5), size=(7, 3))  # 7 samples, 3 inputs, 5 classes
  log_probs = jnp.log(jnp.asarray(probs, jnp.float32))
  average, total, mutual_information = brute_force(probs)
  np.testing.assert_allclose(jnp.exp(predictive.model_average(log_probs)), average, rtol=1e-5)
  np.testing.assert_allclose(predictive.entropy(predictive.model_average(log_probs)), total,
                             rtol=1e-5)
  np.testing.assert_allclose(predictive.mutual_information(log_probs), mutual_information,
                             rtol=1e-4, atol=1e-6)
  assert bool(jnp.all(predictive.mutual_information(log_probs) > 0))


def test_mutual_information_vanishes_when_samples_agree():
  log_probs = jnp.log(jnp.broadcast_to(jnp.array([0.2, 0.3, 0.5]), (4, 2, 3)))
  np.testing.assert_allclose(predictive.mutual_information(log_probs), 0.0, atol=1e-6)
  np.testing.assert_allclose(predictive.entropy(log_probs[0, 0]),
                             -sum(p * math.log(p) for p in (0.2, 0.3, 0.5)), rtol=1e-6)


def test_sample_outputs_draws_independent_samples():
  samples = predictive.sample_outputs(lambda k: jax.random.normal(k, (2,)), jax.random.key(0),
                                      num_samples=4000)
  assert samples.shape == (4000, 2)
  np.testing.assert_allclose(samples.mean(0), 0.0, atol=4.5 / math.sqrt(4000))
  np.testing.assert_allclose(samples.std(0), 1.0, rtol=0.05)
  with pytest.raises(ValueError, match="num_samples=0 must be >= 1"):
    predictive.sample_outputs(lambda k: k, jax.random.key(0), 0)


def test_streaming_model_average_equals_stacked_samples():
  """One sample at a time gives the stacked samples' average and mutual information."""
  fn = lambda key: jax.nn.log_softmax(3 * jax.random.normal(key, (2, 3, 7)))
  keys = jax.random.split(jax.random.key(0), 5)
  stacked = jax.vmap(fn)(keys)
  average, mutual_information = predictive.streaming_model_average(fn, keys)
  np.testing.assert_allclose(average, predictive.model_average(stacked), atol=1e-5)
  np.testing.assert_allclose(mutual_information, predictive.mutual_information(stacked),
                             atol=1e-5)
