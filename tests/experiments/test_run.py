"""The uncertainty experiment's whole code path at toy size (``meshbayes.experiments.run``
through its command, ``meshbayes.tools.experiment``): every method trained and evaluated on
a fake Tatoeba corpus, at the end and at the best checkpoint, and its report; the runner of
its commands."""

import dataclasses
import io
import json
import re
from pathlib import Path

import pytest

from meshbayes.experiments import plan, schedule
from meshbayes.experiments import run as experiment_run
from meshbayes.tools import experiment
from meshbayes.training import compute_log
from tests.experiments.fake_runs import gin_bindings, write_trained_run

COLUMNS = ("deterministic", "temperature-scaled (T=", "MC dropout", "deep ensemble",
           "Bayesian layers", "Bayesian layers (mean)", "IVON", "IVON (mean)",
           "last-layer Laplace")
OOD_SETS = ("spanish", "technical_english", "targets_as_inputs", "shuffled_words")


def _rising_at_the_end(patch, out, runs):
  """Makes the validation NLL of ``runs`` of the experiment in ``out`` rise at their last
  step, so that their best checkpoint is an earlier one (toy runs improve to the end) and
  is evaluated on its own."""
  measured = plan.validation_curve

  def curve(run_dir):
    points = measured(run_dir)
    if run_dir.parent == out / "runs" and run_dir.name in runs and points:
      points[-1] = (points[-1][0], max(nll for _, nll in points) + 1.0)
    return points

  patch.setattr(plan, "validation_curve", curve)

def _run_toy(data_dir, out, *extra):
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("MESHBAYES_DATA_DIR", str(data_dir))
    args = ["--preset=toy", f"--out={out}", "--in_process",
            "--binding=models.TransformerConfig.vocab_size=128", *extra]
    assert experiment.main(args) == 0
  return out, args

@pytest.fixture
def deterministic_stops_early(tmp_path):
  with pytest.MonkeyPatch.context() as patch:
    _rising_at_the_end(patch, tmp_path, {"deterministic"})
    yield

@pytest.mark.integration
def test_the_map_control_end_to_end_with_early_stopping(data_dir, tmp_path):
  """MAP (the Bayesian layers' recipe without weight noise) beside the deterministic model,
  each run under early stopping (here both reach the cap), MAP at its mean, temperature-scaled
  too. (The KL-weight controls are the Bayesian recipe with one binding changed:
  tests/experiments/test_recipes.py.)"""
  out, _ = _run_toy(data_dir, tmp_path, "--methods=deterministic,map", "--seeds=1",
                    "--patience=3")
  config = (out / "runs" / "map" / "config.gin").read_text()
  assert "EncoderDecoderModel.weight_noise = False" in config
  assert "EvaluationConfig.patience = 3" in config
  the_map = json.loads((out / "eval" / "map_final" / "metrics.json").read_text())
  assert the_map["predictives"] == ["posterior_mean", "posterior_mean_temperature_scaled"]
  assert set(the_map["temperature_fits"]) == {"posterior_mean_temperature_scaled"}
  report = (out / "report.md").read_text()
  header = re.search(r"^\| metric \|.*$", report, flags=re.M)[0]
  for column in ("deterministic", "MAP", "MAP, temperature-scaled (T="):
    assert f"| {column}" in header
  for run in ("deterministic", "map"):
    assert f"| {run} | 4 | **the cap** (4) |" in report
  assert json.loads((out / "report.json").read_text())["stopped_at"] == {
      "deterministic": None, "map": None}
  # A run's training cost is its own account of every attempt (meshbayes.training.compute_log).
  costs = json.loads((out / "costs.json").read_text())
  assert costs["map"] == compute_log.total(out / "runs" / "map") != {}

@pytest.fixture(scope="module")
def toy(data_dir, tmp_path_factory):
  """Every method, two seeds each (the slow tests); the deterministic run's best checkpoint
  is before its last."""
  out = tmp_path_factory.mktemp("experiment")
  with pytest.MonkeyPatch.context() as patch:
    _rising_at_the_end(patch, out, {"deterministic"})
    yield _run_toy(data_dir, out)

