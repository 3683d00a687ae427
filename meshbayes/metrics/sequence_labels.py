"""Sequence-calibration labels without the any-reference bias, the ECE a perfectly
calibrated model shows by chance, and a synthetic task whose calibration is known.

Output ``j`` has probability ``p_j`` and matches ``m_j`` of its source's ``k_j >= 1``
references (``sequence_calibration.normalize_for_match``). Labels: any reference,
``1[m_j > 0]``, or the fraction ``m_j / k_j`` (unbiased for the true ``q(y)`` when the
references are independent draws). ECEs take labels in ``[0, 1]``; ``null_band`` gives
the ECE of calibrated labels drawn on the same ``p``. The signed gap and its z-test (a
primary figure beside the one-sided fraction ECE's band): ``sequence_gap``; the sources a
test needs: ``sequence_power``. Derivations, the biases of deduplicated references, the two
ECEs compared and which figure sees which direction: docs/measures.md.

>>> matched, k = [1, 0, 2], [2, 1, 3]
>>> reference_fraction_labels(matched, k)
array([0.5       , 0.        , 0.66666667])
>>> round(one_sided_ece([0.4, 0.1, 0.6], reference_fraction_labels(matched, k)), 4)
0.0889
>>> band = null_band([0.4, 0.1, 0.6], one_sided_ece, num_references=k, num_draws=200)
>>> bool(0 < band.low < band.mean < band.high < 1)
True
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from meshbayes.metrics import calibration, label_checks, sequence_calibration, sequence_gap

DEFAULT_NUM_BINS = calibration.DEFAULT_NUM_BINS
DEFAULT_NULL_DRAWS = 1000
DEFAULT_QUANTILES = (0.025, 0.5, 0.975)
FRACTION, ANY = "fraction", "any"
# Null draws are made in chunks of at most this many labels (memory).
_CHUNK_LABELS = 1 << 22


# --------------------------------------------------------------------------- labels


def reference_match_counts(predictions: Sequence[str], references: Sequence[Sequence[str]]
                           ) -> tuple[np.ndarray, np.ndarray]:
  """How many of its source's references each output matches, and how many there are.

  Matching is ``sequence_calibration.normalize_for_match`` equality, as for
  ``exact_matches``; a reference list holding one translation twice counts it twice.

  Args:
    predictions: ``n`` decoded outputs.
    references: each output's source's references (at least one each).

  Returns:
    ``(num_matched, num_references)``, two ``(n,)`` int64 arrays.

  Raises:
    ValueError: lengths differ, or a source has no reference.

  >>> reference_match_counts(["Il pleut.", "Non"], [["il pleut .", "Il pleut!"], ["Oui"]])
  (array([1, 0]), array([2, 1]))
  """
  if len(predictions) != len(references):
    raise ValueError(f"reference_match_counts: {len(predictions)} predictions but "
                     f"{len(references)} reference lists")
  matched, counts = [], []
  for index, (prediction, refs) in enumerate(zip(predictions, references)):
    if not refs:
      raise ValueError(f"reference_match_counts: source {index} has no reference")
    target = sequence_calibration.normalize_for_match(prediction)
    matched.append(sum(sequence_calibration.normalize_for_match(r) == target for r in refs))
    counts.append(len(refs))
  return np.array(matched, np.int64), np.array(counts, np.int64)


def reference_fraction_labels(num_matched, num_references) -> np.ndarray:
  """The fraction of its source's references each output matches, ``m / k`` in ``[0, 1]``.

  Unbiased for the true probability ``q(y)`` of the output when the references are
  independent draws from the translation distribution (docs/measures.md: when they are
  not).

  Args:
    num_matched: ``(n,)`` ints ``m >= 0``, the references each output matches.
    num_references: ``(n,)`` ints ``k >= m``, ``k >= 1``, its source's references.

  Returns:
    ``(n,)`` float64 labels.

  Raises:
    ValueError: one line naming the bad value (a negative or fractional count,
      ``k < 1``, ``m > k``, lengths that differ).

  >>> reference_fraction_labels([0, 1, 3], [1, 4, 3])
  array([0.  , 0.25, 1.  ])
  """
  m, k = label_checks.counts(num_matched, num_references, "reference_fraction_labels")
  return m / k


def any_reference_labels(num_matched, num_references) -> np.ndarray:
  """``1[m > 0]``: whether each output matches any reference (as ``exact_matches``), as
  float64, with the checks of ``reference_fraction_labels``.

  >>> any_reference_labels([0, 1, 3], [1, 4, 3])
  array([0., 1., 1.])
  """
  m, _ = label_checks.counts(num_matched, num_references, "any_reference_labels")
  return (m > 0).astype(np.float64)


# --------------------------------------------------------------------------- ECE


def _signed_binned_gap(p: np.ndarray, y: np.ndarray, bins: np.ndarray, signs: np.ndarray):
  """``(1/n) sum_b |sum_{i in b} s_i (y_i - p_i)|`` for ``y`` of shape (n,) or (d, n)."""
  if p.size == 0:
    return float("nan") if y.ndim == 1 else np.full(y.shape[0], np.nan)
  order = np.argsort(bins, kind="stable")
  starts = np.flatnonzero(np.diff(bins[order], prepend=-1))  # each filled bin's first
  sums = np.add.reduceat((signs * (y - p))[..., order], starts, axis=-1)
  error = np.abs(sums).sum(-1) / p.size
  return float(error) if y.ndim == 1 else error


def _check_bins(num_bins, owner: str) -> None:
  if not isinstance(num_bins, (int, np.integer)) or isinstance(num_bins, bool) or num_bins < 1:
    raise ValueError(f"{owner}: num_bins={num_bins!r} must be a positive int")


def one_sided_ece(probabilities, labels, num_bins: int = DEFAULT_NUM_BINS):
  """``sum_b (n_b / n) |mean_b(p) - mean_b(label)|`` over ``num_bins`` equal-width bins of
  ``p`` (``calibration.bin_indices``): the error of the one-sided reliability diagram.

  Args:
    probabilities: ``(n,)`` values of ``p`` in ``[0, 1]``.
    labels: ``(n,)`` labels in ``[0, 1]`` (0/1, or fractions of references matched), or
      ``(draws, n)`` sets of labels for the same ``p`` (each scored alone).
    num_bins: the number of bins.

  Returns:
    The ECE in ``[0, 1]`` (a float; ``(draws,)`` for 2-D labels; NaN when ``n = 0``).

  Raises:
    ValueError: one line naming the bad value or shape.

  >>> round(one_sided_ece([0.1, 0.1, 0.9, 0.9], [0.0, 0.5, 1.0, 0.5], num_bins=10), 6)
  0.15
  """
  _check_bins(num_bins, "one_sided_ece")
  p = label_checks.probabilities(probabilities, "one_sided_ece")
  y = label_checks.labels(labels, p.size, "one_sided_ece")
  return _signed_binned_gap(p, y, calibration.bin_indices(p, num_bins), np.ones_like(p))


def two_class_ece(probabilities, labels, num_bins: int = DEFAULT_NUM_BINS):
  """The top-label ECE of the two-class distributions ``[1 - p, p]``: binned by
  ``max(p, 1 - p)``, scored by the label of the predicted class (``label`` if
  ``p > 1/2``, else ``1 - label``). For 0/1 labels, ``sequence_calibration.binary_ece``.

  Its blind side, with exact-match (any-reference) labels at low match rates and several
  references per source: it cannot see overconfidence. The any-reference label's
  expectation ``1 - (1 - q)^k`` exceeds ``q``, which offsets a ``p`` above ``q``, and the
  null band of ``1[Binomial(k, p) > 0]`` labels grows with ``p``: at Tatoeba's reference
  counts and about 91 matches in 2,000 sources, a model whose ``p`` is 1.25 to 2 times the
  truth falls inside or below the band (tests/metrics/test_sequence_directions.py). Report
  it; decide with ``sequence_gap.gap_test`` and the one-sided fraction ECE's band.

  Args and returns as ``one_sided_ece``.

  >>> # confidence 0.8 (p = 0.2; scored 1 - label): |0.8 - 0.75| * 2/3; 0.9: |0.9 - 1| * 1/3
  >>> round(two_class_ece([0.2, 0.2, 0.9], [0.5, 0.0, 1.0], num_bins=10), 6)
  0.066667
  """
  _check_bins(num_bins, "two_class_ece")
  p = label_checks.probabilities(probabilities, "two_class_ece")
  y = label_checks.labels(labels, p.size, "two_class_ece")
  return _signed_binned_gap(p, y, calibration.bin_indices(np.maximum(p, 1.0 - p), num_bins),
                            np.where(p > 0.5, 1.0, -1.0))


# ECEs that score a (draws, n) array of labels in one call; any other ece_fn is called
# once per draw.
_BATCHED = (one_sided_ece, two_class_ece)


# --------------------------------------------------------------------------- null band


@dataclasses.dataclass(frozen=True)
class NullBand:
  """The distribution of an ECE when the labels are those of a perfectly calibrated model.

  Attributes:
    levels: the quantile levels, ascending.
    quantiles: the ECE's quantiles at ``levels``.
    mean: its mean over the draws.
    std: its standard deviation over the draws.
    num_draws: the draws.
  """

  levels: tuple[float, ...]
  quantiles: tuple[float, ...]
  mean: float
  std: float
  num_draws: int

  @property
  def low(self) -> float:
    """The lowest quantile."""
    return self.quantiles[0]

  @property
  def high(self) -> float:
    """The highest quantile (a figure above it is more than chance at this level)."""
    return self.quantiles[-1]

  def contains(self, value: float) -> bool:
    """Whether ``low <= value <= high``."""
    return bool(self.low <= value <= self.high)

  def as_dict(self) -> dict[str, float]:
    """``{'mean', 'std', 'q<level>'...}``, e.g. ``'q0.975'``."""
    return {"mean": self.mean, "std": self.std,
            **{f"q{level:g}": value for level, value in zip(self.levels, self.quantiles)}}


def _draw_labels(rng: np.random.Generator, p: np.ndarray, k: np.ndarray | None, label: str,
                 num_draws: int) -> np.ndarray:
  if k is None:
    return (rng.random((num_draws, p.size)) < p).astype(np.float64)
  matched = np.empty((num_draws, p.size), np.int64)
  for count in np.unique(k):  # m ~ Binomial(k, p) as k Bernoulli(p) draws: exact, and fast
    index = np.flatnonzero(k == count)
    matched[:, index] = (rng.random((num_draws, index.size, int(count))) < p[index, None]).sum(-1)
  return matched / k if label == FRACTION else (matched > 0).astype(np.float64)


def _null_arguments(probabilities, num_draws, num_references, label, owner: str
                    ) -> tuple[np.ndarray, np.ndarray | None]:
  p = label_checks.probabilities(probabilities, owner)
  if not isinstance(num_draws, (int, np.integer)) or isinstance(num_draws, bool) or num_draws < 1:
    raise ValueError(f"{owner}: num_draws={num_draws!r} must be a positive int")
  if label not in (FRACTION, ANY):
    raise ValueError(f"{owner}: label={label!r} must be {FRACTION!r} or {ANY!r}")
  if num_references is None:
    return p, None
  if np.ndim(num_references) != 1:
    raise ValueError(f"{owner}: num_references must be 1-D; got shape "
                     f"{np.shape(num_references)}")
  _, k = label_checks.counts(np.zeros(np.shape(num_references), np.int64), num_references, owner)
  if k.size != p.size:
    raise ValueError(f"{owner}: {p.size} probabilities but {k.size} reference counts")
  return p, k


def null_labels(probabilities, num_draws: int, seed: int = 0, num_references=None,
                label: str = FRACTION) -> np.ndarray:
  """``(num_draws, n)`` labels a perfectly calibrated model would get on these outputs.

  Each output's ``m`` correct references are drawn as ``Binomial(k, p)`` (references as
  independent draws from a translation distribution that gives the output ``p``); the
  label is ``m / k`` (``FRACTION``) or ``1[m > 0]`` (``ANY``). Without references
  (``num_references=None``), one each: Bernoulli(p), the same for both labels.

  Raises:
    ValueError: a bad probability, count, ``num_draws`` or ``label``.

  >>> null_labels([0.0, 1.0, 0.5], 2, num_references=[1, 3, 2])[:, :2]
  array([[0., 1.],
         [0., 1.]])
  """
  p, k = _null_arguments(probabilities, num_draws, num_references, label, "null_labels")
  return _draw_labels(np.random.default_rng(seed), p, k, label, num_draws)


def null_band(probabilities, ece_fn: Callable[..., float] = one_sided_ece,
              num_draws: int = DEFAULT_NULL_DRAWS, seed: int = 0,
              quantiles: Sequence[float] = DEFAULT_QUANTILES, num_references=None,
              label: str = FRACTION) -> NullBand:
  """The ECE a perfectly calibrated model shows on the same outputs: the distribution of
  ``ece_fn(p, labels)`` over ``num_draws`` sets of ``null_labels``.

  Read an observed ECE against it: inside, it is what calibration looks like at this
  ``n`` and these ``p``; above ``high``, miscalibration beyond chance. The band is
  conditional on the ``p`` (and ``k``) observed; it assumes the labelling of
  ``null_labels`` (for ``ANY`` and ``FRACTION`` with references: references as draws).

  Args:
    probabilities: ``(n,)`` values of ``p``.
    ece_fn: ``ece_fn(p, labels) -> float``; ``one_sided_ece`` and ``two_class_ece`` (or a
      ``functools.partial`` of one, e.g. setting ``num_bins``) score all draws in one
      call, any other function once per draw.
    num_draws: label sets drawn.
    seed: their seed (the same seed: the same draws).
    quantiles: levels in ``(0, 1)``.
    num_references: ``(n,)`` reference counts, or None (one reference each).
    label: ``FRACTION`` or ``ANY``, the label the ECE is of.

  Returns:
    A ``NullBand``.

  Raises:
    ValueError: one line naming the bad value.

  >>> band = null_band([0.3] * 100, num_draws=2000)  # |0.3 - Binomial(100, 0.3) / 100|
  >>> round(band.mean, 2), band.levels
  (0.04, (0.025, 0.5, 0.975))
  """
  levels = tuple(float(q) for q in quantiles)
  if not levels or any(not 0.0 < q < 1.0 for q in levels) or list(levels) != sorted(levels):
    raise ValueError(f"null_band: quantiles={tuple(quantiles)!r} must be ascending levels "
                     "in (0, 1)")
  p, k = _null_arguments(probabilities, num_draws, num_references, label, "null_band")
  rng = np.random.default_rng(seed)
  chunk = max(1, _CHUNK_LABELS // max(p.size if k is None else int(k.sum()), 1))
  values = []
  for start in range(0, num_draws, chunk):
    draws = _draw_labels(rng, p, k, label, min(chunk, num_draws - start))
    values.append(ece_fn(p, draws) if getattr(ece_fn, "func", ece_fn) in _BATCHED else
                  np.array([ece_fn(p, labels) for labels in draws], np.float64))
  values = np.concatenate(values)
  return NullBand(levels, tuple(float(v) for v in np.quantile(values, levels)),
                  float(values.mean()), float(values.std()), int(num_draws))


def debiased_ece(observed: float, band: NullBand) -> float:
  """``observed - band.mean``: the ECE less the part a calibrated model shows by chance.

  A simple bias correction, not an unbiased estimator in general. For a calibrated model
  its expectation is 0 (given the ``p``). For one miscalibrated beyond the noise, the
  ECE's chance part is mostly absorbed (``E|gap + noise| ~ |gap|``), so subtracting the
  whole null mean under-states the error by up to ``band.mean``; the null's noise is also
  drawn at ``p`` rather than at the true probabilities. It can be negative.

  >>> round(debiased_ece(0.05, NullBand((0.5,), (0.02,), 0.02, 0.01, 100)), 6)
  0.03
  """
  return float(observed - band.mean)


def fraction_calibration_figures(probabilities, num_matched, num_references,
                                 num_bins: int = DEFAULT_NUM_BINS) -> dict[str, float]:
  """The fraction-label figures of one set of outputs (cheap: no null draws).

  Returns:
    ``reference_fraction`` (mean fraction label, the estimate of the mean true ``q(y)``),
    ``fraction_probability_gap`` (mean ``p`` minus it; > 0: overconfident),
    ``fraction_signed_gap`` (the primary figure, ``sequence_gap.gap_test`` against the
    fraction labels: mean label minus mean ``p``; < 0: overconfident) with its z-test's
    ``fraction_signed_gap_z`` and two-sided ``fraction_signed_gap_p_value`` (NaN under 2
    outputs or without spread), ``fraction_ece`` (``one_sided_ece`` against the fraction
    labels), and ``match_rate_over_probability`` (exact-match rate over mean ``p``: about 1
    for a calibrated model with one reference each, more with several).

  >>> figures = fraction_calibration_figures([0.5, 0.2], [1, 0], [2, 1])
  >>> figures['reference_fraction'], round(figures['fraction_probability_gap'], 6)
  (0.25, 0.1)
  >>> round(figures['fraction_signed_gap'], 6), round(figures['fraction_signed_gap_p_value'], 3)
  (-0.1, 0.317)
  """
  p = label_checks.probabilities(probabilities, "fraction_calibration_figures")
  m, k = label_checks.counts(num_matched, num_references, "fraction_calibration_figures")
  if m.size != p.size:
    raise ValueError(f"fraction_calibration_figures: {p.size} probabilities but {m.size} counts")
  fraction = m / k
  mean_p = float(p.mean()) if p.size else float("nan")
  gap = sequence_gap.gap_test(p, fraction)
  return {"reference_fraction": float(fraction.mean()) if p.size else float("nan"),
          "fraction_probability_gap": float(p.mean() - fraction.mean()) if p.size else float(
              "nan"),
          "fraction_signed_gap": gap.estimate, "fraction_signed_gap_z": gap.z,
          "fraction_signed_gap_p_value": gap.p_value,
          "fraction_ece": one_sided_ece(p, fraction, num_bins),
          "match_rate_over_probability": float(np.mean(m > 0) / mean_p) if mean_p > 0 else
          float("nan")}


# --------------------------------------------------------------------------- ground truth


@dataclasses.dataclass(frozen=True)
class SyntheticTask:
  """Sources whose translation distributions are known, and references drawn from them.

  Attributes:
    true_probabilities: ``(n, M)`` ``q``, each source's distribution over its ``M``
      candidate outputs.
    reference_counts: ``(n, M)`` ints, how many of the source's references are each
      candidate (0/1 when the references were deduplicated).
  """

  true_probabilities: np.ndarray
  reference_counts: np.ndarray

  @property
  def num_references(self) -> np.ndarray:
    """``(n,)`` each source's references."""
    return self.reference_counts.sum(-1)

  def decode(self, temperature: float = 1.0) -> dict[str, np.ndarray]:
    """A model ``r = q^(1/T) / sum q^(1/T)`` decoding its mode.

    ``T = 1`` is calibrated, ``T < 1`` sharpened (overconfident: ``p > q(y)`` for the
    mode), ``T > 1`` flattened (underconfident). Every ``T`` has the same mode, the
    mode of ``q`` (the first on ties).

    Returns:
      ``probability`` (``p``, the model's probability of its output),
      ``true_probability`` (``q(y)``), ``num_matched`` and ``num_references``, ``(n,)``
      each.

    Raises:
      ValueError: ``temperature`` is not a positive number.
    """
    if not isinstance(temperature, (int, float)) or not temperature > 0 or not math.isfinite(
        temperature):
      raise ValueError(f"SyntheticTask.decode: temperature={temperature!r} must be a "
                       "positive number")
    log_q = np.log(self.true_probabilities)
    mode = np.argmax(log_q, -1)
    log_r = log_q / temperature
    log_r = log_r - np.logaddexp.reduce(log_r, axis=-1, keepdims=True)
    rows = np.arange(mode.size)
    return {"probability": np.exp(log_r[rows, mode]),
            "true_probability": self.true_probabilities[rows, mode],
            "num_matched": self.reference_counts[rows, mode].astype(np.int64),
            "num_references": self.num_references.astype(np.int64)}


