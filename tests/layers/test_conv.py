"""Bayesian convolutions: moments and covariances, KL, gradients, the swap, sharding.

Moments as in ``test_estimator_moments``: with N draws the empirical mean of
every output must lie within Z standard errors of ``conv(x, loc) + b`` and
its variance within ``Z * sqrt(2 / (N - 1))`` of ``conv(x * x, stddev^2) +
stddev_b^2`` (3.2% at N = 40,000, Z = 4.5). The covariances are exact too:
the output is linear in the kernel, ``y = J w`` (``J`` the convolution's
Jacobian), so a shared kernel sample gives ``Cov(y_a, y_b) = sum_w J_aw J_bw
stddev_w^2`` (+ the bias variance for one feature). Two positions of one
example must have that covariance under reparameterization and Flipout (one
kernel per example) and none under local reparameterization.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from meshbayes import layers
from meshbayes.layers import conv, estimators
from tests.layers.fixtures import (
  Z,
  assert_moments,
  bayesian_classes,
  boxed,
  correlation,
  expected_bayesian,
  f64,
  randomize_posterior,
  shapes_and_specs,
  sharded_grads_equal_unsharded,
  stddev,
)

CLASSES = bayesian_classes(layers.conv_class)
NUM_SAMPLES = 40_000

# (layer attributes, input shape, two positions of example 0 with overlapping windows)
GEOMETRIES = {
    "2d_same": (dict(features=4, kernel_size=(3, 3)), (2, 5, 5, 3), ((2, 2), (2, 3))),
    "1d_strided_dilated_grouped": (
        dict(features=4, kernel_size=3, strides=2, kernel_dilation=2, padding="VALID",
             feature_group_count=2), (2, 11, 4), ((1,), (2,))),
}


def draw(layer, params, x, num_samples=NUM_SAMPLES, seed=1):
  apply = lambda k: layer.apply({"params": params}, x, rngs={"sample": k})
  return f64(jax.jit(jax.vmap(apply))(jax.random.split(jax.random.key(seed), num_samples)))


def kernel_jacobian(params, x, **attributes):
  """``J``: d outputs / d kernel of the deterministic twin, as a (outputs, weights) matrix."""
  twin = nn.Conv(**attributes, use_bias=False)
  outputs = lambda kernel: twin.apply({"params": {"kernel": kernel}}, x)
  jacobian = jax.jacfwd(outputs)(params["kernel_loc"])
  out_shape = jacobian.shape[:x.ndim]
  return f64(jacobian).reshape(math.prod(out_shape), -1), out_shape


@pytest.mark.parametrize("cls_name, geometry", [(c, "2d_same") for c in CLASSES] + [
    ("ConvFlipout", "1d_strided_dilated_grouped")])  # a group's signs: one kernel per example
def test_conv_moments_and_covariance_of_two_positions(cls_name, geometry):
  attributes, shape, (p, q) = GEOMETRIES[geometry]
  layer = getattr(conv, cls_name)(**attributes, bayesian_bias=True)
  # Positive inputs: neighbouring windows overlap in large products, a large covariance.
  x = 0.5 + jnp.abs(jax.random.normal(jax.random.key(0), shape))
  params = randomize_posterior(layer.init(jax.random.key(0), x)["params"], jax.random.key(2))
  samples = draw(layer, params, x, NUM_SAMPLES)

  jacobian, out_shape = kernel_jacobian(params, x, **attributes)
  var_w, var_b = f64(stddev(params["kernel_scale"])).ravel() ** 2, f64(
      stddev(params["bias_scale"])) ** 2
  mean = (jacobian @ f64(params["kernel_loc"]).ravel()).reshape(out_shape) + f64(
      params["bias_loc"])
  cov = lambda a, b: np.einsum("fw,fw,w->f", jacobian.reshape(out_shape + (-1,))[a],
                               jacobian.reshape(out_shape + (-1,))[b], var_w) + var_b
  var = np.einsum("nw,nw,w->n", jacobian, jacobian, var_w).reshape(out_shape) + var_b
  assert_moments(samples, mean, var)

  a, b = (0,) + p, (0,) + q                       # two positions of example 0
  shared = cov(a, b) / np.sqrt(cov(a, a) * cov(b, b))
  within = correlation(samples[(slice(None),) + a], samples[(slice(None),) + b])
  other_example = correlation(samples[(slice(None),) + a], samples[(slice(None), 1) + p])
  across = cov(a, (1,) + p) / np.sqrt(cov(a, a) * cov((1,) + p, (1,) + p))
  zero = np.zeros_like(shared)
  expected_within = zero if cls_name == "ConvLocalReparameterization" else shared
  expected_across = across if cls_name == "ConvReparameterization" else zero
  print(f"{cls_name} {geometry}: correlation of two positions of one example, expected "
        f"{np.round(expected_within, 4)}, measured {np.round(within, 4)}; of two examples, "
        f"expected {np.round(expected_across, 4)}, measured {np.round(other_example, 4)}")
  # Standard error of a sample correlation: (1 - rho^2) / sqrt(N) for Gaussian pairs
  # (pairs of one example are Gaussian under all three), at most 1 / sqrt(N) otherwise.
  bound = Z / math.sqrt(NUM_SAMPLES)
  assert np.all(np.abs(within - expected_within) < bound * (1 - expected_within ** 2)), within
  assert np.all(np.abs(other_example - expected_across) < bound), other_example
  # The shared-kernel correlation is far from 0: positions decorrelated by per-position
  # signs (or local reparameterization) cannot pass for reparameterization and Flipout.
  assert shared.min() > 20 * bound, shared


def test_per_position_flipout_signs_would_fail_the_covariance_test():
  """Dense Flipout's per-position signs on a convolution: right variance, wrong covariance."""
  attributes, shape, (p, q) = GEOMETRIES["2d_same"]
  layer = conv.ConvFlipout(**attributes)
  x = 0.5 + jnp.abs(jax.random.normal(jax.random.key(0), shape))
  params = randomize_posterior(layer.init(jax.random.key(0), x)["params"], jax.random.key(2))
  kernel = estimators.Normal(params["kernel_loc"], stddev(params["kernel_scale"]))
  contract = lambda inputs, w, **kw: nn.Conv(**attributes, use_bias=False).apply(
      {"params": {"kernel": w}}, inputs)
  per_position = lambda key: estimators.flipout(key, contract, x, kernel)
  samples = f64(jax.jit(jax.vmap(per_position))(jax.random.split(jax.random.key(1), 4_000)))
  within = correlation(samples[(slice(None), 0) + p], samples[(slice(None), 0) + q])
  # Decorrelated (the shared-kernel correlation is above 0.5 here): not one kernel per example.
  assert np.abs(within).max() < Z / math.sqrt(4_000), within