@pytest.mark.integration
def test_two_methods_end_to_end_at_both_checkpoints_and_resumed(data_dir, tmp_path,
                                                                deterministic_stops_early):
  """The path of `make demo` and `make experiment` in `make test`: train, evaluate at the
  end and at the best checkpoint, report; a second call redoes nothing. One seed (the
  spread over seeds: the slow tests)."""
  out, args = _run_toy(data_dir, tmp_path, "--methods=deterministic,bayesian", "--seeds=1")
  report = (out / "report.md").read_text()
  tables = re.findall(r"^\| metric \|.*?(?=\n\n)", report, flags=re.S | re.M)
  assert len(tables) == 2
  # The deterministic run is evaluated again at its best step; the Bayesian run's best is
  # its last checkpoint, evaluated once.
  assert json.loads((out / "eval" / "deterministic_best" / "metrics.json").read_text())["step"] == 2
  assert not (out / "eval" / "bayesian_best").exists()
  for table in tables:
    header = table.splitlines()[0]
    for column in ("deterministic", "temperature-scaled (T=", "Bayesian layers",
                   "Bayesian layers (mean)"):
      assert f"| {column}" in header
    assert "IVON" not in header and "MC dropout" not in header
    for ood_set in OOD_SETS:
      assert f"OOD {ood_set}: AUROC / FPR@95 (%) by total uncertainty" in table
    assert re.search(r"\| BLEU \| \d+\.\d\d \[\d+\.\d\d, \d+\.\d\d\] \|", table)
  # Paired differences, error detection, OOD by a measure chosen on held-out inputs.
  assert ("| minus deterministic (a temperature-scaled posterior: minus the temperature-scaled "
          "deterministic model): difference [95% interval] | temperature-scaled (T=") in report
  assert re.search(r"\| BLEU \| \+0\.00 \[\+0\.00, \+0\.00\] within noise \|", report)
  assert "| negative log probability |" in report
  assert "spanish: the measure chosen on the other half" in report
  # The measures fixed in advance, mutual information among them, in the OOD and paired tables.
  assert re.search(r"^\| spanish: mutual information \| - \| \d\.\d{3} \[", report, flags=re.M)
  assert ("| OOD spanish: AUROC by mutual information minus deterministic's by total "
          "uncertainty | ") in report
  assert "over seeds" not in report
  summary = json.loads((out / "report.json").read_text())
  for run in ("deterministic", "bayesian"):
    curve = plan.validation_curve(out / "runs" / run)
    assert summary["best_steps"][run] == min(curve, key=lambda p: p[1])[0]
  assert set(summary["posterior"]["bayesian"]) == {"self_attention", "cross_attention", "mlp"}
  # Convergence: each group's median stddev from the trainer's evaluations (steps 2 and 4).
  converged = summary["convergence"]["bayesian"]
  assert set(converged["groups"]) == {"encoder/attention", "encoder/mlp", "decoder/mlp",
                                      "decoder/self_attention",
                                      "decoder/encoder_decoder_attention"}
  rows = [json.loads(l) for l in (out / "runs" / "bayesian" / "eval" / "metrics.jsonl")
          .read_text().splitlines()]
  key = "posterior_stddev_median/encoder/mlp"
  assert converged["groups"]["encoder/mlp"]["change"] == pytest.approx(
      rows[-1][key] / rows[-2][key] - 1)
  assert converged["neg_elbo"] > converged["nll"]
  assert re.search(r"\| bayesian \| \d+\.\d{4} \| \d+\.\d{4} \| encoder/mlp \| ", report)
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("MESHBAYES_DATA_DIR", str(data_dir))
    calls = []
    patch.setattr(experiment_run.Runner, "__call__", lambda self, *a: calls.append(a))
    assert experiment.main(args) == 0
  assert calls == []

@pytest.mark.integration
@pytest.mark.slow
def test_every_method_is_reported_at_the_end_and_at_its_best_checkpoint(toy):
  out, _ = toy
  report = (out / "report.md").read_text()
  tables = re.findall(r"^\| metric \|.*?(?=\n\n)", report, flags=re.S | re.M)
  assert len(tables) == 2  # final and best
  for table in tables:
    header = table.splitlines()[0]
    for column in COLUMNS:
      assert f"| {column}" in header
    for ood_set in OOD_SETS:
      assert f"OOD {ood_set}: AUROC / FPR@95 (%) by total uncertainty" in table
    assert "OOD spanish: AUROC / FPR@95 (%) by mutual information" in table
    assert "| training step time / deterministic | 1.00 |" in table
  for figure in ("curves", "reliability_final", "reliability_best", "ood_final", "ood_best"):
    assert (out / "figures" / f"{figure}.png").stat().st_size > 10_000

