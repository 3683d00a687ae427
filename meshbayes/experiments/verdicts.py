"""One verdict per claim of "is being Bayesian worth it", at the level of training seeds, by
the rules fixed before the runs (docs/results/2026-11-29-sequence-calibration-design.md,
"Verdict rules").

Each comparison sets a column of the experiment (a predictive, over its seeds) against the
column that would explain its effect away. Each claim is decided by its deciding figures
and reports others beside them (translation: BLEU decides, the token NLL is reported).
Per figure: the paired difference over the seeds both columns have (seed k of every recipe
sees the same batches), its mean with the 95% t-interval and the two-sided t-test's
p-value. Holm's step-down correction at family-wise 0.05 runs over every deciding figure
of every claim of one comparison. A claim ``helps`` (``hurts``) when one of its figures is
rejected in its favour (against it) and none the other way, is ``mixed`` when both, and
``cannot tell`` otherwise, with its power: the true difference each deciding figure would
detect with probability 0.8 at Holm's smallest level, from the seeds' realized stddev.
Sequence calibration is decided on the pool only (``on_pool``) and, as a paired comparison,
only where every seed of both columns has ``registry.MIN_POSITIVES`` positive labels
(else ``underpowered``, outside the family). A reported figure's direction is stated at
Holm's smallest level, so it never reads stronger than a deciding one. The
one-sample verdicts against the band are ``band_verdicts``'.

Before these rules (fixed at commit 0b462b6) a claim helped when one of its figures' 95%
intervals excluded 0, with no correction: the published report of 2026-11-29
(docs/uncertainty/bayesian_worth_it/) was made so, at commit d8db8b0; ``report.
seed_values_from_summary`` reads it back for today's rules.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meshbayes.experiments import recipes, selections, tables
from meshbayes.metrics import bootstrap
from meshbayes.metrics import measures as registry
from meshbayes.metrics import multiple_testing, seed_power
from meshbayes.metrics.seed_intervals import paired_t_interval

Values = Mapping[str, Mapping[str, Mapping[int, float]]]  # tables.seed_values'
HELPS, HURTS, MIXED, CANNOT_TELL, UNDERPOWERED = ("helps", "hurts", "mixed", "cannot tell",
                                                  "underpowered")
BETTER, WORSE = "better", "worse"
DEFAULT_ALPHA = multiple_testing.DEFAULT_ALPHA
# The absolute reference-fraction signed gap, taken of each seed's signed gap here: how far
# from calibrated, either way (lower is better).
ABS_GAP, SIGNED_GAP = "abs_fraction_signed_gap", "fraction_signed_gap"


@dataclasses.dataclass(frozen=True)
class Figure:
  """A figure a claim reads: its seed-table name, the short name and the verb its label
  says it with ("translates better (BLEU)")."""

  name: str
  short: str
  verb: str


@dataclasses.dataclass(frozen=True)
class Claim:
  """A question the experiment answers: the figures that decide it, those reported beside
  them, and whether it is read on the pool's evaluations."""

  name: str
  deciding: tuple[Figure, ...]
  reported: tuple[Figure, ...] = ()
  on_pool: bool = False


@dataclasses.dataclass(frozen=True)
class Comparison:
  """A column set against the control that would explain its effect away."""

  column: str
  control: str
  question: str

  @property
  def key(self) -> str:
    return f"{self.column} vs {self.control}"


CLAIMS = (
    Claim("translation", (Figure("bleu", "BLEU", "translates"),),
          (Figure("token_nll", "NLL", "fits"),)),
    Claim("token calibration", (Figure("token_ece", "token ECE", "calibrates tokens"),)),
    # The exact-match ECE cannot see overconfidence at these match rates: reported only.
    Claim("sequence calibration",
          (Figure(ABS_GAP, "|signed gap|", "calibrates sequences"),
           Figure("fraction_ece", "reference-fraction ECE", "calibrates sequences")),
          (Figure("sequence_ece", "exact-match ECE", "calibrates sequences"),), on_pool=True),
    Claim("error detection", (Figure("prr_negative_log_probability", "PRR", "detects errors"),)),
    # By the beam-level total uncertainty (Malinin and Gales's measure over the beam, which
    # every predictive has), then the token-level one.
    Claim("OOD (Spanish inputs)",
          (Figure("ood/spanish/beam_total_uncertainty", "beam AUROC", "detects Spanish inputs"),
           Figure("ood/spanish", "token AUROC", "detects Spanish inputs"))),
)

