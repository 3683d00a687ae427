"""Why Bayesian PlaNet falls behind: the factorial ablation of its initial stddev, weight KL
and collection rule, against PlaNet, seeds interleaved; JSON summary.

The cells and the rule are ``meshbayes.planet.ablation``'s, fixed before the runs
(docs/results/2026-11-29-planet-ablation-design.md). Each finished run is kept as
``OUT/runs/CELL_seedN.json`` and reused by a rerun with the same settings (an interrupted
run resumes); after every seed ``OUT/ablation.json`` holds the summary so far. With
``--published=DIR`` the F and P runs are compared with that directory's runs of the same
seed (bit for bit: ``ablation.identical_to_published``).

Run: ``python -m meshbayes.tools.planet_ablation --seeds=7 --out=runs/planet_ablation``
(``make planet-ablation``: about 3.3 hours on 2 cores).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402

from meshbayes.planet import ablation  # noqa: E402
from meshbayes.planet.agent import Agent  # noqa: E402
from meshbayes.planet.config import PRESETS  # noqa: E402
from meshbayes.planet.run_files import read_run, run_path, trained  # noqa: E402
from meshbayes.runtime import strict_json  # noqa: E402


def _write_summary(out: str, summary: dict[str, object]) -> None:
  path = os.path.join(out, "ablation.json")
  with open(path + ".tmp", "w") as f:
    f.write(strict_json.dumps(summary, null_reasons=strict_json.NULL_REASONS, indent=2))
  os.replace(path + ".tmp", path)


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
  parser.add_argument("--seeds", type=int, default=7)
  parser.add_argument("--first_seed", type=int, default=0)
  parser.add_argument("--cells", default=",".join(ablation.CELLS),
                      help="comma-separated, run in this order within a seed")
  parser.add_argument("--published", default="",
                      help="a directory of published runs to compare F and P with")
  parser.add_argument("--out", default="runs/planet_ablation")
  args = parser.parse_args(argv)
  if args.seeds < 1:
    parser.error(f"--seeds={args.seeds} must be at least 1")
  if args.first_seed < 0:
    parser.error(f"--first_seed={args.first_seed} must be at least 0")
  cells = [c for c in args.cells.split(",") if c]
  try:
    configs = {cell: ablation.cell_config(PRESETS[args.preset], cell) for cell in cells}
  except ValueError as error:
    parser.error(str(error))
  if args.published and not os.path.isdir(args.published):
    parser.error(f"--published={args.published!r} is not a directory")
  agents: dict[str, Agent] = {}
  records = {cell: {} for cell in cells}
  published = {cell: {} for cell in cells if args.published and cell in ablation.PUBLISHED}
  start = time.perf_counter()
  summary = {}
  for seed in range(args.first_seed, args.first_seed + args.seeds):
    for cell, config in configs.items():
      config = dataclasses.replace(config, seed=seed)
      agent = agents.setdefault(cell, Agent(configs[cell]))
      record = trained(config, agent, run_path(args.out, cell, seed),
                       log=lambda m: print(m, flush=True))
      records[cell][seed] = record
      note = ""
      if cell in published:
        old = read_run(os.path.join(args.published, f"{ablation.PUBLISHED[cell]}_seed{seed}.json"))
        if old is not None:
          published[cell][seed] = ablation.identical_to_published(record, old)
          note = (", identical to the published run" if published[cell][seed]
                  else ", DIFFERS from the published run")
      print(f"{cell} seed {seed}: held-out return ({ablation.RULE}) "
            f"{ablation.response(record):.1f}{note} "
            f"({time.perf_counter() - start:.0f} s so far)", flush=True)
    summary = ablation.summarize(records, published)
    summary["preset"] = args.preset
    summary["total_seconds"] = time.perf_counter() - start
    summary["runs_wall_seconds"] = sum(r["wall_seconds"] for runs in records.values()
                                       for r in runs.values())
    _write_summary(args.out, summary)
  for name, effect in summary["effects"].items():
    interval = ("" if effect.get("low") is None
                else f" [{effect['low']:.1f}, {effect['high']:.1f}]")
    estimate = "n/a" if effect.get("estimate") is None else f"{effect['estimate']:.1f}"
    print(f"{name}: {estimate}{interval}: {effect['verdict']}")
  print(f"wrote {args.out}/ablation.json")
  return summary


if __name__ == "__main__":
  main()
