"""An uncertainty experiment run: every method's training runs, each method evaluated at
the end of the budget and at its best validation checkpoint, and the report (the command:
``python -m meshbayes.tools.experiment``, whose docstring says what each method is).

- ``PRESETS``: the budgets of ``make experiment``, ``make demo``, the sequence calibration
  experiment, ``make estimator-quality`` and the test suite's toy;
- ``Runner``: runs ``python -m meshbayes.train|eval`` commands, ``jobs`` at a time, and
  accounts for their time;
- ``Experiment``: the runs and evaluations of one budget under ``OUT`` (resumed where an
  earlier call stopped), a tuning grid, a run reused from elsewhere;
- ``execute``: all of it for one command line, the report included.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from meshbayes.experiments import estimator_quality, plan, recipes, schedule
from meshbayes.experiments.plan import (ALL_TEST_PAIRS, RECIPES, Budget, best_step, convergence,
                                        evaluations, finished, read_json, result_dirs,
                                        setting_label, stopped_at, write_json)
from meshbayes.training import compute_log

PRESETS = {
    # make experiment, "is being Bayesian worth it" (docs/results/2026-11-28-bayesian-
    # worth-it-design.md, fixed before its runs): the tuned deterministic model, its
    # ensemble, the Bayesian layers and their controls (MAP; KL weights 1 and 0.3, one
    # seed each: only controls), fresh seeds 100-102, early stopping (4 validation
    # passes) capped at 6,000 steps, each run evaluated at its best checkpoint on every
    # test source. No equivalence samples: they more than double a model average's
    # decoding, and at this scale's 1-4% exact matches no sequence calibration figure
    # reaches 400 positives at 2,000 sources.
    "cpu": Budget(train_steps=6000, eval_period=250, patience=4, eval_batches=ALL_TEST_PAIRS,
                  ensemble_size=3, first_seed=100, checkpoints=("best",), beam_measures=True,
                  methods=("deterministic", "ensemble", "bayesian", "map", "bayesian_kl1",
                           "bayesian_kl0.3"),
                  single_seed=("bayesian_kl1", "bayesian_kl0.3"), ood_beam_sets=("spanish",)),
    # make experiment, "sequence calibration decided on CPU" (docs/results/2026-11-29-
    # sequence-calibration-design.md, fixed before its runs): one 12,000-step cap for every
    # method with early stopping (4 validation passes of 250 steps), each run evaluated at
    # its best checkpoint; the deterministic model (the setting its grid past the edge
    # chose: tuning_deterministic.json) and the Bayesian layers at seeds 200-204, the
    # ensemble of the five deterministic runs, MAP and the noise arms at 200-202 (each
    # noise run after the Bayesian run of its seed); every test source as the cpu preset,
    # and the deterministic and Bayesian runs also on 24,000 pool sources; a budget of 50
    # CPU-hours whose stop rule gives up the pool of seed 204, then 203, then noise_map.
    "sequence_cpu": Budget(
        train_steps=12000, eval_period=250, patience=4, eval_batches=ALL_TEST_PAIRS,
        ensemble_size=5, first_seed=200, checkpoints=("best",), beam_measures=True,
        ood_beam_sets=("spanish",),
        methods=("deterministic", "ensemble", "bayesian", "map", "noise", "noise_map"),
        method_seeds=(("deterministic", 5), ("bayesian", 5), ("map", 3), ("noise", 3),
                      ("noise_map", 3)),
        tuned=("deterministic",), pool_split="pool_24000",
        pool_methods=("deterministic", "bayesian"), cpu_hours=50.0,
        given_up_first=("pool 204", "pool 203", "noise_map")),
    # The sequence calibration experiment (docs/results/2026-11-28-sequence-calibration.md):
    # every method but the controls at 3,000 steps, every test source, beam-level measures
    # and 8 ancestral samples per source (equivalence-class confidence).
    "sequence_calibration": Budget(train_steps=3000, eval_period=250,
                                   eval_batches=ALL_TEST_PAIRS, beam_measures=True,
                                   equivalence_samples=8),
    # make demo: a smaller table (1,000 steps, the first 4 test batches: 256 pairs).
    "demo": Budget(train_steps=1000, eval_period=250, eval_batches=4, ood_examples=128,
                   methods=("deterministic", "mc_dropout", "bayesian"), checkpoints=("final",),
                   seeds=1),
    # The grouped estimator's quality (docs/results/2026-11-29-grouped-quality-design.md,
    # fixed before its runs): the Bayesian layers' recipe with its own estimators, with the
    # grouped reparameterization at k = 2 and at k = 1, seeds 100-102 in seed order, the
    # sequence calibration design's cap and early stopping, each run scored at its best
    # checkpoint on the whole validation split (greedy decoding for BLEU: the experiment's
    # cheapest), at most 8 CPU-hours; OUT/estimator_quality.md instead of the report.
    estimator_quality.PRESET: Budget(
        train_steps=12000, eval_period=250, patience=4, eval_batches=ALL_TEST_PAIRS,
        first_seed=100, seeds=3, checkpoints=("best",), methods=estimator_quality.ARMS,
        decode_method="greedy", cpu_hours=8.0),
    # The test suite: the whole code path in seconds (a tiny model; a task given by --binding).
    "toy": Budget(train_steps=4, eval_period=2, ensemble_size=2, num_samples=2, eval_batches=1,
                  ood_examples=4, decode_method="greedy", seeds=2, bootstrap_resamples=50,
                  equivalence_samples=2,
                  bindings=(
                      "models.TransformerConfig.emb_dim=16", "models.TransformerConfig.mlp_dim=16",
                      "models.TransformerConfig.num_heads=2",
                      "models.TransformerConfig.head_dim=8",
                      "models.TransformerConfig.num_encoder_layers=1",
                      "models.TransformerConfig.num_decoder_layers=1", "BATCH_SIZE=8")),
}

# The page that decides what the demo only shows: the sequence calibration experiment's
# design, fixed before its runs (its results page, once published, gives the verdicts).
VERDICT_PAGE = "docs/results/2026-11-29-sequence-calibration-design.md"


def demo_caveat(budget: Budget) -> str:
  """The line ``make demo`` prints under its table: what its figures are, and are not."""
  seeds = "one seed" if budget.seeds == 1 else f"{budget.seeds} seeds"
  return (f"These figures are {seeds} at {budget.train_steps:,} steps, a code path, not a "
          f"verdict: see {VERDICT_PAGE} (the verdicts will be on its results page)")


class Runner:
  """Runs ``python -m meshbayes.train|eval ...`` and accounts for its time.

  In new processes (the default: a clean gin configuration each, CPU time read per
  process), ``jobs`` at a time: a training run of these small models keeps about one
  core busy, so two runs share a 2-core machine at nearly twice the throughput. Or in
  this process, one after another (tests): ``in_process(entry_point, args)`` runs one
  there, the command line's launcher (the library does not import it), raising
  ``SystemExit`` with a status as the command would.
  """

  def __init__(self, in_process: Callable[[str, list[str]], None] | None = None,
               jobs: int = 1):
    if in_process is not None and not callable(in_process):
      raise ValueError(f"Runner: in_process={in_process!r} must be None or a function")
    if not isinstance(jobs, int) or jobs < 1:
      raise ValueError(f"Runner: jobs={jobs!r} must be a positive int")
    self.in_process, self.jobs = in_process, jobs

  def __call__(self, entry_point: str, args: Sequence[str]) -> dict[str, float]:
    """Runs one command here, its output on this terminal; returns its wall and CPU
    seconds. Raises on failure."""
    print(f"experiment: {entry_point} {' '.join(args)}", flush=True)
    who = resource.RUSAGE_SELF if self.in_process else resource.RUSAGE_CHILDREN
    before, started = resource.getrusage(who), time.perf_counter()
    if self.in_process:
      try:
        self.in_process(entry_point, list(args))
      except SystemExit as exit_:
        if exit_.code:
          raise RuntimeError(f"meshbayes.{entry_point} failed (status {exit_.code})") from None
    else:
      done = subprocess.run([sys.executable, "-m", f"meshbayes.{entry_point}", *args])
      if done.returncode:
        raise RuntimeError(f"meshbayes.{entry_point} failed (status {done.returncode}): "
                           f"{' '.join(args)}")
    after = resource.getrusage(who)
    return {"wall_seconds": time.perf_counter() - started,
            "cpu_seconds": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}

  def all(self, commands: Sequence[tuple[str, Sequence[str], Path]],
          done: Callable[[int, dict[str, float]], None] = lambda index, cost: None,
          admit: Callable[[int], bool] = lambda index: True,
          after: Mapping[int, Sequence[int]] | None = None) -> list[dict[str, float] | None]:
    """Runs ``(entry point, args, log file)`` commands, ``jobs`` at a time, in order, and
    returns each one's wall and CPU seconds, in order; ``done(index, seconds)`` is called
    as each succeeds, so a later failure loses no one's time. A command starts once the
    commands ``after[index]`` (earlier ones) have succeeded, and only if ``admit(index)``:
    once it says no, no command starts (the stop rule) and those not started have None.
    With more than one job each command's output goes to its log file and, line by line
    and prefixed, to the terminal. After a failure no new command starts; the error names
    it and ends with its log's last lines."""
    after = after or {}
    if any(not 0 <= i < index for index, before in after.items() for i in before):
      raise ValueError(f"Runner.all: after={dict(after)!r} must name earlier commands")
    costs: list[dict[str, float] | None] = [None for _ in commands]
    if self.in_process or self.jobs == 1:
      for index, (entry_point, args, _) in enumerate(commands):
        if not admit(index):
          break
        costs[index] = self(entry_point, args)
        done(index, costs[index])
      return costs
    waiting, running, succeeded = list(enumerate(commands)), {}, set()
    failure, admitted = None, True
    while waiting or running:
      while (waiting and len(running) < self.jobs and failure is None and admitted
             and set(after.get(waiting[0][0], ())) <= succeeded):
        if not admit(waiting[0][0]):
          admitted = False
          break
        index, (entry_point, args, log) = waiting.pop(0)
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f"experiment: {entry_point} {' '.join(args)} (output in {log})", flush=True)
        process = subprocess.Popen([sys.executable, "-m", f"meshbayes.{entry_point}", *args],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        copier = threading.Thread(target=_copy_output, args=(process.stdout, log, log.stem))
        copier.start()
        running[process.pid] = (index, process, copier, time.perf_counter())
      if not running:
        break
      pid, status, usage = os.wait4(-1, 0)  # this child's own CPU time
      if pid not in running:
        continue
      index, process, copier, started = running.pop(pid)
      process.returncode = os.waitstatus_to_exitcode(status)
      copier.join()
      costs[index] = {"wall_seconds": time.perf_counter() - started,
                      "cpu_seconds": usage.ru_utime + usage.ru_stime}
      if not process.returncode:
        succeeded.add(index)
        done(index, costs[index])
      elif failure is None:
        entry_point, args, log = commands[index]
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-5:])
        failure = (f"meshbayes.{entry_point} failed (status {process.returncode}): "
                   f"{' '.join(args)}; the end of {log}:\n{tail}")
    if failure is not None:
      raise RuntimeError(failure)
    return costs


