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
  with pytest.raises(ValueError, match="num_samples=0 must be a positive int"):
    predictive.sample_outputs(lambda k: k, jax.random.key(0), 0)


def brute_force_measures(probs):
  """Malinin and Gales' token measures by their definitions, with explicit loops."""
  num_samples = probs.shape[0]
  average = probs.mean(0)
  entropy = lambda p: -np.sum(p * np.log(p), -1)
  kl = lambda p, q: np.sum(p * (np.log(p) - np.log(q)), -1)
  return {
      "total_uncertainty": entropy(average),
      "data_uncertainty": np.mean([entropy(p) for p in probs], 0),
      "mutual_information": entropy(average) - np.mean([entropy(p) for p in probs], 0),
      "expected_pairwise_kl": np.mean([kl(probs[s], probs[t]) for s in range(num_samples)
                                       for t in range(num_samples)], 0),
      "reverse_mutual_information": np.mean([kl(average, p) for p in probs], 0)}


def test_token_measures_against_their_definitions():
  probs = np.random.default_rng(1).dirichlet(np.full(4, 0.5), size=(5, 3, 2))  # S=5, 3x2, V=4
  expected = brute_force_measures(probs)
  measures = predictive.token_measures(jnp.log(jnp.asarray(probs, jnp.float32)))
  assert set(measures) == set(predictive.TOKEN_MEASURES)
  for name in predictive.TOKEN_MEASURES:
    np.testing.assert_allclose(measures[name], expected[name], rtol=1e-4, atol=1e-6,
                               err_msg=name)
    assert np.all(np.asarray(measures[name]) > 0), name
  np.testing.assert_allclose(
      measures["expected_pairwise_kl"],
      measures["mutual_information"] + measures["reverse_mutual_information"], rtol=1e-5)


def test_streaming_token_measures_equal_stacked_samples():
  """One sample at a time gives the stacked samples' average, measures and target log-probs."""
  fn = lambda key: jax.nn.log_softmax(3 * jax.random.normal(key, (2, 3, 7)))
  keys = jax.random.split(jax.random.key(0), 5)
  targets = jnp.array([[0, 6, 2], [3, 3, 1]])
  stacked = jax.vmap(fn)(keys)
  average, measures, picked = predictive.streaming_token_measures(fn, keys, targets)
  np.testing.assert_allclose(average, predictive.model_average(stacked), atol=1e-5)
  for name, value in predictive.token_measures(stacked).items():
    np.testing.assert_allclose(measures[name], value, atol=1e-5, err_msg=name)
  np.testing.assert_allclose(measures["mutual_information"],
                             predictive.mutual_information(stacked), atol=1e-5)
  np.testing.assert_allclose(picked, jnp.take_along_axis(stacked, targets[None, ..., None],
                                                         -1)[..., 0], atol=1e-6)


def test_sequence_measures_against_their_definitions():
  """Two outputs of 3 and 1 tokens, S=3 samples' log P_s(y | x)."""
  sample_log_probs = np.array([[-2.0, -0.5], [-3.0, -0.1], [-1.0, -2.0]])
  lengths = np.array([3, 1])
  measures = predictive.sequence_measures(jnp.asarray(sample_log_probs, jnp.float32),
                                          jnp.asarray(lengths))
  total = -np.log(np.mean(np.exp(sample_log_probs), 0)) / lengths
  data = -np.mean(sample_log_probs, 0) / lengths
  np.testing.assert_allclose(measures["sequence_total_uncertainty"], total, rtol=1e-6)
  np.testing.assert_allclose(measures["sequence_data_uncertainty"], data, rtol=1e-6)
  np.testing.assert_allclose(measures["sequence_reverse_mutual_information"], data - total,
                             rtol=1e-5)
  assert np.all(data - total > 0)  # Jensen: log of a mean >= mean of logs
