"""What the move of the root modules into packages kept working: the old import paths
(deprecated, for one release; tests/test_old_paths.py checks each) and runs made before
the move."""

import re
import warnings
from pathlib import Path


from meshbayes.runtime.old_paths import MOVED
from tests.training.runs import ROOT, command, train_args, train_or_fail

# The package's root before the move (commit b574cec), but for __init__.
ROOT_BEFORE = {
    "atomic_files", "checkpoint_integrity", "checkpoint_restore", "checkpoints",
    "compute_log", "configurables", "console", "demo", "distributed", "early_stopping",
    "eval", "field_checks", "gin_preflight", "host_input", "host_memory", "infer",
    "inference", "ivon", "laplace", "launch", "metrics_writer", "optimizers",
    "posterior_diagnostics", "predictive", "preemption", "run_configs", "run_lock",
    "text_lines", "train", "train_step", "trainer"}
# The config.gin the trainer wrote for a run of tiny_synthetic_bayesian.gin before the move.
OLD_CONFIG = Path(__file__).with_name("old_layout_config.gin")


def test_every_module_that_left_the_root_has_its_old_path():
  still_there = {p.stem for p in (ROOT / "meshbayes").glob("*.py")} - {"__init__"}
  assert {old for old in MOVED if "." not in old} == ROOT_BEFORE - still_there
  assert len(still_there) <= 12


def test_a_run_from_before_the_move_evaluates_infers_and_resumes(tmp_path, capsys):
  """A run whose config.gin the trainer wrote before the move (the checkpoints hold no
  Python paths: only arrays and JSON of parameter names and axes)."""
  model_dir = tmp_path / "run"
  with warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)  # the new code uses no old path
    train_or_fail(train_args(model_dir, 4))
  (model_dir / "config.gin").write_text(
      OLD_CONFIG.read_text().replace("MODEL_DIR_OF_THE_RUN", str(model_dir)))
  moved = re.compile(rb"meshbayes\.(%s)\b" % "|".join(MOVED).encode())
  assert not [p for p in model_dir.rglob("*") if p.is_file() and moved.search(p.read_bytes())]
  common = [f"--gin.MODEL_DIR='{model_dir}'", "--gin.models.EncoderDecoderModel.num_train_units=450000",
            "--gin_file=tasks/synthetic.gin"]
  code, _, err = command(capsys, "evaluate", "--gin_file=runs/eval.gin", *common,
                         "--gin.BATCH_SIZE=64", "--gin.data.TaskData.max_eval_batches=1",
                         "--gin.evaluation.DecodeConfig.method='greedy'",
                         "--gin.evaluation.ReportConfig.bootstrap_resamples=20",
                         "--gin.evaluation.OodConfig.max_examples=8",
                         model_from_model_dir=True)
  assert code == 0, err[-2000:]
  inputs = tmp_path / "inputs.txt"
  inputs.write_text("1 2 3 4 5\n7 8 9\n")
  code, _, err = command(capsys, "infer", "--gin_file=runs/infer.gin", *common,
                         "--gin.BATCH_SIZE=8", f"--gin.INPUT_FILE='{inputs}'",
                         f"--gin.OUTPUT_FILE='{tmp_path / 'outputs.txt'}'",
                         model_from_model_dir=True)
  assert code == 0, err[-2000:]
  assert len((tmp_path / "outputs.txt").read_text().splitlines()) == 2
  code, out, err = command(capsys, "train", *train_args(model_dir, 8))
  assert code == 0 and "resuming from the checkpoint of step 4" in out + err, err[-2000:]
  assert (model_dir / "checkpoints" / "8").is_dir()