@pytest.mark.integration
@pytest.mark.slow
def test_the_spread_over_seeds_is_reported_per_method(toy):
  out, _ = toy
  report = (out / "report.md").read_text()
  header = next(line for line in report.splitlines() if "mean of seeds: Student-t" in line)
  for column in ("deterministic", "Bayesian layers", "IVON", "IVON (mean)"):
    assert f"| {column} (2 seeds; t, 1 df) |" in header
  assert "| deep ensemble (single realization) |" in header
  assert "| MC dropout (single realization) |" in header
  assert re.search(r"\| BLEU, mean of seeds \| \d+\.\d\d \[-?\d+\.\d\d, \d+\.\d\d\] \|", report)
  assert "| BLEU, paired by seed | " in report
  summary = json.loads((out / "report.json").read_text())
  bleu = summary["seeds"]["means"]["Bayesian layers"]["bleu"]
  assert bleu["mean"]["df"] == 1 and set(bleu["seeds"]) == {"0", "1"}
  assert summary["seeds"]["differences"]["IVON"]["bleu"]["welch"]["seed_counts"] == [2, 2]

@pytest.mark.integration
@pytest.mark.slow
def test_the_best_checkpoint_is_the_lowest_validation_nll(toy):
  out, _ = toy
  summary = json.loads((out / "report.json").read_text())
  for run in ("deterministic", "deterministic_seed1", "bayesian", "ivon"):
    curve = plan.validation_curve(out / "runs" / run)
    assert [step for step, _ in curve] == [2, 4]
    assert summary["best_steps"][run] == min(curve, key=lambda p: p[1])[0]
  # Each ensemble member at its own best step; the evaluation is at the run's best step.
  ensemble = json.loads((out / "eval" / "ensemble_best" / "metrics.json").read_text())
  assert ensemble["ensemble"][1].endswith(f"checkpoints/{summary['best_steps']['deterministic_seed1']}")
  assert ensemble["step"] == summary["best_steps"]["deterministic"]
  assert ensemble["num_samples"] == 2

@pytest.mark.integration
@pytest.mark.slow
def test_posterior_diagnostics_and_costs(toy):
  out, _ = toy
  summary = json.loads((out / "report.json").read_text())
  bayesian, ivon = summary["posterior"]["bayesian"], summary["posterior"]["ivon"]
  # The paper's estimators: attention and feed-forward weights are Bayesian, embeddings not.
  assert set(bayesian) == {"self_attention", "cross_attention", "mlp"}
  assert "embedding" in ivon  # IVON's posterior covers every weight
  for kinds in (bayesian, ivon):
    for d in kinds.values():
      low, median, high = (d["stddev"][q] for q in ("0.05", "0.5", "0.95"))
      assert 0 < low <= median <= high
  for run in ("deterministic", "deterministic_seed1", "bayesian", "ivon"):
    assert summary["costs"][run]["cpu_seconds"] > 0

@pytest.mark.integration
@pytest.mark.slow
def test_an_experiment_resumes_without_redoing_anything(toy, capsys):
  out, args = toy
  capsys.readouterr()
  assert experiment.main(args) == 0
  assert "experiment: train" not in capsys.readouterr().out
  assert "experiment: eval" not in capsys.readouterr().out

def test_reuse_copies_a_finished_run_of_the_same_seed_with_its_time(tmp_path):
  chosen = tmp_path / "tuning" / "tuning" / "deterministic" / "dropout_rate=0.1"
  (chosen / "checkpoints" / "4").mkdir(parents=True)
  (chosen / "config.gin").write_text("MODEL_DIR = 'x'\nSEED = 0\n")
  (chosen / "RUN_LOCK").write_text("")
  cost = {"wall_seconds": 2.0, "cpu_seconds": 3.0}
  (tmp_path / "tuning" / "costs.json").write_text(json.dumps(
      {"tune deterministic dropout_rate=0.1": cost}))
  budget = plan.Budget(train_steps=4, eval_period=2, ensemble_size=2,
                                  methods=("deterministic", "ensemble"))
  run = experiment_run.Experiment(budget, tmp_path / "out", experiment_run.Runner())
  (tmp_path / "out").mkdir()
  run.reuse("deterministic", chosen)
  copied = tmp_path / "out" / "runs" / "deterministic"
  assert (copied / "checkpoints" / "4").is_dir() and not (copied / "RUN_LOCK").exists()
  assert json.loads((tmp_path / "out" / "costs.json").read_text())["deterministic"] == cost
  with pytest.raises(ValueError, match="with SEED = 1"):
    run.reuse("deterministic_seed1", chosen)
  with pytest.raises(ValueError, match="must be a run trained to 4 steps"):
    run.reuse("deterministic_seed1", tmp_path / "missing")
  with pytest.raises(ValueError, match="'ivon' must be one of deterministic, deterministic_seed1"):
    run.reuse("ivon", chosen)

