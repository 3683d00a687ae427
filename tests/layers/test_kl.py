"""KL divergences against closed forms and quadrature, and how layers record them."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes import layers
from tests.layers.fixtures import randomize_posterior, stddev


def reference_normal_kl(q_loc, q_sd, p_loc, p_sd):
  q_loc, q_sd = np.asarray(q_loc, np.float64), np.asarray(q_sd, np.float64)
  return np.sum(np.log(p_sd / q_sd) + (q_sd ** 2 + (q_loc - p_loc) ** 2) / (2 * p_sd ** 2) - 0.5)


def test_normal_kl_known_values_and_monte_carlo():
  assert float(layers.normal_kl(1.0, 1.0, 0.0, 1.0)) == pytest.approx(0.5)
  assert float(layers.normal_kl(0.0, 2.0, 0.0, 1.0)) == pytest.approx(1.5 - math.log(2.0))
  rng = np.random.default_rng(0)
  for q_loc, q_sd, p_loc, p_sd in [(0.3, 0.5, -0.2, 1.3), (-1.0, 2.0, 0.5, 0.8)]:
    w = q_loc + q_sd * rng.standard_normal(1_000_000)
    log_ratio = (-np.log(q_sd) - 0.5 * ((w - q_loc) / q_sd) ** 2
                 + np.log(p_sd) + 0.5 * ((w - p_loc) / p_sd) ** 2)
    standard_error = log_ratio.std() / math.sqrt(w.size)
    assert abs(float(layers.normal_kl(q_loc, q_sd, p_loc, p_sd)) - log_ratio.mean()) < (
        4 * standard_error)


def recorded_kl(layer, params, x, **kwargs):
  _, state = layer.apply({"params": params}, x, mutable=[layers.KL_COLLECTION], **kwargs)
  return layers.total_kl(state)


def test_layer_records_closed_form_kl_for_normal_prior():
  prior = layers.NormalPrior(loc=0.3, stddev=0.7)
  layer = layers.DenseFlipout(features=5, bayesian_bias=True, prior=prior)
  x = jnp.ones((2, 4))
  params = randomize_posterior(layer.init(jax.random.key(0), x)["params"], jax.random.key(1))
  expected = (reference_normal_kl(params["kernel_loc"], stddev(params["kernel_scale"]), 0.3, 0.7)
              + reference_normal_kl(params["bias_loc"], stddev(params["bias_scale"]), 0.3, 0.7))
  sampled = recorded_kl(layer, params, x, rngs={"sample": jax.random.key(2)})
  mean_only = recorded_kl(layer, params, x, deterministic=True)
  np.testing.assert_allclose(sampled, expected, rtol=1e-5)
  np.testing.assert_allclose(mean_only, expected, rtol=1e-5)


def mixture_kl_by_quadrature(loc, sd, prior):
  """Sum over elements of KL(q || mixture), each a 1-D Gauss-Hermite integral."""
  nodes, weights = np.polynomial.hermite.hermgauss(200)
  loc, sd = np.asarray(loc, np.float64)[..., None], np.asarray(sd, np.float64)[..., None]
  w = loc + math.sqrt(2.0) * sd * nodes
  log_p = np.logaddexp(
      math.log(prior.mix) - 0.5 * (w / prior.stddev1) ** 2 - math.log(prior.stddev1),
      math.log1p(-prior.mix) - 0.5 * (w / prior.stddev2) ** 2 - math.log(prior.stddev2),
  ) - 0.5 * math.log(2 * math.pi)
  cross_entropy = -np.sum(weights * log_p, axis=-1) / math.sqrt(math.pi)
  entropy = np.log(sd[..., 0]) + 0.5 * math.log(2 * math.pi * math.e)
  return float(np.sum(cross_entropy - entropy))


def test_scale_mixture_kl_monte_carlo_matches_quadrature():
  prior = layers.ScaleMixtureNormalPrior(mix=0.25, stddev1=1.0, stddev2=math.exp(-6))
  layer = layers.DenseReparameterization(features=32, use_bias=False, prior=prior)
  x = jnp.ones((1, 32))
  params = layer.init(jax.random.key(0), x)["params"]
  expected = mixture_kl_by_quadrature(params["kernel_loc"], stddev(params["kernel_scale"]),
                                      prior)
  estimates = np.array([
      recorded_kl(layer, params, x, rngs={"sample": jax.random.key(seed)}) for seed in range(50)
  ])
  standard_error = estimates.std(ddof=1) / math.sqrt(len(estimates))
  assert abs(estimates.mean() - expected) < 4 * standard_error + 1e-4 * abs(expected)
  # A single estimate over 1,024 weights is already within a few percent of the truth.
  assert np.abs(estimates / expected - 1).max() < 0.03


def test_trainable_prior_kl_and_its_optimum():
  layer = layers.DenseLocalReparameterization(features=6, use_bias=False,
                                              prior=layers.TrainableNormalPrior())
  x = jnp.ones((1, 5))
  params = randomize_posterior(layer.init(jax.random.key(0), x)["params"], jax.random.key(1))
  loc, sd = np.asarray(params["kernel_loc"], np.float64), np.asarray(
      stddev(params["kernel_scale"]), np.float64)
  # The KL-minimizing scalar prior: mean of the means, and the mean second moment about it.
  best_loc = loc.mean()
  best_sd = math.sqrt(np.mean(sd ** 2 + (loc - best_loc) ** 2))
  params = dict(params, kernel_prior_loc=jnp.float32(best_loc),
                kernel_prior_scale=layers.softplus_inverse(jnp.float32(best_sd)))
  np.testing.assert_allclose(recorded_kl(layer, params, x, deterministic=True),
                             reference_normal_kl(loc, sd, best_loc, best_sd), rtol=1e-5)
  grads = jax.grad(lambda p: recorded_kl(layer, p, x, deterministic=True))(params)
  assert abs(float(grads["kernel_prior_loc"])) < 1e-4
  assert abs(float(grads["kernel_prior_scale"])) < 1e-4
  assert float(jnp.max(jnp.abs(grads["kernel_loc"]))) > 0


def test_trainable_prior_initializes_and_records_its_kl_under_jit():
  layer = layers.DenseFlipout(features=3, prior=layers.TrainableNormalPrior(init_stddev=0.5))
  x = jnp.ones((2, 4))
  variables = nn.unbox(jax.jit(lambda k: layer.init(k, x))(jax.random.key(0)))
  np.testing.assert_allclose(jax.nn.softplus(variables["params"]["kernel_prior_scale"]), 0.5,
                             rtol=1e-6)
  kl = jax.jit(lambda p: recorded_kl(layer, p, x, deterministic=True))(variables["params"])
  assert np.isfinite(kl) and kl > 0


def test_a_trainable_prior_is_a_point_estimate_neither_sampled_nor_counted_as_weights():
  layer = layers.DenseFlipout(features=3, prior=layers.TrainableNormalPrior(init_stddev=0.5))
  params = nn.unbox(layer.init(jax.random.key(0), jnp.ones((2, 4)))["params"])
  sample = layers.sample_weights(params, jax.random.key(1))
  for name in ("kernel_prior_loc", "kernel_prior_scale", "kernel_scale"):
    np.testing.assert_array_equal(sample[name], params[name])
  assert float(jnp.abs(sample["kernel_loc"] - params["kernel_loc"]).max()) > 0
  counts = layers.count_parameters(params)
  # 4x3 kernel and 3 biases (Flipout's bias is a point weight), 2 prior scalars.
  assert (counts.bayesian_weights, counts.point_weights, counts.total) == (12, 3, 29)


class TwoLayers(nn.Module):
  @nn.compact
  def __call__(self, x):
    first = layers.DenseFlipout(4, name="first")
    x = first(first(x))  # called twice: its KL must count once
    return layers.DenseLocalReparameterization(3, name="second")(x)


def test_total_kl_sums_layers_and_counts_each_layer_once():
  model = TwoLayers()
  x = jnp.ones((2, 4))
  variables = model.init(jax.random.key(0), x)
  _, state = model.apply({"params": variables["params"]}, x, rngs={"sample": jax.random.key(1)},
                         mutable=[layers.KL_COLLECTION])
  per_layer = [reference_normal_kl(p["kernel_loc"], stddev(p["kernel_scale"]), 0.0, 1.0)
               for p in (variables["params"]["first"], variables["params"]["second"])]
  np.testing.assert_allclose(layers.total_kl(state), sum(per_layer), rtol=1e-5)
  assert set(state[layers.KL_COLLECTION]) == {"first", "second"}


class ForbiddenPrior(layers.NormalPrior):
  def kl(self, *args):
    raise AssertionError("KL computed although the losses collection is not mutable")


def test_kl_is_not_computed_unless_collected():
  layer = layers.DenseFlipout(4, prior=ForbiddenPrior())
  x = jnp.ones((2, 4))
  params = layers.DenseFlipout(4).init(jax.random.key(0), x)["params"]
  layer.apply({"params": params}, x, rngs={"sample": jax.random.key(1)})
  with pytest.raises(AssertionError, match="not mutable"):
    recorded_kl(layer, params, x, deterministic=True)
  assert float(layers.total_kl({})) == 0.0


def test_total_kl_of_scanned_layers():
  class Block(nn.Module):
    @nn.compact
    def __call__(self, x, _):
      return layers.DenseFlipout(4)(x), None

  stack = nn.scan(Block, variable_axes={"params": 0, layers.KL_COLLECTION: 0},
                  split_rngs={"params": True, "sample": True}, length=3)
  x = jnp.ones((2, 4))
  variables = stack().init(jax.random.key(0), x, None)
  _, state = stack().apply({"params": variables["params"]}, x, None,
                           rngs={"sample": jax.random.key(1)}, mutable=[layers.KL_COLLECTION])
  p = variables["params"]["DenseFlipout_0"]
  assert p["kernel_loc"].shape == (3, 4, 4)
  np.testing.assert_allclose(layers.total_kl(state),
                             reference_normal_kl(p["kernel_loc"], stddev(p["kernel_scale"]), 0, 1),
                             rtol=1e-5)


def test_kl_penalty_scaling_and_errors():
  assert float(layers.kl_penalty(50.0, num_train_units=200, kl_weight=0.5)) == pytest.approx(0.125)
  with pytest.raises(ValueError, match="num_train_units=0"):
    layers.kl_penalty(1.0, num_train_units=0)


@pytest.mark.parametrize("make, fan_in, weights", [
    (lambda prior: layers.DenseFlipout(features=5, bayesian_bias=True, prior=prior), 4,
     ("kernel", "bias")),
    (lambda prior: layers.DenseGeneralLocalReparameterization(
        features=(2, 3), axis=(-2, -1), use_bias=False, prior=prior), 12, ("kernel",)),
    (lambda prior: layers.ConvReparameterization(features=3, kernel_size=(3,), use_bias=False,
                                                 prior=prior), 12, ("kernel",)),
])
def test_a_fan_in_scaled_prior_has_stddev_scale_over_sqrt_fan_in_of_each_tensor(make, fan_in,
                                                                               weights):
  layer = make(layers.NormalPrior(stddev=2.0, fan_in_scaled=True))
  x = jnp.ones((2, 5, 4)) if "Conv" in type(layer).__name__ else jnp.ones((2, 4, 3))
  x = jnp.ones((2, 4)) if isinstance(layer, layers.DenseFlipout) else x
  params = randomize_posterior(layer.init(jax.random.key(0), x)["params"], jax.random.key(1))
  # The bias has fan-in 1: its prior is the unscaled N(0, 2^2).
  expected = sum(reference_normal_kl(params[f"{w}_loc"], stddev(params[f"{w}_scale"]), 0.0,
                                     2.0 / math.sqrt(fan_in if w == "kernel" else 1))
                 for w in weights)
  np.testing.assert_allclose(recorded_kl(layer, params, x, deterministic=True), expected,
                             rtol=1e-5)


def test_fan_in_scaled_priors_resolve_per_tensor_and_refuse_a_kl_without_one():
  assert layers.NormalPrior(fan_in_scaled=True).for_fan_in(25).stddev == pytest.approx(0.2)
  trainable = layers.TrainableNormalPrior(init_stddev=3.0, fan_in_scaled=True).for_fan_in(9)
  assert trainable.init_stddev == pytest.approx(1.0) and not trainable.fan_in_scaled
  assert layers.NormalPrior(stddev=0.5).for_fan_in(100).stddev == 0.5
  with pytest.raises(ValueError, match=r"fan_in_scaled=True\) has no fan-in yet: call for_fan_in"):
    layers.NormalPrior(fan_in_scaled=True).kl(jnp.zeros(2), jnp.ones(2), {}, None)
  embed = layers.EmbedFlipout(num_embeddings=7, features=16,
                              prior=layers.NormalPrior(fan_in_scaled=True))
  ids = jnp.zeros((1,), jnp.int32)
  params = randomize_posterior(embed.init(jax.random.key(0), ids)["params"], jax.random.key(1))
  # An embedding's fan-in is its width, as its initializer's.
  expected = reference_normal_kl(params["embedding_loc"], stddev(params["embedding_scale"]),
                                 0.0, 0.25)
  np.testing.assert_allclose(recorded_kl(embed, params, ids, deterministic=True), expected,
                             rtol=1e-5)
