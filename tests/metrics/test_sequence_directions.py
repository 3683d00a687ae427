"""Which sequence calibration figures see over- and underconfidence (issue 69), and the
signed gap's z-test (``metrics.sequence_gap``) against hand computation and the bootstrap.

The simulation: the 2,000 sources of ``tatoeba_like_sources`` (the test split's reference
counts, a fixed truth ``q`` per source: about 91 exact-match and 67 reference-fraction
positives expected). Each of ``NUM_MODELS`` simulated models draws its references as
``m ~ Binomial(k, q)`` and reports ``p = min(c q, 1)``. A figure flags a model when its ECE
lies above the 97.5% point of its null band (``NULL_DRAWS`` label sets of a calibrated
model on the same ``p`` and ``k``), or when the signed gap's z-test rejects at 5% in that
direction. Sources fixed, labels redrawn: each band is conditional on ``p`` and ``k``, so
one band per ``c`` serves every model. The rates are docs/measures.md's table
(``simulated_rates`` computes them).
"""

import math

import numpy as np
import pytest
from scipy import stats

from meshbayes.metrics import bootstrap, measures, sequence_gap
from meshbayes.metrics import sequence_labels as sl
from tests.metrics.tatoeba_like_sources import tatoeba_like_sources

FACTORS = (0.5, 0.67, 1.0, 1.25, 1.5, 2.0)  # p = c q: under 1 underconfident, above over
NUM_MODELS, NULL_DRAWS = 1000, 1000
LABEL_SEED, BAND_SEED = 1, 2
ALPHA = 0.05


def simulated_rates() -> dict[float, dict[str, float]]:
  """For each factor ``c``: the fraction of the models each figure flags.

  Keys: ``exact_ece_above`` (two-class ECE against exact-match labels above its band),
  ``exact_ece_below`` (below the band's 2.5% point), ``fraction_ece_above`` (one-sided
  reference-fraction ECE above its band), ``gap_overconfident`` and
  ``gap_underconfident`` (``sequence_gap.verdict`` at ``ALPHA``).
  """
  q, k = tatoeba_like_sources()
  matched = np.random.default_rng(LABEL_SEED).binomial(k, q, size=(NUM_MODELS, k.size))
  exact, fraction = (matched > 0).astype(np.float64), matched / k
  rates = {}
  for factor in FACTORS:
    p = np.minimum(factor * q, 1.0)
    exact_band = sl.null_band(p, sl.two_class_ece, NULL_DRAWS, BAND_SEED, num_references=k,
                              label=sl.ANY)
    fraction_band = sl.null_band(p, sl.one_sided_ece, NULL_DRAWS, BAND_SEED, num_references=k,
                                 label=sl.FRACTION)
    exact_ece, fraction_ece = sl.two_class_ece(p, exact), sl.one_sided_ece(p, fraction)
    verdicts = [sequence_gap.gap_verdict(p, labels, ALPHA) for labels in fraction]
    rates[factor] = {
        "exact_ece_above": float(np.mean(exact_ece > exact_band.high)),
        "exact_ece_below": float(np.mean(exact_ece < exact_band.low)),
        "fraction_ece_above": float(np.mean(fraction_ece > fraction_band.high)),
        "gap_overconfident": verdicts.count(sequence_gap.OVERCONFIDENT) / NUM_MODELS,
        "gap_underconfident": verdicts.count(sequence_gap.UNDERCONFIDENT) / NUM_MODELS}
  return rates


@pytest.fixture(scope="module")
def rates():
  return simulated_rates()


def test_the_sources_are_tatoeba_like():
  q, k = tatoeba_like_sources()
  assert k.size == 2000 and k.sum() == 2950  # the test split's sources and pairs
  assert np.sum(1 - (1 - q) ** k) == pytest.approx(91, abs=1)  # expected exact matches
  assert q.sum() == pytest.approx(67, abs=1)  # expected reference-fraction positives
  assert q.max() < 0.65


