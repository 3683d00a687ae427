"""The power calculations of ``metrics.sequence_power`` against simulation, on the
Tatoeba-like sources of tests/metrics/tatoeba_like_sources.py (fixed seeds).

Tolerances: a rate over ``NUM_TESTS`` simulated test sets has a Monte Carlo standard error
of at most 0.016; the closed forms are normal approximations, within 0.04 of simulation here
(from about 10 expected reference-fraction positives; closest at many). Each closed form is
asserted within ``TOLERANCE`` = 0.05 of its simulation, the simulated ECE band power within
three of its Monte Carlo standard errors of an independent simulation.
"""

import math

import numpy as np
import pytest

from meshbayes.metrics import sequence_gap
from meshbayes.metrics import sequence_labels as sl
from meshbayes.metrics import sequence_power as sp
from tests.metrics.tatoeba_like_sources import tatoeba_like_sources

NUM_TESTS = 1000
TOLERANCE = 0.05
ALPHA = 0.05


@pytest.fixture(scope="module")
def population():
  return tatoeba_like_sources()


def simulated_gap_power(q, k, num_sources, factor, seed):
  """The rejection rate of ``sequence_gap.gap_test`` on ``NUM_TESTS`` test sets of
  ``num_sources`` sources drawn from the population."""
  rng = np.random.default_rng(seed)
  rejected = 0
  for _ in range(NUM_TESTS):
    index = rng.integers(0, q.size, num_sources)
    labels = rng.binomial(k[index], q[index]) / k[index]
    rejected += sequence_gap.gap_test(np.minimum(factor * q[index], 1.0), labels).p_value < ALPHA
  return rejected / NUM_TESTS


@pytest.mark.parametrize("num_sources, factor, seed", [
    (2000, 1.0, 0), (1000, 1.25, 1), (600, 1.5, 2), (2000, 0.8, 3), (300, 1.5, 4)])
def test_gap_test_power_against_simulation(population, num_sources, factor, seed):
  q, k = population
  predicted = sp.gap_test_power(num_sources, q, factor, k, ALPHA)
  simulated = simulated_gap_power(q, k, num_sources, factor, seed)
  assert simulated == pytest.approx(predicted, abs=TOLERANCE), (predicted, simulated)
  if factor == 1.0:
    assert predicted == pytest.approx(ALPHA, abs=1e-12)
  else:
    assert 0.3 < predicted < 0.9  # the middle, where an error in the formula would show


def test_sources_for_gap_power_reach_it(population):
  q, k = population
  needed = sp.sources_for_gap_power(q, 1.25, k)
  assert sp.gap_test_power(needed, q, 1.25, k) >= 0.8 > sp.gap_test_power(needed - 1, q, 1.25, k)
  assert simulated_gap_power(q, k, needed, 1.25, seed=5) == pytest.approx(0.8, abs=TOLERANCE)
  # Four times the sources halve the detectable effect: about.
  assert sp.sources_for_gap_power(q, 1.125, k) == pytest.approx(4 * needed, rel=0.05)
  assert sp.sources_for_gap_power(q, 1.25, k, power=0.9) > needed


def fixed_source_band_rate(q, k, factor, num_bands=50, models_per_band=200):
  """The one-sided fraction ECE's rate above its band's 97.5% point on fixed sources, each
  of ``num_bands`` bands (200 draws, as ``ece_band_power``'s) read by its own label sets."""
  p = np.minimum(factor * q, 1.0)
  rng = np.random.default_rng(6)
  rates = []
  for band_seed in range(num_bands):
    labels = rng.binomial(k, q, size=(models_per_band, q.size)) / k
    band = sl.null_band(p, sl.one_sided_ece, 200, seed=band_seed, num_references=k)
    rates.append(np.mean(sl.one_sided_ece(p, labels) > band.high))
  return float(np.mean(rates))


def test_ece_band_power_at_its_level_and_against_fixed_sources(population):
  q, k = population
  # A 200-draw band's 97.5% point is about the 195th of 200 draws: a calibrated model lies
  # above it about 1 - 195/201 = 3% of the time.
  simulations = 200
  calibrated = sp.ece_band_power(300, q, 1.0, k, num_simulations=simulations, seed=1)
  assert calibrated <= 0.03 + 3 * math.sqrt(0.03 * 0.97 / simulations)
  # One true probability for all (the sources differ only in k, so resampling them hardly
  # matters): the simulation against fixed sources drawn from the same counts.
  simulations = 150
  resampled = sp.ece_band_power(1000, np.full(k.size, 0.04), 1.4, k,
                                num_simulations=simulations, seed=2)
  fixed = fixed_source_band_rate(np.full(1000, 0.04),
                                 k[np.random.default_rng(5).integers(0, k.size, 1000)], 1.4)
  error = math.sqrt(fixed * (1 - fixed) / simulations)
  assert 0.3 < fixed < 0.9 and resampled == pytest.approx(fixed, abs=3 * error)
  stronger = sp.ece_band_power(1000, np.full(k.size, 0.04), 2.0, k, num_simulations=50, seed=3)
  assert stronger > fixed + 3 * error
  assert stronger == sp.ece_band_power(1000, np.full(k.size, 0.04), 2.0, k, num_simulations=50,
                                       seed=3)


