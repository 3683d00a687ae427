"""The registry of evaluation measures: every reported figure (``FIGURE``) and every
uncertainty measure (``UNCERTAINTY``, higher = more uncertain; it ranks outputs for error
detection and inputs for OOD detection), each named once with its label, direction,
level, display and definition; and the measures the evaluation ranks outputs by for error
detection. Which of them each report table shows is the experiment's
(``meshbayes.experiments.selections``).

Per-measure families are ``prr_``, ``auroc_``, ``fpr95_`` + measure (``family_name``) and
``equivalence_<slug>_<figure>`` (``equivalence_figure``); no other module spells them.
Pure data, no project imports; an unknown name is a one-line ``ValueError``.

>>> get("token_ece").direction, get("token_ece").level
('lower', 'token')
>>> family_name(PRR, "mutual_information")
'prr_mutual_information'
>>> get("prr_mutual_information").label
'error detection PRR, mutual information'
>>> higher_is_better("fpr95_total_uncertainty")
False
>>> names(kind=UNCERTAINTY, level=SEQUENCE)
('sequence_total_uncertainty', 'sequence_data_uncertainty', 'sequence_reverse_mutual_information')
>>> names(kind=UNCERTAINTY, level=BEAM)[:2]
('beam_total_uncertainty', 'beam_data_uncertainty')
"""

from __future__ import annotations

import dataclasses

# Kinds.
FIGURE = "figure"  # a number an evaluation reports
UNCERTAINTY = "uncertainty"  # a score of each output or input; higher: more uncertain
# Directions: which way a figure improves (an uncertainty score has none).
HIGHER, LOWER, NEITHER = "higher", "lower", "neither"
# Levels. Figures: teacher-forced token statistics (TOKEN), decoded outputs (SEQUENCE),
# out-of-distribution detection (OOD). Uncertainty measures: the mean over the output's
# tokens of a next-token measure (TOKEN, meshbayes.predictive.token_measures); from each
# posterior sample's probability of the whole output (SEQUENCE,
# meshbayes.predictive.sequence_measures); from each sample's probability of every
# hypothesis of the beam, importance-weighted (BEAM, meshbayes.predictive.
# beam_sequence_measures); of the output as decoded (OUTPUT: its probability under the
# predictive that decoded it, the outputs each sample decodes alone).
TOKEN, SEQUENCE, BEAM, OOD, OUTPUT = "token", "sequence", "beam", "ood", "output"
LEVELS = {FIGURE: (TOKEN, SEQUENCE, OOD), UNCERTAINTY: (TOKEN, SEQUENCE, BEAM, OUTPUT)}
DIRECTIONS = (HIGHER, LOWER, NEITHER)


@dataclasses.dataclass(frozen=True)
class Measure:
  """One figure or uncertainty measure.

  Attributes:
    name: the key it has in ``metrics.json``, the items and the OOD scores.
    label: its row label in tables (with its unit when scaled).
    direction: ``HIGHER`` or ``LOWER`` is better, or ``NEITHER``.
    level: one of ``LEVELS[kind]``.
    kind: ``FIGURE`` or ``UNCERTAINTY``.
    scale: tables show ``value * scale`` (100 for a percentage).
    format_spec: the format spec of the scaled value, e.g. ``'.2f'``.
    definition: what it is, in one line.
  """

  name: str
  label: str
  direction: str
  level: str
  kind: str
  scale: float
  format_spec: str
  definition: str

  def __post_init__(self):
    if self.kind not in LEVELS:
      raise ValueError(f"measure {self.name!r}: kind {self.kind!r} is not one of {tuple(LEVELS)}")
    if self.level not in LEVELS[self.kind]:
      raise ValueError(f"measure {self.name!r}: level {self.level!r} is not one of "
                       f"{LEVELS[self.kind]} (kind {self.kind!r})")
    if self.direction not in DIRECTIONS or (self.kind == UNCERTAINTY and self.direction != NEITHER):
      raise ValueError(f"measure {self.name!r}: direction {self.direction!r} is not one of "
                       f"{DIRECTIONS} ({NEITHER!r} for an uncertainty measure)")
    try:
      format(0.0, self.format_spec)
    except ValueError:
      raise ValueError(f"measure {self.name!r}: {self.format_spec!r} is not a format spec "
                       "for numbers, e.g. '.2f'") from None


