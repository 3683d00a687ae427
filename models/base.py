"""The model interface the trainer, checkpoints and evaluation use (T5X's ``BaseModel``).

A new model implements these five methods and needs no trainer change.
Batches are dicts of arrays; metrics are dicts of float32 scalars averaged
over the batch.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import jax

Array = jax.Array
Batch = Mapping[str, Array]
Metrics = dict[str, Array]


class BaseModel(abc.ABC):
  """What a model must provide."""

  @property
  def is_bayesian(self) -> bool:
    """Whether the parameters hold a posterior to sample weights from (default: no)."""
    return False

  @abc.abstractmethod
  def get_initial_variables(self, rng: Array, input_shapes: Mapping[str, tuple[int, ...]]
                            ) -> Mapping[str, Any]:
    """Freshly initialized variables, parameters boxed with their logical axes.

    Args:
      rng: PRNG key.
      input_shapes: name -> shape of each batch feature.
    """

  @abc.abstractmethod
  def loss_fn(self, params: Any, batch: Batch, rng: Array, kl_weight: float | Array = 1.0
              ) -> tuple[Array, Metrics]:
    """The training loss (for a Bayesian model the negative ELBO) and its metrics.

    Args:
      params: the parameters (unboxed).
      batch: a training batch.
      rng: PRNG key for this step; split into ``'dropout'`` and ``'sample'``.
      kl_weight: weight of the KL term (annealing schedules set it per step).
    """

  @abc.abstractmethod
  def eval_fn(self, params: Any, batch: Batch, rng: Array | None = None
              ) -> tuple[Array, Metrics]:
    """Teacher-forced evaluation loss and metrics (no dropout)."""

  @abc.abstractmethod
  def score_batch(self, params: Any, batch: Batch, rng: Array | None = None,
                  num_samples: int = 0, return_log_probs: bool = False
                  ) -> tuple[Array, dict[str, Array]]:
    """Log-probability of each batch example's targets, and per-token details.

    Args:
      num_samples: 0 for the posterior mean, else average the predictive
        probabilities of that many posterior samples (needs ``rng``).
      return_log_probs: also return the whole predictive distribution
        (``aux['log_probs']``), e.g. for calibration.
    """

  @abc.abstractmethod
  def predict_batch_with_aux(self, params: Any, batch: Batch, rng: Array | None = None,
                             **decode_kwargs: Any) -> tuple[Array, dict[str, Array]]:
    """Decoded outputs and auxiliary values (scores, per-token probabilities)."""