@pytest.mark.integration
@pytest.mark.slow
def test_a_tuned_run_is_reused_as_the_experiments_run_not_trained_again(data_dir, tmp_path,
                                                                       capsys):
  """Tuning writes its table; the chosen run, same recipe and seed, then stands in for the
  experiment's run (copied, with its training time); a run of another seed is refused."""
  tuning = tmp_path / "tuning"
  _run_toy(data_dir, tuning, "--tune=deterministic",
           "--grid=models.TransformerConfig.dropout_rate=0.1")
  assert "| 0.1 | " in (tuning / "tuning_deterministic.md").read_text()
  choice = plan.read_json(tuning / "tuning_deterministic.json")  # what Budget.tuned reads
  assert choice["chosen"] == {"models.TransformerConfig.dropout_rate": "0.1"}
  assert choice["label"] == "dropout_rate=0.1"
  assert set(choice["validation_nll"]) == {"dropout_rate=0.1"}
  chosen = tuning / "tuning" / "deterministic" / "dropout_rate=0.1"
  capsys.readouterr()
  out, _ = _run_toy(data_dir, tmp_path / "experiment", "--methods=deterministic",
                    f"--reuse=deterministic={chosen}")
  printed = capsys.readouterr().out
  assert "experiment: train" not in printed and "experiment: eval" in printed
  assert plan.validation_curve(out / "runs" / "deterministic") == \
      plan.validation_curve(chosen)
  tuned_cost = json.loads((tuning / "costs.json").read_text())[
      "tune deterministic dropout_rate=0.1"]
  assert json.loads((out / "costs.json").read_text())["deterministic"] == tuned_cost
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("MESHBAYES_DATA_DIR", str(data_dir))
    assert experiment.main(["--preset=toy", f"--out={tmp_path / 'other'}", "--in_process",
                            "--methods=ensemble",
                            f"--reuse=deterministic_seed1={chosen}"]) == 1
  assert "with SEED = 1" in capsys.readouterr().err

@pytest.mark.parametrize("curve, evaluated", [
    ({2: 3.0, 4: 2.5}, ["eval deterministic@final"]),  # the best is the final checkpoint
    ({2: 2.5, 4: 3.0}, ["eval deterministic@final", "eval deterministic@best"]),
])
def test_a_best_checkpoint_that_is_the_final_one_is_evaluated_once(tmp_path, curve, evaluated):
  run = tmp_path / "runs" / "deterministic"
  (run / "eval").mkdir(parents=True)
  for step in curve:
    (run / "checkpoints" / str(step)).mkdir(parents=True)
  (run / "eval" / "metrics.jsonl").write_text(
      "".join(json.dumps({"step": s, "nll": nll}) + "\n" for s, nll in curve.items()))

  class Recorder:
    def all(self, commands, done, admit=None, after=None):
      self.names = [log.stem.replace("_", " ") for _, _, log in commands]
      return []

  runner = Recorder()
  budget = plan.Budget(train_steps=4, eval_period=2, methods=("deterministic",))
  results = experiment_run.Experiment(budget, tmp_path, runner).evaluate()
  assert runner.names == evaluated
  assert (results["deterministic@best"] == results["deterministic@final"]) == (len(evaluated) == 1)

@pytest.mark.integration
def test_parallel_commands_report_their_own_time_and_a_failure_names_its_log(tmp_path):
  runner = experiment_run.Runner(jobs=2)
  costs = runner.all([("train", ["--help"], tmp_path / "a.log"),
                      ("eval", ["--help"], tmp_path / "b.log")])
  assert [c["cpu_seconds"] > 0 and c["wall_seconds"] > 0 for c in costs] == [True, True]
  assert "usage" in (tmp_path / "a.log").read_text().lower()
  finished = []  # each success is reported as it ends: a failure beside it loses no time
  with pytest.raises(RuntimeError, match=r"(?s)meshbayes.train failed \(status 1\).*"
                                         r"nonexistent.gin' not found"):
    runner.all([("train", ["--gin_file=nonexistent.gin"], tmp_path / "c.log"),
                ("eval", ["--help"], tmp_path / "d.log")],
               lambda index, cost: finished.append((index, cost["cpu_seconds"] > 0)))
  assert finished == [(1, True)]
  with pytest.raises(ValueError, match="jobs=0 must be a positive int"):
    experiment_run.Runner(jobs=0)
  with pytest.raises(ValueError, match="in_process=True must be None or a function"):
    experiment_run.Runner(in_process=True)

