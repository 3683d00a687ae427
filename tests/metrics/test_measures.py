"""The registry of evaluation measures: it names every figure and measure the evaluation
emits, with the directions known from their definitions, and refuses unknown names."""

import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes import metrics, predictive
from meshbayes.evaluation import items as evaluation_items
from meshbayes.evaluation.items import OodScores, SourceItems
from meshbayes.metrics import equivalence, measures

WORDS = "le chat noir dort sur un tapis rouge".split()


def uncertainty_measure_names() -> list[str]:
  """The names of the measures an evaluation scores each output by, from the functions that
  compute them (and predictive_eval's sample agreement and beam measures)."""
  log_probs = jnp.log(jnp.asarray(np.random.default_rng(0).dirichlet(np.ones(4), (2, 3)),
                                  jnp.float32))
  return [*predictive.token_measures(log_probs),
          *predictive.sequence_measures(jnp.array([-2.0, -3.0]), jnp.array(4)),
          "bleu_disagreement",
          *predictive.beam_sequence_measures(jnp.array([[-2.0, -3.0]]), jnp.array([4, 5]))]


def decoded_items(n: int = 12) -> SourceItems:
  """Items with every uncertainty measure, decoded outputs and token statistics."""
  rng = np.random.default_rng(1)
  log_probs = np.log(rng.dirichlet(np.ones(5), size=(n, 3)))
  targets = rng.integers(0, 5, size=(n, 3))
  per_source = [metrics.token_calibration_statistics(jnp.asarray(log_probs[i:i + 1]),
                                                     jnp.asarray(targets[i:i + 1]),
                                                     jnp.ones((1, 3))) for i in range(n)]
  statistics = {k: np.stack([np.asarray(s[k], np.float64) for s in per_source])
                for k in per_source[0]}
  references = [[" ".join(rng.choice(WORDS, size=4))] for _ in range(n)]
  predictions = [refs[0] if k % 3 else "un chat" for k, refs in enumerate(references)]
  samples = [[refs[0], "un chat noir"] for refs in references]  # for the equivalence figures
  return SourceItems([f"source {k}" for k in range(n)], statistics, references, predictions,
                     np.log(rng.uniform(0.05, 0.9, n)), rng.integers(2, 6, n),
                     {name: rng.random(n) for name in uncertainty_measure_names()},
                     samples=samples, sample_log_probs=np.log(rng.uniform(0.01, 0.1, (n, 2))))


def test_every_figure_and_measure_the_evaluation_emits_is_registered():
  figures = evaluation_items.intervals(decoded_items(), num_resamples=20)
  for name in figures:
    assert measures.get(name).kind == measures.FIGURE, name
  assert {name for name in figures if name.startswith("prr_")} == {
      measures.family_name(measures.PRR, m) for m in measures.ERROR_DETECTION_MEASURES}
  # The token-level figures, in the order the evaluation writes them.
  assert measures.names(kind=measures.FIGURE, level=measures.TOKEN) == tuple(
      name for name in figures if name.startswith("token_"))
  rng = np.random.default_rng(2)
  inside = {name: rng.random(20) for name in uncertainty_measure_names()}
  scores = OodScores(inside, {"far": {name: rng.random(10) + 0.5 for name in inside}})
  for name in evaluation_items.ood_intervals(scores, num_resamples=20)["far"]:
    assert measures.get(name).level == measures.OOD, name
  for name in [*uncertainty_measure_names(), evaluation_items.NEGATIVE_LOG_PROBABILITY]:
    assert measures.get(name).kind == measures.UNCERTAINTY, name
  assert set(measures.names(kind=measures.UNCERTAINTY)) == {
      *uncertainty_measure_names(), evaluation_items.NEGATIVE_LOG_PROBABILITY}


def test_each_equivalence_mirrors_every_exact_match_calibration_figure():
  assert tuple(measures.EQUIVALENCE_SLUGS) == equivalence.EQUIVALENCES
  figures = evaluation_items.figures(decoded_items())
  mirrored = [name for name in figures if name in measures.EQUIVALENCE_MIRRORED_FIGURES]
  assert sorted(mirrored) == sorted(measures.EQUIVALENCE_MIRRORED_FIGURES)
  for name in equivalence.EQUIVALENCES:
    for figure in mirrored:
      entry = measures.get(measures.equivalence_figure(name, figure))
      assert entry.name in figures and entry.level == measures.SEQUENCE
      assert name in entry.label and name in entry.definition
      if "confidence" in entry.name or "ece" in entry.name or "auroc" in entry.name:
        assert "lower bound" in entry.definition, entry.name
      # The same direction as the exact-match figure it mirrors.
      assert entry.direction == measures.get(figure).direction, entry.name
  assert measures.equivalence_figure("chrf++>=0.8", "exact_match") == (
      "equivalence_chrf80_match_rate")
  with pytest.raises(ValueError, match="unknown equivalence 'bleu'"):
    measures.equivalence_figure("bleu", "exact_match")
  with pytest.raises(ValueError, match="no equivalence figure mirrors 'bleu'"):
    measures.equivalence_figure("exact", "bleu")


