"""What an experiment trains and evaluates (``meshbayes.experiments.plan``): its budget's
checks, the best checkpoint, tuning grids, runs stopped early."""

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
     r"of the methods with a seed spread \(bayesian, ivon, map, bayesian_kl1, bayesian_kl0.3\)"),
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
