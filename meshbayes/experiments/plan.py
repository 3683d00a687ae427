"""What an uncertainty experiment (``meshbayes.experiments.run``) trains and evaluates, and
what its runs wrote: the shared ground of the experiment and its report.

- ``Budget``: the size of an experiment (steps, seeds per method, methods, evaluations,
  the pool, the CPU-hour budget) and the training runs it implies;
- ``evaluations`` and ``result_dirs``: which checkpoint of which run each method is
  evaluated at (the end of the budget, or the best validation checkpoint) and where its
  results go under ``OUT/eval/``; ``pool_evaluations`` and ``pool_result_dirs``: the same
  for the runs also evaluated on the pool (``OUT/eval/<pool split>/``);
- a run's trainer records read back: its validation curve, best and final steps, and
  the posterior's convergence; and the experiment's own JSON files (``costs.json``,
  ``budget.json``, ``report.json``).

Directory layout under ``OUT``: ``runs/<run>/`` (each training run), ``eval/<method>_
<checkpoint>/`` (each evaluation), ``eval/<pool split>/<run>_<checkpoint>/`` (each pool
evaluation), ``tuning/<recipe>/<setting>/`` and ``tuning_<recipe>.md|json`` (a tuning grid),
``logs/``, ``costs.json``, ``budget.json``, ``not_run.json`` (what the stop rule gave up).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshbayes.experiments import recipes
from meshbayes.field_checks import is_int, positive_ints, positive_number
from meshbayes.runtime import metrics_writer, strict_json
from meshbayes.training import early_stopping
from meshbayes.training.posterior_diagnostics import MEDIAN_PREFIX, relative_change

# The methods the experiment compares (meshbayes.experiments.recipes).
METHODS = recipes.names()
# The Bayesian layers' controls: MAP (their penalty without the noise), KL weights 1 and
# 0.3, the noise arms (their noise without the learning of the stddevs). Not in a budget
# unless asked for, nor are the grouped estimator's arms (recipes.GROUPED_ARMS).
CONTROLS = ("map", "bayesian_kl1", "bayesian_kl0.3", *recipes.NOISE_ARMS)
# The gin file of each training recipe the methods evaluate.
RECIPES = {recipe: recipes.gin_file(recipe) for recipe in recipes.RECIPES}
CHECKPOINTS = ("final", "best")
# ``Budget.eval_batches`` of an evaluation of every test pair (``data.TaskData.
# max_eval_batches=None``: no limit).
ALL_TEST_PAIRS = None


@dataclasses.dataclass(frozen=True)
class Budget:
  """One size of the experiment.

  Attributes:
    train_steps: steps of every training run.
    eval_period: steps between the trainer's validation passes, each with a
      checkpoint (the candidates for the best checkpoint).
    ensemble_size: members of the deep ensemble (the deterministic run is one).
    num_samples: posterior samples (weight samples, dropout masks) per prediction.
    eval_batches: test batches of 64 pairs evaluated; None (``ALL_TEST_PAIRS``): every
      test pair, so every one of the split's sources. One binding,
      ``data.TaskData.max_eval_batches``, so it also bounds what an evaluation reads of
      the other splits: the validation batches the temperature is fitted on (None: the
      whole validation split, the test split's size) and the Laplace approximation's
      training (curvature) and validation (prior precision) batches.
    ood_examples: inputs per out-of-distribution set (and in-domain sources).
    ood_beam_sets: OOD sets also decoded by beam search with the beam-level measures
      (``evaluation.OodConfig.beam_sets``; needs ``beam_measures``).
    methods: the methods compared (default: all but ``CONTROLS`` and the grouped arms).
    checkpoints: where each method is evaluated, of ``CHECKPOINTS``: ``final`` (a run's
      last checkpoint: the end of the budget, or where it stopped early) and ``best``
      (its lowest validation NLL). The other seeds' runs are evaluated at the first.
    bindings: gin bindings added to every training and evaluation command.
    task_gin: the task file evaluations read (training reads its recipe's).
    decode_method: how the test split is decoded (``beam`` or ``greedy``; OOD
      inputs are decoded greedily, ``ood_beam_sets`` by beam search too).
    seeds: training seeds of each method with a seed spread (the Bayesian layers,
      IVON, the controls: runs ``<method>``, ``<method>_seed1``, ...); the
      deterministic model's seed spread comes from the ensemble's members.
    single_seed: methods trained at one seed although they have a seed spread
      (controls, when compute is short; those not in ``methods`` are ignored): their
      figures have intervals over test sources only, and no seed-level verdict.
    first_seed: the ``SEED`` of run ``<recipe>``; run ``<recipe>_seed<k>`` has
      ``first_seed + k``. Tuning runs use ``SEED = 0``: a ``first_seed`` past the
      tuning's keeps the reported runs' seeds fresh.
    patience: early stopping (``run_configs.EvaluationConfig.patience``): a run stops
      after this many validation passes in a row without a lower validation NLL, and
      ``train_steps`` is the cap; None: every run trains ``train_steps``.
    bootstrap_resamples: resamples of every interval (evaluations and report).
    beam_measures: also the importance-weighted uncertainty measures over the beam's
      hypotheses (``evaluation.PredictiveConfig.beam_measures``; beam decoding only).
    equivalence_samples: ancestral samples per test source for the equivalence-class
      sequence confidence (``evaluation.PredictiveConfig.equivalence_samples``; 0: none).
    method_seeds: ``(method, seeds)`` pairs: the seeds a method's recipe is trained at, in
      place of ``seeds`` (a method with a seed spread) or one (another: the deterministic
      model's other seeds are then its seed spread, and a method combining its recipe's
      runs combines them all, so ``ensemble_size`` must be the same). Methods not in
      ``methods`` are ignored.
    tuned: recipes whose runs take the setting their tuning grid in the same ``OUT``
      chose (``--tune``: ``OUT/tuning_<recipe>.json``); none of them trains before it.
    pool_split: a second test split (``pool_N``: docs/training.md, "The pool") on which
      every run of ``pool_methods`` is also evaluated, at ``seed_checkpoint``: decoded as
      the test split is, with its figures, temperature-scaled as the method is, without
      OOD sets, beam-level measures or equivalence samples; None: no pool.
    pool_methods: the methods evaluated on ``pool_split``, each run as its recipe's own
      method (the Bayesian layers: model average and posterior mean).
    cpu_hours: the stop rule: once the CPU-hours logged in ``costs.json`` reach it
      (``spent_cpu_hours``), no command starts and what is left is not run
      (``meshbayes.experiments.schedule``); None: no limit.
    given_up_first: what the stop rule gives up first, in that order, each scheduled
      after everything else, in the reverse order: a method of ``methods`` trained by a
      recipe of its own (its runs and their evaluations) or ``'pool <seed>'`` (the pool
      evaluations of that seed's runs). Those that name no part of the budget are ignored.
  """

  train_steps: int
  eval_period: int
  ensemble_size: int = 4
  num_samples: int = 4
  eval_batches: int | None = ALL_TEST_PAIRS
  ood_examples: int = 512
  methods: tuple[str, ...] = tuple(m for m in METHODS
                                  if m not in (*CONTROLS, *recipes.GROUPED_ARMS))
  checkpoints: tuple[str, ...] = CHECKPOINTS
  bindings: tuple[str, ...] = ()
  task_gin: str = "tasks/tatoeba_enfr_20k.gin"
  decode_method: str = "beam"
  seeds: int = 3
  bootstrap_resamples: int = 1000
  beam_measures: bool = False
  equivalence_samples: int = 0
  first_seed: int = 0
  patience: int | None = None
  single_seed: tuple[str, ...] = ()
  ood_beam_sets: tuple[str, ...] = ()
  method_seeds: tuple[tuple[str, int], ...] = ()
  tuned: tuple[str, ...] = ()
  pool_split: str | None = None
  pool_methods: tuple[str, ...] = ()
  cpu_hours: float | None = None
  given_up_first: tuple[str, ...] = ()

  def __post_init__(self):
    # budget.json holds pairs as lists: read back, they are pairs again.
    object.__setattr__(self, "method_seeds", tuple(tuple(p) for p in self.method_seeds))
    positive_ints("Budget", self, "train_steps", "eval_period", "num_samples", "ood_examples",
                  "seeds", "bootstrap_resamples")
    positive_ints("Budget", self, "first_seed", allow_zero=True)
    positive_ints("Budget", self, "patience", allow_none=True)
    if (not self.checkpoints or len(set(self.checkpoints)) != len(self.checkpoints)
        or not set(self.checkpoints) <= set(CHECKPOINTS)):
      raise ValueError(f"Budget: checkpoints={self.checkpoints!r} must name each of "
                       f"{', '.join(CHECKPOINTS)} at most once, at least one")
    if self.eval_batches is not ALL_TEST_PAIRS and not (
        is_int(self.eval_batches) and self.eval_batches >= 1):
      raise ValueError(f"Budget: eval_batches={self.eval_batches!r} must be a positive int "
                       "or None (every test pair)")
    unknown = [m for m in self.methods if m not in METHODS]
    if unknown or not self.methods:
      raise ValueError(f"Budget: methods={self.methods!r}: each must be one of "
                       f"{', '.join(METHODS)}")
    spread = [m for m in METHODS if recipes.get(m).seed_spread]
    if not set(self.single_seed) <= set(spread):
      raise ValueError(f"Budget: single_seed={self.single_seed!r}: each must be one of the "
                       f"methods with a seed spread ({', '.join(spread)})")
    if self.decode_method not in ("beam", "greedy"):
      raise ValueError(f"Budget: decode_method={self.decode_method!r} must be beam or greedy")
    if not (is_int(self.equivalence_samples) and 0 <= self.equivalence_samples <= 16):
      raise ValueError(f"Budget: equivalence_samples={self.equivalence_samples!r} must be an "
                       "int from 0 (none) to 16")
    if self.beam_measures and self.decode_method != "beam":
      raise ValueError(f"Budget: beam_measures=True needs decode_method='beam', not "
                       f"{self.decode_method!r}")
    if self.ood_beam_sets and not self.beam_measures:
      raise ValueError(f"Budget: ood_beam_sets={self.ood_beam_sets!r} need beam_measures=True")
    combining = [m for m in self.methods if recipes.get(m).combines_runs]
    if combining and not self.ensemble_size >= 2:
      raise ValueError(f"Budget: ensemble_size={self.ensemble_size!r} must be at least 2 "
                       f"(methods {', '.join(combining)} combine runs)")
    self._check_seeds(combining)
    self._check_pool_and_stop_rule()

  def _check_seeds(self, combining: Sequence[str]) -> None:
    given = [name for name, _ in self.method_seeds]
    if (any(len(p) != 2 for p in self.method_seeds) or len(set(given)) != len(given)
        or not set(given) <= set(METHODS)
        or not all(is_int(n) and n >= 1 for _, n in self.method_seeds)):
      raise ValueError(f"Budget: method_seeds={self.method_seeds!r} must be (method, seeds) "
                       f"pairs, each method once, one of {', '.join(METHODS)}, each with a "
                       "positive int of seeds")
    both = sorted(set(given) & set(self.single_seed))
    if both:
      raise ValueError(f"Budget: method_seeds={self.method_seeds!r} and single_seed="
                       f"{self.single_seed!r} both name {both}")
    for name in combining:
      recipe = recipes.get(name).trained_by
      others = {m: self.seeds_of(m) for m in self.methods
                if recipes.get(m).trained_by == recipe and m != name}
      if any(n != self.ensemble_size for n in others.values() if n > 1):
        raise ValueError(f"Budget: ensemble_size={self.ensemble_size!r} must equal the seeds "
                         f"of {recipe} ({others}): method {name} combines every run of it")
    if not set(self.tuned) <= set(RECIPES):
      raise ValueError(f"Budget: tuned={self.tuned!r}: each must be one of "
                       f"{', '.join(RECIPES)}")
    for run, source in source_runs(self).items():
      if source not in self.runs:
        raise ValueError(f"Budget: run {run} reads run {source} (the same seed of "
                         f"{source.split('_seed')[0]}), which the budget does not train: "
                         f"add {source.split('_seed')[0]} with as many seeds to methods")

  def _check_pool_and_stop_rule(self) -> None:
    if (self.pool_split is None) != (not self.pool_methods) or self.pool_split in ("", "test"):
      raise ValueError(f"Budget: pool_split={self.pool_split!r} and pool_methods="
                       f"{self.pool_methods!r} must be both given (a split other than test and "
                       "some methods) or neither")
    bad = [m for m in self.pool_methods
           if m not in self.methods or recipes.get(m).combines_runs]
    if bad:
      raise ValueError(f"Budget: pool_methods={self.pool_methods!r}: each must be one of "
                       f"methods {self.methods!r} that does not combine runs")
    if self.cpu_hours is not None:
      positive_number("Budget", "cpu_hours", self.cpu_hours)
    for item in self.given_up_first:
      pool_seed = item.removeprefix("pool ")
      shared = [m for m in self.methods if m != item and item in (
          recipes.get(m).trained_by, recipes.get(m).reads_run_of)] if item in METHODS else []
      if (not (item in METHODS and _own_recipe(item) or pool_seed.isdigit() and pool_seed != item)
          or shared):
        raise ValueError(f"Budget: given_up_first={self.given_up_first!r}: {item!r} must be "
                         "a method trained by a recipe of its own, which no other method "
                         f"trains or reads{f' ({shared})' if shared else ''}, or 'pool <seed>'")

  def seeds_of(self, name: str) -> int:
    """The seeds method ``name``'s recipe is trained at for it (``method_seeds``, else
    ``ensemble_size`` for a method that combines runs, ``seeds`` for one with a seed spread,
    one for another)."""
    method, given = recipes.get(name), dict(self.method_seeds)
    if name in given:
      return given[name]
    if method.combines_runs:
      return self.ensemble_size
    return self.seeds if method.seed_spread and name not in self.single_seed else 1

  @property
  def runs(self) -> dict[str, tuple[str, int]]:
    """Training runs: name -> (gin file, seed), in the order of ``methods``. Each method's
    recipe once (run ``<recipe>``), and ``seeds_of(method) - 1`` more seeds of it (runs
    ``<recipe>_seed<k>``, seed ``first_seed + k``)."""
    runs = {}
    for name in self.methods:
      recipe = recipes.get(name).trained_by
      runs.setdefault(recipe, (RECIPES[recipe], self.first_seed))
      runs.update({f"{recipe}_seed{k}": (RECIPES[recipe], self.first_seed + k)
                   for k in range(1, self.seeds_of(name))})
    return runs

  @property
  def seed_checkpoint(self) -> str:
    """The checkpoint every run of another seed is evaluated at."""
    return self.checkpoints[0]

  @property
  def stopping(self) -> str:
    """How a run of this budget ends, as the tables say it."""
    if not self.patience:
      return f"{self.train_steps} steps"
    return (f"early stopping after {self.patience} validation passes without a lower NLL "
            f"(one every {self.eval_period} steps), cap {self.train_steps} steps")

  def stopped(self, step: int | None) -> str:
    """A table's cell for where a run stopped (``stopped_at``; None: it reached the cap)."""
    return f"{step}" if step is not None else f"cap ({self.train_steps})"


def _own_recipe(name: str) -> bool:
  """Whether method ``name`` is trained by a recipe of its own name."""
  return recipes.get(name).trained_by == name


def recipe_of(run: str) -> str:
  """The recipe of run ``<recipe>`` or ``<recipe>_seed<k>``."""
  return run.rsplit("_seed", 1)[0]


def source_runs(budget: Budget) -> dict[str, str]:
  """``{run: the run it reads}``: each run of a recipe whose training reads another recipe's
  run of the same seed (``recipes.MethodRecipe.reads_run_of``: the noise arms, the
  Bayesian layers' learned stddevs); it starts after that run has finished."""
  found = {}
  for run in budget.runs:
    recipe = recipe_of(run)
    source = recipes.get(recipe).reads_run_of if recipe in METHODS else None
    if source:
      found[run] = source + run[len(recipe):]
  return found


def tuning_grid(knobs: Sequence[tuple[str, Sequence[str]]], trials: int | None = None,
                seed: int = 0) -> list[dict[str, str]]:
  """The settings a tuning grid trains, each ``{binding: value}``.

  Without ``trials``: every combination of the knobs' values. With ``trials``: a Latin
  hypercube over the values (each knob's values used equally often, to within one): the
  first setting is every knob at its first value (list the recipe's own setting first),
  each knob's other entries shuffled by ``numpy.random.default_rng(seed)``, redrawn until
  no setting repeats.

  >>> tuning_grid([("a", ["1", "2"]), ("b", ["x", "y"])])[1]
  {'a': '1', 'b': 'y'}
  >>> [s["a"] for s in tuning_grid([("a", ["1", "2", "3"]), ("b", ["x", "y"])], trials=6)]
  ['1', '1', '2', '2', '3', '3']
  """
  names = [name for name, _ in knobs]
  if len(set(names)) != len(names) or any(not values for _, values in knobs):
    raise ValueError(f"tuning grid: {knobs!r}: each binding at most once, each with values")
  combinations = [dict(zip(names, values)) for values in itertools.product(*(v for _, v in knobs))]
  if trials is None or trials >= len(combinations):
    return combinations
  if not (isinstance(trials, int) and trials >= 1):
    raise ValueError(f"tuning grid: trials={trials!r} must be a positive int")
  rng = np.random.default_rng(seed)
  while True:
    columns = []
    for _, values in knobs:
      column = [values[i % len(values)] for i in range(trials)]
      columns.append(column[:1] + list(rng.permutation(column[1:])))
    settings = [dict(zip(names, row)) for row in zip(*columns)]
    if len({tuple(s.values()) for s in settings}) == trials:
      return settings


def setting_label(setting: dict[str, str]) -> str:
  """A tuning run's name: ``name=value`` per knob (the binding's last part), comma-joined."""
  return ",".join(f"{binding.rsplit('.', 1)[-1]}={value}" for binding, value in setting.items())


# The experiment's JSON files.


def read_json(path: Path) -> dict[str, Any]:
  """The JSON object in ``path`` (its nulls of non-finite figures NaN again:
  ``strict_json.restore``); empty when there is no such file (not written yet)."""
  return strict_json.restore(json.loads(path.read_text())) if path.is_file() else {}


def write_json(path: Path, value: Any) -> None:
  """Writes ``value`` to ``path`` as strict JSON (a non-finite figure null, its reason under
  ``strict_json.NULL_REASONS``), whole or not at all (a reader never sees half of it)."""
  temporary = path.with_suffix(".tmp")
  temporary.write_text(strict_json.dumps(value, null_reasons=strict_json.NULL_REASONS, indent=2))
  temporary.replace(path)


# A run's trainer records.


def _evaluations(run_dir: Path) -> list[dict[str, Any]]:
  """The trainer's periodic validation passes of a run (``eval/metrics.jsonl``), by step."""
  path = run_dir / "eval" / "metrics.jsonl"
  rows = metrics_writer.read_lines(path) if path.is_file() else []
  return sorted((r for r in rows if "nll" in r), key=lambda r: int(r["step"]))


def validation_curve(run_dir: Path) -> list[tuple[int, float]]:
  """``(step, validation NLL)`` of the trainer's periodic evaluations, by step: what its
  early stopping reads (``meshbayes.training.early_stopping.validation_history``)."""
  return early_stopping.validation_history(run_dir)


def convergence(run_dir: Path) -> dict[str, Any]:
  """The last periodic evaluation of a run with a posterior: its step, validation NLL and
  plug-in negative ELBO (the posterior mean's NLL plus KL / training tokens), and per layer
  group the median posterior stddev and its relative change over the last tenth of the
  run (``meshbayes.training.posterior_diagnostics``). Empty without evaluations or stddevs."""
  rows = _evaluations(run_dir)
  groups = sorted({k for r in rows for k in r if k.startswith(MEDIAN_PREFIX)})
  if len(rows) < 2 or not groups:
    return {}
  last = rows[-1]
  result = {"step": int(last["step"]), "nll": last["nll"],
            "neg_elbo": last.get("plugin_neg_elbo", last["nll"]), "groups": {}}
  for group in groups:
    start, _, change = relative_change([(r["step"], r[group]) for r in rows if group in r])
    result["groups"][group[len(MEDIAN_PREFIX):]] = {"median": last[group], "change": change,
                                                    "from_step": start}
  return result


def best_step(run_dir: Path) -> int:
  """The step of the lowest validation NLL (the earliest among ties)."""
  curve = validation_curve(run_dir)
  if not curve:
    raise ValueError(f"{run_dir} has no periodic validation "
                     "(run_configs.EvaluationConfig.period) to choose from")
  return min(curve, key=lambda point: (point[1], point[0]))[0]


def final_step(run_dir: Path) -> int:
  """The step of a run's last checkpoint."""
  steps = [int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()]
  return max(steps)


def finished(run_dir: Path, train_steps: int) -> bool:
  """Whether a run is done: trained to ``train_steps`` or stopped early."""
  return ((run_dir / "checkpoints" / str(train_steps)).is_dir()
          or early_stopping.read_stop(run_dir) is not None)


def stopped_at(run_dir: Path) -> int | None:
  """The step a run stopped early at; None if it ran to its cap."""
  stop = early_stopping.read_stop(run_dir)
  return None if stop is None else stop.step


# The evaluations of an experiment.


def evaluation_keys(budget: Budget) -> dict[str, tuple[str, str, str]]:
  """``{key: (method, run, checkpoint)}`` of every evaluation on the test split, in the
  order ``evaluations`` lists them; nothing is read."""
  keys = {f"{name}@{checkpoint}": (name, recipes.get(name).trained_by, checkpoint)
          for checkpoint in budget.checkpoints for name in budget.methods}
  # Every other seed as itself, evaluated as its recipe's own method (each recipe is a
  # method too): the seed spread of the deterministic model (the ensemble's members) and
  # of each method with ``seed_spread``.
  keys.update({f"{run}@{budget.seed_checkpoint}": (recipe_of(run), run, budget.seed_checkpoint)
               for run in budget.runs if "_seed" in run})
  return keys


def _step(out: Path, run: str, checkpoint: str) -> int:
  return best_step(out / "runs" / run) if checkpoint == "best" else final_step(out / "runs" / run)


def evaluations(budget: Budget, out: Path, keys: Sequence[str] | None = None
                ) -> dict[str, dict[str, Any]]:
  """``{'<method>@<checkpoint>': {'method': ..., 'run': ..., 'step': ..., 'extra': [...]}}``
  of every evaluation of the experiment in ``out`` (its runs trained), and
  ``'<run>@<checkpoint>'`` for each run of another seed (its recipe's method); ``extra``
  are the evaluation's own gin bindings. ``keys``: only these (their runs trained)."""
  runs = out / "runs"
  found = {}
  for key, (name, run, checkpoint) in evaluation_keys(budget).items():
    if keys is not None and key not in keys:
      continue
    method = recipes.get(name)
    extra = list(method.eval_bindings)
    if method.combines_runs:
      extra.append("evaluation.PredictiveConfig.ensemble_dirs=[{}]".format(", ".join(
          f"'{runs / member / 'checkpoints' / str(_step(out, member, checkpoint))}'"
          for member in budget.runs if member.startswith(f"{run}_seed"))))
    found[key] = {"method": name, "run": run, "step": _step(out, run, checkpoint),
                  "extra": extra}
  return found


def result_dirs(budget: Budget, out: Path, keys: Sequence[str] | None = None
                ) -> dict[str, Path]:
  """Each evaluation's result directory; a best checkpoint that is the final one shares
  the final's (it is evaluated once). ``keys``: only these (their runs trained)."""
  results, evaluated = {}, {}
  for key, spec in evaluations(budget, out, keys).items():
    same = (spec["run"], spec["step"], tuple(spec["extra"]))
    results[key] = evaluated.setdefault(same, out / "eval" / key.replace("@", "_"))
  return results


# The pool: a second test split for the figures that need many sources.

# An evaluation on the pool decodes and scores its sources only: no OOD sets, no beam-level
# measures, no equivalence samples (the design's cost: decoding alone).
POOL_BINDINGS = ("evaluation.OodConfig.files={}", "evaluation.OodConfig.targets_as_inputs=False",
                 "evaluation.OodConfig.shuffled_words=False", "evaluation.OodConfig.beam_sets=[]",
                 "evaluation.PredictiveConfig.beam_measures=False",
                 "evaluation.PredictiveConfig.equivalence_samples=0")


def pool_keys(budget: Budget) -> dict[str, tuple[str, str, int]]:
  """``{'<run>@<checkpoint>': (method, run, seed)}``: every run of each of
  ``pool_methods``' recipes, at ``seed_checkpoint``, in the order of ``runs``."""
  by_recipe = {recipes.get(m).trained_by: m for m in budget.pool_methods}
  return {f"{run}@{budget.seed_checkpoint}": (by_recipe[recipe_of(run)], run, seed)
          for run, (_, seed) in budget.runs.items() if recipe_of(run) in by_recipe}


def pool_evaluations(budget: Budget, out: Path, keys: Sequence[str] | None = None
                     ) -> dict[str, dict[str, Any]]:
  """``{'<run>@<checkpoint>': {'method', 'run', 'seed', 'step', 'extra'}}`` of every
  evaluation on ``pool_split`` (empty without a pool); ``extra``: the method's bindings,
  then ``POOL_BINDINGS``. ``keys``: only these (their runs trained)."""
  return {key: {"method": method, "run": run, "seed": seed,
                "step": _step(out, run, budget.seed_checkpoint),
                "extra": [*recipes.get(method).eval_bindings, *POOL_BINDINGS]}
          for key, (method, run, seed) in pool_keys(budget).items()
          if keys is None or key in keys}


def pool_result_dirs(budget: Budget, out: Path) -> dict[str, Path]:
  """Each pool evaluation's result directory, ``OUT/eval/<pool_split>/<run>_<checkpoint>``
  (its ``metrics.json`` there once it has run); nothing is read."""
  return {key: out / "eval" / budget.pool_split / key.replace("@", "_")
          for key in pool_keys(budget)}

