"""What an experiment trains and evaluates (``meshbayes.experiments.plan``): its budget's
checks, the best checkpoint, tuning grids, runs stopped early, seeds per method, the runs
a run reads, the pool's evaluations."""

import dataclasses
import json

import pytest

from meshbayes.experiments import plan


def test_best_step_reads_the_trainers_validation_log(tmp_path):
  (tmp_path / "eval").mkdir()
  rows = [{"step": 100, "nll": 3.0}, {"step": 200, "nll": 2.5}, {"step": 300, "nll": 2.5},
          {"step": 400, "nll": 2.7}]
  (tmp_path / "eval" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert plan.best_step(tmp_path) == 200  # the earliest of ties
  with pytest.raises(ValueError, match="no periodic validation"):
    plan.best_step(tmp_path / "missing")

@pytest.mark.parametrize("changes, message", [
    ({"methods": ("deterministic", "dropout")}, r"methods=.*'dropout'.*one of deterministic"),
    ({"train_steps": 0}, "train_steps=0 must be a positive int"),
    ({"ensemble_size": 1}, "ensemble_size=1 must be at least 2"),
    ({"ood_beam_sets": ("spanish",)}, r"ood_beam_sets=\('spanish',\) need beam_measures=True"),
])
def test_bad_budgets_are_one_line_errors(changes, message):
  with pytest.raises(ValueError, match=message):
    plan.Budget(**{"train_steps": 10, "eval_period": 5, **changes})

def test_a_tuning_grid_of_trials_is_a_latin_hypercube_from_the_recipes_setting():
  knobs = [("dropout", ["0.1", "0.2", "0.3"]), ("decay", ["0", "0.1", "1.0"]),
           ("smoothing", ["0", "0.1"]), ("lr", ["3e-3", "1.5e-3", "6e-3"])]
  settings = plan.tuning_grid(knobs, trials=12)
  assert settings[0] == {"dropout": "0.1", "decay": "0", "smoothing": "0", "lr": "3e-3"}
  assert len({tuple(s.values()) for s in settings}) == 12  # no setting twice
  for name, values in knobs:  # every value of a knob equally often
    assert sorted(s[name] for s in settings) == sorted(values * (12 // len(values)))
  assert settings == plan.tuning_grid(knobs, trials=12)  # fixed by its seed
  assert len(plan.tuning_grid(knobs)) == 54  # no trials: every combination
  assert plan.setting_label({"a.b.dropout_rate": "0.1", "c.base": "3e-3"}) == \
      "dropout_rate=0.1,base=3e-3"
  with pytest.raises(ValueError, match="trials=0 must be a positive int"):
    plan.tuning_grid(knobs, trials=0)

def test_a_run_stopped_early_is_finished_and_says_where(tmp_path):
  (tmp_path / "checkpoints" / "500").mkdir(parents=True)
  assert not plan.finished(tmp_path, train_steps=6000)
  (tmp_path / "early_stopping.json").write_text(
      json.dumps({"step": 500, "best_step": 250, "best_nll": 2.5}))
  assert plan.finished(tmp_path, train_steps=6000)
  assert plan.stopped_at(tmp_path) == 500
  (tmp_path / "checkpoints" / "6000").mkdir()
  (tmp_path / "early_stopping.json").unlink()
  assert plan.finished(tmp_path, 6000) and plan.stopped_at(tmp_path) is None

@pytest.mark.parametrize("changes, message", [
    ({"checkpoints": ()}, r"checkpoints=\(\) must name each of final, best"),
    ({"checkpoints": ("best", "best")}, "at most once"),
    ({"checkpoints": ("last",)}, "must name each of final, best"),
    ({"patience": 0}, "patience=0 must be a positive int"),
    ({"first_seed": -1}, "first_seed=-1 must be"),
    ({"single_seed": ("deterministic",)}, r"single_seed=\('deterministic',\): each must be one "
     r"of the methods with a seed spread \(bayesian, ivon, map, bayesian_kl1, bayesian_kl0.3, "
     r"noise, noise_map, bayesian_grouped, bayesian_grouped_k1\)"),
])
def test_bad_stopping_and_seed_settings_are_one_line_errors(changes, message):
  with pytest.raises(ValueError, match=message):
    plan.Budget(**{"train_steps": 10, "eval_period": 5, **changes})


@pytest.mark.parametrize("eval_batches", [0, "all", True, 2.0])
def test_eval_batches_is_a_positive_int_or_every_pair(eval_batches):
  with pytest.raises(ValueError, match=rf"Budget: eval_batches={eval_batches!r} must be a "
                                       r"positive int or None \(every test pair\)"):
    plan.Budget(train_steps=10, eval_period=5, eval_batches=eval_batches)
  assert plan.Budget(train_steps=10, eval_period=5).eval_batches is None


def _sequence_budget():
  from meshbayes.experiments import run  # the presets

  return run.PRESETS["sequence_cpu"]


def test_each_method_is_trained_at_its_own_seeds_and_the_ensemble_is_the_deterministic_seeds():
  budget = _sequence_budget()
  seeds = {}
  for run, (gin_file, seed) in budget.runs.items():
    seeds.setdefault(gin_file, []).append(seed)
  assert seeds == {f"uncertainty/{recipe}.gin": list(range(200, 200 + n)) for recipe, n in (
      ("deterministic", 5), ("bayesian", 5), ("map", 3), ("noise", 3), ("noise_map", 3))}
  assert [budget.seeds_of(m) for m in budget.methods] == [5, 5, 5, 3, 3, 3]
  keys = plan.evaluation_keys(budget)
  assert keys["ensemble@best"] == ("ensemble", "deterministic", "best")
  assert keys["deterministic_seed4@best"] == ("deterministic", "deterministic_seed4", "best")
  # The ensemble is every deterministic run: the seeds cannot disagree with its size.
  with pytest.raises(ValueError, match=r"^Budget: ensemble_size=3 must equal the seeds of "
                                       r"deterministic \(\{'deterministic': 5\}\): method "
                                       r"ensemble combines every run of it$"):
    dataclasses.replace(budget, ensemble_size=3)


@pytest.mark.parametrize("changes, message", [
    ({"method_seeds": (("bayesian", 0),)}, r"method_seeds=\(\('bayesian', 0\),\) must be "
     r"\(method, seeds\) pairs, each method once, one of deterministic, .*positive int"),
    ({"method_seeds": (("bayes", 2),)}, r"method_seeds=\(\('bayes', 2\),\) must be"),
    ({"method_seeds": (("map", 2),), "single_seed": ("map",)}, r"both name \['map'\]"),
    ({"tuned": ("ensemble",)}, r"tuned=\('ensemble',\): each must be one of deterministic, "),
    ({"methods": ("noise",)}, r"^Budget: run noise reads run bayesian \(the same seed of "
     r"bayesian\), which the budget does not train: add bayesian with as many seeds to methods$"),
    ({"methods": ("bayesian", "noise"), "method_seeds": (("noise", 4),)},
     r"run noise_seed3 reads run bayesian_seed3"),
    ({"pool_split": "pool_10"}, r"pool_split='pool_10' and pool_methods=\(\) must be both given"),
    ({"pool_split": "test", "pool_methods": ("deterministic",)}, r"pool_split='test'"),
    ({"pool_split": "pool_10", "pool_methods": ("ensemble",)},
     r"pool_methods=\('ensemble',\): each must be one of methods"),
    ({"cpu_hours": 0}, r"cpu_hours=0 must be a positive number"),
    ({"given_up_first": ("pool x",)}, r"given_up_first=\('pool x',\): 'pool x' must be a method "
     r"trained by a recipe of its own"),
    ({"given_up_first": ("deterministic",), "methods": ("deterministic", "mc_dropout")},
     r"which no other method trains or reads \(\['mc_dropout'\]\)"),
    ({"given_up_first": ("bayesian",), "methods": ("bayesian", "noise")},
     r"'bayesian' must be .*\(\['noise'\]\)"),
])
def test_bad_seeds_pools_and_stop_rules_are_one_line_errors(changes, message):
  with pytest.raises(ValueError, match=message):
    plan.Budget(**{"train_steps": 10, "eval_period": 5, **changes})


def test_the_noise_arms_read_the_bayesian_run_of_their_seed():
  assert plan.source_runs(_sequence_budget()) == {
      "noise": "bayesian", "noise_seed1": "bayesian_seed1", "noise_seed2": "bayesian_seed2",
      "noise_map": "bayesian", "noise_map_seed1": "bayesian_seed1",
      "noise_map_seed2": "bayesian_seed2"}
  assert plan.source_runs(plan.Budget(train_steps=4, eval_period=2)) == {}


def _trained(out, runs, steps=12000):
  """Fake finished runs under ``out``, their best validation step 500."""
  for run in runs:
    (out / "runs" / run / "checkpoints" / str(steps)).mkdir(parents=True)
    (out / "runs" / run / "eval").mkdir()
    (out / "runs" / run / "eval" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "nll": abs(s - 500) / 1000 + 2}) + "\n" for s in (250, 500, 750)))


