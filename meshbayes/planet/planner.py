"""The cross-entropy method (CEM) over action sequences in ``[-1, 1]``, as PlaNet plans.

``cem`` refits a Gaussian over ``horizon``-long sequences (from mean 0, stddev 1) to the
``top_k`` best of ``candidates`` clipped samples per iteration and returns its final mean;
an agent executes its first action and plans again (model-predictive control).
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
