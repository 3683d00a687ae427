"""What a test that could not tell would have told: the smallest true effect it detects.

A "cannot tell" is a finding only with its power. ``detectable_effect`` gives the smallest
true mean (a difference over seeds, a signed gap) that a two-sided test of ``estimate /
standard_error`` against 0 rejects at ``alpha`` with probability ``power``: Student's t
with ``df`` degrees of freedom (a t-test over seeds; the statistic is then noncentral t
with noncentrality ``effect / standard_error``), or the normal z-test (``df`` None: a
signed gap over many sources). The standard error is the realized one (the seeds' own
standard deviation over ``sqrt(n)``), taken as the truth's: an approximation, stated
where the power is. Tests against simulation: tests/metrics/test_seed_power.py.

>>> round(detectable_effect(1.0), 3)  # z-test at 0.05 with power 0.8: (1.960 + 0.842) SE
2.802
>>> round(detectable_effect(1.0, df=4), 2)  # five seeds: t's heavier tails need more
3.76
"""

from __future__ import annotations

import math
import numbers
import statistics

from scipy import optimize, stats  # a dependency of jax's

DEFAULT_ALPHA = 0.05
DEFAULT_POWER = 0.8
_NORMAL = statistics.NormalDist()


def _fraction(name: str, value) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 < value < 1.0:
    raise ValueError(f"detectable_effect: {name}={value!r} must be a number in (0, 1)")
  return float(value)


def rejection_rate(shift: float, alpha: float = DEFAULT_ALPHA, df: float | None = None
                   ) -> float:
  """The probability that a two-sided test at ``alpha`` rejects when the true mean is
  ``shift`` standard errors from 0 (``df``: Student's t, noncentral; None: normal)."""
  if df is None:
    critical = _NORMAL.inv_cdf(1.0 - alpha / 2)
    return _NORMAL.cdf(shift - critical) + _NORMAL.cdf(-shift - critical)
  critical = float(stats.t.ppf(1.0 - alpha / 2, df))
  # scipy's far tail can come back NaN where it is below 1e-30: it is then 0.
  far = float(stats.nct.cdf(-critical, df, shift))
  return float(stats.nct.sf(critical, df, shift)) + (0.0 if math.isnan(far) else far)


def detectable_effect(standard_error: float, alpha: float = DEFAULT_ALPHA,
                      power: float = DEFAULT_POWER, df: float | None = None) -> float:
  """The smallest true ``|mean|`` whose two-sided test at ``alpha`` rejects with
  probability ``power``, in the units of ``standard_error``.

  Args:
    standard_error: the estimate's standard error (over seeds: their standard deviation
      over ``sqrt(n)``); 0 or NaN (no spread to scale by) gives NaN.
    alpha: the test's level (under Holm: the family's smallest, ``alpha / m``).
    power: the detection probability, in ``(alpha, 1)``.
    df: Student's t degrees of freedom (``n - 1`` for ``n`` seeds); None: a z-test.

  Raises:
    ValueError: one line naming the bad value.

  >>> round(detectable_effect(0.5, alpha=0.05 / 7, df=4), 2)  # 5 seeds, Holm over 7
  3.21
  """
  alpha, power = _fraction("alpha", alpha), _fraction("power", power)
  if power <= alpha:
    raise ValueError(f"detectable_effect: power={power!r} must exceed alpha={alpha!r} (a "
                     "true mean of 0 is already rejected at rate alpha)")
  if df is not None and (isinstance(df, bool) or not isinstance(df, numbers.Real)
                         or not df > 0):
    raise ValueError(f"detectable_effect: df={df!r} must be a positive number or None")
  if isinstance(standard_error, bool) or not isinstance(standard_error, numbers.Real) or (
      standard_error < 0):
    raise ValueError(f"detectable_effect: standard_error={standard_error!r} must be a "
                     "number >= 0")
  if not standard_error > 0 or math.isinf(standard_error):
    return math.nan
  # The rate grows with the shift; the normal test's shift bounds the t-test's from below.
  low = 0.0
  high = _NORMAL.inv_cdf(1.0 - alpha / 2) + _NORMAL.inv_cdf(power)
  while rejection_rate(high, alpha, df) < power:
    high *= 2
  shift = optimize.brentq(lambda s: rejection_rate(s, alpha, df) - power, low, high,
                          xtol=1e-10)
  return float(shift * standard_error)
