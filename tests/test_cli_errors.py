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
from tests.training.runs import EXAMPLES, ROOT, train_args, train_or_fail

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
    # Registered as meshbayes.evaluation.driver.evaluate: compared by its last part.
    ("--gin.evalute.checkpoint_step=3", "No configurable matching 'evalute'; did you mean "
     "evaluate?"),
], ids=["configurable", "parameter", "entry_point"])
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


def test_traceback_logs_are_bounded_to_the_newest_and_only_meshbayes_ones(tmp_path, capsys):
  logs = tmp_path / "tmp"
  old = [logs / f"meshbayes.{prog}-20200101-0000{i:02d}-{100 + i}.log"
         for i, prog in enumerate(["train", "eval", "infer"] * 9)]  # 27, all older
  others = [logs / "other-20200101-000000-1.log", logs / "meshbayes.train-notes.log",
            logs / "meshbayes.train-20200101-000000-1.log.keep"]
  for path in old + others:
    path.write_text("x")
  _, _, _, log = train(capsys, EXAMPLE, "--gin.MODEL_DIR=runs/x", "--gin.TRAIN_STEPS=2")
  assert log.parent == logs
  kept = sorted(p.name for p in logs.iterdir() if p not in others)
  assert kept == sorted([log.name] + [p.name for p in old[-19:]])  # the newest 20
  assert all(p.exists() for p in others)
  assert launch.KEPT_LOGS == 20


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
  assert code == 1 and line == (
      f"meshbayes.eval: error: MODEL_DIR '{model_dir}' {what}, so it has no checkpoint; train "
      "first: meshbayes.train writes a run's checkpoints into its MODEL_DIR (make demo trains "
      "runs/demo/runs/bayesian and runs/demo/runs/deterministic)")
  assert not model_dir.is_dir() or not any(model_dir.iterdir())


def test_the_readme_s_inference_example_before_make_demo_names_make_demo(tmp_path, capsys,
                                                                       monkeypatch):
  """The README decodes with make demo's Bayesian run: run before make demo, the error
  names the runs make demo trains, which are where tools.experiment's demo preset puts
  them (the Makefile's runs/demo/runs/<run>)."""
  from meshbayes.experiments import run

  readme = (ROOT / "README.md").read_text()
  example = re.search(r"^python -m meshbayes\.infer (.*?)\n(?!  )", readme,
                      flags=re.DOTALL | re.MULTILINE).group(1)
  args = [arg.replace("\"", "") for arg in example.replace("\\\n", " ").split()]
  model_dir = next(arg for arg in args if arg.startswith("--gin.MODEL_DIR=")).split("=")[1]
  monkeypatch.chdir(tmp_path)  # where no make demo ran
  code, line = command_line(capsys, "meshbayes.infer", "infer", *args,
                            model_from_model_dir=True)
  assert code == 1 and line == (
      f"meshbayes.infer: error: MODEL_DIR {model_dir} does not exist, so it has no checkpoint; "
      "train first: meshbayes.train writes a run's checkpoints into its MODEL_DIR (make demo "
      "trains runs/demo/runs/bayesian and runs/demo/runs/deterministic)")
  demo_runs = [f"runs/demo/runs/{name}" for name in sorted(run.PRESETS["demo"].runs)]
  assert demo_runs == ["runs/demo/runs/bayesian", "runs/demo/runs/deterministic"]
  assert model_dir.strip("'") in demo_runs
  assert "DEMO_DIR := runs/demo\n" in (ROOT / "Makefile").read_text()


@pytest.mark.parametrize("entry_point, restored, hint", [
    ("evaluate", "run", "; --gin.evaluate.checkpoint_step=4 restores step 4"),
    ("infer", "run", "; --gin.infer.checkpoint_step=4 restores step 4"),
    ("evaluate", "member", ""),  # an ensemble member's: MODEL_DIR's step would not help
], ids=["eval", "infer", "another_run"])
def test_a_corrupt_checkpoint_s_earlier_step_is_the_command_s_checkpoint_step(
    tmp_path, capsys, monkeypatch, entry_point, restored, hint):
  from meshbayes.training.checkpoint_restore import CorruptRunCheckpointError

  (tmp_path / "run" / "checkpoints").mkdir(parents=True)
  message = (f"checkpoint {tmp_path / restored}/checkpoints/6 is corrupt: array params/w does "
             "not match its checksum; the checkpoint before it is step 4")

  def corrupt(options):  # where the restore fails, in the command's own path
    raise CorruptRunCheckpointError(message, ("params/w",), str(tmp_path / restored), 4)

  monkeypatch.setattr(distributed, "initialize", corrupt)
  monkeypatch.chdir(tmp_path)
  command = {"evaluate": "eval", "infer": "infer"}[entry_point]
  files = ["--gin.INPUT_FILE='in.txt'", "--gin.OUTPUT_FILE='out.txt'"] if command == "infer" else []
  prog = f"meshbayes.{command}"
  code, line = command_line(capsys, prog, entry_point, "--gin_file=models/tiny.gin",
                            f"--gin_file=runs/{command}.gin",
                            "--gin_file=tasks/synthetic.gin", "--gin.MODEL_DIR='run'",
                            "--gin.BATCH_SIZE=8", *files, model_from_model_dir=True)
  assert code == 1 and line == f"{prog}: error: {message}{hint}"


@pytest.mark.slow  # trains a run (make test covers its parts: the test above, and
                   # tests/training/test_checkpoint_integrity.py's restore_params)
