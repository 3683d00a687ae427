"""Estimator outputs against their analytic mean and variance, and their correlations.

Every estimator must give each example an output with mean ``x @ loc (+ b)``
and variance ``(x * x) @ stddev^2 (+ stddev_b^2)``. With N draws at a fixed
seed the empirical mean must lie within Z standard errors ``sqrt(var / N)`` of
the analytic mean and the empirical variance within ``Z * sqrt(2 / (N - 1))``
relative error of the analytic variance (the outputs are Gaussian, so that is
the standard error of a sample variance): 3.2% at N = 40,000 and Z = 4.5. A
Flipout with uniform instead of Rademacher output signs (edward2's bug) would
be off by a factor 7/3.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes import layers
from tests.layers.fixtures import (
  DENSE_CLASSES,
  GENERAL_CLASSES,
  Z,
  assert_moments,
  bayesian_classes,
  correlation,
  f64,
  randomize_posterior,
  stddev,
)

NUM_SAMPLES = 40_000


def draw(layer, params, x, num_samples=NUM_SAMPLES, seed=1):
  apply = lambda k: layer.apply({"params": params}, x, rngs={"sample": k})
  keys = jax.random.split(jax.random.key(seed), num_samples)
  return np.asarray(jax.vmap(apply)(keys), np.float64)


@pytest.mark.parametrize("bayesian_bias", [False, True])
@pytest.mark.parametrize("cls_name", DENSE_CLASSES)
def test_dense_moments(cls_name, bayesian_bias):
  layer = getattr(layers, cls_name)(features=4, bayesian_bias=bayesian_bias)
  x = jax.random.normal(jax.random.key(0), (2, 3, 6))
  params = randomize_posterior(layer.init(jax.random.key(0), x)["params"], jax.random.key(2))
  samples = draw(layer, params, x)

  mean = f64(x) @ f64(params["kernel_loc"])
  var = f64(x) ** 2 @ f64(stddev(params["kernel_scale"])) ** 2
  if bayesian_bias:
    mean, var = mean + f64(params["bias_loc"]), var + f64(stddev(params["bias_scale"])) ** 2
  else:
    mean = mean + f64(params["bias"])
  assert_moments(samples, mean, var)


@pytest.mark.parametrize("cls_name", GENERAL_CLASSES)
def test_dense_general_moments(cls_name):
  # Contract two input axes into two output axes, as attention output projections do.
  layer = getattr(layers, cls_name)(features=(2, 3), axis=(-2, -1), bayesian_bias=True)
  x = jax.random.normal(jax.random.key(0), (2, 5, 3, 4))
  params = randomize_posterior(layer.init(jax.random.key(0), x)["params"], jax.random.key(2))
  samples = draw(layer, params, x)

  loc, sd = f64(params["kernel_loc"]), f64(stddev(params["kernel_scale"]))
  mean = np.einsum("blhk,hkij->blij", f64(x), loc) + f64(params["bias_loc"])
  var = (np.einsum("blhk,hkij->blij", f64(x) ** 2, sd ** 2)
         + f64(stddev(params["bias_scale"])) ** 2)
  assert_moments(samples, mean, var)


EMBED_CLASSES = bayesian_classes(layers.embed_class)


@pytest.mark.parametrize("cls_name", EMBED_CLASSES)
def test_embed_lookup_and_attend_moments(cls_name):
  layer = getattr(layers, cls_name)(num_embeddings=7, features=3)
  ids = jnp.array([[0, 3, 3], [6, 1, 0]])
  params = randomize_posterior(layer.init(jax.random.key(0), ids)["params"], jax.random.key(2))
  loc, sd = f64(params["embedding_loc"]), f64(stddev(params["embedding_scale"]))
  assert_moments(draw(layer, params, ids), loc[ids], sd[ids] ** 2)

  query = jax.random.normal(jax.random.key(3), (2, 3))
  attend = lambda k: layer.apply({"params": params}, query, method="attend", rngs={"sample": k})
  logits = np.asarray(jax.vmap(attend)(jax.random.split(jax.random.key(1), NUM_SAMPLES)),
                      np.float64)
  assert_moments(logits, f64(query) @ loc.T, f64(query) ** 2 @ (sd ** 2).T)


def test_reparameterization_lookup_uses_one_table_per_call():
  layer = layers.EmbedReparameterization(num_embeddings=7, features=3)
  ids = jnp.array([[0, 3, 3], [6, 1, 0]])
  params = layer.init(jax.random.key(0), ids)["params"]
  samples = draw(layer, params, ids, num_samples=100)
  # A repeated id gets the same vector everywhere in the batch.
  np.testing.assert_array_equal(samples[:, 0, 1], samples[:, 0, 2])
  np.testing.assert_array_equal(samples[:, 0, 0], samples[:, 1, 2])
  assert np.all(samples[:, 0, 0] != samples[:, 0, 1])


@pytest.mark.parametrize("cls_name", DENSE_CLASSES)
def test_outputs_of_different_positions_are_decorrelated(cls_name):
  """Pseudo-independence, stated as a test.

  Feed the *same* input vector at every position of a (2 examples x 2 positions)
  batch. With one weight sample per call (reparameterization) all positions
  get identical outputs: correlation 1. Flipout and local reparameterization
  must make them uncorrelated: for every output feature and for both a second
  position of the same example and a position of another example, the Pearson
  correlation over N draws is within Z / sqrt(N) (2.2%) of 0.
  """
  layer = getattr(layers, cls_name)(features=4)
  x = jnp.broadcast_to(jax.random.normal(jax.random.key(0), (6,)), (2, 2, 6))
  params = randomize_posterior(layer.init(jax.random.key(0), x)["params"], jax.random.key(2))
  samples = draw(layer, params, x)
  other_position = correlation(samples[:, 0, 0], samples[:, 0, 1])
  other_example = correlation(samples[:, 0, 0], samples[:, 1, 1])
  if cls_name == "DenseReparameterization":
    np.testing.assert_allclose(other_position, 1.0, rtol=1e-6)
    np.testing.assert_allclose(other_example, 1.0, rtol=1e-6)
  else:
    bound = Z / math.sqrt(NUM_SAMPLES)
    print(f"max |correlation|: other position {np.abs(other_position).max():.4f}, "
          f"other example {np.abs(other_example).max():.4f} (bound {bound:.4f})")
    assert np.abs(other_position).max() < bound, other_position
    assert np.abs(other_example).max() < bound, other_example


def test_flipout_signs_are_plus_minus_one():
  """Flipout's two sign tensors are exactly +-1, drawn per element of input and output."""
  x = jnp.ones((3, 5, 1))
  kernel = layers.estimators.Normal(jnp.zeros((1, 2)), jnp.ones((1, 2)))
  contract = lambda a, w, **kw: jnp.einsum("blk,kf->blf", a, w)
  out = layers.estimators.flipout(jax.random.key(0), contract, x, kernel)
  # One input feature, loc = 0 and one eps per call: every output is +-eps, so
  # |output| is the same for every example and position and both signs occur.
  np.testing.assert_allclose(jnp.abs(out), jnp.broadcast_to(jnp.abs(out[0, 0]), out.shape),
                             rtol=1e-6)
  assert bool(jnp.any(out > 0)) and bool(jnp.any(out < 0))


