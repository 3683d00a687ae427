"""The experiment's view of the predictive methods (``meshbayes.experiments.recipes``): the
runs each method's recipe trains and the bindings its evaluations add, read from the
evaluation's registry where the two share a fact."""

import dataclasses
from pathlib import Path

import pytest

from meshbayes.evaluation import methods as predictive_methods
from meshbayes.experiments import plan, recipes
from tests.experiments.recipe_configs import trained_config


def test_the_experiments_runs_and_bindings_follow_the_registry(tmp_path: Path):
  budget = plan.Budget(train_steps=4, eval_period=2, ensemble_size=3, seeds=2,
                                  methods=("deterministic", "mc_dropout", "ensemble", "ivon"))
  assert budget.runs == {
      "deterministic": ("uncertainty/deterministic.gin", 0),
      "deterministic_seed1": ("uncertainty/deterministic.gin", 1),
      "deterministic_seed2": ("uncertainty/deterministic.gin", 2),
      "ivon": ("uncertainty/ivon.gin", 0), "ivon_seed1": ("uncertainty/ivon.gin", 1)}
  # Without a method that combines runs, the deterministic recipe trains once.
  assert set(dataclasses.replace(budget, methods=("mc_dropout", "bayesian")).runs) == {
      "deterministic", "bayesian", "bayesian_seed1"}
  for run in budget.runs:
    (tmp_path / "runs" / run / "checkpoints" / "4").mkdir(parents=True)
  found = plan.evaluations(dataclasses.replace(budget, checkpoints=("final",)),
                                      tmp_path)
  assert found["mc_dropout@final"] == {"method": "mc_dropout", "run": "deterministic", "step": 4,
                                       "extra": ["evaluation.PredictiveConfig.method='mc_dropout'"]}
  members = [tmp_path / "runs" / f"deterministic_seed{k}" / "checkpoints" / "4" for k in (1, 2)]
  assert found["ensemble@final"]["extra"] == [
      "evaluation.PredictiveConfig.method='ensemble'",
      f"evaluation.PredictiveConfig.ensemble_dirs=['{members[0]}', '{members[1]}']"]
  assert found["ivon@final"] == {"method": "ivon", "run": "ivon", "step": 4, "extra": []}
  with pytest.raises(ValueError, match="methods=\\('laplacian',\\): each must be one of "):
    plan.Budget(train_steps=4, eval_period=2, methods=("laplacian",))


def test_the_controls_are_the_bayesian_recipe_with_one_change_each():
  """MAP: the Bayesian layers' recipe without weight noise, evaluated at its mean; KL 1 and
  0.3: the recipe at another KL weight; each run by its own recipe, each temperature-scaled."""
  bound = lambda recipe: set(trained_config(plan.RECIPES[recipe]).splitlines())
  bayesian = bound("bayesian")
  assert bound("map") - bayesian == {"EncoderDecoderModel.weight_noise = False"}
  assert "KLWeight.value = 0.1" in bayesian  # resolve tells the recipes by these two
  assert not any("weight_noise" in line for line in bayesian)  # unbound: on
  for weight in ("1", "0.3"):
    assert bound(f"bayesian_kl{weight}") - bayesian == {f"KLWeight.value = {float(weight)}"}
  assert "map" not in plan.Budget(train_steps=4, eval_period=2).methods
  budget = plan.Budget(train_steps=4, eval_period=2, seeds=2,
                       methods=("bayesian", *plan.CONTROLS))
  assert budget.runs["map_seed1"] == ("uncertainty/map.gin", 1)
  assert "evaluation.PredictiveConfig.num_samples=0" in recipes.get("map").eval_bindings
  for name in ("bayesian", *plan.CONTROLS):
    assert ("evaluation.PredictiveConfig.temperature_scaling=True"
            in recipes.get(name).eval_bindings)


def test_each_method_is_trained_by_the_evaluations_recipe_and_shows_its_columns():
  """trained_by and combines_runs are the evaluation registry's: they cannot disagree."""
  assert recipes.names() == predictive_methods.names()[:len(recipes.names())]
  for name in recipes.names():
    method, recipe = predictive_methods.get(name), recipes.get(name)
    assert (recipe.trained_by, recipe.combines_runs) == (method.trained_by,
                                                          method.combines_runs)
    assert recipe.columns  # every method the experiment compares has a column
  assert recipes.RECIPES == predictive_methods.TRAINED_BY
  assert [plan.RECIPES[r] for r in ("map", "bayesian_kl0.3")] == [
      "uncertainty/map.gin", "uncertainty/bayesian_kl0.3.gin"]
  with pytest.raises(ValueError, match=r"^experiment method 'ensembles' is not one of "
                                       r"deterministic, .*; did you mean ensemble\?$"):
    recipes.get("ensembles")
  with pytest.raises(ValueError, match="recipe 'sgd' is not one of deterministic, bayesian"):
    recipes.gin_file("sgd")
  with pytest.raises(ValueError, match="predictive method 'dropout' is not one of"):
    recipes.MethodRecipe("dropout")