def _figure(name, label, direction, level, scale, format_spec, definition) -> Measure:
  return Measure(name, label, direction, level, FIGURE, scale, format_spec, definition)


def _uncertainty(name, label, level, definition) -> Measure:
  return Measure(name, label, NEITHER, level, UNCERTAINTY, 1, ".3f", definition)


# The order matters within a kind and level: the token figures are in the order
# evaluation_items.token_figures writes them (each token_<key of
# metrics.token_calibration_metrics>), the uncertainty measures in the order
# meshbayes.predictive computes them (its TOKEN_MEASURES and SEQUENCE_MEASURES).
MEASURES = (
    _figure("token_ece", "token ECE (%)", LOWER, TOKEN, 100, ".2f",
            "top-label expected calibration error of the teacher-forced next-token "
            "distributions, 15 equal-width bins (metrics.calibration)"),
    _figure("token_weighted_ece", "token weighted ECE (%)", LOWER, TOKEN, 100, ".2f",
            "Kumar & Sarawagi's weighted calibration error over every (token, label) pair, "
            "teacher-forced"),
    _figure("token_nll", "token NLL (nats)", LOWER, TOKEN, 1, ".3f",
            "mean negative log-probability of each reference token, teacher-forced"),
    _figure("token_brier", "Brier", LOWER, TOKEN, 1, ".4f",
            "mean Brier score of the next-token distributions (summed over the vocabulary)"),
    _figure("token_accuracy", "token accuracy (%)", HIGHER, TOKEN, 100, ".2f",
            "fraction of reference tokens that are the next-token distribution's argmax"),
    _figure("num_items", "test sources", NEITHER, SEQUENCE, 1, ".0f",
            "the number of test sources (distinct source sentences) the figures are over"),
    _figure("bleu", "BLEU", HIGHER, SEQUENCE, 1, ".2f",
            "corpus BLEU of the decoded outputs, multi-reference (sacrebleu)"),
    _figure("mean_sentence_bleu", "mean sentence BLEU", HIGHER, SEQUENCE, 1, ".2f",
            "mean multi-reference sentence BLEU of the decoded outputs"),
    _figure("exact_match", "exact match (%)", HIGHER, SEQUENCE, 100, ".1f",
            "fraction of outputs that match a reference after normalization"),
    _figure("mean_probability", "mean sequence probability (%)", NEITHER, SEQUENCE, 100, ".2f",
            "mean probability p of each output under the predictive that decoded it"),
    _figure("probability_gap", "sequence probability gap (%)", NEITHER, SEQUENCE, 100, ".2f",
            "mean p minus the exact-match rate (positive: overconfident)"),
    _figure("abs_probability_gap", "absolute sequence probability gap (%)", LOWER, SEQUENCE,
            100, ".2f", "the absolute value of the sequence probability gap"),
    _figure("sequence_ece", "sequence ECE, exact match (%)", LOWER, SEQUENCE, 100, ".2f",
            "ECE of [1 - p, p] against exact match, 15 equal-width bins of max(p, 1 - p); "
            "blind to overconfidence at low match rates with several references"),
    _figure("calibration_auroc", "sequence calibration AUROC", HIGHER, SEQUENCE, 1, ".3f",
            "AUROC of p ranking the outputs that match a reference above the rest"),
    _figure("equal_mass_ece", "sequence equal-mass ECE, exact match (%)", LOWER, SEQUENCE, 100,
            ".2f", "calibration error of p against exact match in 15 equal-mass bins"),
    _figure("reference_fraction", "reference-fraction match (%)", HIGHER, SEQUENCE, 100, ".1f",
            "mean fraction of its source's references each output matches: mean q(y) when "
            "the references are draws from the translations (metrics.sequence_labels)"),
    _figure("fraction_probability_gap", "sequence probability gap, reference fraction (%)",
            NEITHER, SEQUENCE, 100, ".2f",
            "mean p minus the mean reference fraction (positive: overconfident)"),
    _figure("fraction_signed_gap", "sequence signed gap, reference fraction (%)", NEITHER,
            SEQUENCE, 100, ".2f", "mean reference fraction minus mean p (negative: "
            "overconfident; metrics.sequence_gap): a primary sequence calibration figure"),
    _figure("fraction_signed_gap_z", "sequence signed gap, reference fraction, z", NEITHER,
            SEQUENCE, 1, ".2f", "the signed gap over its standard error, the per-source "
            "standard deviation of label - p over sqrt(n)"),
    _figure("fraction_signed_gap_p_value", "sequence signed gap, reference fraction, p-value",
            NEITHER, SEQUENCE, 1, ".3f", "two-sided p-value of a true signed gap of 0 (normal "
            "approximation); under alpha the predictive is over- or underconfident"),
    _figure("fraction_ece", "sequence ECE, reference fraction (%)", LOWER, SEQUENCE, 100,
            ".2f", "one-sided ECE of p against the fraction of references matched, 15 "
            "equal-width bins of p"),
    _figure("match_rate_over_probability", "exact-match rate / mean p", NEITHER, SEQUENCE, 1,
            ".2f", "exact-match rate over mean p: E[1 - (1 - q)^k] / E[q] > 1 for a calibrated "
            "model with k > 1 references"),
    _figure("sequence_ece_null_mean", "sequence ECE of a calibrated model, mean (%)", NEITHER,
            SEQUENCE, 100, ".2f", "mean sequence ECE of labels drawn as 1[Binomial(k, p) > 0] "
            "on the same outputs (k: the source's references)"),
    _figure("sequence_ece_null_high", "sequence ECE of a calibrated model, 97.5% (%)", NEITHER,
            SEQUENCE, 100, ".2f", "97.5% quantile of that null sequence ECE"),
    _figure("debiased_sequence_ece", "debiased sequence ECE (%)", LOWER, SEQUENCE, 100, ".2f",
            "sequence ECE minus its null mean (a bias correction; can be negative)"),
    _figure("fraction_ece_null_mean", "reference-fraction ECE of a calibrated model, mean (%)",
            NEITHER, SEQUENCE, 100, ".2f", "mean reference-fraction ECE of labels drawn as "
            "Binomial(k, p) / k on the same outputs"),
    _figure("fraction_ece_null_high", "reference-fraction ECE of a calibrated model, 97.5% (%)",
            NEITHER, SEQUENCE, 100, ".2f", "97.5% quantile of that null reference-fraction ECE"),
    _figure("debiased_fraction_ece", "debiased reference-fraction ECE (%)", LOWER, SEQUENCE,
            100, ".2f", "reference-fraction ECE minus its null mean (can be negative)"),
    _figure("exact_match_positives", "outputs matching a reference", NEITHER, SEQUENCE, 1,
            ".0f", "number of outputs that match a reference (the positives of the "
            "any-reference label; under 400 the calibration figures are underpowered)"),
    _figure("reference_fraction_positives", "references matched, fraction-weighted", NEITHER,
            SEQUENCE, 1, ".1f", "sum over the outputs of the fraction of references matched "
            "(the positives of the reference-fraction label)"),
    _figure("decoded_token_ece", "decoded-token ECE, edit-distance labels (%)", LOWER,
            SEQUENCE, 100, ".2f",
            "ECE of the decoded tokens' probabilities against whether each is aligned to an "
            "equal token of its closest reference (Wang et al., 2020; metrics.token_labels)"),
    _figure("decoded_token_accuracy", "decoded-token accuracy (%)", HIGHER, SEQUENCE, 100,
            ".1f", "fraction of decoded tokens aligned to an equal token of the closest "
            "reference"),
    _figure("decoded_token_confidence_gap", "decoded-token confidence gap (%)", NEITHER,
            SEQUENCE, 100, ".2f",
            "mean probability of the decoded tokens minus their accuracy (positive: "
            "overconfident)"),
    _uncertainty("negative_log_probability", "negative log-probability", OUTPUT,
                 "-log p(y | x) / L of the output y (L tokens, EOS included) under the "
                 "predictive that decoded it"),
    _uncertainty("sequence_total_uncertainty", "sequence total uncertainty", SEQUENCE,
                 "-(1/L) log mean_s P_s(y | x); for one model its own -log P(y | x) / L"),
    _uncertainty("total_uncertainty", "total uncertainty", TOKEN,
                 "entropy of the model average's next-token distribution, H[pbar], in nats"),
    _uncertainty("data_uncertainty", "data uncertainty", TOKEN,
                 "expected data uncertainty mean_s H[p_s] of the samples' next-token "
                 "distributions"),
    _uncertainty("mutual_information", "mutual information", TOKEN,
                 "knowledge uncertainty H[pbar] - mean_s H[p_s]"),
    _uncertainty("expected_pairwise_kl", "expected pairwise KL", TOKEN,
                 "mean_{s,s'} KL(p_s || p_s') between the samples' next-token distributions"),
    _uncertainty("reverse_mutual_information", "reverse mutual information", TOKEN,
                 "mean_s KL(pbar || p_s)"),
    _uncertainty("sequence_data_uncertainty", "sequence data uncertainty", SEQUENCE,
                 "-(1/L) mean_s log P_s(y | x)"),
    _uncertainty("sequence_reverse_mutual_information", "sequence reverse mutual information",
                 SEQUENCE, "sequence data minus sequence total uncertainty (>= 0)"),
    _uncertainty("bleu_disagreement", "BLEU disagreement", OUTPUT,
                 "100 minus the mean pairwise sentence BLEU of the outputs each posterior "
                 "sample decodes alone"),
    # Over the beam's hypotheses y_b (L_b tokens), pi_b = P(y_b | x) normalized over the
    # beam (P = mean_s P_s), w_sb = P_s(y_b | x) normalized over the beam.
    _uncertainty("beam_total_uncertainty", "beam total uncertainty", BEAM,
                 "-sum_b pi_b log P(y_b | x) / L_b (Malinin & Gales's importance-weighted "
                 "sequence entropy H_S-IW)"),
    _uncertainty("beam_data_uncertainty", "beam data uncertainty", BEAM,
                 "-mean_s sum_b w_sb log P_s(y_b | x) / L_b, each sample's sequence entropy "
                 "over the beam"),
    _uncertainty("beam_mutual_information", "beam mutual information", BEAM,
                 "beam total minus beam data uncertainty"),
    _uncertainty("beam_epkl", "beam expected pairwise KL", BEAM,
                 "-sum_b pi_b mean_s log P_s(y_b | x) / L_b minus beam data uncertainty"),
    _uncertainty("beam_reverse_mutual_information", "beam reverse mutual information", BEAM,
                 "sum_b pi_b (log P(y_b | x) - mean_s log P_s(y_b | x)) / L_b (Malinin & "
                 "Gales's M_S-IW)"),
)

