"""One verdict per claim, by the rules fixed before the runs
(``meshbayes.experiments.verdicts``), on hand-made per-seed figures whose verdicts are
known: paired t-tests over seeds, Holm over a comparison's deciding figures, labels that
say what each figure shows, the pool for sequence calibration and its 400-positive gate."""

import math

import pytest
from scipy import stats

from meshbayes.experiments import verdicts
from meshbayes.metrics import multiple_testing, seed_power

SEEDS = (200, 201, 202, 203, 204)
DET, BAYES, MEAN = "deterministic", "Bayesian layers", "Bayesian layers (mean)"


def _by_seed(*values):
  return dict(zip(SEEDS, values))


def _plus(base, *differences):
  return {seed: base[seed] + d for seed, d in zip(SEEDS, differences)}


BLEU = _by_seed(20.0, 22.0, 24.0, 21.0, 23.0)
TOKEN_ECE = _by_seed(0.05, 0.06, 0.055, 0.052, 0.058)
NLL = _by_seed(2.8, 2.9, 2.7, 2.85, 2.75)
PRR = _by_seed(0.30, 0.32, 0.28, 0.31, 0.29)
# BLEU +1.9 with p = 0.041 over 5 seeds: an uncorrected t-test calls it, Holm over the
# comparison's three figures does not: the token ECE's far smaller p takes the first level,
# 0.05 / 3, and 0.041 is over the second's, 0.05 / 2.
BLEU_DIFFERENCES = (1.0, 3.0, 2.0, 0.0, 3.5)
VALUES = {
    DET: {"bleu": BLEU, "token_ece": TOKEN_ECE, "token_nll": NLL,
          "prr_negative_log_probability": PRR},
    BAYES: {"bleu": _plus(BLEU, *BLEU_DIFFERENCES),
            "token_ece": _plus(TOKEN_ECE, -0.020, -0.021, -0.019, -0.0205, -0.0195),
            "token_nll": _plus(NLL, 0.10, 0.11, 0.09, 0.105, 0.095),  # fits worse
            "prr_negative_log_probability": _plus(PRR, 0.01, -0.02, 0.015, -0.005, 0.0)},
    MEAN: {"bleu": _plus(BLEU, 1.0, -1.0, 0.5, 0.0, -0.5)},
    # One shared seed with the deterministic model: no verdict.
    "MAP": {"bleu": {200: 18.0, 7: 19.0}},
}
GAP_DET = _by_seed(-0.010, -0.012, -0.009, -0.011, -0.010)  # overconfident
POOL = {
    DET: {"fraction_signed_gap": GAP_DET,
          "fraction_ece": _by_seed(0.012, 0.013, 0.011, 0.012, 0.0125),
          "sequence_ece": _by_seed(0.004, 0.005, 0.004, 0.0045, 0.004),
          "reference_fraction_positives": _by_seed(430.0, 425.0, 441.0, 410.0, 436.0),
          "exact_match_positives": _by_seed(1150.0, 1160.0, 1170.0, 1140.0, 1155.0)},
    # Near calibrated either way: its absolute gap is smaller than the deterministic one's.
    BAYES: {"fraction_signed_gap": _by_seed(0.001, -0.001, 0.0005, 0.0, -0.0005),
            "fraction_ece": _by_seed(0.0118, 0.0132, 0.0112, 0.0119, 0.0124),
            "sequence_ece": _by_seed(0.004, 0.005, 0.004, 0.0045, 0.004),
            "reference_fraction_positives": _by_seed(452.0, 447.0, 460.0, 439.0, 455.0),
            "exact_match_positives": _by_seed(1250.0, 1260.0, 1270.0, 1240.0, 1255.0)},
    # The gap nearer 0, but the one-sided ECE clearly above the deterministic one's.
    MEAN: {"fraction_signed_gap": _by_seed(-0.002, -0.003, -0.001, -0.002, -0.0025),
           "fraction_ece": _by_seed(0.020, 0.022, 0.019, 0.0205, 0.0215),
           "reference_fraction_positives": _by_seed(440.0, 431.0, 445.0, 420.0, 433.0)},
}
HEADLINE = verdicts.Comparison(BAYES, DET, "the headline")
WITHOUT_AVERAGING = verdicts.Comparison(MEAN, DET, "without the averaging")