# The design's comparisons, each side a (method, predictive) whose title is the report's
# column (``recipes``): the noise arms take their posterior mean, as the chain deterministic,
# noise, noise_map, Bayesian layers (mean) adds one thing at each step.
DESIGN = (
    (("bayesian", "model_average"), ("deterministic", "posterior_mean"), "the headline"),
    (("bayesian", "posterior_mean"), ("deterministic", "posterior_mean"),
     "without the averaging"),
    (("bayesian", "model_average"), ("bayesian", "posterior_mean"), "does the averaging help"),
    (("bayesian", "posterior_mean"), ("map", "posterior_mean"),
     "does MAP's penalty explain it"),
    (("noise", "posterior_mean"), ("deterministic", "posterior_mean"),
     "does the weight noise alone help"),
    (("noise_map", "posterior_mean"), ("noise", "posterior_mean"),
     "the prior's penalty on top of the noise"),
    (("bayesian", "posterior_mean"), ("noise_map", "posterior_mean"),
     "learning the stddevs (the variational part)"),
)
# The older presets' posteriors against the deterministic model (not run by the design).
OLDER = tuple(((method, "model_average"), ("deterministic", "posterior_mean"),
               f"{question} (an older preset's)")
              for method, question in (("bayesian_kl1", "the ELBO's own posterior, KL weight 1"),
                                       ("bayesian_kl0.3", "KL weight 0.3"),
                                       ("ivon", "IVON's posterior")))
# Methods of the design the experiment has only once the evaluation registers them (the
# noise control's two arms): their comparisons are left out until then.
AWAITED = recipes.NOISE_ARMS
SCALED_BASELINE = ("deterministic", "posterior_mean_temperature_scaled")


def _title(method: str, predictive: str) -> str:
  columns = dict(recipes.get(method).columns)
  if predictive not in columns:
    raise ValueError(f"verdicts: {method!r} has no column of predictive {predictive!r}; "
                     f"valid: {', '.join(columns)}")
  return columns[predictive]


def comparisons() -> tuple[Comparison, ...]:
  """The design's comparisons, then each temperature-scaled predictive against the
  temperature-scaled deterministic model, then the older presets' (titles: ``recipes``').

  Raises:
    ValueError: a method or predictive the experiment does not have (but ``AWAITED``).
  """
  known = recipes.names()
  for column, control, _ in (*DESIGN, *OLDER):
    for method in (column[0], control[0]):
      if method not in known and method not in AWAITED:
        raise ValueError(f"verdicts: method {method!r} is not one of the experiment's "
                         f"({', '.join(known)})")
  present = lambda rows: [Comparison(_title(*column), _title(*control), question)
                          for column, control, question in rows
                          if column[0] in known and control[0] in known]
  scaled = _title(*SCALED_BASELINE)
  return (*present(DESIGN),
          *(Comparison(title, scaled, "calibration beyond temperature scaling")
            for name in known if name != SCALED_BASELINE[0]
            for predictive, title in recipes.get(name).columns
            if predictive.endswith("_temperature_scaled")),
          *present(OLDER))


# --------------------------------------------------------------------------- figures


def _display(name: str) -> tuple[str, float, str]:
  """``(label, scale, format)`` of a claim's figure."""
  if name.startswith("ood/"):
    ood_set, measure = tables.parse_ood_figure(name)
    return f"OOD {ood_set} AUROC by {measure.replace('_', ' ')}", 1.0, ".3f"
  if name == ABS_GAP:
    gap = registry.get(SIGNED_GAP)
    return f"absolute {gap.label}", gap.scale, gap.format_spec
  figure = registry.get(name)
  return figure.label, figure.scale, figure.format_spec


def _higher_is_better(name: str) -> bool:
  return name.startswith("ood/") or (name != ABS_GAP and bool(registry.higher_is_better(name)))


def _positives_figure(name: str) -> str | None:
  return registry.positives_figure(SIGNED_GAP if name == ABS_GAP else name)


def with_absolute_gap(values: Values) -> dict[str, dict[str, dict[int, float]]]:
  """``values`` with each column's ``ABS_GAP``: each seed's ``|fraction_signed_gap|``."""
  result = {title: dict(figures) for title, figures in values.items()}
  for figures in result.values():
    if SIGNED_GAP in figures:
      figures[ABS_GAP] = {seed: abs(v) for seed, v in figures[SIGNED_GAP].items()}
  return result


def _fewest_positives(values: Values, titles: Sequence[str], name: str) -> float | None:
  """The fewest positive labels figure ``name`` rests on in any seed of ``titles``."""
  count = _positives_figure(name)
  found = [v for t in titles for v in values.get(t, {}).get(count or "", {}).values()]
  return min(found) if count and found else None