def synthetic_task(num_sources: int, num_candidates: int = 8, logit_scale: float = 2.0,
                   mean_references: float = 1.5, max_references: int = 12,
                   distinct_references: bool = False, seed: int = 0) -> SyntheticTask:
  """Sources with known translation distributions, references drawn from them.

  Each source's ``q`` is the softmax of ``num_candidates`` logits drawn from
  ``N(0, logit_scale^2)`` (the larger the scale, the more mass on the mode: the
  default puts the any-reference exact-match rate of the mode near 65%); its number of
  references is ``1 + Poisson(mean_references - 1)``, at most ``max_references`` (the
  default: about Tatoeba's 1.48 per source); the references are that many independent
  draws from ``q`` (with ``distinct_references``, the distinct ones only, as
  ``evaluation.sources.group_sources`` keeps them).

  >>> task = synthetic_task(3, seed=1)
  >>> task.true_probabilities.shape, bool(np.allclose(task.true_probabilities.sum(-1), 1))
  ((3, 8), True)
  """
  for name, value in (("num_sources", num_sources), ("num_candidates", num_candidates),
                      ("max_references", max_references)):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
      raise ValueError(f"synthetic_task: {name}={value!r} must be a positive int")
  if not (isinstance(logit_scale, (int, float)) and logit_scale >= 0):
    raise ValueError(f"synthetic_task: logit_scale={logit_scale!r} must be a number >= 0")
  if not (isinstance(mean_references, (int, float)) and mean_references >= 1):
    raise ValueError(f"synthetic_task: mean_references={mean_references!r} must be a "
                     "number >= 1")
  rng = np.random.default_rng(seed)
  logits = logit_scale * rng.standard_normal((num_sources, num_candidates))
  q = np.exp(logits - logits.max(-1, keepdims=True))
  q /= q.sum(-1, keepdims=True)
  k = np.minimum(1 + rng.poisson(mean_references - 1.0, num_sources), max_references)
  counts = rng.multinomial(k, q)
  if distinct_references:
    counts = np.minimum(counts, 1)
  return SyntheticTask(q, counts.astype(np.int64))
