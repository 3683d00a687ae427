"""Registers everything a run's gin files configure.

Names in gin files: ``train``, ``evaluate``, ``infer`` (the entry points),
``data.TaskData``, ``data.train_set_size``, ``optimizers.Optimizer``,
``optimizers.IVON``, ``optimizers.LearningRate``, ``optimizers.KLWeight``,
``run_configs.CheckpointConfig``, ``run_configs.EvaluationConfig``,
``run_configs.InputConfig`` (``train``'s grouped settings), ``evaluation.DecodeConfig``,
``evaluation.PredictiveConfig``, ``evaluation.OodConfig``, ``evaluation.ReportConfig``
(``evaluate``'s), and those of
``meshbayes.models.configurables`` and ``meshbayes.partitioning.configurables``.
"""

import gin

import meshbayes.models.configurables  # noqa: F401
import meshbayes.partitioning.configurables  # noqa: F401
from meshbayes import data, evaluation
from meshbayes.evaluation import inference
from meshbayes.training import optimizers, run_configs, trainer

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
