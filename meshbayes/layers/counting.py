"""Parameter counts of a model built from meshbayes layers, read off parameter names."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
from flax import linen as nn

from meshbayes.layers.variational import posterior_part


@dataclasses.dataclass(frozen=True)
class ParameterCounts:
  """Element counts of a parameter tree.

  Attributes:
    total: every element: posterior means and scales (or variational
      dropout's ``*_log_sigma2``), point weights, prior
      scalars ("variational parameters" when the model is Bayesian).
    bayesian_weights: weights with a posterior (elements of ``*_loc``).
    point_weights: weights without one (the deterministic parts).
  """

  total: int
  bayesian_weights: int
  point_weights: int

  @property
  def deterministic_equivalent(self) -> int:
    """The size of the deterministic twin: one number per weight."""
    return self.bayesian_weights + self.point_weights


def count_parameters(params: Any) -> ParameterCounts:
  """Counts a (possibly boxed or abstract) parameter tree.

  >>> import jax.numpy as jnp
  >>> count_parameters({'d': {'kernel_loc': jnp.ones((2, 3)), 'kernel_scale': jnp.ones((2, 3)),
  ...                         'bias': jnp.ones(3)}})
  ParameterCounts(total=15, bayesian_weights=6, point_weights=3)
  """
  total = bayesian = point = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(nn.unbox(params))[0]:
    name, size = str(getattr(path[-1], "key", path[-1])), math.prod(leaf.shape)
    total += size
    part = posterior_part(name)
    if part and part[1] == "loc":
      bayesian += size
    elif not part and not name.endswith("_log_sigma2") and "_prior_" not in name:
      point += size
  return ParameterCounts(total, bayesian, point)