def paired_outputs(q, k, rng, num_sources, shared=0.6, factor=1.3):
  """Two predictives on the same sources: A decodes an output of truth ``q_A`` with
  ``p = q_A`` (calibrated); B the same output on a ``shared`` fraction of the sources,
  another (of truth ``q_B``) on the rest, with ``p = factor q``. Both are scored against
  the same references: ``Multinomial(k, [q_A, q_B, rest])``."""
  index, other = rng.integers(0, q.size, (2, num_sources))
  q_a, counts = q[index], k[index]
  same = rng.random(num_sources) < shared
  q_b = np.where(same, 0.0, np.minimum(q[other], 1.0 - q_a))
  matched = rng.multinomial(counts, np.stack([q_a, q_b, 1.0 - q_a - q_b], -1))
  labels_a = matched[:, 0] / counts
  labels_b = np.where(same, labels_a, matched[:, 1] / counts)
  p_b = factor * np.where(same, q_a, q_b)
  return q_a, labels_a, p_b, labels_b, np.where(same, q_a, q_b)


def test_paired_gap_power_against_simulation(population):
  q, k = population
  rng = np.random.default_rng(8)
  # The truth from one large sample: the paired std (as a design would measure it on outputs
  # at hand) and the true difference of the gaps, 0 - (1 - factor) E[q_B'].
  p_a, labels_a, p_b, labels_b, truth_b = paired_outputs(q, k, rng, 400_000)
  paired_std = sequence_gap.paired_gap_test(p_a, labels_a, p_b, labels_b).std
  difference = float(np.mean(0.3 * truth_b))
  assert difference == pytest.approx(0.3 * np.mean(q), rel=0.02)
  num_sources = sp.sources_for_paired_power(difference, paired_std, power=0.6)
  predicted = sp.paired_gap_power(num_sources, difference, paired_std)
  assert 0.6 <= predicted < sp.paired_gap_power(num_sources + 50, difference, paired_std)
  rejected = 0
  for _ in range(NUM_TESTS):
    test = sequence_gap.paired_gap_test(*paired_outputs(q, k, rng, num_sources)[:4])
    rejected += test.p_value < ALPHA and test.estimate > 0
  assert rejected / NUM_TESTS == pytest.approx(predicted, abs=TOLERANCE)
  assert sp.paired_gap_power(num_sources, 0.0, paired_std) == pytest.approx(ALPHA)


def test_positives_against_simulated_counts(population):
  q, k = population
  rate, wanted = float(np.mean(q)), 100
  needed = sp.sources_for_positives(rate, wanted, probability=0.9)
  assert needed * rate >= wanted and sp.positives_probability(needed, rate, wanted) >= 0.9
  assert sp.positives_probability(needed - 1, rate, wanted) < 0.9
  rng = np.random.default_rng(9)
  draws = 2000
  index = rng.integers(0, q.size, (draws, needed))
  # 0/1 labels at the rate: the binomial itself.
  exact = np.mean((rng.random((draws, needed)) < rate).sum(-1) >= wanted)
  assert exact == pytest.approx(0.9, abs=3 * math.sqrt(0.09 / draws))
  # Reference-fraction positives (sums of m / k): at least as likely to reach the count.
  fractions = (rng.binomial(k[index], q[index]) / k[index]).sum(-1)
  assert np.mean(fractions >= wanted) >= 0.9 - 3 * math.sqrt(0.09 / draws)
  # The expectation alone: N = K / rate, about even odds.
  assert sp.sources_for_positives(rate, wanted) == pytest.approx(wanted / rate, abs=2)


@pytest.mark.parametrize("call, message", [
    (lambda: sp.gap_test_power(0, 0.03, 1.5), "gap_test_power: num_sources=0 must be a positive"),
    (lambda: sp.gap_test_power(100, 1.5, 1.5), "true_probabilities must be a number or a non-"),
    (lambda: sp.gap_test_power(100, [0.1, 0.2], 1.5, [1]), "2 true probabilities but 1 reference"),
    (lambda: sp.gap_test_power(100, 0.1, 1.5, 0), "num_references must be ints >= 1; got 0"),
    (lambda: sp.gap_test_power(100, 0.1, -1.0), "gap_test_power: factor=-1.0 must be a positive"),
    (lambda: sp.gap_test_power(100, 0.0, 1.5), "every source's label - p is the same"),
    (lambda: sp.gap_test_power(100, 0.1, 1.5, alpha=1.0), "alpha=1.0 must be a number in (0, 1)"),
    (lambda: sp.sources_for_gap_power(0.1, 1.0), "sources_for_gap_power: a true effect of 0"),
    (lambda: sp.sources_for_gap_power(0.1, 1.5, power=0), "power=0 must be a number in (0, 1)"),
    (lambda: sp.ece_band_power(100, 0.1, 1.5, num_simulations=0), "num_simulations=0 must be"),
    (lambda: sp.ece_band_power(100, 0.1, 1.5, quantile=97.5), "quantile=97.5 must be a number"),
    (lambda: sp.paired_gap_power(100, 0.01, 0.0), "paired_std=0.0 must be a positive number"),
    (lambda: sp.paired_gap_power(100, float("nan"), 0.1), "difference=nan must be a finite"),
    (lambda: sp.sources_for_paired_power(0.0, 0.1), "a true effect of 0"),
    (lambda: sp.positives_probability(100, 0.0), "rate=0.0 must be a number in (0, 1)"),
    (lambda: sp.sources_for_positives(0.02, min_positives=0), "min_positives=0 must be a posi"),
    (lambda: sp.sources_for_positives(0.02, probability=1.0), "probability=1.0 must be a num"),
])
def test_bad_input_is_a_one_line_value_error(call, message):
  with pytest.raises(ValueError) as error:
    call()
  assert message in str(error.value) and "\n" not in str(error.value), str(error.value)
