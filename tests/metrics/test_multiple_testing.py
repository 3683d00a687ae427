"""Holm's step-down correction (``metrics.multiple_testing``): hand-computed families, the
closed-testing definition it is the shortcut of, and its family-wise error rate."""

import itertools
import math

import numpy as np
import pytest

from meshbayes.metrics import multiple_testing


def closed_testing(p_values, alpha):
  """Holm by its definition (Marcus et al.'s closed testing with Bonferroni's test of each
  intersection): ``H_i`` is rejected when every subset ``S`` holding it has
  ``min_{j in S} p_j < alpha / |S|``. Exponential; for the test only."""
  m = len(p_values)
  return tuple(all(min(p_values[j] for j in subset) < alpha / len(subset)
                   for size in range(1, m + 1)
                   for subset in itertools.combinations(range(m), size) if i in subset)
               for i in range(m))


def test_a_family_of_four_by_hand():
  """Sorted 0.01, 0.03, 0.04, 0.20 against 0.05/4, 0.05/3, 0.05/2, 0.05: 0.01 < 0.0125
  rejects, 0.03 > 0.0167 stops. Adjusted: 4 x 0.01 = 0.04, 3 x 0.03 = 0.09, max(0.09,
  2 x 0.04) = 0.09, 0.20."""
  result = multiple_testing.holm([0.01, 0.04, 0.03, 0.20])
  assert result.rejected == (True, False, False, False)
  assert result.adjusted == pytest.approx((0.04, 0.09, 0.09, 0.20))
  assert result.smallest_level == 0.0125


def test_holm_rejects_what_bonferroni_does_and_more():
  """0.001, 0.012, 0.02: Bonferroni's 0.05/3 = 0.0167 rejects two; Holm's step-down
  0.0167, 0.025, 0.05 rejects all three."""
  p_values = [0.001, 0.012, 0.02]
  assert sum(p < 0.05 / 3 for p in p_values) == 2
  result = multiple_testing.holm(p_values)
  assert result.rejected == (True, True, True)
  assert result.adjusted == pytest.approx((0.003, 0.024, 0.024))


def test_the_first_failure_stops_every_later_rejection():
  # Sorted 0.005, 0.011, 0.5 against 0.0167, 0.025, 0.05: the first two rejected.
  assert multiple_testing.holm([0.005, 0.5, 0.011]).rejected == (True, False, True)
  # Sorted 0.004, 0.03, 0.031: 0.03 > 0.025 stops, so 0.031 is kept though under 0.05.
  assert multiple_testing.holm([0.031, 0.004, 0.03]).rejected == (False, True, False)


def test_one_test_is_the_test_itself_and_rejection_is_strict():
  assert multiple_testing.holm([0.049]).rejected == (True,)
  assert multiple_testing.holm([0.05]).rejected == (False,)
  assert multiple_testing.holm([0.049]).adjusted == (0.049,)
  empty = multiple_testing.holm([])
  assert empty.rejected == () and math.isnan(empty.smallest_level)


def test_it_is_closed_testing_with_bonferroni():
  rng = np.random.default_rng(0)
  for _ in range(300):
    m = int(rng.integers(1, 7))
    # Small p-values often enough that rejections are decided at every step.
    p_values = list(rng.uniform(0, 0.08, m) ** rng.uniform(0.5, 2))
    result = multiple_testing.holm(p_values)
    assert result.rejected == closed_testing(p_values, 0.05), p_values
    assert result.rejected == tuple(p < 0.05 for p in result.adjusted)


def test_the_family_wise_error_rate_under_the_null():
  """Five independent true nulls (uniform p-values): Holm rejects any one only when the
  smallest is under 0.01, probability 1 - 0.99^5 = 0.0490; 20,000 families: standard error
  0.0015."""
  rng = np.random.default_rng(1)
  families = rng.uniform(size=(20_000, 5))
  rate = np.mean([any(multiple_testing.holm(list(p)).rejected) for p in families])
  assert rate == pytest.approx(1 - 0.99**5, abs=0.005)


@pytest.mark.parametrize("p_values, alpha, message", [
    ([0.2, 1.5], 0.05, r"holm: p-value 1.5 of \[0.2, 1.5\] must be a number in \[0, 1\]"),
    ([math.nan], 0.05, r"holm: p-value nan of \[nan\] must be a number in \[0, 1\]"),
    ([0.2], 0.0, r"holm: alpha=0.0 must be a number in \(0, 1\)"),
])
def test_bad_input_is_one_line(p_values, alpha, message):
  with pytest.raises(ValueError, match=message):
    multiple_testing.holm(p_values, alpha)
