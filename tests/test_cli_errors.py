"""Mistakes on the command lines: one line naming the bad value and what would do, the
traceback in a log file, and configuration mistakes told before the data layer loads."""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import pytest

from meshbayes import launch, partitioning
from meshbayes.runtime import distributed, gin_preflight
from meshbayes.tools import inspect_partitioning
from tests.training.runs import EXAMPLES, ROOT, train_args

pytestmark = pytest.mark.integration

EXAMPLE = f"--gin_file={EXAMPLES / 'tiny_synthetic_bayesian.gin'}"
LOGGED = re.compile(r" \(traceback in (\S+\.log)\)$")


@pytest.fixture(autouse=True)
def logs_in_tmp_path(tmp_path, monkeypatch):
  """Logs that would go to the temporary directory go to the test's; errors are lines."""
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
  (tmp_path / "tmp").mkdir()
  monkeypatch.delenv("MESHBAYES_TRACEBACK", raising=False)


def _environment(tmp_path):
  env = {**os.environ, "TMPDIR": str(tmp_path)}
  env.pop("MESHBAYES_TRACEBACK", None)
  return env


def train(capsys, *args):
  """``meshbayes.train`` here: (exit status, stdout, the one error line, its log file)."""
  with pytest.raises(SystemExit) as exit_:
    launch.run("meshbayes.train", "train", list(args))
  out, err = capsys.readouterr()
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("meshbayes.train: error: "), err[-3000:]
  logged = LOGGED.search(lines[0])
  return exit_.value.code, out, LOGGED.sub("", lines[0]), logged and Path(logged.group(1))


def test_an_unquoted_string_shows_the_quoted_form(tmp_path, capsys):
  code, out, line, log = train(capsys, EXAMPLE, "--gin.MODEL_DIR=runs/x", "--gin.TRAIN_STEPS=2")
  assert code == 1
  assert line == ("meshbayes.train: error: --gin.MODEL_DIR=runs/x: gin values are Python "
                  "literals and runs/x is not one; a string needs quotes: "
                  "--gin.MODEL_DIR=\"'runs/x'\"")
  assert out == "meshbayes.train: reading the configuration ...\n"
  # MODEL_DIR is unknown: the traceback goes to the temporary directory.
  assert log.parent == tmp_path / "tmp" and "Traceback" in log.read_text()


def test_a_misspelled_macro_is_named_with_the_nearest_valid_name(capsys):
  code, _, line, _ = train(capsys, *train_args("runs/x", 2), "--gin.TRAIN_STEP=20")
  assert code == 1
  assert line == ("meshbayes.train: error: --gin.TRAIN_STEP=20: no gin macro TRAIN_STEP in the "
                  "configuration (nothing refers to %TRAIN_STEP); did you mean TRAIN_STEPS?")


def test_configuration_mistakes_are_told_before_tensorflow_loads(tmp_path):
  """A new process: a misspelled macro, an unquoted string and a missing REQUIRED macro are
  reported without importing the data layer (TensorFlow, seqio) or even jax; so are a
  training run's simple values (TRAIN_STEPS, a MODEL_DIR that is a file)."""
  (tmp_path / "f").write_text("")
  script = (
      "import sys\nfrom meshbayes import launch\n"
      "for args in (['--gin.TRAIN_STEP=2'], ['--gin.BATCH_SIZE=big'], [],\n"
      "             ['--gin.MODEL_DIR=\\'r\\'', '--gin.TRAIN_STEPS=0'],\n"
      "             ['--gin.MODEL_DIR=\\'f/r\\'', '--gin.TRAIN_STEPS=2']):\n"
      "  try:\n"
      f"    launch.run('meshbayes.train', 'train', [{EXAMPLE!r}, *args])\n"
      "  except SystemExit as exit_:\n"
      "    assert exit_.code == 1\n"
      "print(sorted(m for m in ('tensorflow', 'seqio', 'jax') if m in sys.modules))\n")
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=tmp_path, env=_environment(tmp_path), timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().splitlines()[-1] == "[]"
  errors = result.stderr.strip().splitlines()
  assert len(errors) == 5, result.stderr
  assert "did you mean TRAIN_STEPS?" in errors[0]
  assert "--gin.BATCH_SIZE=\"'big'\"" in errors[1]
  assert ("gin macros MODEL_DIR, TRAIN_STEPS are %gin.REQUIRED but not set; set them with "
          "--gin.MODEL_DIR=VALUE --gin.TRAIN_STEPS=VALUE") in errors[2]
  assert "train: train_steps=0 must be a positive int" in errors[3]
  assert f"train: MODEL_DIR f/r must be a directory, but {tmp_path / 'f'} is a file" in errors[4]


