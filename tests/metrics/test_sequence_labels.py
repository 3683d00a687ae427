"""Fraction labels, soft-label ECEs and the null band against a synthetic task with known
translation probabilities, the binomial closed form and direct loops."""

import functools
import math

import numpy as np
import pytest

from meshbayes import metrics
from meshbayes.metrics import sequence_labels as sl
from tests.metrics.reference_loops import loop_one_sided_ece

NUM_SOURCES = 5000
SHARPENED, FLATTENED = 0.5, 2.0


@pytest.fixture(scope="module")
def task():
  return sl.synthetic_task(NUM_SOURCES, seed=0)


def fraction_standard_error(q, k):
  """Standard error of mean(m / k) - mean(q) when m ~ Binomial(k, q), independently."""
  return math.sqrt(np.sum(q * (1 - q) / k)) / q.size


# --------------------------------------------------------------------------- ground truth


def test_synthetic_task_matches_its_specification(task):
  outputs = task.decode(1.0)
  rate = np.mean(outputs["num_matched"] > 0)
  assert 0.3 <= rate <= 0.9, rate  # the range of exact-match rates
  assert outputs["num_references"].mean() == pytest.approx(1.5, abs=0.05)
  # Calibrated: the model's p is the true probability of its output.
  np.testing.assert_allclose(outputs["probability"], outputs["true_probability"], rtol=1e-12)
  # References are draws from q: the mode's share of them is q(mode) on average.
  share = outputs["num_matched"].sum() / outputs["num_references"].sum()
  expected = np.sum(outputs["true_probability"] * outputs["num_references"]) / outputs[
      "num_references"].sum()
  assert share == pytest.approx(expected, abs=0.02)


@pytest.mark.parametrize("temperature, sign", [(1.0, 0), (SHARPENED, 1), (FLATTENED, -1)])
def test_fraction_labels_recover_the_true_calibration(task, temperature, sign):
  outputs = task.decode(temperature)
  p, q = outputs["probability"], outputs["true_probability"]
  k = outputs["num_references"]
  fraction = sl.reference_fraction_labels(outputs["num_matched"], k)
  gap, true_gap = p.mean() - fraction.mean(), p.mean() - q.mean()
  error = fraction_standard_error(q, k)
  assert abs(gap - true_gap) < 4 * error, (gap, true_gap, error)
  ece = sl.one_sided_ece(p, fraction)
  band = sl.null_band(p, sl.one_sided_ece, num_references=k, seed=1)
  if sign == 0:
    assert true_gap == pytest.approx(0.0, abs=1e-12)
    # Only above the band reads as miscalibration (below it: 2.5% of calibrated models).
    assert ece <= band.high, (ece, band)
    return
  # A temperature moves every mode's p the same way: the true ECE is the true |gap|.
  true_ece = sl.one_sided_ece(p, q)
  assert true_ece == pytest.approx(abs(true_gap), rel=1e-9)
  assert np.sign(gap) == sign and abs(true_gap) > 20 * error
  assert ece > band.high, (ece, band)
  # Every bin's gap has the sign of the miscalibration: the ECE is the measured |gap|, as
  # near the truth as the gap is; the debiased ECE under-states it by the null mean.
  assert abs(ece - true_ece) < 4 * error
  assert sl.debiased_ece(ece, band) == pytest.approx(true_ece - band.mean, abs=4 * error)
  assert band.mean > error  # ... which is not negligible


def test_sharpened_and_flattened_are_over_and_underconfident_by_the_true_amount(task):
  gaps = {}
  for temperature in (SHARPENED, FLATTENED):
    outputs = task.decode(temperature)
    figures = sl.fraction_calibration_figures(outputs["probability"], outputs["num_matched"],
                                              outputs["num_references"])
    gaps[temperature] = (figures["fraction_probability_gap"],
                         np.mean(outputs["probability"] - outputs["true_probability"]))
  error = fraction_standard_error(task.decode(1.0)["true_probability"], task.num_references)
  for measured, truth in gaps.values():
    assert measured == pytest.approx(truth, abs=4 * error)
  assert gaps[SHARPENED][1] > 0.1 and gaps[FLATTENED][1] < -0.1  # sizes the truth gives


