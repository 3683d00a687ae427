"""Teacher-forced metrics over batches, weighted by their target tokens: what the trainer's
periodic validation and an evaluation report for the posterior mean."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

from meshbayes.partitioning import Partitioner


def teacher_forced_metrics(eval_fn, params: Any, batches: Iterable[dict[str, np.ndarray]],
                           partitioner: Partitioner, rng: jax.Array | None = None
                           ) -> dict[str, float]:
  """``eval_fn``'s metrics over ``batches``, weighted by their target tokens.

  ``eval_fn(params, batch)``, or ``eval_fn(params, batch, key)`` with a key per
  batch folded from ``rng``.
  """
  totals: dict[str, float] = {}
  num_tokens = 0.0
  with partitioner.activation_rules():
    for i, batch in enumerate(batches):
      keys = () if rng is None else (jax.random.fold_in(rng, i),)
      metrics = jax.device_get(eval_fn(params, partitioner.global_batch(batch), *keys))
      tokens = float(metrics["num_tokens"])
      for name, value in metrics.items():
        totals[name] = totals.get(name, 0.0) + float(value) * tokens
      num_tokens += tokens
  return {name: total / max(num_tokens, 1.0) for name, total in totals.items()
          if name != "num_tokens"} | {"num_tokens": num_tokens}
