"""Stochastic output layers: log-probabilities against scipy and brute force, shapes, axes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats
from tensorflow_probability.substrates import jax as tfp

from meshbayes.layers.stochastic_outputs import (
  Bernoulli,
  Categorical,
  Discretize,
  MixtureLogistic,
  MixtureNormal,
  Normal,
  Poisson,
  bin_log_probs,
  discrete_entropy,
  discrete_mean,
  discretize,
  monte_carlo_entropy,
)

tfd = tfp.distributions
RNG = np.random.default_rng(0)


def _softplus(x):
  return np.logaddexp(0.0, x)


def _mixture_params(shape, k):
  logits = RNG.normal(size=shape + (k,))
  locs = RNG.uniform(-3, 19, size=shape + (k,))
  raw = RNG.normal(size=shape + (k,))
  return np.concatenate([logits, locs, raw], -1).astype(np.float32)


def _brute_mixture_logistic(params, x, k):
  """float64 numpy: log sum_k w_k logistic_pdf(x; mu_k, s_k)."""
  params = params.astype(np.float64)
  logits, locs, scales = params[..., :k], params[..., k:2 * k], _softplus(params[..., 2 * k:])
  z = (x[..., None] - locs) / scales
  log_pdf = -z - 2 * np.logaddexp(0.0, -z) - np.log(scales)
  return special.logsumexp(special.log_softmax(logits, -1) + log_pdf, axis=-1)


def _brute_discretized(params, x, k, low, high):
  """float64 numpy: log sum_k w_k [CDF_k(x + 1/2) - CDF_k(x - 1/2)], edges to +-infinity."""
  params = params.astype(np.float64)
  logits, locs, scales = params[..., :k], params[..., k:2 * k], _softplus(params[..., 2 * k:])
  upper = np.where(x >= high, np.inf, x + 0.5)[..., None]
  lower = np.where(x <= low, -np.inf, x - 0.5)[..., None]
  # sigmoid(a) - sigmoid(b) = sigmoid(a) sigmoid(-b) (1 - exp(b - a)), all in log space.
  a, b = (upper - locs) / scales, (lower - locs) / scales
  log_mass = (-np.logaddexp(0.0, -a) - np.logaddexp(0.0, b)
              + np.log1p(-np.exp(np.where(np.isinf(a) | np.isinf(b), -np.inf, b - a))))
  return special.logsumexp(special.log_softmax(logits, -1) + log_mass, axis=-1)


def test_elementwise_layers_log_prob_against_scipy():
  h = RNG.normal(size=(3, 8)).astype(np.float32)
  y = RNG.normal(size=(3, 4)).astype(np.float32)
  normal = Normal().apply({}, h)
  expected = stats.norm(h[:, :4], _softplus(h[:, 4:])).logpdf(y)
  np.testing.assert_allclose(normal.log_prob(y), expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(normal.entropy(), stats.norm(0, _softplus(h[:, 4:])).entropy(),
                             rtol=1e-5)

  labels = np.array([0, 7, 3])
  categorical = Categorical().apply({}, h)
  np.testing.assert_allclose(categorical.log_prob(labels),
                             special.log_softmax(h, -1)[np.arange(3), labels], rtol=1e-5)
  np.testing.assert_allclose(categorical.entropy(),
                             stats.entropy(special.softmax(h, -1), axis=-1), rtol=1e-5)

  bits = (RNG.uniform(size=h.shape) < 0.5).astype(np.float32)
  bernoulli = Bernoulli().apply({}, h)
  np.testing.assert_allclose(bernoulli.log_prob(bits),
                             stats.bernoulli(special.expit(h)).logpmf(bits), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(bernoulli.mean(), special.expit(h), rtol=1e-6)

  counts = RNG.poisson(3.0, size=h.shape).astype(np.float32)
  poisson = Poisson().apply({}, h)
  np.testing.assert_allclose(poisson.log_prob(counts), stats.poisson(np.exp(h)).logpmf(counts),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(poisson.mean(), np.exp(h), rtol=1e-6)


def test_mixtures_against_brute_force():
  k = 3
  params = _mixture_params((5, 2), k)
  x = RNG.uniform(-5, 21, size=(5, 2)).astype(np.float32)
  logistic = MixtureLogistic(num_components=k).apply({}, params)
  assert tuple(logistic.batch_shape) == (5, 2)
  np.testing.assert_allclose(logistic.log_prob(x), _brute_mixture_logistic(params, x, k),
                             rtol=1e-5, atol=1e-5)
  w = special.softmax(params[..., :k].astype(np.float64), -1)
  np.testing.assert_allclose(logistic.mean(), (w * params[..., k:2 * k]).sum(-1), rtol=1e-5,
                             atol=1e-5)
  normal = MixtureNormal(num_components=k).apply({}, params)
  scales = _softplus(params[..., 2 * k:].astype(np.float64))
  expected = special.logsumexp(
      np.log(w) + stats.norm(params[..., k:2 * k], scales).logpdf(x[..., None]), axis=-1)
  np.testing.assert_allclose(normal.log_prob(x), expected, rtol=1e-5, atol=1e-5)
  # TFP has no closed-form mixture entropy: the layer says so, the Monte Carlo estimate stands in.
  with pytest.raises(NotImplementedError):
    normal.entropy()


def test_discretized_mixture_logistic_against_brute_force_including_tails():
  k, low, high = 4, 0, 16
  params = _mixture_params((6,), k)
  # Far tails too: a narrow component makes the edge bins and distant bins tiny.
  params[0, 2 * k:] = -4.0
  mixture = MixtureLogistic(num_components=k).apply({}, params)
  dist = Discretize(low=low, high=high).apply({}, mixture)
  x = np.arange(low, high + 1, dtype=np.float32)[:, None] * np.ones((1, 6), np.float32)
  got = np.asarray(dist.log_prob(x))
  expected = _brute_discretized(params[None], x.astype(np.float64), k, low, high)
  finite = expected > -60  # float32 log-space CDFs resolve bins down to about e^-60
  assert finite.mean() > 0.8
  np.testing.assert_allclose(got[finite], expected[finite], rtol=2e-4, atol=2e-4)
  assert np.all(np.isfinite(got))
  # Bin probabilities over all 17 bins (tails absorbed by the edges) sum to one.
  probs = np.exp(np.asarray(bin_log_probs(dist, low, high), np.float64))
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
  # Mean and entropy over the finite support, against the brute-force pmf.
  pmf = np.exp(expected.T)
  np.testing.assert_allclose(discrete_mean(dist, low, high), pmf @ np.arange(low, high + 1),
                             rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(discrete_entropy(dist, low, high),
                             -(pmf * np.log(np.maximum(pmf, 1e-300))).sum(-1), atol=1e-4)


def test_discretize_single_distributions_sum_to_one_and_match_cdf_differences():
  normal_loc, normal_scale = np.array([0.3, 5.0, 20.0]), np.array([0.1, 2.0, 1.0])
  logistic_loc, logistic_scale = np.array([-4.0, 8.0, 8.2]), np.array([0.05, 3.0, 0.3])
  cases = [(tfd.Normal(normal_loc.astype(np.float32), normal_scale.astype(np.float32)),
            stats.norm(normal_loc, normal_scale)),
           (tfd.Logistic(logistic_loc.astype(np.float32), logistic_scale.astype(np.float32)),
            stats.logistic(logistic_loc, logistic_scale))]
  for dist, reference in cases:
    probs = np.exp(np.asarray(bin_log_probs(discretize(dist, 0, 16), 0, 16), np.float64))
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    # Against float64 scipy: inner bins are CDF differences, the edges take the tails.
    k = np.arange(17, dtype=np.float64)[:, None]
    expected = (np.where(k == 16, 1.0, reference.cdf(k + 0.5))
                - np.where(k == 0, 0.0, reference.cdf(k - 0.5))).T
    np.testing.assert_allclose(probs, expected, rtol=2e-4, atol=1e-7)
  # Far in a tail, where CDF differences in float32 would be 0 - 0, log space stays exact:
  # logistic(0, 0.5) at bin 12 (the 11.5..12.5 mass is e^-23 - e^-25 = 2 e^-24 sinh(1)).
  far = discretize(tfd.Logistic(0.0, 0.5), -20, 20).log_prob(12.0)
  expected = -24.0 + np.log(2 * np.sinh(1.0))
  assert abs(float(far) - expected) < 1e-3


def test_projection_shapes_logical_axes_and_finite_gradients():
  x = jnp.asarray(RNG.normal(size=(4, 5)), jnp.float32)
  cases = [(Normal(units=3), (4, 3)), (Categorical(units=6), (4,)), (Bernoulli(units=3), (4, 3)),
           (Poisson(units=3), (4, 3)), (MixtureLogistic(num_components=2, units=3), (4, 3)),
           (MixtureNormal(num_components=2, units=3), (4, 3))]
  for layer, batch_shape in cases:
    variables = layer.init(jax.random.key(0), x)
    specs = nn.get_partition_spec(variables)["params"]["projection"]
    assert specs["kernel"] == jax.sharding.PartitionSpec("embed", "mlp"), type(layer).__name__
    assert specs["bias"] == jax.sharding.PartitionSpec("mlp")
    dist = layer.apply(variables, x)
    assert tuple(dist.batch_shape) == batch_shape, type(layer).__name__
    sample = dist.sample(seed=jax.random.key(1))
    assert sample.shape == batch_shape
    assert dist.mean().shape == batch_shape
  # Custom axes travel to the projection; the whole likelihood differentiates.
  layer = MixtureLogistic(num_components=2, units=3, kernel_axes=("embed", "vocab"),
                          bias_axes=("vocab",))
  variables = layer.init(jax.random.key(0), x)
  assert nn.get_partition_spec(variables)["params"]["projection"]["kernel"] == \
      jax.sharding.PartitionSpec("embed", "vocab")
  pixels = jnp.asarray(RNG.integers(0, 17, size=(4, 3)), jnp.float32)

  def nll(params):
    dist = Discretize(low=0, high=16).apply({}, layer.apply({"params": params}, x * 10))
    return -dist.log_prob(pixels).sum()

  grads = jax.grad(nll)(nn.unbox(variables["params"]))
  leaves = jax.tree.leaves(grads)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
  assert max(float(jnp.abs(g).max()) for g in leaves) > 0
  # Gradients against finite differences on one weight.
  params = nn.unbox(variables["params"])
  eps = 1e-2
  bump = jax.tree.map(jnp.zeros_like, params)
  bump["projection"]["bias"] = bump["projection"]["bias"].at[1].set(eps)
  plus = jax.tree.map(jnp.add, params, bump)
  minus = jax.tree.map(jnp.subtract, params, bump)
  numeric = (nll(plus) - nll(minus)) / (2 * eps)
  assert abs(float(numeric) - float(grads["projection"]["bias"][1])) < 2e-2 * max(
      1.0, abs(float(numeric)))


def test_sample_moments_match_means():
  key = jax.random.key(3)
  n = 20_000
  params = _mixture_params((2,), 3)
  dists = {
      "normal": Normal().apply({}, jnp.array([1.0, -2.0, 0.5, 1.5])),
      "poisson": Poisson().apply({}, jnp.log(jnp.array([0.5, 7.0]))),
      "mixture_logistic": MixtureLogistic(num_components=3).apply({}, params),
      "mixture_normal": MixtureNormal(num_components=3).apply({}, params),
  }
  for i, (name, dist) in enumerate(dists.items()):
    samples = dist.sample(n, seed=jax.random.fold_in(key, i))
    stderr = np.asarray(samples.std(0)) / np.sqrt(n)
    assert np.all(np.abs(np.asarray(samples.mean(0) - dist.mean())) < 5 * stderr), name
  pixels = discretize(dists["mixture_logistic"], 0, 16)
  samples = np.asarray(pixels.sample(n, seed=jax.random.fold_in(key, 9)))
  assert set(np.unique(samples)) <= set(range(17))
  # Sample frequencies match the pmf (chi-square-sized tolerance per bin).
  probs = np.exp(np.asarray(bin_log_probs(pixels, 0, 16)))
  freqs = np.stack([(samples == v).mean(0) for v in range(17)], -1)
  assert np.all(np.abs(freqs - probs) < 5 * np.sqrt(probs * (1 - probs) / n) + 1e-3)
  np.testing.assert_allclose(samples.mean(0), discrete_mean(pixels, 0, 16),
                             atol=5 * samples.std(0).max() / np.sqrt(n))
  # Monte Carlo entropy of a mixture against quadrature.
  mixture = dists["mixture_normal"]
  grid = np.linspace(-40, 60, 200_001)
  log_p = np.asarray(mixture.log_prob(grid[:, None].astype(np.float32)), np.float64)
  exact = -np.trapezoid(np.exp(log_p) * log_p, grid, axis=0)
  estimate = monte_carlo_entropy(mixture, jax.random.fold_in(key, 11), num_samples=n)
  np.testing.assert_allclose(estimate, exact, atol=0.05)


def test_bad_shapes_raise():
  with pytest.raises(ValueError, match="3 \\* num_components"):
    MixtureLogistic(num_components=2).apply({}, jnp.zeros((4, 5)))
  with pytest.raises(ValueError, match="multiple of 2"):
    Normal().apply({}, jnp.zeros((4, 5)))
  with pytest.raises(ValueError, match="must exceed"):
    Discretize(low=3, high=3).apply({}, tfd.Normal(0.0, 1.0))


@pytest.mark.slow  # compiles for a 2x4 mesh
def test_sharded_likelihood_and_gradients_equal_unsharded():
  """A discretized MixtureLogistic likelihood on a 2x4 (data, model) mesh, fsdp_tp rules:
  the projection's kernel is sharded by its logical axes; loss and gradients match."""
  from jax.sharding import NamedSharding, PartitionSpec

  from meshbayes.partitioning import Partitioner

  layer = MixtureLogistic(num_components=2, units=4, kernel_axes=("embed", "mlp"),
                          bias_axes=("mlp",))
  x = jax.random.normal(jax.random.key(0), (8, 16)) * 5
  y = jax.random.randint(jax.random.key(1), (8, 4), 0, 17).astype(jnp.float32)

  def loss_fn(params, x, y):
    return -discretize(layer.apply({"params": params}, x), 0, 16).log_prob(y).mean()

  init = lambda k: layer.init(k, x)["params"]
  params = nn.unbox(init(jax.random.key(2)))
  ref_loss, ref_grads = jax.jit(jax.value_and_grad(loss_fn))(params, x, y)
  partitioner = Partitioner(data=2, model=4, rules="fsdp_tp")
  sharded, shardings = partitioner.init(init, jax.random.key(2))
  batch = NamedSharding(partitioner.mesh, partitioner.batch_spec)
  with partitioner.activation_rules():
    step = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(shardings, batch, batch),
                   out_shardings=(None, shardings))
    loss, grads = step(sharded, x, y)
  assert shardings["projection"]["kernel"].spec == PartitionSpec("data", "model")
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for got, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