def test_any_reference_label_has_the_documented_bias(task):
  outputs = task.decode(1.0)
  p, q, k = outputs["probability"], outputs["true_probability"], outputs["num_references"]
  matched = outputs["num_matched"]
  any_label = sl.any_reference_labels(matched, k)
  np.testing.assert_array_equal(any_label, matched > 0)
  hit = 1 - (1 - q) ** k  # E[any-reference label]
  truth = hit.mean() / q.mean()
  error = math.sqrt(np.sum(hit * (1 - hit))) / q.size / q.mean()
  measured = sl.fraction_calibration_figures(p, matched, k)["match_rate_over_probability"]
  assert measured == pytest.approx(any_label.mean() / p.mean(), rel=1e-12)
  assert abs(measured - truth) < 4 * error, (measured, truth, error)
  assert truth > 1.1  # several references: a calibrated model looks underconfident
  # Read against the single-reference band the calibrated model's any-reference ECE looks
  # miscalibrated; against the band of any-reference labels it does not. (One-sided: here
  # p lies on both sides of 1/2, where the two-class ECE partly cancels the bias.)
  ece = sl.one_sided_ece(p, any_label)
  assert ece > 3 * sl.null_band(p, num_draws=300).high
  assert ece <= sl.null_band(p, num_draws=300, num_references=k, label=sl.ANY).high


def test_distinct_references_undercount_frequent_modes():
  """The same draws (same seed), kept whole or deduplicated: with about 4 references
  per source the mode often repeats, and keeping one copy lowers its fraction."""
  gaps = {}
  for distinct in (False, True):
    outputs = sl.synthetic_task(NUM_SOURCES, mean_references=4.0, distinct_references=distinct,
                                seed=0).decode(1.0)
    p, k = outputs["probability"], outputs["num_references"]
    fraction = sl.reference_fraction_labels(outputs["num_matched"], k)
    error = np.std(fraction - outputs["true_probability"]) / math.sqrt(p.size)
    gaps[distinct] = (p.mean() - fraction.mean(), error, k.mean())
  assert abs(gaps[False][0]) < 4 * gaps[False][1]  # draws: calibrated
  assert gaps[True][0] > 10 * gaps[True][1]  # distinct: a calibrated model looks overconfident
  assert gaps[True][2] < gaps[False][2] - 1  # duplicates were dropped


def test_null_band_covers_a_calibrated_model_at_its_level():
  """The band is the distribution of a calibrated model's ECE given p and k: a 95% band
  holds it about 95% of the time, for fraction labels and for any-reference labels, and
  a sharpened model's ECE lies above it."""
  inside = {sl.FRACTION: [], sl.ANY: []}
  debiased, above_when_sharpened = [], []
  for seed in range(150):
    outputs = sl.synthetic_task(200, seed=seed).decode(1.0)
    p, m, k = outputs["probability"], outputs["num_matched"], outputs["num_references"]
    for label, labels in ((sl.FRACTION, sl.reference_fraction_labels(m, k)),
                          (sl.ANY, sl.any_reference_labels(m, k))):
      band = sl.null_band(p, sl.one_sided_ece, num_draws=400, seed=10_000 + seed,
                          num_references=k, label=label)
      ece = sl.one_sided_ece(p, labels)
      inside[label].append(band.contains(ece))
      if label == sl.FRACTION:
        debiased.append(sl.debiased_ece(ece, band))
        assert debiased[-1] == ece - band.mean
    sharpened = sl.synthetic_task(200, seed=seed).decode(SHARPENED)
    band = sl.null_band(sharpened["probability"], num_draws=400, seed=seed, num_references=k)
    above_when_sharpened.append(sl.one_sided_ece(
        sharpened["probability"], sl.reference_fraction_labels(m, k)) > band.high)
  for label, hits in inside.items():
    assert 0.89 <= np.mean(hits) <= 0.995, (label, np.mean(hits))
  # Given p, a calibrated model's ECE is a draw of the null: its debiased ECE has mean 0.
  assert abs(np.mean(debiased)) < 3 * np.std(debiased) / math.sqrt(len(debiased))
  assert np.mean(above_when_sharpened) > 0.95  # power at n = 200


