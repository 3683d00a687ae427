"""Evaluation metrics: calibration, BLEU, OOD detection, error detection, bootstrap intervals,
reliability diagrams, and the registry of measure names (``measures``).

Pure functions without TensorFlow; matplotlib is imported only when a diagram is drawn.
How each measure is computed: docs/measures.md.
"""

from meshbayes.metrics import measures
from meshbayes.metrics.bleu import (
    BleuResult,
    bleu,
    bleu_from_statistics,
    bleu_statistics,
    corpus_bleu,
    sentence_bleu,
    sentence_bleus,
)
from meshbayes.metrics.calibration import (
    DEFAULT_NUM_BINS,
    bin_indices,
    expected_calibration_error,
    reliability_bins,
    sum_statistics,
    token_calibration_metrics,
    token_calibration_statistics,
)
from meshbayes.metrics.ood import auroc, fpr_at_tpr
from meshbayes.metrics.rejection import prediction_rejection_ratio, rejection_curve
from meshbayes.metrics.reliability import plot_reliability, plot_token_and_sequence_reliability
from meshbayes.metrics.sequence_calibration import (
    binary_ece,
    calibration_auroc,
    equal_mass_reliability,
    exact_matches,
    normalize_for_match,
    sequence_calibration_figures,
)

__all__ = [
    "DEFAULT_NUM_BINS",
    "auroc",
    "bin_indices",
    "binary_ece",
    "bleu",
    "bleu_from_statistics",
    "bleu_statistics",
    "BleuResult",
    "calibration_auroc",
    "corpus_bleu",
    "equal_mass_reliability",
    "exact_matches",
    "expected_calibration_error",
    "fpr_at_tpr",
    "measures",
    "normalize_for_match",
    "plot_reliability",
    "plot_token_and_sequence_reliability",
    "prediction_rejection_ratio",
    "rejection_curve",
    "reliability_bins",
    "sentence_bleu",
    "sentence_bleus",
    "sequence_calibration_figures",
    "sum_statistics",
    "token_calibration_metrics",
    "token_calibration_statistics",
]
