"""The registry of predictive methods: how each turns trained runs into the posterior
evaluation predicts with.

A ``PredictiveMethod`` names the training recipe whose runs it predicts with and builds,
from a restored run, the model and the ``layers.posteriors.Posterior`` evaluation takes in
place of the parameters. ``PredictiveConfig.method`` and gin read the registry; adding a
method is one ``register``. What the experiment trains, evaluates and reports of each
method is its own (``meshbayes.experiments.recipes``).

>>> get('mc_dropout').trained_by
'deterministic'
>>> get('dropout')
Traceback (most recent call last):
...
ValueError: predictive method 'dropout' is not one of deterministic, ...; did you mean mc_dropout?

A method applies only to its recipe's runs: ``resolve`` tells, before a parameter is
restored, which run ``evaluate`` was given (``run_record``: its posterior always, the
Bayesian layers' recipe from the run's ``config.gin``) and refuses a method that does not fit.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from etils import epath

from meshbayes.evaluation import laplace
from meshbayes.layers import Ensemble, MCDropout, holds_posterior
from meshbayes.layers.dense import GROUPED
from meshbayes.models.base import BaseModel
from meshbayes.models.transformer.config import GROUPED_COMPONENTS
from meshbayes.runtime import gin_preflight
from meshbayes.training import run_posteriors

# The kinds of runs a method may predict with, named by the training recipe that makes
# them (gin_configs/uncertainty/<recipe>.gin): point weights, IVON's, and the Bayesian
# layers' at their settings (``run_record`` tells them apart), the noise-without-KL
# controls (``noise``, ``noise_map``: stddevs frozen at another run's) and the grouped
# estimator's arms (``GROUPED_ARMS``) among them.
TRAINED_BY = ("deterministic", "bayesian", "ivon", "map", "bayesian_kl1", "bayesian_kl0.3",
              "noise", "noise_map", "bayesian_grouped", "bayesian_grouped_k1")
# Issue 70's quality arms: the Bayesian layers' recipe with the grouped reparameterization
# in attention, cross-attention and feed-forward layers, k = 2 groups of the batch and k = 1
# (one sample for the batch), each its number of weight groups.
GROUPED_ARMS = {"bayesian_grouped": 2, "bayesian_grouped_k1": 1}


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
    trained_by: the kind of run of ``TRAINED_BY`` it predicts with.
    build: ``build(model, params, inputs) -> (model, posterior)`` from the restored
      run's model and parameters.
    combines_runs: it predicts with several runs of its kind (``member_dirs``).
  """

  name: str
  description: str
  trained_by: str
  build: Build
  combines_runs: bool = False

  def __post_init__(self):
    if self.trained_by not in TRAINED_BY:
      raise ValueError(f"PredictiveMethod {self.name!r}: trained_by={self.trained_by!r} must be "
                       f"one of {', '.join(TRAINED_BY)}")


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
    as_trained))
register(PredictiveMethod(
    "mc_dropout", "S dropout masks of the deterministic run", "deterministic", mc_dropout))
register(PredictiveMethod(
    "ensemble", "the deterministic runs of K seeds, a uniform mixture", "deterministic",
    ensemble, combines_runs=True))
register(PredictiveMethod(
    "bayesian", "the Bayesian layers' posterior (S weight samples), KL weight 0.1",
    "bayesian", as_trained))
register(PredictiveMethod(
    "ivon", "IVON's posterior over every weight (S weight samples)", "ivon", as_trained))
register(PredictiveMethod(
    "map", "the Bayesian layers' recipe trained without weight noise: its posterior mean",
    "map", as_trained))
# The Bayesian layers' runs at the KL weights of the experiment's controls: a recipe's runs
# are evaluated as its own method (``resolve`` names an unnamed run's by its recipe).
for _weight in ("1", "0.3"):
  register(PredictiveMethod(
      f"bayesian_kl{_weight}", f"the Bayesian layers' posterior at KL weight {_weight}",
      f"bayesian_kl{_weight}", as_trained))
register(PredictiveMethod(
    "laplace", "a last-layer Laplace approximation around the deterministic run",
    "deterministic", laplace.fit))
# The noise-without-KL controls: Bayesian layers whose stddevs were frozen at the KL-0.1
# run's (meshbayes.training.frozen_stddevs), evaluated as the Bayesian layers are.
register(PredictiveMethod(
    "noise", "the Bayesian layers with stddevs frozen at the KL-0.1 run's, trained without KL",
    "noise", as_trained))
