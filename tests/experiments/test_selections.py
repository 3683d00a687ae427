"""Which measures each report table shows (``meshbayes.experiments.selections``): defined
once, so tables that must agree cannot disagree, and a measure the registry gains is
shown without a second list."""

import json

import pytest

from meshbayes.evaluation import items as evaluation_items
from meshbayes.experiments import compare, selections, tables, verdicts
from meshbayes.metrics import measures
from tests.experiments.seed_evaluations import evaluation


def test_the_headline_figures_are_run_table_rows_in_its_order():
  rows = selections.run_table_figures()
  headline = selections.headline_figures()
  assert headline == ("bleu", "exact_match", "sequence_ece", "fraction_signed_gap",
                      "fraction_ece", "calibration_auroc", "equivalence_chrf80_sequence_ece",
                      "equivalence_chrf80_calibration_auroc", "decoded_token_ece",
                      "prr_negative_log_probability", "token_ece", "token_nll", "token_brier")
  assert [name for name in rows if name in headline] == list(headline)
  assert len(rows) == 23 and rows[-1] == "token_brier"


def test_the_signed_gap_is_a_headline_with_its_p_value_beside_the_fraction_ece():
  rows = selections.run_table_figures()
  at = rows.index("fraction_signed_gap")
  assert rows[at:at + 3] == ("fraction_signed_gap", "fraction_signed_gap_p_value",
                             "fraction_ece")
  assert "fraction_signed_gap_p_value" not in selections.headline_figures()
  # The one-predictive verdicts read each seed's z-test and band beside the headline.
  assert selections.band_figures() == (
      "fraction_signed_gap", "fraction_signed_gap_z", "fraction_signed_gap_p_value",
      "fraction_ece", "fraction_ece_null_high", "reference_fraction", "num_items")


def test_the_seed_tables_ood_measures_are_the_fixed_ones_every_model_has():
  # d8db8b0: the seed tables' own list once replaced the fixed one and dropped mutual
  # information from the OOD and paired tables; now the one is marked within the other.
  assert selections.ood_measures() == ("total_uncertainty", "mutual_information",
                                       "beam_total_uncertainty")
  assert selections.seed_ood_measures() == ("total_uncertainty", "beam_total_uncertainty")


def test_reports_show_every_measure_an_input_is_scored_by():
  # OOD inputs carry every measure but the negative log-probability of a decoded output.
  assert set(selections.ood_table_measures()) == set(measures.names(
      kind=measures.UNCERTAINTY)) - {evaluation_items.NEGATIVE_LOG_PROBABILITY}
  assert selections.ood_table_measures()[:4] == (
      "mutual_information", "reverse_mutual_information", "expected_pairwise_kl",
      "total_uncertainty")
  assert evaluation_items.ERROR_MEASURES == selections.error_detection_measures()


def test_a_measure_added_to_the_registry_reaches_the_tables(monkeypatch, tmp_path):
  """A registered uncertainty measure is a run-table OOD row; one marked EVERY_MODEL among
  the fixed OOD measures is in the OOD and paired tables and the seed tables alike."""
  energy = measures.Measure("energy", "energy", measures.NEITHER, measures.TOKEN,
                            measures.UNCERTAINTY, 1, ".3f", "a measure to show")
  monkeypatch.setattr(measures, "MEASURES", measures.MEASURES + (energy,))
  assert selections.ood_table_measures()[-1] == "energy"
  monkeypatch.setattr(selections, "OOD_MEASURES",
                      selections.OOD_MEASURES + (("energy", selections.EVERY_MODEL),))
  selections.check()
  assert selections.ood_measures()[-1] == selections.seed_ood_measures()[-1] == "energy"
  directory = evaluation(tmp_path / "det", ["posterior_mean"], [20.0], ood=0.6)
  run_metrics, _ = compare.load(directory, "")
  run_metrics["ood"]["spanish"]["auroc_energy"] = 0.9
  (directory / "metrics.json").write_text(json.dumps(run_metrics))
  values = tables.seed_values({"deterministic": {0: directory}},
                              {"deterministic": "posterior_mean"})
  assert values["deterministic"]["ood/spanish/energy"] == {0: 0.9}


@pytest.mark.parametrize("patch, message", [
    ({"FIGURE_ROWS": (("bleu", selections.HEADLINE), ("token_eec", ""))},
     "unknown measure 'token_eec'"),
    ({"FIGURE_ROWS": (("bleu", "main"),)}, "FIGURE_ROWS: 'bleu' is marked 'main'; valid"),
    ({"FIGURE_ROWS": (("bleu", ""), ("bleu", ""))}, "FIGURE_ROWS: .* names a measure twice"),
    ({"OOD_MEASURES": (("bleu", ""),)}, "OOD_MEASURES: 'bleu' is not of kind 'uncertainty'"),
    ({"OOD_PLOT_MEASURES": ("token_ece",)}, "OOD_PLOT_MEASURES: 'token_ece' is not of kind"),
])
def test_a_bad_selection_is_a_one_line_error_naming_it(monkeypatch, patch, message):
  for name, value in patch.items():
    monkeypatch.setattr(selections, name, value)
  with pytest.raises(ValueError, match=message):
    selections.check()


def test_each_claim_is_answered_by_figures_the_seed_tables_collect(monkeypatch):
  verdicts.check()
  claim = verdicts.Claim("OOD", (verdicts.Figure("ood/spanish/mutual_information", "MI",
                                                 "detects"),))
  monkeypatch.setattr(verdicts, "CLAIMS", (claim,))
  with pytest.raises(ValueError, match=r"CLAIMS: 'OOD''s figure 'ood/spanish/mutual_information' "
                                       r"is not a headline figure or an OOD AUROC by one of "
                                       r"total_uncertainty, beam_total_uncertainty"):
    verdicts.check()
  monkeypatch.setattr(verdicts, "CLAIMS", ())
  monkeypatch.setattr(verdicts, "DESIGN", ((("bayes", "model_average"),
                                            ("deterministic", "posterior_mean"), ""),))
  with pytest.raises(ValueError, match="verdicts: method 'bayes' is not one of the "
                                       "experiment's"):
    verdicts.check()
  monkeypatch.setattr(verdicts, "DESIGN", ((("bayesian", "mode"),
                                            ("deterministic", "posterior_mean"), ""),))
  with pytest.raises(ValueError, match="verdicts: 'bayesian' has no column of predictive "
                                       "'mode'; valid: model_average, posterior_mean"):
    verdicts.check()
