"""One verdict per claim of "is being Bayesian worth it", from an experiment's evaluations.

  python -m meshbayes.tools.experiment_verdicts runs/experiment [--json=verdicts.json]

Prints the verdict table of the experiment in OUT at its seeds' checkpoint and each
predictive against its band (what its report's "One verdict per claim" and "One predictive
against its band" show; sequence calibration on its pool when it has one) and writes both
as strict JSON (``verdicts``, ``band_verdicts``). The command line of
``meshbayes.experiments.verdicts`` (whose names this module also exports).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from meshbayes.experiments.plan import pool_result_dirs, result_dirs, write_json
from meshbayes.experiments.report import read_budget, seed_band, seed_verdicts
from meshbayes.experiments.verdicts import (CLAIMS, Claim, Comparison,  # noqa: F401
                                            claim_verdict, comparison_verdicts, comparisons,
                                            verdict_table)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("out", type=Path, help="the experiment's directory")
  parser.add_argument("--json", type=Path, help="also write the verdicts here (strict JSON)")
  args = parser.parse_args(argv)
  try:
    budget = read_budget(args.out)
    results = result_dirs(budget, args.out)
    pool = pool_result_dirs(budget, args.out) if budget.pool_split else None
    table, summary = seed_verdicts(results, budget.seed_checkpoint, pool)
    band, band_summary = seed_band(results, budget.seed_checkpoint, pool)
  except (OSError, ValueError) as error:
    parser.error(str(error))
  print(table or f"no verdict: no column of {args.out} has two seeds shared with its control")
  if band:
    print("\n" + band)
  if args.json:
    write_json(args.json, {"verdicts": summary, "band_verdicts": band_summary})
  return 0


if __name__ == "__main__":
  sys.exit(main())