def test_a_corrupt_checkpoint_names_the_step_before_it_to_eval_and_infer(tmp_path, capsys):
  """A run whose newest checkpoint lost its array data: eval and infer name the intact one
  before it as their own checkpoint_step binding, and the tool that verifies each step."""
  model_dir = tmp_path / "run"
  train_or_fail(train_args(model_dir, 2, "--gin.run_configs.CheckpointConfig.period=1"))
  capsys.readouterr()
  for path in (model_dir / "checkpoints" / "2" / "state").rglob("*"):
    if path.is_file() and path.parent.name == "d":
      path.unlink()
  (tmp_path / "in.txt").write_text("3 4 5\n")
  common = ["--gin_file=tasks/synthetic.gin", f"--gin.MODEL_DIR='{model_dir}'",
            "--gin.BATCH_SIZE=8"]
  for prog, entry_point, files in (
      ("meshbayes.eval", "evaluate", ["--gin_file=runs/eval.gin"]),
      ("meshbayes.infer", "infer", ["--gin_file=runs/infer.gin",
                                    f"--gin.INPUT_FILE='{tmp_path / 'in.txt'}'",
                                    f"--gin.OUTPUT_FILE='{tmp_path / 'out.txt'}'"])):
    code, line = command_line(capsys, prog, entry_point, *files, *common,
                              model_from_model_dir=True)
    assert code == 1 and line.startswith(
        f"{prog}: error: checkpoint {model_dir / 'checkpoints' / '2'} is corrupt or "
        "incomplete: "), line
    assert line.endswith(
        f"; the checkpoint before it is step 1 (python -m meshbayes.tools.inspect_checkpoint "
        f"verify {model_dir} checks every step); --gin.{entry_point}.checkpoint_step=1 "
        "restores step 1"), line


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


def _moved_error(files, *bindings, entry_point="train"):
  """The ValueError of ``gin_preflight`` for a tiny run's configuration plus ``bindings``."""
  flags = [(f"--gin.{b}", b.replace("=", " = ", 1)) for b in
           ("MODEL_DIR='runs/x'", "TRAIN_STEPS=2", *bindings)]
  with pytest.raises(ValueError) as error:
    gin_preflight.checked_configuration([EXAMPLE.split("=", 1)[1], *files], flags,
                                        gin_preflight.search_prefixes([]), entry_point, False)
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


def test_a_moved_parameter_given_an_unquoted_string_is_told_both_at_once():
  fix = ("moved, and gin values are Python literals (runs/det is not one): bind "
         "run_configs.CheckpointConfig.initial_checkpoint with the string quoted, "
         "--gin.run_configs.CheckpointConfig.initial_checkpoint=\"'runs/det'\"")
  assert _moved_error([], "train.initial_checkpoint=runs/det") == (
      f"--gin.train.initial_checkpoint=runs/det: train.initial_checkpoint {fix}")
  # The former parameter's name alone, as a user who read an old page writes it.
  assert _moved_error([], "initial_checkpoint=runs/det") == (
      f"--gin.initial_checkpoint=runs/det: train.initial_checkpoint {fix}")
  assert _moved_error([], "fallback_on_corrupt_checkpoint=True") == (
      "--gin.fallback_on_corrupt_checkpoint=True: train.fallback_on_corrupt_checkpoint moved: "
      "bind run_configs.CheckpointConfig.fallback_on_corrupt (e.g. "
      "--gin.run_configs.CheckpointConfig.fallback_on_corrupt=True)")
  assert _moved_error([], "decode_method=greedy", entry_point="evaluate") == (
      "--gin.decode_method=greedy: evaluate.decode_method moved, and gin values are Python "
      "literals (greedy is not one): bind evaluation.DecodeConfig.method with the string "
      "quoted, --gin.evaluation.DecodeConfig.method=\"'greedy'\"")


def test_a_macro_named_like_a_former_parameter_is_a_macro(tmp_path):
  """A configuration's own macro of that name is bound, not told as moved."""
  (tmp_path / "macro.gin").write_text("keep_checkpoints = 2\n"
                                      "run_configs.CheckpointConfig.keep = %keep_checkpoints\n")
  flags = [(f"--gin.{b}", b.replace("=", " = ", 1)) for b in
           ("MODEL_DIR='runs/x'", "TRAIN_STEPS=2", "keep_checkpoints=3")]
  gin_preflight.checked_configuration([EXAMPLE.split("=", 1)[1], str(tmp_path / "macro.gin")],
                                      flags, gin_preflight.search_prefixes([]), "train", False)
  with pytest.raises(gin_preflight.UnquotedStringError, match="a string needs quotes"):
    gin_preflight.checked_configuration(
        [EXAMPLE.split("=", 1)[1], str(tmp_path / "macro.gin")],
        [*flags, ("--gin.keep_checkpoints=all", "keep_checkpoints = all")],
        gin_preflight.search_prefixes([]), "train", False)


def test_a_moved_train_parameter_on_the_command_line(tmp_path, capsys):
  code, _, line, _ = train(capsys, *train_args(tmp_path / "run", 2),
                           "--gin.train.keep_checkpoints=None")
  assert code == 1 and line == (
      "meshbayes.train: error: --gin.train.keep_checkpoints=None: train.keep_checkpoints moved: "
      "bind run_configs.CheckpointConfig.keep (e.g. --gin.run_configs.CheckpointConfig.keep="
      "None)")