# --------------------------------------------------------------------------- closed form


def absolute_deviation_distribution(p0, trials, success):
  """Values and probabilities of |p0 - S / trials|, S ~ Binomial(trials, success)."""
  s = np.arange(trials + 1)
  pmf = np.array([math.comb(trials, int(i)) * success ** i * (1 - success) ** (trials - i)
                  for i in s])
  return np.abs(p0 - s / trials), pmf


@pytest.mark.parametrize("ece_fn", [sl.one_sided_ece, sl.two_class_ece])
@pytest.mark.parametrize("num_references, label", [(None, sl.FRACTION), (3, sl.FRACTION),
                                                   (3, sl.ANY)])
def test_null_band_against_the_binomial_closed_form(ece_fn, num_references, label):
  # Every p equal (below 1/2): one bin, and the ECE is |p0 - mean(label)|.
  n, p0, draws = 40, 0.3, 20_000
  k = None if num_references is None else np.full(n, num_references)
  if num_references is None:
    values, pmf = absolute_deviation_distribution(p0, n, p0)
  elif label == sl.FRACTION:  # mean of Binomial(3, p0) / 3 over n items: Binomial(3n, p0) / 3n
    values, pmf = absolute_deviation_distribution(p0, 3 * n, p0)
  else:  # 1[Binomial(3, p0) > 0] ~ Bernoulli(1 - (1 - p0)^3)
    values, pmf = absolute_deviation_distribution(p0, n, 1 - (1 - p0) ** 3)
  levels = (0.1, 0.25, 0.5, 0.75, 0.9)
  band = sl.null_band(np.full(n, p0), ece_fn, num_draws=draws, quantiles=levels,
                      num_references=k, label=label)
  mean = np.sum(pmf * values)
  std = math.sqrt(np.sum(pmf * (values - mean) ** 2))
  assert band.mean == pytest.approx(mean, abs=4 * std / math.sqrt(draws))
  assert band.std == pytest.approx(std, rel=0.05)
  for level, quantile in zip(levels, band.quantiles):
    below, at_most = pmf[values < quantile - 1e-12].sum(), pmf[values <= quantile + 1e-12].sum()
    assert below <= level + 0.015 and at_most >= level - 0.015, (level, quantile, below, at_most)


def test_null_band_calls_any_ece_once_per_draw_with_the_same_draws():
  p = np.random.default_rng(3).beta(0.5, 3, 120)
  k = np.random.default_rng(4).integers(1, 4, 120)
  batched = sl.null_band(p, sl.two_class_ece, num_draws=300, seed=7, num_references=k,
                         label=sl.ANY)
  looped = sl.null_band(p, lambda p, y: metrics.binary_ece(p, y), num_draws=300, seed=7,
                        num_references=k, label=sl.ANY)
  np.testing.assert_allclose(batched.quantiles, looped.quantiles, atol=1e-12)
  assert batched.mean == pytest.approx(looped.mean, abs=1e-12)
  partial = sl.null_band(p, functools.partial(sl.two_class_ece, num_bins=15), num_draws=300,
                         seed=7, num_references=k, label=sl.ANY)
  assert partial == batched
  assert sl.null_band(p, num_draws=300, seed=7) == sl.null_band(p, num_draws=300, seed=7)
  assert sl.null_band(p, num_draws=300, seed=7) != sl.null_band(p, num_draws=300, seed=8)
  assert set(batched.as_dict()) == {"mean", "std", "q0.025", "q0.5", "q0.975"}


# --------------------------------------------------------------------------- brute force


