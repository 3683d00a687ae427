"""PlaNet and Bayesian PlaNet on the pendulum from pixels, several seeds each: JSON and figure.

The Bayesian Layers paper's Figures 10-11 in miniature (docs/planet.md): each seed trains
the deterministic agent and the Bayesian one (the transition's Dense layers
``DenseReparameterization``) with the same settings, seeds interleaved so a cut-short run
still compares both. Each finished run is written to ``OUT/runs/ESTIMATOR_seedN.json`` and
reused by a rerun with the same settings (so an interrupted run resumes); then
``OUT/planet.json`` (the summary of ``meshbayes.planet.report``) and ``OUT/planet.png``.

Run: ``python -m meshbayes.tools.planet --preset=cpu --seeds=3 --out=runs/planet``
(``make planet``). ``--first_seed`` moves the seeds (a pilot's apart from the reported
ones); the ``OVERRIDES`` flags set a preset's fields (``--train_episodes=20``,
``--transition_prior=fan_in_scaled``, ...); PlaNet's config keeps the weight posterior's
at their defaults (it reads none), so its runs are reused across posterior settings.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402

from meshbayes.planet import report  # noqa: E402
from meshbayes.planet.agent import Agent  # noqa: E402
from meshbayes.planet.config import PRESETS, PlanetConfig  # noqa: E402
from meshbayes.planet.run_files import run_path, trained  # noqa: E402
from meshbayes.runtime import strict_json  # noqa: E402


# PlanetConfig fields settable from the command line, with their types.
OVERRIDES = (("train_episodes", int), ("train_steps", int), ("transition_prior", str),
             ("transition_stddev_ratio", float), ("weight_kl_weight", float),
             ("weight_kl_warmup_rounds", int),
             ("reward_scale", float), ("collect_rule", str))


def agent_configs(preset: str, estimators: Sequence[str], overrides: dict[str, object]
                  ) -> dict[str, PlanetConfig]:
  """Each estimator's agent: ``preset`` changed by ``overrides``, PlaNet's as
  ``PlanetConfig.canonical`` makes it (the weight posterior's settings at their defaults),
  so a run of it is reused by comparisons at other posterior settings."""
  return {estimator: dataclasses.replace(PRESETS[preset], estimator=estimator,
                                         **overrides).canonical()
          for estimator in estimators}


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--first_seed", type=int, default=0)
  parser.add_argument("--estimators", default="deterministic,reparameterization")
  for name, kind in OVERRIDES:
    parser.add_argument(f"--{name}", type=kind, default=None)
  parser.add_argument("--out", default="runs/planet")
  parser.add_argument("--title", default="")
  args = parser.parse_args(argv)
  if args.seeds < 1:
    parser.error(f"--seeds={args.seeds} must be at least 1")
  if args.first_seed < 0:
    parser.error(f"--first_seed={args.first_seed} must be at least 0")
  overrides = {name: getattr(args, name) for name, _ in OVERRIDES
               if getattr(args, name) is not None}
  try:
    configs = agent_configs(args.preset, [e for e in args.estimators.split(",") if e],
                            overrides)
  except ValueError as error:
    parser.error(str(error))
  estimators = list(configs)
  agents = {e: Agent(config) for e, config in configs.items()}
  records = {e: [] for e in estimators}
  start = time.perf_counter()
  for seed in range(args.first_seed, args.first_seed + args.seeds):
    for estimator, config in configs.items():
      config = dataclasses.replace(config, seed=seed)
      record = trained(config, agents[estimator], run_path(args.out, estimator, seed),
                       log=lambda m: print(m, flush=True))
      records[estimator].append(record)
      returns = ", ".join(f"{rule} {sum(r) / len(r):.1f}"
                          for rule, r in record["eval_returns"].items())
      print(f"{estimator} seed {seed}: held-out return {returns}, "
            f"probe R^2 {record['velocity_probe_r2']:.3f}, "
            f"{record['wall_seconds']:.0f} s ({time.perf_counter() - start:.0f} s so far)",
            flush=True)
  summary = report.summarize(records)
  summary["preset"] = args.preset
  summary["config"] = {e: dataclasses.asdict(c) for e, c in configs.items()}
  # This call's time (a resumed call: only what it ran), and every run's own, however
  # many calls it took.
  summary["total_seconds"] = time.perf_counter() - start
  summary["runs_wall_seconds"] = sum(r["wall_seconds"] for rs in records.values() for r in rs)
  with open(os.path.join(args.out, "planet.json"), "w") as f:
    f.write(strict_json.dumps(summary, null_reasons=strict_json.NULL_REASONS, indent=2))
  report.plot(summary, os.path.join(args.out, "planet.png"), args.title)
  for estimator, comparison in summary.get("comparisons", {}).items():
    for rule, entry in comparison["rules"].items():
      held_out = entry["held_out"]
      interval = ("" if held_out["low"] is None
                  else f" [{held_out['low']:.1f}, {held_out['high']:.1f}] {entry['verdict']}")
      chosen = " (chosen on validation)" if rule == comparison["chosen_rule"] else ""
      print(f"{estimator} {rule}{chosen} minus PlaNet, held-out return: "
            f"{held_out['estimate']:.1f}{interval}")
    if comparison["power"]:
      print(f"power: {strict_json.dumps(comparison['power'])}")
  print(f"wrote {args.out}/planet.json and {args.out}/planet.png")
  return summary


if __name__ == "__main__":
  main()
