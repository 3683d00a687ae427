"""The registry of predictive methods: how each builds its posterior and which runs it fits
(what the experiment trains and evaluates of each: tests/experiments/test_recipes.py)."""

import contextlib
import dataclasses
import re
import shutil
from pathlib import Path

import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest

from meshbayes.evaluation import methods as predictive_methods
from meshbayes.experiments import recipes
from meshbayes.layers import Ensemble, MCDropout, WeightPosterior
from meshbayes.training import checkpoints
from tests.experiments.recipe_configs import trained_config
from tests.training.runs import command, eval_args, train_args, train_or_fail


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


# Which methods fit which run, told before anything is restored (issue 65).

IVON_META = {"ivon": {"ess": 1000.0, "weight_decay": 0.0}}
# Each run: (its model is Bayesian, its checkpoint's metadata, its config.gin or None).
RUNS = {
    "point": (False, {}, ""),
    "ivon": (False, IVON_META, ""),
    "no_gin": (True, {}, None),  # no config.gin: the recipe is not recorded
    "example": (True, {}, "train.seed = 1\n"),  # the KL weight unbound, weight noise on
    "kl0.1": (True, {}, "KLWeight.value = 0.1\n"),
    "kl1": (True, {}, "KLWeight.value = 1.0\n"),
    "kl0.3": (True, {}, "KL = 0.3\nmodels.KLWeight.value = %KL\n"),
    "map": (True, {}, "KLWeight.value = 0.1\nEncoderDecoderModel.weight_noise = False\n"),
    "kl0.01": (True, {}, "KLWeight.value = 0.01\n"),
}
# Each registered method against each run: ok, it applies; -, it is refused.
TABLE = """\
method              point ivon no_gin example kl0.1 kl1 kl0.3 map kl0.01
deterministic       ok    -    -      -       -     -   -     -   -
mc_dropout          ok    -    -      -       -     -   -     -   -
ensemble            ok    -    -      -       -     -   -     -   -
bayesian            -     -    ok     ok      ok    -   -     -   -
ivon                -     ok   -      -       -     -   -     -   -
map                 -     -    ok     -       -     -   -     ok  -
bayesian_kl1        -     -    ok     ok      -     ok  -     -   -
bayesian_kl0.3      -     -    ok     ok      -     -   ok    -   -
laplace             ok    -    -      -       -     -   -     -   -
noise               -     -    ok     -       -     -   -     -   -
noise_map           -     -    ok     -       -     -   -     -   -
bayesian_grouped    -     -    ok     -       -     -   -     -   -
bayesian_grouped_k1 -     -    ok     -       -     -   -     -   -
"""
# The method of each run when none is given: the run's own, by its recipe's name if told.
UNSET = {"point": "deterministic", "ivon": "ivon", "no_gin": "as_trained",
         "example": "as_trained", "kl0.1": "bayesian", "kl1": "bayesian_kl1",
         "kl0.3": "bayesian_kl0.3", "map": "map", "kl0.01": "as_trained"}


def _run(tmp_path, kind, dropout_rate=0.1):
  """(model, meta, model_dir) of a run of ``RUNS[kind]``."""
  bayesian, meta, config = RUNS[kind]
  model_dir = tmp_path / kind
  model_dir.mkdir(exist_ok=True)
  if config is not None:
    (model_dir / "config.gin").write_text(config)
  return _Model(_Config(dropout_rate), is_bayesian=bayesian), meta, model_dir


def _outcome(name, run):
  try:
    return "ok" if predictive_methods.resolve(name, *run) == name else "?"
  except ValueError:
    return "-"


def test_every_method_against_every_run(tmp_path):
  rows = [["method", *RUNS]] + [
      [name, *(_outcome(name, _run(tmp_path, kind)) for kind in RUNS)]
      for name in predictive_methods.names()]
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  assert "".join(" ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() + "\n"
                 for row in rows) == TABLE
  assert {kind: predictive_methods.resolve(None, *_run(tmp_path, kind)) for kind in RUNS} == UNSET


