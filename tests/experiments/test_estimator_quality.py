"""Issue 70's quality experiment (``meshbayes.experiments.estimator_quality``, the
``estimator_quality`` preset of ``python -m meshbayes.tools.experiment``): its arms, the
order of its runs, the validation evaluations, the table of paired differences and the
rule's verdict, with a runner that runs nothing; and its whole command path at toy size."""

import dataclasses
import json
import math
import re
import statistics
from pathlib import Path

import pytest
from scipy import stats

from meshbayes.evaluation import methods as predictive_methods
from meshbayes.experiments import estimator_quality as quality
from meshbayes.experiments import plan
from meshbayes.experiments import run as experiment_run
from meshbayes.tools import experiment
from tests.experiments.fake_runs import gin_bindings, write_trained_run
from tests.experiments.recipe_configs import trained_config

GROUPED = "Estimators.{} = 'grouped_reparameterization'"
# Validation NLL, token ECE and BLEU of each arm at seeds 100, 101, 102 (the fake runs').
FIGURES = {"bayesian": ([2.50, 2.52, 2.54], [0.010, 0.012, 0.011], [20.0, 21.0, 22.0]),
           "bayesian_grouped": ([2.51, 2.54, 2.55], [0.013, 0.012, 0.015], [19.5, 21.0, 21.0]),
           "bayesian_grouped_k1": ([2.53, 2.53, 2.58], [0.020, 0.010, 0.012],
                                   [19.0, 20.0, 21.5])}


def test_the_arms_are_the_bayesian_recipe_with_the_grouped_estimator(tmp_path):
  """Each arm's gin file changes only the estimators and the groups; a run of it is told
  by its config.gin and evaluated as its own method, as the Bayesian layers are."""
  bound = lambda recipe: set(trained_config(plan.RECIPES[recipe]).splitlines())
  bayesian = bound("bayesian")
  grouped = {"# Parameters for Estimators:",
             *(GROUPED.format(c) for c in ("attention", "cross_attention", "mlp"))}
  assert bound("bayesian_grouped") - bayesian == grouped | {
      "TransformerConfig.num_weight_groups = 2"}
  assert bound("bayesian_grouped_k1") - bayesian == grouped | {
      "TransformerConfig.num_weight_groups = 1"}
  model = type("Model", (), {"is_bayesian": True})()
  for recipe in quality.ARMS:
    (tmp_path / recipe).mkdir()
    (tmp_path / recipe / "config.gin").write_text(trained_config(plan.RECIPES[recipe]))
    assert predictive_methods.resolve(None, model, {}, tmp_path / recipe) == recipe
  with pytest.raises(ValueError) as refused:
    predictive_methods.resolve("bayesian", model, {}, tmp_path / "bayesian_grouped")
  assert str(refused.value) == (
      "evaluate: method='bayesian' predicts with Bayesian-layers runs (KL weight 0.1, with "
      f"weight noise); {tmp_path / 'bayesian_grouped'} is a Bayesian-layers run (KL weight 0.1, "
      "with weight noise, grouped_reparameterization k=2): use bayesian_grouped or leave "
      "method unset")
  # Grouped in the feed-forward layers only: no recipe's.
  (tmp_path / "mlp_only").mkdir()
  (tmp_path / "mlp_only" / "config.gin").write_text(
      f"KLWeight.value = 0.1\n{GROUPED.format('mlp')}\nTransformerConfig.num_weight_groups = 2\n")
  assert predictive_methods.run_record(model, {}, tmp_path / "mlp_only").methods() == ()
  # Not in a budget unless asked for.
  assert not set(quality.ARMS[1:]) & set(plan.Budget(train_steps=4, eval_period=2).methods)


