"""Evaluation: quality, calibration and uncertainty of a trained run's predictions.

``driver.evaluate`` is what ``python -m meshbayes.eval`` runs, with its ``settings``;
``methods`` turns trained runs into posteriors; ``predictives`` holds the passes over a
split (teacher-forced metrics are ``meshbayes.training.teacher_forced``'s); ``sources``,
``items``, ``ood``,
``phases`` and ``writer`` the items, their figures, progress and results. Measures and
their names: ``meshbayes.metrics.measures``.
"""

from meshbayes.evaluation.driver import evaluate
from meshbayes.evaluation.settings import DecodeConfig, OodConfig, PredictiveConfig, ReportConfig
from meshbayes.training.teacher_forced import teacher_forced_metrics

__all__ = ["DecodeConfig", "OodConfig", "PredictiveConfig", "ReportConfig", "evaluate",
           "teacher_forced_metrics"]