def test_the_exact_match_ece_cannot_see_overconfidence(rates):
  for factor in (1.25, 1.5, 2.0):
    assert rates[factor]["exact_ece_above"] <= 0.02, (factor, rates[factor])
  # ... its overconfident models fall inside or below the band (at 1.5x often below) ...
  assert rates[1.5]["exact_ece_below"] >= 0.3
  # ... while it sees underconfidence.
  for factor in (0.5, 0.67):
    assert rates[factor]["exact_ece_above"] >= 0.85, (factor, rates[factor])


def test_the_reference_fraction_figures_see_both_directions(rates):
  assert rates[1.5]["fraction_ece_above"] >= 0.7
  assert rates[2.0]["fraction_ece_above"] >= 0.97
  assert rates[0.5]["fraction_ece_above"] >= 0.97 and rates[0.67]["fraction_ece_above"] >= 0.6
  assert rates[1.5]["gap_overconfident"] >= 0.95 and rates[2.0]["gap_overconfident"] >= 0.99
  assert rates[1.25]["gap_overconfident"] >= 0.5
  assert rates[0.5]["gap_underconfident"] >= 0.99 and rates[0.67]["gap_underconfident"] >= 0.8
  for factor in FACTORS:  # never the wrong direction
    wrong = "gap_underconfident" if factor > 1 else "gap_overconfident"
    assert factor == 1.0 or rates[factor][wrong] <= 0.005, (factor, rates[factor])


def test_a_calibrated_model_is_flagged_at_about_the_tests_level(rates):
  calibrated = rates[1.0]
  assert 0.02 <= calibrated["gap_overconfident"] + calibrated["gap_underconfident"] <= 0.09
  assert calibrated["fraction_ece_above"] <= 0.06 and calibrated["exact_ece_above"] <= 0.06


# --------------------------------------------------------------------------- the gap's test


def test_gap_test_by_hand():
  p, labels = [0.1, 0.2, 0.1, 0.3], [0.0, 0.5, 0.0, 1.0]
  terms = np.array(labels) - np.array(p)  # -0.1, 0.3, -0.1, 0.7
  test = sequence_gap.gap_test(p, labels, level=0.9)
  error = terms.std(ddof=1) / 2
  assert test.estimate == pytest.approx(0.2) and test.std == pytest.approx(math.sqrt(0.44 / 3))
  assert test.z == pytest.approx(0.2 / error)
  assert test.p_value == pytest.approx(2 * stats.norm.sf(0.2 / error))
  assert (test.low, test.high) == pytest.approx((0.2 - 1.6448536 * error, 0.2 + 1.6448536 * error))
  assert test.num_sources == 4 and test.level == 0.9
  paired = sequence_gap.paired_gap_test(p, labels, [0.2, 0.2, 0.1, 0.1], [0.0, 0.0, 0.0, 1.0])
  baseline_terms = np.array([-0.2, -0.2, -0.1, 0.9])
  assert paired.estimate == pytest.approx(np.mean(terms - baseline_terms))
  assert paired.std == pytest.approx(np.std(terms - baseline_terms, ddof=1))


def test_the_interval_agrees_with_the_bootstrap_over_sources():
  q, k = tatoeba_like_sources()
  p = np.minimum(1.5 * q, 1.0)
  labels = np.random.default_rng(3).binomial(k, q) / k
  test = sequence_gap.gap_test(p, labels)
  interval = bootstrap.bootstrap(
      lambda index: {"gap": float(np.mean(labels[index] - p[index]))}, [k.size], 2000, 0)["gap"]
  assert interval.estimate == pytest.approx(test.estimate, abs=1e-15)
  width = test.high - test.low
  assert interval.low == pytest.approx(test.low, abs=0.05 * width)
  assert interval.high == pytest.approx(test.high, abs=0.05 * width)
  # The interval excludes 0 exactly when the test rejects at 1 - level.
  assert (test.high < 0) == (test.p_value < ALPHA) and test.high < 0