class _Planned:
  """A runner that runs nothing: each command costs 0.1 CPU-hours (360 s of wall) and leaves
  what it would: a finished run whose best validation step is 500, an evaluation's
  metrics.json with the run's ``FIGURES``. Records each command's name and arguments."""

  def __init__(self):
    self.names, self.args = [], {}

  def all(self, commands, done, admit=lambda index: True, after=None):
    del after
    for index, (entry_point, args, log) in enumerate(commands):
      if not admit(index):
        break
      name = re.sub(r"^validation_", "validation ", log.stem)
      self.names.append(name)
      self.args[name] = args
      bound = gin_bindings(args)
      if entry_point == "train":
        write_trained_run(bound)
      else:
        result = Path(bound["evaluation.ReportConfig.output_dir"].strip("'"))
        run = result.name.removesuffix("_best")
        seed = int(run.rsplit("_seed", 1)[1]) if "_seed" in run else 0
        nll, ece, bleu = (values[seed] for values in FIGURES[plan.recipe_of(run)])
        result.mkdir(parents=True)
        (result / "metrics.json").write_text(json.dumps({
            "step": 500, "predictives": ["model_average", "posterior_mean"], "bleu": bleu,
            "token_calibration": {"model_average": {"nll": nll, "ece": ece},
                                  "posterior_mean": {"nll": 9.0, "ece": 0.5}}}))
      done(index, {"wall_seconds": 360.0, "cpu_seconds": 360.0})
    return []


def _planned(tmp_path, **changes):
  budget = dataclasses.replace(experiment_run.PRESETS[quality.PRESET], **changes)
  return experiment_run.Experiment(budget, tmp_path, _Planned())


def test_the_runs_go_in_seed_order_each_seed_evaluated_on_validation_before_the_next_trains(
    tmp_path, capsys):
  run = _planned(tmp_path)
  assert experiment_run.execute(run, quality.PRESET) == 0
  seeds = ("", "_seed1", "_seed2")
  trains = [[f"{arm}{seed}" for arm in quality.ARMS] for seed in seeds]
  validations = [[f"validation {name}" for name in names] for names in trains]
  assert run.run.names == [*trains[0], *validations[0], *trains[1], *validations[1],
                           *trains[2], *validations[2]]
  args = run.run.args
  assert "--gin.SEED=101" in args["bayesian_grouped_k1_seed1"]
  assert "--gin_file=uncertainty/bayesian_grouped.gin" in args["bayesian_grouped_seed2"]
  for common in ("--gin.TRAIN_STEPS=12000", "--gin.run_configs.EvaluationConfig.patience=4",
                 "--gin.run_configs.EvaluationConfig.period=250"):
    assert common in args["bayesian_grouped"]
  validation = args["validation bayesian_grouped_seed1"]
  result = tmp_path / "eval" / "validation" / "bayesian_grouped_seed1_best"
  for binding in ("evaluate.split='validation'", "evaluate.checkpoint_step=500",
                  "data.TaskData.max_eval_batches=None", "evaluation.DecodeConfig.method='greedy'",
                  f"MODEL_DIR='{tmp_path / 'runs' / 'bayesian_grouped_seed1'}'",
                  f"evaluation.ReportConfig.output_dir='{result}'", *plan.POOL_BINDINGS):
    assert f"--gin.{binding}" in validation
  assert not any("temperature_scaling" in a for a in validation)
  assert capsys.readouterr().out.startswith("bayesian, bayesian_grouped, bayesian_grouped_k1: "
                                            "each run at its best checkpoint")
  # Resumed, nothing is done again.
  again = experiment_run.Experiment(run.budget, tmp_path, _Planned())
  assert experiment_run.execute(again, quality.PRESET) == 0
  assert again.run.names == []


def _t_interval(differences):
  mean = statistics.mean(differences)
  half = stats.t.ppf(0.975, len(differences) - 1) * statistics.stdev(differences) / math.sqrt(
      len(differences))
  return mean, mean - half, mean + half


