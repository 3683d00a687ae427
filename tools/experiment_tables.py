"""The experiment report's comparisons, each figure with its interval: paired differences
against the deterministic model, error detection, OOD detection by measures fixed in
advance and by a measure chosen on held-out inputs, and the spread over seeds.

Every function takes ``compare_runs.Column``s (an evaluation's predictive and its
directory) and returns ``(markdown, summary)``, the summary for ``report.json``. The
bootstrap's resamples are over test sources (and over OOD inputs), ``num_resamples`` of
them with a fixed seed, the same for both sides of a paired difference
(``meshbayes.evaluation.items``). Labels, formats and directions are the registry's
(``meshbayes.metrics.measures``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshbayes import metrics
from meshbayes.evaluation import items as evaluation_items
from meshbayes.metrics import bootstrap
from meshbayes.metrics import measures as registry
from meshbayes.tools import compare_runs

Column = compare_runs.Column
# OOD measures fixed before looking at any result: predictive entropy (every model has it)
# and, for a posterior, mutual information (its samples' disagreement).
OOD_MEASURES = ("total_uncertainty", "mutual_information")
BASELINE = "deterministic"  # the column every paired difference is taken against


def _signed(interval: bootstrap.Interval, scale: float, spec: str) -> str:
  value = lambda x: format(x * scale, "+" + spec)
  return f"{value(interval.estimate)} [{value(interval.low)}, {value(interval.high)}]"


def _header(first: str, titles: Sequence[str]) -> list[str]:
  return [f"| {first} | " + " | ".join(titles) + " |", "|---" * (len(titles) + 1) + "|"]


def _verdict(name: str, difference: bootstrap.Interval) -> str:
  direction = registry.higher_is_better(name)
  return "" if direction is None else f" {bootstrap.verdict(difference, direction)}"


def _auroc(measure: str) -> registry.Measure:
  """The registry's entry of the OOD AUROC by ``measure``."""
  return registry.get(registry.family_name(registry.AUROC, measure))


def paired_table(cols: Sequence[Column], num_resamples: int = bootstrap.DEFAULT_RESAMPLES
                 ) -> tuple[str, dict[str, Any]]:
  """Each column's headline figures minus the deterministic model's on the same resampled
  sources, with the interval and its verdict (better, worse, within noise); and, per OOD
  set, each posterior's AUROC by total uncertainty and by mutual information minus the
  deterministic model's by total uncertainty."""
  baseline = next((c for c in cols if c.title == BASELINE), None)
  others = [c for c in cols if c is not baseline]
  if baseline is None or not others:
    return "", {}
  base_items = evaluation_items.read_items(baseline.directory, baseline.predictive)
  differences = {c.title: evaluation_items.paired_differences(
      evaluation_items.read_items(c.directory, c.predictive), base_items, num_resamples)
                 for c in others}
  lines = _header(f"minus {BASELINE}: difference [95% interval]", [c.title for c in others])
  for figure in map(registry.get, registry.HEADLINE_FIGURES):
    name = figure.name
    cells = [f"{_signed(d[name], figure.scale, figure.format_spec)}{_verdict(name, d[name])}"
             if name in d and np.isfinite(d[name].estimate) else "-"
             for d in differences.values()]
    lines.append(f"| {figure.label} | " + " | ".join(cells) + " |")
  summary = {title: evaluation_items.as_json(d) for title, d in differences.items()}
  base_ood = evaluation_items.read_ood_scores(baseline.directory)
  ood = {c.title: evaluation_items.ood_paired_differences(
      scores, base_ood, {m: (m, "total_uncertainty") for m in OOD_MEASURES}, num_resamples)
         for c in others if c.is_headline
         and (scores := evaluation_items.read_ood_scores(c.directory)) is not None}
  if base_ood is not None:
    for ood_set in sorted(base_ood.out_of_domain):
      for measure in OOD_MEASURES:
        auroc = _auroc(measure)
        cells = [_signed(ood[c.title][ood_set][measure], auroc.scale, auroc.format_spec) + " "
                 + bootstrap.verdict(ood[c.title][ood_set][measure],
                                     registry.higher_is_better(auroc.name))
                 if measure in ood.get(c.title, {}).get(ood_set, {}) else "-" for c in others]
        if any(cell != "-" for cell in cells):
          lines.append(f"| OOD {ood_set}: AUROC by {measure.replace('_', ' ')} minus "
                       f"{BASELINE}'s by total uncertainty | " + " | ".join(cells) + " |")
    summary["ood"] = {title: evaluation_items.as_json(d) for title, d in ood.items()}
  return "\n".join(lines), summary