def test_a_commands_echo_drops_progress_bars_and_their_blank_erasing(tmp_path, capsys):
  # What a child's stdout reads like in text mode: tqdm's carriage returns become line
  # ends, and a bar that does not stay is erased with spaces.
  output = ("phase 2/3: teacher-forced pass\n"
            "teacher-forced pass:  50%|#####     | 8/16 [00:05<00:05,  1.5it/s]\n"
            "                                                                 \n"
            "\n"
            "evaluation done in 12 s\n")
  experiment_run._copy_output(io.StringIO(output), tmp_path / "eval.log", "eval_x")
  assert capsys.readouterr().out.splitlines() == [
      "[eval_x] phase 2/3: teacher-forced pass", "[eval_x] evaluation done in 12 s"]
  assert (tmp_path / "eval.log").read_text() == output  # the log keeps everything

def test_fresh_seeds_early_stopping_and_the_checkpoint_of_other_seeds(tmp_path):
  budget = plan.Budget(train_steps=6000, eval_period=250, methods=(
      "deterministic", "ensemble", "bayesian"), ensemble_size=3, seeds=2, first_seed=100,
      patience=4, checkpoints=("best",))
  assert budget.runs == {
      "deterministic": ("uncertainty/deterministic.gin", 100),
      "deterministic_seed1": ("uncertainty/deterministic.gin", 101),
      "deterministic_seed2": ("uncertainty/deterministic.gin", 102),
      "bayesian": ("uncertainty/bayesian.gin", 100),
      "bayesian_seed1": ("uncertainty/bayesian.gin", 101)}
  runner = experiment_run.Runner()
  args = experiment_run.Experiment(budget, tmp_path, runner)._train_args(
      "uncertainty/bayesian.gin", tmp_path / "run")
  assert "--gin.run_configs.EvaluationConfig.patience=4" in args
  assert "--gin.TRAIN_STEPS=6000" in args
  for name in budget.runs:  # best step 500 of each
    (tmp_path / "runs" / name / "eval").mkdir(parents=True)
    (tmp_path / "runs" / name / "checkpoints" / "1500").mkdir(parents=True)
    (tmp_path / "runs" / name / "eval" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "nll": abs(s - 500) / 1000 + 2}) + "\n"
        for s in range(250, 1501, 250)))
  found = plan.evaluations(budget, tmp_path)
  assert sorted(found) == ["bayesian@best", "bayesian_seed1@best", "deterministic@best",
                           "deterministic_seed1@best", "deterministic_seed2@best",
                           "ensemble@best"]
  assert {spec["step"] for spec in found.values()} == {500}
  # another seed's run is evaluated as its recipe's method
  assert found["bayesian_seed1@best"]["method"] == "bayesian"
  assert found["deterministic_seed2@best"]["method"] == "deterministic"
  assert found["ensemble@best"]["method"] == "ensemble"

def test_controls_trained_at_one_seed_when_compute_is_short():
  budget = experiment_run.PRESETS["cpu"]
  assert sorted(budget.runs) == [
      "bayesian", "bayesian_kl0.3", "bayesian_kl1", "bayesian_seed1", "bayesian_seed2",
      "deterministic", "deterministic_seed1", "deterministic_seed2", "map", "map_seed1",
      "map_seed2"]
  assert {seed for _, seed in budget.runs.values()} == {100, 101, 102}
  # --methods may leave the single-seed controls out
  assert dataclasses.replace(budget, methods=("deterministic",)).runs == {
      "deterministic": ("uncertainty/deterministic.gin", 100)}

def test_model_average_evaluations_are_started_first():
  assert [experiment_run._averages(name) for name in (
      "mc_dropout", "bayesian_kl0.3", "ensemble", "deterministic", "map")] == [
          True, True, True, False, False]


class _Recorder:
  """A runner that records the commands it is given and runs none."""

  def all(self, commands, done, admit=None, after=None):
    self.args = [args for _, args, _ in commands]
    return []