def test_flipout_fourth_moments_need_both_sign_vectors():
  """Flipout's perturbation ``p = ((x * s) @ (stddev * eps)) * r``, pinned by fourth moments.

  Second moments cannot tell: with either sign vector alone the outputs of two
  examples (which share ``eps``) are already uncorrelated and keep the variance
  ``V = (x * x) @ stddev^2``. Fourth moments can, for examples ``b != c`` and
  features ``j != k`` (``S = stddev``):

  - input signs ``s``: ``Cov(p_bj^2, p_cj^2) = 2 sum_i x_bi^2 x_ci^2 S_ij^4``;
    without them (or with the same ``s`` for every example)
    ``2 (sum_i x_bi x_ci S_ij^2)^2``: 1.38 against 0.09 here, scaled by
    ``V_bj V_cj`` (positive inputs make the difference large).
  - output signs ``r``: ``E[p_bj p_bk p_cj p_ck] = 0``; without them (or the
    same ``r`` for every example) ``sum_i x_bi^2 x_ci^2 S_ij^2 S_ik^2``: 0.031
    here, scaled by ``sqrt(V_bj V_bk V_cj V_ck)``.

  Each is averaged over all pairs of 16 examples and of 32 features and
  compared with its closed form within Z standard errors (the spread of the
  per-draw averages / sqrt(N): 0.009 and 0.0002 at N = 500); the test also
  checks that the alternatives lie beyond 3 Z standard errors (they are 150
  away), so it cannot pass with a sign missing. 32 inputs and outputs take
  the packed sign path.
  """
  num_draws, batch, width = 500, 16, 32
  x = 0.5 + jnp.abs(jax.random.normal(jax.random.key(0), (batch, width)))
  sd = jax.random.uniform(jax.random.key(1), (width, width), minval=0.2, maxval=1.0)
  kernel = layers.estimators.Normal(jnp.zeros((width, width)), sd)  # loc 0: the outputs are p
  contract = lambda a, w, **kw: jnp.einsum("bi,io->bo", a, w, **kw)
  flipout = lambda key: layers.estimators.flipout(key, contract, x, kernel)
  p = f64(jax.jit(jax.vmap(flipout))(jax.random.split(jax.random.key(2), num_draws)))
  x, sd = f64(x), f64(sd)
  var = x ** 2 @ sd ** 2                                   # V[b, j]
  q = p / np.sqrt(var)                                     # unit variance
  examples = np.triu(np.ones((batch, batch), bool), 1)     # pairs b < c
  features = np.triu(np.ones((width, width), bool), 1)     # pairs j < k
  # sum over pairs b < c of u_b u_c: ((sum_b u_b)^2 - sum_b u_b^2) / 2.
  pair_sum = lambda u: (np.square(u.sum(1)) - np.square(u).sum(1)) / 2

  # Cov(p_bj^2, p_cj^2) / (V_bj V_cj), averaged over b < c and j.
  squares = pair_sum(q ** 2).mean(-1) / examples.sum() - 1.0
  xx = x[:, None, :, None] * x[None, :, :, None]           # x_bi x_ci: (b, c, i, 1)
  var_var = var[:, None] * var[None, :]                    # V_bj V_cj: (b, c, j)
  both = np.mean((2 * np.sum(xx ** 2 * sd ** 4, 2) / var_var)[examples])
  without_s = np.mean((2 * np.sum(xx * sd ** 2, 2) ** 2 / var_var)[examples])

  # E[p_bj p_bk p_cj p_ck] / sqrt(V_bj V_bk V_cj V_ck), averaged over b < c and j < k:
  # the pair sum of u_b = q_bj q_bk, without forming u for every (j, k).
  sums = np.einsum("nbj,nbk->njk", q, q)
  squares_of_u = np.einsum("nbj,nbk->njk", q ** 2, q ** 2)
  crosses = ((sums ** 2 - squares_of_u) / 2)[:, features].mean(-1) / examples.sum()
  moment = np.einsum("bi,ci,ij,ik->bcjk", x ** 2, x ** 2, sd ** 2, sd ** 2)
  root = np.sqrt(np.einsum("bj,bk,cj,ck->bcjk", var, var, var, var))
  without_r = np.mean((moment / root)[examples][:, features])

  for name, draws, mean, other in (("squares", squares, both, without_s),
                                   ("crosses", crosses, 0.0, without_r)):
    error = draws.std(ddof=1) / math.sqrt(num_draws)
    print(f"{name}: {draws.mean():.4f} against {mean:.4f} (standard error {error:.4f}); "
          f"with a sign missing {other:.4f}, {abs(other - mean) / error:.0f} standard errors off")
    assert abs(draws.mean() - mean) < Z * error, (name, draws.mean(), mean, error)
    assert abs(other - mean) > 3 * Z * error, (name, other, mean, error)


