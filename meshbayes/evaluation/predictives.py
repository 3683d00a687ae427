"""Which predictive distributions an evaluation measures, and their teacher-forced token
calibration.

``Predictive``: the posterior mean or a model average, optionally temperature-scaled;
``predictives`` / ``variants``: those evaluated. ``token_calibration``: teacher-forced
token calibration statistics, per example and summed. Decoding and scoring:
``evaluation.decoding`` and its passes ``evaluation.decode_passes``; temperatures:
``evaluation.temperature`` (their public names are importable from here too).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from meshbayes import metrics
from meshbayes.evaluation.decode_passes import beam_hypotheses, pairwise_bleu
from meshbayes.evaluation.decoding import (DECODE_OPTIONS, Batch, DecodeContext, Decoded,
                                           batch_sharding, decode_and_score, until_eos)
from meshbayes.evaluation.temperature import (TEMPERATURE_GRID, best_temperature,
                                              fit_temperature, temperature_nll_sums)
from meshbayes.layers import as_posterior, holds_posterior
from meshbayes.models.base import BaseModel
from meshbayes.partitioning import Partitioner

__all__ = ["DECODE_OPTIONS", "DecodeContext", "Decoded", "Predictive", "TEMPERATURE_GRID",
           "TEMPERATURE_SCALED", "beam_hypotheses", "best_temperature", "decode_and_score",
           "fit_temperature", "pairwise_bleu", "predictives", "temperature_nll_sums",
           "token_calibration", "until_eos", "variants"]

TEMPERATURE_SCALED = "_temperature_scaled"


@dataclasses.dataclass(frozen=True)
class Predictive:
  """Which predictive distribution: the posterior mean or a model average, optionally
  temperature-scaled.

  Attributes:
    name: ``posterior_mean`` or ``model_average``, with a ``_temperature_scaled``
      suffix for a fitted ``temperature``.
    num_samples: 0 (posterior mean) or ``S`` weight samples averaged.
    temperature: calibration temperature of the predictive distribution.
  """

  name: str
  num_samples: int = 0
  temperature: float = 1.0

  def __post_init__(self):
    base = self.name.removesuffix(TEMPERATURE_SCALED)
    if self.num_samples < 0 or (self.num_samples == 0) != (base == "posterior_mean") or (
        base not in ("posterior_mean", "model_average")):
      raise ValueError(f"Predictive: name={self.name!r} with num_samples={self.num_samples} "
                       "must be 'posterior_mean' with 0 or 'model_average' with S > 0")
    if not self.temperature > 0 or (self.temperature != 1.0 and base == self.name):
      raise ValueError(f"Predictive: temperature={self.temperature!r} must be positive, and "
                       f"1 unless the name ends with {TEMPERATURE_SCALED!r}")

  def temperature_scaled(self, temperature: float) -> Predictive:
    """This predictive at ``temperature``."""
    return Predictive(self.name + TEMPERATURE_SCALED, self.num_samples, temperature)


def predictives(is_bayesian: bool, num_samples: int) -> list[Predictive]:
  """The distributions to evaluate, the headline one first: the model average of
  ``num_samples`` weight samples for a Bayesian model (and its posterior mean),
  the only one for a deterministic model."""
  if is_bayesian and num_samples > 0:
    return [Predictive("model_average", num_samples), Predictive("posterior_mean")]
  return [Predictive("posterior_mean")]


def variants(model: BaseModel, params: Any, num_samples: int) -> list[Predictive]:
  """The predictives of ``params`` (a method's posterior), the headline first: a finite
  mixture's average of all its members, else ``predictives``."""
  posterior = as_posterior(params)
  if not posterior.has_mean:
    return [Predictive("model_average", posterior.num_members(num_samples))]
  return predictives(model.is_bayesian or holds_posterior(params), num_samples)


def token_calibration(model: BaseModel, params: Any, batches: Iterable[Batch],
                      partitioner: Partitioner, predictive: Predictive, rng: jax.Array,
                      num_bins: int = metrics.DEFAULT_NUM_BINS
                      ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Teacher-forced token-level calibration over ``batches``.

  Returns:
    ``(metrics.token_calibration_metrics of the whole split, per-example statistics)``:
    the statistics of ``metrics.token_calibration_statistics`` of each row of each
    batch, in order (``(rows, ...)`` each; padding rows hold zeros).
  """
  param_shardings = jax.tree.map(lambda x: x.sharding, params)

  @functools.partial(jax.jit, in_shardings=(param_shardings, batch_sharding(partitioner),
                                            None, None))
  def statistics(params, batch, rng, temperature):
    _, aux = model.score_batch(params, batch, rng, num_samples=predictive.num_samples,
                               return_log_probs=True, calibration_temperature=temperature)
    per_row = functools.partial(metrics.token_calibration_statistics, num_bins=num_bins)
    return jax.vmap(lambda *row: per_row(*(x[None] for x in row)))(
        aux["log_probs"], batch["decoder_target_tokens"],
        batch["decoder_loss_weights"].astype(jnp.float32))

  rows = []
  with partitioner.activation_rules():
    for i, batch in enumerate(batches):
      rows.append(jax.device_get(statistics(params, partitioner.global_batch(batch),
                                            jax.random.fold_in(rng, i),
                                            np.float32(predictive.temperature))))
  per_example = {k: np.concatenate([np.asarray(r[k], np.float64) for r in rows])
                 for k in rows[0]}
  return (metrics.token_calibration_metrics({k: v.sum(0) for k, v in per_example.items()}),
          per_example)
