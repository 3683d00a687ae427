"""The order an experiment runs in and its stop rule (``meshbayes.experiments.schedule``):
the sequence calibration design's stages, what is given up first, the CPU-hours counted."""

import dataclasses

from meshbayes.experiments import plan, schedule
from meshbayes.experiments.run import PRESETS


def test_the_designs_runs_go_in_its_order_with_what_is_given_up_first_last():
  """Training, the test split, the pool of seeds 200-202, then noise_map, the pool of 203
  and of 204: the stop rule gives up the pool of 204, then 203, then noise_map."""
  stages = schedule.stages(PRESETS["sequence_cpu"])
  assert [(s.name, s.given_up) for s in stages] == [
      ("training", False), ("test split", False), ("pool_24000", False), ("noise_map", True),
      ("pool 203", True), ("pool 204", True)]
  training, tests, pool, noise_map, pool_203, pool_204 = stages
  assert training.runs == (
      "deterministic", *(f"deterministic_seed{k}" for k in range(1, 5)),
      "bayesian", *(f"bayesian_seed{k}" for k in range(1, 5)),
      "map", "map_seed1", "map_seed2", "noise", "noise_seed1", "noise_seed2")
  assert len(tests.evaluations) == 17 and not any("noise_map" in k for k in tests.evaluations)
  assert pool.pool == ("deterministic@best", "deterministic_seed1@best",
                       "deterministic_seed2@best", "bayesian@best", "bayesian_seed1@best",
                       "bayesian_seed2@best")
  assert noise_map == schedule.Stage(
      "noise_map", ("noise_map", "noise_map_seed1", "noise_map_seed2"),
      ("noise_map@best", "noise_map_seed1@best", "noise_map_seed2@best"), (), True)
  assert pool_203.pool == ("deterministic_seed3@best", "bayesian_seed3@best")
  assert pool_204.pool == ("deterministic_seed4@best", "bayesian_seed4@best")


def test_without_a_stop_rule_the_stages_are_training_then_evaluations():
  budget = PRESETS["cpu"]
  assert [s.name for s in schedule.stages(budget)] == ["training", "test split"]
  assert schedule.stages(budget)[0].runs == tuple(budget.runs)
  # Items naming nothing of the budget are ignored: --methods may leave them out.
  fewer = dataclasses.replace(PRESETS["sequence_cpu"], methods=("deterministic",),
                              pool_methods=("deterministic",))
  assert [s.name for s in schedule.stages(fewer)] == [
      "training", "test split", "pool_24000", "pool 203", "pool 204"]


def test_the_cpu_hours_counted_are_each_commands_wall_time(tmp_path):
  costs = {"deterministic": {"wall_seconds": 5400.0, "cpu_seconds": 5000.0},
           "eval deterministic@best": {"wall_seconds": 1800.0, "cpu_seconds": 2000.0},
           "never ran": {}}
  assert schedule.spent_cpu_hours(costs) == 2.0
  budget = PRESETS["sequence_cpu"]
  plan.write_json(tmp_path / "costs.json", costs)
  left = [schedule.Stage("noise_map", evaluations=("noise_map@best",), given_up=True),
          schedule.Stage("pool 204", pool=("bayesian_seed4@best",), given_up=True)]
  record = schedule.write_not_run(tmp_path, budget, left)
  assert record == plan.read_json(tmp_path / "not_run.json")
  assert (record["cpu_hours"], record["spent_cpu_hours"]) == (50.0, 2.0)
  assert [s["name"] for s in record["not_run"]] == ["pool 204", "noise_map"]  # given up first
  # The report covers what ran: noise_map given up, the pool of 204 is not a method.
  assert schedule.reported(budget, tmp_path).methods == (
      "deterministic", "ensemble", "bayesian", "map", "noise")
  assert schedule.reported(budget, tmp_path / "elsewhere") == budget