# Equivalence-class sequence confidence (metrics.equivalence), for each equivalence fixed in
# advance: its name -> the slug of its figures' names, equivalence_<slug>_<figure>.
EQUIVALENCE_SLUGS = {"exact": "exact", "chrf++>=0.9": "chrf90", "chrf++>=0.8": "chrf80"}
_CONFIDENCE = ("c(y) = p(y) + p of the distinct outputs among K ancestral samples "
               "equivalent to y ({equivalence}), a lower bound on y's class probability")
# Each equivalence's figures: (the exact-match figure it mirrors, with c(y) for p and an
# equivalent reference for a matching one, whose direction, scale and format it has; its
# figure's suffix; label; definition, {equivalence} its name and {c} the definition of c(y)).
_EQUIVALENCE_FIGURES = (
    ("exact_match", "match_rate", "equivalent-reference rate (%)",
     "fraction of outputs to which a reference is equivalent ({equivalence})"),
    ("exact_match_positives", "positives", "outputs with an equivalent reference",
     "number of outputs to which a reference is equivalent ({equivalence}): the positives; "
     "under 400 the figures are underpowered"),
    ("mean_probability", "mean_confidence", "mean class confidence (%)", "mean c(y), {c}"),
    ("probability_gap", "confidence_gap", "class confidence gap (%)",
     "mean c(y) minus the equivalent-reference rate (positive: overconfident), {c}"),
    ("abs_probability_gap", "abs_confidence_gap", "absolute class confidence gap (%)",
     "the absolute value of the class confidence gap, {c}"),
    ("sequence_ece", "sequence_ece", "class confidence ECE, any reference (%)",
     "ECE of [1 - c, c] against an equivalent reference, 15 equal-width bins of "
     "max(c, 1 - c), {c}"),
    ("calibration_auroc", "calibration_auroc", "class confidence AUROC",
     "AUROC of c(y) ranking the outputs with an equivalent reference above the rest, {c}"),
    ("equal_mass_ece", "equal_mass_ece", "class confidence equal-mass ECE (%)",
     "calibration error of c(y) against an equivalent reference in 15 equal-mass bins, {c}"),
    ("reference_fraction", "reference_fraction", "equivalent-reference fraction (%)",
     "mean fraction of its source's references equivalent to each output ({equivalence})"),
    ("reference_fraction_positives", "fraction_positives",
     "equivalent references, fraction-weighted", "sum over the outputs of the fraction of "
     "references equivalent ({equivalence}): the fraction label's positives"),
    ("fraction_probability_gap", "fraction_confidence_gap",
     "class confidence gap, reference fraction (%)",
     "mean c(y) minus the mean equivalent-reference fraction (positive: overconfident), {c}"),
    ("fraction_signed_gap", "fraction_signed_confidence_gap",
     "class confidence signed gap, reference fraction (%)",
     "mean equivalent-reference fraction minus mean c(y) (negative: overconfident), {c}"),
    ("fraction_signed_gap_z", "fraction_signed_confidence_gap_z",
     "class confidence signed gap, reference fraction, z",
     "the class confidence signed gap over its standard error, {c}"),
    ("fraction_signed_gap_p_value", "fraction_signed_confidence_gap_p_value",
     "class confidence signed gap, reference fraction, p-value",
     "two-sided p-value of a true class confidence signed gap of 0, {c}"),
    ("fraction_ece", "fraction_ece", "class confidence ECE, reference fraction (%)",
     "one-sided ECE of c(y) against the fraction of references equivalent, 15 equal-width "
     "bins of c, {c}"),
    ("match_rate_over_probability", "match_rate_over_confidence",
     "equivalent-reference rate / mean class confidence",
     "equivalent-reference rate over mean c(y), {c}"),
    ("sequence_ece_null_mean", "sequence_ece_null_mean",
     "class confidence ECE of a calibrated model, mean (%)",
     "mean class confidence ECE of labels drawn as 1[Binomial(k, c) > 0] on the same "
     "outputs (k: the source's references), {c}"),
    ("sequence_ece_null_high", "sequence_ece_null_high",
     "class confidence ECE of a calibrated model, 97.5% (%)",
     "97.5% quantile of that null class confidence ECE, {c}"),
    ("debiased_sequence_ece", "debiased_sequence_ece", "debiased class confidence ECE (%)",
     "class confidence ECE minus its null mean (can be negative), {c}"),
    ("fraction_ece_null_mean", "fraction_ece_null_mean",
     "class confidence fraction ECE of a calibrated model, mean (%)",
     "mean reference-fraction ECE of labels drawn as Binomial(k, c) / k on the same "
     "outputs, {c}"),
    ("fraction_ece_null_high", "fraction_ece_null_high",
     "class confidence fraction ECE of a calibrated model, 97.5% (%)",
     "97.5% quantile of that null reference-fraction ECE, {c}"),
    ("debiased_fraction_ece", "debiased_fraction_ece",
     "debiased class confidence fraction ECE (%)",
     "class confidence reference-fraction ECE minus its null mean (can be negative), {c}"),
)
EQUIVALENCE_MIRRORED_FIGURES = tuple(row[0] for row in _EQUIVALENCE_FIGURES)