def loop_fraction(matched, references):
  return np.array([m / k for m, k in zip(matched, references)])




def loop_two_class_ece(p, y, num_bins=15):
  """[1 - p, p]: top-label confidence, argmax (the first on ties), the soft label of the
  predicted class."""
  probs = np.stack([1 - p, p], -1)
  confidence, predicted = probs.max(-1), probs.argmax(-1)
  correct = np.where(predicted == 1, y, 1 - y)
  return loop_one_sided_ece(confidence, correct, num_bins)


def random_outputs(seed, n=500):
  rng = np.random.default_rng(seed)
  p = rng.beta(0.7, 2.0, size=n)
  k = rng.integers(1, 6, size=n)
  m = rng.binomial(k, np.clip(1.2 * p, 0, 1))
  return p, m, k


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_direct_loops(seed):
  p, m, k = random_outputs(seed)
  fraction = sl.reference_fraction_labels(m, k)
  np.testing.assert_allclose(fraction, loop_fraction(m, k), rtol=0, atol=0)
  for num_bins in (15, 10, 1):
    assert sl.one_sided_ece(p, fraction, num_bins) == pytest.approx(
        loop_one_sided_ece(p, fraction, num_bins), abs=1e-12)
    assert sl.two_class_ece(p, fraction, num_bins) == pytest.approx(
        loop_two_class_ece(p, fraction, num_bins), abs=1e-12)
  # 0/1 labels: the two-class ECE is sequence_calibration.binary_ece.
  exact = (m > 0).astype(float)
  assert sl.two_class_ece(p, exact) == pytest.approx(metrics.binary_ece(p, exact), abs=1e-12)
  # Every p on one side of 1/2: the two definitions agree; across 1/2 they need not.
  for side in (p <= 0.5, p > 0.5):
    assert sl.one_sided_ece(p[side], fraction[side]) == pytest.approx(
        sl.two_class_ece(p[side], fraction[side]), abs=1e-12)
  assert abs(sl.one_sided_ece(p, fraction) - sl.two_class_ece(p, fraction)) > 1e-3
  # (draws, n) labels: each row scored alone.
  rows = np.stack([fraction, exact, np.full(p.size, 0.5)])
  np.testing.assert_allclose(sl.one_sided_ece(p, rows),
                             [sl.one_sided_ece(p, row) for row in rows], atol=1e-12)
  np.testing.assert_allclose(sl.two_class_ece(p, rows),
                             [sl.two_class_ece(p, row) for row in rows], atol=1e-12)