def _figure(found, claim, name):
  return next(f for f in found["claims"][claim]["figures"] if f["figure"] == name)


def test_holm_takes_back_a_call_one_uncorrected_figure_would_make():
  found = verdicts.comparison_verdicts(VALUES, None, HEADLINE)
  bleu = _figure(found, "translation", "bleu")
  paired = stats.ttest_rel([BLEU[k] + d for k, d in zip(SEEDS, BLEU_DIFFERENCES)],
                           list(BLEU.values()))
  assert bleu["difference"]["estimate"] == pytest.approx(1.9)
  assert bleu["difference"]["p_value"] == pytest.approx(paired.pvalue)
  assert [bleu["difference"]["low"], bleu["difference"]["high"]] == pytest.approx(
      list(paired.confidence_interval()))
  assert paired.pvalue == pytest.approx(0.0413, abs=1e-4)  # under 0.05: the old rule called it
  # The family: BLEU, token ECE, PRR (no OOD, no pool): Holm at 0.05/3, 0.05/2, 0.05.
  assert found["family_size"] == 3 and found["holm_level"] == pytest.approx(0.05 / 3)
  token = _figure(found, "token calibration", "token_ece")
  holm = multiple_testing.holm([bleu["difference"]["p_value"], token["difference"]["p_value"],
                                _figure(found, "error detection",
                                        "prr_negative_log_probability")["difference"]["p_value"]])
  assert holm.rejected == (False, True, False)
  assert bleu["holm_p_value"] == pytest.approx(holm.adjusted[0])
  assert bleu["verdict"] == "cannot tell" and token["verdict"] == "better"
  translation = found["claims"]["translation"]
  assert translation["verdict"] == "cannot tell"
  # NLL is reported, decides nothing, and is stated at Holm's smallest level: p ~ 1e-5.
  assert _figure(found, "translation", "token_nll")["verdict"] == "worse"
  assert translation["label"] == "fits worse (NLL), BLEU cannot tell"
  assert found["claims"]["token calibration"] == {
      "verdict": "helps", "label": "calibrates tokens better (token ECE)",
      "figures": [token]}
  # Its power: the BLEU difference 5 seeds detect with probability 0.8 at 0.05/3.
  std = stats.tstd(BLEU_DIFFERENCES)
  assert bleu["std"] == pytest.approx(std)
  assert bleu["detectable"] == pytest.approx(seed_power.detectable_effect(
      std / math.sqrt(5), 0.05 / 3, df=4))
  assert 3.0 < bleu["detectable"] < 5.0
  assert "sequence calibration" not in found["claims"]  # no pool: not decided


def test_sequence_calibration_is_decided_on_the_pool_and_joins_the_family():
  found = verdicts.comparison_verdicts(VALUES, POOL, HEADLINE)
  assert found["family_size"] == 5  # and the absolute gap and the one-sided ECE
  sequence = found["claims"]["sequence calibration"]
  gap = _figure(found, "sequence calibration", verdicts.ABS_GAP)
  # |gap| per seed: 0.001 - 0.010, 0.001 - 0.012, ...: about -0.0098, lower is better.
  assert gap["difference"]["estimate"] == pytest.approx(
      sum(abs(POOL[BAYES]["fraction_signed_gap"][k]) - abs(GAP_DET[k]) for k in SEEDS) / 5)
  assert gap["verdict"] == "better" and gap["positives"] == 410.0
  assert _figure(found, "sequence calibration", "fraction_ece")["verdict"] == "cannot tell"
  # The exact-match ECE is reported and decides nothing.
  exact = _figure(found, "sequence calibration", "sequence_ece")
  assert not exact["deciding"] and "holm_p_value" not in exact
  assert sequence["verdict"] == "helps"
  assert sequence["label"] == ("calibrates sequences better (|signed gap|), reference-fraction "
                               "ECE cannot tell")