class CNN(nn.Module):
  """Two convolutions with flax-style boxed axes, channels split over `mlp`, then `embed`."""

  conv: type

  @nn.compact
  def __call__(self, x):
    lecun, zeros = nn.initializers.lecun_normal(), nn.initializers.zeros_init()
    x = self.conv(8, (3, 3), kernel_init=boxed(lecun, None, None, "embed", "mlp"),
                  bias_init=boxed(zeros, "mlp"), name="conv_0")(x)
    x = nn.with_logical_constraint(nn.relu(x), ("batch", None, None, "mlp"))
    return self.conv(8, (3, 3), strides=2, kernel_init=boxed(lecun, None, None, "mlp", "embed"),
                     bias_init=boxed(zeros, "embed"), name="conv_1")(x)


@pytest.mark.parametrize("cls_name", CLASSES)
def test_swap_conv_for_bayesian_conv(cls_name):
  x = jnp.ones((2, 6, 6, 3))
  deterministic = shapes_and_specs(CNN(nn.Conv), x)
  bayesian = shapes_and_specs(CNN(getattr(conv, cls_name)), x)
  assert bayesian == expected_bayesian(deterministic)
  assert bayesian[("conv_1", "kernel_scale")] == ((3, 3, 8, 8), P(None, None, "mlp", "embed"))
  # T5X-style axes give the same boxes as the boxed initializer.
  layer = getattr(conv, cls_name)(8, (3, 3), kernel_axes=(None, None, "embed", "mlp"),
                                  bias_axes=("mlp",))
  assert shapes_and_specs(layer, x) == {
      k[1:]: v for k, v in bayesian.items() if k[0] == "conv_0"}


