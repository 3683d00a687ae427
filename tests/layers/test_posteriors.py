"""The posterior protocol: every kind answers a predictive's five questions alike, and no
code outside the registry switches on the kind."""

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes.layers import (
  Ensemble,
  LayerWeights,
  MCDropout,
  WeightPosterior,
  as_posterior,
  posterior_mean,
  sample_axes,
  sample_weights,
)
from meshbayes.layers import posteriors

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYER_PARAMS = {"dense": {"kernel_loc": jnp.array([1.0, -2.0]),
                          "kernel_scale": jnp.array([0.0, 1.0]), "bias": jnp.array([0.5])}}


def test_a_parameter_tree_is_layer_weights_and_the_kinds_are_themselves():
  assert isinstance(as_posterior(LAYER_PARAMS), LayerWeights)
  for kind in (WeightPosterior({"w": jnp.zeros(2)}, {"w": jnp.ones(2)}),
               Ensemble.stack([{"w": jnp.zeros(2)}] * 3), MCDropout({"w": jnp.zeros(2)})):
    assert as_posterior(kind) is kind
  assert {LayerWeights, WeightPosterior, Ensemble, MCDropout} <= set(posteriors.kinds())


def test_layer_weights_sample_has_the_layers_moments_and_keeps_the_rest():
  keys = jax.random.split(jax.random.key(0), 20_000)
  posterior = as_posterior(LAYER_PARAMS)
  samples = posterior.stacked(keys)
  kernel = np.asarray(samples["dense"]["kernel_loc"])
  assert kernel.shape == (20_000, 2)
  stddev = np.log1p(np.exp([0.0, 1.0]))  # softplus
  assert np.all(np.abs(kernel.mean(0) - [1.0, -2.0]) < 4 * stddev / np.sqrt(20_000))
  np.testing.assert_allclose(kernel.std(0), stddev, rtol=0.03)
  # What does not differ between members is not stacked.
  assert samples["dense"]["bias"].shape == (1,)
  assert posterior.sampled_axes() == {"dense": {"bias": None, "kernel_loc": 0,
                                                "kernel_scale": None}}
  assert posterior.num_members(5) == 5 and not posterior.external and posterior.has_mean
  assert posterior_mean(LAYER_PARAMS) is LAYER_PARAMS


def test_weight_posterior_sample_moments_and_keys():
  posterior = WeightPosterior({"w": jnp.array([3.0, 0.0])}, {"w": jnp.array([0.5, 2.0])})
  samples = np.asarray(posterior.stacked(jax.random.split(jax.random.key(1), 20_000))["w"])
  np.testing.assert_allclose(samples.mean(0), [3.0, 0.0], atol=4 * 2.0 / np.sqrt(20_000))
  np.testing.assert_allclose(samples.std(0), [0.5, 2.0], rtol=0.03)
  assert posterior.member_keys(jax.random.key(0), 4).shape == (4,)
  with pytest.raises(ValueError, match="^num_samples=4 posterior samples need an rng$"):
    posterior.member_keys(None, 4)
  assert posterior.external and posterior.apply_options(jax.random.key(0)) == {}


def test_an_ensemble_is_each_member_once_and_has_no_mean():
  members = [{"w": jnp.full(2, float(i))} for i in range(3)]
  ensemble = Ensemble.stack(members)
  keys = ensemble.member_keys(None, 8)  # every member, whatever S
  np.testing.assert_array_equal(keys, [0, 1, 2])
  assert ensemble.num_members(8) == 3 and not ensemble.has_mean
  assert ensemble.stacked(keys) is ensemble.members
  np.testing.assert_array_equal(sample_weights(ensemble, 2)["w"], [2.0, 2.0])
  np.testing.assert_array_equal(ensemble.stacked(jnp.array([2, 0]))["w"][:, 0], [2.0, 0.0])


def test_mc_dropout_keeps_its_weights_and_passes_its_key_to_dropout():
  params = {"w": jnp.ones(2)}
  posterior = MCDropout(params)
  key = jax.random.key(3)
  assert sample_weights(posterior, key) is params and posterior.stacked(None) is params
  assert posterior.apply_options(key) == {"enable_dropout": True, "rngs": {"dropout": key}}
  assert sample_axes(posterior) == {"w": None}


def test_a_kind_is_registered_only_with_the_whole_protocol():
  class Incomplete:
    external = True

    def sample(self, key):
      return key

  with pytest.raises(TypeError, match="^register_kind: Incomplete lacks has_mean, mean_weights, "
                                      "member_keys, num_members, apply_options, sampled_axes, "
                                      "stacked of Posterior$"):
    posteriors.register_kind(Incomplete)
  assert Incomplete not in posteriors.kinds()


def test_no_code_outside_the_registry_switches_on_the_kind_of_posterior():
  kinds = "|".join(kind.__name__ for kind in posteriors.kinds())
  switch = re.compile(rf"isinstance\([^)]*\b({kinds})\b")
  found = [f"{path.relative_to(ROOT)}:{number}"
           for folder in ("meshbayes", "models", "tools")
           for path in (ROOT / folder).rglob("*.py")
           for number, line in enumerate(path.read_text().splitlines(), 1)
           if switch.search(line)]
  assert found == []
