"""Intervals over training seeds: a mean, a difference or a paired difference of figures,
one value per seed, with Student-t intervals.

They say how much a figure moves with the seed, which the bootstrap over one run's test
items cannot; the uncertainty experiment's tables and the PlaNet comparison use them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats  # a dependency of jax's

from meshbayes.metrics import bootstrap

@dataclasses.dataclass(frozen=True)
class SeedInterval:
  """A mean over training seeds, or a difference of two, with its Student-t interval.

  Attributes:
    estimate: the mean (the difference of means).
    low: lower end of the interval.
    high: upper end.
    df: the t distribution's degrees of freedom (seeds - 1; Welch-Satterthwaite's for a
      Welch difference; NaN when neither side varies).
    p_value: two-sided p-value of a true value of 0 (NaN when no seed differs).
    seed_counts: how many seeds it is over, ``(n,)``; a Welch difference's each side's,
      ``(n_a, n_b)``.
  """

  estimate: float
  low: float
  high: float
  df: float
  p_value: float
  seed_counts: tuple[int, ...]

  def as_dict(self) -> dict[str, Any]:
    return {**dataclasses.asdict(self), "seed_counts": list(self.seed_counts)}

  def interval(self) -> bootstrap.Interval:
    """The estimate and ends alone (``bootstrap.verdict`` reads them)."""
    return bootstrap.Interval(self.estimate, self.low, self.high)


def _checked_values(owner: str, values: Sequence[float]) -> np.ndarray:
  array = np.asarray(values, np.float64)
  if array.ndim != 1 or array.size < 2 or not np.all(np.isfinite(array)):
    raise ValueError(f"{owner}: values={list(values)!r} must be at least 2 finite numbers "
                     "(one per seed)")
  return array


def _student_t(owner: str, estimate: float, standard_error: float, df: float, level: float,
               seed_counts: tuple[int, ...]) -> SeedInterval:
  if not 0.0 < level < 1.0:
    raise ValueError(f"{owner}: level={level!r} must be in (0, 1)")
  if standard_error == 0.0:  # every seed the same: no spread to draw an interval from
    return SeedInterval(estimate, estimate, estimate, df, math.nan, seed_counts)
  half_width = float(stats.t.ppf(0.5 + level / 2, df)) * standard_error
  p_value = 2.0 * float(stats.t.sf(abs(estimate) / standard_error, df))
  return SeedInterval(estimate, estimate - half_width, estimate + half_width, df, p_value,
                      seed_counts)


def t_interval(values: Sequence[float], level: float = bootstrap.DEFAULT_LEVEL) -> SeedInterval:
  """The mean of ``values`` (one per seed) with its Student-t interval, ``n - 1`` df:
  ``mean +- t_{(1 + level) / 2, n - 1} s / sqrt(n)``.

  >>> t_interval([1.0, 2.0, 3.0, 4.0]).interval().format(".3f")
  '2.500 [0.446, 4.554]'
  """
  array = _checked_values("t_interval", values)
  return _student_t("t_interval", float(array.mean()),
                    float(array.std(ddof=1) / math.sqrt(array.size)), array.size - 1.0, level,
                    (array.size,))


def welch_interval(a: Sequence[float], b: Sequence[float],
                   level: float = bootstrap.DEFAULT_LEVEL) -> SeedInterval:
  """``mean(a) - mean(b)`` with Welch's t interval (unequal variances; the degrees of
  freedom by Welch-Satterthwaite: ``(va + vb)^2 / (va^2 / (n_a - 1) + vb^2 / (n_b - 1))``
  with ``v = s^2 / n``) and its two-sided p-value."""
  a, b = _checked_values("welch_interval", a), _checked_values("welch_interval", b)
  va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
  spread = va + vb
  df = (spread**2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1)) if spread > 0
        else math.nan)
  return _student_t("welch_interval", float(a.mean() - b.mean()), float(math.sqrt(spread)),
                    float(df), level, (a.size, b.size))


def paired_t_interval(a: Mapping[int, float], b: Mapping[int, float],
                      level: float = bootstrap.DEFAULT_LEVEL) -> SeedInterval:
  """The mean of ``a[k] - b[k]`` over the seeds ``k`` both have (``{seed: value}`` each),
  with its Student-t interval (common seeds - 1 df) and two-sided p-value."""
  common = sorted(set(a) & set(b))
  if len(common) < 2:
    raise ValueError(f"paired_t_interval: seeds {sorted(a)} and {sorted(b)} must share at "
                     "least 2")
  return t_interval([a[k] - b[k] for k in common], level)
