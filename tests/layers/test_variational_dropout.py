"""Sparse variational dropout: moments, the KL approximation, pruning, gradients, sharding."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P
from scipy import integrate

from meshbayes import layers
from meshbayes.layers import variational_dropout as vd
from tests.layers.fixtures import Z, assert_moments, correlation, f64, sharded_grads_equal_unsharded

NUM_SAMPLES = 40_000


def randomize(params, key, log_alpha_range=(-4.0, 1.0)):
  """``theta`` ~ N(0, 1) and ``log sigma^2`` giving log alpha in a range (no weight pruned)."""
  key_theta, key_alpha, key_bias = jax.random.split(key, 3)
  theta = jax.random.normal(key_theta, params["kernel_loc"].shape)
  log_alpha = jax.random.uniform(key_alpha, theta.shape, minval=log_alpha_range[0],
                                 maxval=log_alpha_range[1])
  return dict(params, kernel_loc=theta, kernel_log_sigma2=log_alpha + jnp.log(theta ** 2),
              bias=jax.random.normal(key_bias, params["bias"].shape))


def draw(layer, params, x, num_samples=NUM_SAMPLES):
  apply = lambda k: layer.apply({"params": params}, x, rngs={"sample": k})
  return f64(jax.jit(jax.vmap(apply))(jax.random.split(jax.random.key(1), num_samples)))


def test_dense_moments_are_the_local_reparameterization_gaussians():
  layer = vd.DenseVariationalDropout(features=4)
  x = jax.random.normal(jax.random.key(0), (2, 3, 6))
  params = randomize(layer.init(jax.random.key(0), x)["params"], jax.random.key(2))
  theta, var_w = f64(params["kernel_loc"]), np.exp(f64(params["kernel_log_sigma2"]))
  assert_moments(draw(layer, params, x), f64(x) @ theta + f64(params["bias"]),
                 f64(x) ** 2 @ var_w)


def test_conv_moments_and_independent_positions():
  layer = vd.ConvVariationalDropout(features=4, kernel_size=(3, 3))
  x = 0.5 + jnp.abs(jax.random.normal(jax.random.key(0), (2, 5, 5, 3)))
  params = randomize(layer.init(jax.random.key(0), x)["params"], jax.random.key(2))
  twin = nn.Conv(4, (3, 3), use_bias=False)
  conv = lambda inputs, kernel: f64(twin.apply({"params": {"kernel": kernel}}, inputs))
  samples = draw(layer, params, x)
  assert_moments(samples, conv(x, params["kernel_loc"]) + f64(params["bias"]),
                 conv(x ** 2, jnp.exp(params["kernel_log_sigma2"])))
  # Local reparameterization: neighbouring positions of one example are uncorrelated.
  within = correlation(samples[:, 0, 2, 2], samples[:, 0, 2, 3])
  print(f"correlation of two positions: {np.round(within, 4)}")
  assert np.abs(within).max() < Z / math.sqrt(NUM_SAMPLES), within


def kl_by_integral(log_alpha):
  """``KL(N(theta, alpha theta^2) || log-uniform)`` by quadrature (Kingma et al., 2015).

  ``-0.5 log alpha + E[log |e|] + (euler_gamma + log 2) / 2`` with ``e ~ N(1, alpha)``;
  the constant makes it 0 as ``alpha -> inf``, the convention of the approximation.
  """
  s = math.exp(0.5 * log_alpha)
  density = lambda e: math.log(abs(e)) * math.exp(-0.5 * ((e - 1) / s) ** 2) / (
      s * math.sqrt(2 * math.pi))
  expectation = sum(integrate.quad(density, a, b, epsabs=1e-12, limit=200)[0]
                    for a, b in ((-np.inf, 0.0), (0.0, np.inf)))
  return -0.5 * log_alpha + expectation + (np.euler_gamma + math.log(2.0)) / 2


def test_kl_approximation_against_the_integral():
  """Molchanov et al. fitted k1, k2, k3 to this integral: within 0.01 nats everywhere
  (0.0085 at log alpha = -4 the worst of these), and exact in both limits."""
  log_alphas = np.array([-8.0, -6.0, -4.0, -2.0, -1.0, 0.0, 1.0, 2.0, 4.0, 8.0])
  exact = np.array([kl_by_integral(a) for a in log_alphas])
  approx = f64(vd.log_uniform_kl(jnp.asarray(log_alphas)))
  for a, e, m in zip(log_alphas, exact, approx):
    print(f"log alpha {a:+.0f}: integral {e:.5f}, approximation {m:.5f}")
  np.testing.assert_allclose(approx, exact, atol=0.01)
  assert np.abs(approx - exact)[log_alphas >= 4].max() < 3e-4  # the tail of a pruned weight


def test_layer_records_the_approximate_kl_of_its_kernel():
  layer = vd.DenseVariationalDropout(features=5)
  x = jnp.ones((2, 4))
  params = randomize(layer.init(jax.random.key(0), x)["params"], jax.random.key(1),
                     log_alpha_range=(-8.0, 8.0))
  theta, log_sigma2 = f64(params["kernel_loc"]), f64(params["kernel_log_sigma2"])
  log_alpha = log_sigma2 - np.log(theta ** 2)
  expected = np.sum(vd.K1 - vd.K1 / (1 + np.exp(-(vd.K2 + vd.K3 * log_alpha)))
                    + 0.5 * np.log1p(np.exp(-log_alpha)))
  for kwargs in ({"rngs": {"sample": jax.random.key(2)}}, {"deterministic": True}):
    _, state = layer.apply({"params": params}, x, mutable=[layers.KL_COLLECTION], **kwargs)
    np.testing.assert_allclose(layers.total_kl(state), expected, rtol=1e-5)
  # As a prior of an ordinary Bayesian layer: the same KL of each weight's alpha.
  flipout = layers.DenseFlipout(features=5, use_bias=False, prior=vd.LogUniformPrior())
  normal = {"kernel_loc": params["kernel_loc"],
            "kernel_scale": layers.softplus_inverse(jnp.exp(0.5 * params["kernel_log_sigma2"]))}
  _, state = flipout.apply({"params": normal}, x, deterministic=True,
                           mutable=[layers.KL_COLLECTION])
  np.testing.assert_allclose(layers.total_kl(state), expected, rtol=1e-4)


@pytest.mark.parametrize("make, x, twin", [
    (lambda: vd.DenseVariationalDropout(features=6), jnp.ones((3, 8)), nn.Dense(6)),
    (lambda: vd.ConvVariationalDropout(features=6, kernel_size=(3,)), jnp.ones((3, 7, 8)),
     nn.Conv(6, (3,))),
])
def test_evaluation_drops_weights_above_the_threshold_and_sparsity_counts_them(make, x, twin):
  layer = make()
  x = jax.random.normal(jax.random.key(0), x.shape)
  params = randomize(layer.init(jax.random.key(0), x)["params"], jax.random.key(1))
  theta = params["kernel_loc"]
  # Exactly every third weight gets log alpha = 3.5 (dropped); the others keep theirs.
  dropped = (jnp.arange(theta.size) % 3 == 0).reshape(theta.shape)
  params["kernel_log_sigma2"] = jnp.where(dropped, 3.5 + jnp.log(theta ** 2),
                                          params["kernel_log_sigma2"])
  evaluate = jax.jit(lambda layer, params: layer.apply({"params": params}, x,
                                                      deterministic=True), static_argnums=0)
  twin_apply = jax.jit(lambda kernel: twin.apply({"params": {"kernel": kernel,
                                                             "bias": params["bias"]}}, x))
  np.testing.assert_array_equal(evaluate(layer, params),
                                twin_apply(jnp.where(dropped, 0.0, theta)))
  assert vd.sparsity(params) == pytest.approx(int(dropped.sum()) / theta.size)
  assert vd.sparsity(params, threshold=4.0) == 0.0
  np.testing.assert_array_equal(evaluate(layer.clone(threshold=4.0), params), twin_apply(theta))


def test_training_drives_irrelevant_weights_past_the_threshold():
  """Regression on 16 inputs of which 2 matter: the ELBO prunes the other 14.

  The targets are exactly ``x @ w`` under a unit-variance likelihood, so the
  data's best value of every irrelevant weight is 0 (with noisy targets a
  weight whose least-squares estimate is a standard error or more from 0 is
  rightly kept)."""
  layer = vd.DenseVariationalDropout(features=1, use_bias=False)
  x = jax.random.normal(jax.random.key(0), (256, 16))
  w = jnp.zeros((16, 1)).at[0, 0].set(2.0).at[1, 0].set(-1.5)
  y = x @ w
  params = layer.init(jax.random.key(2), x)["params"]
  optimizer = optax.adam(optax.cosine_decay_schedule(0.05, 1500))

  def loss(params, key):
    pred, state = layer.apply({"params": params}, x, rngs={"sample": key},
                              mutable=[layers.KL_COLLECTION])
    nll = 0.5 * jnp.mean(jnp.square(pred - y))
    return nll + layers.kl_penalty(layers.total_kl(state), num_train_units=256)

  def step(carry, key):
    params, opt_state = carry
    grads = jax.grad(loss)(params, key)
    updates, opt_state = optimizer.update(grads, opt_state)
    return (optax.apply_updates(params, updates), opt_state), None

  train = jax.jit(lambda p, keys: jax.lax.scan(step, (p, optimizer.init(p)), keys)[0][0])
  params = train(params, jax.random.split(jax.random.key(3), 1500))
  log_alpha = np.asarray(vd.log_alpha(params["kernel_loc"], params["kernel_log_sigma2"]))[:, 0]
  print(f"log alpha of the relevant weights {np.round(log_alpha[:2], 2)}, of the others "
        f"min {log_alpha[2:].min():.2f}; sparsity {vd.sparsity(params):.3f}")
  assert log_alpha[:2].max() < -3.0 and log_alpha[2:].min() > vd.THRESHOLD, log_alpha
  assert vd.sparsity(params) == 14 / 16
  pruned = layer.apply({"params": params}, x, deterministic=True)
  print(f"relevant weights {np.round(params['kernel_loc'][:2, 0], 3)}; RMS error of the pruned "
        f"model {float(jnp.sqrt(jnp.mean(jnp.square(pruned - y)))):.4f}")
  np.testing.assert_allclose(pruned, y, atol=0.05)


@pytest.mark.parametrize("make, x", [
    (lambda: vd.DenseVariationalDropout(4), jnp.ones((2, 5, 3))),
    (lambda: vd.ConvVariationalDropout(4, (3, 3)), jnp.ones((2, 5, 5, 3))),
])
def test_gradients_reach_theta_and_log_sigma2(make, x):
  layer = make()
  x = jax.random.normal(jax.random.key(0), x.shape)
  params = randomize(layer.init(jax.random.key(0), x)["params"], jax.random.key(2))

  def loss(params):
    y, state = layer.apply({"params": params}, x, rngs={"sample": jax.random.key(1)},
                           mutable=[layers.KL_COLLECTION])
    return jnp.mean(jnp.square(y - 1.0)) + layers.total_kl(state) / 1000.0

  grads = jax.jit(jax.grad(loss))(params)
  assert set(grads) == {"kernel_loc", "kernel_log_sigma2", "bias"}
  for name, g in grads.items():
    assert bool(jnp.all(jnp.isfinite(g))), name
    assert float(jnp.max(jnp.abs(g))) > 0, f"no gradient reaches {name}"


@pytest.mark.parametrize("make, twin, x, axes", [
    (lambda **kw: vd.DenseVariationalDropout(4, **kw), nn.Dense(4), jnp.ones((2, 3)),
     ("embed", "mlp")),
    (lambda **kw: vd.ConvVariationalDropout(4, (3, 3), **kw), nn.Conv(4, (3, 3)),
     jnp.ones((2, 5, 5, 3)), (None, None, "embed", "mlp")),
])
def test_swap_same_shapes_and_logical_axes_as_the_twin(make, twin, x, axes):
  shape = twin.init(jax.random.key(0), x)["params"]["kernel"].shape
  variables = make(kernel_axes=axes, bias_axes=("mlp",)).init(jax.random.key(0), x)
  specs = nn.get_partition_spec(variables)["params"]
  shapes = jax.tree.map(jnp.shape, nn.unbox(variables["params"]))
  assert shapes == {"kernel_loc": shape, "kernel_log_sigma2": shape, "bias": (4,)}
  assert specs == {"kernel_loc": P(*axes), "kernel_log_sigma2": P(*axes), "bias": P("mlp")}
  # Flax-style boxed initializers give the same boxes.
  boxed = make(kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), axes),
               bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("mlp",)))
  assert nn.get_partition_spec(boxed.init(jax.random.key(0), x))["params"] == specs


def test_bfloat16_compute_with_float32_parameters():
  layer = vd.ConvVariationalDropout(features=4, kernel_size=(3, 3))
  x = jax.random.normal(jax.random.key(0), (8, 6, 6, 3))
  params = randomize(layer.init(jax.random.key(0), x)["params"], jax.random.key(1),
                     log_alpha_range=(-6.0, -4.0))
  key = jax.random.key(3)
  out32 = layer.apply({"params": params}, x, rngs={"sample": key})
  out16 = layer.clone(dtype=jnp.bfloat16).apply({"params": params}, x, rngs={"sample": key})
  assert out16.dtype == jnp.bfloat16 and params["kernel_log_sigma2"].dtype == jnp.float32
  rel = jnp.linalg.norm(out16.astype(jnp.float32) - out32) / jnp.linalg.norm(out32)
  assert float(rel) < 1e-2, float(rel)


def test_sharded_forward_backward_equals_unsharded():
  """A convolution and a classifier with variational dropout on a 2x4 mesh, fsdp_tp rules."""

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = vd.ConvVariationalDropout(8, (3, 3), kernel_axes=(None, None, "embed", "mlp"),
                                    bias_axes=("mlp",))(x)
      x = nn.with_logical_constraint(nn.relu(x), ("batch", None, None, "mlp"))
      return vd.DenseVariationalDropout(4, kernel_axes=("mlp", "vocab"),
                                        bias_axes=("vocab",))(x.mean(axis=(1, 2)))

  model = Net()
  x = jax.random.normal(jax.random.key(0), (8, 6, 6, 4))
  y = jax.random.randint(jax.random.key(1), (8,), 0, 4)

  grads, shardings = sharded_grads_equal_unsharded(model, x, y)
  spec = grads["ConvVariationalDropout_0"]["kernel_log_sigma2"].sharding.spec
  assert spec == P(None, None, "data", "model")


def test_sparsity_of_params_without_variational_dropout_is_an_error():
  with pytest.raises(ValueError, match=r"sparsity: params hold no variational dropout weights"):
    vd.sparsity({"dense": {"kernel_loc": jnp.ones(2), "kernel_scale": jnp.ones(2)}})


def test_parameter_counts_treat_log_sigma2_as_a_posterior_scale():
  params = layers.DenseVariationalDropout(features=3).init(jax.random.key(0), jnp.ones((1, 4)))
  counts = layers.count_parameters(params["params"])
  assert (counts.total, counts.bayesian_weights, counts.point_weights) == (27, 12, 3)