@pytest.mark.parametrize("preset, binding", [("cpu", "None"), ("demo", "4"), ("toy", "1")])
def test_the_cpu_preset_evaluates_every_test_pair(tmp_path, preset, binding):
  """``make experiment`` reads the whole test split (every source); ``make demo`` and the
  tests a few batches."""
  run = tmp_path / "runs" / "deterministic"
  (run / "checkpoints" / "4").mkdir(parents=True)
  budget = dataclasses.replace(experiment_run.PRESETS[preset], methods=("deterministic",),
                               train_steps=4, checkpoints=("final",))
  runner = _Recorder()
  experiment_run.Experiment(budget, tmp_path, runner).evaluate()
  [args] = runner.args
  limits = [a for a in args if "max_eval_batches" in a]
  assert limits == [f"--gin.data.TaskData.max_eval_batches={binding}"]
  assert (experiment_run.PRESETS[preset].eval_batches is plan.ALL_TEST_PAIRS) == (
      preset == "cpu")


# The sequence calibration design's plan (make experiment): its command lines, its order
# and its stop rule, with a runner that runs nothing.

RATE = "optimizers.LearningRate.base"


class _Planned:
  """A runner that runs nothing: each command costs 0.1 CPU-hours (360 s of wall) and
  leaves what it would (a finished run whose best validation step is 500; an evaluation's
  metrics.json); records each command's name and arguments, and what waits for what."""

  def __init__(self):
    self.names, self.args, self.after = [], {}, {}

  def all(self, commands, done, admit=lambda index: True, after=None):
    names = [re.sub(r"^(eval|pool)_", r"\1 ", log.stem) for _, _, log in commands]
    self.after.update({names[i]: [names[j] for j in before]
                       for i, before in (after or {}).items()})
    for index, (entry_point, args, _) in enumerate(commands):
      if not admit(index):
        break
      self.names.append(names[index])
      self.args[names[index]] = args
      bound = gin_bindings(args)
      if entry_point == "train":
        write_trained_run(bound)
      else:
        result = Path(bound["evaluation.ReportConfig.output_dir"].strip("'"))
        result.mkdir(parents=True)
        (result / "metrics.json").write_text("{}")
      done(index, {"wall_seconds": 360.0, "cpu_seconds": 360.0})
    return []


def _sequence(tmp_path, **changes):
  """The sequence_cpu preset's experiment in ``tmp_path``, its grid having chosen 1.2e-2."""
  tmp_path.mkdir(exist_ok=True)
  plan.write_json(tmp_path / "tuning_deterministic.json", {"chosen": {RATE: "1.2e-2"}})
  budget = dataclasses.replace(experiment_run.PRESETS["sequence_cpu"], **changes)
  return experiment_run.Experiment(budget, tmp_path, _Planned())


def test_the_designs_runs_take_the_grids_choice_and_the_noise_arms_their_sources(tmp_path):
  run = _sequence(tmp_path)
  run.train()
  runner = run.run
  assert runner.names == [f"{name}" for name in run.budget.runs]  # the table's order
  args = runner.args
  assert f"--gin.{RATE}=1.2e-2" in args["deterministic_seed3"]
  assert "--gin.SEED=203" in args["deterministic_seed3"]
  assert not any(RATE in a for a in args["bayesian"])  # only the tuned recipe's runs
  for common in ("--gin.TRAIN_STEPS=12000", "--gin.run_configs.EvaluationConfig.patience=4",
                 "--gin.run_configs.EvaluationConfig.period=250"):
    assert common in args["noise_map_seed2"]
  assert (f"--gin.FROZEN_STDDEVS_FROM='{tmp_path / 'runs' / 'bayesian_seed2'}'"
          in args["noise_map_seed2"])
  assert "--gin_file=uncertainty/noise_map.gin" in args["noise_map_seed2"]
  assert not any("FROZEN_STDDEVS_FROM" in a for a in args["map_seed2"])
  # Each noise run starts after the Bayesian run of its seed has finished.
  assert runner.after == {f"{arm}{seed}": [f"bayesian{seed}"] for arm in ("noise", "noise_map")
                          for seed in ("", "_seed1", "_seed2")}
  (tmp_path / "tuning_deterministic.json").unlink()
  with pytest.raises(ValueError, match=r"^deterministic's runs take its tuning grid's choice "
                                       r"\(Budget.tuned\), and .*tuning_deterministic.json is "
                                       r"missing: run --tune=deterministic with this --out "
                                       r"first \(docs/experiment.md\)$"):
    experiment_run.Experiment(run.budget, tmp_path / "other", _Planned()).train()