register(PredictiveMethod(
    "noise_map", "the Bayesian layers with stddevs frozen at the KL-0.1 run's, KL weight 0.1 "
    "(MAP's penalty on the means)", "noise_map", as_trained))
# The grouped estimator's arms (docs/results/2026-11-29-grouped-quality-design.md), evaluated
# as the Bayesian layers are.
for _arm, _groups in GROUPED_ARMS.items():
  register(PredictiveMethod(
      _arm, f"the Bayesian layers' posterior trained with the grouped reparameterization, "
      f"k = {_groups} weight samples per batch", _arm, as_trained))


# Which methods fit a run, told before its parameters load.

AS_TRAINED = "as_trained"  # the run's own posterior, when no registered name is told
POINT, IVON, BAYESIAN_LAYERS = "point weights", "IVON", "Bayesian layers"
# Each posterior's recipes: the deterministic and IVON recipes are their posterior's only.
_POSTERIOR_RECIPES = {POINT: ("deterministic",), IVON: ("ivon",),
                      BAYESIAN_LAYERS: ("bayesian", "map", "bayesian_kl1", "bayesian_kl0.3",
                                        "noise", "noise_map", *GROUPED_ARMS)}
# ``RunRecord.grouping`` of a run none of whose layers is grouped: the recipe's own
# estimators (Flipout attention, local reparameterization feed-forward) or any other.
UNGROUPED = ""
# The Bayesian layers' recipes by (weight noise, KL weight, stddevs frozen, grouping), as
# gin_configs/uncertainty binds them: EncoderDecoderModel.weight_noise, KLWeight.value,
# run_configs.CheckpointConfig.frozen_stddevs_from, the Estimators and num_weight_groups.
_LAYER_RECIPES = {
    (True, 0.1, False, UNGROUPED): "bayesian", (False, 0.1, False, UNGROUPED): "map",
    (True, 1.0, False, UNGROUPED): "bayesian_kl1", (True, 0.3, False, UNGROUPED): "bayesian_kl0.3",
    (True, 0.0, True, UNGROUPED): "noise", (True, 0.1, True, UNGROUPED): "noise_map",
    **{(True, 0.1, False, f"{GROUPED} k={groups}"): arm for arm, groups in GROUPED_ARMS.items()}}


def _layers(weight_noise: bool | None, kl_weight: float | None,
            frozen_stddevs: bool | None = None, grouping: str | None = None) -> str:
  """The Bayesian layers' settings that are known, e.g. 'KL weight 0.1, with weight noise'
  (stddevs frozen and a grouped estimator: named only when they are)."""
  known = [f"KL weight {kl_weight:g}"] if kl_weight is not None else []
  if weight_noise is not None:
    known.append(f"{'with' if weight_noise else 'without'} weight noise")
  if frozen_stddevs:
    known.append("stddevs frozen at another run's")
  if grouping:
    known.append(grouping)
  return ", ".join(known)


def _grouping(bindings: dict[tuple[str, str], Any]) -> str:
  """How a run's config.gin has its attention, cross-attention and feed-forward layers draw
  weights: ``UNGROUPED``, or 'grouped_reparameterization k=K' (K: ``num_weight_groups``,
  unbound 1), with ' in <components>' when only some of them are grouped (no recipe's)."""
  grouped = [c for c in GROUPED_COMPONENTS if bindings.get(("Estimators", c)) == GROUPED]
  if not grouped:
    return UNGROUPED
  groups = bindings.get(("TransformerConfig", "num_weight_groups"), 1)
  some = "" if len(grouped) == len(GROUPED_COMPONENTS) else f" in {', '.join(grouped)}"
  return f"{GROUPED} k={groups}{some}"


_RECIPE_RUNS = {"deterministic": "point-weight runs", "ivon": "IVON runs",
                **{recipe: f"Bayesian-layers runs ({_layers(*key)})"
                   for key, recipe in _LAYER_RECIPES.items()}}


