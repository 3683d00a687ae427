"""Evaluation metrics: calibration, BLEU, OOD AUROC and reliability diagrams.

Pure functions without TensorFlow. The calibration definitions are stated in
``meshbayes.metrics.calibration``; matplotlib is imported only when a
reliability diagram is drawn.
"""

from meshbayes.metrics.bleu import BleuResult, bleu, corpus_bleu, sentence_bleu, sentence_bleus
from meshbayes.metrics.calibration import (
    DEFAULT_NUM_BINS,
    bin_indices,
    expected_calibration_error,
    reliability_bins,
    sequence_calibration_error,
    sequence_reliability_bins,
    sum_statistics,
    token_calibration_metrics,
    token_calibration_statistics,
)
from meshbayes.metrics.ood import auroc, fpr_at_tpr
from meshbayes.metrics.reliability import plot_reliability, plot_token_and_sequence_reliability

__all__ = [
    "DEFAULT_NUM_BINS",
    "BleuResult",
    "auroc",
    "fpr_at_tpr",
    "bin_indices",
    "bleu",
    "corpus_bleu",
    "expected_calibration_error",
    "plot_reliability",
    "plot_token_and_sequence_reliability",
    "reliability_bins",
    "sentence_bleu",
    "sentence_bleus",
    "sequence_calibration_error",
    "sequence_reliability_bins",
    "sum_statistics",
    "token_calibration_metrics",
    "token_calibration_statistics",
]
