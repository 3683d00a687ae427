"""Holm's step-down correction: which of a family of tests to reject so that the chance of
rejecting any true null hypothesis stays at most ``alpha`` (the family-wise error rate),
whatever the tests' dependence.

Holm (1979): order the ``m`` p-values ``p_(1) <= ... <= p_(m)``; reject ``H_(1)``, ...,
``H_(i)`` while ``p_(j) < alpha / (m - j + 1)`` for every ``j <= i``, and stop at the first
that fails. Its adjusted p-values, ``max_{j <= i} min(1, (m - j + 1) p_(j))``, are under
``alpha`` exactly for the rejected tests. It rejects at least what Bonferroni's
``alpha / m`` rejects, and with one test it is the test itself. A rejection needs
``p < alpha`` strictly, as ``sequence_gap.verdict``'s does.

>>> result = holm([0.01, 0.04, 0.03, 0.20])
>>> result.rejected
(True, False, False, False)
>>> [round(p, 2) for p in result.adjusted]
[0.04, 0.09, 0.09, 0.2]
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence

DEFAULT_ALPHA = 0.05


@dataclasses.dataclass(frozen=True)
class Holm:
  """Holm's verdicts on a family of tests, in the order the p-values were given.

  Attributes:
    rejected: whether each test is rejected.
    adjusted: each test's Holm-adjusted p-value (rejected exactly when under ``alpha``).
    alpha: the family-wise level.
  """

  rejected: tuple[bool, ...]
  adjusted: tuple[float, ...]
  alpha: float

  @property
  def smallest_level(self) -> float:
    """``alpha / m``: the level the smallest p-value is held to (Bonferroni's), the one a
    power for "cannot tell" is stated at (NaN for an empty family)."""
    return self.alpha / len(self.rejected) if self.rejected else math.nan


def holm(p_values: Sequence[float], alpha: float = DEFAULT_ALPHA) -> Holm:
  """Holm's step-down correction of ``p_values`` at family-wise level ``alpha``.

  Args:
    p_values: one two-sided p-value per test of the family, each in ``[0, 1]`` (an
      untestable figure is the caller's to leave out or to count as 1).
    alpha: the family-wise level, in ``(0, 1)``.

  Returns:
    A ``Holm``; an empty family rejects nothing.

  Raises:
    ValueError: one line naming the bad p-value or ``alpha``.

  >>> holm([0.001, 0.012, 0.02]).rejected  # 0.001 < 0.05/3, 0.012 < 0.05/2, 0.02 < 0.05
  (True, True, True)
  """
  if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0.0 < alpha < 1.0:
    raise ValueError(f"holm: alpha={alpha!r} must be a number in (0, 1)")
  values = list(p_values)
  for value in values:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
        0.0 <= value <= 1.0):
      raise ValueError(f"holm: p-value {value!r} of {values!r} must be a number in [0, 1] "
                       "(leave an untestable figure out, or count it as 1)")
  m = len(values)
  order = sorted(range(m), key=lambda i: values[i])
  adjusted, rejected = [0.0] * m, [False] * m
  running, still_rejecting = 0.0, True
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (m - rank) * values[i]))
    adjusted[i] = running
    # Step down: the first p-value over its level stops every later rejection.
    still_rejecting = still_rejecting and values[i] < alpha / (m - rank)
    rejected[i] = still_rejecting
  return Holm(tuple(rejected), tuple(float(p) for p in adjusted), float(alpha))