# Progress bars' redraws (tqdm), kept in the log but not echoed.
_PROGRESS_BAR = re.compile(r"\d+it \[|it/s\]|s/it\]")


def _copy_output(stream: Any, log: Path, name: str) -> None:
  """Writes a command's output to its log and echoes its lines, but for progress bars'
  redraws and the blank lines of their erasing, prefixed with ``[name]``."""
  with stream, open(log, "w") as out:
    for line in stream:
      out.write(line)
      out.flush()
      if line.strip() and not _PROGRESS_BAR.search(line):
        print(f"[{name}] {line.rstrip()}", flush=True)


class Experiment:
  """The runs and evaluations of one budget under ``out``, in the stages of
  ``schedule.stages`` under its stop rule (``stopped``: it has refused a command)."""

  def __init__(self, budget: Budget, out: Path, runner: Runner, bindings: Sequence[str] = ()):
    self.budget, self.out, self.run = budget, out, runner
    self.bindings = [*budget.bindings, *bindings]
    self.costs_path = out / "costs.json"
    self.stopped = False

  def _admit(self, index: int) -> bool:
    """The stop rule: whether a command may start (``Budget.cpu_hours``)."""
    del index
    if self.budget.cpu_hours is None or self.stopped:
      return not self.stopped
    spent = schedule.spent_cpu_hours(read_json(self.costs_path))
    if spent >= self.budget.cpu_hours:
      self.stopped = True
      print(f"experiment: stop rule: {spent:.2f} CPU-hours logged of the budget's "
            f"{self.budget.cpu_hours:g}: no command starts", flush=True)
    return not self.stopped

  def _gin(self, *bindings: str) -> list[str]:
    return [f"--gin.{b}" for b in (*self.bindings, *bindings)]

  def _run_all(self, commands: dict[str, tuple[str, list[str]]],
               run_dirs: dict[str, Path] | None = None,
               after: dict[str, str] | None = None) -> None:
    """Runs ``{name: (entry point, args)}`` (``runner.jobs`` at a time, each writing to
    ``OUT/logs/<name>.log``; ``after``: ``{name: the command it waits for}``, where that
    one is among them; under the stop rule) and adds each one's time to ``costs.json``
    under its name (a resumed command adds to its earlier time), as each one finishes. A
    training run of ``run_dirs`` records instead its own account of every attempt, killed
    ones included (``meshbayes.training.compute_log``)."""
    names, run_dirs = list(commands), run_dirs or {}
    waits = {names.index(name): [names.index(first)]
             for name, first in (after or {}).items() if name in names and first in names}

    def record(index: int, cost: dict[str, float]) -> None:
      costs, name = read_json(self.costs_path), names[index]
      previous = costs.get(name, {})
      costs[name] = (compute_log.total(run_dirs[name]) if name in run_dirs else {}) or {
          k: previous.get(k, 0.0) + v for k, v in cost.items()}
      write_json(self.costs_path, costs)

    self.run.all([(entry_point, args, self.out / "logs" / f"{name.replace(' ', '_')}.log")
                  for name, (entry_point, args) in commands.items()], record, self._admit,
                 waits)

  def _train_args(self, gin_file: str, run_dir: Path, *bindings: str) -> list[str]:
    budget = self.budget
    return [f"--gin_file={gin_file}", *self._gin(
        f"MODEL_DIR='{run_dir}'", f"TRAIN_STEPS={budget.train_steps}",
        f"run_configs.EvaluationConfig.period={budget.eval_period}",
        f"run_configs.CheckpointConfig.period={budget.eval_period}",
        "run_configs.CheckpointConfig.keep=None",
        f"train.log_period={min(budget.eval_period, 50)}",
        *([f"run_configs.EvaluationConfig.patience={budget.patience}"] if budget.patience else []),
        *bindings)]

  def _eval_args(self, run_dir: Path, result_dir: Path, *bindings: str) -> list[str]:
    budget = self.budget
    return ["--gin_file=runs/eval.gin", f"--gin_file={budget.task_gin}", *self._gin(
        f"MODEL_DIR='{run_dir}'", "BATCH_SIZE=64",
        f"evaluation.PredictiveConfig.num_samples={budget.num_samples}",
        f"evaluation.ReportConfig.output_dir='{result_dir}'",
        f"evaluation.ReportConfig.bootstrap_resamples={budget.bootstrap_resamples}", *bindings)]

  def _finished(self, run_dir: Path) -> bool:
    return finished(run_dir, self.budget.train_steps)

  def reuse(self, name: str, run_dir: Path) -> None:
    """Takes ``run_dir``, a finished run of run ``name``'s recipe and seed trained
    elsewhere (the tuning grid's chosen run), as that run: copies it into ``OUT/runs/``
    and, from its experiment's ``costs.json``, its training time. Checked: ``name`` is a
    run of this budget, ``run_dir`` finished its steps with that run's seed; that it was
    trained from ``name``'s recipe is the caller's word."""
    if name not in self.budget.runs:
      raise ValueError(f"--reuse {name}={run_dir}: {name!r} must be one of "
                       f"{', '.join(self.budget.runs)}")
    target = self.out / "runs" / name
    if self._finished(target):
      return
    seed = self.budget.runs[name][1]
    config = run_dir / "config.gin"
    if (not self._finished(run_dir) or not config.is_file()
        or f"SEED = {seed}\n" not in config.read_text()):
      raise ValueError(f"--reuse {name}={run_dir}: must be a run trained to "
                       f"{self.budget.train_steps} steps (or stopped early) with SEED = {seed} "
                       f"({config})")
    shutil.copytree(run_dir, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
        "RUN_LOCK", "eval_validation"))
    # A grid's run is OUT/tuning/<method>/<value>; its time is in OUT/costs.json.
    tuning_costs = read_json(run_dir.parents[2] / "costs.json") if len(run_dir.parents) > 2 else {}
    spent = tuning_costs.get(f"tune {run_dir.parent.name} {run_dir.name}")
    if spent:
      costs = read_json(self.costs_path)
      costs[name] = spent
      write_json(self.costs_path, costs)
    print(f"experiment: run {name} is {run_dir} (copied)", flush=True)

  def _tuned(self, recipe: str) -> list[str]:
    """The bindings of the setting ``recipe``'s tuning grid chose (``Budget.tuned``)."""
    if recipe not in self.budget.tuned:
      return []
    path = self.out / f"tuning_{recipe}.json"
    if not path.is_file():
      raise ValueError(f"{recipe}'s runs take its tuning grid's choice (Budget.tuned), and "
                       f"{path} is missing: run --tune={recipe} with this --out first "
                       "(docs/experiment.md)")
    return [f"{binding}={value}" for binding, value in read_json(path)["chosen"].items()]

  def train(self, runs: Sequence[str] | None = None) -> None:
    """Trains ``runs`` (default: every run of the budget), in that order, to
    ``train_steps``, resuming or skipping finished ones; a run that reads another
    (``plan.source_runs``) is given its directory and starts after it."""
    self._run_all(*self._training(self.budget.runs if runs is None else runs))

  def _training(self, runs: Sequence[str]) -> tuple[dict[str, tuple[str, list[str]]],
                                                    dict[str, Path], dict[str, str]]:
    """``_run_all``'s commands, run directories and waits of training ``runs`` (those of
    the budget, in the order given; finished ones left out)."""
    runs = [name for name in runs if name in self.budget.runs]
    sources = plan.source_runs(self.budget)
    commands = {}
    for name in runs:
      gin_file, seed = self.budget.runs[name]
      if not self._finished(self.out / "runs" / name):
        commands[name] = ("train", self._train_args(
            gin_file, self.out / "runs" / name, f"SEED={seed}",
            *self._tuned(plan.recipe_of(name)),
            *([f"{recipes.SOURCE_RUN_MACRO}='{self.out / 'runs' / sources[name]}'"]
              if name in sources else [])))
    return (commands, {name: self.out / "runs" / name for name in runs},
            {run: source for run, source in sources.items() if run in runs})

  def validation_dir(self, run: str) -> Path:
    """Where ``validate`` writes run ``run``'s evaluation, ``OUT/eval/validation/<run>_best``
    (its ``metrics.json`` there once it has run)."""
    return self.out / "eval" / "validation" / f"{run}_best"

  def validate(self, runs: Sequence[str], then_train: Sequence[str] = ()) -> None:
    """Evaluates each of ``runs`` (finished runs of the budget; those evaluated already are
    not again) at its best checkpoint on the validation split, as a tuning grid scores its
    runs (teacher-forced: every predictive's token NLL and ECE) and decoded by
    ``Budget.decode_method`` (BLEU), without temperature scaling, OOD sets, beam-level
    measures or equivalence samples; ``Budget.eval_batches`` batches (None: the whole
    split). Then trains ``then_train``, in the same batch of commands (``runner.jobs`` at a
    time, under the stop rule), so no core waits for a batch's last command."""
    budget = self.budget
    commands = {f"validation {run}": ("eval", self._eval_args(
        self.out / "runs" / run, self.validation_dir(run), "evaluate.split='validation'",
        f"evaluate.checkpoint_step={best_step(self.out / 'runs' / run)}",
        f"data.TaskData.max_eval_batches={budget.eval_batches}",
        # The pool's bindings: decoding and scoring only.
        f"evaluation.DecodeConfig.method='{budget.decode_method}'", *plan.POOL_BINDINGS))
        for run in runs
        if run in budget.runs and self._finished(self.out / "runs" / run)
        and not (self.validation_dir(run) / "metrics.json").is_file()}
    training, run_dirs, after = self._training(then_train)
    self._run_all({**commands, **training}, run_dirs, after)

  def _evaluation_args(self, spec: dict[str, Any], result_dir: Path, split: str) -> list[str]:
    budget = self.budget
    return self._eval_args(
        self.out / "runs" / spec["run"], result_dir, f"evaluate.split='{split}'",
        f"evaluate.checkpoint_step={spec['step']}",
        # None (ALL_TEST_PAIRS): no limit, every test pair.
        f"data.TaskData.max_eval_batches={budget.eval_batches}",
        f"evaluation.OodConfig.max_examples={budget.ood_examples}",
        f"evaluation.OodConfig.beam_sets={list(budget.ood_beam_sets)}",
        f"evaluation.DecodeConfig.method='{budget.decode_method}'",
        f"evaluation.PredictiveConfig.beam_measures={budget.beam_measures}",
        f"evaluation.PredictiveConfig.equivalence_samples={budget.equivalence_samples}",
        *spec["extra"])

  def _run_evaluations(self, commands: dict[str, tuple[str, list[str]]],
                       averages: set[str]) -> None:
    # The model averages first (S passes per decode): with two jobs, the point estimates
    # fill in beside them instead of leaving one to run alone at the end.
    self._run_all(dict(sorted(commands.items(), key=lambda item: item[0] not in averages)))

  def evaluate(self, keys: Sequence[str] | None = None) -> dict[str, Path]:
    """Evaluates every method at each checkpoint (each result directory once; ``keys``:
    only these of ``plan.evaluation_keys``, their runs trained); returns each
    evaluation's result directory (``plan.result_dirs``)."""
    results = result_dirs(self.budget, self.out, keys)
    commands, averages = {}, set()
    for key, spec in evaluations(self.budget, self.out, keys).items():
      result_dir = results[key]
      if result_dir.name == key.replace("@", "_") and not (result_dir / "metrics.json").is_file():
        if _averages(spec["method"]):
          averages.add(f"eval {key}")
        commands[f"eval {key}"] = ("eval", self._evaluation_args(spec, result_dir, "test"))
    self._run_evaluations(commands, averages)
    return results

  def evaluate_pool(self, keys: Sequence[str] | None = None) -> dict[str, Path]:
    """Evaluates each run of ``Budget.pool_methods`` on ``Budget.pool_split`` (``keys``:
    only these of ``plan.pool_keys``); returns each one's result directory."""
    results = plan.pool_result_dirs(self.budget, self.out)
    commands, averages = {}, set()
    for key, spec in plan.pool_evaluations(self.budget, self.out, keys).items():
      if not (results[key] / "metrics.json").is_file():
        if _averages(spec["method"]):
          averages.add(f"pool {key}")
        commands[f"pool {key}"] = ("eval", self._evaluation_args(
            spec, results[key], self.budget.pool_split))
    self._run_evaluations(commands, averages)
    return {key: results[key] for key in (results if keys is None else keys)}

  def run_stages(self) -> list[schedule.Stage]:
    """Trains and evaluates every stage of ``schedule.stages`` in order (what is done is
    not redone) until the stop rule refuses a command; returns what is left of each
    stage from there (empty: everything has run)."""
    all_stages = schedule.stages(self.budget)
    for index, stage in enumerate(all_stages):
      self.train(stage.runs)
      if not self.stopped:
        self.evaluate(stage.evaluations)
      if not self.stopped:
        self.evaluate_pool(stage.pool)
      if self.stopped:
        left = [self._left(s) for s in all_stages[index:]]
        return [s for s in left if not s.empty]
    return []

  def _left(self, stage: schedule.Stage) -> schedule.Stage:
    """What of ``stage`` has not run: runs not finished, evaluations without results."""
    trained = {run for run in self.budget.runs if self._finished(self.out / "runs" / run)}
    keys = plan.evaluation_keys(self.budget)
    needs = lambda key: {r for r in self.budget.runs if r == keys[key][1] or (
        recipes.get(keys[key][0]).combines_runs and plan.recipe_of(r) == keys[key][1])}
    ready = [key for key in stage.evaluations if needs(key) <= trained]
    tests = result_dirs(self.budget, self.out, ready)
    pools = plan.pool_result_dirs(self.budget, self.out)
    return dataclasses.replace(
        stage, runs=tuple(run for run in stage.runs if run not in trained),
        evaluations=tuple(k for k in stage.evaluations
                          if k not in tests or not (tests[k] / "metrics.json").is_file()),
        pool=tuple(k for k in stage.pool if not (pools[k] / "metrics.json").is_file()))

  def tune(self, method: str, settings: Sequence[dict[str, str]]) -> Path:
    """Trains ``method``'s recipe at each of ``settings`` (``{binding: value}``,
    ``plan.tuning_grid``) and evaluates each run at its best validation
    checkpoint on the whole validation split (teacher-forced: the headline predictive's
    token NLL and ECE); writes and returns ``OUT/tuning_<method>.md``, the lowest NLL
    marked chosen, and ``OUT/tuning_<method>.json`` (the chosen setting, each run's NLL:
    what ``Budget.tuned`` reads)."""
    if method not in RECIPES:
      raise ValueError(f"tune: method={method!r} must be one of {', '.join(RECIPES)} (MC "
                       "dropout and the ensemble take the deterministic run's settings)")
    budget = self.budget
    labels = [setting_label(setting) for setting in settings]
    run_dirs = {label: self.out / "tuning" / method / label for label in labels}
    names = {label: f"tune {method} {label}" for label in labels}
    self._run_all({names[label]: ("train", self._train_args(
        RECIPES[method], run_dirs[label], *(f"{k}={v}" for k, v in setting.items())))
        for label, setting in zip(labels, settings) if not self._finished(run_dirs[label])},
        {names[label]: run_dirs[label] for label in labels})
    self._run_all({f"{names[label]} eval": ("eval", self._eval_args(
        run_dir, run_dir / "eval_validation", "evaluate.split='validation'",
        f"evaluate.checkpoint_step={best_step(run_dir)}",
        "evaluation.DecodeConfig.enabled=False", "data.TaskData.max_eval_batches=None"))
        for label, run_dir in run_dirs.items()
        if not (run_dir / "eval_validation" / "metrics.json").is_file()})
    headlines = {label: _headline(run_dirs[label]) for label in labels}
    chosen = min(labels, key=lambda label: headlines[label]["nll"])
    write_json(self.out / f"tuning_{method}.json", {
        "method": method, "chosen": settings[labels.index(chosen)], "label": chosen,
        "validation_nll": {label: headlines[label]["nll"] for label in labels}})
    table = self.out / f"tuning_{method}.md"
    table.write_text(self._tuning_table(method, settings, labels, run_dirs, names, headlines,
                                        chosen))
    return table

  def _tuning_table(self, method: str, settings: Sequence[dict[str, str]],
                    labels: Sequence[str], run_dirs: dict[str, Path],
                    names: dict[str, str], headlines: dict[str, dict[str, float]],
                    chosen: str) -> str:
    costs, budget = read_json(self.costs_path), self.budget
    knobs = list(settings[0])
    rows = ["| " + " | ".join(k.rsplit(".", 1)[-1] for k in knobs) + " | validation NLL | "
            "validation token ECE (%) | best step (posterior-mean NLL) | stopped at | "
            "posterior-mean NLL + KL/D | largest change of a median stddev, last tenth | "
            "CPU minutes |", "|---" * (len(knobs) + 7) + "|"]
    spent = 0.0
    for setting, label in zip(settings, labels):
      run_dir, headline = run_dirs[label], headlines[label]
      curve, best = dict(plan.validation_curve(run_dir)), best_step(run_dir)
      end = convergence(run_dir)
      stop = stopped_at(run_dir)
      moved = (max(end["groups"].items(), key=lambda item: abs(item[1]["change"]))
               if end else None)
      cpu = sum(costs.get(key, {}).get("cpu_seconds", 0.0)
                for key in (names[label], f"{names[label]} eval"))
      spent += cpu
      mark = " **(chosen)**" if label == chosen else ""
      rows.append("| " + " | ".join(setting[k] for k in knobs)
                  + f" | {headline['nll']:.4f}{mark} | {100 * headline['ece']:.2f} | "
                  f"{best} ({curve[best]:.4f}) | "
                  + f"{budget.stopped(stop)} |"
                  + (f" {end['neg_elbo']:.4f} | {100 * moved[1]['change']:+.1f}% ({moved[0]}) | "
                     if end else " - | - | ")
                  + f"{cpu / 60:.0f} |")
    runs = f"{len(settings)} run{'s' if len(settings) > 1 else ''}"
    return (f"{method}, {runs}, {budget.stopping}; chosen: {chosen} (lowest NLL on the whole "
            "validation split, each run at its best checkpoint).\n\n" + "\n".join(rows)
            + f"\n\nCPU time of the grid (training and validation evaluations): "
            f"{spent / 3600:.2f} CPU-hours.\n")


