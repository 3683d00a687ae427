"""How many test sources a sequence calibration test needs, computed before any decoding.

Three questions, each its own function (and the sources each needs for a power):

- one predictive against calibration: the power of the signed gap's z-test
  (``sequence_gap.gap_test``; closed form) and of the one-sided reference-fraction ECE
  against its null band (``ece_band_power``; by simulation), for a model whose ``p`` is
  ``factor`` times the true probability;
- two predictives on the same sources: the power of the paired difference of their
  signed gaps (``sequence_gap.paired_gap_test``), from its per-source paired standard
  deviation;
- the sources that give at least ``K`` reference-fraction positives at a measured rate.

The one-sample functions take the truth as a population of sources: each source's true
probability ``q`` of the output (a scalar: every source's; e.g. a calibrated model's ``p``,
or a measured model's as the truth's stand-in) and its reference count ``k``; ``N`` test
sources are drawn from it at random, a model of ``factor`` reports ``p = min(factor q, 1)``
and the references are independent draws (``m ~ Binomial(k, q)``, label ``m / k``).
Tests against simulation: tests/metrics/test_sequence_power.py; what each sees:
docs/measures.md.

>>> round(gap_test_power(2000, 0.035, 1.5, num_references=1), 3)
0.989
"""

from __future__ import annotations

import functools
import math
import numbers
import statistics

import numpy as np
from scipy import stats  # a dependency of jax's

from meshbayes import field_checks
from meshbayes.metrics import label_checks, sequence_labels
from meshbayes.metrics.measures import MIN_POSITIVES
from meshbayes.metrics.sequence_gap import DEFAULT_ALPHA

DEFAULT_POWER = 0.8
_NORMAL = statistics.NormalDist()


# --------------------------------------------------------------------------- checks


def _fraction(owner: str, name: str, value) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 < value < 1.0:
    raise ValueError(f"{owner}: {name}={value!r} must be a number in (0, 1)")
  return float(value)


def _positive(owner: str, name: str, value) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
      math.isfinite(value) and value > 0):
    raise ValueError(f"{owner}: {name}={value!r} must be a positive number")
  return float(value)


def _finite(owner: str, name: str, value) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
    raise ValueError(f"{owner}: {name}={value!r} must be a finite number")
  return float(value)


def _population(owner: str, true_probabilities, num_references
                ) -> tuple[np.ndarray, np.ndarray]:
  """``(q, k)`` of one length: a scalar ``q`` or ``k`` is every source's, None ``k`` is 1."""
  q = np.atleast_1d(np.asarray(true_probabilities, np.float64))
  if q.ndim != 1 or q.size == 0 or not np.all((q >= 0) & (q <= 1)):
    raise ValueError(f"{owner}: true_probabilities must be a number or a non-empty 1-D array "
                     f"in [0, 1]; got {np.asarray(true_probabilities).tolist()!r:.80}")
  k = np.ones(q.size, np.int64) if num_references is None else np.asarray(num_references)
  if k.ndim == 0:
    k = np.full(q.size, k)
  elif q.size == 1 and k.ndim == 1:  # one rate for sources of these counts
    q = np.full(k.size, q[0])
  if k.shape != q.shape:
    raise ValueError(f"{owner}: {q.size} true probabilities but {k.size} reference counts")
  _, k = label_checks.counts(np.zeros(k.size, np.int64), k, owner)
  return q, k


def _moments(owner: str, true_probabilities, factor, num_references) -> tuple[float, float]:
  """The mean and standard deviation of one random source's ``m / k - p``."""
  factor = _positive(owner, "factor", factor)
  q, k = _population(owner, true_probabilities, num_references)
  p = np.minimum(factor * q, 1.0)
  # Within a source: the binomial variance of m / k; across sources: that of q - p.
  variance = float(np.mean(q * (1.0 - q) / k) + np.var(q - p))
  if variance == 0.0:
    raise ValueError(f"{owner}: every source's label - p is the same (true probabilities all "
                     "0 or 1): no test to power")
  return float(np.mean(q - p)), math.sqrt(variance)


def _normal_power(shift: float, alpha: float) -> float:
  """The rejection rate of a two-sided z-test at ``alpha`` whose statistic is N(shift, 1)."""
  critical = _NORMAL.inv_cdf(1.0 - alpha / 2)
  return _NORMAL.cdf(shift - critical) + _NORMAL.cdf(-shift - critical)


