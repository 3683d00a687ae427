"""The experiment report's comparisons, each figure with its interval: paired differences
against the deterministic model, error detection, OOD detection by measures fixed in
advance and by a measure chosen on held-out inputs, and the spread over training seeds
with Student-t intervals and seed-level tests against the deterministic model.

Every table function takes ``compare.Column``s (an evaluation's predictive and its
directory) or, over seeds, ``seed_values``' figures of each seed, and returns
``(markdown, summary)``, the summary for ``report.json``. The bootstrap's resamples are
over test sources (and over OOD inputs), ``num_resamples`` of them with a fixed seed, the
same for both sides of a paired difference (``meshbayes.evaluation.items``). Labels,
formats and directions are the registry's (``meshbayes.metrics.measures``), the figures
and measures each table shows ``meshbayes.experiments.selections``'.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshbayes import metrics
from meshbayes.evaluation import items as evaluation_items
from meshbayes.experiments import compare, selections
from meshbayes.metrics import bootstrap
from meshbayes.metrics import measures as registry
# Re-exported: the tables' seed intervals (tests and callers read them here).
from meshbayes.metrics.seed_intervals import (SeedInterval, paired_t_interval,  # noqa: F401
                                              t_interval, welch_interval)

Column = compare.Column
BASELINE = "deterministic"  # the column every paired difference is taken against,
SCALED_BASELINE = "temperature-scaled"  # but a temperature-scaled column's: this one


def group_title(title: str) -> str:
  """A column's title without its fitted temperature (``... (T=1.10)``)."""
  return title.split(" (T=")[0]


def baseline_of(title: str) -> str:
  """The column a column is compared with: the temperature-scaled deterministic model for a
  temperature-scaled posterior, else the deterministic model."""
  title = group_title(title)
  return (SCALED_BASELINE if title.endswith(SCALED_BASELINE) and title != SCALED_BASELINE
          else BASELINE)


def _signed(interval: bootstrap.Interval, scale: float, spec: str) -> str:
  value = lambda x: format(x * scale, "+" + spec)
  return f"{value(interval.estimate)} [{value(interval.low)}, {value(interval.high)}]"


def _header(first: str, titles: Sequence[str]) -> list[str]:
  return [f"| {first} | " + " | ".join(titles) + " |", "|---" * (len(titles) + 1) + "|"]


def _verdict(name: str, difference: bootstrap.Interval, cols: Sequence[Column] = ()) -> str:
  """The verdict of a paired difference; "underpowered" for a sequence calibration figure
  of fewer than ``registry.MIN_POSITIVES`` positive labels in one of ``cols``."""
  positives = [_positives(c, name) for c in cols]
  if any(count is not None and count < registry.MIN_POSITIVES for count in positives):
    return f" underpowered ({' vs '.join(f'{count:.0f}' for count in positives)} positives)"
  direction = registry.higher_is_better(name)
  return "" if direction is None else f" {bootstrap.verdict(difference, direction)}"


def _positives(col: Column, name: str) -> float | None:
  """How many positive labels ``col``'s figure ``name`` rests on (None: not counted)."""
  count = registry.positives_figure(name)
  interval = col.metrics.get("intervals", {}).get(col.predictive, {}).get(count or "")
  return None if interval is None else interval["estimate"]


def _auroc(measure: str) -> registry.Measure:
  """The registry's entry of the OOD AUROC by ``measure``."""
  return registry.get(registry.family_name(registry.AUROC, measure))


def ood_figure(ood_set: str, measure: str = "total_uncertainty") -> str:
  """The seed tables' name of an OOD set's AUROC by ``measure``: ``ood/<set>`` (total
  uncertainty) or ``ood/<set>/<measure>``."""
  return f"ood/{ood_set}" if measure == "total_uncertainty" else f"ood/{ood_set}/{measure}"


def parse_ood_figure(name: str) -> tuple[str, str]:
  """``(set, measure)`` of an ``ood_figure`` name."""
  _, ood_set, *measure = name.split("/")
  return ood_set, (measure[0] if measure else "total_uncertainty")


