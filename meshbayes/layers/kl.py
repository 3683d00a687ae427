"""Where layers record their KL divergence, and how a loss must scale it.

Every Bayesian layer computes the KL divergence of its posterior from its
prior (summed over all of its weights, in float32) and records it with
``self.sow(KL_COLLECTION, KL_NAME, kl)``. The layer records one value per
layer however often it is called in one ``apply``: the KL belongs to the
weights, not to the call. It is computed only when the collection is mutable::

  outputs, state = model.apply(variables, x, rngs={'sample': key},
                               mutable=[KL_COLLECTION])
  kl = total_kl(state)

How to scale it (the negative ELBO per unit of data):
  For a training set of ``D`` units the negative ELBO is
  ``sum_d NLL_d + KL``. A minibatch estimate of it per unit is::

    loss = mean NLL over the batch's units + kl_weight * KL / D

  where the *unit* is whatever the NLL is averaged over: if the loss averages
  the NLL over target tokens, ``D`` is the number of target tokens in the
  training set (one epoch); if it averages over examples (each example's NLL
  summed over its tokens), ``D`` is the number of training examples. ``D`` is
  never the batch size or the number of steps. ``kl_weight = 1`` is the true
  ELBO; anneal it from 0 to 1 early in training, or set it below 1 for a
  tempered posterior. ``kl_penalty`` computes this term.
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
