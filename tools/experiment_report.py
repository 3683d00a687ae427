"""The report of an uncertainty experiment again, from its runs' and evaluations' records.

  python -m meshbayes.tools.experiment_report runs/experiment   # rewrite the report alone

Writes ``OUT/report.md``, ``OUT/report.json`` and ``OUT/figures/*.png`` (with the pool's
evaluations when the experiment has a pool): the command line of
``meshbayes.experiments.report``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from meshbayes.experiments.plan import pool_result_dirs, result_dirs
from meshbayes.experiments.report import read_budget, write


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("out", type=Path, help="the experiment's directory")
  args = parser.parse_args(argv)
  try:
    budget = read_budget(args.out)
  except ValueError as error:
    parser.error(str(error))
  pool = pool_result_dirs(budget, args.out) if budget.pool_split else None
  print(write(args.out, budget, result_dirs(budget, args.out), pool).read_text())
  return 0


if __name__ == "__main__":
  sys.exit(main())