@pytest.mark.parametrize("binding, message", [
    ("--gin.models.TransformerConfgi.emb_dim=8",
     "No configurable matching 'models.TransformerConfgi'; did you mean "
     "models.TransformerConfig?"),
    ("--gin.train.train_step=3",
     "Configurable 'train' doesn't have a parameter named 'train_step'; did you mean "
     "train_steps?"),
], ids=["configurable", "parameter"])
def test_unknown_configurables_and_parameters_suggest_the_nearest(tmp_path, capsys, binding,
                                                                  message):
  code, _, line, _ = train(capsys, *train_args(tmp_path / "run", 2), binding)
  assert code == 1 and line == f"meshbayes.train: error: {message}"


@pytest.mark.parametrize("args, message", [
    (["--gin.partitioning.Partitioner.data='2'"], "mesh data='2' is a str; expected an int: a "
     "positive size, or -1 to fill from the device count"),
    (["--gin_file=partitioning/fsdp_tp.gin", "--gin.MODEL_PARALLEL='2'"], "mesh model='2' is a "
     "str; expected an int"),
], ids=["data", "fsdp_MODEL_PARALLEL"])
def test_a_mesh_size_given_as_a_string(tmp_path, capsys, args, message):
  code, _, line, _ = train(capsys, *train_args(tmp_path / "run", 2), *args)
  assert code == 1 and line.startswith(f"meshbayes.train: error: {message}")


def test_a_bug_is_one_line_with_its_traceback_in_model_dir_logs(tmp_path, capsys, monkeypatch):
  def broken(options):
    raise AttributeError("'NoneType' object has no attribute 'x'")

  monkeypatch.setattr(distributed, "initialize", broken)
  model_dir = tmp_path / "run"
  model_dir.mkdir()
  code, _, line, log = train(capsys, *train_args(model_dir, 2))
  assert code == 1
  assert line == ("meshbayes.train: error: AttributeError: 'NoneType' object has no attribute "
                  "'x'")
  assert log.parent == model_dir / "logs"
  text = log.read_text()
  assert "Traceback" in text and "in broken" in text and "--gin.TRAIN_STEPS=2" in text

  monkeypatch.setenv("MESHBAYES_TRACEBACK", "1")
  with pytest.raises(AttributeError, match="has no attribute 'x'"):
    launch.run("meshbayes.train", "train", train_args(model_dir, 2))


def test_only_process_0_says_what_it_does(tmp_path, capsys):
  code, out, line, log = train(capsys, *train_args("runs/x", 2), "--gin.TRAIN_STEP=20",
                               "--process_id=1", "--num_processes=2",
                               "--coordinator_address=127.0.0.1:1234")
  assert code == 1 and out == "" and "no gin macro TRAIN_STEP" in line
  with pytest.raises(SystemExit) as exit_:
    launch.run("meshbayes.train", "train", ["--gin_fil=x.gin"])
  out, err = capsys.readouterr()
  assert exit_.value.code == 2 and out == ""
  assert list((tmp_path / "tmp").iterdir()) == [log]  # a usage error adds no log file
  assert err == ("meshbayes.train: error: unknown or incomplete flag '--gin_fil=x.gin'; "
                 "expected --gin_file=FILE, --gin.NAME=VALUE or --gin_search_paths=DIRS\n")


def test_inspect_partitioning_reports_an_indivisible_dimension_in_one_line():
  with pytest.raises(SystemExit) as exit_:
    inspect_partitioning.main(["--model=tiny", "--mesh=2x4", "--rules=megatron"])
  message = exit_.value.code  # printed by Python as the one line, status 1
  assert isinstance(message, str) and "\n" not in message
  assert message.startswith("meshbayes.tools.inspect_partitioning: error: ")
  assert "('heads', size 2) cannot be split 4 ways over mesh axis 'model'" in message