def _sources_for(owner: str, effect: float, std: float, alpha: float, power: float) -> int:
  """The fewest sources whose z-test of a mean ``effect`` (per-source ``std``) has
  ``power``."""
  if effect == 0.0:
    raise ValueError(f"{owner}: a true effect of 0 (factor 1 or difference 0) is rejected at "
                     "rate alpha whatever the sources: no number reaches a power")
  critical = _NORMAL.inv_cdf(1.0 - alpha / 2)
  n = max(1, math.ceil(((critical + _NORMAL.inv_cdf(power)) * std / abs(effect)) ** 2))
  # The closed form leaves out the far tail's rejections, so it can be one or two high.
  while n > 1 and _normal_power(math.sqrt(n - 1) * abs(effect) / std, alpha) >= power:
    n -= 1
  return n


# --------------------------------------------------------------------------- one sample


def gap_test_power(num_sources: int, true_probabilities, factor: float, num_references=None,
                   alpha: float = DEFAULT_ALPHA) -> float:
  """The probability that the signed gap's z-test rejects at ``alpha`` (either direction).

  Normal approximation: ``N`` sources drawn from the population give the gap's mean
  ``mu = mean(q - p)`` and per-source variance ``mean(q (1 - q) / k) + var(q - p)``; the
  power is ``Phi(sqrt(N) |mu| / sd - z) + Phi(-sqrt(N) |mu| / sd - z)``,
  ``z = Phi^-1(1 - alpha / 2)``. Within 0.04 of simulation from about 10 expected
  reference-fraction positives (tests/metrics/test_sequence_power.py).

  Args:
    num_sources: ``N``.
    true_probabilities: each population source's ``q``, or one ``q`` for all (a rate).
    factor: the model reports ``min(factor q, 1)``; above 1 overconfident.
    num_references: each source's ``k`` (or one for all; None: 1).
    alpha: the test's level.

  Raises:
    ValueError: one line naming the bad value.

  >>> round(gap_test_power(2000, 0.035, 1.0, num_references=1), 3)  # its level
  0.05
  """
  field_checks.positive_int("gap_test_power", "num_sources", num_sources)
  alpha = _fraction("gap_test_power", "alpha", alpha)
  mean, std = _moments("gap_test_power", true_probabilities, factor, num_references)
  return _normal_power(math.sqrt(num_sources) * abs(mean) / std, alpha)


def sources_for_gap_power(true_probabilities, factor: float, num_references=None,
                          alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER) -> int:
  """The fewest sources at which ``gap_test_power`` reaches ``power``.

  Raises:
    ValueError: a bad value, or ``factor`` 1 (no effect to detect).

  >>> sources_for_gap_power(0.018, 1.25, num_references=1)  # 1.8% positives, 1.25x
  6852
  """
  alpha = _fraction("sources_for_gap_power", "alpha", alpha)
  power = _fraction("sources_for_gap_power", "power", power)
  mean, std = _moments("sources_for_gap_power", true_probabilities, factor, num_references)
  return _sources_for("sources_for_gap_power", mean, std, alpha, power)


def ece_band_power(num_sources: int, true_probabilities, factor: float, num_references=None,
                   quantile: float = sequence_labels.DEFAULT_QUANTILES[-1],
                   num_simulations: int = 200, null_draws: int = 200, seed: int = 0,
                   num_bins: int = sequence_labels.DEFAULT_NUM_BINS) -> float:
  """The probability that the one-sided reference-fraction ECE lies above its null band's
  ``quantile`` (the evaluation's 97.5% point), by simulation.

  Each of ``num_simulations`` test sets draws ``N`` sources from the population and their
  labels, scores ``one_sided_ece(p, m / k)`` and draws its own ``null_band`` (``null_draws``
  label sets on the same ``p`` and ``k``, as the evaluation does: with its 200, the 97.5%
  point is about the 195th draw, so a calibrated model is flagged about 3% of the time).
  The result's Monte Carlo standard error is ``sqrt(P (1 - P) / num_simulations)``. Costs
  about ``num_simulations * null_draws * N`` label draws (200 x 200 x 2,000 sources: about
  10 s on one core).

  Raises:
    ValueError: one line naming the bad value.

  >>> ece_band_power(2000, 0.035, 2.0, num_simulations=20, null_draws=100)
  1.0
  """
  owner = "ece_band_power"
  for name, value in (("num_sources", num_sources), ("num_simulations", num_simulations),
                      ("null_draws", null_draws)):
    field_checks.positive_int(owner, name, value)
  quantile = _fraction(owner, "quantile", quantile)
  factor = _positive(owner, "factor", factor)
  q, k = _population(owner, true_probabilities, num_references)
  ece = functools.partial(sequence_labels.one_sided_ece, num_bins=num_bins)
  rng = np.random.default_rng(seed)
  flagged = 0
  for _ in range(num_simulations):
    index = rng.integers(0, q.size, num_sources)
    p, counts = np.minimum(factor * q[index], 1.0), k[index]
    labels = rng.binomial(counts, q[index]) / counts
    band = sequence_labels.null_band(p, ece, num_draws=null_draws,
                                     seed=int(rng.integers(2**31)), quantiles=(quantile,),
                                     num_references=counts)
    flagged += ece(p, labels) > band.high
  return flagged / num_simulations


