"""Which measures of the registry (``meshbayes.metrics.measures``) each report table shows,
in its order: defined here once, read by the run table (``compare``), the experiment's
comparisons (``tables``), its figures (``report``) and its verdicts (``verdicts``,
``band_verdicts``).

The registry says what a measure is (name, label, direction, how it is computed); this
module says only where it is shown. A table's rows that must agree are derived from one
list: the headline figures are the run table's rows marked ``HEADLINE``, the seed tables'
OOD measures those of ``OOD_MEASURES`` every model has, and the run table's OOD rows every
measure an OOD input is scored by (a measure added to the registry is shown there without
being listed here). The primary sequence figure is the reference-fraction signed gap
(``fraction_signed_gap``: it sees over- and underconfidence), its z-test's p-value beside it
and before the one-sided reference-fraction ECE.

>>> headline_figures()[:4]
('bleu', 'exact_match', 'sequence_ece', 'fraction_signed_gap')
>>> seed_ood_measures()
('total_uncertainty', 'beam_total_uncertainty')
"""

from __future__ import annotations

from meshbayes.metrics import measures as registry

HEADLINE = "headline"  # also a row of the paired-difference and seed tables
# The run table's figure rows in order, each marked HEADLINE when the paired-difference
# and seed tables repeat it.
FIGURE_ROWS = (
    ("bleu", HEADLINE), ("exact_match", HEADLINE), ("exact_match_positives", ""),
    ("mean_probability", ""), ("sequence_ece", HEADLINE), ("sequence_ece_null_high", ""),
    ("fraction_signed_gap", HEADLINE), ("fraction_signed_gap_p_value", ""),
    ("fraction_ece", HEADLINE), ("fraction_ece_null_high", ""),
    ("calibration_auroc", HEADLINE), ("equivalence_chrf80_positives", ""),
    ("equivalence_chrf80_sequence_ece", HEADLINE),
    ("equivalence_chrf80_sequence_ece_null_high", ""),
    ("equivalence_chrf80_calibration_auroc", HEADLINE), ("decoded_token_ece", HEADLINE),
    ("prr_negative_log_probability", HEADLINE), ("prr_mutual_information", ""),
    ("token_ece", HEADLINE), ("token_weighted_ece", ""), ("token_nll", HEADLINE),
    ("token_accuracy", ""), ("token_brier", HEADLINE))
# What the one-predictive verdicts (``band_verdicts``) read of each seed beside the headline
# figures: the signed gap's z-test, the one-sided ECE's null band, the mean label (the
# match rate a miscalibration factor scales) and the number of sources.
BAND_FIGURES = ("fraction_signed_gap", "fraction_signed_gap_z", "fraction_signed_gap_p_value",
                "fraction_ece", "fraction_ece_null_high", "reference_fraction", "num_items")
# The order of the run table's OOD rows; a scored measure not named here follows them, in
# the registry's order.
OOD_ROW_ORDER = ("mutual_information", "reverse_mutual_information", "expected_pairwise_kl",
                 "total_uncertainty", "data_uncertainty", "sequence_reverse_mutual_information",
                 "sequence_total_uncertainty", "sequence_data_uncertainty", "bleu_disagreement",
                 "beam_mutual_information", "beam_reverse_mutual_information", "beam_epkl",
                 "beam_total_uncertainty", "beam_data_uncertainty")
# Uncertainty measures of decoded test outputs only: OOD inputs are not scored by them.
OUTPUT_ONLY = ("negative_log_probability",)
EVERY_MODEL = "every model"  # a measure every model has (a point model too)
# The OOD measures fixed before looking at any result, in the experiment's tables' order:
# predictive entropy (every model has it), for a posterior mutual information (its samples'
# disagreement), and for a set decoded by beam search the beam-level total uncertainty. Those
# every model has are also the seed tables' and the verdicts' OOD AUROCs.
OOD_MEASURES = (("total_uncertainty", EVERY_MODEL), ("mutual_information", ""),
                ("beam_total_uncertainty", EVERY_MODEL))
# The measures of the report's OOD AUROC figure, in order.
OOD_PLOT_MEASURES = ("total_uncertainty", "mutual_information", "reverse_mutual_information",
                     "sequence_total_uncertainty")


def run_table_figures() -> tuple[str, ...]:
  """The run table's figure rows, in order."""
  return tuple(name for name, _ in FIGURE_ROWS)


def headline_figures() -> tuple[str, ...]:
  """The figures the paired-difference and seed tables repeat, in the run table's order."""
  return tuple(name for name, mark in FIGURE_ROWS if mark == HEADLINE)


def band_figures() -> tuple[str, ...]:
  """The figures the one-predictive verdicts read of each seed (``BAND_FIGURES``)."""
  return BAND_FIGURES


def ood_table_measures() -> tuple[str, ...]:
  """The run table's OOD rows: every registered measure an OOD input is scored by, in
  ``OOD_ROW_ORDER`` and then the registry's."""
  scored = [name for name in registry.names(kind=registry.UNCERTAINTY)
            if name not in OUTPUT_ONLY]
  listed = [name for name in OOD_ROW_ORDER if name in scored]
  return (*listed, *(name for name in scored if name not in listed))


def ood_measures() -> tuple[str, ...]:
  """The OOD measures fixed in advance (the experiment's OOD and paired tables)."""
  return tuple(name for name, _ in OOD_MEASURES)


def seed_ood_measures() -> tuple[str, ...]:
  """Those of ``ood_measures`` every model has: the seed tables' OOD AUROCs."""
  return tuple(name for name, mark in OOD_MEASURES if mark == EVERY_MODEL)


def error_detection_measures() -> tuple[str, ...]:
  """The measures of the error-detection rows: those the evaluation computes a PRR of
  (the registry's ``ERROR_DETECTION_MEASURES``), in its order."""
  return registry.ERROR_DETECTION_MEASURES


def check() -> None:
  """Every selected name registered and of its kind, each at most once, each mark known.

  Raises:
    ValueError: one line naming the bad entry.
  """
  for selection, chosen, kind in (
      ("FIGURE_ROWS", run_table_figures(), registry.FIGURE),
      ("BAND_FIGURES", BAND_FIGURES, registry.FIGURE),
      ("OOD_ROW_ORDER", OOD_ROW_ORDER, registry.UNCERTAINTY),
      ("OUTPUT_ONLY", OUTPUT_ONLY, registry.UNCERTAINTY),
      ("OOD_MEASURES", ood_measures(), registry.UNCERTAINTY),
      ("OOD_PLOT_MEASURES", OOD_PLOT_MEASURES, registry.UNCERTAINTY)):
    if len(set(chosen)) != len(chosen):
      raise ValueError(f"{selection}: {chosen!r} names a measure twice")
    for name in chosen:
      if registry.get(name).kind != kind:
        raise ValueError(f"{selection}: {name!r} is not of kind {kind!r}")
  for selection, rows, mark in (("FIGURE_ROWS", FIGURE_ROWS, HEADLINE),
                                ("OOD_MEASURES", OOD_MEASURES, EVERY_MODEL)):
    for name, given in rows:
      if given not in (mark, ""):
        raise ValueError(f"{selection}: {name!r} is marked {given!r}; valid: {mark!r} or ''")


check()  # a misspelt or doubled name fails on import
