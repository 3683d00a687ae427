"""The grouped reparameterization: one weight sample per group of the batch.

``estimators.grouped_reparameterization`` cuts the batch into ``num_groups`` equal
consecutive groups and contracts each with its own sample ``loc + stddev * eps_g``
(issue 70). Checked against brute force, against ``reparameterization`` at one group,
by its moments and correlations, its KL, its regenerated backward pass and, on a
4 x 2 mesh, by what crosses devices.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals
from jax.sharding import NamedSharding, PartitionSpec

from meshbayes import layers
from meshbayes.layers import attention, estimators
from meshbayes.layers.dense import _contract
from meshbayes.layers.variational import stddev_of_scale
from meshbayes.partitioning import Partitioner
from meshbayes.scaling import hlo
from tests.layers.fixtures import (
  Z,
  assert_moments,
  correlation,
  f64,
  one_line_error,
  randomize_posterior,
  stddev,
)

GROUPED = "grouped_reparameterization"
NUM_SAMPLES = 40_000
# The layers' linear maps: Dense's (one input axis) and DenseGeneral's over two input axes
# into two output axes, with a kernel of that shape.
CASES = {
    "dense": (functools.partial(_contract, axis=(2,), precision=None), (8, 3, 6), (6, 5)),
    "dense_general": (functools.partial(_contract, axis=(2, 3), precision=None),
                      (8, 3, 2, 4), (2, 4, 3, 5)),
}


def _posteriors(shape, seed=2):
  """A kernel posterior of ``shape`` and a bias posterior over its output axes."""
  keys = jax.random.split(jax.random.key(seed), 4)
  kernel = estimators.Normal(jax.random.normal(keys[0], shape),
                             jax.random.uniform(keys[1], shape, minval=0.2, maxval=1.0))
  features = shape[-1:] if len(shape) == 2 else shape[-2:]
  bias = estimators.Normal(jax.random.normal(keys[2], features),
                           jax.random.uniform(keys[3], features, minval=0.2, maxval=1.0))
  return kernel, bias


@pytest.mark.parametrize("num_groups", [2, 8])  # 8: the batch, one sample per example
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_each_group_is_a_dense_layer_with_its_own_sample(case, with_bias, num_groups):
  """Brute force: group ``g``'s outputs are ``contract(x_g, loc + stddev * eps_g)`` (+ its
  bias sample), ``eps`` the ``(groups, *kernel)`` draw from the kernel's split key."""
  contract, x_shape, shape = CASES[case]
  x = jax.random.normal(jax.random.key(1), x_shape)
  kernel, bias = _posteriors(shape)
  bias = bias if with_bias else None
  key = jax.random.key(0)
  y = estimators.DENSE[GROUPED](key, contract, x, kernel, bias, num_groups=num_groups)

  # The same draw, by hand: the key split as reparameterization splits it.
  key_kernel, key_bias = jax.random.split(key, 2)
  eps = estimators.standard_normal(key_kernel, (num_groups,) + shape)
  if with_bias:
    bias_eps = estimators.standard_normal(key_bias, (num_groups,) + bias.loc.shape)
  size = x_shape[0] // num_groups
  for g in range(num_groups):
    want = contract(x[g * size:(g + 1) * size], kernel.loc + kernel.stddev * eps[g])
    if with_bias:
      want = want + bias.loc + bias.stddev * bias_eps[g]
    np.testing.assert_allclose(y[g * size:(g + 1) * size], want, rtol=1e-5, atol=1e-5)
  # Different groups saw different samples.
  assert not np.allclose(y[:size], contract(x[:size], kernel.loc + kernel.stddev * eps[1]))


@pytest.mark.parametrize("shape", [(6, 5), (16, 24), (2, 4, 3, 6)])
def test_one_group_is_the_reparameterization_bit_for_bit(shape):
  """A leading group axis of 1 leaves every position's counter, hence the noise, unchanged
  (an odd last axis goes to ``jax.random.bits``: the same there too)."""
  key = jax.random.key(4)
  np.testing.assert_array_equal(estimators.standard_normal(key, (1,) + shape)[0],
                                estimators.standard_normal(key, shape))
  contract = functools.partial(_contract, axis=(2,) if len(shape) == 2 else (2, 3),
                               precision=None)
  x = jax.random.normal(jax.random.key(1), (4, 3) + shape[:-1 if len(shape) == 2 else -2])
  kernel, bias = _posteriors(shape)
  for table in (estimators.STORED["DENSE"], estimators.DENSE):
    grouped = table[GROUPED](key, contract, x, kernel, bias, num_groups=1)
    np.testing.assert_array_equal(grouped, table["reparameterization"](key, contract, x, kernel,
                                                                       bias))