def test_sampled_weights_have_the_posterior_moments_and_keep_other_parameters():
  """``layers.sample_weights``: each ``w_loc`` drawn from N(loc, softplus(scale)^2)."""
  layer = layers.DenseFlipout(features=4, bayesian_bias=True)
  x = jnp.ones((1, 6))
  params = randomize_posterior(layer.init(jax.random.key(0), x)["params"], jax.random.key(2))
  draws = jax.vmap(lambda k: layers.sample_weights(params, k))(
      jax.random.split(jax.random.key(3), NUM_SAMPLES))
  for name in ("kernel", "bias"):
    assert_moments(f64(draws[f"{name}_loc"]), f64(params[f"{name}_loc"]),
                   f64(stddev(params[f"{name}_scale"])) ** 2)
    np.testing.assert_array_equal(draws[f"{name}_scale"][0], params[f"{name}_scale"])
  # Weights are independent of each other: kernel entries uncorrelated.
  kernel = f64(draws["kernel_loc"]).reshape(NUM_SAMPLES, -1)
  correlation = np.corrcoef(kernel, rowvar=False)[np.triu_indices(kernel.shape[1], 1)]
  assert np.abs(correlation).max() < Z / math.sqrt(NUM_SAMPLES)


@pytest.mark.parametrize("cls_name", ["DenseFlipout", "DenseGeneralFlipout"])
def test_flipout_one_sample_per_example_is_a_weight_sample_shared_by_the_positions(cls_name):
  """With ``one_sample_per_example`` each example of a (batch, length, d) input
  sees one weight sample at all its positions: its outputs are exactly linear in
  its inputs (positions 0..5 are the basis vectors, which read off the sampled
  kernel; position 6 is a random vector, whose output must be that kernel
  applied to it), identical inputs at two positions give identical outputs, and
  examples stay decorrelated with the posterior's marginal moments."""
  layer = getattr(layers, cls_name)(features=4, one_sample_per_example=True)
  x_one = jnp.concatenate([jnp.eye(6), jax.random.normal(jax.random.key(0), (2, 6))])
  x_one = x_one.at[7].set(x_one[6])  # positions 6 and 7: the same input
  x = jnp.stack([x_one, x_one])  # (2 examples, 8 positions, 6)
  params = randomize_posterior(layer.init(jax.random.key(0), x)["params"], jax.random.key(2))
  samples = draw(layer, params, x) - f64(params["bias"])  # (N, 2, 8, 4)
  kernels = samples[:, :, :6]  # each example's sampled kernel, (N, 2, 6, 4)
  np.testing.assert_allclose(samples[:, :, 6], np.einsum("d,nbdf->nbf", f64(x_one[6]), kernels),
                             atol=1e-4)
  np.testing.assert_array_equal(samples[:, :, 6], samples[:, :, 7])
  loc, sd = f64(params["kernel_loc"]), f64(stddev(params["kernel_scale"]))
  assert_moments(kernels[:, 0], loc, sd ** 2)
  other_example = correlation(samples[:, 0, 6], samples[:, 1, 6])
  assert np.abs(other_example).max() < Z / math.sqrt(NUM_SAMPLES), other_example


def test_one_sample_per_example_is_refused_by_local_reparameterization():
  layer = layers.DenseLocalReparameterization(features=2, one_sample_per_example=True)
  with pytest.raises(ValueError, match="local reparameterization samples each output"):
    layer.init(jax.random.key(0), jnp.ones((1, 2, 3)))
