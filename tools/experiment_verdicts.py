"""One verdict per claim of "is being Bayesian worth it", from an experiment's evaluations.

  python -m meshbayes.tools.experiment_verdicts runs/experiment [--json=verdicts.json]

Prints the verdict table of the experiment in OUT at its seeds' checkpoint (what its
report's "One verdict per claim" shows) and writes its summary as strict JSON. The command
line of ``meshbayes.experiments.verdicts`` (whose names this module also exports).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from meshbayes.experiments.plan import result_dirs, write_json
from meshbayes.experiments.report import read_budget, seed_verdicts
from meshbayes.experiments.verdicts import (CLAIMS, COMPARISONS, Claim,  # noqa: F401
                                            Comparison, claim_verdict, figure_verdict,
                                            verdict_table)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("out", type=Path, help="the experiment's directory")
  parser.add_argument("--json", type=Path, help="also write the verdicts here (strict JSON)")
  args = parser.parse_args(argv)
  try:
    budget = read_budget(args.out)
    table, summary = seed_verdicts(result_dirs(budget, args.out), budget.seed_checkpoint)
  except (OSError, ValueError) as error:
    parser.error(str(error))
  print(table or f"no verdict: no column of {args.out} has two seeds shared with its control")
  if args.json:
    write_json(args.json, summary)
  return 0


if __name__ == "__main__":
  sys.exit(main())
