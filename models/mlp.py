"""A classifier MLP built from meshbayes layers, with logical axes on every array.

The smallest real model (the demo, partitioning tests, inspection tool): hidden kernels
alternate ``embed -> mlp`` and ``mlp -> embed`` (Megatron's column then row parallel), the
classifier is ``-> vocab``, and activations are constrained at every boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import flax.linen as nn
import jax

from meshbayes.layers import dense_class

Array = jax.Array


class MLP(nn.Module):
  """An MLP whose layers each take an estimator by name.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> model = MLP(hidden_dims=(8,), num_classes=3, estimators=('flipout', 'deterministic'))
    >>> variables = model.init(jax.random.key(0), jnp.ones((2, 4)))
    >>> sorted(variables['params']['dense_0']), sorted(variables['params']['dense_1'])
    (['bias', 'kernel_loc', 'kernel_scale'], ['bias', 'kernel'])

  Attributes:
    hidden_dims: widths of the hidden layers.
    num_classes: output classes.
    estimators: one estimator name per layer (hidden layers, then the
      classifier): ``deterministic``, ``reparameterization``, ``flipout`` or
      ``local_reparameterization``.
    activation: the hidden nonlinearity.
  """

  hidden_dims: Sequence[int] = (64, 64)
  num_classes: int = 4
  estimators: Sequence[str] = ("flipout", "local_reparameterization", "flipout")
  activation: Callable[[Array], Array] = nn.gelu

  def __post_init__(self):
    if len(self.estimators) != len(self.hidden_dims) + 1:
      raise ValueError(f"MLP: estimators={tuple(self.estimators)} must name one estimator per "
                       f"layer: {len(self.hidden_dims) + 1} for hidden_dims="
                       f"{tuple(self.hidden_dims)} plus the classifier")
    super().__post_init__()

  @nn.compact
  def __call__(self, x: Array, deterministic: bool | None = None) -> Array:
    """Logits ``(batch, num_classes)`` of inputs ``(batch, features)``."""
    dims = tuple(self.hidden_dims) + (self.num_classes,)
    axis_in = "embed"
    x = nn.with_logical_constraint(x, ("batch", axis_in))
    for i, (features, estimator) in enumerate(zip(dims, self.estimators)):
      last = i == len(dims) - 1
      axis_out = "vocab" if last else ("mlp" if axis_in == "embed" else "embed")
      layer = dense_class(estimator)(features, kernel_axes=(axis_in, axis_out),
                                     bias_axes=(axis_out,), name=f"dense_{i}")
      x = nn.with_logical_constraint(layer(x, deterministic), ("batch", axis_out))
      if not last:
        x = self.activation(x)
      axis_in = axis_out
    return x
