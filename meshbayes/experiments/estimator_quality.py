"""Issue 70's quality experiment (docs/results/2026-11-29-grouped-quality-design.md, fixed
before its runs): the Bayesian layers' recipe with its own estimators (``bayesian``), with
the grouped reparameterization at k = 2 (``bayesian_grouped``) and at k = 1
(``bayesian_grouped_k1``), the same seeds in every arm, each run scored at its best
checkpoint on the validation split, the arms compared seed by seed and the design's rule
decided.

- ``run``: the runs in seed order (each seed's arms, then the next seed's), each seed's
  validation evaluations before the next seed's training, with the experiment's machinery
  (resumed where a call stopped, ``costs.json``, the stop rule), then ``write``;
- ``records``, ``compare``, ``table``: each run's figures, the paired differences with their
  Student-t intervals and the rule's verdict, as ``OUT/estimator_quality.md`` and ``.json``.

A cut by the stop rule leaves whole seeds: the comparison is over the seeds every arm has.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from meshbayes.experiments import plan, recipes, schedule
from meshbayes.experiments.plan import Budget
from meshbayes.metrics import seed_intervals

PRESET = "estimator_quality"
BASELINE, CANDIDATE, ONE_GROUP = "bayesian", *recipes.GROUPED_ARMS
ARMS = (BASELINE, CANDIDATE, ONE_GROUP)
# (minuend, subtrahend) of each paired difference.
PAIRS = ((CANDIDATE, BASELINE), (ONE_GROUP, BASELINE), (CANDIDATE, ONE_GROUP))
# The rule: the candidate becomes gpu.gin's estimator if the upper end of its NLL difference
# to the baseline is at most this many nats.
MARGIN = 0.02
# (figure, title, scale, format) of each measure, as metrics.json holds it.
MEASURES = (("nll", "validation NLL (nats)", 1.0, ".4f"),
            ("ece", "token ECE (%)", 100.0, ".2f"), ("bleu", "BLEU", 1.0, ".2f"))
TABLE, RECORD = "estimator_quality.md", "estimator_quality.json"


def seed_order(budget: Budget) -> list[list[str]]:
  """The budget's runs grouped by seed, in seed order, each seed's in the order of its
  methods.

  >>> seed_order(Budget(train_steps=4, eval_period=2, methods=ARMS, seeds=2))
  [['bayesian', 'bayesian_grouped', 'bayesian_grouped_k1'], ['bayesian_seed1', \
'bayesian_grouped_seed1', 'bayesian_grouped_k1_seed1']]
  """
  by_seed: dict[int, list[str]] = {}
  for run, (_, seed) in budget.runs.items():
    by_seed.setdefault(seed, []).append(run)
  return [by_seed[seed] for seed in sorted(by_seed)]


def run(experiment: Any, margin: float = MARGIN) -> Path:
  """Trains and evaluates ``experiment``'s runs (a ``meshbayes.experiments.run.Experiment``
  of the arms), seed after seed, each seed's validation evaluations (``Experiment.validate``)
  in one batch of commands with the next seed's training, until done or the stop rule
  refuses a command; writes and returns the table (``write``)."""
  previous: list[str] = []
  for runs in [*seed_order(experiment.budget), []]:
    experiment.validate(previous, then_train=runs)
    if experiment.stopped:
      break
    previous = runs
  return write(experiment.out, experiment.budget, margin)


def records(out: Path, budget: Budget) -> dict[str, dict[str, Any]]:
  """Each evaluated run's figures, ``{run: {arm, seed, predictive, nll, ece, bleu, best_step,
  stopped_at, cpu_hours}}``, in the budget's order: the headline predictive's (the model
  average) token NLL and ECE and BLEU from its validation evaluation, the run's best and
  last steps from its trainer's records, and the CPU-hours of its training and evaluation
  as the stop rule counts them (wall time). Runs not evaluated yet are left out."""
  costs = plan.read_json(out / "costs.json")
  found = {}
  for name, (_, seed) in budget.runs.items():
    result = plan.read_json(out / "eval" / "validation" / f"{name}_best" / "metrics.json")
    if not result:
      continue
    headline = result["predictives"][0]
    token = result["token_calibration"][headline]
    wall = sum(costs.get(key, {}).get("wall_seconds", 0.0) for key in (name, f"validation {name}"))
    found[name] = {"arm": plan.recipe_of(name), "seed": seed, "predictive": headline,
                   "nll": token["nll"], "ece": token["ece"], "bleu": result["bleu"],
                   "best_step": result["step"], "stopped_at": plan.stopped_at(out / "runs" / name),
                   "cpu_hours": wall / 3600}
  return found


def compare(found: dict[str, dict[str, Any]], margin: float = MARGIN) -> dict[str, Any]:
  """The paired differences of ``PAIRS`` over the seeds every arm has (``records``), each
  measure's mean with its 95% Student-t interval (seeds - 1 df), and the rule's verdict.

  Returns:
    ``{'seeds': [...], 'margin': margin, 'differences': {'<a> - <b>': {measure:
    SeedInterval.as_dict()}}, 'verdict': {'decided', 'adopted', 'upper_end', 'text'}}``;
    with fewer than 2 such seeds, no differences and an undecided verdict.
  """
  if not (isinstance(margin, (int, float)) and math.isfinite(margin)):
    raise ValueError(f"estimator_quality: margin={margin!r} must be a finite number of nats")
  values = {arm: {} for arm in ARMS}
  for record in found.values():
    values[record["arm"]][record["seed"]] = record
  seeds = sorted(set.intersection(*(set(by_seed) for by_seed in values.values())))
  result = {"seeds": seeds, "margin": float(margin), "differences": {}}
  if len(seeds) < 2:
    result["verdict"] = {"decided": False, "adopted": None, "upper_end": None,
                         "text": f"not decided: {len(seeds)} seed(s) with every arm evaluated; "
                                 "an interval needs 2"}
    return result
  for minuend, subtrahend in PAIRS:
    result["differences"][f"{minuend} - {subtrahend}"] = {
        measure: seed_intervals.paired_t_interval(
            {s: values[minuend][s][measure] for s in seeds},
            {s: values[subtrahend][s][measure] for s in seeds}).as_dict()
        for measure, *_ in MEASURES}
  upper = result["differences"][f"{CANDIDATE} - {BASELINE}"]["nll"]["high"]
  adopted = bool(upper <= margin)
  relation = "<=" if adopted else ">"
  outcome = ("becomes gpu.gin's estimator" if adopted
             else "ships as an option, with its measured cost in quality")
  result["verdict"] = {
      "decided": True, "adopted": adopted, "upper_end": upper,
      "text": f"{CANDIDATE} {outcome}: the upper end of its NLL difference to {BASELINE}, "
              f"{upper:+.4f}, is {relation} {margin:+g} nats"}
  return result


def table(budget: Budget, found: dict[str, dict[str, Any]], comparison: dict[str, Any],
          spent_cpu_hours: float) -> str:
  """The markdown of ``records`` and ``compare``: every run's figures, the paired
  differences over the seeds every arm has, the rule and its verdict, the CPU-hours."""
  lines = [f"{', '.join(budget.methods)}: each run at its best checkpoint on the validation "
           f"split ({budget.stopping}); token NLL and ECE of the headline predictive (teacher-forced), "
           f"BLEU decoded ({budget.decode_method}).", "",
           "| arm | seed | " + " | ".join(title for _, title, _, _ in MEASURES)
           + " | best step | stopped at | CPU-hours |", "|---" * (len(MEASURES) + 5) + "|"]
  for record in found.values():
    lines.append(f"| {record['arm']} | {record['seed']} | " + " | ".join(
        format(record[measure] * scale, spec) for measure, _, scale, spec in MEASURES)
        + f" | {record['best_step']} | {budget.stopped(record['stopped_at'])}"
        + f" | {record['cpu_hours']:.2f} |")
  missing = [name for name in budget.runs if name not in found]
  if missing:
    lines += ["", f"Not evaluated (not run yet, or the stop rule): {', '.join(missing)}."]
  seeds = comparison["seeds"]
  if comparison["differences"]:
    lines += ["", f"Paired differences over seeds {', '.join(map(str, seeds))}: mean [95% "
              f"Student-t interval, {len(seeds) - 1} df].", "",
              "| difference | " + " | ".join(title for _, title, _, _ in MEASURES) + " |",
              "|---" * (len(MEASURES) + 1) + "|"]
    for pair, figures in comparison["differences"].items():
      lines.append(f"| {pair} | " + " | ".join(
          _signed(figures[measure], scale, spec) for measure, _, scale, spec in MEASURES) + " |")
  lines += ["", f"The rule (fixed before the runs): {CANDIDATE} becomes gpu.gin's estimator "
            f"if its NLL difference to {BASELINE} has its upper end <= "
            f"{comparison['margin']:+g} nats. Verdict: {comparison['verdict']['text']}.", "",
            f"CPU-hours logged (training and evaluations, wall time): {spent_cpu_hours:.2f}"
            + (f" of the budget's {budget.cpu_hours:g}" if budget.cpu_hours else "") + "."]
  return "\n".join(lines) + "\n"


def _signed(figure: dict[str, float], scale: float, spec: str) -> str:
  value = lambda x: format(x * scale, "+" + spec)
  return f"{value(figure['estimate'])} [{value(figure['low'])}, {value(figure['high'])}]"


def write(out: Path, budget: Budget, margin: float = MARGIN) -> Path:
  """Writes ``OUT/estimator_quality.json`` (every run's figures, the comparison) and
  ``OUT/estimator_quality.md`` (``table``) from what the runs recorded; returns the table's
  path."""
  found = records(out, budget)
  comparison = compare(found, margin)
  spent = schedule.spent_cpu_hours(plan.read_json(out / "costs.json"))
  plan.write_json(out / RECORD, {"runs": found, **comparison, "cpu_hours": spent})
  path = out / TABLE
  path.write_text(table(budget, found, comparison, spent))
  return path
