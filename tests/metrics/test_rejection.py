"""The prediction rejection ratio against a plain numpy implementation."""

import numpy as np
import pytest

from meshbayes import metrics


def numpy_prr(errors, uncertainties):
  """Malinin & Gales's ratio written out with loops: reject the k most uncertain (k = 0..n),
  their errors become 0; areas by the trapezoid rule over k / n."""
  n = len(errors)

  def area(order):
    curve = [sum(errors[i] for i in order[k:]) / n for k in range(n + 1)]
    return sum((curve[k] + curve[k + 1]) / 2 / n for k in range(n))

  by_uncertainty = sorted(range(n), key=lambda i: -uncertainties[i])
  by_error = sorted(range(n), key=lambda i: -errors[i])
  random = np.mean(errors) / 2
  return (random - area(by_uncertainty)) / (random - area(by_error))


@pytest.mark.parametrize("seed", [0, 1])
def test_prr_against_numpy_on_random_data(seed):
  rng = np.random.default_rng(seed)
  errors = rng.random(300)
  uncertainties = errors + rng.normal(0, 0.3, size=300)  # informative, not perfect
  value = metrics.prediction_rejection_ratio(errors, uncertainties)
  assert value == pytest.approx(numpy_prr(errors, uncertainties), abs=1e-10)
  assert 0.3 < value < 1


def test_prr_is_one_for_the_oracle_about_zero_for_chance_and_negative_backwards():
  rng = np.random.default_rng(3)
  errors = rng.random(2000)
  assert metrics.prediction_rejection_ratio(errors, errors) == pytest.approx(1.0)
  assert metrics.prediction_rejection_ratio(errors, 3 * errors + 1) == pytest.approx(1.0)
  chance = [metrics.prediction_rejection_ratio(errors, rng.random(2000)) for _ in range(20)]
  assert abs(np.mean(chance)) < 0.03 and max(map(abs, chance)) < 0.12
  assert metrics.prediction_rejection_ratio(errors, -errors) == pytest.approx(-1.0)


def test_ties_reject_at_their_mean_error():
  """A constant measure is a random order in expectation: PRR exactly 0, and its curve is
  the straight line."""
  errors = np.array([0.9, 0.1, 0.4, 0.2])
  assert metrics.prediction_rejection_ratio(errors, np.zeros(4)) == pytest.approx(0.0, abs=1e-12)
  fractions, curve = metrics.rejection_curve(errors, np.zeros(4))
  np.testing.assert_allclose(curve, errors.mean() * (1 - fractions))
  assert np.isnan(metrics.prediction_rejection_ratio(np.full(4, 0.5), [1, 2, 3, 4]))
  with pytest.raises(ValueError, match="must not contain NaN"):
    metrics.prediction_rejection_ratio([0.5, np.nan], [1, 2])