def equivalence_figure(equivalence: str, figure: str) -> str:
  """The name of ``equivalence``'s figure mirroring the exact-match ``figure`` (one of
  ``EQUIVALENCE_MIRRORED_FIGURES``).

  >>> equivalence_figure("chrf++>=0.9", "mean_probability")
  'equivalence_chrf90_mean_confidence'

  Raises:
    ValueError: an unknown equivalence or figure (one line naming it).
  """
  if equivalence not in EQUIVALENCE_SLUGS:
    raise ValueError(f"unknown equivalence {equivalence!r}; valid: "
                     f"{', '.join(map(repr, EQUIVALENCE_SLUGS))}")
  suffix = {row[0]: row[1] for row in _EQUIVALENCE_FIGURES}.get(figure)
  if suffix is None:
    raise ValueError(f"no equivalence figure mirrors {figure!r}; valid: "
                     f"{', '.join(EQUIVALENCE_MIRRORED_FIGURES)}")
  return f"equivalence_{EQUIVALENCE_SLUGS[equivalence]}_{suffix}"


_REGISTERED_SO_FAR = {measure.name: measure for measure in MEASURES}
MEASURES += tuple(
    dataclasses.replace(
        _REGISTERED_SO_FAR[mirrored], name=equivalence_figure(equivalence, mirrored),
        label=f"{label}, {equivalence}", definition=definition.format(
            equivalence=equivalence, c=_CONFIDENCE.format(equivalence=equivalence)))
    for equivalence in EQUIVALENCE_SLUGS
    for mirrored, _, label, definition in _EQUIVALENCE_FIGURES)


