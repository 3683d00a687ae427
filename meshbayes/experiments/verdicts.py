"""One verdict per claim of "is being Bayesian worth it", at the level of training seeds.

Each comparison sets a column of the experiment (a method's predictive, over its seeds)
against the column that would explain its effect away: the tuned deterministic model, its
temperature-scaled self for token calibration, MAP under the same penalty for the weight
noise. Each claim is a few figures; each figure's difference is the paired t interval over
the seed numbers both columns have (seed k of every recipe sees the same batches). A claim
is ``helps`` or ``hurts`` when at least one of its figures is outside noise and none points
the other way, ``mixed`` when they disagree, ``cannot tell`` when none is outside noise, and
``underpowered`` for a sequence calibration figure whose positive labels fall under
``registry.MIN_POSITIVES`` in a seed of either column. Fewer than two shared seeds: no
verdict. A claim's figures are among those the seed tables collect (``selections``), its
comparisons' columns among the report's (``recipes``): checked on import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from meshbayes.experiments import recipes, selections, tables
from meshbayes.metrics import bootstrap
from meshbayes.metrics import measures as registry
from meshbayes.metrics.seed_intervals import paired_t_interval


@dataclasses.dataclass(frozen=True)
class Claim:
  """A question the experiment answers, by the figures that answer it."""

  name: str
  figures: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Comparison:
  """A column set against the control that would explain its effect away."""

  column: str
  control: str
  question: str


CLAIMS = (
    Claim("translation", ("bleu", "token_nll")),
    Claim("token calibration", ("token_ece", "decoded_token_ece")),
    Claim("sequence calibration", ("sequence_ece", "fraction_ece",
                                   "equivalence_chrf80_sequence_ece")),
    Claim("error detection", ("prr_negative_log_probability",)),
    # By the beam-level total uncertainty (Malinin and Gales's measure over the beam, which
    # every predictive has), then the token-level one.
    Claim("OOD (Spanish inputs)", ("ood/spanish/beam_total_uncertainty", "ood/spanish")),
)

# Columns are the report's titles (``meshbayes.experiments.recipes``' columns).
COMPARISONS = (
    Comparison("Bayesian layers", "deterministic",
               "the Bayesian layers (KL weight 0.1, model average) against the deterministic "
               "model"),
    Comparison("Bayesian layers, temperature-scaled", "temperature-scaled",
               "the same, each temperature-scaled"),
    Comparison("Bayesian layers", "temperature-scaled",
               "the Bayesian layers' own calibration against temperature scaling"),
    Comparison("MAP", "deterministic",
               "MAP under the Bayesian layers' prior and KL weight 0.1 (their penalty, no noise)"),
    Comparison("Bayesian layers (mean)", "MAP",
               "does the weight noise add to MAP's penalty (KL weight 0.1, posterior mean)"),
    Comparison("Bayesian layers", "MAP",
               "does the posterior's average add to MAP (KL weight 0.1, model average)"),
    Comparison("Bayesian layers", "Bayesian layers (mean)",
               "does averaging over the posterior add to its mean (KL weight 0.1; the same "
               "runs)"),
    Comparison("Bayesian layers, KL 1", "deterministic",
               "the ELBO's own posterior (KL weight 1, model average)"),
    Comparison("Bayesian layers, KL 0.3", "deterministic",
               "KL weight 0.3, model average"),
    Comparison("IVON", "deterministic", "IVON's posterior (model average)"),
)


def _figure_label(name: str) -> str:
  return name if name.startswith("ood/") else registry.get(name).label


def _higher_is_better(name: str) -> bool | None:
  return True if name.startswith("ood/") else registry.higher_is_better(name)


def _fewest_positives(values: Mapping[str, Mapping[str, Mapping[int, float]]],
                      titles: Sequence[str], name: str) -> float | None:
  """The fewest positive labels figure ``name`` rests on in any seed of ``titles``."""
  count = registry.positives_figure(name)
  found = [v for t in titles for v in values.get(t, {}).get(count or "", {}).values()]
  return min(found) if count and found else None


def figure_verdict(values: Mapping[str, Mapping[str, Mapping[int, float]]],
                   comparison: Comparison, name: str,
                   level: float = bootstrap.DEFAULT_LEVEL) -> dict[str, Any] | None:
  """One figure's paired difference over seeds (column minus control) and its verdict:
  ``better``, ``worse``, ``within noise`` or ``underpowered``; None without two shared
  seeds."""
  a = values.get(comparison.column, {}).get(name, {})
  b = values.get(comparison.control, {}).get(name, {})
  if len(set(a) & set(b)) < 2:
    return None
  difference = paired_t_interval(a, b, level)
  result = {"figure": name, "difference": difference.as_dict()}
  fewest = _fewest_positives(values, (comparison.column, comparison.control), name)
  direction = _higher_is_better(name)
  if fewest is not None and fewest < registry.MIN_POSITIVES:
    result.update(verdict="underpowered", positives=fewest)
  elif direction is not None:
    result["verdict"] = bootstrap.verdict(difference.interval(), direction)
  return result


def claim_verdict(figures: Sequence[dict[str, Any]]) -> str:
  """``helps``, ``hurts``, ``mixed``, ``cannot tell`` or ``underpowered`` from the
  figures' verdicts."""
  verdicts = {f.get("verdict") for f in figures}
  if "better" in verdicts and "worse" in verdicts:
    return "mixed"
  if "better" in verdicts or "worse" in verdicts:
    return "helps" if "better" in verdicts else "hurts"
  return "underpowered" if verdicts == {"underpowered"} else "cannot tell"