@dataclasses.dataclass(frozen=True)
class RunRecord:
  """The posterior a run holds and, for Bayesian layers, the settings that tell their
  recipes apart, as its record tells them (``run_record``).

  Attributes:
    posterior: ``POINT``, ``IVON`` or ``BAYESIAN_LAYERS``.
    weight_noise: Bayesian layers: trained under weight noise (None: not recorded).
    kl_weight: Bayesian layers: the (final) KL weight (None: not recorded).
    frozen_stddevs: Bayesian layers: the stddevs were frozen at another run's (None: not
      recorded).
    grouping: Bayesian layers: ``UNGROUPED`` or how the grouped reparameterization draws
      their weights (``_grouping``; None: not recorded).

  >>> RunRecord(BAYESIAN_LAYERS, True, frozen_stddevs=False, grouping=UNGROUPED).methods()
  ('bayesian', 'bayesian_kl1', 'bayesian_kl0.3')
  >>> RunRecord(BAYESIAN_LAYERS, True, 0.1, False, 'grouped_reparameterization k=2').recipe
  'bayesian_grouped'
  >>> RunRecord(IVON).methods()
  ('ivon',)
  >>> RunRecord(BAYESIAN_LAYERS, True, 1.0, False).recipe, RunRecord(BAYESIAN_LAYERS).recipe
  ('bayesian_kl1', None)
  >>> RunRecord(BAYESIAN_LAYERS, True, 0.0, True).recipe
  'noise'
  """

  posterior: str
  weight_noise: bool | None = None
  kl_weight: float | None = None
  frozen_stddevs: bool | None = None
  grouping: str | None = None

  def recipes(self) -> tuple[str, ...]:
    """The recipes whose runs this one may be: of its posterior, and for Bayesian layers
    those whose settings agree with each one recorded."""
    if self.posterior != BAYESIAN_LAYERS:
      return _POSTERIOR_RECIPES[self.posterior]
    return tuple(recipe for (noise, weight, frozen, grouping), recipe in _LAYER_RECIPES.items()
                 if self.weight_noise in (None, noise)
                 and (self.kl_weight is None or math.isclose(weight, self.kl_weight))
                 and self.frozen_stddevs in (None, frozen)
                 and self.grouping in (None, grouping))

  @property
  def recipe(self) -> str | None:
    """The one recipe the record tells (None: several agree with it, or none)."""
    recipes = self.recipes()
    return recipes[0] if len(recipes) == 1 else None

  def methods(self) -> tuple[str, ...]:
    """The registered methods that predict with runs like this one, in registration order."""
    return tuple(m.name for m in _METHODS.values() if m.trained_by in self.recipes())

  def describe(self) -> str:
    if self.posterior == POINT:
      return "a point-weight run"
    if self.posterior == IVON:
      return "an IVON run"
    known = _layers(self.weight_noise, self.kl_weight, self.frozen_stddevs, self.grouping)
    return f"a Bayesian-layers run ({known})" if known else "a Bayesian-layers run"


def run_record(model: BaseModel, meta: dict[str, Any], model_dir: str | os.PathLike
               ) -> RunRecord:
  """What ``model_dir``'s run holds, from the model as configured, its checkpoint's JSON
  metadata ``meta`` and its ``config.gin``; nothing is restored.

  The posterior, always told: one kept by training when the checkpoint records it
  (``training.run_posteriors``: IVON's), the Bayesian layers' when ``model.is_bayesian``,
  point weights otherwise. That tells the
  recipe too, except for the Bayesian layers': the deterministic and IVON recipes are
  their posterior's only ones. The Bayesian layers' eight differ in four training settings
  the metadata does not hold, ``EncoderDecoderModel.weight_noise`` (MAP: False),
  ``KLWeight.value`` (0.1; the controls 1, 0.3 and noise's 0),
  ``run_configs.CheckpointConfig.frozen_stddevs_from`` (noise, noise_map) and the
  attention, cross-attention and feed-forward layers' ``Estimators`` with
  ``TransformerConfig.num_weight_groups`` (the grouped arms: ``GROUPED_ARMS``). They are read
  from the run's own record, its ``config.gin`` (the gin bindings the trainer writes into
  the run's directory), not from the model as evaluated (a command line may override it):

  - weight noise: as bound, and when unbound, on. Training under the layers' weight
    samples is what they are; off is the MAP control's opt-out, which a run binds.
  - the KL weight: only as bound. An unbound one took the code's default of its day,
    which nothing records, and no recipe leaves it unbound: such a run (one of
    gin_configs/examples, say) may be any recipe's with weight noise and stddevs trained.
  - frozen stddevs: when a source run is bound; unbound, the stddevs were trained.
  - grouping: the estimators as bound (unbound: the recipe's own, not grouped) and the
    number of groups (unbound: 1).

  A bound setting is reliable unless the run was resumed with another (the file is the
  last start's). So a method is refused by the run's posterior always, and by its recipe
  as far as these settings tell it: a run at settings no recipe has (KL weight 0.01) fits
  no Bayesian-layers method; one without a readable ``config.gin`` (a checkpoint copied
  alone) fits every one.
  """
  held = run_posteriors.held_by(meta)
  if held is not run_posteriors.PARAMETERS:
    return RunRecord(held.title)
  if not model.is_bayesian:
    return RunRecord(POINT)
  bindings = _trained_bindings(model_dir)
  if bindings is None:
    return RunRecord(BAYESIAN_LAYERS)
  noise = bindings.get(("EncoderDecoderModel", "weight_noise"), True)
  weight = bindings.get(("KLWeight", "value"))
  frozen = bindings.get(("CheckpointConfig", "frozen_stddevs_from"))
  return RunRecord(BAYESIAN_LAYERS, noise if isinstance(noise, bool) else None,
                   float(weight) if isinstance(weight, (int, float))
                   and not isinstance(weight, bool) else None,
                   frozen is not None, _grouping(bindings))


