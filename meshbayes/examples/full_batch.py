"""Full-batch Adam on a stochastic loss: the examples that fit all their data at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import optax

Array = jax.Array


def fit(loss_fn: Callable[[Any, Array], Array], params: Any, learning_rate: float,
        key: Array, steps: int) -> tuple[Any, list[float], float]:
  """``steps`` Adam steps on ``loss_fn(params, key)``, with ``fold_in(key, step)`` each step.

  Returns the parameters, the loss every 20 steps and at the last, and the seconds taken.
  """
  optimizer = optax.adam(learning_rate)

  @jax.jit
  def step(params, opt_state, index):
    loss, grads = jax.value_and_grad(loss_fn)(params, jax.random.fold_in(key, index))
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = optimizer.init(params)
  curve, start = [], time.perf_counter()
  for i in range(steps):
    params, opt_state, loss = step(params, opt_state, i)
    if i % 20 == 0 or i == steps - 1:
      curve.append(float(loss))
  return params, curve, time.perf_counter() - start
