"""The cross-entropy method (CEM) over action sequences, as PlaNet plans.

A Gaussian over sequences of ``horizon`` actions in ``[-1, 1]`` starts at mean 0, stddev 1;
each iteration scores ``candidates`` clipped samples with the objective and refits the
mean and stddev to the ``top_k`` best. The plan is the final mean; an agent executes its
first action and plans again at the next step (model-predictive control).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

Array = jax.Array


def cem(objective: Callable[[Array, Array], Array], key: Array, *, horizon: int,
        action_dim: int, iterations: int, candidates: int, top_k: int) -> Array:
  """The action sequence ``(horizon, action_dim)`` CEM finds for ``objective``.

  Args:
    objective: ``(actions (candidates, horizon, action_dim), key) -> scores (candidates,)``,
      higher is better.
    key: PRNG key of the samples (and of the objective's own noise).
    horizon, action_dim: the plan's shape.
    iterations, candidates, top_k: CEM's refits, samples per refit and elite size.

  Returns:
    The final mean, in ``[-1, 1]``.
  """
  if not 1 <= top_k <= candidates:
    raise ValueError(f"cem: top_k={top_k} must be in [1, candidates={candidates}]")

  def refit(i, belief):
    mean, stddev = belief
    key_sample, key_objective = jax.random.split(jax.random.fold_in(key, i))
    noise = jax.random.normal(key_sample, (candidates, horizon, action_dim))
    actions = jnp.clip(mean + stddev * noise, -1.0, 1.0)
    scores = objective(actions, key_objective)
    _, elite = jax.lax.top_k(scores, top_k)
    best = actions[elite]
    return best.mean(axis=0), best.std(axis=0)

  initial = (jnp.zeros((horizon, action_dim)), jnp.ones((horizon, action_dim)))
  mean, _ = jax.lax.fori_loop(0, iterations, refit, initial)
  return mean
