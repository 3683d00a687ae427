"""Gaussian process layers: the exact GP against scikit-learn, the sparse GP against the exact
one (Titsias's optimal q), random Fourier features against the kernel, KL, gradients, axes,
sharding."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from meshbayes import layers
from meshbayes.layers import gaussian_process as gpl
from meshbayes.partitioning.rules import logical_to_mesh_spec, resolve_rules
from tests.layers.fixtures import sharded_grads_equal_unsharded

AMPLITUDE, LENGTHSCALE, NOISE = 1.3, 0.9, 0.05


def _data(num_train=30, num_test=15, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.uniform(-3, 3, (num_train, 2))
  y = np.stack([np.sin(x[:, 0]) + 0.1 * rng.normal(size=num_train), x[:, 1] ** 2 / 5], -1)
  return x, y, rng.uniform(-4, 4, (num_test, 2))


def _sklearn(x, y, noisy):
  signal = ConstantKernel(AMPLITUDE ** 2, "fixed") * RBF(LENGTHSCALE, "fixed")
  if noisy:  # WhiteKernel: the predictive variance includes the noise (of y)
    model = GaussianProcessRegressor(signal + WhiteKernel(NOISE, "fixed"), alpha=0.0,
                                     optimizer=None)
  else:  # alpha: the noise enters the fit only; the predictive is of f
    model = GaussianProcessRegressor(signal, alpha=NOISE, optimizer=None)
  return model.fit(x, y)


def _exact_gp(dtype, **kwargs):
  return gpl.GaussianProcess(units=2, amplitude_init=AMPLITUDE, lengthscale_init=LENGTHSCALE,
                             noise_variance_init=NOISE, param_dtype=dtype, **kwargs)


def _moments(module, variables, *args):
  return jax.jit(lambda v, *a: (lambda d: (d.mean(), d.variance()))(module.apply(v, *a)))(
      variables, *args)


def test_exact_gp_equals_sklearn_in_float64_and_float32():
  x, y, x_test = _data()
  errors = {}
  with jax.enable_x64(True):
    for noisy in (True, False):
      gp = _exact_gp(jnp.float64, predict_noisy_outputs=noisy, jitter=0.0)
      variables = gp.init(jax.random.key(0), x_test, x, y)
      mean, variance = _moments(gp, variables, x_test, x, y)
      ref_mean, ref_std = _sklearn(x, y, noisy).predict(x_test, return_std=True)
      assert mean.shape == (2, 15) and mean.dtype == jnp.float64
      errors[noisy] = (np.abs(mean.T - ref_mean).max(), np.abs(variance.T - ref_std ** 2).max())
      assert errors[noisy][0] < 1e-5 and errors[noisy][1] < 1e-5, errors
    # The prior's log_prob of the outputs is the log marginal likelihood (with the noise).
    prior = gp.clone(predict_noisy_outputs=True).apply(variables, x)
    lml = float(jnp.sum(prior.log_prob(y.T)))
    assert lml == pytest.approx(_sklearn(x, y, True).log_marginal_likelihood_value_, abs=1e-8)
  # float64: 2.1e-15 (mean) and 2.3e-15 (variance) measured. float32 with the default jitter
  # (1e-6): 3.2e-6 and 7.2e-6.
  gp = _exact_gp(jnp.float32, predict_noisy_outputs=True)
  variables = gp.init(jax.random.key(0), x_test, x, y)
  mean, variance = _moments(gp, variables, x_test, x, y)
  ref_mean, ref_std = _sklearn(x, y, True).predict(x_test, return_std=True)
  np.testing.assert_allclose(mean.T, ref_mean, atol=5e-5)
  np.testing.assert_allclose(variance.T, ref_std ** 2, atol=5e-5)


def test_exact_gp_mean_function_shifts_the_zero_mean_posterior():
  x, y, x_test = _data()
  slope = jnp.array([0.5, -1.0])
  with_mean = _exact_gp(jnp.float32, mean_fn=lambda t: t @ slope)  # (N,): every unit
  zero_mean = _exact_gp(jnp.float32)
  variables = zero_mean.init(jax.random.key(0), x_test, x, y)
  prior_mean = lambda t: (t @ np.asarray(slope))[:, None]
  mean, variance = _moments(with_mean, variables, x_test, x, y)
  ref_mean, ref_variance = _moments(zero_mean, variables, x_test, x, y - prior_mean(x))
  np.testing.assert_allclose(mean.T, ref_mean.T + prior_mean(x_test), atol=1e-5)
  np.testing.assert_allclose(variance, ref_variance, atol=1e-6)


def _sparse_elbo(x, y, x_test, num_inducing):
  """ELBO (closed-form expected log-likelihood minus the recorded KL) with Titsias's optimal q
  for the first ``num_inducing`` training inputs as inducing points, and the predictive at
  ``x_test``; float64."""
  layer = gpl.SparseGaussianProcess(units=2, num_inducing=num_inducing,
                                    amplitude_init=AMPLITUDE, lengthscale_init=LENGTHSCALE,
                                    jitter=1e-10, param_dtype=jnp.float64)

  @jax.jit
  def run(x, y, x_test):
    z = x[:num_inducing]
    kernel = gpl.make_kernel(jnp.float64(AMPLITUDE), jnp.float64(LENGTHSCALE))
    m, scale = layers.optimal_variational_distribution(kernel, z, x, y, NOISE, jitter=1e-10)
    params = nn.unbox(layer.init(jax.random.key(0), x)["params"])
    params.update(inducing_inputs=z, inducing_mean=m,
                  inducing_scale_tril=gpl.scale_tril_inverse(scale))
    q, state = layer.apply({"params": params}, x, mutable=[layers.KL_COLLECTION])
    expected = layers.gaussian_expected_log_likelihood(y, q.mean(), q.variance(), NOISE)
    kl = state[layers.KL_COLLECTION]["kl"]  # float64 here; total_kl sums in float32
    predictive = layer.apply({"params": params}, x_test)
    return (jnp.sum(expected) - kl, kl, layers.total_kl(state), predictive.mean(),
            predictive.variance())

  elbo, kl, total, mean, variance = run(x, y, x_test)
  assert kl.dtype == jnp.float64 and float(total) == pytest.approx(float(kl), rel=1e-6)
  return float(elbo), mean, variance


def test_sparse_gp_with_optimal_q_recovers_the_exact_gp_and_its_elbo_bounds_the_evidence():
  x, y, x_test = _data()
  with jax.enable_x64(True):
    gp = _exact_gp(jnp.float64, predict_noisy_outputs=False, jitter=0.0)
    variables = gp.init(jax.random.key(0), x_test, x, y)
    exact_mean, exact_variance = _moments(gp, variables, x_test, x, y)
    log_evidence = float(jnp.sum(gp.clone(predict_noisy_outputs=True).apply(variables, x
                                                                             ).log_prob(y.T)))
    elbos, predictives = {}, {}
    for num_inducing in (10, 20, 30):
      elbos[num_inducing], *predictives[num_inducing] = _sparse_elbo(x, y, x_test, num_inducing)
  # Z = X: q(f) is the exact posterior (1.8e-9 measured) and the bound is tight (4.7e-8).
  sparse_mean, sparse_variance = predictives[30]
  np.testing.assert_allclose(sparse_mean, exact_mean.T, atol=1e-7)
  np.testing.assert_allclose(sparse_variance, exact_variance.T, atol=1e-7)
  assert elbos[30] == pytest.approx(log_evidence, abs=1e-6)
  # Fewer inducing points: strictly below the evidence, and rising with more
  # (measured -778.6, -416.3, -149.2, -48.6 for M = 5, 10, 20, 30; evidence -48.6).
  values = [elbos[m] for m in (10, 20, 30)]
  assert all(a < b for a, b in zip(values, values[1:])), elbos
  assert values[-2] < log_evidence - 1.0


def test_random_fourier_kernel_error_shrinks_as_one_over_sqrt_features():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(50, 3)), jnp.float32)
  kernel = np.asarray(gpl.make_kernel(jnp.float32(1.2), jnp.float32(1.5)).matrix(x, x))

  def max_error(seed, size):
    w, b = gpl.fourier_frequencies(jax.random.key(seed), 3, size)
    phi = gpl.random_fourier_features(x, w, b, 1.2, 1.5)
    return jnp.max(jnp.abs(phi @ phi.T - kernel))

  sizes = (64, 1024, 16384)
  errors = [float(jnp.mean(jax.jit(jax.vmap(lambda s: max_error(s, size)))(jnp.arange(8))))
            for size in sizes]
  slope = np.polyfit(np.log(sizes), np.log(errors), 1)[0]
  # Measured: 0.476, 0.126, 0.0295 (amplitude 1.2, k(x, x) = 1.44); slope -0.501.
  assert errors[0] > errors[1] > errors[2]
  assert -0.6 < slope < -0.4, (errors, slope)


class _TwoFeatureMaps(nn.Module):
  """Two random-feature layers whose output weights' mean is the identity (units equal to
  num_features): their posterior mean functions are their feature maps phi(x)."""

  size: int

  @nn.compact
  def __call__(self, x):
    make = lambda name: layers.RandomFourierFeatures(
        units=self.size, num_features=self.size, amplitude_init=1.2, lengthscale_init=0.7,
        deterministic=True, name=name)
    return make("a")(x), make("b")(x)


def test_random_fourier_layer_features_reproduce_its_kernel():
  """phi(x) phi(x')^T of the layer approximates the kernel of its own amplitude and
  lengthscale; its frequencies are fixed, and differ between layers."""
  x = jnp.linspace(-2.0, 2.0, 9)[:, None]
  model, size = _TwoFeatureMaps(size=2048), 2048

  @jax.jit
  def features(key):
    params = nn.unbox(model.init(key, x)["params"])
    for name in ("a", "b"):
      params[name]["output"]["kernel_loc"] = jnp.eye(size)
    return model.apply({"params": params}, x)

  phi_a, phi_b = features(jax.random.key(0))
  phi = np.asarray(phi_a, np.float64)
  kernel = np.asarray(gpl.make_kernel(jnp.float32(1.2), jnp.float32(0.7)).matrix(x, x))
  # The rate test's errors give about 0.09 at D = 2048 for 50 points; measured 0.038 for 9.
  assert np.abs(phi @ phi.T - kernel).max() < 0.12
  # Fixed frequencies: another initialization key, the same features; another layer, others.
  np.testing.assert_array_equal(features(jax.random.key(1))[0], phi_a)
  assert not np.allclose(phi_a, phi_b, atol=1e-3)


def test_recorded_kl_equals_the_closed_form():
  layer = gpl.SparseGaussianProcess(units=3, num_inducing=5)
  x = jnp.ones((4, 2))

  @jax.jit
  def recorded(key):
    params = nn.unbox(layer.init(key, x)["params"])
    keys = jax.random.split(key, 2)
    params["inducing_mean"] = jax.random.normal(keys[0], (5, 3))
    params["inducing_scale_tril"] = 0.3 * jax.random.normal(keys[1], (3, 5, 5))
    return params, layer.apply({"params": params}, x, mutable=["losses"])[1]

  params, state = recorded(jax.random.key(1))
  m = np.asarray(params["inducing_mean"], np.float64)
  scale = np.asarray(gpl.scale_tril(params["inducing_scale_tril"]), np.float64)
  expected = 0.0
  for unit in range(3):
    s = scale[unit] @ scale[unit].T
    expected += 0.5 * (np.trace(s) + m[:, unit] @ m[:, unit] - 5 - np.linalg.slogdet(s)[1])
  assert float(layers.total_kl(state)) == pytest.approx(expected, rel=1e-5)
  assert expected > 1.0  # far from the prior: the check is not 0 == 0


class _Stack(nn.Module):
  """Every GP layer in one model: a deep GP (a mean function module, ARD, a sampled hidden
  layer), random Fourier features on the same hidden layer, and an exact GP."""

  @nn.compact
  def __call__(self, x, y):
    hidden = layers.SparseGaussianProcess(units=4, num_inducing=8, ard=True, scale_init=0.1,
                                          mean_fn=layers.Dense(4, kernel_axes=("embed", "mlp"),
                                                               bias_axes=("mlp",), name="mean"))(x)
    # scale_init below 1: at q(u) = N(0, I) the predictive is the prior's whatever the
    # inducing inputs, whose gradient would then be exactly 0.
    f = layers.SparseGaussianProcess(units=2, num_inducing=8, scale_init=0.5)(hidden)
    g = layers.RandomFourierFeatures(units=2, num_features=32)(hidden)
    exact = layers.GaussianProcess(units=2, ard=True)(x)
    expected = layers.gaussian_expected_log_likelihood(y, f.mean(), f.variance(), 0.1)
    return -jnp.sum(expected) + jnp.sum((g - y) ** 2) - jnp.sum(exact.log_prob(y.T))


def test_gradients_reach_every_parameter_and_every_parameter_has_logical_axes():
  x = jax.random.normal(jax.random.key(0), (16, 3))
  y = jax.random.normal(jax.random.key(1), (16, 2))
  model = _Stack()
  boxed = jax.eval_shape(model.init, jax.random.key(2), x, y)["params"]  # abstract: no compile
  rules = resolve_rules("fsdp_tp")
  for path, leaf in traverse_util.flatten_dict(boxed).items():
    assert isinstance(leaf, nn.LogicallyPartitioned), path
    assert len(leaf.names) == leaf.value.ndim, path
    logical_to_mesh_spec(leaf.names, rules, "/".join(path))  # the default rules know them
  specs = traverse_util.flatten_dict(nn.get_partition_spec(boxed))
  assert tuple(specs[("SparseGaussianProcess_0", "inducing_scale_tril")]) == ("embed", "mlp",
                                                                               None)
  assert tuple(specs[("SparseGaussianProcess_0", "raw_lengthscale")]) == ("embed",)

  def loss(params):
    value, state = model.apply({"params": params}, x, y, rngs={"sample": jax.random.key(3)},
                               mutable=[layers.KL_COLLECTION])
    # KL: one per sparse layer and one for the random features' output weights.
    assert len(traverse_util.flatten_dict(state[layers.KL_COLLECTION])) == 3
    return value + layers.total_kl(state)

  grads = jax.jit(lambda k: jax.grad(loss)(nn.unbox(model.init(k, x, y)["params"])))(
      jax.random.key(2))
  grads = traverse_util.flatten_dict(grads)
  assert len(grads) == 19  # 5 per sparse layer, 2 of the mean, 4 of the features, 3 exact
  for path, grad in grads.items():
    assert np.all(np.isfinite(grad)) and np.any(grad != 0), path


def test_a_distribution_input_is_sampled_or_its_mean_taken():
  x = jax.random.normal(jax.random.key(0), (6, 2))
  first = layers.SparseGaussianProcess(units=3, num_inducing=4)
  second = layers.SparseGaussianProcess(units=1, num_inducing=4)
  v1 = jax.jit(first.init)(jax.random.key(1), x)
  v2 = nn.unbox(jax.jit(lambda k: second.init(k, first.apply(v1, x)))(jax.random.key(2)))
  v2["params"]["inducing_mean"] = jnp.ones((4, 1))

  @jax.jit
  def means(key):
    hidden = first.apply(v1, x)
    at_mean = second.apply(v2, hidden, deterministic=True).mean()
    of_mean = second.apply(v2, hidden.mean()).mean()
    sampled = second.apply(v2, hidden, rngs={"sample": key}).mean()
    return at_mean, of_mean, sampled

  at_mean, of_mean, sampled = means(jax.random.key(3))
  np.testing.assert_array_equal(at_mean, of_mean)
  assert not np.allclose(sampled, means(jax.random.key(4))[2])
  assert not np.allclose(sampled, at_mean)
  with pytest.raises(ValueError, match="'sample' rng"):
    jax.eval_shape(lambda: second.apply(v2, first.apply(v1, x)))


@pytest.mark.parametrize("make, message", [
    (lambda: layers.SparseGaussianProcess(units=0), "units=0 must be a positive int"),
    (lambda: layers.SparseGaussianProcess(units=True), "units=True must be a positive int"),
    (lambda: layers.SparseGaussianProcess(units=2, num_inducing=0), "num_inducing=0"),
    (lambda: layers.SparseGaussianProcess(units=2, scale_init=0.0), "scale_init=0.0"),
    (lambda: layers.GaussianProcess(units=1, lengthscale_init=-1.0), "lengthscale_init=-1.0"),
    (lambda: layers.GaussianProcess(units=1, noise_variance_init=0.0), "noise_variance_init"),
    (lambda: layers.RandomFourierFeatures(units=1, estimator="dropout"),
     "estimator='dropout' is not one of reparameterization, flipout"),
    (lambda: layers.RandomFourierFeatures(
        units=1, kernel_fn=gpl.tfpk.MaternFiveHalves), "only tfpk.ExponentiatedQuadratic"),
])
def test_bad_configuration_raises_one_clear_line(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_bad_shapes_raise():
  x = jnp.ones((5, 2))
  gp = layers.GaussianProcess(units=2)
  init = lambda module, *args: jax.eval_shape(lambda: module.init(jax.random.key(0), *args))
  with pytest.raises(ValueError, match=r"conditional_outputs of shape \(5, 3\) must be \(5, 2\)"):
    init(gp, x, x, jnp.ones((5, 3)))
  with pytest.raises(ValueError, match="give both conditional_inputs and conditional_outputs"):
    init(gp, x, x)
  with pytest.raises(ValueError, match=r"inputs of shape \(5,\) must be \(N, features\)"):
    init(gp, x[:, 0])
  bad_mean = layers.SparseGaussianProcess(units=2, mean_fn=lambda t: t[:, :1, None])
  with pytest.raises(ValueError, match=r"mean_fn returned shape \(5, 1, 1\)"):
    init(bad_mean, x)


class _GPClassifier(nn.Module):
  """Logits from random features of a sparse GP's sampled output: both layers, sharded."""

  @nn.compact
  def __call__(self, x):
    hidden = layers.SparseGaussianProcess(units=8, num_inducing=8, scale_init=0.1)(x)
    return layers.RandomFourierFeatures(units=4, num_features=16)(hidden)


@pytest.mark.slow  # compiles for a 2x4 mesh
def test_sharded_equals_unsharded_on_a_2x4_mesh():
  x = jax.random.normal(jax.random.key(0), (16, 6))
  y = jax.random.randint(jax.random.key(1), (16,), 0, 4)
  grads, shardings = sharded_grads_equal_unsharded(_GPClassifier(), x, y)
  specs = {"/".join(str(getattr(k, "key", k)) for k in path): s.spec
           for path, s in jax.tree_util.tree_flatten_with_path(shardings)[0]}
  # Inducing axis over the model axis, features over data (fsdp_tp's weight embed).
  assert tuple(specs["SparseGaussianProcess_0/inducing_inputs"]) == ("model", "data")
  assert tuple(specs["SparseGaussianProcess_0/inducing_scale_tril"])[:2] == ("data", "model")
  assert tuple(specs["RandomFourierFeatures_0/output/kernel_loc"]) == ("model", "data")
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
