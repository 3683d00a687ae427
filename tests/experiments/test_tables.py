"""Intervals over training seeds and seed-level tests, and the comparisons' verdicts
(``meshbayes.experiments.tables``), on hand-made evaluations."""

import math

import pytest
from scipy import stats

from meshbayes.experiments import compare, report
from meshbayes.experiments import tables
from tests.experiments.seed_evaluations import BLEU, seed_results  # noqa: F401


def test_the_t_interval_of_a_small_sample_by_hand():
  """[1, 2, 3, 4]: mean 2.5, s = sqrt(5/3) = 1.290994, t(0.975, 3) = 3.182446."""
  interval = tables.t_interval([1.0, 2.0, 3.0, 4.0])
  half_width = 3.182446 * 1.290994 / 2
  assert interval.estimate == 2.5
  assert interval.low == pytest.approx(2.5 - half_width, abs=1e-5)
  assert interval.high == pytest.approx(2.5 + half_width, abs=1e-5)
  assert (interval.low, interval.high) == pytest.approx(
      stats.t.interval(0.95, 3, loc=2.5, scale=stats.sem([1, 2, 3, 4])), rel=1e-12)
  assert interval.df == 3 and interval.seed_counts == (4,)
  assert interval.p_value == pytest.approx(stats.ttest_1samp([1, 2, 3, 4], 0).pvalue)
  # The 90% interval is narrower: t(0.95, 3) = 2.353363.
  assert tables.t_interval([1.0, 2.0, 3.0, 4.0], level=0.9).high == pytest.approx(
      2.5 + 2.353363 * 1.290994 / 2, abs=1e-5)

def test_welch_degrees_of_freedom_by_hand():
  """a = [1, 2, 3, 4], b = [2, 4, 6]: s_a^2 / n_a = (5/3) / 4 = 5/12, s_b^2 / n_b = 4 / 3;
  df = (5/12 + 4/3)^2 / ((5/12)^2 / 3 + (4/3)^2 / 2) = 3.0625 / 0.946759 = 3.234719."""
  welch = tables.welch_interval([1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0])
  assert welch.df == pytest.approx(3.234719, abs=1e-6)
  assert welch.estimate == pytest.approx(-1.5)
  half_width = stats.t.ppf(0.975, 3.234719) * math.sqrt(5 / 12 + 4 / 3)
  assert (welch.low, welch.high) == pytest.approx((-1.5 - half_width, -1.5 + half_width),
                                                  abs=1e-5)
  reference = stats.ttest_ind([1, 2, 3, 4], [2, 4, 6], equal_var=False)
  assert welch.p_value == pytest.approx(reference.pvalue)  # 0.3338
  assert (welch.low, welch.high) == pytest.approx(tuple(reference.confidence_interval()))
  assert welch.seed_counts == (4, 3)

def test_the_paired_interval_takes_the_seeds_both_sides_have():
  a = {0: 1.0, 1: 2.0, 2: 4.0}
  b = {0: 0.5, 1: 1.0, 2: 2.0, 3: 9.0}  # seed 3 has no partner
  paired = tables.paired_t_interval(a, b)
  reference = stats.ttest_rel([1, 2, 4], [0.5, 1, 2])
  assert paired.estimate == pytest.approx(7 / 6) and paired.df == 2 and paired.seed_counts == (3,)
  assert paired.p_value == pytest.approx(reference.pvalue)  # 0.1181
  assert (paired.low, paired.high) == pytest.approx(tuple(reference.confidence_interval()))