def _averages(method: str) -> bool:
  """Whether ``method`` predicts with a model average (S passes per decode)."""
  return any(p == "model_average" for p, _ in recipes.get(method).columns)


def _headline(run_dir: Path) -> dict[str, float]:
  """A tuning run's validation figures: its headline predictive's token calibration."""
  result = read_json(run_dir / "eval_validation" / "metrics.json")
  return result["token_calibration"][result["predictives"][0]]


def grid_knobs(grid: Sequence[str]) -> list[tuple[str, list[str]]]:
  """``(binding, values)`` of each ``NAME=V1,V2,...`` of a tuning grid.

  Raises:
    ValueError: no knob, or one without ``=``.
  """
  bad = [g for g in grid if "=" not in g] or ([] if grid else ["(none)"])
  if bad:
    raise ValueError(f"--tune needs --grid=NAME=V1,V2,..., not --grid={bad[0]!r}")
  return [(g.split("=", 1)[0], g.split("=", 1)[1].split(",")) for g in grid]


def past_the_edge(knobs: Sequence[tuple[str, Sequence[str]]], chosen: dict[str, str],
                  value: str) -> list[tuple[str, list[str]]] | None:
  """The grid of one knob with ``value`` added when ``chosen`` (the grid's choice) is its
  last value, its edge; None when the choice is inside the grid (or ``value`` in it).

  >>> past_the_edge([("lr", ["6e-3", "1.2e-2"])], {"lr": "1.2e-2"}, "2.4e-2")
  [('lr', ['6e-3', '1.2e-2', '2.4e-2'])]
  """
  if len(knobs) != 1:
    raise ValueError(f"--past_edge={value} needs a grid of one knob, not {len(knobs)}")
  (binding, values), = knobs
  if chosen[binding] != values[-1] or value in values:
    return None
  return [(binding, [*values, value])]