def error_detection_table(cols: Sequence[Column]) -> str:
  """The prediction rejection ratio of every measure each column has, with intervals."""
  decoded = [c for c in cols if c.predictive in c.metrics.get("decoding", {})]
  lines = _header("error detection: PRR [95% interval] by", [c.title for c in decoded])
  for measure in registry.ERROR_DETECTION_MEASURES:
    prr = registry.get(registry.family_name(registry.PRR, measure))
    cells = [compare_runs.interval_text(c.metrics["intervals"][c.predictive].get(prr.name),
                                        prr.scale, prr.format_spec) for c in decoded]
    if any(cell != "-" for cell in cells):
      lines.append(f"| {measure.replace('_', ' ')} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def ood_table(cols: Sequence[Column], num_resamples: int = bootstrap.DEFAULT_RESAMPLES
              ) -> tuple[str, dict[str, Any]]:
  """Per OOD set, each headline column's AUROC by the measures fixed in advance, and the
  measure chosen on half of the inputs with its AUROC on the other half."""
  scored = [(c, scores) for c in cols if c.is_headline
            and (scores := evaluation_items.read_ood_scores(c.directory)) is not None]
  if not scored:
    return "", {}
  lines = _header("OOD set: AUROC [95% interval] by", [c.title for c, _ in scored])
  summary: dict[str, Any] = {}
  for ood_set in sorted({s for _, scores in scored for s in scores.out_of_domain}):
    for measure in OOD_MEASURES:
      auroc = _auroc(measure)
      cells = [compare_runs.interval_text(c.metrics["ood_intervals"].get(ood_set, {}).get(
          auroc.name), auroc.scale, auroc.format_spec) for c, _ in scored]
      if any(cell != "-" for cell in cells):
        lines.append(f"| {ood_set}: {measure.replace('_', ' ')} | " + " | ".join(cells) + " |")
    chosen = []
    for c, scores in scored:
      best, interval = evaluation_items.measure_chosen_on_half(scores, ood_set,
                                                               num_resamples=num_resamples)
      summary.setdefault(c.title, {})[ood_set] = {"measure": best, **interval.as_dict()}
      chosen.append(f"{interval.format('.3f')} ({best.replace('_', ' ')})")
    lines.append(f"| {ood_set}: the measure chosen on the other half | " + " | ".join(chosen)
                 + " |")
  return "\n".join(lines), summary


def seed_table(groups: Mapping[str, Sequence[Path]], predictives: Mapping[str, str]
               ) -> tuple[str, dict[str, Any]]:
  """Per method (``groups``: title -> its seeds' evaluation directories, ``predictives``:
  title -> the predictive reported), the mean and range over seeds of the headline
  figures and of the OOD AUROCs by total uncertainty."""
  values: dict[str, dict[str, list[float]]] = {}
  auroc = _auroc("total_uncertainty")
  for title, directories in groups.items():
    for directory in directories:
      run_metrics, _ = compare_runs.load(directory, "")
      figures = run_metrics["intervals"][predictives[title]]
      found = values.setdefault(title, {})
      for name in registry.HEADLINE_FIGURES:
        if name in figures and figures[name]["estimate"] is not None and np.isfinite(
            figures[name]["estimate"]):
          found.setdefault(name, []).append(figures[name]["estimate"])
      for ood_set, entry in run_metrics.get("ood", {}).items():
        if auroc.name in entry:
          found.setdefault(f"ood/{ood_set}", []).append(entry[auroc.name])
  titles = list(values)
  lines = _header("mean (lowest to highest) over seeds", [
      f"{t} ({len(groups[t])} seeds)" for t in titles])
  rows = [(f.label, f.name, f.scale, f.format_spec)
          for f in map(registry.get, registry.HEADLINE_FIGURES)] + [
      (f"OOD {name[4:]}: AUROC by total uncertainty", name, auroc.scale, auroc.format_spec)
      for name in sorted({n for v in values.values() for n in v if n.startswith("ood/")})]
  for label, name, scale, spec in rows:
    cells = [f"{np.mean(v) * scale:{spec}} ({min(v) * scale:{spec}} to {max(v) * scale:{spec}})"
             if (v := values[t].get(name)) else "-" for t in titles]
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  return "\n".join(lines), values


def plot_rejection(cols: Sequence[Column], path: Path,
                   measure: str = evaluation_items.NEGATIVE_LOG_PROBABILITY) -> None:
  """Each decoded column's rejection curve by ``measure`` (solid) and its oracle's (dotted),
  as the error removed beyond random rejection: the random order's mean error minus the
  curve's (the PRR is the solid area over the dotted one)."""
  plt = metrics.reliability._pyplot()  # pylint: disable=protected-access
  fig, ax = plt.subplots(figsize=(6, 4.2))
  for col in cols:
    if col.predictive not in col.metrics.get("decoding", {}):
      continue
    items = evaluation_items.read_items(col.directory, col.predictive)
    error = 1.0 - items.sentence_bleu / 100.0
    fractions, curve = metrics.rejection_curve(error, items.error_measures[measure])
    random = error.mean() * (1.0 - fractions)
    line, = ax.plot(fractions, random - curve, label=col.title)
    ax.plot(fractions, random - metrics.rejection_curve(error, error)[1], linestyle=":",
            color=line.get_color())
  ax.set(xlabel="fraction rejected (most uncertain first)",
         ylabel="mean error removed beyond random rejection",
         title=f"rejection by {measure.replace('_', ' ')} (dotted: each one's oracle)")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