def test_no_spread_and_bad_input():
  same = tables.t_interval([2.0, 2.0, 2.0])
  assert (same.low, same.high) == (2.0, 2.0) and math.isnan(same.p_value)
  assert math.isnan(tables.welch_interval([1.0, 1.0], [1.0, 1.0]).df)
  with pytest.raises(ValueError, match=r"t_interval: values=\[1.0\] must be at least 2 finite"):
    tables.t_interval([1.0])
  with pytest.raises(ValueError, match=r"welch_interval: values=\[1.0, nan\] must be"):
    tables.welch_interval([1.0, math.nan], [1.0, 2.0])
  with pytest.raises(ValueError, match=r"seeds \[0, 1\] and \[1, 2\] must share at least 2"):
    tables.paired_t_interval({0: 1.0, 1: 2.0}, {1: 1.0, 2: 2.0})
  with pytest.raises(ValueError, match=r"level=1.5 must be in \(0, 1\)"):
    tables.t_interval([1.0, 2.0], level=1.5)

def test_the_seed_table_puts_the_mean_over_seeds_beside_seed_0(seed_results):
  groups = report._seed_groups(seed_results, "final")
  values = tables.seed_values(groups, {t: report.SEED_GROUPS[t][1] for t in groups})
  assert values["deterministic"]["bleu"] == {0: 20.0, 1: 22.0, 2: 24.0}
  assert values["Bayesian layers"]["ood/spanish"] == pytest.approx({0: 0.65, 1: 0.67, 2: 0.69})
  assert values["Bayesian layers"]["ood/spanish/beam_total_uncertainty"] == pytest.approx(
      {0: 0.75, 1: 0.77, 2: 0.79})
  assert "ood/spanish" not in values["Bayesian layers (mean)"]  # OOD is the headline's
  cols = report._columns(seed_results, "final")
  table, summary = tables.seed_table(cols, values)
  lines = table.splitlines()
  assert lines[0] == (
      "| seed 0: bootstrap 95% interval over test sources; mean of seeds: Student-t 95% "
      "interval | deterministic (3 seeds; t, 2 df) | temperature-scaled (T=1.10) (single "
      "realization) | deep ensemble (single realization) | Bayesian layers (3 seeds; t, 2 df) "
      "| Bayesian layers (mean) (3 seeds; t, 2 df) |")
  # Deterministic BLEU 20, 22, 24: mean 22, s = 2, half-width t(0.975, 2) 2 / sqrt(3) = 4.97;
  # Bayesian 23, 26, 26: mean 25, s = sqrt(3), half-width 4.303 sqrt(3) / sqrt(3) = 4.30.
  assert lines[2] == ("| BLEU, seed 0 | 20.00 [19.00, 21.00] | 20.50 [19.50, 21.50] | "
                      "25.00 [24.00, 26.00] | 23.00 [22.00, 24.00] | 21.00 [20.00, 22.00] |")
  assert lines[3] == ("| BLEU, mean of seeds | 22.00 [17.03, 26.97] | single realization | "
                      "single realization | 25.00 [20.70, 29.30] | 22.00 [19.52, 24.48] |")
  assert summary["deterministic"]["bleu"]["mean"]["high"] == pytest.approx(
      22 + stats.t.ppf(0.975, 2) * 2 / math.sqrt(3))
  assert summary["deep ensemble"]["bleu"] == {"seed_0": {"estimate": 25.0, "low": 24.0,
                                                         "high": 26.0}}
  assert lines[-3].startswith("| OOD spanish: AUROC by total uncertainty, mean of seeds | "
                              "0.610 [0.585, 0.635] | single realization | single realization "
                              "| 0.670 [0.620, 0.720] | - |")
  assert lines[-2].startswith("| OOD spanish: AUROC by beam total uncertainty, seed 0 | "
                              "0.700 [0.650, 0.750] |")
  assert lines[-1].startswith("| OOD spanish: AUROC by beam total uncertainty, mean of seeds | "
                              "0.710 [0.685, 0.735] |")