@pytest.mark.parametrize("family", ["dense", "dense_general", "attention"])
def test_one_group_layers_are_the_reparameterization_layers_bit_for_bit(family):
  """By name, with the same parameters and rng: Dense (a Bayesian bias, bfloat16 noise
  setting, which reparameterizations ignore), DenseGeneral and attention's projections."""
  x = jax.random.normal(jax.random.key(0), (4, 5, 6))
  make = {
      "dense": lambda e: layers.dense_class(e)(7, bayesian_bias=True, noise_dtype="bfloat16"),
      "dense_general": lambda e: layers.dense_general_class(e)(features=(2, 3)),
      "attention": lambda e: attention.attention_class(e)(num_heads=2, bayesian_bias=True),
  }[family]
  params = make(GROUPED).init(jax.random.key(1), x)["params"]
  run = lambda e: make(e).apply({"params": params}, x, rngs={"sample": jax.random.key(2)})
  np.testing.assert_array_equal(run(GROUPED), run("reparameterization"))


def test_moments_and_correlations_over_draws():
  """4 examples in 2 groups. Each output has mean ``x @ loc + b_loc`` and variance
  ``(x * x) @ stddev^2 + b_stddev^2`` (``assert_moments``: Z = 4.5 standard errors); at
  positions 0 and 1 every example has the same input: the two examples of a group give
  identical outputs (correlation 1), examples of different groups uncorrelated outputs
  (|correlation| < Z / sqrt(N), 2.2%)."""
  layer = layers.DenseGroupedReparameterization(features=4, bayesian_bias=True,
                                                num_weight_groups=2)
  same = jnp.broadcast_to(jax.random.normal(jax.random.key(0), (6,)), (4, 2, 6))
  x = jnp.concatenate([same, jax.random.normal(jax.random.key(1), (4, 1, 6))], axis=1)
  params = randomize_posterior(layer.init(jax.random.key(0), x)["params"], jax.random.key(2))
  apply = lambda k: layer.apply({"params": params}, x, rngs={"sample": k})
  samples = f64(jax.vmap(apply)(jax.random.split(jax.random.key(3), NUM_SAMPLES)))

  mean = f64(x) @ f64(params["kernel_loc"]) + f64(params["bias_loc"])
  var = f64(x) ** 2 @ f64(stddev(params["kernel_scale"])) ** 2 + f64(
      stddev(params["bias_scale"])) ** 2
  assert_moments(samples, mean, var)
  np.testing.assert_array_equal(samples[:, 0, 0], samples[:, 1, 1])  # one group
  np.testing.assert_array_equal(samples[:, 2, 0], samples[:, 3, 1])
  for a, b in ((0, 2), (1, 3), (0, 3)):  # two groups
    assert np.abs(correlation(samples[:, a, 0], samples[:, b, 1])).max() < Z / math.sqrt(
        NUM_SAMPLES)


def test_the_kl_is_the_other_estimators():
  """The same posterior, the same KL: the estimator changes the sampling alone."""
  x = jnp.ones((4, 6))
  make = lambda e: layers.dense_class(e)(5, bayesian_bias=True,
                                         num_weight_groups=4 if e == GROUPED else 1)
  params = make(GROUPED).init(jax.random.key(0), x)["params"]
  kls = {}
  for e in (GROUPED, "reparameterization", "flipout", "local_reparameterization"):
    _, state = make(e).apply({"params": params}, x, rngs={"sample": jax.random.key(1)},
                             mutable=[layers.KL_COLLECTION])
    kls[e] = float(layers.total_kl(state))
  assert kls[GROUPED] > 0 and len(set(kls.values())) == 1, kls


def _floating_residuals(fn, *args):
  """Shapes of the floating values the backward pass of ``fn`` keeps, besides its arguments."""
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    print_saved_residuals(fn, *args)  # one "shape source" line per residual
  residuals = [line.split(" ", 1) for line in printed.getvalue().splitlines() if line.strip()]
  return [shape for shape, source in residuals
          if not source.startswith("from the argument") and shape.startswith(("f32", "bf16"))]


