"""Sequence-level calibration of decoded outputs judged by exact match, as
uncertainty-baselines computes it for its T5X models (after Kumar & Sarawagi, 2019).

Output ``j`` has ``p_j``, the predictive's probability of it (EOS included), and label 1
when it matches a reference after ``normalize_for_match``. Figures: the two-class ECE
(``binary_ece``), ``calibration_auroc``, the equal-mass reliability and the gap
``mean(p) - exact_match``; read them beside ``exact_match`` and ``mean_probability``.
Definitions: docs/uncertainty.md, "The measures".
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Sequence

import numpy as np
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from meshbayes.metrics import calibration, ood

DEFAULT_NUM_BINS = calibration.DEFAULT_NUM_BINS


@functools.cache
def _tokenizer() -> Tokenizer13a:
  return Tokenizer13a()


def normalize_for_match(text: str) -> str:
  """The form two outputs are compared in: Unicode NFKC, sacrebleu's ``13a`` tokens (what
  BLEU compares), case-folded, single spaces.

  >>> normalize_for_match("Tom  est là!") == normalize_for_match("tom est là !")
  True
  """
  return " ".join(_tokenizer()(unicodedata.normalize("NFKC", text)).casefold().split())


def exact_matches(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> np.ndarray:
  """Whether each prediction matches one of its references after ``normalize_for_match``.

  >>> exact_matches(["Il pleut.", "Non"], [["Il pleuvait.", "il pleut ."], ["Oui"]])
  array([ True, False])
  """
  if len(predictions) != len(references):
    raise ValueError(f"{len(predictions)} predictions but {len(references)} reference lists")
  return np.array([normalize_for_match(p) in {normalize_for_match(r) for r in refs}
                   for p, refs in zip(predictions, references)], bool)


def _checked(probabilities, labels) -> tuple[np.ndarray, np.ndarray]:
  p = np.asarray(probabilities, np.float64)
  y = np.asarray(labels, np.float64)
  if p.ndim != 1 or p.shape != y.shape:
    raise ValueError(f"probabilities and labels must be 1-D of one length; got shapes "
                     f"{p.shape}, {y.shape}")
  if p.size and not (np.all(p >= 0) and np.all(p <= 1)):
    raise ValueError(f"probabilities must lie in [0, 1]; got values in [{p.min()}, {p.max()}]")
  if not np.all((y == 0) | (y == 1)):
    raise ValueError("labels must be 0 or 1")
  return p, y


def binary_ece(probabilities, labels, num_bins: int = DEFAULT_NUM_BINS) -> float:
  """ECE of the two-class distributions ``[1 - p, p]`` against 0/1 ``labels`` (top-label,
  ``num_bins`` equal-width bins).

  >>> round(binary_ece([0.9, 0.9, 0.9, 0.9], [1, 0, 0, 0], num_bins=10), 6)
  0.65
  >>> round(binary_ece([0.01, 0.02], [0, 0]), 6)  # confident, rightly, that both are wrong
  0.015
  """
  p, y = _checked(probabilities, labels)
  return calibration.expected_calibration_error(np.maximum(p, 1.0 - p),
                                                ((p > 0.5) == (y == 1)).astype(np.float64),
                                                num_bins)


def calibration_auroc(probabilities, labels) -> float:
  """AUROC of ``p`` ranking the outputs labelled 1 above those labelled 0, ties 1/2; NaN
  when only one label occurs.

  >>> calibration_auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
  0.75
  """
  p, y = _checked(probabilities, labels)
  if y.all() or not y.any():
    return float("nan")
  return ood.auroc(p[y == 0], p[y == 1])


def equal_mass_bins(probabilities, num_bins: int = DEFAULT_NUM_BINS) -> np.ndarray:
  """Bin index of each value: sorted by value (stably), cut into ``num_bins`` runs of
  nearly equal size (sizes differ by at most one). Fewer values than bins: one per bin.

  >>> equal_mass_bins([0.9, 0.1, 0.5, 0.3], num_bins=2)
  array([1, 0, 1, 0])
  """
  p = np.asarray(probabilities, np.float64)
  index = np.empty(p.size, np.int64)
  index[np.argsort(p, kind="stable")] = np.arange(p.size) * min(num_bins, max(p.size, 1)) // max(
      p.size, 1)
  return index


def equal_mass_reliability(probabilities, labels, num_bins: int = DEFAULT_NUM_BINS
                           ) -> dict[str, np.ndarray]:
  """Per equal-mass bin of ``p``: mean ``p`` (``bin_confidence``), the rate of label 1
  (``bin_accuracy``) and the count (``bin_count``), for ``metrics.plot_reliability``.

  >>> equal_mass_reliability([0.1, 0.2, 0.7, 0.9], [0, 1, 1, 1], num_bins=2)['bin_accuracy']
  array([0.5, 1. ])
  """
  p, y = _checked(probabilities, labels)
  index = equal_mass_bins(p, num_bins)
  bins = min(num_bins, max(p.size, 1))
  count = np.bincount(index, minlength=bins).astype(np.float64)
  with np.errstate(invalid="ignore"):
    return {"bin_confidence": np.bincount(index, p, minlength=bins) / count,
            "bin_accuracy": np.bincount(index, y, minlength=bins) / count, "bin_count": count}


def sequence_calibration_figures(probabilities, labels, num_bins: int = DEFAULT_NUM_BINS
                         ) -> dict[str, float]:
  """The scalar figures of this module for one set of outputs.

  Returns:
    ``exact_match`` (rate of label 1), ``mean_probability``, ``probability_gap``
    (their difference, mean ``p`` minus exact-match rate), ``ece`` (``binary_ece``),
    ``calibration_auroc`` and ``equal_mass_ece`` (``sum_b n_b/N |mean p_b - rate_b|``
    over the equal-mass bins, the one-sided reliability's error).
  """
  p, y = _checked(probabilities, labels)
  bins = equal_mass_reliability(p, y, num_bins)
  filled = bins["bin_count"] > 0
  return {"exact_match": float(y.mean()), "mean_probability": float(p.mean()),
          "probability_gap": float(p.mean() - y.mean()), "ece": binary_ece(p, y, num_bins),
          "calibration_auroc": calibration_auroc(p, y),
          "equal_mass_ece": float(np.sum(bins["bin_count"][filled] * np.abs(
              bins["bin_confidence"][filled] - bins["bin_accuracy"][filled])) / max(p.size, 1))}
