"""The uncertainty experiment's whole code path at toy size (``meshbayes.experiments.run``
through its command, ``meshbayes.tools.experiment``): every method trained and evaluated on
a fake Tatoeba corpus, at the end and at the best checkpoint, and its report; the runner of
its commands."""

import dataclasses
import io
import json
import re

import pytest

from meshbayes.data import technical_english
from meshbayes.experiments import plan
from meshbayes.experiments import run as experiment_run
from meshbayes.tools import experiment
from meshbayes.training import compute_log
from tests.data import corpus

COLUMNS = ("deterministic", "temperature-scaled (T=", "MC dropout", "deep ensemble",
           "Bayesian layers", "Bayesian layers (mean)", "IVON", "IVON (mean)",
           "last-layer Laplace")
OOD_SETS = ("spanish", "technical_english", "targets_as_inputs", "shuffled_words")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("MESHBAYES_DATA_DIR", str(root / "data"))
    corpus.prepare_with_vocabulary(root / "data")
    technical_english.prepare(root / "data")
  return root / "data"

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
    def all(self, commands, done):
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

  def all(self, commands, done):
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