def test_hand_made_cases():
  # Bin [0, 0.1): |0.05 - 0.25| for two outputs; bin 0.9: |0.95 - 1| for one.
  assert sl.one_sided_ece([0.05, 0.05, 0.95], [0.5, 0.0, 1.0], 10) == pytest.approx(0.15)
  # Both in the middle bin: one-sided |0.5 - 1| = 0.5; two-class (0.48 scored by 1 - y):
  # |(0 - 0.52) + (1 - 0.52)| / 2 = 0.02.
  assert sl.one_sided_ece([0.48, 0.52], [1.0, 1.0]) == pytest.approx(0.5)
  assert sl.two_class_ece([0.48, 0.52], [1.0, 1.0]) == pytest.approx(0.02)
  # p and 1 - p share a two-class bin: 0.1 (scored 1 - y = 0, confidence 0.9) and 0.9
  # (scored y = 1): |(0 - 0.9) + (1 - 0.9)| / 2 = 0.4; one-sided, apart: (0.9 + 0.1) / 2.
  assert sl.two_class_ece([0.1, 0.9], [1.0, 1.0]) == pytest.approx(0.4)
  assert sl.one_sided_ece([0.1, 0.9], [1.0, 1.0]) == pytest.approx(0.5)
  assert math.isnan(sl.one_sided_ece([], []))
  matched, counts = sl.reference_match_counts(["Oui.", "oui", "Non"],
                                              [["oui .", "Oui.", "Si"], ["Oui!"], ["non"]])
  assert matched.tolist() == [2, 0, 1] and counts.tolist() == [3, 1, 1]
  figures = sl.fraction_calibration_figures([0.4, 0.2, 0.3], [1, 0, 2], [2, 1, 2])
  # label - p: 0.1, -0.2, 0.7; mean 0.2, sample std sqrt(0.21), z = 0.2 / sqrt(0.21 / 3).
  z = 0.2 / math.sqrt(0.21 / 3)
  assert figures == pytest.approx({"reference_fraction": 0.5, "fraction_probability_gap": -0.2,
                                   "fraction_signed_gap": 0.2, "fraction_signed_gap_z": z,
                                   "fraction_signed_gap_p_value": math.erfc(z / math.sqrt(2)),
                                   "fraction_ece": (0.1 + 0.2 + 0.7) / 3,
                                   "match_rate_over_probability": (2 / 3) / 0.3})
  one = sl.fraction_calibration_figures([0.4], [1], [2])  # one output: a gap, no test
  assert one["fraction_signed_gap"] == pytest.approx(0.1)
  assert math.isnan(one["fraction_signed_gap_z"]) and math.isnan(one["fraction_signed_gap_p_value"])


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("call, message", [
    (lambda: sl.one_sided_ece([0.2, 1.2], [0, 1]),
     "probabilities must lie in [0, 1]; got 1.2 at index 1"),
    (lambda: sl.two_class_ece([0.2, float("nan")], [0, 1]), "got nan at index 1"),
    (lambda: sl.one_sided_ece([0.2, 0.3], [0, 1.5]),
     "labels must lie in [0, 1]; got 1.5 at index 1"),
    (lambda: sl.one_sided_ece([0.2, 0.3], [0]), "got shape (1,)"),
    (lambda: sl.one_sided_ece([0.2], [0], num_bins=0), "num_bins=0"),
    (lambda: sl.reference_fraction_labels([1, 3], [1, 2]),
     "num_matched 3 exceeds num_references 2 at index 1"),
    (lambda: sl.reference_fraction_labels([0], [0]),
     "num_references must be ints >= 1; got 0 at index 0"),
    (lambda: sl.reference_fraction_labels([0.5], [1]), "num_matched must be ints >= 0; got 0.5"),
    (lambda: sl.reference_fraction_labels([-1], [1]), "got -1 at index 0"),
    (lambda: sl.reference_fraction_labels([0, 1], [1]), "one length; got 2 and 1"),
    (lambda: sl.any_reference_labels([2], [1]), "num_matched 2 exceeds"),
    (lambda: sl.fraction_calibration_figures([0.1, 0.2], [0], [1]), "2 probabilities but 1"),
    (lambda: sl.null_band([0.1, 0.2], num_references=[1]), "2 probabilities but 1 reference"),
    (lambda: sl.null_band([0.1], num_references=[[1]]), "num_references must be 1-D"),
    (lambda: sl.null_band([0.1], num_references=[0]), "num_references must be ints >= 1; got 0"),
    (lambda: sl.null_band([0.1], quantiles=(0.0, 0.5)), "quantiles=(0.0, 0.5)"),
    (lambda: sl.null_band([0.1], num_draws=0), "num_draws=0"),
    (lambda: sl.null_band([0.1], num_references=[1], label="all"), "label='all'"),
    (lambda: sl.null_band([-0.1]), "got -0.1 at index 0"),
    (lambda: sl.reference_match_counts(["a"], []), "1 predictions but 0"),
    (lambda: sl.reference_match_counts(["a"], [[]]), "source 0 has no reference"),
    (lambda: sl.synthetic_task(10).decode(0.0), "temperature=0.0"),
    (lambda: sl.synthetic_task(0), "num_sources=0"),
])
def test_bad_input_is_a_one_line_value_error(call, message):
  with pytest.raises(ValueError) as error:
    call()
  assert message in str(error.value) and "\n" not in str(error.value), str(error.value)
