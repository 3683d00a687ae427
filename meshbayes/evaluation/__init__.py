"""Evaluation: quality, calibration and uncertainty of a trained run's predictions.

``driver.evaluate`` is what ``python -m meshbayes.eval`` runs, with its ``settings``;
``methods`` turns trained runs into posteriors; ``predictives`` says which predictives are
measured (token calibration; ``temperature`` fits their temperatures), ``decoding`` decodes
and scores with them, each optional decode pass in ``decode_passes`` (teacher-forced
metrics are ``meshbayes.training.teacher_forced``'s); ``context`` restores a run as its
method's posterior, for eval and infer alike; ``sources``, ``items``, ``ood``, ``phases``
and ``writer`` the items, their figures, progress and results; ``token_arrays`` a task's
splits as token arrays for a device without seqio (decode there, score here). Measures
and their names: ``meshbayes.metrics.measures``.
"""

from meshbayes.evaluation.driver import evaluate
from meshbayes.evaluation.settings import DecodeConfig, OodConfig, PredictiveConfig, ReportConfig
from meshbayes.training.teacher_forced import teacher_forced_metrics

__all__ = ["DecodeConfig", "OodConfig", "PredictiveConfig", "ReportConfig", "evaluate",
           "teacher_forced_metrics"]