# A sequence calibration figure from fewer positive labels than this is underpowered: a
# power simulation (a calibrated model against one sharpened by temperature 0.7, paired
# bootstrap of the ECE) needs about 400 matching outputs to tell them apart.
MIN_POSITIVES = 400
# The calibration figures of each label, by the figure counting that label's positives.
_LABELLED_BY = {
    "exact_match_positives": ("mean_probability", "probability_gap", "abs_probability_gap",
                              "sequence_ece", "calibration_auroc", "equal_mass_ece",
                              "match_rate_over_probability", "debiased_sequence_ece"),
    "reference_fraction_positives": ("fraction_probability_gap", "fraction_signed_gap",
                                     "fraction_signed_gap_z", "fraction_signed_gap_p_value",
                                     "fraction_ece", "debiased_fraction_ece"),
}
_POSITIVES = {figure: count for count, figures in _LABELLED_BY.items() for figure in figures}
_POSITIVES.update({equivalence_figure(equivalence, figure): equivalence_figure(equivalence, count)
                   for equivalence in EQUIVALENCE_SLUGS for figure, count in _POSITIVES.items()})


def positives_figure(name: str) -> str | None:
  """The figure counting the positive labels ``name`` is computed from (None: not a
  sequence calibration figure); under ``MIN_POSITIVES`` of them it is underpowered.

  >>> positives_figure("sequence_ece"), positives_figure("token_ece")
  ('exact_match_positives', None)
  """
  return _POSITIVES.get(name)