def verdict_table(values: Mapping[str, Mapping[str, Mapping[int, float]]],
                  comparisons: Sequence[Comparison] = COMPARISONS,
                  claims: Sequence[Claim] = CLAIMS,
                  level: float = bootstrap.DEFAULT_LEVEL) -> tuple[str, dict[str, Any]]:
  """``(markdown, summary)``: a row per comparison with seeds on both sides, a column per
  claim, each cell the claim's verdict and its figures' paired differences over seeds
  (``values``: ``tables.seed_values``)."""
  lines = [f"| comparison (column minus control; paired t {level:.0%} interval over seeds) | "
           + " | ".join(c.name for c in claims) + " |", "|---" * (len(claims) + 1) + "|"]
  summary: dict[str, Any] = {}
  for comparison in comparisons:
    cells, found = [], {}
    for claim in claims:
      figures = [f for name in claim.figures
                 if (f := figure_verdict(values, comparison, name, level)) is not None]
      if not figures:
        cells.append("-")
        continue
      verdict = claim_verdict(figures)
      found[claim.name] = {"verdict": verdict, "figures": figures}
      cells.append(f"**{verdict}**: " + "; ".join(_figure_text(f) for f in figures))
    if found:
      key = f"{comparison.column} vs {comparison.control}"
      summary[key] = {"question": comparison.question, "claims": found}
      lines.append(f"| {comparison.column} vs {comparison.control}: {comparison.question} | "
                   + " | ".join(cells) + " |")
  return ("\n".join(lines) if summary else ""), summary


def _figure_text(figure: dict[str, Any]) -> str:
  name, difference = figure["figure"], figure["difference"]
  scale, spec = ((1.0, ".3f") if name.startswith("ood/") else
                 (registry.get(name).scale, registry.get(name).format_spec))
  value = lambda x: format(x * scale, "+" + spec)
  text = (f"{_figure_label(name)} {value(difference['estimate'])} "
          f"[{value(difference['low'])}, {value(difference['high'])}]")
  if figure.get("verdict") == "underpowered":
    return text + f" underpowered ({figure['positives']:.0f} positives)"
  return text + (f" {figure['verdict']}" if "verdict" in figure else "")


def check() -> None:
  """Every claim's figure one the seed tables collect (a headline figure, or an OOD AUROC
  by a measure every model has) and every comparison's columns report columns.

  Raises:
    ValueError: one line naming the bad figure or column.
  """
  headline, seed_ood = selections.headline_figures(), selections.seed_ood_measures()
  for claim in CLAIMS:
    for name in claim.figures:
      if not (name in headline or name.startswith("ood/")
              and tables.parse_ood_figure(name)[1] in seed_ood):
        raise ValueError(f"CLAIMS: {claim.name!r}'s figure {name!r} is not a headline figure "
                         f"or an OOD AUROC by one of {', '.join(seed_ood)}")
  titles = {title for name in recipes.names() for _, title in recipes.get(name).columns}
  for comparison in COMPARISONS:
    for title in (comparison.column, comparison.control):
      if title not in titles:
        raise ValueError(f"COMPARISONS: {title!r} is not a report column; valid: "
                         f"{', '.join(sorted(titles))}")


check()  # a claim the seed tables cannot answer fails on import