def test_evaluations_report_the_gap_and_its_test():
  q, k = tatoeba_like_sources()
  p = np.minimum(1.5 * q, 1.0)
  matched = np.random.default_rng(4).binomial(k, q)
  figures = sl.fraction_calibration_figures(p, matched, k)
  test = sequence_gap.gap_test(p, matched / k)
  assert figures["fraction_signed_gap"] == pytest.approx(test.estimate, abs=1e-15)
  assert figures["fraction_signed_gap"] == pytest.approx(-figures["fraction_probability_gap"])
  assert figures["fraction_signed_gap_z"] == test.z < -3
  assert figures["fraction_signed_gap_p_value"] == test.p_value
  for name in ("fraction_signed_gap", "fraction_signed_gap_z", "fraction_signed_gap_p_value"):
    assert measures.get(name).level == measures.SEQUENCE, name
    assert measures.positives_figure(name) == "reference_fraction_positives"
    assert measures.get(measures.equivalence_figure("chrf++>=0.8", name)).kind == measures.FIGURE
  assert "blind to overconfidence" in measures.get("sequence_ece").definition


def test_verdicts_follow_the_sign_and_the_level():
  assert sequence_gap.verdict(-0.01, 0.049) == sequence_gap.OVERCONFIDENT
  assert sequence_gap.verdict(0.01, 0.049) == sequence_gap.UNDERCONFIDENT
  assert sequence_gap.verdict(-0.01, 0.05) == sequence_gap.CALIBRATED  # p < alpha rejects
  assert sequence_gap.verdict(-0.01, 0.02, alpha=0.01) == "calibrated within noise"
  p, labels = np.full(400, 0.1), np.r_[np.ones(20), np.zeros(380)]  # 5% against 10%
  assert sequence_gap.gap_verdict(p, labels) == "overconfident"
  assert sequence_gap.gap_verdict(p, np.r_[np.ones(80), np.zeros(320)]) == "underconfident"


def test_too_few_sources_or_no_spread_give_nan_and_no_verdict():
  one = sequence_gap.gap_test([0.2], [1.0])
  assert one.estimate == pytest.approx(0.8) and math.isnan(one.p_value) and math.isnan(one.low)
  flat = sequence_gap.gap_test([0.1, 0.1], [0.0, 0.0])
  assert flat.estimate == pytest.approx(-0.1) and flat.std == 0 and math.isnan(flat.z)
  assert (flat.low, flat.high) == (flat.estimate, flat.estimate)
  assert math.isnan(sequence_gap.gap_test([], []).estimate)
  with pytest.raises(ValueError, match=r"^verdict: gap=-0\.1, p_value=nan must be"):
    sequence_gap.gap_verdict([0.1, 0.1], [0.0, 0.0])


@pytest.mark.parametrize("call, message", [
    (lambda: sequence_gap.gap_test([0.2, 1.2], [0, 1]),
     "gap_test: probabilities must lie in [0, 1]; got 1.2 at index 1"),
    (lambda: sequence_gap.gap_test([0.2, 0.3], [0, 2]),
     "gap_test: labels must lie in [0, 1]; got 2.0 at index 1"),
    (lambda: sequence_gap.gap_test([0.2, 0.3], [[0, 1]]),
     "gap_test: labels must be 1-D, one per output; got shape (1, 2)"),
    (lambda: sequence_gap.gap_test([0.2], [0], level=1.0),
     "gap_test: level=1.0 must be a number in (0, 1)"),
    (lambda: sequence_gap.paired_gap_test([0.2], [0], [0.1, 0.2], [0, 1]),
     "paired_gap_test: 1 outputs but 2 baseline outputs"),
    (lambda: sequence_gap.verdict(0.1, 0.01, alpha=0), "verdict: alpha=0 must be a number in"),
    (lambda: sequence_gap.verdict(0.1, 1.5), "p_value=1.5 must be"),
    (lambda: sequence_gap.gap_verdict([0.2], [0], alpha=True), "gap_verdict: alpha=True"),
])
def test_bad_input_is_a_one_line_value_error(call, message):
  with pytest.raises(ValueError) as error:
    call()
  assert message in str(error.value) and "\n" not in str(error.value), str(error.value)

