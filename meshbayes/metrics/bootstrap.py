"""Bootstrap intervals over test items, and paired differences between two predictives.

A statistic maps index arrays, one per group of items (each group resampled within
itself), to named figures. Every statistic sees the same resamples (a fixed seed), so a
paired difference ``a - b`` cancels the noise both share. A figure that is NaN on a
resample is left out of its interval.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from meshbayes import field_checks

DEFAULT_RESAMPLES = 1000
DEFAULT_LEVEL = 0.95
DEFAULT_SEED = 0

Statistic = Callable[..., Mapping[str, float]]


@dataclasses.dataclass(frozen=True)
class Interval:
  """A figure and its bootstrap interval.

  Attributes:
    estimate: the figure on all items.
    low: lower end of the percentile interval.
    high: upper end.
  """

  estimate: float
  low: float
  high: float

  def as_dict(self) -> dict[str, float]:
    return dataclasses.asdict(self)

  def format(self, spec: str = ".3f", scale: float = 1.0) -> str:
    """``estimate [low, high]`` with ``spec``, each multiplied by ``scale``.

    >>> Interval(0.5, 0.4, 0.61).format(".1f", 100)
    '50.0 [40.0, 61.0]'
    """
    value = lambda x: "nan" if math.isnan(x) else format(x * scale, spec)
    return f"{value(self.estimate)} [{value(self.low)}, {value(self.high)}]"


def resample_indices(sizes: Sequence[int], num_resamples: int = DEFAULT_RESAMPLES,
                     seed: int = DEFAULT_SEED) -> list[np.ndarray]:
  """``(num_resamples, n_g)`` indices drawn with replacement, for each group size ``n_g``."""
  if not sizes or any(not isinstance(n, (int, np.integer)) or n < 1 for n in sizes):
    raise ValueError(f"bootstrap: group sizes {list(sizes)} must be positive ints")
  field_checks.positive_int("bootstrap", "num_resamples", num_resamples)
  rng = np.random.default_rng(seed)
  return [rng.integers(0, n, size=(num_resamples, n)) for n in sizes]


def _intervals(estimates: Mapping[str, float], samples: Sequence[Mapping[str, float]],
               level: float) -> dict[str, Interval]:
  if not 0.0 < level < 1.0:
    raise ValueError(f"bootstrap: level={level!r} must be in (0, 1)")
  result = {}
  for name, estimate in estimates.items():
    values = np.array([sample.get(name, np.nan) for sample in samples], np.float64)
    values = values[np.isfinite(values)]
    low, high = (np.percentile(values, [50 * (1 - level), 50 * (1 + level)]) if values.size
                 else (np.nan, np.nan))
    result[name] = Interval(float(estimate), float(low), float(high))
  return result


def bootstrap(statistic: Statistic, sizes: Sequence[int],
              num_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
              level: float = DEFAULT_LEVEL) -> dict[str, Interval]:
  """Each figure of ``statistic`` with its percentile interval.

  Args:
    statistic: ``statistic(*indices) -> {name: value}``, one index array per group.
    sizes: the number of items of each group.
    num_resamples: resamples drawn.
    seed: their seed.
    level: the interval's coverage.

  >>> data = np.arange(100.0)
  >>> mean = bootstrap(lambda i: {'mean': data[i].mean()}, [100])['mean']
  >>> mean.estimate, bool(43 < mean.low < 49.5 < mean.high < 56)
  (49.5, True)
  """
  everything = [np.arange(n) for n in sizes]
  draws = resample_indices(sizes, num_resamples, seed)
  samples = [statistic(*(d[r] for d in draws)) for r in range(num_resamples)]
  return _intervals(statistic(*everything), samples, level)


def paired_bootstrap(statistic_a: Statistic, statistic_b: Statistic, sizes: Sequence[int],
                     num_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
                     level: float = DEFAULT_LEVEL) -> dict[str, Interval]:
  """``a - b`` for each figure both statistics give, with its interval over the same
  resamples (the items of ``a`` and ``b`` must be the same, in the same order).

  >>> x = np.linspace(0, 1, 50)
  >>> d = paired_bootstrap(lambda i: {'m': (x[i] + 0.1).mean()}, lambda i: {'m': x[i].mean()},
  ...                      [50])['m']
  >>> [round(v, 9) for v in (d.estimate, d.low, d.high)]
  [0.1, 0.1, 0.1]
  """
  everything = [np.arange(n) for n in sizes]

  def difference(*indices):
    a, b = statistic_a(*indices), statistic_b(*indices)
    return {name: a[name] - b[name] for name in a if name in b}

  draws = resample_indices(sizes, num_resamples, seed)
  samples = [difference(*(d[r] for d in draws)) for r in range(num_resamples)]
  return _intervals(difference(*everything), samples, level)


def verdict(difference: Interval, higher_is_better: bool) -> str:
  """``better``, ``worse`` or ``within noise``: whether the interval of ``a - b`` excludes 0,
  and on which side.

  >>> verdict(Interval(-0.02, -0.03, -0.01), higher_is_better=False)
  'better'
  >>> verdict(Interval(0.01, -0.01, 0.03), higher_is_better=True)
  'within noise'
  """
  if not (difference.low > 0 or difference.high < 0):
    return "within noise"
  return "better" if (difference.low > 0) == higher_is_better else "worse"
