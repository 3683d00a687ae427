"""Evaluation: quality, calibration and uncertainty of a trained run's predictions.

- ``driver``: ``evaluate``, what ``python -m meshbayes.eval`` runs, and its grouped
  ``settings`` (``DecodeConfig``, ``PredictiveConfig``, ``OodConfig``, ``ReportConfig``);
- ``methods``: the registry of predictive methods (how trained runs become the
  posterior a predictive reads: as trained, MC dropout, a deep ensemble, Laplace);
- ``predictives``: the passes over a split (token calibration, a temperature, decoding
  and scoring under a predictive); ``teacher_forced``: the metrics the trainer reports;
- ``sources``: the split's pairs grouped by source; ``items``: the per-source figures,
  their bootstrap intervals and paired differences, the files of items; ``ood``: the
  out-of-distribution sets; ``phases``: the passes' progress; ``writer``: the results.

Measures and their names are ``meshbayes.metrics.measures``'.
"""

from meshbayes.evaluation.driver import evaluate
from meshbayes.evaluation.settings import DecodeConfig, OodConfig, PredictiveConfig, ReportConfig
from meshbayes.evaluation.teacher_forced import teacher_forced_metrics

__all__ = ["DecodeConfig", "OodConfig", "PredictiveConfig", "ReportConfig", "evaluate",
           "teacher_forced_metrics"]
