"""The swap test: a flax model with its Dense layers replaced by Bayesian ones.

Each kernel becomes ``kernel_loc`` and ``kernel_scale`` of the deterministic
kernel's shape and logical axes; every other parameter is unchanged, whether
the axes come from a boxed initializer (flax style) or ``kernel_axes`` (T5X).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from meshbayes import layers
from tests.layers.fixtures import (
  DENSE_CLASSES,
  GENERAL_CLASSES,
  MLP,
  Attention,
  boxed,
  expected_bayesian,
  shapes_and_specs,
)


@pytest.mark.parametrize("cls_name", DENSE_CLASSES)
def test_swap_dense_for_bayesian_dense(cls_name):
  x = jnp.ones((2, 8))
  deterministic = shapes_and_specs(MLP(nn.Dense), x)
  bayesian = shapes_and_specs(MLP(getattr(layers, cls_name)), x)
  assert bayesian == expected_bayesian(deterministic)
  assert bayesian[("hidden", "kernel_scale")] == ((8, 16), P("embed", "mlp"))


@pytest.mark.parametrize("cls_name", GENERAL_CLASSES)
def test_swap_dense_general_for_bayesian_dense_general(cls_name):
  x = jnp.ones((2, 5, 8))
  deterministic = shapes_and_specs(Attention(nn.DenseGeneral), x)
  bayesian = shapes_and_specs(Attention(getattr(layers, cls_name)), x)
  assert bayesian == expected_bayesian(deterministic)
  assert bayesian[("out", "kernel_loc")] == ((2, 3, 8), P("heads", "kv", "embed"))


@pytest.mark.parametrize("cls_name", DENSE_CLASSES)
def test_t5x_style_axes_give_the_same_boxes(cls_name):
  cls = getattr(layers, cls_name)
  x = jnp.ones((2, 8))
  via_init = shapes_and_specs(
      cls(16, kernel_init=boxed(nn.initializers.lecun_normal(), "embed", "mlp"),
          bias_init=boxed(nn.initializers.zeros_init(), "mlp")), x)
  via_axes = shapes_and_specs(cls(16, kernel_axes=("embed", "mlp"), bias_axes=("mlp",)), x)
  assert via_init == via_axes
  assert via_axes[("kernel_loc",)] == ((8, 16), P("embed", "mlp"))


def test_swapped_model_runs_with_the_same_call():
  x = jax.random.normal(jax.random.key(0), (2, 8))
  for model in (MLP(nn.Dense), MLP(layers.DenseFlipout)):
    variables = model.init(jax.random.key(0), x)
    out = model.apply(variables, x, rngs={"sample": jax.random.key(1)})
    assert out.shape == (2, 4)