def test_the_table_gives_each_runs_figures_their_paired_differences_and_the_verdict(tmp_path):
  run = _planned(tmp_path)
  table = quality.run(run).read_text()
  assert ("| arm | seed | validation NLL (nats) | token ECE (%) | BLEU | best step | stopped at "
          "| CPU-hours |\n|---|---|---|---|---|---|---|---|\n| bayesian | 100 | 2.5000 | 1.00 | "
          "20.00 | 500 | cap (12000) | 0.20 |\n") in table
  assert "| bayesian_grouped | 101 | 2.5400 | 1.20 | 21.00 | 500 | cap (12000) | 0.20 |" in table
  for (minuend, subtrahend), in_table in zip(quality.PAIRS, (
      "| bayesian_grouped - bayesian | +0.0133 [-0.0010, +0.0277] | +0.23 [-0.28, +0.75] | "
      "-0.50 [-1.74, +0.74] |",
      "| bayesian_grouped_k1 - bayesian | +0.0267 [-0.0113, +0.0646] | +0.30 [-1.25, +1.85] | "
      "-0.83 [-1.55, -0.12] |",
      "| bayesian_grouped - bayesian_grouped_k1 | -0.0133 [-0.0650, +0.0384] |")):
    assert in_table in table
    for index, (measure, *_) in enumerate(quality.MEASURES):
      mean, low, high = _t_interval([a - b for a, b in zip(FIGURES[minuend][index],
                                                           FIGURES[subtrahend][index])])
      recorded = plan.read_json(tmp_path / quality.RECORD)["differences"][
          f"{minuend} - {subtrahend}"][measure]
      assert (recorded["estimate"], recorded["low"], recorded["high"]) == pytest.approx(
          (mean, low, high), abs=1e-12)
  upper = _t_interval([0.01, 0.02, 0.01])[2]  # grouped - bayesian, NLL: 0.0277 > 0.02
  assert ("Verdict: bayesian_grouped ships as an option, with its measured cost in quality: "
          "the upper end of its NLL difference to bayesian, +0.0277, is > +0.02 nats.") in table
  assert "CPU-hours logged (training and evaluations, wall time): 1.80 of the budget's 8." in table
  # The verdict flips with the margin, at the upper end.
  found = quality.records(tmp_path, run.budget)
  assert quality.compare(found, margin=upper + 1e-9)["verdict"]["adopted"] is True
  assert quality.compare(found, margin=upper - 1e-9)["verdict"]["adopted"] is False
  adopted = quality.table(run.budget, found, quality.compare(found, 0.03), 1.8)
  assert ("Verdict: bayesian_grouped becomes gpu.gin's estimator: the upper end of its NLL "
          "difference to bayesian, +0.0277, is <= +0.03 nats.") in adopted
  with pytest.raises(ValueError, match=r"^estimator_quality: margin=nan must be a finite "):
    quality.compare(found, margin=float("nan"))


def test_a_cut_by_the_stop_rule_leaves_whole_seeds_and_the_table_over_them(tmp_path, capsys):
  """12 commands of 0.1 CPU-hours fit a budget of 1.2: seed 100's and 101's runs and their
  evaluations; seed 102 is not trained, and the comparison is over 100 and 101."""
  run = _planned(tmp_path, cpu_hours=1.2)
  assert experiment_run.execute(run, quality.PRESET) == 0
  assert run.run.names[-1] == "validation bayesian_grouped_k1_seed1" and len(run.run.names) == 12
  printed = capsys.readouterr().out
  assert "experiment: stop rule: 1.20 CPU-hours logged of the budget's 1.2" in printed
  assert ("Not evaluated (not run yet, or the stop rule): bayesian_seed2, "
          "bayesian_grouped_seed2, bayesian_grouped_k1_seed2.") in printed
  mean, low, high = _t_interval([0.01, 0.02])
  assert (f"| bayesian_grouped - bayesian | {mean:+.4f} [{low:+.4f}, {high:+.4f}] |" in printed
          and "Paired differences over seeds 100, 101: mean [95% Student-t interval, 1 df]."
          in printed)
  # One seed: no interval, no verdict.
  (tmp_path / "one").mkdir()
  one = _planned(tmp_path / "one", cpu_hours=0.6)
  assert experiment_run.execute(one, quality.PRESET) == 0
  assert ("Verdict: not decided: 1 seed(s) with every arm evaluated; an interval needs 2."
          in capsys.readouterr().out)
  assert plan.read_json(tmp_path / "one" / quality.RECORD)["verdict"]["decided"] is False


