"""The registry of predictive methods: what the experiment trains and evaluates follows it."""

import dataclasses
from pathlib import Path

import jax.numpy as jnp
import pytest

from meshbayes.evaluation import methods as predictive_methods
from meshbayes.layers import Ensemble, MCDropout, WeightPosterior
from meshbayes.tools import experiment_plan


@dataclasses.dataclass(frozen=True)
class _Config:
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1

  def replace(self, **changes):
    return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class _Model:
  config: _Config = _Config()
  is_bayesian: bool = False


def _inputs(**changes):
  return predictive_methods.MethodInputs(**{"model_dir": "runs/det", "num_samples": 2, **changes})


def test_an_unknown_method_is_one_line_naming_the_nearest():
  with pytest.raises(ValueError, match=r"^predictive method 'ensembles' is not one of "
                                       r"deterministic, .*; did you mean ensemble\?$"):
    predictive_methods.get("ensembles")
  with pytest.raises(ValueError, match="^register: a predictive method 'ivon' is registered "
                                       "already$"):
    predictive_methods.register(predictive_methods.get("ivon"))
  with pytest.raises(ValueError, match="trained_by='sgd' must be one of deterministic, bayesian, "
                                       "ivon, map"):
    predictive_methods.PredictiveMethod("x", "", "sgd", predictive_methods.as_trained)


def test_mc_dropout_turns_attention_dropout_off_and_refuses_other_runs():
  model, posterior = predictive_methods.get("mc_dropout").build(_Model(), {"w": 1}, _inputs())
  assert isinstance(posterior, MCDropout) and posterior.params == {"w": 1}
  assert model.config.attention_dropout_rate == 0.0 and model.config.dropout_rate == 0.1
  with pytest.raises(ValueError, match="needs deterministic runs; runs/det is a Bayesian or IVON"):
    predictive_methods.get("mc_dropout").build(
        _Model(), WeightPosterior({"w": 1.0}, {"w": 1.0}), _inputs())
  with pytest.raises(ValueError, match=r"dropout_rate > 0 and num_samples > 0 \(num_samples=0\)"):
    predictive_methods.get("mc_dropout").build(_Model(), {"w": 1}, _inputs(num_samples=0))


def test_the_ensemble_stacks_the_run_and_its_members():
  restored = {"runs/s1": {"w": jnp.ones(2)}, "runs/s2": {"w": jnp.full(2, 2.0)}}
  _, posterior = predictive_methods.get("ensemble").build(
      _Model(), {"w": jnp.zeros(2)}, _inputs(member_dirs=("runs/s1", "runs/s2"),
                                             restore=restored.__getitem__))
  assert isinstance(posterior, Ensemble) and posterior.size == 3
  assert posterior.members["w"][:, 0].tolist() == [0.0, 1.0, 2.0]
  with pytest.raises(ValueError, match="needs ensemble_dirs"):
    predictive_methods.get("ensemble").build(_Model(), {"w": 0}, _inputs())


def test_the_experiments_runs_and_bindings_follow_the_registry(tmp_path: Path):
  budget = experiment_plan.Budget(train_steps=4, eval_period=2, ensemble_size=3, seeds=2,
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
  found = experiment_plan.evaluations(dataclasses.replace(budget, checkpoints=("final",)),
                                      tmp_path)
  assert found["mc_dropout@final"] == {"method": "mc_dropout", "run": "deterministic", "step": 4,
                                       "extra": ["evaluation.PredictiveConfig.method='mc_dropout'"]}
  members = [tmp_path / "runs" / f"deterministic_seed{k}" / "checkpoints" / "4" for k in (1, 2)]
  assert found["ensemble@final"]["extra"] == [
      "evaluation.PredictiveConfig.method='ensemble'",
      f"evaluation.PredictiveConfig.ensemble_dirs=['{members[0]}', '{members[1]}']"]
  assert found["ivon@final"] == {"method": "ivon", "run": "ivon", "step": 4, "extra": []}
  with pytest.raises(ValueError, match="methods=\\('laplacian',\\): each must be one of "):
    experiment_plan.Budget(train_steps=4, eval_period=2, methods=("laplacian",))


def test_the_controls_are_the_bayesian_recipe_with_one_change_each():
  """MAP: the Bayesian layers' recipe without weight noise, evaluated at its mean; KL 1 and
  0.3: the recipe at another KL weight; each run by its own recipe, each temperature-scaled."""
  import gin

  from meshbayes import configurables  # noqa: F401  (registers the configurables)
  from meshbayes.gin_configs import DIRECTORY as GIN_CONFIGS

  def bound(recipe):
    gin.clear_config()
    gin.add_config_file_search_path(str(GIN_CONFIGS))
    gin.parse_config_files_and_bindings([str(GIN_CONFIGS / experiment_plan.RECIPES[recipe])],
                                        ["MODEL_DIR = 'x'", "TRAIN_STEPS = 1"], skip_unknown=True)
    config = gin.config_str()
    gin.clear_config()
    return set(config.splitlines())

  bayesian = bound("bayesian")
  assert bound("map") - bayesian == {"EncoderDecoderModel.weight_noise = False"}
  for weight in ("1", "0.3"):
    assert bound(f"bayesian_kl{weight}") - bayesian == {f"KLWeight.value = {float(weight)}"}
  assert "map" not in experiment_plan.Budget(train_steps=4, eval_period=2).methods
  budget = experiment_plan.Budget(train_steps=4, eval_period=2, seeds=2,
                                  methods=experiment_plan.CONTROLS)
  assert budget.runs["map_seed1"] == ("uncertainty/map.gin", 1)
  assert "evaluation.PredictiveConfig.num_samples=0" in predictive_methods.get("map").eval_bindings
  for name in ("bayesian", *experiment_plan.CONTROLS):
    assert ("evaluation.PredictiveConfig.temperature_scaling=True"
            in predictive_methods.get(name).eval_bindings)