# nn.Conv's geometries: (attributes, input shape)
TWIN_GEOMETRIES = [
    (dict(features=6, kernel_size=(3, 2), strides=2, padding="VALID", feature_group_count=3),
     (2, 7, 6, 3)),
    (dict(features=4, kernel_size=3, padding="CAUSAL", kernel_dilation=2), (2, 3, 9, 3)),
    (dict(features=2, kernel_size=(2, 3, 2), padding="CIRCULAR"), (4, 5, 3, 2)),  # no batch
    (dict(features=3, kernel_size=(3, 3), input_dilation=2, padding=((1, 2), (0, 1))),
     (2, 4, 4, 2)),
]


@pytest.mark.parametrize("attributes, shape", TWIN_GEOMETRIES)
def test_posterior_mean_equals_nn_conv(attributes, shape):
  # One code path serves every estimator's posterior mean: all of them on one geometry.
  names = ("Conv",) + (CLASSES if attributes is TWIN_GEOMETRIES[0][0] else ("ConvFlipout",))
  x = jax.random.normal(jax.random.key(0), shape)
  twin = nn.Conv(**attributes)
  twin_shapes = jax.tree.map(jnp.shape, twin.init(jax.random.key(0), x)["params"])
  for cls in (getattr(conv, name) for name in names):
    layer = cls(**attributes, deterministic=True)
    params = randomize_posterior(layer.init(jax.random.key(0), x)["params"], jax.random.key(1))
    kernel = params["kernel" if cls is conv.Conv else "kernel_loc"]
    assert kernel.shape == twin_shapes["kernel"] and params["bias"].shape == twin_shapes["bias"]
    np.testing.assert_array_equal(
        jax.jit(layer.apply)({"params": params}, x, rngs={"sample": jax.random.key(2)}),
        jax.jit(twin.apply)({"params": {"kernel": kernel, "bias": params["bias"]}}, x),
        err_msg=cls.__name__)


def test_records_closed_form_kl_for_normal_prior():
  prior = layers.NormalPrior(loc=0.3, stddev=0.7)
  layer = conv.ConvFlipout(features=4, kernel_size=(3, 3), bayesian_bias=True, prior=prior)
  x = jnp.ones((2, 5, 5, 3))
  params = randomize_posterior(layer.init(jax.random.key(0), x)["params"], jax.random.key(1))
  expected = 0.0
  for name in ("kernel", "bias"):
    q_loc, q_sd = f64(params[f"{name}_loc"]), f64(stddev(params[f"{name}_scale"]))
    expected += np.sum(np.log(0.7 / q_sd) + (q_sd ** 2 + (q_loc - 0.3) ** 2) / (2 * 0.49) - 0.5)
  for kwargs in ({"rngs": {"sample": jax.random.key(2)}}, {"deterministic": True}):
    apply = jax.jit(lambda p: layer.apply({"params": p}, x, mutable=[layers.KL_COLLECTION],
                                          **kwargs)[1])
    np.testing.assert_allclose(layers.total_kl(apply(params)), expected, rtol=1e-5)


@pytest.mark.parametrize("cls_name", CLASSES)
def test_gradients_reach_every_variational_parameter(cls_name):
  layer = getattr(conv, cls_name)(features=3, kernel_size=(3, 3), bayesian_bias=True)
  x = jax.random.normal(jax.random.key(0), (2, 5, 5, 2))
  params = randomize_posterior(layer.init(jax.random.key(0), x)["params"], jax.random.key(2))

  def loss(params):
    y, state = layer.apply({"params": params}, x, rngs={"sample": jax.random.key(1)},
                           mutable=[layers.KL_COLLECTION])
    return jnp.mean(jnp.square(y - 1.0)) + layers.total_kl(state) / 1000.0

  grads = jax.jit(jax.grad(loss))(params)
  assert set(grads) == {"kernel_loc", "kernel_scale", "bias_loc", "bias_scale"}
  for name, g in grads.items():
    assert bool(jnp.all(jnp.isfinite(g))), name
    assert float(jnp.max(jnp.abs(g))) > 0, f"no gradient reaches {name}"


