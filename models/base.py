"""The model interface the trainer, checkpoints and evaluation use (T5X's ``BaseModel``).

A new model implements these methods and needs no trainer change. Batches are dicts of
arrays. The loss is stated as sums over loss units (``loss_sums``) and the metrics as a
function of them (``metrics_from_sums``), so microbatches' sums add up to the whole batch's.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array
Batch = Mapping[str, Array]
Metrics = dict[str, Array]
Sums = dict[str, Array]

LOSS = "loss"  # in sums: the loss summed over the loss units; in metrics: their mean
NUM_LOSS_UNITS = "num_loss_units"  # in sums: how many units the loss averages over


def per_loss_unit(total: Any, sums: Sums) -> Any:
  """``total`` (an array or a pytree) divided by the number of loss units of ``sums``.

  A batch without loss units (all padding) counts as one, so its mean is 0, not NaN.
  """
  units = jnp.maximum(sums[NUM_LOSS_UNITS], 1.0)
  return jax.tree.map(lambda x: x / units, total)


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
  def loss_sums(self, params: Any, batch: Batch, rng: Array, kl_weight: float | Array = 1.0
                ) -> Sums:
    """The training loss and its metrics' statistics, as float32 sums over the batch.

    Every entry adds up over a split of the batch into parts: the whole
    batch's sums are the parts' sums. ``sums[LOSS]`` is the loss summed over
    the loss units (a term per batch, such as the KL, enters once per unit at
    its per-unit share), ``sums[NUM_LOSS_UNITS]`` the number of units.

    Args:
      params: the parameters (unboxed).
      batch: a training batch.
      rng: PRNG key for this step; split into ``'dropout'`` and ``'sample'``.
      kl_weight: weight of the KL term (annealing schedules set it per step).
    """

  @abc.abstractmethod
  def metrics_from_sums(self, sums: Sums) -> Metrics:
    """The metrics of the batch whose ``loss_sums`` are ``sums``.

    ``metrics[LOSS]`` is the loss, ``per_loss_unit(sums[LOSS], sums)``.
    """

  def loss_fn(self, params: Any, batch: Batch, rng: Array, kl_weight: float | Array = 1.0
              ) -> tuple[Array, Metrics]:
    """The training loss per loss unit (for a Bayesian model the negative ELBO) and its metrics.

    Args: as ``loss_sums``.
    """
    sums = self.loss_sums(params, batch, rng, kl_weight)
    return per_loss_unit(sums[LOSS], sums), self.metrics_from_sums(sums)

  @abc.abstractmethod
  def eval_fn(self, params: Any, batch: Batch, rng: Array | None = None, num_samples: int = 0
              ) -> tuple[Array, Metrics]:
    """Teacher-forced evaluation loss and metrics (no dropout); with ``num_samples``
    weight samples from ``rng``, also the Monte Carlo ELBO of a model with a posterior."""

  @abc.abstractmethod
  def score_batch(self, params: Any, batch: Batch, rng: Array | None = None,
                  num_samples: int = 0, return_log_probs: bool = False,
                  calibration_temperature: float | Array = 1.0
                  ) -> tuple[Array, dict[str, Array]]:
    """Log-probability of each batch example's targets, and per-token details.

    Args:
      num_samples: 0 for the posterior mean, else average the predictive
        probabilities of that many posterior samples (needs ``rng``).
      return_log_probs: also return the whole predictive distribution
        (``aux['log_probs']``), e.g. for calibration.
      calibration_temperature: ``T`` of temperature scaling (a float or a
        traced scalar, so one compiled program serves every ``T``): the
        predictive distribution ``p`` becomes ``p^(1/T)``, renormalized.
    """

  @abc.abstractmethod
  def predict_batch_with_aux(self, params: Any, batch: Batch, rng: Array | None = None,
                             **decode_kwargs: Any) -> tuple[Array, dict[str, Array]]:
    """Decoded outputs and auxiliary values (scores, per-token probabilities).

    With ``num_samples=S`` the weight samples are those ``score_batch`` draws
    from the same ``rng``, so an output is scored under the posterior samples
    that produced it.
    """
