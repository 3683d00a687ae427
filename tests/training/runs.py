"""Running the trainer's command line in tests: tiny model, batch 8, a few steps."""

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from meshbayes import launch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "gin_configs" / "examples"
TOOLS = ROOT / "tools"


def train_args(model_dir, steps, *bindings, kind="bayesian"):
  return [f"--gin_file={EXAMPLES / f'tiny_synthetic_{kind}.gin'}",
          f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={steps}", "--gin.BATCH_SIZE=8",
          "--gin.run_configs.CheckpointConfig.period=4", "--gin.train.log_period=2",
          # Skip counting the training split's tokens (seconds per process).
          "--gin.models.EncoderDecoderModel.num_train_units=450000", *bindings]


def eval_args(model_dir, *bindings):
  """``meshbayes.eval`` of a ``train_args`` run, teacher-forced only (no decoding), on one
  batch of 8."""
  return ["--gin_file=runs/eval.gin", "--gin_file=tasks/synthetic.gin",
          f"--gin.MODEL_DIR='{model_dir}'", "--gin.BATCH_SIZE=8",
          "--gin.models.EncoderDecoderModel.num_train_units=450000",
          "--gin.evaluation.DecodeConfig.enabled=False", "--gin.data.TaskData.max_eval_batches=1",
          *bindings]


def train_or_fail(args):
  """Runs ``meshbayes.train`` here with ``args``; the test fails if training does."""
  try:
    launch.run("meshbayes.train", "train", list(args))
  except SystemExit as exit_:
    pytest.fail(f"training failed with {exit_.code}")


def run(module, args, timeout=600, **kwargs):
  """``python -m module args`` in a new process; returns the CompletedProcess."""
  return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                        timeout=timeout, cwd=ROOT, **kwargs)


def tool(name, *args):
  return subprocess.run([sys.executable, str(TOOLS / name), *map(str, args)],
                        capture_output=True, text=True, timeout=300, cwd=ROOT)


def events(directory):
  """The scalars of the TensorBoard event files in ``directory``: {(tag, step): value}."""
  from tensorboardX.proto import event_pb2

  found = {}
  for path in Path(directory).glob("events.out.tfevents.*"):
    data = path.read_bytes()
    while data:  # records: length (8 bytes), its CRC (4), the event, its CRC (4)
      (length,) = struct.unpack("Q", data[:8])
      event = event_pb2.Event.FromString(data[12:12 + length])
      data = data[12 + length + 4:]
      for value in event.summary.value:
        found[(value.tag, event.step)] = value.simple_value
  return found


def command(capsys, entry_point, *args, model_from_model_dir=False):
  """Runs a command (``train``, ``evaluate``, ``infer``) here, as its module
  (``meshbayes.train``, ``eval``, ``infer``) does: (exit code, stdout, stderr)."""
  module = {"evaluate": "eval"}.get(entry_point, entry_point)
  try:
    launch.run(f"meshbayes.{module}", entry_point, list(args),
               model_from_model_dir=model_from_model_dir)
    code = 0
  except SystemExit as exit_:
    code = exit_.code
  out, err = capsys.readouterr()
  return code, out, err


def train(capsys, *args):
  """Runs ``meshbayes.train`` here: (exit code, stdout, stderr)."""
  return command(capsys, "train", *args)


def one_line(err):
  """The one error line of ``meshbayes.train`` in ``err`` (fails unless there is exactly one)."""
  lines = [line for line in err.splitlines() if line.startswith("meshbayes.train: error:")]
  assert len(lines) == 1, err[-2000:]
  return lines[0]
