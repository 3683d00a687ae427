"""The order an experiment's work runs in, and its stop rule.

An experiment (``meshbayes.experiments.run``) runs in stages, each its training runs, then
their evaluations on the test split, then on the pool (``plan``):

1. ``training``: every run, in the order of ``Budget.methods`` (a run that reads another
   run, ``plan.source_runs``, starts after it has finished);
2. ``test split``: every evaluation on the test split;
3. the pool split: every evaluation on the pool;

then each item of ``Budget.given_up_first`` as a stage of its own, in the reverse order,
so that the stop rule gives them up in that order.

The stop rule (``Budget.cpu_hours``): before each command starts, the CPU-hours logged in
``costs.json`` (``spent_cpu_hours``) are set against the budget; once they reach it, no
command starts, and what is left is recorded in ``OUT/not_run.json`` (``write_not_run``),
what is given up first first.

>>> from meshbayes.experiments.plan import Budget
>>> budget = Budget(train_steps=4, eval_period=2, methods=("deterministic", "bayesian"),
...                 seeds=2, checkpoints=("best",), pool_split="pool_9",
...                 pool_methods=("bayesian",), given_up_first=("pool 1",))
>>> [(s.name, s.runs, s.pool) for s in stages(budget)][::2]
[('training', ('deterministic', 'bayesian', 'bayesian_seed1'), ()),
 ('pool_9', (), ('bayesian@best',))]
>>> stages(budget)[-1]
Stage(name='pool 1', runs=(), evaluations=(), pool=('bayesian_seed1@best',), given_up=True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from meshbayes.experiments import plan, recipes
from meshbayes.experiments.plan import Budget


@dataclasses.dataclass(frozen=True)
class Stage:
  """One stage of an experiment: its runs trained, then its evaluations.

  Attributes:
    name: ``training``, ``test split``, the pool split, or an item of
      ``Budget.given_up_first``.
    runs: training runs (``Budget.runs``).
    evaluations: evaluations on the test split (keys of ``plan.evaluation_keys``).
    pool: evaluations on the pool (keys of ``plan.pool_keys``).
    given_up: an item of ``Budget.given_up_first``.
  """

  name: str
  runs: tuple[str, ...] = ()
  evaluations: tuple[str, ...] = ()
  pool: tuple[str, ...] = ()
  given_up: bool = False

  @property
  def empty(self) -> bool:
    return not (self.runs or self.evaluations or self.pool)


def stages(budget: Budget) -> list[Stage]:
  """The stages of ``budget``, in the order they run (the module's docstring); empty
  ones left out."""
  tests, pools = plan.evaluation_keys(budget), plan.pool_keys(budget)
  claimed, dispensable = set(), []
  for item in budget.given_up_first:  # an item given up earlier keeps what it names
    if item in budget.methods:
      named = Stage(item, tuple(r for r in budget.runs if plan.recipe_of(r) == item),
                    tuple(k for k, (method, _, _) in tests.items() if method == item),
                    tuple(k for k, (method, _, _) in pools.items() if method == item), True)
    elif item.startswith("pool ") and item[5:].isdigit():
      named = Stage(item, pool=tuple(k for k, (_, _, seed) in pools.items()
                                     if seed == int(item[5:])), given_up=True)
    else:
      continue
    named = dataclasses.replace(named, **{field: tuple(k for k in getattr(named, field)
                                                       if (field, k) not in claimed)
                                          for field in ("runs", "evaluations", "pool")})
    claimed.update((field, k) for field in ("runs", "evaluations", "pool")
                   for k in getattr(named, field))
    dispensable.append(named)
  kept = lambda field, keys: tuple(k for k in keys if (field, k) not in claimed)
  found = [Stage("training", runs=kept("runs", budget.runs)),
           Stage("test split", evaluations=kept("evaluations", tests)),
           Stage(budget.pool_split or "pool", pool=kept("pool", pools)),
           *reversed(dispensable)]
  return [stage for stage in found if not stage.empty]


def spent_cpu_hours(costs: Mapping[str, Mapping[str, float]]) -> float:
  """The CPU-hours of an experiment's ``costs.json`` as its stop rule counts them: each
  command's wall time, summed (two commands at a time on a 2-core machine: the designs'
  count)."""
  return sum(cost.get("wall_seconds", 0.0) for cost in costs.values()) / 3600


NOT_RUN = "not_run.json"


def write_not_run(out: Path, budget: Budget, left: Sequence[Stage]) -> dict[str, Any]:
  """Records in ``OUT/not_run.json`` what the stop rule left (``left``: what remains of
  each stage, in the order they run), given up first first; returns the record as
  written."""
  record = {"cpu_hours": budget.cpu_hours,
            "spent_cpu_hours": spent_cpu_hours(plan.read_json(out / "costs.json")),
            "not_run": [dataclasses.asdict(stage) for stage in reversed(left)]}
  plan.write_json(out / NOT_RUN, record)
  return plan.read_json(out / NOT_RUN)


def reported(budget: Budget, out: Path) -> Budget:
  """The budget an experiment's report covers: ``budget`` without the methods the stop
  rule gave up (``OUT/not_run.json``), or as it is when nothing was."""
  given_up = {stage["name"] for stage in plan.read_json(out / NOT_RUN).get("not_run", ())
              if stage["given_up"] and stage["name"] in recipes.names()}
  if not given_up:
    return budget
  return dataclasses.replace(budget, methods=tuple(m for m in budget.methods
                                                   if m not in given_up))