def test_a_mesh_larger_than_the_cpu_devices_says_how_to_simulate_them():
  """The README's partitioning example in a process with one CPU device."""
  with pytest.raises(ValueError) as error:
    partitioning.Partitioner(data=2, model=4, rules="fsdp_tp", devices=jax.devices()[:1])
  assert str(error.value) == (
      "mesh data=2 x model=4 needs 8 devices but 1 are available; on CPU, simulate 8 devices: "
      "--num_cpu_devices=8 on a meshbayes command line, or XLA_FLAGS=--xla_force_host_platform"
      "_device_count=8 set before jax is imported")


def test_the_commands_print_one_line_and_exit_1_as_processes(tmp_path):
  """The real command line: status 1, nothing on stderr but the one line."""
  result = subprocess.run(
      [sys.executable, "-m", "meshbayes.train", EXAMPLE, "--gin.MODEL_DIR=runs/x"],
      capture_output=True, text=True, cwd=ROOT, timeout=120, env=_environment(tmp_path))
  assert result.returncode == 1
  assert result.stdout == "meshbayes.train: reading the configuration ...\n"
  [line] = result.stderr.splitlines()
  assert "--gin.MODEL_DIR=\"'runs/x'\"" in line and f"(traceback in {tmp_path}/" in line


def command_line(capsys, prog, entry_point, *args, **kwargs):
  """A command here: (exit status, the one error line)."""
  with pytest.raises(SystemExit) as exit_:
    launch.run(prog, entry_point, list(args), **kwargs)
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1, lines
  return exit_.value.code, LOGGED.sub("", lines[0])


@pytest.mark.parametrize("kind", ["missing", "empty", "file"])
def test_eval_without_a_trained_run_says_so_and_leaves_model_dir_alone(tmp_path, capsys, kind):
  model_dir = tmp_path / "run"
  if kind == "empty":
    model_dir.mkdir()
  elif kind == "file":
    model_dir.write_text("")
  what = {"missing": "does not exist", "file": "is a file",
          "empty": "holds no training run (no config.gin, no checkpoints/)"}[kind]
  code, line = command_line(capsys, "meshbayes.eval", "evaluate", "--gin_file=runs/eval.gin",
                            "--gin_file=tasks/synthetic.gin", f"--gin.MODEL_DIR='{model_dir}'",
                            "--gin.BATCH_SIZE=8", model_from_model_dir=True)
  assert code == 1 and line == (f"meshbayes.eval: error: MODEL_DIR '{model_dir}' {what}; give "
                                "the MODEL_DIR a run was trained into (meshbayes.train)")
  assert not model_dir.is_dir() or not any(model_dir.iterdir())


def test_a_misspelled_gin_file_suggests_the_nearest_and_lists_each_place_once(capsys):
  code, _, line, _ = train(capsys, "--gin_file=uncertainty/bayesain.gin")
  assert code == 1 and "; did you mean uncertainty/bayesian.gin or" in line, line
  searched = line.split(" nor in ")[1].split(";")[0].split(", ")
  assert len(searched) == len(set(searched)) >= 2


def test_a_task_file_before_the_run_file_is_told_as_the_order(capsys):
  code, line = command_line(capsys, "meshbayes.eval", "evaluate", "--gin_file=tasks/synthetic.gin",
                            "--gin_file=runs/eval.gin", "--gin.MODEL_DIR='runs/x'",
                            "--gin.BATCH_SIZE=8")
  assert code == 1 and re.fullmatch(
      r"meshbayes.eval: error: gin macro (MIXTURE_OR_TASK_NAME|TASK_FEATURE_LENGTHS) is set in "
      r"\S+/tasks/synthetic.gin:\d+ but reset to %gin.REQUIRED by \S+/runs/eval.gin:\d+, which "
      r"comes after it: gin applies files in order, so give \S+/runs/eval.gin before "
      r"\S+/tasks/synthetic.gin", line), line


@pytest.mark.parametrize("binding, message", [
    ("--gin.optimizers.Optimizer.clip_gradient_norm=None",
     "Optimizer: clip_gradient_norm=None must be a number >= 0 (0: no clipping)"),
    ("--gin.optimizers.LearningRate.base=-0.001",
     "LearningRate: base=-0.001 must be a positive number"),
    ("--gin.optimizers.LearningRate.warmup_steps=-5",
     "LearningRate: warmup_steps=-5 must be a non-negative int"),
], ids=["clip_none", "negative_lr", "negative_warmup"])
def test_bad_optimizer_values_name_only_the_bad_one(tmp_path, capsys, binding, message):
  code, _, line, _ = train(capsys, *train_args(tmp_path / "run", 2), binding)
  assert code == 1 and line == f"meshbayes.train: error: {message}"