@dataclasses.dataclass(frozen=True)
class Family:
  """Figures computed per uncertainty measure, named ``<prefix>_<measure>``.

  Attributes:
    prefix: the names' prefix, without the underscore.
    label: the label, ``{measure}`` standing for the measure's label.
    direction, level, scale, format_spec: as ``Measure``'s (the level a figure's).
    definition: the definition, ``{measure}`` standing for the measure's label.
  """

  prefix: str
  label: str
  direction: str
  level: str
  scale: float
  format_spec: str
  definition: str

  def member(self, measure: Measure) -> Measure:
    """The figure of this family for ``measure``."""
    return Measure(f"{self.prefix}_{measure.name}", self.label.format(measure=measure.label),
                   self.direction, self.level, FIGURE, self.scale, self.format_spec,
                   self.definition.format(measure=measure.label))


PRR, AUROC, FPR95 = "prr", "auroc", "fpr95"
FAMILIES = (
    Family(PRR, "error detection PRR, {measure}", HIGHER, SEQUENCE, 1, ".3f",
           "prediction rejection ratio of the sentence-BLEU error 1 - BLEU / 100, outputs "
           "rejected by {measure}, most uncertain first (metrics.rejection)"),
    Family(AUROC, "OOD AUROC, {measure}", HIGHER, OOD, 1, ".3f",
           "AUROC of telling out-of-distribution inputs from in-distribution ones by "
           "{measure}, higher meaning out of distribution"),
    Family(FPR95, "OOD FPR at 95% TPR (%), {measure}", LOWER, OOD, 100, ".1f",
           "fraction of in-distribution inputs flagged when {measure}'s threshold flags 95% "
           "of the out-of-distribution ones"),
)

