"""The paper-style table of evaluated runs side by side, and their reliability diagrams.

    python -m meshbayes.tools.compare_runs --task=tatoeba_enfr runs/demo/deterministic runs/demo/bayesian \
        [--names=deterministic,Bayesian] [--markdown=table.md] [--plot=reliability.png]

The command line of ``meshbayes.experiments.compare`` (whose names this module also
exports): each cell the figure and its 95% bootstrap interval over the test sources.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from meshbayes import metrics
from meshbayes.experiments.compare import (Column, columns, evaluation_dir,  # noqa: F401
                                           interval_text, load, reliability_arrays, table,
                                           temperature)


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
    metrics.plot_token_and_sequence_reliability(
        {col.title: reliability_arrays(col.reliability) for col in cols}, args.plot,
        title=args.task)
    print(f"reliability diagrams: {args.plot}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