def test_the_recipes_runs_are_told_by_what_their_config_gin_records(tmp_path):
  """A run of each Bayesian-layers recipe (its config.gin as the trainer writes it) is
  evaluated by its own method when none is given; one of the examples, by any with
  weight noise."""
  model = _Model(is_bayesian=True)
  for recipe in ("bayesian", "map", "bayesian_kl1", "bayesian_kl0.3", "example"):
    (tmp_path / recipe).mkdir()
    (tmp_path / recipe / "config.gin").write_text(trained_config(
        "examples/tiny_synthetic_bayesian.gin" if recipe == "example"
        else recipes.gin_file(recipe)))
    expected = "as_trained" if recipe == "example" else recipe
    assert predictive_methods.resolve(None, model, {}, tmp_path / recipe) == expected, recipe
  assert predictive_methods.run_record(model, {}, tmp_path / "example").methods() == (
      "bayesian", "bayesian_kl1", "bayesian_kl0.3")


def test_a_method_that_does_not_fit_is_one_line_naming_what_does(tmp_path):
  model, meta, example = _run(tmp_path, "example")  # as tiny_synthetic_bayesian.gin records
  with pytest.raises(ValueError) as ivon:
    predictive_methods.resolve("ivon", model, meta, example)
  assert str(ivon.value) == (
      f"evaluate: method='ivon' predicts with IVON runs; {example} is a Bayesian-layers run "
      "(with weight noise): use one of bayesian, bayesian_kl1, bayesian_kl0.3 or leave method "
      "unset")
  with pytest.raises(ValueError) as deterministic:
    predictive_methods.resolve("deterministic", *_run(tmp_path, "kl0.1"))
  assert str(deterministic.value) == (
      f"evaluate: method='deterministic' predicts with point-weight runs; {tmp_path / 'kl0.1'} "
      "is a Bayesian-layers run (KL weight 0.1, with weight noise): use bayesian or leave "
      "method unset")
  with pytest.raises(ValueError) as unrecorded:
    predictive_methods.resolve("ivon", *_run(tmp_path, "no_gin"))
  assert str(unrecorded.value) == (
      f"evaluate: method='ivon' predicts with IVON runs; {tmp_path / 'no_gin'} is a "
      "Bayesian-layers run: use one of bayesian, map, bayesian_kl1, bayesian_kl0.3, noise, "
      "noise_map, bayesian_grouped, bayesian_grouped_k1 or leave method unset")
  with pytest.raises(ValueError) as sampled_map:
    predictive_methods.resolve("bayesian", *_run(tmp_path, "map"))
  assert str(sampled_map.value) == (
      "evaluate: method='bayesian' predicts with Bayesian-layers runs (KL weight 0.1, with "
      f"weight noise); {tmp_path / 'map'} is a Bayesian-layers run (KL weight 0.1, without "
      "weight noise): use map or leave method unset")
  with pytest.raises(ValueError) as laplace:
    predictive_methods.resolve("laplace", *_run(tmp_path, "ivon"))
  assert str(laplace.value) == (
      f"evaluate: method='laplace' predicts with point-weight runs; {tmp_path / 'ivon'} is an "
      "IVON run: use ivon or leave method unset")
  with pytest.raises(ValueError) as no_dropout:
    predictive_methods.resolve("mc_dropout", *_run(tmp_path, "point", dropout_rate=0.0))
  assert str(no_dropout.value) == (
      f"evaluate: method='mc_dropout' needs a model with dropout_rate > 0; {tmp_path / 'point'}"
      "'s has dropout_rate=0.0: use one of deterministic, ensemble, laplace or leave method "
      "unset")
  with pytest.raises(ValueError, match=r"^evaluate: method='bayesian_kl1' predicts with .*; "
                                       r".* \(KL weight 0.01, with weight noise\): leave "
                                       r"method unset$"):
    predictive_methods.resolve("bayesian_kl1", *_run(tmp_path, "kl0.01"))
  with pytest.raises(ValueError, match="^predictive method 'ivn' is not one of"):
    predictive_methods.resolve("ivn", model, meta, example)


