"""Helpers shared by the layer tests."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util
from jax.sharding import NamedSharding

from meshbayes import layers
from meshbayes.layers import softplus_inverse
from meshbayes.partitioning import Partitioner

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
