"""What an evaluation's passes read: the run restored as its method's posterior
(``restored``, for ``evaluate`` and ``infer`` alike) and ``EvalRun``."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from meshbayes.data.pipeline import TaskData
from meshbayes.evaluation import methods, phases
from meshbayes.evaluation.decoding import DecodeContext
from meshbayes.evaluation.predictives import Predictive
from meshbayes.evaluation.settings import PredictiveConfig
from meshbayes.models.base import BaseModel
from meshbayes.partitioning import Partitioner
from meshbayes.training.checkpoint_restore import as_trained, restore_params


def restored(model_dir: str, model: BaseModel, data: TaskData, partitioner: Partitioner,
             checkpoint_step: int | None, settings: PredictiveConfig
             ) -> tuple[BaseModel, Any, int]:
  """The run's model (its KL divisor the run's) and its method's posterior
  (``settings.method_name``: ``methods.get(name).build``; None: the run as trained), and
  the step."""
  params, step = restore_params(model_dir, model, data, partitioner, checkpoint_step)
  trained = as_trained(model, data, model_dir, checkpoint_step)
  if settings.method_name is None:
    return trained, params, step
  inputs = methods.MethodInputs(
      str(model_dir), settings.num_samples, settings.ensemble_dirs,
      restore=lambda d: restore_params(d, trained, data, partitioner)[0],
      context=methods.EvalContext(data, partitioner, settings.seed))
  model, params = methods.get(settings.method_name).build(trained, params, inputs)
  return model, params, step


@dataclasses.dataclass(frozen=True)
class EvalRun:
  """What every pass of one evaluation reads: the model and its posterior, the data, the
  mesh, the key of samples, the passes' progress."""

  model: BaseModel
  params: Any
  data: TaskData
  partitioner: Partitioner
  rng: jax.Array
  progress: phases.EvalPhases

  def decoding(self, predictive: Predictive, **options: Any) -> DecodeContext:
    """The ``DecodeContext`` of ``predictive`` on this run's data, decoding with
    ``options`` (``method``, ``beam_size``)."""
    return DecodeContext(self.model, self.params, self.partitioner, predictive, self.rng,
                         self.data.feature_lengths["targets"], self.data.vocabulary.eos_id,
                         options)
