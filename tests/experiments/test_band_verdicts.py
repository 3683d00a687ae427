"""One predictive against calibration over seeds (``meshbayes.experiments.band_verdicts``)
on hand-made per-seed signed gaps whose verdicts are known: the t-test over seeds, Holm
over the predictives, the per-seed z-tests and bands beside, and the power."""

import math

import pytest
from scipy import stats

from meshbayes.experiments import band_verdicts
from meshbayes.metrics import multiple_testing, seed_power

SEEDS = (200, 201, 202, 203, 204)


def _by_seed(*values):
  return dict(zip(SEEDS, values))


def _predictive(gaps, z, ece, band_high, match_rate=0.018, positives=430.0):
  """Per-seed figures as the pool's evaluations give them: each seed's gap and its z
  (the p-value two-sided normal), one-sided ECE and band, mean label and positives."""
  zs = dict(zip(SEEDS, z))
  return {"fraction_signed_gap": _by_seed(*gaps), "fraction_signed_gap_z": zs,
          "fraction_signed_gap_p_value": {k: math.erfc(abs(v) / math.sqrt(2))
                                          for k, v in zs.items()},
          "fraction_ece": _by_seed(*ece), "fraction_ece_null_high": _by_seed(*band_high),
          "reference_fraction": _by_seed(*[match_rate] * 5),
          "reference_fraction_positives": _by_seed(*[positives] * 5)}


# The deterministic model clearly overconfident, the Bayesian layers' model average clearly
# underconfident, their mean within noise, and a temperature-scaled model whose t-test over
# seeds is under 0.05 (p = 0.036) but not under Holm's 0.05 / 2 at its step.
GAPS = {
    "deterministic": (-0.010, -0.012, -0.009, -0.011, -0.010),
    "Bayesian layers": (0.020, 0.024, 0.022, 0.021, 0.025),
    "Bayesian layers (mean)": (0.001, -0.002, 0.0005, 0.0015, -0.001),
    "temperature-scaled": (-0.002, -0.004, 0.0, -0.003, -0.0015),
}
VALUES = {
    "deterministic": _predictive(GAPS["deterministic"], (-4.0, -4.8, -3.6, -4.4, -4.0),
                                 (0.012, 0.013, 0.011, 0.012, 0.0125), [0.009] * 5),
    "Bayesian layers": _predictive(GAPS["Bayesian layers"], (8.0, 9.6, 8.8, 8.4, 10.0),
                                   (0.015, 0.016, 0.014, 0.015, 0.017), [0.009] * 5,
                                   positives=350.0),
    "Bayesian layers (mean)": _predictive(GAPS["Bayesian layers (mean)"],
                                          (0.4, -0.8, 0.2, 0.6, -0.4),
                                          (0.008, 0.010, 0.007, 0.008, 0.009), [0.009] * 5),
    "temperature-scaled": _predictive(GAPS["temperature-scaled"], (-0.8, -1.6, 0.0, -1.2, -0.6),
                                      (0.008, 0.0095, 0.007, 0.008, 0.009), [0.009] * 5),
    "deep ensemble": {"fraction_signed_gap": {200: -0.003}},  # one realization: no test
}


def test_each_predictive_by_its_seeds_with_holm_over_the_predictives():
  found = band_verdicts.band_verdicts(VALUES)
  assert list(found) == list(GAPS)
  p_values = [stats.ttest_1samp(gaps, 0).pvalue for gaps in GAPS.values()]
  assert p_values[3] == pytest.approx(0.0364, abs=1e-4)  # uncorrected: overconfident
  holm = multiple_testing.holm(p_values)
  assert holm.rejected == (True, True, False, False)
  assert [row["holm_p_value"] for row in found.values()] == pytest.approx(holm.adjusted)
  assert [row["verdict"] for row in found.values()] == [
      "overconfident", "underconfident", "calibrated within noise", "calibrated within noise"]
  mean = found["deterministic"]["mean"]
  assert mean["estimate"] == pytest.approx(-0.0104)
  assert (mean["low"], mean["high"]) == pytest.approx(tuple(stats.ttest_1samp(
      GAPS["deterministic"], 0).confidence_interval()))
  # The one-sample tests have no positive gate: 350 positives still get their verdict.
  assert found["Bayesian layers"]["positives"] == 350.0


def test_beside_it_each_seeds_z_test_band_and_power():
  found = band_verdicts.band_verdicts(VALUES)
  seed = found["deterministic"]["seeds"][200]
  assert (seed["verdict"], seed["band"]) == ("overconfident", "above its band")
  # Standard error |gap / z| = 0.0025: detects 2.8016 x 0.0025 = 0.0070 with probability
  # 0.8 at 0.05, on a match rate of 1.8%: p 1.389x or 0.611x the truth.
  detectable = seed_power.detectable_effect(0.0025)
  assert seed["factors"] == pytest.approx([1 + detectable / 0.018, 1 - detectable / 0.018])
  assert seed["factors"][0] == pytest.approx(1.389, abs=1e-3)
  mean_seeds = found["Bayesian layers (mean)"]["seeds"]
  assert [s["verdict"] for s in mean_seeds.values()] == ["calibrated within noise"] * 5
  assert [s["band"] for s in mean_seeds.values()] == ["within its band", "above its band",
                                                      "within its band", "within its band",
                                                      "within its band"]
  # The seeds' t-test: the mean gap detected at Holm's smallest level, 0.05 / 4.
  std = stats.tstd(GAPS["Bayesian layers (mean)"])
  assert found["Bayesian layers (mean)"]["detectable"] == pytest.approx(
      seed_power.detectable_effect(std / math.sqrt(5), 0.05 / 4, df=4))


def test_the_table():
  table, summary = band_verdicts.band_table(VALUES, "pool")
  lines = table.splitlines()
  assert lines[0] == (
      "| predictive (pool) | signed gap (%), mean of seeds [95% t] | t-test p (Holm over 4) | "
      "verdict | per seed: z-test over the sources | per seed: reference-fraction ECE (%) "
      "against its band's 97.5% point | power |")
  assert lines[2].startswith(
      "| deterministic (5 seeds) | -1.04 [-1.18, -0.90] | 3.4e-05 (Holm 0.0001) | "
      "**overconfident** | overconfident, overconfident, overconfident, overconfident, "
      "overconfident | 1.20 > 0.90, 1.30 > 0.90, 1.10 > 0.90, 1.20 > 0.90, 1.25 > 0.90 | "
      "seeds: a mean gap of ±")
  assert lines[2].endswith("; each seed: 1.39x over, 0.61x under; fewest positives 430 |")
  assert summary == band_verdicts.band_verdicts(VALUES)
  assert band_verdicts.band_table({"deep ensemble": VALUES["deep ensemble"]}, "pool") == ("", {})