# --------------------------------------------------------------------------- paired


def paired_gap_power(num_sources: int, difference: float, paired_std: float,
                     alpha: float = DEFAULT_ALPHA) -> float:
  """The probability that the paired z-test of two predictives' signed gaps on the same
  ``N`` sources rejects at ``alpha``, when their true difference is ``difference`` and the
  per-source paired standard deviation ``paired_std`` (``paired_gap_test(...).std`` on
  outputs at hand): ``Phi(sqrt(N) |d| / sd - z) + Phi(-sqrt(N) |d| / sd - z)``.

  Raises:
    ValueError: one line naming the bad value.

  >>> round(paired_gap_power(2000, 0.01, 0.15), 3)
  0.846
  """
  field_checks.positive_int("paired_gap_power", "num_sources", num_sources)
  alpha = _fraction("paired_gap_power", "alpha", alpha)
  std = _positive("paired_gap_power", "paired_std", paired_std)
  difference = _finite("paired_gap_power", "difference", difference)
  return _normal_power(math.sqrt(num_sources) * abs(difference) / std, alpha)


def sources_for_paired_power(difference: float, paired_std: float,
                             alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER) -> int:
  """The fewest sources at which ``paired_gap_power`` reaches ``power``.

  >>> sources_for_paired_power(0.01, 0.15)
  1766
  """
  alpha = _fraction("sources_for_paired_power", "alpha", alpha)
  power = _fraction("sources_for_paired_power", "power", power)
  std = _positive("sources_for_paired_power", "paired_std", paired_std)
  difference = _finite("sources_for_paired_power", "difference", difference)
  return _sources_for("sources_for_paired_power", difference, std, alpha, power)


# --------------------------------------------------------------------------- positives


def positives_probability(num_sources: int, rate: float,
                          min_positives: int = MIN_POSITIVES) -> float:
  """``P(Binomial(N, rate) >= K)``: the chance that ``N`` sources realize at least ``K``
  positives at a positive rate ``rate`` per source. Reference-fraction positives (a sum of
  fractions ``m / k`` in ``[0, 1]`` with mean ``rate``) vary at most as much as the binomial
  count: when ``N rate >= K`` they reach ``K`` at least about this often.

  >>> round(positives_probability(22_400, 0.0179), 2)
  0.53
  """
  field_checks.positive_int("positives_probability", "num_sources", num_sources)
  field_checks.positive_int("positives_probability", "min_positives", min_positives)
  rate = _fraction("positives_probability", "rate", rate)
  return float(stats.binom.sf(min_positives - 1, num_sources, rate))


def sources_for_positives(rate: float, min_positives: int = MIN_POSITIVES,
                          probability: float = 0.5) -> int:
  """The fewest sources ``N`` whose expected positives ``N rate`` are at least ``K`` and
  whose realized positives are at least ``K`` with ``probability``
  (``positives_probability``; the issue's gate: ``K = 400``).

  Raises:
    ValueError: one line naming the bad value.

  >>> sources_for_positives(0.017875), sources_for_positives(0.017875, probability=0.9)
  (22378, 23810)
  """
  field_checks.positive_int("sources_for_positives", "min_positives", min_positives)
  rate = _fraction("sources_for_positives", "rate", rate)
  probability = _fraction("sources_for_positives", "probability", probability)
  low = math.ceil(min_positives / rate)  # the expected count reaches K
  reached = lambda n: stats.binom.sf(min_positives - 1, n, rate) >= probability
  high = low
  while not reached(high):
    high *= 2
  while low < high:  # the chance grows with n: the fewest n that reaches it
    middle = (low + high) // 2
    low, high = (low, middle) if reached(middle) else (middle + 1, high)
  return low
