"""The least a ``checkpoint_restore.restore_params`` call needs besides a checkpoint: a model
whose initial parameters have the saved shapes, a task with a vocabulary, one device."""

import jax
import jax.numpy as jnp

from meshbayes.training import checkpoint_restore


class Model:
  """``params``' shapes and dtypes as a model's initial variables."""

  def __init__(self, params):
    self.params = params

  def get_initial_variables(self, key, shapes):
    del key, shapes
    return {"params": jax.tree.map(jnp.zeros_like, self.params)}


class Data:
  vocabulary = type("Vocabulary", (), {"vocab_size": 32})()

  def input_shapes(self):
    return {}


class OneDevice:
  def placed(self, tree):
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), tree)


def restore(model_dir, params, step=None):
  """``restore_params`` of ``model_dir`` for a model of ``params``' shapes, on one device."""
  return checkpoint_restore.restore_params(model_dir, Model(params), Data(), OneDevice(), step)
