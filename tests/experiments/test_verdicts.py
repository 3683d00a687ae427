"""One verdict per claim from seed-level paired differences
(``meshbayes.experiments.verdicts``) on hand-made figures."""

import pytest
from scipy import stats

from meshbayes.experiments import verdicts

SEEDS = (0, 1, 2)


def _by_seed(*values):
  return dict(zip(SEEDS, values))


VALUES = {
    "deterministic": {"bleu": _by_seed(20.0, 22.0, 24.0), "token_nll": _by_seed(2.8, 2.9, 2.7),
                      "sequence_ece": _by_seed(0.02, 0.03, 0.02),
                      "exact_match_positives": _by_seed(60.0, 61.0, 59.0),
                      "token_ece": _by_seed(0.05, 0.06, 0.055)},
    "Bayesian layers": {"bleu": _by_seed(23.0, 26.0, 26.0), "token_nll": _by_seed(2.5, 2.62, 2.38),
                        "sequence_ece": _by_seed(0.01, 0.01, 0.012),
                        "exact_match_positives": _by_seed(70.0, 72.0, 71.0),
                        "token_ece": _by_seed(0.02, 0.021, 0.019)},
    "MAP": {"bleu": _by_seed(23.5, 26.0, 25.0), "token_nll": _by_seed(2.6, 2.71, 2.5),
            "token_ece": _by_seed(0.09, 0.10, 0.097)},
    # One shared seed with the deterministic model only: no verdict.
    "Bayesian layers, KL 1": {"bleu": {0: 18.0, 7: 19.0}},
}


def test_each_claim_is_decided_by_its_figures_paired_over_seeds():
  table, summary = verdicts.verdict_table(VALUES)
  main = summary["Bayesian layers vs deterministic"]
  bleu = main["claims"]["translation"]["figures"][0]
  paired = stats.ttest_rel([23, 26, 26], [20, 22, 24])  # differences 3, 4, 2
  assert bleu["difference"]["estimate"] == pytest.approx(3.0)
  assert [bleu["difference"]["low"], bleu["difference"]["high"]] == pytest.approx(
      list(paired.confidence_interval()))
  assert bleu["verdict"] == "better"
  assert main["claims"]["translation"]["verdict"] == "helps"  # BLEU up, NLL down
  assert main["claims"]["token calibration"]["verdict"] == "helps"
  # 59-72 exact matches: under 400, no verdict on the sequence ECE.
  sequence = main["claims"]["sequence calibration"]
  assert sequence["verdict"] == "underpowered"
  assert sequence["figures"][0]["positives"] == 59.0
  # MAP's token ECE is worse than the deterministic model's, its BLEU better: each claim alone.
  the_map = summary["MAP vs deterministic"]["claims"]
  assert the_map["token calibration"]["verdict"] == "hurts"
  assert the_map["translation"]["verdict"] == "helps"
  # The weight noise against MAP: BLEU differences 0.5, 0, -1 are within noise.
  noise = summary["Bayesian layers vs MAP"]["claims"]["translation"]["figures"][0]
  assert noise["verdict"] == "within noise"
  assert "Bayesian layers, KL 1 vs deterministic" not in summary
  assert "| Bayesian layers vs deterministic: the Bayesian layers (KL weight 0.1" in table
  assert ("| **underpowered**: sequence ECE, exact match (%) -1.27 [-2.86, +0.33] underpowered "
          "(59 positives) |") in table


@pytest.mark.parametrize("figures, expected", [
    (["better", "within noise"], "helps"),
    (["worse"], "hurts"),
    (["better", "worse"], "mixed"),
    (["within noise", "underpowered"], "cannot tell"),
    (["underpowered"], "underpowered"),
])
def test_a_claims_verdict_from_its_figures(figures, expected):
  assert verdicts.claim_verdict([{"verdict": v} for v in figures]) == expected


def test_no_comparison_with_seeds_is_no_table():
  assert verdicts.verdict_table({"deterministic": {"bleu": {0: 20.0}}}) == ("", {})