def _moved_error(files, *bindings):
  """The ValueError of ``gin_preflight`` for a tiny run's configuration plus ``bindings``."""
  flags = [(f"--gin.{b}", b.replace("=", " = ", 1)) for b in
           ("MODEL_DIR='runs/x'", "TRAIN_STEPS=2", *bindings)]
  with pytest.raises(ValueError) as error:
    gin_preflight.checked_configuration([EXAMPLE.split("=", 1)[1], *files], flags,
                                        gin_preflight.search_prefixes([]), "train", False)
  return str(error.value)


def test_a_moved_train_parameter_names_its_new_binding(tmp_path):
  assert _moved_error([], "train.checkpoint_period=50") == (
      "--gin.train.checkpoint_period=50: train.checkpoint_period moved: bind "
      "run_configs.CheckpointConfig.period (e.g. --gin.run_configs.CheckpointConfig.period=50)")
  assert _moved_error([], "train.initial_checkpoint='runs/det'").endswith(
      "bind run_configs.CheckpointConfig.initial_checkpoint (e.g. "
      "--gin.run_configs.CheckpointConfig.initial_checkpoint=\"'runs/det'\")")
  # In a gin file: its line, and the gin line to write instead.
  (tmp_path / "old.gin").write_text("train.log_period = 5\ntrain.eval_period = 250\n")
  assert _moved_error([str(tmp_path / "old.gin")]) == (
      f"{tmp_path / 'old.gin'}:2: train.eval_period moved: bind "
      "run_configs.EvaluationConfig.period (e.g. run_configs.EvaluationConfig.period = 250)")


def test_evaluates_moved_parameters_and_mode_flag_name_their_new_binding(tmp_path):
  assert _moved_error([], "evaluate.decode_method='greedy'") == (
      "--gin.evaluate.decode_method='greedy': evaluate.decode_method moved: bind "
      "evaluation.DecodeConfig.method (e.g. --gin.evaluation.DecodeConfig.method=\"'greedy'\")")
  assert _moved_error([], "evaluate.mc_dropout=True") == (
      "--gin.evaluate.mc_dropout=True: evaluate.mc_dropout moved: bind "
      "evaluation.PredictiveConfig.method (e.g. --gin.evaluation.PredictiveConfig.method="
      "\"'mc_dropout'\"), or drop it for the run as trained")
  (tmp_path / "old_eval.gin").write_text("evaluate.split = 'test'\nevaluate.num_samples = 4\n")
  assert _moved_error([str(tmp_path / "old_eval.gin")]) == (
      f"{tmp_path / 'old_eval.gin'}:2: evaluate.num_samples moved: bind "
      "evaluation.PredictiveConfig.num_samples (e.g. evaluation.PredictiveConfig.num_samples = 4)")


def test_the_moved_names_are_gone_from_train_and_evaluate_and_name_real_fields():
  import dataclasses
  import inspect

  from meshbayes import evaluation
  from meshbayes.training import run_configs, trainer

  assert len(inspect.signature(trainer.train).parameters) <= 12
  for old, (configurable, param) in gin_preflight.MOVED_TRAIN_PARAMETERS.items():
    assert old not in inspect.signature(trainer.train).parameters
    fields = dataclasses.fields(getattr(run_configs, configurable.split(".")[1]))
    assert param in {f.name for f in fields}, (old, configurable, param)
  assert len(inspect.signature(evaluation.evaluate).parameters) <= 12
  for old, (configurable, param) in gin_preflight.MOVED_EVALUATE_PARAMETERS.items():
    assert old not in inspect.signature(evaluation.evaluate).parameters
    fields = dataclasses.fields(getattr(evaluation, configurable.split(".")[1]))
    assert param in {f.name for f in fields}, (old, configurable, param)


def test_a_moved_train_parameter_on_the_command_line(tmp_path, capsys):
  code, _, line, _ = train(capsys, *train_args(tmp_path / "run", 2),
                           "--gin.train.keep_checkpoints=None")
  assert code == 1 and line == (
      "meshbayes.train: error: --gin.train.keep_checkpoints=None: train.keep_checkpoints moved: "
      "bind run_configs.CheckpointConfig.keep (e.g. --gin.run_configs.CheckpointConfig.keep="
      "None)")