def _check_preset(out: Path, preset: str) -> None:
  """Refuses to resume in ``out`` an experiment of another preset (its runs would be taken
  as this one's)."""
  recorded = read_json(out / "budget.json").get("preset", preset)
  if recorded != preset:
    raise ValueError(f"--preset={preset}: {out} holds an experiment of --preset={recorded} "
                     "(budget.json); give another --out")


def execute(experiment: Experiment, preset: str, tune: str | None = None,
            knobs: Sequence[tuple[str, Sequence[str]]] = (), trials: int | None = None,
            reuse: Sequence[str] = (), publish: Path | None = None,
            past_edge: str | None = None) -> int:
  """Runs one command line's experiment: records its budget (``OUT/budget.json``), then
  tunes ``tune`` over ``knobs`` (``plan.tuning_grid``; with ``past_edge``, once more with
  it added when the grid chose its edge: ``past_the_edge``) and prints the tuning table,
  or takes each ``RUN=DIR`` of ``reuse``, trains and evaluates stage by stage
  (``schedule``), writes and prints the report and copies it and its figures to
  ``publish``. When the stop rule leaves something not run it is recorded
  (``OUT/not_run.json``); the report then covers what ran when only what
  ``Budget.given_up_first`` names is left, and there is none otherwise. The
  ``estimator_quality`` preset instead writes and prints its table
  (``meshbayes.experiments.estimator_quality``), over what ran when the stop rule cut it.
  Returns the exit status: 1 when a command or a ``reuse`` failed (its one-line error
  printed) or the stop rule left what the report needs."""
  out, budget = experiment.out, experiment.budget
  try:
    _check_preset(out, preset)
  except ValueError as error:
    print(f"experiment: error: {error}", file=sys.stderr)
    return 1
  write_json(out / "budget.json", {"preset": preset, **dataclasses.asdict(budget),
                                   "bindings": experiment.bindings})
  try:
    if tune:
      table = experiment.tune(tune, plan.tuning_grid(knobs, trials))
      wider = past_edge and past_the_edge(
          knobs, read_json(out / f"tuning_{tune}.json")["chosen"], past_edge)
      if wider:
        table = experiment.tune(tune, plan.tuning_grid(wider, trials))
      print(table.read_text())
      return 0
    for reused in reuse:
      name, _, run_dir = reused.partition("=")
      experiment.reuse(name, Path(run_dir))
    if preset == estimator_quality.PRESET:
      print(estimator_quality.run(experiment).read_text())
      return 0
    left = experiment.run_stages()
  except (RuntimeError, ValueError) as error:  # the command printed its own one-line error
    print(f"experiment: error: {error}", file=sys.stderr)
    return 1
  (out / schedule.NOT_RUN).unlink(missing_ok=True)
  if left:
    record = schedule.write_not_run(out, budget, left)
    print(f"experiment: not run (the stop rule; {out / schedule.NOT_RUN}), given up first "
          f"first: {', '.join(stage['name'] for stage in record['not_run'])}", flush=True)
    if not all(stage.given_up for stage in left):
      print(f"experiment: error: the stop rule left stages the report needs: "
            f"{', '.join(s.name for s in left if not s.given_up)}", file=sys.stderr)
      return 1
    budget = schedule.reported(budget, out)
  results = result_dirs(budget, out)
  from meshbayes.experiments import report as experiment_report  # matplotlib: only here

  pools = plan.pool_result_dirs(budget, out) if budget.pool_split else None
  report = experiment_report.write(out, budget, results, pools)
  print(report.read_text())
  if preset == "demo":  # one seed at a short budget: the table invites a verdict it cannot give
    print(demo_caveat(budget))
  if publish:
    publish.mkdir(parents=True, exist_ok=True)
    for path in out.glob("report*"):
      shutil.copy(path, publish / path.name)
    (publish / "figures").mkdir(exist_ok=True)
    for path in (out / "figures").glob("*.png"):  # where report.md links them
      shutil.copy(path, publish / "figures" / path.name)
  return 0
