"""Every uncertainty method side by side on one translation regime (``make experiment``,
``make demo``): trains the runs, evaluates each method at the end of the budget and at
its best validation checkpoint, and writes the tables and figures.

  python -m meshbayes.tools.experiment --preset=sequence_cpu --out=runs/sequence_cpu
  python -m meshbayes.tools.experiment --preset=cpu --out=runs/experiment [--publish=docs/uncertainty]
  python -m meshbayes.tools.experiment --preset=demo --out=runs/demo
  python -m meshbayes.tools.experiment --preset=estimator_quality --out=runs/estimator_quality

Methods, on the same data and architecture for the same number of steps
(``gin_configs/uncertainty/``, where each method's tuned settings are):

- ``deterministic``: the Transformer trained with dropout; evaluated as it is and
  temperature-scaled (one temperature fitted on the validation split by NLL);
- ``mc_dropout``: the same run with ``S`` dropout masks at test time;
- ``ensemble``: the deterministic run and ``K - 1`` more seeds, a uniform mixture;
- ``bayesian``: Bayesian layers (Flipout attention, local reparameterization
  feed-forward), model average of ``S`` weight samples and posterior mean;
- ``ivon``: the deterministic Transformer trained by IVON, model average and mean;
- the Bayesian layers' controls (``--methods``): ``map``, their recipe without weight
  noise (the same penalty), ``bayesian_kl1``, ``bayesian_kl0.3``, other KL weights, and
  the noise arms ``noise`` and ``noise_map``, their recipe with each stddev frozen at the
  Bayesian run of the same seed, without the KL and with MAP's penalty;
- the grouped estimator's arms ``bayesian_grouped`` (k = 2) and ``bayesian_grouped_k1``:
  the Bayesian layers' recipe with the grouped reparameterization in attention and
  feed-forward layers (``--preset=estimator_quality``).

The Bayesian layers and IVON are trained with ``seeds`` seeds (a preset may give each
method its own), the deterministic model with the ensemble's; each other seed is
evaluated at the end of the budget too, for
the seed spread (the report's Student-t intervals over seeds and seed-level tests against
the deterministic model). Evaluations read the test split's first ``eval_batches``
batches of 64 pairs, or every test pair (``make experiment``). The best checkpoint of a
run is the one with the lowest validation NLL of the trainer's periodic evaluation (the
posterior mean's, for a posterior; each ensemble member its own). Runs and evaluations
already complete are not redone, so an interrupted experiment resumes where it stopped.
``--preset=sequence_cpu`` also evaluates the deterministic and Bayesian runs on the pool,
takes the deterministic setting its tuning grid chose in the same ``--out`` (``--tune``
first) and stops by its CPU-hour budget (docs/experiment.md). The report (``meshbayes.experiments.report``) goes to ``OUT/report.md`` with its figures.
``--preset=estimator_quality`` (``make estimator-quality``) instead trains the Bayesian
layers and the grouped arms seed after seed and writes ``OUT/estimator_quality.md``: each run
scored on the validation split, the arms' paired differences and the design's rule
(``meshbayes.experiments.estimator_quality``).
This is the command line of ``meshbayes.experiments.run``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from meshbayes.experiments.plan import METHODS
from meshbayes.experiments.run import (PRESETS, Experiment, Runner, execute,
                                       grid_knobs)
from meshbayes.runtime import host_memory


def run_in_process(entry_point: str, args: list[str]) -> None:
  """Runs ``python -m meshbayes.<entry_point> ARGS`` in this process (``--in_process``)."""
  from meshbayes import launch

  launch.run(f"meshbayes.{entry_point}", {"train": "train", "eval": "evaluate"}[entry_point],
             args, model_from_model_dir=entry_point == "eval")


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
  parser.add_argument("--out", type=Path, default=Path("runs/experiment"))
  parser.add_argument("--methods", help=f"comma-separated subset of {','.join(METHODS)}")
  parser.add_argument("--train_steps", type=int, help="override the preset's")
  parser.add_argument("--seeds", type=int, help="override the preset's training seeds")
  parser.add_argument("--binding", action="append", default=[],
                      help="a gin binding for every command, e.g. SEED=1 (repeatable)")
  parser.add_argument("--publish", type=Path, help="also copy the report and figures here")
  parser.add_argument("--patience", type=int,
                      help="override the preset's early stopping (validation passes)")
  parser.add_argument("--tune", metavar="METHOD", help="instead: tune METHOD over --grid")
  parser.add_argument("--grid", metavar="NAME=V1,V2,...", action="append", default=[],
                      help="a gin binding --tune varies, e.g. optimizers.KLWeight.value=1,0.1 "
                           "(repeatable: every combination, or --trials of them)")
  parser.add_argument("--trials", type=int,
                      help="--tune trains this many settings of the grid: the first values "
                           "of every knob, then a Latin hypercube over the values")
  parser.add_argument("--past_edge", metavar="VALUE",
                      help="--tune over one knob: if the grid chooses its last value (its "
                           "edge), also train VALUE and choose again")
  parser.add_argument("--jobs", type=int, default=2,
                      help="commands run at once, each in its own process (default 2: a "
                           "2-core machine; each writes OUT/logs/<name>.log)")
  parser.add_argument("--reuse", action="append", default=[], metavar="RUN=DIR",
                      help="take DIR, a finished run with RUN's recipe and seed (the tuning "
                           "grid's chosen run, e.g. deterministic=runs/tuning/tuning/"
                           "deterministic/0.1), as run RUN instead of training it again")
  parser.add_argument("--in_process", action="store_true",
                      help="run the commands in this process (tests)")
  args = parser.parse_args(argv)
  changes = {}
  if args.methods:
    changes["methods"] = tuple(args.methods.split(","))
  for name in ("train_steps", "seeds", "patience"):
    if getattr(args, name) is not None:
      changes[name] = getattr(args, name)
  try:
    budget = dataclasses.replace(PRESETS[args.preset], **changes)
    args.out.mkdir(parents=True, exist_ok=True)
    runner = Runner(run_in_process if args.in_process else None, args.jobs)
    knobs = grid_knobs(args.grid) if args.tune else ()
  except ValueError as error:
    parser.error(str(error))
  return execute(Experiment(budget, args.out, runner, args.binding), args.preset, args.tune,
                 knobs, args.trials, args.reuse, args.publish, args.past_edge)


if __name__ == "__main__":
  host_memory.exec_with_malloc_tunables()
  sys.exit(main())
