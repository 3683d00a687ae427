"""The paper-style table of evaluated runs side by side (the command:
``python -m meshbayes.tools.compare_runs``).

Reads what ``python -m meshbayes.eval`` wrote under ``RUN/eval/<task>/``, or in a
directory given as RUN that holds it (``evaluation.ReportConfig.output_dir``). A
Bayesian run gives two columns: its model average (headline) and its
posterior mean. Each cell is the figure and its 95% bootstrap interval over the
test sources, ``estimate [low, high]``; calibration errors in percent. The rows, their
labels and formats are the registry's (``meshbayes.metrics.measures``), which rows it
shows ``meshbayes.experiments.selections``'.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshbayes.evaluation import manifest
from meshbayes.experiments import selections
from meshbayes.metrics import bootstrap
from meshbayes.metrics import measures as registry
from meshbayes.runtime import strict_json


@dataclasses.dataclass(frozen=True)
class Column:
  """One column of the table: a predictive of one evaluation.

  Attributes:
    title: the column's title.
    metrics: the evaluation's ``metrics.json``.
    predictive: which of its predictives.
    reliability: that predictive's reliability bins (``reliability.json``).
    directory: the evaluation's directory (its per-source items).
  """

  title: str
  metrics: dict[str, Any]
  predictive: str
  reliability: dict[str, Any]
  directory: Path

  @property
  def is_headline(self) -> bool:
    """Whether this is the evaluation's headline predictive (the one OOD is measured with)."""
    return self.predictive == self.metrics["predictives"][0]


def interval_text(interval: dict[str, float | None] | None, scale: float = 1.0,
                  spec: str = ".3f") -> str:
  """``estimate [low, high]`` of an interval stored in JSON, or ``-`` when there is none or
  its estimate is undefined (null or NaN: an AUROC of outputs that all fail)."""
  if not interval or interval["estimate"] is None or math.isnan(interval["estimate"]):
    return "-"
  return bootstrap.Interval(**{k: math.nan if v is None else v
                               for k, v in interval.items()}).format(spec, scale)


def load(run: Path, task: str) -> tuple[dict[str, Any], dict[str, Any]]:
  """``(metrics.json, reliability.json)`` of a run's evaluation on ``task`` (``run`` is the
  run's directory or the evaluation's own)."""
  directory = evaluation_dir(run, task)
  found = [manifest.read_checked(directory, name, what) for name, what in (
      ("metrics.json", "the metrics"), ("reliability.json", "the reliability diagrams"))]
  if None in found:
    raise ValueError(f"{directory} has no evaluation; run python -m meshbayes.eval on "
                     f"{run} first")
  return strict_json.restore(json.loads(found[0])), json.loads(found[1])


def evaluation_dir(run: Path, task: str) -> Path:
  """The directory of a run's evaluation on ``task`` (or ``run`` itself when it is one)."""
  return run if (run / "metrics.json").is_file() else run / "eval" / task


def columns(runs: Sequence[Path], names: Sequence[str], task: str) -> list[Column]:
  """A column per predictive of each run's evaluation."""
  result = []
  for run, name in zip(runs, names):
    run_metrics, reliability = load(run, task)
    for predictive in run_metrics["predictives"]:
      title = name if len(run_metrics["predictives"]) == 1 else f"{name} ({_label(predictive, run_metrics)})"
      result.append(Column(title, run_metrics, predictive, reliability[predictive],
                           evaluation_dir(run, task)))
  return result


def _label(predictive: str, run_metrics: dict[str, Any]) -> str:
  """``model average, S=4``, ``posterior mean``, ``... , temperature-scaled T=1.23``."""
  base = predictive.removesuffix("_temperature_scaled")
  label = (f"model average, S={run_metrics['num_samples']}" if base == "model_average"
           else base.replace("_", " "))
  if base != predictive:
    label += f", temperature-scaled T={temperature(run_metrics, predictive):.2f}"
  return label


def temperature(run_metrics: dict[str, Any], predictive: str) -> float:
  """The temperature of a temperature-scaled predictive (an evaluation from before
  ``temperature_fits`` scaled only its headline: ``temperature_scaling``)."""
  fit = run_metrics.get("temperature_fits", {}).get(predictive,
                                                    run_metrics["temperature_scaling"])
  return fit["temperature"]


def reliability_arrays(reliability: dict[str, dict[str, list[float | None]]]
                       ) -> dict[str, dict[str, np.ndarray]]:
  """Stored reliability bins (empty bins as null) as arrays, per level."""
  return {level: {k: np.array([np.nan if x is None else x for x in v]) for k, v in bins.items()}
          for level, bins in reliability.items()}


def table(cols: Sequence[Column]) -> str:
  """The markdown table: one row per figure, one column per run and predictive."""
  header = "| metric | " + " | ".join(col.title for col in cols) + " |"
  lines = [header, "|---" * (len(cols) + 1) + "|"]
  for figure in map(registry.get, selections.run_table_figures()):
    cells = [interval_text(col.metrics.get("intervals", {}).get(col.predictive, {}).get(
        figure.name), figure.scale, figure.format_spec) for col in cols]
    if any(cell != "-" for cell in cells):
      lines.append(f"| {figure.label} | " + " | ".join(cells) + " |")
  ood_sets = sorted({name for col in cols for name in col.metrics.get("ood_intervals", {})})
  for ood_set in ood_sets:  # measured with each run's headline predictive
    entries = [col.metrics.get("ood_intervals", {}).get(ood_set, {}) if col.is_headline else {}
               for col in cols]
    for score in selections.ood_table_measures():
      auroc = registry.get(registry.family_name(registry.AUROC, score))
      fpr = registry.get(registry.family_name(registry.FPR95, score))
      if not any(auroc.name in e for e in entries):
        continue
      cells = [interval_text(e[auroc.name], auroc.scale, auroc.format_spec) + (
          f" / {fpr.scale * e[fpr.name]['estimate']:{fpr.format_spec}}" if fpr.name in e else "")
               if auroc.name in e else "-" for e in entries]
      lines.append(f"| OOD {ood_set}: AUROC / FPR@95 (%) by {score.replace('_', ' ')} | "
                   + " | ".join(cells) + " |")
  lines.append("| test sources (pairs) | " + " | ".join(
      f"{col.metrics.get('num_sources', '-')} ({col.metrics.get('num_pairs', '-')})"
      for col in cols) + " |")
  steps = " | ".join(str(col.metrics["step"]) for col in cols)
  lines.append(f"| training steps | {steps} |")
  return "\n".join(lines)