def test_regenerated_keeps_no_noise_and_gives_the_stored_gradients():
  """Regenerated (the layers' table), the backward pass keeps no floating value but the
  arguments (stored: the samples); outputs and gradients equal the stored estimator's."""
  contract = functools.partial(_contract, axis=(2,), precision=None)
  x = jax.random.normal(jax.random.key(1), (8, 3, 16))
  loc = jax.random.normal(jax.random.key(2), (16, 24)) * 0.3
  scale = jax.random.normal(jax.random.key(3), (16, 24)) - 1.0
  bias = (jnp.full((24,), 0.1), jnp.full((24,), -2.0))

  def loss(estimator, x, loc, scale, bias_loc, bias_scale):
    kernel = estimators.Normal(loc, stddev_of_scale(scale), scale)
    b = estimators.Normal(bias_loc, stddev_of_scale(bias_scale), bias_scale)
    y = estimator(jax.random.key(0), contract, x, kernel, b, num_groups=4)
    return jnp.sum(jnp.sin(3.0 * y)), y

  stored, regenerated = estimators.STORED["DENSE"][GROUPED], estimators.DENSE[GROUPED]
  args = (x, loc, scale, *bias)
  value = lambda f: lambda *a: jnp.sum(loss(f, *a)[1])  # linear: keeps nothing itself
  assert _floating_residuals(value(regenerated), *args) == []
  assert "f32[4,16,24]" in _floating_residuals(value(stored), *args)
  grad = lambda f: jax.jit(jax.grad(lambda *a: loss(f, *a), argnums=range(5), has_aux=True))
  (ref, y_ref), (new, y_new) = grad(stored)(*args), grad(regenerated)(*args)
  np.testing.assert_allclose(y_new, y_ref, rtol=1e-6, atol=1e-7)
  for got, want in zip(new, ref):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _step(cls, partitioner=None, **options):
  """A Dense layer's loss (``sum(sin(y))`` plus its KL), outputs and gradients; with a
  partitioner, on its mesh, with the program's collectives."""
  model = cls(64, kernel_axes=("embed", "mlp"), bias_axes=("mlp",), **options)
  x = jax.random.normal(jax.random.key(0), (16, 32))

  def loss_fn(params, x, key):
    y, state = model.apply({"params": params}, x, rngs={"sample": key},
                           mutable=[layers.KL_COLLECTION])
    return jnp.sum(jnp.sin(y)) + layers.kl_penalty(layers.total_kl(state), 1000), y

  init = lambda k: model.init(k, x)["params"]
  step = jax.value_and_grad(loss_fn, has_aux=True)
  if partitioner is None:
    return jax.jit(step)(nn.unbox(init(jax.random.key(2))), x, jax.random.key(3)), None
  params, shardings = partitioner.init(init, jax.random.key(2))
  batch = NamedSharding(partitioner.mesh, partitioner.batch_spec)
  outputs = NamedSharding(partitioner.mesh, PartitionSpec("data", "model"))  # as computed
  with partitioner.activation_rules():
    program = jax.jit(step, in_shardings=(shardings, batch, None),
                      out_shardings=((None, outputs), shardings))
    compiled = program.lower(params, x, jax.random.key(3)).compile()
    census = hlo.analyze(compiled.as_text()).collectives
    return compiled(params, x, jax.random.key(3)), {
        kind: c.bytes for kind, c in census.items() if c.count}


def test_on_a_mesh_each_group_samples_where_its_data_is():
  """data=4 x model=2, the batch on 'data', the kernel's outputs on 'model'. With 4 groups
  (one per data shard) and 8 (two per shard) outputs and gradients equal the unsharded
  program's, and the forward and backward program communicates only the gradients'
  all-reduce: no sample and no input moves. Its bytes are local reparameterization's
  (and Flipout's): reparameterization's plus one kernel shard (32 x 32 float32, 4096
  bytes), the scale's gradient, which reparameterization derives from the one reduced
  weight gradient because its noise is shared, and every other estimator reduces apart."""
  partitioner = Partitioner(data=4, model=2, rules="megatron")
  _, reparameterization = _step(layers.DenseReparameterization, partitioner)
  _, local = _step(layers.DenseLocalReparameterization, partitioner)
  assert list(reparameterization) == list(local) == ["all-reduce"]
  assert local["all-reduce"] == reparameterization["all-reduce"] + 32 * 32 * 4
  for groups in (4, 8):
    ((loss, y), grads), census = _step(layers.DenseGroupedReparameterization, partitioner,
                                       num_weight_groups=groups)
    assert census == local, (groups, census, local)
    ((ref_loss, ref_y), ref_grads), _ = _step(layers.DenseGroupedReparameterization,
                                              num_weight_groups=groups)
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)  # a sum in another order
    for (path, grad), ref in zip(jax.tree_util.tree_flatten_with_path(grads)[0],
                                 jax.tree.leaves(ref_grads)):
      np.testing.assert_allclose(grad, ref, rtol=1e-5, atol=1e-6, err_msg=str(path))


def test_bad_group_counts_are_one_line_errors():
  x = jnp.ones((4, 3))
  grouped = lambda groups: layers.DenseGroupedReparameterization(2, num_weight_groups=groups)
  for bad in (0, -1, 2.0, True):
    one_line_error(rf"DenseGroupedReparameterization None: num_weight_groups={bad!r} must be "
                   "a positive int", grouped(bad).init, jax.random.key(0), x)
  one_line_error(r"num_weight_groups=3 does not divide the batch of 4 examples \(inputs "
                 r"\(4, 3\)\); use a divisor of it", grouped(3).init, jax.random.key(0), x)
  one_line_error(r"DenseFlipout None: num_weight_groups=2 needs the grouped "
                 r"reparameterization; estimator 'flipout' takes only 1",
                 layers.DenseFlipout(2, num_weight_groups=2).init, jax.random.key(0), x)
  kernel = estimators.Normal(jnp.zeros((3, 2)), jnp.ones((3, 2)))
  one_line_error(r"grouped_reparameterization: num_groups=3 must be a positive int that "
                 r"divides the batch of 4 examples", estimators.grouped_reparameterization,
                 jax.random.key(0), jnp.matmul, x, kernel, num_groups=3)
  one_line_error(r"dense_class: estimator='grouped' is not one of deterministic, "
                 r"reparameterization, flipout, local_reparameterization, "
                 r"grouped_reparameterization", layers.dense_class, "grouped")