def _toy_quality(data_dir, out, monkeypatch, *extra):
  """Runs the command of `make estimator-quality` at toy size (4 steps, two seeds); returns
  its record (estimator_quality.json)."""
  toy = experiment_run.PRESETS["toy"]
  monkeypatch.setitem(experiment_run.PRESETS, quality.PRESET, dataclasses.replace(
      experiment_run.PRESETS[quality.PRESET], train_steps=4, eval_period=2, seeds=2,
      num_samples=2, eval_batches=1, bootstrap_resamples=50, bindings=toy.bindings))
  monkeypatch.setenv("MESHBAYES_DATA_DIR", str(data_dir))
  assert experiment.main([f"--preset={quality.PRESET}", f"--out={out}", "--in_process",
                          "--binding=models.TransformerConfig.vocab_size=128", *extra]) == 0
  return plan.read_json(out / quality.RECORD)


def _validation_nll(out, run):
  """The headline predictive's validation NLL its evaluation recorded."""
  result = json.loads((out / "eval" / "validation" / f"{run}_best" / "metrics.json").read_text())
  assert result["method"] == plan.recipe_of(run) and result["split"] == "validation"
  return result["token_calibration"]["model_average"]["nll"]


@pytest.mark.integration
def test_the_grouped_arm_is_trained_and_scored_on_validation_by_the_command(
    data_dir, tmp_path, monkeypatch, capsys):
  """One run of the grouped arm through the command (the whole path at two seeds and three
  arms: the slow test below): trained with two weight groups, evaluated on the validation
  split at its best checkpoint, its recorded figures in the table."""
  out = tmp_path / "quality"
  recorded = _toy_quality(data_dir, out, monkeypatch, "--methods=bayesian_grouped", "--seeds=1")
  config = (out / "runs" / "bayesian_grouped" / "config.gin").read_text()
  assert "TransformerConfig.num_weight_groups = 2" in config and "SEED = 100" in config
  nll = _validation_nll(out, "bayesian_grouped")
  assert recorded["runs"]["bayesian_grouped"]["nll"] == nll
  table = capsys.readouterr().out
  assert re.search(rf"^\| bayesian_grouped \| 100 \| {nll:.4f} \| \d+\.\d\d \| \d+\.\d\d \| "
                   r"4 \| cap \(4\) \| \d\.\d\d \|$", table, flags=re.M)
  assert "Verdict: not decided: 0 seed(s) with every arm evaluated" in table


@pytest.mark.integration
@pytest.mark.slow
def test_the_command_trains_evaluates_and_tabulates_the_arms_at_toy_size(
    data_dir, tmp_path, monkeypatch, capsys):
  """The whole path of `make estimator-quality` at toy size (three arms, two seeds): the
  table's differences are those of the figures the evaluations recorded."""
  out = tmp_path / "quality"
  recorded = _toy_quality(data_dir, out, monkeypatch)
  config = (out / "runs" / "bayesian_grouped_k1_seed1" / "config.gin").read_text()
  assert "TransformerConfig.num_weight_groups = 1" in config and "SEED = 101" in config
  figures = {name: _validation_nll(out, name) for name in recorded["runs"]}
  assert len(figures) == 6
  difference = recorded["differences"]["bayesian_grouped - bayesian"]["nll"]
  mean, low, high = _t_interval([figures["bayesian_grouped"] - figures["bayesian"],
                                 figures["bayesian_grouped_seed1"] - figures["bayesian_seed1"]])
  assert (difference["estimate"], difference["low"], difference["high"]) == pytest.approx(
      (mean, low, high), abs=1e-9)
  table = capsys.readouterr().out
  assert f"| bayesian_grouped - bayesian | {mean:+.4f} [{low:+.4f}, {high:+.4f}] |" in table
  assert recorded["verdict"]["adopted"] is bool(high <= quality.MARGIN)