def _checkpoint_without_arrays(run_dir, meta, step=8):
  """``run_dir/checkpoints/step`` with its JSON metadata and an empty ``state/``: restoring
  it would fail."""
  step_dir = run_dir / "checkpoints" / str(step)
  (step_dir / checkpoints.META).mkdir(parents=True)
  (step_dir / checkpoints.STATE).mkdir()
  with contextlib.closing(ocp.JsonCheckpointHandler()) as handler:  # as the trainer writes it
    handler.save(step_dir / checkpoints.META, args=ocp.args.JsonSave(meta))
  return step_dir


def test_the_method_is_checked_before_any_parameter_is_restored(tmp_path):
  """The checks read the checkpoint's metadata and config.gin only: a run whose arrays are
  missing is refused for its method, not for its arrays; an ensemble's members too."""
  model = _Model(is_bayesian=False)
  run_dir = tmp_path / "ivon_run"
  step_dir = _checkpoint_without_arrays(run_dir, IVON_META)
  assert "state/d/*" in checkpoints.missing_parts(step_dir)
  for where in (run_dir, run_dir / "checkpoints", step_dir):
    with pytest.raises(ValueError, match=f"^evaluate: method='mc_dropout' predicts with "
                                         f"point-weight runs; {re.escape(str(where))} is an "
                                         "IVON run: use ivon or leave method unset$"):
      predictive_methods.resolve_run("mc_dropout", model, where)
  assert predictive_methods.resolve_run(None, model, run_dir, step=8) == "ivon"
  with pytest.raises(checkpoints.CheckpointError, match="no checkpoint of step 4"):
    predictive_methods.resolve_run(None, model, run_dir, step=4)

  bayesian = _Model(is_bayesian=True)
  (tmp_path / "bayesian_run").mkdir()
  (tmp_path / "bayesian_run" / "config.gin").write_text("EncoderDecoderModel.weight_noise = "
                                                         "False\nKLWeight.value = 0.1\n")
  map_step = _checkpoint_without_arrays(tmp_path / "bayesian_run", {}, step=2)
  assert predictive_methods.resolve_run(None, bayesian, map_step) == "map"  # config.gin above
  point = _checkpoint_without_arrays(tmp_path / "point_run", {})
  assert predictive_methods.resolve_run("ensemble", model, tmp_path / "point_run",
                                        member_dirs=[str(point)]) == "ensemble"
  with pytest.raises(ValueError, match=f"^evaluate: method='ensemble' predicts with point-weight "
                                       f"runs; {re.escape(str(run_dir))} is an IVON run"):
    predictive_methods.resolve_run("ensemble", model, tmp_path / "point_run",
                                   member_dirs=[str(point), str(run_dir)])


@pytest.mark.integration
def test_eval_refuses_a_method_that_does_not_fit_before_anything_loads(tmp_path, capsys):
  """``python -m meshbayes.eval`` with method='ivon' on a tiny Bayesian run whose arrays are
  gone: exit 1 and one line saying what the run is, not the restore's error."""
  model_dir = tmp_path / "run"
  train_or_fail(train_args(model_dir, 2))  # gin_configs/examples/tiny_synthetic_bayesian.gin
  shutil.rmtree(model_dir / "checkpoints" / "2" / checkpoints.STATE)
  code, _, err = command(
      capsys, "evaluate", *eval_args(model_dir, "--gin.evaluation.PredictiveConfig.method='ivon'"),
      model_from_model_dir=True)
  # Each line launch writes: PROG: error: MESSAGE (traceback in LOG).
  errors = [re.sub(r" \(traceback in \S+\)$", "", line) for line in err.splitlines()
            if "error:" in line]
  assert (code, errors) == (1, [
      f"meshbayes.eval: error: evaluate: method='ivon' predicts with IVON runs; {model_dir} is "
      "a Bayesian-layers run (with weight noise): use one of bayesian, bayesian_kl1, "
      "bayesian_kl0.3 or leave method unset"]), err[-2000:]
  assert not list(model_dir.rglob("metrics.json"))
