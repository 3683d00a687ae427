"""The registry of predictive methods: how each turns trained runs into the posterior
evaluation predicts with.

A ``PredictiveMethod`` names the training recipe whose runs it predicts with and builds,
from a restored run, the model and the ``layers.posteriors.Posterior`` evaluation takes in
place of the parameters. ``PredictiveConfig.method``, the experiment tool and gin read
the registry; adding a method is one ``register``.

>>> get('mc_dropout').trained_by
'deterministic'
>>> get('dropout')
Traceback (most recent call last):
...
ValueError: predictive method 'dropout' is not one of deterministic, ...; did you mean mc_dropout?
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Sequence
from typing import Any

from meshbayes.evaluation import laplace
from meshbayes.layers import Ensemble, MCDropout, holds_posterior
from meshbayes.models.base import BaseModel

# The training recipes runs come from (gin_configs/uncertainty/<recipe>.gin): the three
# methods' and the Bayesian layers' controls (MAP; the KL weights 1 and 0.3).
RECIPES = ("deterministic", "bayesian", "ivon", "map", "bayesian_kl1", "bayesian_kl0.3")
_TEMPERATURE_SCALED = ("evaluation.PredictiveConfig.temperature_scaling=True",)


@dataclasses.dataclass(frozen=True)
class MethodInputs:
  """What a method's ``build`` may read besides the restored run.

  Attributes:
    model_dir: the restored run's directory.
    num_samples: members of the model average (``evaluate``'s ``num_samples``).
    member_dirs: more runs of the same recipe (other seeds), for methods that
      combine runs.
    restore: ``restore(run_dir) -> params``: the latest parameters of another run.
    context: the evaluation's ``EvalContext`` (a method that fits something reads it).
  """

  model_dir: str
  num_samples: int
  member_dirs: Sequence[str] = ()
  restore: Callable[[str], Any] | None = None
  context: Any = None


@dataclasses.dataclass(frozen=True)
class EvalContext:
  """The evaluation a method is built for: its task data, partitioner and seed."""

  data: Any
  partitioner: Any
  seed: int = 0


Build = Callable[[BaseModel, Any, MethodInputs], tuple[BaseModel, Any]]


@dataclasses.dataclass(frozen=True)
class PredictiveMethod:
  """A predictive method.

  Attributes:
    name: the method's name (``evaluation.PredictiveConfig.method``, the experiment's
      ``--methods``).
    description: one line on what it predicts with.
    trained_by: the recipe of ``RECIPES`` whose runs it predicts with.
    build: ``build(model, params, inputs) -> (model, posterior)`` from the restored
      run's model and parameters.
    combines_runs: it predicts with several runs of its recipe (``member_dirs``;
      the experiment trains ``ensemble_size`` seeds of it).
    seed_spread: the experiment trains its recipe at ``seeds`` seeds, each evaluated
      alone (the spread over training seeds).
    eval_bindings: gin bindings its evaluations add (e.g. temperature scaling).
    columns: the predictives its reports show, each with its column title.
  """

  name: str
  description: str
  trained_by: str
  build: Build
  combines_runs: bool = False
  seed_spread: bool = False
  eval_bindings: tuple[str, ...] = ()
  columns: tuple[tuple[str, str], ...] = ()

  def __post_init__(self):
    if self.trained_by not in RECIPES:
      raise ValueError(f"PredictiveMethod {self.name!r}: trained_by={self.trained_by!r} must be "
                       f"one of {', '.join(RECIPES)}")


_METHODS: dict[str, PredictiveMethod] = {}


def register(method: PredictiveMethod) -> PredictiveMethod:
  """Adds ``method`` to the registry (a name registered twice is refused)."""
  if method.name in _METHODS:
    raise ValueError(f"register: a predictive method {method.name!r} is registered already")
  _METHODS[method.name] = method
  return method


def names() -> tuple[str, ...]:
  """The registered methods' names, in order of registration."""
  return tuple(_METHODS)


def get(name: str) -> PredictiveMethod:
  """The method ``name``; an unknown one is a one-line ValueError naming the valid ones."""
  if name not in _METHODS:
    near = difflib.get_close_matches(name, list(_METHODS), n=2)
    hint = f"; did you mean {' or '.join(near)}?" if near else ""
    raise ValueError(f"predictive method {name!r} is not one of {', '.join(_METHODS)}{hint}")
  return _METHODS[name]


def as_trained(model: BaseModel, params: Any, inputs: MethodInputs) -> tuple[BaseModel, Any]:
  """The run's own posterior: point weights, Bayesian layers, or IVON's ``WeightPosterior``."""
  del inputs
  return model, params