def test_seed_level_differences_against_the_deterministic_model(seed_results):
  groups = report._seed_groups(seed_results, "final")
  values = tables.seed_values(groups, {t: report.SEED_GROUPS[t][1] for t in groups})
  table, summary = tables.seed_difference_table(values)
  lines = table.splitlines()
  assert lines[0] == ("| mean over seeds minus deterministic's (a temperature-scaled "
                      "posterior: minus the temperature-scaled deterministic model's): "
                      "difference [95% interval] | Bayesian layers | Bayesian layers (mean) |")
  bleu = summary["Bayesian layers"]["bleu"]
  welch = stats.ttest_ind(BLEU["bayesian"], BLEU["deterministic"], equal_var=False)
  assert bleu["welch"]["p_value"] == pytest.approx(welch.pvalue)
  # Welch: s^2 / n = 1 and 4/3; df = (1 + 4/3)^2 / (1 / 2 + (4/3)^2 / 2) = 3.92.
  assert bleu["welch"]["df"] == pytest.approx(welch.df) == pytest.approx(3.92, abs=0.005)
  paired = stats.ttest_rel(BLEU["bayesian"], BLEU["deterministic"])
  assert bleu["paired"]["p_value"] == pytest.approx(paired.pvalue)
  assert [bleu["paired"]["low"], bleu["paired"]["high"]] == pytest.approx(
      list(paired.confidence_interval()))
  assert lines[2] == ("| BLEU, Welch | +3.00 [-1.28, +7.28] within noise (3 vs 3 seeds, df "
                      "3.9, p=0.12) | +0.00 [-4.16, +4.16] within noise (3 vs 3 seeds, df 2.9, "
                      "p=1) |")
  # Paired: differences 3, 4, 2 by seed: mean 3, s = 1, half-width 4.303 / sqrt(3) = 2.48;
  # t = 3 sqrt(3) = 5.196 on 2 df: p = 1 - t / sqrt(t^2 + 2) = 0.035.
  assert lines[3] == ("| BLEU, paired by seed | +3.00 [+0.52, +5.48] better (3 seeds, df 2, "
                      "p=0.035) | +0.00 [-2.48, +2.48] within noise (3 seeds, df 2, p=1) |")
  assert lines[4].startswith("| OOD spanish: AUROC by total uncertainty, Welch | +0.060 [")

def test_a_temperature_scaled_posterior_is_compared_with_the_temperature_scaled_model():
  values = {"deterministic": {"bleu": {0: 20.0, 1: 22.0, 2: 24.0}},
            "temperature-scaled": {"bleu": {0: 21.0, 1: 20.0, 2: 22.0}},
            "Bayesian layers, temperature-scaled": {"bleu": {0: 22.0, 1: 23.0, 2: 27.0}},
            "MAP": {"bleu": {0: 21.0, 1: 23.0, 2: 25.0}}}
  assert tables.baseline_of("MAP, temperature-scaled (T=1.31)") == "temperature-scaled"
  assert tables.baseline_of("temperature-scaled (T=1.31)") == "deterministic"
  _, summary = tables.seed_difference_table(values)
  paired = lambda title: summary[title]["bleu"]["paired"]["estimate"]
  assert paired("Bayesian layers, temperature-scaled") == pytest.approx(3.0)  # 24 - 21
  assert paired("temperature-scaled") == pytest.approx(-1.0)  # 21 - 22
  assert paired("MAP") == pytest.approx(1.0)  # 23 - 22
  # Without seeds of the temperature-scaled deterministic model: no test of its kind.
  del values["temperature-scaled"]
  assert set(tables.seed_difference_table(values)[1]) == {"MAP"}

def _column(title, positives):
  metrics = {"predictives": ["posterior_mean"], "intervals": {"posterior_mean": {
      "exact_match_positives": {"estimate": positives, "low": positives, "high": positives}}}}
  return compare.Column(title, metrics, "posterior_mean", {}, None)

def test_a_calibration_difference_from_too_few_positives_is_underpowered_not_a_verdict():
  better = tables.bootstrap.Interval(-0.02, -0.03, -0.01)
  few, many = _column("a", 120.0), _column("deterministic", 900.0)
  assert tables._verdict("sequence_ece", better, (few, many)) == \
      " underpowered (120 vs 900 positives)"
  assert tables._verdict("sequence_ece", better, (_column("a", 400.0), many)) == " better"
  assert tables._verdict("bleu", better, (few, many)) == " worse"  # not a calibration figure
