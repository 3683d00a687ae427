"""Reversible layers: inverses, log determinants against autodiff, MADE's masks, distributions.

Every layer is checked with random, non-trivial parameters (all entries
N(0, 0.5^2), 0.25^2 in the three-layer flow), so no layer passes by being
the identity.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import NamedSharding
from tensorflow_probability.substrates import jax as tfp

from meshbayes.layers.reversible import MADE, Flow, RealNVP, Reverse, made_degrees
from meshbayes.partitioning import Partitioner

tfd = tfp.distributions
D = 5


class HalfMLP(nn.Module):
  """A plain (unmasked) conditioner: the masked half to (..., D - num_masked, 2)."""

  outputs: int

  @nn.compact
  def __call__(self, x):
    h = nn.tanh(nn.Dense(8, kernel_init=nn.with_logical_partitioning(
        nn.initializers.lecun_normal(), ("embed", "mlp")))(x))
    out = nn.Dense(2 * self.outputs, kernel_init=nn.with_logical_partitioning(
        nn.initializers.lecun_normal(), ("mlp", "embed")))(h)
    return out.reshape(x.shape[:-1] + (self.outputs, 2))


LAYERS = {
    "coupling": lambda: RealNVP(2, hidden_dims=(8, 8)),
    "coupling_bounded_log_scale": lambda: RealNVP(2, hidden_dims=(8, 8), log_scale_bound=0.5),
    "made_left_to_right": lambda: RealNVP(0, conditioner=MADE(hidden_dims=(8, 8))),
    "made_right_to_left_masked": lambda: RealNVP(
        2, conditioner=MADE(hidden_dims=(8,), order="right-to-left")),
    "mlp_conditioner": lambda: RealNVP(2, conditioner=HalfMLP(D - 2)),
    "reverse": Reverse,
    "flow": lambda: Flow([RealNVP(2, hidden_dims=(8,)), Reverse(),
                          RealNVP(0, conditioner=MADE(hidden_dims=(8,)))]),
}


def randomize(params, key, scale=0.5):
  flat = traverse_util.flatten_dict(nn.unbox(params))
  return traverse_util.unflatten_dict({
      path: scale * jax.random.normal(jax.random.fold_in(key, i), v.shape, v.dtype)
      for i, (path, v) in enumerate(sorted(flat.items()))})


def make(name, key=0):
  layer = LAYERS[name]()
  x = jax.random.normal(jax.random.key(key), (4, D))
  scale = 0.25 if name == "flow" else 0.5  # composed layers compound the scales
  variables = {"params": randomize(layer.init(jax.random.key(1), x).get("params", {}),
                                   jax.random.key(2), scale)}
  return layer, variables, x


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_reverse_inverts_forward_and_log_det_matches_autodiff(name):
  layer, variables, x = make(name)
  forward = lambda v: layer.apply(variables, v)
  y = jax.jit(forward)(x)
  assert float(jnp.max(jnp.abs(y - x))) > 0.1                    # not the identity
  x_back = jax.jit(lambda v: layer.apply(variables, v, method="reverse"))(y)
  np.testing.assert_allclose(x_back, x, atol=1e-5)
  log_det = jax.jit(lambda v: layer.apply(variables, v, method="log_det_jacobian"))(x)
  jacobians = jax.jit(jax.vmap(jax.jacfwd(forward)))(x)           # (4, D, D), one per example
  _, ref = np.linalg.slogdet(np.asarray(jacobians, np.float64))
  np.testing.assert_allclose(log_det, ref, atol=1e-4)
  if name != "reverse":
    assert float(np.abs(ref).max()) > 0.1                         # a volume change to get right


@pytest.mark.parametrize("order", ["left-to-right", "right-to-left", (2, 1, 1, 3)])
def test_made_jacobian_is_strictly_triangular_in_its_order(order):
  made = MADE(num_params=2, hidden_dims=(16, 16), order=order, activation=nn.tanh)
  x = jax.random.normal(jax.random.key(0), (4,))
  params = randomize(made.init(jax.random.key(1), x)["params"], jax.random.key(2))
  jac = np.asarray(jax.jacfwd(lambda v: made.apply({"params": params}, v))(x))  # (out, p, in)
  degrees = made_degrees(order, 4)
  allowed = degrees[None, :] < degrees[:, None]                     # [output d, input e]
  for p in range(2):
    assert np.all(jac[:, p, :][~allowed] == 0.0)                    # exact zeros
    assert np.all(jac[:, p, :][allowed] != 0.0)                     # and every edge is used


def test_transformed_distribution_log_prob_sample_and_grad():
  layer, variables, _ = make("flow")
  base = tfd.MultivariateNormalDiag(jnp.arange(D) * 0.3, jnp.linspace(0.5, 1.5, D))
  y = jax.random.normal(jax.random.key(5), (6, D)) * 2.0

  def both(params):
    dist = layer.apply({"params": params}, base)                  # leaves apply: pure in params
    x = layer.apply({"params": params}, y, method="reverse")
    log_det = layer.apply({"params": params}, x, method="log_det_jacobian")
    return dist.log_prob(y), base.log_prob(x) - log_det

  log_prob, manual = jax.jit(both)(variables["params"])
  np.testing.assert_allclose(log_prob, manual, rtol=1e-6, atol=1e-5)
  # And against the change of variables with the autodiff Jacobian, independent of the layer's.
  x = layer.apply(variables, y, method="reverse")
  jacobians = jax.vmap(jax.jacfwd(lambda v: layer.apply(variables, v)))(x)
  brute = base.log_prob(x) - np.linalg.slogdet(np.asarray(jacobians, np.float64))[1]
  np.testing.assert_allclose(log_prob, brute, atol=1e-4)
  assert float(jnp.std(log_prob)) > 0.1
  # Densities integrate through the right Jacobian: against a known case, Reverse of a Gaussian.
  rev = Reverse().apply({}, base)
  np.testing.assert_allclose(rev.log_prob(y), tfd.MultivariateNormalDiag(
      base.mean()[::-1], base.stddev()[::-1]).log_prob(y), rtol=1e-6)
  grads = jax.jit(jax.grad(lambda p: both(p)[0].sum()))(variables["params"])
  ref_grads = jax.jit(jax.grad(lambda p: both(p)[1].sum()))(variables["params"])
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
  assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) > 1e-2

  # A sample is the forward map of the base's sample under the same seed.
  dist = layer.apply(variables, base)
  key = jax.random.key(7)
  np.testing.assert_allclose(dist.sample(3, seed=key),
                             layer.apply(variables, base.sample(3, seed=key)), atol=1e-6)
  # nn.Sequential passes the distribution through the same layers alike.
  seq = nn.Sequential(list(layer.layers))
  np.testing.assert_allclose(seq.apply(variables, base).log_prob(y), log_prob, rtol=1e-6)


def test_samples_have_the_transformed_mean_and_stddev():
  # MADE with zero kernels: an affine map y = x * exp(a) + b, then reversed; closed-form moments.
  flow = Flow([RealNVP(0, conditioner=MADE(hidden_dims=(8,))), Reverse()])
  base = tfd.MultivariateNormalDiag(jnp.linspace(-1, 1, 3), jnp.array([0.5, 1.0, 2.0]))
  params = flow.init(jax.random.key(0), jnp.zeros((1, 3)))["params"]
  params = jax.tree.map(jnp.zeros_like, nn.unbox(params))
  bias = jnp.array([[0.5, 0.3], [-1.0, -0.4], [2.0, 0.2]])        # (D, [shift, log scale])
  params["layers_0"]["conditioner"]["output"]["bias"] = bias
  n = 20_000
  samples = np.asarray(jax.jit(lambda k: flow.apply({"params": params}, base).sample(
      n, seed=k))(jax.random.key(3)), np.float64)
  mean = (base.mean() * jnp.exp(bias[:, 1]) + bias[:, 0])[::-1]
  stddev = (base.stddev() * jnp.exp(bias[:, 1]))[::-1]
  assert np.all(np.abs(samples.mean(0) - mean) < 4 * stddev / np.sqrt(n))
  np.testing.assert_allclose(samples.std(0), stddev, rtol=4 * np.sqrt(2 / n))


def test_every_parameter_has_logical_axes():
  layer, _, x = make("flow")
  params = layer.init(jax.random.key(0), x)["params"]
  specs = traverse_util.flatten_dict(nn.get_partition_spec(params))
  flat = traverse_util.flatten_dict(nn.unbox(params))
  for path, value in flat.items():
    spec = specs[path]
    assert isinstance(spec, jax.sharding.PartitionSpec) and len(spec) == value.ndim, path
    assert any(a is not None for a in spec), path
  assert tuple(specs[("layers_0", "made", "hidden_0", "kernel")]) == ("embed", "mlp")
  assert tuple(specs[("layers_2", "conditioner", "output", "kernel")]) == ("mlp", "embed", None)
  assert tuple(specs[("layers_2", "conditioner", "output", "bias")]) == ("embed", None)


def test_errors_name_the_problem():
  x = jnp.ones((2, 3))
  with pytest.raises(ValueError, match="num_masked > 0"):
    RealNVP(0).init(jax.random.key(0), x)
  with pytest.raises(ValueError, match="num_masked=3"):
    RealNVP(3).init(jax.random.key(0), x)
  with pytest.raises(ValueError, match="order="):
    MADE(order="up").init(jax.random.key(0), x)
  with pytest.raises(ValueError, match="vector event"):
    Reverse().apply({}, tfd.Normal(0.0, 1.0))

  class SharedConditioner(nn.Module):  # the MADE's parameters would live outside the RealNVP
    @nn.compact
    def __call__(self, inputs):
      return RealNVP(0, conditioner=MADE(hidden_dims=(4,)))(inputs)

  with pytest.raises(ValueError, match="own child"):
    SharedConditioner().init(jax.random.key(0), tfd.MultivariateNormalDiag(jnp.zeros(3)))


@pytest.mark.slow
def test_flow_negative_log_likelihood_sharded_equals_unsharded():
  flow = Flow([RealNVP(4, hidden_dims=(16, 16)), Reverse(),
               RealNVP(0, conditioner=MADE(hidden_dims=(16,)))])
  base = tfd.MultivariateNormalDiag(jnp.zeros(8))
  y = jax.random.normal(jax.random.key(0), (16, 8))

  def loss_fn(params, y):
    return -jnp.mean(flow.apply({"params": params}, base).log_prob(y))

  init = lambda k: randomize(flow.init(k, y)["params"], k)
  params = init(jax.random.key(1))
  ref_loss, ref_grads = jax.jit(jax.value_and_grad(loss_fn))(params, y)
  partitioner = Partitioner(data=2, model=4, rules="fsdp_tp")
  boxed_init = lambda k: jax.tree.map(
      lambda box, v: box.replace_boxed(v), flow.init(k, y)["params"], init(k),
      is_leaf=lambda b: isinstance(b, nn.LogicallyPartitioned))
  sharded, shardings = partitioner.init(boxed_init, jax.random.key(1))
  batch = NamedSharding(partitioner.mesh, partitioner.batch_spec)
  with partitioner.activation_rules():
    step = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(shardings, batch),
                   out_shardings=(None, shardings))
    loss, grads = step(sharded, y)
  assert any(len(s.spec) and any(a is not None for a in s.spec)
             for s in jax.tree.leaves(shardings))                   # something is split
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
