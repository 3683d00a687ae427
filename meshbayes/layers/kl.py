"""Where layers record their KL divergence, and how a loss must scale it.

Each Bayesian layer sows its KL (summed over its weights, float32, once per
layer per ``apply``) as ``KL_NAME`` in ``KL_COLLECTION`` when that collection is
mutable; ``total_kl`` sums a model's. The loss adds ``kl_penalty(kl, D)``, ``D``
the training set's units the NLL averages over (tokens or examples), never the batch size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import traverse_util

Array = jax.Array

KL_COLLECTION = "losses"
KL_NAME = "kl"


def total_kl(state: Mapping[str, Any]) -> Array:
  """The sum of every KL recorded in ``state``.

  Args:
    state: the mutated collections returned by
      ``apply(..., mutable=[KL_COLLECTION])`` (or a full variables dict).
      Values stacked by ``nn.scan`` are summed too.

  Returns:
    A float32 scalar; 0 when nothing was recorded.
  """
  collection = state.get(KL_COLLECTION, {})
  values = [jnp.sum(jnp.asarray(v, jnp.float32))
            for path, v in traverse_util.flatten_dict(collection).items()
            if path[-1] == KL_NAME]
  return sum(values, jnp.zeros((), jnp.float32))


def kl_penalty(kl: Array, num_train_units: float, kl_weight: float | Array = 1.0) -> Array:
  """The KL term of the per-unit negative ELBO: ``kl_weight * kl / num_train_units``.

  Args:
    kl: total KL of the model's posterior (``total_kl``).
    num_train_units: number of units (tokens or examples, as the NLL is
      averaged) in the whole training set.
    kl_weight: annealing or tempering weight; 1 is the ELBO.

  Returns:
    The term to add to the batch-mean NLL.

  >>> float(kl_penalty(100.0, num_train_units=1000))
  0.1
  """
  if not num_train_units > 0:
    raise ValueError(f"kl_penalty: num_train_units={num_train_units!r} must be positive "
                     "(the size of the training set in the units the NLL is averaged over)")
  return kl_weight * kl / num_train_units