def _read_items(col: Column) -> evaluation_items.SourceItems:
  """``col``'s items, refused unless of the step and method of its ``metrics.json``."""
  return evaluation_items.read_items(col.directory, col.predictive,
                                     step=col.metrics.get("step"),
                                     method=col.metrics.get("method"))


def _read_ood_scores(col: Column) -> evaluation_items.OodScores | None:
  """``col``'s OOD scores (None: none), checked as ``_read_items``' items are."""
  return evaluation_items.read_ood_scores(col.directory, step=col.metrics.get("step"),
                                          method=col.metrics.get("method"))


def paired_table(cols: Sequence[Column], num_resamples: int = bootstrap.DEFAULT_RESAMPLES
                 ) -> tuple[str, dict[str, Any]]:
  """Each column's headline figures minus the deterministic model's on the same resampled
  sources, with the interval and its verdict (better, worse, within noise); and, per OOD
  set, each column's AUROC by each of the OOD measures fixed in advance
  (``selections.ood_measures``) it has minus the deterministic
  model's by total uncertainty."""
  by_title = {group_title(c.title): c for c in cols}
  baseline = by_title.get(BASELINE)
  bases = {c.title: by_title.get(baseline_of(c.title), baseline) for c in cols}
  others = [c for c in cols if c is not baseline]
  if baseline is None or not others:
    return "", {}
  items = {c.title: _read_items(c) for c in cols}
  differences = {c.title: evaluation_items.paired_differences(
      items[c.title], items[bases[c.title].title], num_resamples) for c in others}
  lines = _header(f"minus {BASELINE} (a temperature-scaled posterior: minus the "
                  "temperature-scaled deterministic model): difference [95% interval]",
                  [c.title for c in others])
  for figure in map(registry.get, selections.headline_figures()):
    name = figure.name
    cells = [f"{_signed(d[name], figure.scale, figure.format_spec)}"
             f"{_verdict(name, d[name], (c, bases[c.title]))}"
             if name in d and np.isfinite(d[name].estimate) else "-"
             for c, d in zip(others, differences.values())]
    lines.append(f"| {figure.label} | " + " | ".join(cells) + " |")
  summary = {title: evaluation_items.as_json(d) for title, d in differences.items()}
  base_ood = _read_ood_scores(baseline)
  ood = {c.title: evaluation_items.ood_paired_differences(
      scores, base_ood, {m: (m, "total_uncertainty") for m in selections.ood_measures()},
      num_resamples)
         for c in others if c.is_headline
         and (scores := _read_ood_scores(c)) is not None}
  if base_ood is not None:
    for ood_set in sorted(base_ood.out_of_domain):
      for measure in selections.ood_measures():
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
  for measure in selections.error_detection_measures():
    prr = registry.get(registry.family_name(registry.PRR, measure))
    cells = [compare.interval_text(c.metrics["intervals"][c.predictive].get(prr.name),
                                        prr.scale, prr.format_spec) for c in decoded]
    if any(cell != "-" for cell in cells):
      lines.append(f"| {measure.replace('_', ' ')} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def ood_table(cols: Sequence[Column], num_resamples: int = bootstrap.DEFAULT_RESAMPLES
              ) -> tuple[str, dict[str, Any]]:
  """Per OOD set, each headline column's AUROC by the measures fixed in advance, and the
  measure chosen on half of the inputs with its AUROC on the other half."""
  scored = [(c, scores) for c in cols if c.is_headline
            and (scores := _read_ood_scores(c)) is not None]
  if not scored:
    return "", {}
  lines = _header("OOD set: AUROC [95% interval] by", [c.title for c, _ in scored])
  summary: dict[str, Any] = {}
  for ood_set in sorted({s for _, scores in scored for s in scores.out_of_domain}):
    for measure in selections.ood_measures():
      auroc = _auroc(measure)
      cells = [compare.interval_text(c.metrics["ood_intervals"].get(ood_set, {}).get(
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


def _figures(names: Sequence[str]) -> list[tuple[str, str, float, str]]:
  """``(label, name, scale, format)`` of the headline figures and the OOD AUROCs
  (``ood_figure``) among ``names``, in report order."""
  oods = [(name, *parse_ood_figure(name)) for name in sorted(names) if name.startswith("ood/")]
  return [(f.label, f.name, f.scale, f.format_spec)
          for f in map(registry.get, selections.headline_figures()) if f.name in names] + [
      (f"OOD {ood_set}: AUROC by {registry.get(measure).label}", name, _auroc(measure).scale,
       _auroc(measure).format_spec) for name, ood_set, measure in oods]


def seed_values(groups: Mapping[str, Mapping[int, Path]], predictives: Mapping[str, str]
                ) -> dict[str, dict[str, dict[int, float]]]:
  """``{title: {figure: {seed: value}}}``: each seed's headline figures, the counts of
  positive labels they rest on, what the one-predictive verdicts read
  (``selections.band_figures``) (and, for an evaluation's headline predictive, its OOD
  AUROCs by ``selections.seed_ood_measures``, as ``ood_figure`` names)
  read from ``groups`` (title -> ``{seed: evaluation directory}``), of the predictive
  ``predictives[title]``; undefined figures (null, NaN) are left out."""
  values: dict[str, dict[str, dict[int, float]]] = {}
  for title, directories in groups.items():
    found = values.setdefault(title, {})
    for seed, directory in sorted(directories.items()):
      run_metrics, _ = compare.load(directory, "")
      predictive = predictives[title]
      if predictive not in run_metrics["predictives"]:
        continue
      figures = run_metrics["intervals"][predictive]
      headline = selections.headline_figures()
      counts = {registry.positives_figure(name) for name in headline} - {None}
      band = [name for name in selections.band_figures() if name not in headline]
      for name in (*headline, *sorted(counts), *band):
        value = figures.get(name, {}).get("estimate")
        if value is not None and np.isfinite(value):
          found.setdefault(name, {})[seed] = float(value)
      if predictive == run_metrics["predictives"][0]:  # OOD is scored by the headline
        for ood_set, entry in run_metrics.get("ood", {}).items():
          for measure in selections.seed_ood_measures():
            auroc = entry.get(_auroc(measure).name)
            if auroc is not None and np.isfinite(auroc):
              found.setdefault(ood_figure(ood_set, measure), {})[seed] = float(auroc)
  return values


def _seed_zero(col: Column, name: str) -> dict[str, float] | None:
  """A column's own figure ``name`` with its bootstrap interval over test sources."""
  if name.startswith("ood/"):
    if not col.is_headline:
      return None
    ood_set, measure = parse_ood_figure(name)
    return col.metrics.get("ood_intervals", {}).get(ood_set, {}).get(_auroc(measure).name)
  return col.metrics["intervals"][col.predictive].get(name)


def _seed_count(figures: Mapping[str, Mapping[int, float]]) -> int:
  return len({seed for by_seed in figures.values() for seed in by_seed})


def seed_table(cols: Sequence[Column], values: Mapping[str, Mapping[str, Mapping[int, float]]],
               level: float = bootstrap.DEFAULT_LEVEL) -> tuple[str, dict[str, Any]]:
  """Per column (``cols``: the final checkpoint's), each headline figure of seed 0's run
  with its bootstrap interval over test sources, and beside it the mean over the column's
  training seeds (``values``: ``seed_values``) with a Student-t interval, seeds - 1 df. A
  column with one seed (the deep ensemble mixes all of them; MC dropout, temperature
  scaling and the Laplace approximation are of seed 0's run) says it is a single
  realization instead."""
  names = {n for figures in values.values() for n in figures} | set(
      selections.headline_figures()) | {
          ood_figure(s, m) for c in cols if c.is_headline
          for s, entry in c.metrics.get("ood_intervals", {}).items()
          for m in selections.seed_ood_measures() if _auroc(m).name in entry}
  titles = []
  for c in cols:
    seeds = _seed_count(values.get(group_title(c.title), {}))
    titles.append(f"{c.title} ({seeds} seeds; t, {seeds - 1} df)" if seeds >= 2
                  else f"{c.title} (single realization)")
  lines = _header(f"seed 0: bootstrap {level:.0%} interval over test sources; mean of seeds: "
                  f"Student-t {level:.0%} interval", titles)
  summary: dict[str, Any] = {}
  for label, name, scale, spec in _figures(sorted(names)):
    own, spread = [], []
    for c in cols:
      by_seed = values.get(group_title(c.title), {}).get(name, {})
      seed_zero = _seed_zero(c, name)
      own.append(compare.interval_text(seed_zero, scale, spec))
      entry = summary.setdefault(c.title, {}).setdefault(name, {"seed_0": seed_zero})
      if len(by_seed) >= 2:
        mean = t_interval(list(by_seed.values()), level)
        spread.append(mean.interval().format(spec, scale))
        entry.update(seeds={str(k): v for k, v in by_seed.items()}, mean=mean.as_dict())
      else:
        spread.append("single realization" if _seed_count(values.get(group_title(c.title),
                                                                      {})) < 2
                      else "-")
    if any(cell != "-" for cell in own + spread):
      lines.append(f"| {label}, seed 0 | " + " | ".join(own) + " |")
      lines.append(f"| {label}, mean of seeds | " + " | ".join(spread) + " |")
  return "\n".join(lines), summary


def seed_difference_table(values: Mapping[str, Mapping[str, Mapping[int, float]]],
                          level: float = bootstrap.DEFAULT_LEVEL
                          ) -> tuple[str, dict[str, Any]]:
  """Each column with several seeds minus the deterministic model (``values``:
  ``seed_values``; its seeds are the deep ensemble's members), per headline figure: the
  difference of the means over seeds with Welch's t interval (Welch-Satterthwaite df) and
  with the paired t interval over the seed numbers both have, each with a two-sided p-value.

  Pairing by seed number is a real pairing here: SEED sets every recipe's training-data
  order (``data.TaskData.seed``, ``translation.shuffled_epochs``; every recipe has
  ``uncertainty/base.gin``'s batch size) and its initialization and noise keys
  (``train.seed``), so seed k of two methods were trained on the same batches in the same
  order; the paired interval takes out what that order does to both. Welch's assumes
  nothing of the pairing and uses every seed of each side.
  """
  others = [t for t, figures in values.items() if t != BASELINE and _seed_count(figures) >= 2
            and _seed_count(values.get(baseline_of(t), {})) >= 2]
  if not others:
    return "", {}
  lines = _header(f"mean over seeds minus {BASELINE}'s (a temperature-scaled posterior: "
                  f"minus the temperature-scaled deterministic model's): difference "
                  f"[{level:.0%} interval]", others)
  summary: dict[str, Any] = {}
  for label, name, scale, spec in _figures(sorted({n for t in others for n in values[t]})):
    welch, paired = [], []
    # Which way is better: the registry's, the AUROC's for an OOD set.
    measure = _auroc("total_uncertainty").name if name.startswith("ood/") else name
    for title in others:
      a, b = values[title].get(name, {}), values[baseline_of(title)].get(name, {})
      if len(a) < 2 or len(b) < 2:
        welch.append("-")
        paired.append("-")
        continue
      entry = summary.setdefault(title, {}).setdefault(name, {})
      test = welch_interval(list(a.values()), list(b.values()), level)
      entry["welch"] = test.as_dict()
      welch.append(f"{_signed(test.interval(), scale, spec)}{_verdict(measure, test.interval())}"
                   f" ({test.seed_counts[0]} vs {test.seed_counts[1]} seeds, df "
                   f"{_number(test.df, '.1f')}, p={_number(test.p_value, '.2g')})")
      if len(set(a) & set(b)) >= 2:
        test = paired_t_interval(a, b, level)
        entry["paired"] = test.as_dict()
        paired.append(f"{_signed(test.interval(), scale, spec)}"
                      f"{_verdict(measure, test.interval())} ({test.seed_counts[0]} seeds, df "
                      f"{test.df:.0f}, p={_number(test.p_value, '.2g')})")
      else:
        paired.append("-")
    if any(cell != "-" for cell in welch):
      lines.append(f"| {label}, Welch | " + " | ".join(welch) + " |")
      lines.append(f"| {label}, paired by seed | " + " | ".join(paired) + " |")
  return "\n".join(lines), summary


def _number(value: float, spec: str) -> str:
  """``value`` formatted, or ``-`` where it is NaN (no spread over seeds: no test)."""
  return "-" if math.isnan(value) else format(value, spec)


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
    items = _read_items(col)
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