def test_the_measures_of_predictive_are_the_registrys_in_the_order_it_computes_them():
  log_probs = jnp.log(jnp.full((2, 1, 3), 1 / 3))
  assert tuple(predictive.token_measures(log_probs)) == predictive.TOKEN_MEASURES
  assert tuple(predictive.sequence_measures(jnp.zeros((2, 1)), jnp.ones(1))
               ) == predictive.SEQUENCE_MEASURES
  assert tuple(predictive.beam_sequence_measures(jnp.zeros((2, 1, 3)), jnp.ones((1, 3)))
               ) == predictive.BEAM_MEASURES
  assert predictive.TOKEN_MEASURES[0] == "total_uncertainty"  # predictive_eval skips it


@pytest.mark.parametrize("name, higher", [
    ("token_ece", False), ("token_weighted_ece", False), ("sequence_ece", False),
    ("equal_mass_ece", False), ("token_nll", False), ("token_brier", False),
    ("abs_probability_gap", False), ("fpr95_mutual_information", False),
    ("bleu", True), ("mean_sentence_bleu", True), ("exact_match", True),
    ("token_accuracy", True), ("calibration_auroc", True), ("auroc_total_uncertainty", True),
    ("prr_negative_log_probability", True),
    ("mean_probability", None), ("probability_gap", None), ("num_items", None),
    ("mutual_information", None)])
def test_directions_are_the_known_ones(name, higher):
  assert measures.higher_is_better(name) is higher


def test_families_build_their_members_from_the_measures_entry():
  fpr = measures.get(measures.family_name(measures.FPR95, "bleu_disagreement"))
  assert fpr == measures.Measure(
      "fpr95_bleu_disagreement", "OOD FPR at 95% TPR (%), BLEU disagreement", measures.LOWER,
      measures.OOD, measures.FIGURE, 100, ".1f", fpr.definition)
  assert "BLEU disagreement" in fpr.definition
  assert measures.get("prr_total_uncertainty").level == measures.SEQUENCE


@pytest.mark.parametrize("call, words", [
    (lambda: measures.get("token_eec"), ["'token_eec'", "token_ece", "prr_/auroc_/fpr95_"]),
    (lambda: measures.get("prr_token_ece"), ["'prr_token_ece'"]),  # not an uncertainty measure
    (lambda: measures.get("auroc_nonsense"), ["'auroc_nonsense'"]),
    (lambda: measures.family_name("roc", "total_uncertainty"), ["'roc'", "prr, auroc, fpr95"]),
    (lambda: measures.names(kind="score"), ["kind 'score'", "'figure'"]),
    (lambda: measures.names(level="word"), ["level 'word'", "'token'"]),
    (lambda: measures.Measure("x", "x", "up", measures.TOKEN, measures.FIGURE, 1, ".2f", "x"),
     ["direction 'up'", "'higher'"]),
    (lambda: measures.Measure("x", "x", measures.NEITHER, measures.OOD, measures.UNCERTAINTY,
                              1, ".2f", "x"), ["level 'ood'", "'output'"]),
    (lambda: measures.Measure("x", "x", measures.HIGHER, measures.TOKEN, measures.UNCERTAINTY,
                              1, ".2f", "x"), ["direction 'higher'"]),
    (lambda: measures.Measure("x", "x", measures.LOWER, measures.TOKEN, measures.FIGURE, 1,
                              "%.2f", "x"), ["'%.2f' is not a format spec"]),
])
def test_bad_names_and_entries_are_one_line_errors_naming_them(call, words):
  with pytest.raises(ValueError) as error:
    call()
  message = str(error.value)
  assert "\n" not in message
  for word in words:
    assert word in message


def test_the_registry_is_checked_on_import(monkeypatch):
  """(Which measures each report table shows: tests/experiments/test_selections.py.)"""
  measures.check()
  monkeypatch.setattr(measures, "ERROR_DETECTION_MEASURES", ("bleu_disagreement", "token_eec"))
  with pytest.raises(ValueError, match="unknown measure 'token_eec'"):
    measures.check()
  monkeypatch.setattr(measures, "ERROR_DETECTION_MEASURES", ("bleu",))
  with pytest.raises(ValueError, match="ERROR_DETECTION_MEASURES: 'bleu' is not of kind"):
    measures.check()
  monkeypatch.setattr(measures, "ERROR_DETECTION_MEASURES", ())
  monkeypatch.setattr(measures, "MEASURES", measures.MEASURES + measures.MEASURES[:1])
  with pytest.raises(ValueError, match="'token_ece' is registered twice"):
    measures.check()
  assert not hasattr(measures, "HEADLINE_FIGURES")  # the report's: defined once, elsewhere


def test_each_sequence_calibration_figure_names_the_count_of_its_positive_labels():
  assert measures.positives_figure("fraction_ece") == "reference_fraction_positives"
  assert measures.positives_figure("equivalence_chrf80_sequence_ece") == \
      "equivalence_chrf80_positives"
  assert measures.positives_figure("equivalence_exact_fraction_ece") == \
      "equivalence_exact_fraction_positives"
  assert measures.positives_figure("bleu") is None
  for name in (measures.positives_figure(m.name) for m in measures.MEASURES):
    assert name is None or measures.get(name).name == name  # every count is registered
