"""MOPED: starting a Bayesian model from a deterministic model's weights."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes import layers
from tests.layers.fixtures import MLP


def test_moped_means_equal_the_weights_and_stddevs_scale_with_them():
  x = jax.random.normal(jax.random.key(0), (3, 8))
  deterministic = MLP(nn.Dense).init(jax.random.key(1), x)["params"]
  bayesian = MLP(layers.DenseFlipout).init(jax.random.key(2), x)["params"]

  params = layers.moped_params(bayesian, deterministic, delta=0.1)

  for layer in ("hidden", "out"):
    w = nn.unbox(deterministic[layer]["kernel"])
    p = nn.unbox(params[layer])
    np.testing.assert_array_equal(p["kernel_loc"], w)
    np.testing.assert_allclose(jax.nn.softplus(p["kernel_scale"]), 0.1 * jnp.abs(w),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(p["bias"], nn.unbox(deterministic[layer]["bias"]))
  # Partitioning metadata survives.
  assert nn.get_partition_spec(params) == nn.get_partition_spec(bayesian)
  # The posterior mean of the new model is the deterministic model.
  posterior_mean_model = MLP(functools.partial(layers.DenseFlipout, deterministic=True))
  np.testing.assert_array_equal(posterior_mean_model.apply({"params": params}, x),
                                MLP(nn.Dense).apply({"params": deterministic}, x))


def test_moped_floors_stddev_at_zero_weights_and_keeps_prior_params():
  bayes = {"d": {"kernel_loc": jnp.ones(3), "kernel_scale": jnp.ones(3),
                 "kernel_prior_loc": jnp.float32(0.5)}}
  params = layers.moped_params(bayes, {"d": {"kernel": jnp.array([0.0, 1.0, -2.0])}},
                               delta=0.1, min_stddev=1e-6)
  np.testing.assert_allclose(jax.nn.softplus(params["d"]["kernel_scale"]), [1e-6, 0.1, 0.2],
                             rtol=1e-4)
  assert float(params["d"]["kernel_prior_loc"]) == 0.5


def test_moped_errors_name_the_parameter():
  bayes = {"d": {"kernel_loc": jnp.ones((2, 3)), "kernel_scale": jnp.ones((2, 3))}}
  with pytest.raises(ValueError, match=r"d/kernel has shape \(3, 2\) in the deterministic "
                                       r"model but \(2, 3\) as d/kernel_loc"):
    layers.moped_params(bayes, {"d": {"kernel": jnp.ones((3, 2))}})
  with pytest.raises(ValueError, match="without a Bayesian counterpart: e/kernel"):
    layers.moped_params(bayes, {"d": {"kernel": jnp.ones((2, 3))}, "e": {"kernel": jnp.ones(1)}})
  with pytest.raises(ValueError, match="delta=0 must be a positive"):
    layers.moped_params(bayes, {"d": {"kernel": jnp.ones((2, 3))}}, delta=0)
