"""Helpers shared by the layer tests."""

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util
from jax.sharding import NamedSharding

from meshbayes import layers
from meshbayes.layers import ESTIMATORS, estimators, softplus_inverse
from meshbayes.partitioning import Partitioner

# Sampled moments are checked within Z standard errors (tests/layers/test_estimator_moments.py).
Z = 4.5
BAYESIAN_ESTIMATORS = tuple(name for name in ESTIMATORS if name != "deterministic")


def bayesian_classes(lookup, names=ESTIMATORS) -> tuple[str, ...]:
  """The names of a layer family's Bayesian classes, one per estimator of ``names`` but
  ``'deterministic'``, from the family's lookup (``layers.dense_class``): a new estimator
  joins every test parametrized by them."""
  return tuple(lookup(name).__name__ for name in names if name != "deterministic")


DENSE_CLASSES = bayesian_classes(layers.dense_class)
GENERAL_CLASSES = bayesian_classes(layers.dense_general_class)


def randomize_posterior(params, key, stddev_range=(0.2, 1.0)):
  """Replaces every ``*_loc`` by N(0, 1) draws and every ``*_scale`` by stddevs in a range.

  Large, varied posterior stddevs make the tests sensitive to variance errors.
  """
  flat = traverse_util.flatten_dict(nn.unbox(params))
  out = {}
  for i, (path, value) in enumerate(sorted(flat.items())):
    k = jax.random.fold_in(key, i)
    if path[-1].endswith("_loc"):
      out[path] = jax.random.normal(k, value.shape, value.dtype)
    elif path[-1].endswith("_scale"):
      stddev = jax.random.uniform(k, value.shape, value.dtype, *stddev_range)
      out[path] = softplus_inverse(stddev)
    else:
      out[path] = jax.random.normal(k, value.shape, value.dtype)
  return traverse_util.unflatten_dict(out)


def stddev(scale):
  return jax.nn.softplus(jnp.asarray(scale, jnp.float32))


def boxed(init, *axes):
  return nn.with_logical_partitioning(init, axes)


class MLP(nn.Module):
  """Two Dense layers of a class given as an attribute, with flax-style boxed axes."""

  dense: Any

  @nn.compact
  def __call__(self, x):
    lecun, zeros = nn.initializers.lecun_normal(), nn.initializers.zeros_init()
    x = self.dense(16, kernel_init=boxed(lecun, "embed", "mlp"), bias_init=boxed(zeros, "mlp"),
                   name="hidden")(x)
    x = nn.relu(x)
    return self.dense(4, kernel_init=boxed(lecun, "mlp", "embed"),
                      bias_init=boxed(zeros, "embed"), name="out")(x)


def sharded_grads_equal_unsharded(model: nn.Module, x, y, rules: str = "fsdp_tp"):
  """A classifier's loss (cross-entropy + KL / 1000) and gradients on a 2x4 (data, model)
  mesh equal the unsharded ones; returns ``(grads, shardings)`` of the sharded step."""
  def loss_fn(params, x, y, key):
    logits, state = model.apply({"params": params}, x, rngs={"sample": key},
                                mutable=[layers.KL_COLLECTION])
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return nll + layers.kl_penalty(layers.total_kl(state), num_train_units=1000)

  init = lambda k: model.init(k, x)["params"]
  params = nn.unbox(init(jax.random.key(2)))
  ref_loss, ref_grads = jax.jit(jax.value_and_grad(loss_fn))(params, x, y, jax.random.key(3))
  partitioner = Partitioner(data=2, model=4, rules=rules)
  sharded, shardings = partitioner.init(init, jax.random.key(2))
  batch = NamedSharding(partitioner.mesh, partitioner.batch_spec)
  with partitioner.activation_rules():
    step = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(shardings, batch, batch, None),
                   out_shardings=(None, shardings))
    loss, grads = step(sharded, x, y, jax.random.key(3))
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for (path, grad), ref in zip(jax.tree_util.tree_flatten_with_path(grads)[0],
                               jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(grad, ref, rtol=1e-5, atol=1e-6, err_msg=str(path))
  return grads, shardings


def one_line_error(match, fn, *args, **kwargs):
  """``fn(*args, **kwargs)`` raises a ValueError matching ``match``, on one line."""
  with pytest.raises(ValueError, match=match) as info:
    fn(*args, **kwargs)
  assert "\n" not in str(info.value), str(info.value)


# Moments of sampled outputs.


def assert_moments(samples, mean, var):
  """The empirical mean of ``samples`` (draws on axis 0) within ``Z`` standard errors of
  ``mean``, and their variance within ``Z`` standard errors of a sample variance of ``var``."""
  n = samples.shape[0]
  emp_mean, emp_var = samples.mean(0), samples.var(0, ddof=1)
  z_mean = np.abs(emp_mean - mean) / np.sqrt(var / n)
  rel_var = np.abs(emp_var / var - 1.0)
  print(f"N={n}: max |mean error| {z_mean.max():.2f} standard errors, "
        f"max |variance error| {rel_var.max():.2%}")
  assert z_mean.max() < Z, f"mean off by {z_mean.max():.2f} standard errors"
  assert rel_var.max() < Z * math.sqrt(2.0 / (n - 1)), f"variance off by {rel_var.max():.2%}"


def f64(x):
  """``x`` in float64, for the analytic moments."""
  return np.asarray(x, np.float64)


def correlation(a, b):
  """The empirical correlation of ``a`` and ``b`` (draws on axis 0), elementwise."""
  a, b = a - a.mean(0), b - b.mean(0)
  return (a * b).mean(0) / np.sqrt((a * a).mean(0) * (b * b).mean(0))


# Dense layers swapped for Bayesian ones.


class Attention(nn.Module):
  """Query and output projections, multi-axis kernels as in a Transformer."""

  dense_general: Any

  @nn.compact
  def __call__(self, x):
    init = nn.initializers.lecun_normal()
    q = self.dense_general(features=(2, 3), use_bias=False,
                           kernel_init=boxed(init, "embed", "heads", "kv"), name="query")(x)
    return self.dense_general(features=x.shape[-1], axis=(-2, -1), use_bias=False,
                              kernel_init=boxed(init, "heads", "kv", "embed"), name="out")(q)


def shapes_and_specs(model, x):
  """``{parameter path: (shape, logical partition spec)}`` of ``model`` on ``x``."""
  variables = model.init(jax.random.key(0), x)
  specs = traverse_util.flatten_dict(nn.get_partition_spec(variables)["params"])
  shapes = traverse_util.flatten_dict(jax.tree.map(jnp.shape, nn.unbox(variables["params"])))
  return {path: (shapes[path], specs[path]) for path in shapes}


def expected_bayesian(deterministic):
  """``shapes_and_specs`` of a deterministic model as its Bayesian swap should have them:
  each ``kernel`` as ``kernel_loc`` and ``kernel_scale``, every other parameter unchanged."""
  out = {}
  for path, value in deterministic.items():
    if path[-1] == "kernel":
      out[path[:-1] + ("kernel_loc",)] = value
      out[path[:-1] + ("kernel_scale",)] = value
    else:
      out[path] = value
  return out


def storing_noise():
  """The layers use the estimators as they are, keeping what autodiff keeps."""
  return estimators.swapped(estimators.STORED)