def test_the_deterministic_and_bayesian_runs_of_every_seed_are_evaluated_on_the_pool(tmp_path):
  budget = _sequence_budget()
  assert list(plan.pool_keys(budget).values())[4:6] == [
      ("deterministic", "deterministic_seed4", 204), ("bayesian", "bayesian", 200)]
  assert len(plan.pool_keys(budget)) == 10
  dirs = plan.pool_result_dirs(budget, tmp_path)
  assert dirs["bayesian_seed3@best"] == tmp_path / "eval" / "pool_24000" / "bayesian_seed3_best"
  # Not among the test split's: the report's evaluations are unchanged.
  assert set(plan.evaluation_keys(budget)) == {
      "deterministic@best", "ensemble@best", "bayesian@best", "map@best", "noise@best",
      "noise_map@best", *(f"deterministic_seed{k}@best" for k in range(1, 5)),
      *(f"bayesian_seed{k}@best" for k in range(1, 5)),
      *(f"{m}_seed{k}@best" for m in ("map", "noise", "noise_map") for k in (1, 2))}
  _trained(tmp_path, ["bayesian_seed3"])
  [spec] = plan.pool_evaluations(budget, tmp_path, ["bayesian_seed3@best"]).values()
  assert spec == {"method": "bayesian", "run": "bayesian_seed3", "seed": 203, "step": 500,
                  "extra": ["evaluation.PredictiveConfig.temperature_scaling=True",
                            *plan.POOL_BINDINGS]}
  assert plan.pool_keys(plan.Budget(train_steps=4, eval_period=2)) == {}


def test_a_budget_read_back_from_its_json_is_the_same_budget(tmp_path):
  """budget.json holds tuples as lists (the report reads it back: report.read_budget)."""
  budget = _sequence_budget()
  plan.write_json(tmp_path / "budget.json", dataclasses.asdict(budget))
  read = plan.read_json(tmp_path / "budget.json")
  assert plan.Budget(**{k: tuple(v) if isinstance(v, list) else v
                        for k, v in read.items()}) == budget