def test_the_pool_is_decoded_as_the_test_split_without_ood_sets(tmp_path):
  run = _sequence(tmp_path)
  run.train(["bayesian_seed1", "deterministic"])
  results = run.evaluate_pool(["bayesian_seed1@best", "deterministic@best"])
  assert results["bayesian_seed1@best"] == (tmp_path / "eval" / "pool_24000" /
                                            "bayesian_seed1_best")
  pool = run.run.args["pool bayesian_seed1@best"]
  for binding in ("evaluate.split='pool_24000'", "evaluate.checkpoint_step=500",
                  "data.TaskData.max_eval_batches=None",
                  "evaluation.DecodeConfig.method='beam'",
                  "evaluation.PredictiveConfig.temperature_scaling=True",
                  f"evaluation.ReportConfig.output_dir='{results['bayesian_seed1@best']}'",
                  *plan.POOL_BINDINGS):
    assert f"--gin.{binding}" in pool
  # The last binding of each wins: no OOD set, no beam-level measures on the pool.
  assert [a for a in pool if "beam_measures" in a][-1].endswith("=False")
  assert [a for a in pool if "beam_sets" in a][-1].endswith("=[]")
  assert run.run.names[-2:] == ["pool bayesian_seed1@best", "pool deterministic@best"]
  run.run.names.clear()
  run.evaluate_pool(["bayesian_seed1@best"])  # done: not again
  assert run.run.names == []


def test_the_stop_rule_gives_up_the_pool_of_seed_204_then_203_then_noise_map(tmp_path):
  """A tiny fake budget: 49 commands of 0.1 CPU-hours each, a budget of 4.55: the 46th is
  the last to start, and the pool decodings of seed 204 and one of 203 are not run."""
  run = _sequence(tmp_path, cpu_hours=4.55)
  left = run.run_stages()
  assert len(run.run.names) == 46 and run.stopped
  assert [(s.name, s.runs, s.evaluations, s.pool) for s in left] == [
      ("pool 203", (), (), ("deterministic_seed3@best",)),
      ("pool 204", (), (), ("deterministic_seed4@best", "bayesian_seed4@best"))]
  assert run.run.names[-1] == "pool bayesian_seed3@best"  # model averages first
  assert schedule.spent_cpu_hours(plan.read_json(tmp_path / "costs.json")) == pytest.approx(4.6)
  # Resumed, nothing starts: the budget is spent.
  again = experiment_run.Experiment(run.budget, tmp_path, _Planned())
  assert again.run_stages() == left and again.run.names == []
  # With a larger budget everything runs, in the design's order.
  everything = _sequence(tmp_path / "all", cpu_hours=50.0)
  assert everything.run_stages() == []
  order = everything.run.names
  assert order.index("noise_seed2") < order.index("eval bayesian@best")
  assert (order.index("pool bayesian_seed2@best") < order.index("noise_map")
          < order.index("eval noise_map@best") < order.index("pool bayesian_seed3@best")
          < order.index("pool bayesian_seed4@best") == len(order) - 2)


def test_a_stop_before_what_the_report_needs_is_an_error_and_recorded(tmp_path, capsys):
  run = _sequence(tmp_path, cpu_hours=0.5)
  assert experiment_run.execute(run, "sequence_cpu") == 1
  assert run.run.names == ["deterministic", "deterministic_seed1", "deterministic_seed2",
                           "deterministic_seed3", "deterministic_seed4"]
  printed = capsys.readouterr()
  assert "experiment: stop rule: 0.50 CPU-hours logged of the budget's 0.5: no command " \
         "starts" in printed.out
  assert printed.err.splitlines()[-1] == ("experiment: error: the stop rule left stages the "
                                          "report needs: training, test split, pool_24000")
  record = plan.read_json(tmp_path / "not_run.json")
  assert [s["name"] for s in record["not_run"]] == [
      "pool 204", "pool 203", "noise_map", "pool_24000", "test split", "training"]
  assert record["not_run"][-1]["runs"][:2] == ["bayesian", "bayesian_seed1"]


def test_an_out_directory_of_another_preset_is_not_resumed(tmp_path, capsys):
  plan.write_json(tmp_path / "budget.json", {"preset": "cpu"})
  assert experiment_run.execute(_sequence(tmp_path), "sequence_cpu") == 1
  assert capsys.readouterr().err.splitlines()[-1] == (
      f"experiment: error: --preset=sequence_cpu: {tmp_path} holds an experiment of "
      "--preset=cpu (budget.json); give another --out")
  assert plan.read_json(tmp_path / "budget.json") == {"preset": "cpu"}


