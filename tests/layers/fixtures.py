"""Helpers shared by the layer tests."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from meshbayes.layers import softplus_inverse

DENSE_CLASSES = ("DenseReparameterization", "DenseFlipout", "DenseLocalReparameterization")
GENERAL_CLASSES = ("DenseGeneralReparameterization", "DenseGeneralFlipout",
                   "DenseGeneralLocalReparameterization")


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