def _deterministic_run(method: str, model: BaseModel, params: Any, directory: str) -> None:
  if model.is_bayesian or holds_posterior(params):
    raise ValueError(f"evaluate: method={method!r} needs deterministic runs; {directory} is a "
                     "Bayesian or IVON run")


def mc_dropout(model: BaseModel, params: Any, inputs: MethodInputs) -> tuple[BaseModel, Any]:
  """The model with attention-weight dropout off and its parameters as ``MCDropout``."""
  _deterministic_run("mc_dropout", model, params, inputs.model_dir)
  config = getattr(model, "config", None)
  if inputs.num_samples < 1 or not getattr(config, "dropout_rate", 0) > 0:
    raise ValueError("evaluate: method='mc_dropout' needs a run with dropout_rate > 0 and "
                     f"num_samples > 0 (num_samples={inputs.num_samples})")
  return (dataclasses.replace(model, config=config.replace(attention_dropout_rate=0.0)),
          MCDropout(params))


def ensemble(model: BaseModel, params: Any, inputs: MethodInputs) -> tuple[BaseModel, Any]:
  """The run and its ``member_dirs``' latest parameters as one ``Ensemble``."""
  if inputs.num_samples < 1 or not inputs.member_dirs:
    raise ValueError("evaluate: method='ensemble' needs ensemble_dirs (the other members' runs) "
                     f"and num_samples > 0 (the ensemble is averaged over all its members), not "
                     f"{len(inputs.member_dirs)} runs and num_samples={inputs.num_samples}")
  members = [params] + [inputs.restore(d) for d in inputs.member_dirs]
  for directory, member in zip([inputs.model_dir, *inputs.member_dirs], members):
    _deterministic_run("ensemble", model, member, directory)
  return model, Ensemble.stack(members)


register(PredictiveMethod(
    "deterministic", "the deterministic run's weights, temperature-scaled too", "deterministic",
    as_trained, eval_bindings=("evaluation.PredictiveConfig.temperature_scaling=True",),
    columns=(("posterior_mean", "deterministic"),
             ("posterior_mean_temperature_scaled", "temperature-scaled"))))
register(PredictiveMethod(
    "mc_dropout", "S dropout masks of the deterministic run", "deterministic", mc_dropout,
    eval_bindings=("evaluation.PredictiveConfig.method='mc_dropout'",),
    columns=(("model_average", "MC dropout"),)))
register(PredictiveMethod(
    "ensemble", "the deterministic runs of K seeds, a uniform mixture", "deterministic",
    ensemble, combines_runs=True, eval_bindings=("evaluation.PredictiveConfig.method='ensemble'",),
    columns=(("model_average", "deep ensemble"),)))


def _bayesian_columns(title: str) -> tuple[tuple[str, str], ...]:
  return (("model_average", title), ("posterior_mean", f"{title} (mean)"),
          ("model_average_temperature_scaled", f"{title}, temperature-scaled"),
          ("posterior_mean_temperature_scaled", f"{title} (mean), temperature-scaled"))


register(PredictiveMethod(
    "bayesian", "the Bayesian layers' posterior (S weight samples), KL weight 0.1",
    "bayesian", as_trained, seed_spread=True, eval_bindings=_TEMPERATURE_SCALED,
    columns=_bayesian_columns("Bayesian layers")))
register(PredictiveMethod(
    "ivon", "IVON's posterior over every weight (S weight samples)", "ivon", as_trained,
    seed_spread=True, columns=(("model_average", "IVON"), ("posterior_mean", "IVON (mean)"))))
register(PredictiveMethod(
    "map", "the Bayesian layers' recipe trained without weight noise: its posterior mean",
    "map", as_trained, seed_spread=True,
    eval_bindings=("evaluation.PredictiveConfig.num_samples=0", *_TEMPERATURE_SCALED),
    columns=(("posterior_mean", "MAP"), ("posterior_mean_temperature_scaled",
                                         "MAP, temperature-scaled"))))
for _weight in ("1", "0.3"):
  register(PredictiveMethod(
      f"bayesian_kl{_weight}", f"the Bayesian layers' posterior at KL weight {_weight}",
      f"bayesian_kl{_weight}", as_trained, seed_spread=True, eval_bindings=_TEMPERATURE_SCALED,
      columns=_bayesian_columns(f"Bayesian layers, KL {_weight}")))
register(PredictiveMethod(
    "laplace", "a last-layer Laplace approximation around the deterministic run",
    "deterministic", laplace.fit, eval_bindings=("evaluation.PredictiveConfig.method='laplace'",),
    columns=(("model_average", "last-layer Laplace"),)))
