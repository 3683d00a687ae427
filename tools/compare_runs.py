"""The paper-style table of evaluated runs side by side, and their reliability diagrams.

    python -m meshbayes.tools.compare_runs --task=tatoeba_enfr runs/demo/deterministic runs/demo/bayesian \
        [--names=deterministic,Bayesian] [--markdown=table.md] [--plot=reliability.png]

Reads what ``python -m meshbayes.eval`` wrote under ``RUN/eval/<task>/``, or in a
directory given as RUN that holds it (``evaluate.output_dir``). A
Bayesian run gives two columns: its model average (headline) and its
posterior mean. Calibration errors are in percent, as in the paper.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshbayes import metrics

# (row label, getter of the value from (metrics.json, predictive name), format).
ROWS = (
    ("BLEU", lambda m, p: m["decoding"][p]["bleu"], "{:.2f}"),
    ("token ECE (%)", lambda m, p: 100 * m["token_calibration"][p]["ece"], "{:.2f}"),
    ("token weighted ECE (%)", lambda m, p: 100 * m["token_calibration"][p]["weighted_ece"],
     "{:.2f}"),
    ("sequence calibration error (%)",
     lambda m, p: 100 * m["decoding"][p]["sequence_calibration_error"], "{:.2f}"),
    ("sequence calibration error, length-normalized (%)",
     lambda m, p: 100 * m["decoding"][p]["sequence_calibration_error_length_normalized"],
     "{:.2f}"),
    ("token NLL (nats)", lambda m, p: m["token_calibration"][p]["nll"], "{:.3f}"),
    ("token accuracy (%)", lambda m, p: 100 * m["token_calibration"][p]["accuracy"], "{:.2f}"),
    ("Brier", lambda m, p: m["token_calibration"][p]["brier"], "{:.4f}"),
)
# The OOD rows' measures, in this order when present (older evaluations said "entropy").
OOD_SCORES = ("mutual_information", "reverse_mutual_information", "expected_pairwise_kl",
              "total_uncertainty", "entropy", "data_uncertainty",
              "sequence_reverse_mutual_information", "sequence_total_uncertainty",
              "sequence_data_uncertainty", "bleu_disagreement")


def load(run: Path, task: str) -> tuple[dict[str, Any], dict[str, Any]]:
  """``(metrics.json, reliability.json)`` of a run's evaluation on ``task`` (``run`` is the
  run's directory or the evaluation's own)."""
  directory = run if (run / "metrics.json").is_file() else run / "eval" / task
  try:
    return (json.loads((directory / "metrics.json").read_text()),
            json.loads((directory / "reliability.json").read_text()))
  except FileNotFoundError:
    raise ValueError(f"{directory} has no evaluation; run python -m meshbayes.eval on "
                     f"{run} first") from None


def columns(runs: Sequence[Path], names: Sequence[str], task: str
            ) -> list[tuple[str, dict[str, Any], str, dict[str, Any]]]:
  """``(column title, metrics, predictive, reliability bins)`` per column."""
  result = []
  for run, name in zip(runs, names):
    run_metrics, reliability = load(run, task)
    for predictive in run_metrics["predictives"]:
      title = name if len(run_metrics["predictives"]) == 1 else f"{name} ({_label(predictive, run_metrics)})"
      result.append((title, run_metrics, predictive, reliability[predictive]))
  return result


def _label(predictive: str, run_metrics: dict[str, Any]) -> str:
  """``model average, S=4``, ``posterior mean``, ``... , temperature-scaled T=1.23``."""
  base = predictive.removesuffix("_temperature_scaled")
  label = (f"model average, S={run_metrics['num_samples']}" if base == "model_average"
           else base.replace("_", " "))
  if base != predictive:
    label += f", temperature-scaled T={run_metrics['temperature_scaling']['temperature']:.2f}"
  return label


def _cell(getter, run_metrics, predictive, fmt) -> str:
  try:
    return fmt.format(getter(run_metrics, predictive))
  except KeyError:
    return "-"


def table(cols) -> str:
  """The markdown table: one row per metric, one column per run and predictive."""
  header = "| metric | " + " | ".join(title for title, *_ in cols) + " |"
  lines = [header, "|---" * (len(cols) + 1) + "|"]
  for label, getter, fmt in ROWS:
    lines.append(f"| {label} | " + " | ".join(_cell(getter, m, p, fmt) for _, m, p, _ in cols)
                 + " |")
  ood_sets = sorted({name for _, m, _, _ in cols for name in m.get("ood", {})})
  for ood_set in ood_sets:  # measured with each run's headline predictive
    entries = [m.get("ood", {}).get(ood_set, {}) if p == m["predictives"][0] else {}
               for _, m, p, _ in cols]
    for score in (s for s in OOD_SCORES if any(f"auroc_{s}" in e for e in entries)):
      cells = [f"{e[f'auroc_{score}']:.3f}" + (f" / {100 * e[f'fpr95_{score}']:.1f}"
                                                if f"fpr95_{score}" in e else "")
               if f"auroc_{score}" in e else "-" for e in entries]
      lines.append(f"| OOD {ood_set}: AUROC / FPR@95 (%) by {score.replace('_', ' ')} | "
                   + " | ".join(cells) + " |")
  steps = " | ".join(str(m["step"]) for _, m, _, _ in cols)
  lines.append(f"| training steps | {steps} |")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("runs", nargs="+", type=Path, help="model directories")
  parser.add_argument("--task", required=True, help="the evaluated task")
  parser.add_argument("--names", help="comma-separated column names (default: directory names)")
  parser.add_argument("--markdown", type=Path, help="also write the table here")
  parser.add_argument("--plot", type=Path, help="write the joint reliability diagrams here")
  args = parser.parse_args(argv)
  names = args.names.split(",") if args.names else [run.name for run in args.runs]
  if len(names) != len(args.runs):
    print(f"--names has {len(names)} names for {len(args.runs)} runs", file=sys.stderr)
    return 2
  try:
    cols = columns(args.runs, names, args.task)
  except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  text = table(cols)
  print(text)
  if args.markdown:
    args.markdown.write_text(text + "\n")
  if args.plot:
    as_arrays = lambda bins: {k: np.array([np.nan if x is None else x for x in v])
                              for k, v in bins.items()}
    metrics.plot_token_and_sequence_reliability(
        {title: {level: as_arrays(bins) for level, bins in reliability.items()}
         for title, _, _, reliability in cols}, args.plot, title=args.task)
    print(f"reliability diagrams: {args.plot}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
