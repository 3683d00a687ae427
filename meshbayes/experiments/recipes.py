"""The experiment's view of the predictive methods: for each method it compares, the
training recipe its runs come from, how many seeds it is trained at, the gin bindings its
evaluations add and the columns its report shows.

The evaluation's registry (``meshbayes.evaluation.methods``) says how a method predicts
and which runs it fits; a ``MethodRecipe`` reads the recipe (``trained_by``) and whether it
combines runs from there, so the two cannot disagree.

>>> get("mc_dropout").trained_by, gin_file("map")
('deterministic', 'uncertainty/map.gin')
>>> get("ivon").seed_spread, get("ensemble").combines_runs
(True, True)
"""

from __future__ import annotations

import dataclasses
import difflib

from meshbayes.evaluation import methods as predictive_methods

# The training recipes (gin_configs/uncertainty/<recipe>.gin): the kinds of runs the
# evaluation tells apart, the three methods', the Bayesian layers' controls (MAP; the
# KL weights 1 and 0.3; the noise arms) and the grouped estimator's arms.
RECIPES = predictive_methods.TRAINED_BY
_TEMPERATURE_SCALED = ("evaluation.PredictiveConfig.temperature_scaling=True",)
# The noise-without-KL control's two arms (docs/results/2026-11-29-sequence-calibration-
# design.md, "Runs" 3): the Bayesian layers' recipe with each weight's stddev frozen at the
# learned value of the KL-0.1 run of the same seed, `noise` without the KL, `noise_map` with
# it (MAP's penalty on the means).
NOISE_ARMS = ("noise", "noise_map")
# The grouped estimator's arms (docs/results/2026-11-29-grouped-quality-design.md): the
# Bayesian layers' recipe with the grouped reparameterization, k = 2 and k = 1.
GROUPED_ARMS = tuple(predictive_methods.GROUPED_ARMS)
# The gin macro naming the run a training run reads (``MethodRecipe.reads_run_of``): the
# noise arms' source of stddevs (gin_configs/uncertainty/noise_map.gin).
SOURCE_RUN_MACRO = "FROZEN_STDDEVS_FROM"


def gin_file(recipe: str) -> str:
  """The gin file (under gin_configs/) of ``recipe``, one of ``RECIPES``."""
  if recipe not in RECIPES:
    raise ValueError(f"recipe {recipe!r} is not one of {', '.join(RECIPES)}")
  return f"uncertainty/{recipe}.gin"


@dataclasses.dataclass(frozen=True)
class MethodRecipe:
  """How the experiment trains, evaluates and reports one predictive method.

  Attributes:
    name: a method of the evaluation's registry (``meshbayes.evaluation.methods``).
    seed_spread: the experiment trains its recipe at ``seeds`` seeds, each evaluated
      alone (the spread over training seeds).
    eval_bindings: gin bindings its evaluations add (e.g. temperature scaling).
    columns: the predictives its reports show, each with its column title.
    reads_run_of: the recipe whose run of the same seed its training reads (given as
      ``SOURCE_RUN_MACRO``), so it starts after that run has finished; None: none.
  """

  name: str
  seed_spread: bool = False
  eval_bindings: tuple[str, ...] = ()
  columns: tuple[tuple[str, str], ...] = ()
  reads_run_of: str | None = None

  def __post_init__(self):
    predictive_methods.get(self.name)  # a registered method, or a one-line error

  @property
  def trained_by(self) -> str:
    """The recipe whose runs it predicts with (the evaluation registry's)."""
    return predictive_methods.get(self.name).trained_by

  @property
  def combines_runs(self) -> bool:
    """It predicts with several runs of its recipe: the experiment trains
    ``ensemble_size`` seeds of it."""
    return predictive_methods.get(self.name).combines_runs


def _bayesian_columns(title: str) -> tuple[tuple[str, str], ...]:
  return (("model_average", title), ("posterior_mean", f"{title} (mean)"),
          ("model_average_temperature_scaled", f"{title}, temperature-scaled"),
          ("posterior_mean_temperature_scaled", f"{title} (mean), temperature-scaled"))


_METHODS = {recipe.name: recipe for recipe in (
    MethodRecipe("deterministic", eval_bindings=_TEMPERATURE_SCALED,
                 columns=(("posterior_mean", "deterministic"),
                          ("posterior_mean_temperature_scaled", "temperature-scaled"))),
    MethodRecipe("mc_dropout", eval_bindings=("evaluation.PredictiveConfig.method='mc_dropout'",),
                 columns=(("model_average", "MC dropout"),)),
    MethodRecipe("ensemble", eval_bindings=("evaluation.PredictiveConfig.method='ensemble'",),
                 columns=(("model_average", "deep ensemble"),)),
    MethodRecipe("bayesian", seed_spread=True, eval_bindings=_TEMPERATURE_SCALED,
                 columns=_bayesian_columns("Bayesian layers")),
    MethodRecipe("ivon", seed_spread=True,
                 columns=(("model_average", "IVON"), ("posterior_mean", "IVON (mean)"))),
    MethodRecipe("map", seed_spread=True,
                 eval_bindings=("evaluation.PredictiveConfig.num_samples=0", *_TEMPERATURE_SCALED),
                 columns=(("posterior_mean", "MAP"),
                          ("posterior_mean_temperature_scaled", "MAP, temperature-scaled"))),
    *(MethodRecipe(f"bayesian_kl{weight}", seed_spread=True, eval_bindings=_TEMPERATURE_SCALED,
                   columns=_bayesian_columns(f"Bayesian layers, KL {weight}"))
      for weight in ("1", "0.3")),
    MethodRecipe("laplace", eval_bindings=("evaluation.PredictiveConfig.method='laplace'",),
                 columns=(("model_average", "last-layer Laplace"),)),
    *(MethodRecipe(arm, seed_spread=True, eval_bindings=_TEMPERATURE_SCALED,
                   columns=_bayesian_columns(title), reads_run_of="bayesian")
      for arm, title in zip(NOISE_ARMS, ("noise without KL", "noise with MAP's penalty"))),
    *(MethodRecipe(arm, seed_spread=True, eval_bindings=_TEMPERATURE_SCALED,
                   columns=_bayesian_columns(f"Bayesian layers, grouped k={groups}"))
      for arm, groups in predictive_methods.GROUPED_ARMS.items()),
)}


def names() -> tuple[str, ...]:
  """The methods the experiment knows, in the order its reports show them."""
  return tuple(_METHODS)


def get(name: str) -> MethodRecipe:
  """The experiment's recipe of method ``name``; an unknown one is a one-line ValueError
  naming the valid ones."""
  if name not in _METHODS:
    near = difflib.get_close_matches(name, list(_METHODS), n=2)
    hint = f"; did you mean {' or '.join(near)}?" if near else ""
    raise ValueError(f"experiment method {name!r} is not one of {', '.join(_METHODS)}{hint}")
  return _METHODS[name]
