"""The signed gap of sequence probabilities against their labels: its estimate, normal
interval and z-test against 0, the verdict it gives one predictive, and the paired
difference of two predictives' gaps on the same sources.

Output ``j`` has probability ``p_j`` and a label ``y_j`` in ``[0, 1]``, with the
reference-fraction label ``m_j / k_j`` (``sequence_labels.reference_fraction_labels``) an
unbiased estimate of the true ``q(y_j)`` when the references are independent draws. The
signed gap is ``mean(y) - mean(p) = mean_j d_j``, ``d_j = y_j - p_j``: negative when ``p``
lies above the frequency (overconfident), positive below it (underconfident). It sees both
directions, which the exact-match ECE against its band does not at these match rates
(docs/measures.md); it cannot see errors that cancel across ``p`` (over at high ``p``, under
at low), which the one-sided ECE against its null band can.

The interval and the test use the normal approximation with the per-source variance,
``gap +- z s / sqrt(n)``, ``s`` the standard deviation of the ``d_j``: the gap is a mean of
independent per-source terms, so the approximation is the central limit theorem's; it
assumes nothing of how the labels were drawn (the sample ``s``, not a binomial variance), it
agrees with the test by construction (the ``1 - alpha`` interval excludes 0 exactly when
the test rejects at ``alpha``) and costs nothing per bootstrap resample. An evaluation's
bootstrap interval over sources (``meshbayes/metrics/bootstrap.py``) of the same mean agrees
with it to within the resampling noise.

>>> test = gap_test([0.1, 0.2, 0.1, 0.3], [0.0, 0.5, 0.0, 1.0])
>>> round(test.estimate, 4), round(test.p_value, 3)
(0.2, 0.296)
>>> verdict(test.estimate, test.p_value)
'calibrated within noise'
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import statistics

import numpy as np

from meshbayes.metrics import label_checks

OVERCONFIDENT, UNDERCONFIDENT, CALIBRATED = ("overconfident", "underconfident",
                                             "calibrated within noise")
VERDICTS = (OVERCONFIDENT, UNDERCONFIDENT, CALIBRATED)
DEFAULT_ALPHA = 0.05
_NORMAL = statistics.NormalDist()


@dataclasses.dataclass(frozen=True)
class GapTest:
  """A signed gap (or a paired difference of two) with its normal interval and z-test.

  Attributes:
    estimate: ``mean(label - p)`` (for a paired test, its difference between the two).
    low: lower end of the ``level`` interval, ``estimate - z s / sqrt(n)``.
    high: upper end.
    std: ``s``, the per-source standard deviation (``ddof=1``) of ``label - p`` (paired: of
      its difference); what a power calculation for more sources needs.
    z: ``estimate / (s / sqrt(n))``.
    p_value: the two-sided p-value of a true gap of 0, ``2 Phi(-|z|)``.
    num_sources: ``n``.
    level: the interval's coverage.

  ``std``, ``z``, ``p_value`` and the ends are NaN under 2 sources; ``z`` and ``p_value``
  also when every source's term is the same (``s = 0``: the ends are then the estimate).
  """

  estimate: float
  low: float
  high: float
  std: float
  z: float
  p_value: float
  num_sources: int
  level: float


def _check_level(level, owner: str) -> float:
  if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0.0 < level < 1.0:
    raise ValueError(f"{owner}: level={level!r} must be a number in (0, 1)")
  return float(level)


def _terms(probabilities, labels, owner: str) -> np.ndarray:
  p = label_checks.probabilities(probabilities, owner)
  y = label_checks.labels(labels, p.size, owner)
  if y.ndim != 1:
    raise ValueError(f"{owner}: labels must be 1-D, one per output; got shape {y.shape}")
  return y - p


def _z_test(terms: np.ndarray, level: float) -> GapTest:
  n = terms.size
  estimate = float(terms.mean()) if n else math.nan
  if n < 2:
    return GapTest(estimate, math.nan, math.nan, math.nan, math.nan, math.nan, n, level)
  std = float(terms.std(ddof=1))
  if std == 0.0:  # no spread to scale the gap by: no test
    return GapTest(estimate, estimate, estimate, std, math.nan, math.nan, n, level)
  error = std / math.sqrt(n)
  half_width = _NORMAL.inv_cdf(0.5 + level / 2) * error
  z = estimate / error
  return GapTest(estimate, estimate - half_width, estimate + half_width, std, z,
                 math.erfc(abs(z) / math.sqrt(2.0)), n, level)


def gap_test(probabilities, labels, level: float = 1.0 - DEFAULT_ALPHA) -> GapTest:
  """The signed gap ``mean(label) - mean(p)`` with its normal interval and z-test against 0.

  Args:
    probabilities: ``(n,)`` each output's ``p`` in ``[0, 1]``.
    labels: ``(n,)`` its label in ``[0, 1]`` (reference-fraction labels for the primary
      figure; 0/1 exact-match labels give the exact-match gap).
    level: the interval's coverage.

  Returns:
    A ``GapTest``.

  Raises:
    ValueError: one line naming the bad value or shape.

  >>> gap_test([0.5, 0.5, 0.5], [1.0, 0.0, 1.0]).estimate > 0  # p below the frequency
  True
  """
  level = _check_level(level, "gap_test")
  return _z_test(_terms(probabilities, labels, "gap_test"), level)


def paired_gap_test(probabilities, labels, baseline_probabilities, baseline_labels,
                    level: float = 1.0 - DEFAULT_ALPHA) -> GapTest:
  """``gap - baseline gap`` of two predictives on the same ``n`` sources, source ``i`` of
  each paired: the mean of ``(y_i - p_i) - (y'_i - p'_i)`` with its normal interval and
  z-test against 0. Pairing cancels what both share (which sources are easy); its ``std``
  is the per-source paired standard deviation ``paired_gap_power`` takes.

  Raises:
    ValueError: one line naming the bad value, or the two differ in length.

  >>> round(paired_gap_test([0.2, 0.4], [0.0, 1.0], [0.1, 0.2], [0.0, 1.0]).estimate, 6)
  -0.15
  """
  level = _check_level(level, "paired_gap_test")
  terms = _terms(probabilities, labels, "paired_gap_test")
  baseline = _terms(baseline_probabilities, baseline_labels, "paired_gap_test")
  if terms.size != baseline.size:
    raise ValueError(f"paired_gap_test: {terms.size} outputs but {baseline.size} baseline "
                     "outputs; the pairs need the same sources")
  return _z_test(terms - baseline, level)


def _check_alpha(alpha, owner: str) -> float:
  if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0.0 < alpha < 1.0:
    raise ValueError(f"{owner}: alpha={alpha!r} must be a number in (0, 1)")
  return float(alpha)


def verdict(gap: float, p_value: float, alpha: float = DEFAULT_ALPHA) -> str:
  """``OVERCONFIDENT`` (a negative gap), ``UNDERCONFIDENT`` (a positive one) when the
  z-test rejects a true gap of 0 at ``alpha`` (``p_value < alpha``), else ``CALIBRATED``
  (calibrated within noise: not evidence of calibration, see the power calculations of
  ``sequence_power``).

  Raises:
    ValueError: ``alpha`` outside ``(0, 1)``, or a ``gap`` or ``p_value`` that is NaN
      (under 2 sources, or every source's ``label - p`` the same: no test).

  >>> verdict(-0.012, 0.001), verdict(0.004, 0.2)
  ('overconfident', 'calibrated within noise')
  """
  alpha = _check_alpha(alpha, "verdict")
  if not (math.isfinite(gap) and 0.0 <= p_value <= 1.0):
    raise ValueError(f"verdict: gap={gap!r}, p_value={p_value!r} must be a finite gap and a "
                     "p-value in [0, 1] (a NaN: under 2 sources, or no spread to test)")
  if p_value >= alpha:
    return CALIBRATED
  return OVERCONFIDENT if gap < 0 else UNDERCONFIDENT


def gap_verdict(probabilities, labels, alpha: float = DEFAULT_ALPHA) -> str:
  """The verdict of one predictive's outputs: ``verdict`` of ``gap_test(p, labels)``.

  >>> gap_verdict([0.3] * 200, [0.0] * 190 + [1.0] * 10)  # p = 30%, frequency 5%
  'overconfident'
  """
  alpha = _check_alpha(alpha, "gap_verdict")
  test = gap_test(probabilities, labels, 1.0 - alpha)
  return verdict(test.estimate, test.p_value, alpha)