def test_figures_both_ways_are_mixed():
  found = verdicts.comparison_verdicts(VALUES, POOL, WITHOUT_AVERAGING)
  sequence = found["claims"]["sequence calibration"]
  assert [f["verdict"] for f in sequence["figures"]] == ["better", "worse"]
  assert sequence["verdict"] == "mixed"
  assert sequence["label"] == ("calibrates sequences better (|signed gap|), calibrates "
                               "sequences worse (reference-fraction ECE)")
  # BLEU differences 1, -1, 0.5, 0, -0.5 over two claims' family of 3.
  assert found["claims"]["translation"]["verdict"] == "cannot tell"


def test_a_paired_sequence_comparison_under_400_positives_is_underpowered():
  pool = {title: dict(figures) for title, figures in POOL.items()}
  pool[MEAN]["reference_fraction_positives"] = {**POOL[MEAN]["reference_fraction_positives"],
                                                203: 399.0}
  found = verdicts.comparison_verdicts(VALUES, pool, WITHOUT_AVERAGING)
  sequence = found["claims"]["sequence calibration"]
  assert sequence["verdict"] == "underpowered"
  assert [f["verdict"] for f in sequence["figures"]] == ["underpowered"] * 2
  assert sequence["label"] == "|signed gap| underpowered, reference-fraction ECE underpowered"
  assert found["family_size"] == 1  # BLEU alone: outside the family, they decide nothing


@pytest.mark.parametrize("directions, expected", [
    (["better"], "helps"), (["worse", "cannot tell"], "hurts"),
    (["better", "worse"], "mixed"), (["cannot tell", "cannot tell"], "cannot tell"),
])
def test_a_claims_verdict_from_its_rejected_figures(directions, expected):
  assert verdicts.claim_verdict(directions) == expected


def test_the_table_says_what_each_figure_shows():
  table, summary = verdicts.verdict_table(VALUES, POOL, [HEADLINE, WITHOUT_AVERAGING,
                                                         verdicts.Comparison("MAP", DET, "")])
  assert list(summary) == ["Bayesian layers vs deterministic",
                           "Bayesian layers (mean) vs deterministic"]
  lines = table.splitlines()
  assert lines[0] == (
      "| comparison (column minus control; paired t over seeds; Holm over the row's deciding "
      "figures at family-wise 0.05) | translation | token calibration | sequence calibration "
      "| error detection | OOD (Spanish inputs) |")
  cells = lines[2].split(" | ")
  assert cells[0] == ("| Bayesian layers vs deterministic: the headline (5 deciding figures, "
                      "smallest level 0.01)")
  assert cells[1].startswith(
      "**cannot tell**: fits worse (NLL), BLEU cannot tell. BLEU +1.90 [+0.12, +3.68], 5 "
      "seeds, p=0.041, Holm p=0.12; token NLL (nats) (reported) +0.100 [+0.090, +0.110], 5 "
      "seeds, p=9.3e-06. Power: detects with probability 0.8 at 0.01 BLEU ±")
  bleu = _figure(summary[HEADLINE.key], "translation", "bleu")
  assert cells[1].endswith(f". Power: detects with probability 0.8 at 0.01 BLEU "
                           f"±{bleu['detectable']:.2f}")
  assert cells[5] == "- |"  # no OOD figures


def test_the_designs_comparisons_are_report_columns():
  found = {c.key: c.question for c in verdicts.comparisons()}
  assert list(found)[:4] == ["Bayesian layers vs deterministic",
                             "Bayesian layers (mean) vs deterministic",
                             "Bayesian layers vs Bayesian layers (mean)",
                             "Bayesian layers (mean) vs MAP"]
  assert found["Bayesian layers, temperature-scaled vs temperature-scaled"] == (
      "calibration beyond temperature scaling")
  assert verdicts.verdict_table({DET: {"bleu": {0: 20.0}}}) == ("", {})