@pytest.mark.parametrize("cls_name", CLASSES)
def test_bfloat16_compute_with_float32_parameters(cls_name):
  layer = getattr(conv, cls_name)(features=4, kernel_size=(3, 3))
  x = jax.random.normal(jax.random.key(0), (8, 6, 6, 3))
  params = randomize_posterior(layer.init(jax.random.key(0), x)["params"], jax.random.key(1),
                               stddev_range=(0.05, 0.2))
  key = jax.random.key(3)
  out32 = layer.apply({"params": params}, x, rngs={"sample": key})
  out16 = layer.clone(dtype=jnp.bfloat16).apply({"params": params}, x, rngs={"sample": key})
  assert out16.dtype == jnp.bfloat16 and params["kernel_loc"].dtype == jnp.float32
  rel = jnp.linalg.norm(out16.astype(jnp.float32) - out32) / jnp.linalg.norm(out32)
  assert float(rel) < 1e-2, float(rel)


@pytest.mark.slow  # compiles for 2x4 (15-20 s); the variational dropout twin stays in make test
def test_sharded_forward_backward_equals_unsharded():
  """Flipout (activation-shaped signs) and reparameterization (kernel-shaped noise, drawn
  shard by shard) on a 2x4 (data, model) mesh, fsdp_tp rules. Local reparameterization
  draws activation-shaped noise as for Dense layers."""

  class Mixed(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.relu(conv.ConvFlipout(8, (3, 3), kernel_axes=(None, None, "embed", "mlp"),
                                   bayesian_bias=True, bias_axes=("mlp",))(x))
      x = nn.with_logical_constraint(x, ("batch", None, None, "mlp"))
      x = conv.ConvReparameterization(4, (3, 3), strides=2,
                                      kernel_axes=(None, None, "mlp", "vocab"),
                                      bias_axes=("vocab",))(x)
      return x.mean(axis=(1, 2))

  model = Mixed()
  x = jax.random.normal(jax.random.key(0), (8, 8, 8, 4))
  y = jax.random.randint(jax.random.key(1), (8,), 0, 4)

  grads, shardings = sharded_grads_equal_unsharded(model, x, y)
  kernel = grads["ConvFlipout_0"]["kernel_scale"]
  assert kernel.sharding == shardings["ConvFlipout_0"]["kernel_scale"]
  assert kernel.sharding.spec == P(None, None, "data", "model")


@pytest.mark.parametrize("make, match", [
    (lambda: conv.ConvFlipout(4, (3, 3), feature_group_count=2),
     r"ConvFlipout None: feature_group_count=2 must be a positive int dividing both the 3 "
     r"input features and features=4"),
    (lambda: conv.ConvReparameterization(4, (3, 3), strides=(1, 2, 1)),
     r"strides=\(1, 2, 1\) must be a positive int or 2 positive ints"),
    (lambda: conv.Conv(4, (3, 3), padding="CAUSAL"), r"padding='CAUSAL' is only defined for 1-D"),
    (lambda: conv.ConvLocalReparameterization(4, (3, 3, 3, 3, 3)),
     r"inputs of shape \(2, 5, 5, 3\) have fewer than the 6 dimensions \(spatial..., features\)"),
])
def test_bad_geometry_is_one_clear_line(make, match):
  with pytest.raises(ValueError, match=match) as info:
    make().init(jax.random.key(0), jnp.ones((2, 5, 5, 3)))
  assert "\n" not in str(info.value)


def test_conv_class_by_estimator_name():
  assert [conv.conv_class(e).__name__ for e in layers.ESTIMATORS] == [
      "Conv", "ConvReparameterization", "ConvFlipout", "ConvLocalReparameterization"]
  with pytest.raises(ValueError, match="estimator='mc_dropout' is not one of deterministic"):
    conv.conv_class("mc_dropout")
