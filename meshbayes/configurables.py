"""Registers everything a run's gin files configure.

The entry points ``train``, ``evaluate`` and ``infer``, the settings of ``data``,
``optimizers``, ``run_configs`` and ``evaluation``, and those of
``meshbayes.models.configurables`` and ``meshbayes.partitioning.configurables``
(every one, with its parameters: docs/configuration.md).
"""

import gin

import meshbayes.models.configurables  # noqa: F401
import meshbayes.partitioning.configurables  # noqa: F401
from meshbayes import data, evaluation
from meshbayes.evaluation import inference
from meshbayes.runtime import gin_preflight
from meshbayes.training import optimizers, run_configs, trainer

# Every gin parse after this import, not only the launcher's: a runs/ output folder on
# sys.path must not stop gin from finding runs/train.gin.
gin_preflight.safe_existence_checks()

gin.external_configurable(trainer.train, name="train")
gin.external_configurable(evaluation.evaluate, name="evaluate")
for _cls in (evaluation.DecodeConfig, evaluation.PredictiveConfig, evaluation.OodConfig,
             evaluation.ReportConfig):
  gin.external_configurable(_cls, module="evaluation")
gin.external_configurable(inference.infer, name="infer")
gin.external_configurable(data.TaskData, module="data")
gin.external_configurable(data.train_set_size, module="data")
for _cls in (optimizers.Optimizer, optimizers.IVON, optimizers.LearningRate, optimizers.KLWeight):
  gin.external_configurable(_cls, module="optimizers")
for _cls in (run_configs.CheckpointConfig, run_configs.EvaluationConfig,
             run_configs.InputConfig):
  gin.external_configurable(_cls, module="run_configs")