def figure_test(values: Values, comparison: Comparison, name: str,
                level: float = bootstrap.DEFAULT_LEVEL) -> dict[str, Any] | None:
  """One figure's paired difference over seeds (column minus control): its t-interval
  and p-value, the seeds' stddev of the differences, and the fewest positives a sequence
  figure rests on; None without two shared seeds."""
  a = values.get(comparison.column, {}).get(name, {})
  b = values.get(comparison.control, {}).get(name, {})
  common = sorted(set(a) & set(b))
  if len(common) < 2:
    return None
  difference = paired_t_interval(a, b, level)
  result = {"figure": name, "difference": difference.as_dict(),
            "std": float(np.std([a[k] - b[k] for k in common], ddof=1))}
  fewest = _fewest_positives(values, (comparison.column, comparison.control), name)
  if fewest is not None:
    result["positives"] = fewest
  return result


def _direction(name: str, estimate: float) -> str:
  return BETTER if (estimate > 0) == _higher_is_better(name) else WORSE


def claim_verdict(directions: Sequence[str]) -> str:
  """``helps``, ``hurts``, ``mixed`` or ``cannot tell`` from the directions of a claim's
  rejected deciding figures (``better``, ``worse``)."""
  if BETTER in directions and WORSE in directions:
    return MIXED
  if BETTER in directions or WORSE in directions:
    return HELPS if BETTER in directions else HURTS
  return CANNOT_TELL


def _label(claim: Claim, figures: Sequence[dict[str, Any]]) -> str:
  """What the claim's figures show: "fits worse (NLL), BLEU cannot tell"."""
  by_name = {f.name: f for f in (*claim.deciding, *claim.reported)}
  shown = [f"{by_name[f['figure']].verb} {f['verdict']} ({by_name[f['figure']].short})"
           for f in figures if f["verdict"] in (BETTER, WORSE)]
  unclear = [f"{by_name[f['figure']].short} {f['verdict']}" for f in figures
             if f["deciding"] and f["verdict"] in (CANNOT_TELL, UNDERPOWERED)]
  return ", ".join(shown + unclear)


def comparison_verdicts(values: Values, pool: Values | None, comparison: Comparison,
                        claims: Sequence[Claim] = CLAIMS, alpha: float = DEFAULT_ALPHA,
                        level: float = bootstrap.DEFAULT_LEVEL) -> dict[str, Any] | None:
  """Every claim's verdict of one comparison, Holm over all its deciding figures.

  Args:
    values: ``tables.seed_values`` of the test split's evaluations.
    pool: the same of the pool's (None: no pool; claims ``on_pool`` are then left out).
    comparison: the columns.
    claims: the claims.
    alpha: the family-wise level.
    level: the t-intervals' coverage.

  Returns:
    ``{"family_size", "holm_level", "claims": {name: {"verdict", "label", "figures"}}}``
    (each figure: ``figure_test``'s, with ``deciding``, ``verdict`` and, for a deciding one,
    ``holm_p_value`` and ``detectable``: the true difference detected with probability 0.8
    at ``holm_level``); None when no claim has two shared seeds.
  """
  found: dict[str, list[dict[str, Any]]] = {}
  sources = {False: with_absolute_gap(values),
             True: with_absolute_gap(pool) if pool is not None else {}}
  for claim in claims:
    source = sources[claim.on_pool]
    figures = []
    for figure, deciding in ([(f, True) for f in claim.deciding]
                             + [(f, False) for f in claim.reported]):
      test = figure_test(source, comparison, figure.name, level)
      if test is not None:
        figures.append(dict(test, deciding=deciding))
    if any(f["deciding"] for f in figures):
      found[claim.name] = figures
  if not found:
    return None
  for figures in found.values():
    for f in figures:  # a paired sequence figure on too few positives decides nothing
      if f.get("positives", math.inf) < registry.MIN_POSITIVES:
        f["verdict"] = UNDERPOWERED
  family = [f for figures in found.values() for f in figures
            if f["deciding"] and "verdict" not in f]
  # A figure with no spread over seeds has no p-value: in the family, never rejected.
  p_values = [f["difference"]["p_value"] for f in family]
  holm = multiple_testing.holm([1.0 if math.isnan(p) else p for p in p_values], alpha)
  smallest = holm.smallest_level
  for f, rejected, adjusted in zip(family, holm.rejected, holm.adjusted):
    difference = f["difference"]
    f.update(holm_p_value=adjusted, verdict=(
        _direction(f["figure"], difference["estimate"]) if rejected else CANNOT_TELL),
             detectable=seed_power.detectable_effect(
                 f["std"] / math.sqrt(difference["seed_counts"][0]), smallest,
                 df=difference["df"]))
  claims_found = {}
  for claim in claims:
    if claim.name not in found:
      continue
    figures = found[claim.name]
    for f in figures:
      p = f["difference"]["p_value"]
      if "verdict" not in f:  # reported: its direction at the family's strictest level
        f["verdict"] = (_direction(f["figure"], f["difference"]["estimate"])
                        if not math.isnan(p) and p < smallest else CANNOT_TELL)
    deciding = [f for f in figures if f["deciding"]]
    verdict = (UNDERPOWERED if all(f["verdict"] == UNDERPOWERED for f in deciding) else
               claim_verdict([f["verdict"] for f in deciding]))
    claims_found[claim.name] = {"verdict": verdict, "label": _label(claim, figures),
                                "figures": figures}
  return {"family_size": len(family), "holm_level": smallest, "claims": claims_found}