def resolve(name: str | None, model: BaseModel, meta: dict[str, Any],
            model_dir: str | os.PathLike) -> str:
  """The method an evaluation of ``model_dir`` predicts with, checked against the run
  before anything loads (``run_record``: the model as configured, the checkpoint's
  metadata ``meta``, the run's ``config.gin``).

  ``None`` is the run's own posterior, named by its recipe's method (``deterministic``,
  ``ivon``, ``bayesian``, ``map``, ``bayesian_kl1``, ``bayesian_kl0.3``, ``noise``,
  ``noise_map``, ``bayesian_grouped``, ``bayesian_grouped_k1``) when its record tells one
  recipe, else ``AS_TRAINED``. A named method
  must predict with one of the recipes the run may be of; MC dropout also needs a model
  with dropout.

  Raises:
    ValueError: one line naming the method, what the run is and the methods that apply.
  """
  run = run_record(model, meta, model_dir)
  usable = run.methods()
  if name is None:
    return run.recipe if run.recipe in usable else AS_TRAINED
  method = get(name)
  if name not in usable:
    runs = _RECIPE_RUNS[method.trained_by]
    raise ValueError(f"evaluate: method={name!r} predicts with {runs}; {model_dir} is "
                     f"{run.describe()}: {_instead(usable)}")
  dropout_rate = getattr(getattr(model, "config", None), "dropout_rate", 0)
  if name == "mc_dropout" and not dropout_rate > 0:
    raise ValueError(f"evaluate: method='mc_dropout' needs a model with dropout_rate > 0; "
                     f"{model_dir}'s has dropout_rate={dropout_rate}: "
                     f"{_instead([m for m in usable if m != name])}")
  return name


def resolve_run(name: str | None, model: BaseModel, model_dir: str | os.PathLike,
                step: int | None = None, member_dirs: Sequence[str] = ()) -> str:
  """``resolve`` for the checkpoint ``step`` (default: the latest) of ``model_dir`` and
  for each of ``member_dirs``' latest (an ensemble's other runs): reads only their JSON
  metadata and ``config.gin``, so a method that does not fit is told before any
  parameter is restored."""
  from meshbayes.training import checkpoints  # orbax: only where runs are read

  def meta(directory: str | os.PathLike, at: int | None = None) -> dict[str, Any]:
    return checkpoints.read_meta(checkpoints.find_step_dir(directory, at))

  method = resolve(name, model, meta(model_dir, step), model_dir)
  for directory in member_dirs:
    resolve(method, model, meta(directory), directory)
  return method


def _instead(usable: Sequence[str]) -> str:
  if not usable:
    return "leave method unset"
  return f"use {'one of ' if len(usable) > 1 else ''}{', '.join(usable)} or leave method unset"


def _trained_bindings(model_dir: str | os.PathLike) -> dict[tuple[str, str], Any] | None:
  """The unscoped bindings of the run's ``config.gin`` by (configurable, parameter), the
  last of each, a macro replaced by its value; None without a readable file. The file is
  in the run's directory, above ``model_dir`` when that is a checkpoint or its folder."""
  from meshbayes.training import checkpoints

  path = epath.Path(model_dir)
  if (path / checkpoints.STATE).is_dir():
    path = path.parent
  if path.name == "checkpoints":
    path = path.parent
  config = path / gin_preflight.TRAINED_CONFIG
  try:
    return gin_preflight.bound_values(config.read_text(), str(config))
  except (OSError, ValueError):  # unreadable: no record
    return None
