"""The smallest true effect a test detects (``metrics.seed_power``): the z-test's closed
form, and the t-test over a few seeds against simulation (fixed seeds; 40,000 simulated
experiments: a rate's Monte Carlo standard error 0.002)."""

import math
import statistics

import numpy as np
import pytest
from scipy import stats

from meshbayes.metrics import seed_power


def test_the_z_test_needs_the_two_quantiles_in_standard_errors():
  """Power 0.8 at 0.05: 1.95996 + 0.84162 = 2.80158 standard errors (the far tail adds
  Phi(-4.76), under 1e-6)."""
  normal = statistics.NormalDist()
  closed = normal.inv_cdf(0.975) + normal.inv_cdf(0.8)
  assert seed_power.detectable_effect(1.0) == pytest.approx(closed, abs=1e-5)
  assert seed_power.detectable_effect(0.002) == pytest.approx(0.002 * closed, abs=1e-8)
  assert seed_power.rejection_rate(0.0) == pytest.approx(0.05)


@pytest.mark.parametrize("seeds, alpha", [(5, 0.05), (5, 0.05 / 7), (3, 0.05 / 5)])
def test_the_t_test_over_seeds_detects_it_with_probability_point_8(seeds, alpha):
  """Simulated experiments of ``seeds`` normal differences (stddev 1) at the true mean it
  gives: their one-sample t-test at ``alpha`` rejects 80% of the time."""
  effect = seed_power.detectable_effect(1.0 / math.sqrt(seeds), alpha, df=seeds - 1)
  rng = np.random.default_rng(seeds)
  draws = rng.normal(effect, 1.0, size=(40_000, seeds))
  t = draws.mean(1) / (draws.std(1, ddof=1) / math.sqrt(seeds))
  rate = np.mean(np.abs(t) > stats.t.ppf(1 - alpha / 2, seeds - 1))
  assert rate == pytest.approx(0.8, abs=0.008)
  # Fewer degrees of freedom and a stricter level need more than the z-test's 2.80.
  assert effect * math.sqrt(seeds) > 2.80


def test_no_spread_gives_no_power_and_bad_input_is_one_line():
  assert math.isnan(seed_power.detectable_effect(0.0, df=4))
  assert math.isnan(seed_power.detectable_effect(math.nan))
  with pytest.raises(ValueError, match=r"detectable_effect: alpha=0.0 must be a number in"):
    seed_power.detectable_effect(1.0, alpha=0.0)
  with pytest.raises(ValueError, match=r"power=0.01 must exceed alpha=0.05"):
    seed_power.detectable_effect(1.0, power=0.01)
  with pytest.raises(ValueError, match=r"df=0 must be a positive number or None"):
    seed_power.detectable_effect(1.0, df=0)
  with pytest.raises(ValueError, match=r"standard_error=-1.0 must be a number >= 0"):
    seed_power.detectable_effect(-1.0)