def verdict_table(values: Values, pool: Values | None = None,
                  comparison_list: Sequence[Comparison] | None = None,
                  claims: Sequence[Claim] = CLAIMS, alpha: float = DEFAULT_ALPHA,
                  level: float = bootstrap.DEFAULT_LEVEL) -> tuple[str, dict[str, Any]]:
  """``(markdown, summary)``: a row per comparison with seeds on both sides, a column per
  claim, each cell the claim's verdict, what its figures show and each figure's paired
  difference over seeds (``comparison_verdicts``; ``comparison_list``: ``comparisons()``)."""
  lines = ["| comparison (column minus control; paired t over seeds; Holm over the row's "
           f"deciding figures at family-wise {alpha:g}) | "
           + " | ".join(c.name for c in claims) + " |", "|---" * (len(claims) + 1) + "|"]
  summary: dict[str, Any] = {}
  for comparison in comparisons() if comparison_list is None else comparison_list:
    found = comparison_verdicts(values, pool, comparison, claims, alpha, level)
    if found is None:
      continue
    summary[comparison.key] = {"question": comparison.question, **found}
    cells = [_cell(found["claims"][c.name], found["holm_level"]) if c.name in found["claims"]
             else "-" for c in claims]
    lines.append(f"| {comparison.key}: {comparison.question} ({found['family_size']} "
                 f"deciding figures, smallest level {found['holm_level']:.2g}) | "
                 + " | ".join(cells) + " |")
  return ("\n".join(lines) if summary else ""), summary


def _cell(claim: dict[str, Any], smallest: float) -> str:
  text = f"**{claim['verdict']}**: {claim['label']}. " + "; ".join(
      _figure_text(f) for f in claim["figures"])
  powers = [f for f in claim["figures"] if f["verdict"] == CANNOT_TELL and f["deciding"]]
  if claim["verdict"] == CANNOT_TELL and powers:
    text += f". Power: detects with probability 0.8 at {smallest:.2g} " + ", ".join(
        f"{_display(f['figure'])[0]} ±{_scaled(f['figure'], f['detectable'])}"
        for f in powers)
  return text


def _scaled(name: str, value: float, sign: str = "") -> str:
  """``value`` in the units and format of figure ``name`` (``sign``: ``'+'`` to sign it)."""
  _, scale, spec = _display(name)
  return "-" if math.isnan(value) else format(value * scale, sign + spec)


def _figure_text(figure: dict[str, Any]) -> str:
  name, difference = figure["figure"], figure["difference"]
  signed = lambda key: _scaled(name, difference[key], "+")
  text = (f"{_display(name)[0]}{'' if figure['deciding'] else ' (reported)'} "
          f"{signed('estimate')} [{signed('low')}, {signed('high')}], "
          f"{difference['seed_counts'][0]} seeds, p={_number(difference['p_value'])}")
  if "holm_p_value" in figure:
    text += f", Holm p={_number(figure['holm_p_value'])}"
  if figure["verdict"] == UNDERPOWERED:
    text += f", underpowered ({figure['positives']:.0f} positives)"
  return text


def _number(value: float) -> str:
  return "-" if math.isnan(value) else format(value, ".2g")


def check() -> None:
  """Every claim's figure one the seed tables collect (a headline figure, the absolute
  signed gap, or an OOD AUROC by a measure every model has), every comparison's columns
  report columns.

  Raises:
    ValueError: one line naming the bad figure or column.
  """
  headline, seed_ood = selections.headline_figures(), selections.seed_ood_measures()
  for claim in CLAIMS:
    for figure in (*claim.deciding, *claim.reported):
      name = SIGNED_GAP if figure.name == ABS_GAP else figure.name
      if not (name in headline or name.startswith("ood/")
              and tables.parse_ood_figure(name)[1] in seed_ood):
        raise ValueError(f"CLAIMS: {claim.name!r}'s figure {figure.name!r} is not a headline "
                         f"figure or an OOD AUROC by one of {', '.join(seed_ood)}")
  comparisons()


check()  # a claim the seed tables cannot answer fails on import