@pytest.mark.parametrize("chosen, trained", [
    ("1.2e-2", [["6e-3", "1.2e-2"], ["6e-3", "1.2e-2", "2.4e-2"]]),  # the edge: once more
    ("6e-3", [["6e-3", "1.2e-2"]]),
])
def test_the_grid_goes_past_its_edge_when_it_chooses_its_edge(tmp_path, monkeypatch, chosen,
                                                              trained):
  calls = []

  def tune(self, method, settings):
    calls.append([s[RATE] for s in settings])
    plan.write_json(self.out / f"tuning_{method}.json", {"chosen": {RATE: chosen}})
    (self.out / "table.md").write_text("the table\n")
    return self.out / "table.md"

  monkeypatch.setattr(experiment_run.Experiment, "tune", tune)
  assert experiment_run.execute(
      _sequence(tmp_path), "sequence_cpu", tune="deterministic",
      knobs=[(RATE, ["6e-3", "1.2e-2"])], past_edge="2.4e-2") == 0
  assert calls == trained
  with pytest.raises(ValueError, match=r"--past_edge=2.4e-2 needs a grid of one knob, not 2"):
    experiment_run.past_the_edge([("a", ["1"]), ("b", ["2"])], {"a": "1"}, "2.4e-2")


def test_the_runner_starts_nothing_the_stop_rule_refuses_and_waits_for_what_it_must(tmp_path):
  calls = []
  runner = experiment_run.Runner(in_process=lambda entry_point, args: calls.append(args))
  commands = [("train", [name], tmp_path / f"{name}.log") for name in ("a", "b", "c")]
  costs = runner.all(commands, admit=lambda index: index < 2)
  assert calls == [["a"], ["b"]] and costs[2] is None and costs[0]["wall_seconds"] >= 0
  with pytest.raises(ValueError, match=r"Runner.all: after=\{0: \[1\]\} must name earlier "
                                       r"commands"):
    runner.all(commands, after={0: [1]})


@pytest.mark.integration
def test_parallel_commands_wait_for_theirs_and_stop_when_refused(tmp_path):
  runner = experiment_run.Runner(jobs=2)
  with pytest.raises(RuntimeError, match="nonexistent.gin"):
    runner.all([("train", ["--gin_file=nonexistent.gin"], tmp_path / "a.log"),
                ("eval", ["--help"], tmp_path / "b.log")], after={1: [0]})
  assert not (tmp_path / "b.log").exists()  # it waited for a, which failed
  costs = runner.all([("eval", ["--help"], tmp_path / "c.log"),
                      ("eval", ["--help"], tmp_path / "d.log")], admit=lambda index: index == 0)
  assert costs[0]["wall_seconds"] > 0 and costs[1] is None
  assert not (tmp_path / "d.log").exists()


def test_the_demo_says_its_figures_are_not_a_verdict(tmp_path, monkeypatch, capsys):
  """``make demo`` prints under its table, once, that its figures are one seed at 1,000
  steps and which page decides; ``make experiment`` does not."""
  from meshbayes.experiments import report

  table = tmp_path / "report.md"
  table.write_text("| metric | deterministic | Bayesian layers |\n| BLEU | 2.82 | 10.75 |\n")
  monkeypatch.setattr(experiment_run.Experiment, "run_stages", lambda self: [])
  monkeypatch.setattr(experiment_run, "result_dirs", lambda budget, out: {})
  monkeypatch.setattr(report, "write", lambda out, budget, results, pools=None: table)
  printed = {}
  for preset in ("demo", "cpu"):
    (tmp_path / preset).mkdir()
    experiment = experiment_run.Experiment(experiment_run.PRESETS[preset], tmp_path / preset,
                                           _Recorder())
    assert experiment_run.execute(experiment, preset) == 0
    printed[preset] = capsys.readouterr().out.splitlines()
  rows = ["| metric | deterministic | Bayesian layers |", "| BLEU | 2.82 | 10.75 |", ""]
  assert printed["demo"] == [*rows, (
      "These figures are one seed at 1,000 steps, a code path, not a verdict: see "
      "docs/results/2026-11-29-sequence-calibration-design.md (the verdicts will be on its "
      "results page)")]
  assert printed["cpu"] == rows
  assert (Path(__file__).resolve().parents[2] / experiment_run.VERDICT_PAGE).is_file()