# The measures outputs are ranked by for error detection (the evaluation computes a prr_
# figure of each), in the order reports show them.
ERROR_DETECTION_MEASURES = ("negative_log_probability", "sequence_total_uncertainty",
                            "total_uncertainty", "mutual_information",
                            "reverse_mutual_information", "sequence_reverse_mutual_information",
                            "bleu_disagreement", "beam_total_uncertainty", "beam_data_uncertainty",
                            "beam_mutual_information", "beam_epkl",
                            "beam_reverse_mutual_information")


def _by_name() -> dict[str, Measure]:
  # Read at each call, not cached: a test may extend MEASURES.
  return {measure.name: measure for measure in MEASURES}


def _unknown(name: str) -> ValueError:
  prefixes = "/".join(f"{family.prefix}_" for family in FAMILIES)
  return ValueError(f"unknown measure {name!r}; valid: {', '.join(_by_name())}, or "
                    f"{prefixes}<uncertainty measure>")


def get(name: str) -> Measure:
  """The entry of ``name``: a registered measure or a family's figure of one.

  Raises:
    ValueError: one line naming ``name`` and the valid names.
  """
  if not isinstance(name, str):
    raise _unknown(name)
  registered = _by_name()
  if name in registered:
    return registered[name]
  for family in FAMILIES:
    measure = registered.get(name.removeprefix(f"{family.prefix}_"))
    if name.startswith(f"{family.prefix}_") and measure is not None and (
        measure.kind == UNCERTAINTY):
      return family.member(measure)
  raise _unknown(name)


def family_name(family: str, measure: str) -> str:
  """The name of ``family``'s figure for ``measure`` (``'auroc'``, ``'total_uncertainty'``
  -> ``'auroc_total_uncertainty'``).

  ``measure`` need not be registered: OOD scores of any name get their figures, and only
  registered ones are read back by ``get``.

  Raises:
    ValueError: ``family`` is not one of ``PRR``, ``AUROC``, ``FPR95``.
  """
  if family not in (f.prefix for f in FAMILIES):
    raise ValueError(f"unknown family {family!r}; valid: "
                     f"{', '.join(f.prefix for f in FAMILIES)}")
  return f"{family}_{measure}"


def names(kind: str | None = None, level: str | None = None,
          direction: str | None = None) -> tuple[str, ...]:
  """The registered names (families' figures not included) of ``kind``, ``level`` and
  ``direction`` (None: any), in the registry's order."""
  for what, value, valid in (("kind", kind, tuple(LEVELS)), ("direction", direction, DIRECTIONS),
                             ("level", level, sorted({l for ls in LEVELS.values() for l in ls}))):
    if value is not None and value not in valid:
      raise ValueError(f"measures.names: {what} {value!r} is not one of {tuple(valid)}")
  return tuple(m.name for m in MEASURES if (kind is None or m.kind == kind)
               and (level is None or m.level == level)
               and (direction is None or m.direction == direction))


def higher_is_better(name: str) -> bool | None:
  """Whether ``name`` improves upwards (None: neither way, e.g. the mean probability or
  an uncertainty measure).

  Raises:
    ValueError: ``name`` is not registered.
  """
  direction = get(name).direction
  return None if direction == NEITHER else direction == HIGHER


def check() -> None:
  """Checks the registry: each name once, none of a family's form, and every measure of
  ``ERROR_DETECTION_MEASURES`` registered and an uncertainty measure.

  Raises:
    ValueError: one line naming the bad name.
  """
  seen = set()
  for measure in MEASURES:
    if measure.name in seen or measure.name.startswith(
        tuple(f"{family.prefix}_" for family in FAMILIES)):
      raise ValueError(f"MEASURES: {measure.name!r} is registered twice or has the form of "
                       "a family's figure")
    seen.add(measure.name)
  for name in ERROR_DETECTION_MEASURES:
    if get(name).kind != UNCERTAINTY:
      raise ValueError(f"ERROR_DETECTION_MEASURES: {name!r} is not of kind {UNCERTAINTY!r}")


check()  # a misspelt or doubled name fails on import
