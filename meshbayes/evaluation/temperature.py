"""Temperature scaling (Guo et al., 2017): the temperature of a predictive distribution
fitted by teacher-forced NLL over a split (``fit_temperature``)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from meshbayes.evaluation.decoding import Batch, batch_sharding
from meshbayes.models.base import BaseModel
from meshbayes.partitioning import Partitioner

if TYPE_CHECKING:
  from meshbayes.evaluation.predictives import Predictive

# Temperatures tried by fit_temperature: log-spaced over [1/8, 8], 14% apart.
TEMPERATURE_GRID = tuple(np.exp(np.linspace(np.log(0.125), np.log(8.0), 33)).tolist())


def fit_temperature(model: BaseModel, params: Any, batches: Iterable[Batch],
                    partitioner: Partitioner, predictive: Predictive, rng: jax.Array,
                    grid: Sequence[float] = TEMPERATURE_GRID) -> tuple[float, dict[str, Any]]:
  """Temperature scaling (Guo et al., 2017): the ``T`` minimizing the teacher-forced NLL
  per token of ``predictive``'s distribution ``p^(1/T)`` over ``batches``.

  The NLL of every ``T`` of ``grid`` is summed in one pass; a parabola through
  the best grid point and its neighbours (in ``log T``) refines it.

  Returns:
    ``(T, {'grid': [...], 'nll': [...], 'nll_at_1': ...})``.
  """
  param_shardings = jax.tree.map(lambda x: x.sharding, params)
  temperatures = jnp.asarray(grid, jnp.float32)

  @functools.partial(jax.jit, in_shardings=(param_shardings, batch_sharding(partitioner),
                                            None))
  def nll_sums(params, batch, rng):
    _, aux = model.score_batch(params, batch, rng, num_samples=predictive.num_samples,
                               return_log_probs=True)
    weights = batch["decoder_loss_weights"].astype(jnp.float32)
    return (temperature_nll_sums(aux["log_probs"], batch["decoder_target_tokens"], weights,
                                 temperatures), jnp.sum(weights))

  totals, tokens = np.zeros(len(grid)), 0.0
  with partitioner.activation_rules():
    for i, batch in enumerate(batches):
      sums, count = jax.device_get(nll_sums(params, partitioner.global_batch(batch),
                                            jax.random.fold_in(rng, i)))
      totals, tokens = totals + sums, tokens + float(count)
  nll = totals / max(tokens, 1.0)
  return best_temperature(grid, nll), {
      "grid": list(grid), "nll": nll.tolist(), "tokens": tokens,
      "nll_at_1": float(np.interp(0.0, np.log(grid), nll)),
      "at_grid_edge": int(np.argmin(nll)) in (0, len(grid) - 1)}


def temperature_nll_sums(log_probs: jax.Array, targets: jax.Array, weights: jax.Array,
                         temperatures: jax.Array) -> jax.Array:
  """``[len(temperatures)]`` summed NLLs of ``targets`` under ``softmax(log_probs / T)``."""
  def nll(temperature):
    scaled = jax.nn.log_softmax(log_probs / temperature)
    return -jnp.sum(jnp.take_along_axis(scaled, targets[..., None], -1)[..., 0] * weights)
  return jax.lax.map(nll, temperatures)


def best_temperature(grid: Sequence[float], nll: Sequence[float]) -> float:
  """The grid's best temperature, refined by the vertex of the parabola (in ``log T``)
  through it and its two neighbours."""
  nll = np.asarray(nll, np.float64)
  best = int(np.argmin(nll))
  if not 0 < best < len(grid) - 1:
    return float(grid[best])
  x, y = np.log(np.asarray(grid[best - 1:best + 2], np.float64)), nll[best - 1:best + 2]
  a, b, _ = np.polyfit(x, y, 2)
  return float(np.exp(np.clip(-b / (2 * a), x[0], x[2]))) if a > 0 else float(grid[best])
