"""What keeps a model directory trustworthy: no non-finite state saved, one writer, a
config.gin that describes the checkpoints, a resume that matches them, clean stops."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from meshbayes.training import checkpoints, trainer
from meshbayes.runtime.run_lock import LOCK_NAME
from tests.training import runs
from tests.training.runs import ROOT, one_line, train, train_or_fail

pytestmark = pytest.mark.integration


def train_args(model_dir, steps, *bindings):
  """The deterministic tiny model's runs: what keeps a model directory trustworthy is the
  trainer's, whatever the layers, and its step compiles five times faster than the
  Bayesian model's."""
  return runs.train_args(model_dir, steps, *bindings, kind="deterministic")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A run of 4 steps (a checkpoint at 4); tests work on copies."""
  model_dir = tmp_path_factory.mktemp("trained") / "run"
  train_or_fail(train_args(model_dir, 4))
  return model_dir


@pytest.fixture
def run_dir(trained, tmp_path):
  shutil.copytree(trained, tmp_path / "run")
  return tmp_path / "run"


def saved_steps(model_dir):
  return sorted(int(p.name) for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit())


def test_a_non_finite_state_is_never_saved(run_dir, capsys):
  """Learning rate 1e39: step 5's loss (before the update) is finite, its new state is not."""
  code, _, err = train(capsys, *train_args(run_dir, 8),
                       "--gin.run_configs.CheckpointConfig.period=1",
                       "--gin.optimizers.LearningRate.base=1e39")
  assert code == 1
  assert re.search(
      r"error: non-finite parameters or optimizer state \(loss [\d.]+\) after step 5; training "
      r"stopped without saving it; the last finite checkpoint is step 4 in "
      + re.escape(str(run_dir / "checkpoints")), one_line(err)), one_line(err)
  assert saved_steps(run_dir) == [4]


@pytest.mark.slow  # two starts of the trainer
def test_a_locked_model_dir_is_one_line_and_a_stale_lock_is_taken_over(run_dir, capsys):
  """A live holder (the parent process) stops the run before anything is written; a dead
  one's lock is taken over; each successful start's configuration is kept."""
  holder = {"host": socket.gethostname(), "pid": os.getppid(), "pid_start": None,
            "started": "2026-01-01 00:00:00 UTC", "token": "x", "heartbeat": time.time()}
  (run_dir / LOCK_NAME).write_text(json.dumps(holder))
  first_config = (run_dir / "config.gin").read_text()
  code, _, err = train(capsys, *train_args(run_dir, 8))
  assert code == 1
  assert (f"MODEL_DIR {run_dir} is in use by another training run (host "
          f"{socket.gethostname()}, pid {os.getppid()}, started 2026-01-01 00:00:00 UTC; lock "
          f"{run_dir / LOCK_NAME})") in one_line(err)

  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  (run_dir / LOCK_NAME).write_text(json.dumps(dict(holder, pid=dead.pid)))
  code, out, err = train(capsys, *train_args(run_dir, 5), "--gin.train.log_period=1")
  assert code == 0, err[-2000:]
  assert (f"took over the lock of a run that is gone (host {socket.gethostname()}, pid "
          f"{dead.pid}, started 2026-01-01 00:00:00 UTC: no process {dead.pid} of that run on "
          "this host)") in out
  assert not (run_dir / LOCK_NAME).exists()
  assert saved_steps(run_dir) == [4, 5]
  starts = sorted(p.name for p in (run_dir / "configs").iterdir())
  assert [re.sub(r"-\d{8}-\d{6}", "", name) for name in starts] == ["start-0.gin", "start-4.gin"]
  assert (run_dir / "configs" / starts[0]).read_text() == first_config
  assert "train.log_period = 2" in first_config
  assert "train.log_period = 1" in (run_dir / "config.gin").read_text()  # the newest start's


def test_a_start_that_fails_leaves_config_gin_alone(run_dir, capsys):
  before = (run_dir / "config.gin").read_text()
  code, _, err = train(capsys, *train_args(run_dir, 8), "--gin.models.TransformerConfig.mlp_dim=48")
  # Another model size: the parameters named first, and what to do.
  assert code == 1 and re.search(
      r"does not fit this model: params/\S+ has shape .*; params/\S+ has shape .* more\); use "
      r"the run's own model settings \(its config.gin\) or a new MODEL_DIR", one_line(err))
  code, _, err = train(capsys, *train_args(run_dir, 8, "--gin.BATCH_SIZE=12"))
  assert code == 1, err
  assert (run_dir / "config.gin").read_text() == before
  assert len(list((run_dir / "configs").iterdir())) == 1
  assert not (run_dir / LOCK_NAME).exists()


def test_the_vocabulary_must_be_the_models_and_the_checkpoints(run_dir, tmp_path, capsys,
                                                              monkeypatch):
  fresh = tmp_path / "fresh"
  for size in (8000, 16):
    code, _, err = train(capsys, *train_args(fresh, 4),
                         f"--gin.models.TransformerConfig.vocab_size={size}")
    assert code == 1
    assert (f"train: the vocabulary of task 'synthetic_reverse' has 32 pieces but the model is "
            f"built for vocab_size={size:,}; set models.TransformerConfig.vocab_size=32 (or up to "
            "128, padded to a multiple of 128)") in one_line(err)
  assert not (fresh / "checkpoints").exists()

  monkeypatch.setattr(trainer, "vocabulary_fingerprint", lambda vocabulary: "sha256:0123")
  code, _, err = train(capsys, *train_args(run_dir, 8))
  assert code == 1
  assert ("train: the vocabulary of task 'synthetic_reverse' (sha256:0123) is not the one the "
          f"checkpoint {run_dir / 'checkpoints' / '4'} was trained with (IdVocabulary:32); resume "
          "with that vocabulary, or start a new MODEL_DIR") in one_line(err)


def test_another_batch_size_on_resume_is_refused(run_dir, capsys):
  code, _, err = train(capsys, *train_args(run_dir, 8), "--gin.BATCH_SIZE=16")
  assert code == 1
  assert ("train: BATCH_SIZE=16 differs from the batch size 8 the checkpoint "
          f"{run_dir / 'checkpoints' / '4'} was trained with (its input position is counted in "
          "batches); resume with BATCH_SIZE=8, or start a new MODEL_DIR") in one_line(err)
  assert saved_steps(run_dir) == [4]


# Signals, in a training process of its own.


@pytest.fixture
def start_training():
  """Starts ``meshbayes.train`` for 100,000 steps (stopped by the test, else at teardown)."""
  started = []

  def start(model_dir, *bindings):
    started.append(subprocess.Popen(
        [sys.executable, "-m", "meshbayes.train", *train_args(model_dir, 100_000, *bindings)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return started[-1]

  yield start
  for process in started:
    if process.poll() is None:
      process.kill()
      process.communicate()


def wait_for_line(process, text, timeout=300):
  """Reads the process's stdout up to a line containing ``text``; returns what was read."""
  read, deadline = [], time.monotonic() + timeout
  while time.monotonic() < deadline:
    line = process.stdout.readline()
    assert line, f"exited {process.wait()}: {''.join(read)}{process.stderr.read()[-2000:]}"
    read.append(line)
    if text in line:
      return "".join(read)
  pytest.fail(f"no {text!r} in {''.join(read)}")


def stop(process, signum):
  """Sends ``signum``; returns (exit code, seconds to exit, stdout, stderr)."""
  sent = time.monotonic()
  process.send_signal(signum)
  out, err = process.communicate(timeout=120)
  return process.returncode, time.monotonic() - sent, out, err


@pytest.mark.parametrize("when", [
    "reading the configuration",  # the first line: under a second
    pytest.param("compiling the train step", marks=pytest.mark.slow),  # ~30 s of start-up
])
def test_sigterm_before_the_first_step_exits_at_once(tmp_path, start_training, when):
  process = start_training(tmp_path / "run")
  wait_for_line(process, when)
  code, seconds, out, err = stop(process, signal.SIGTERM)
  assert code == 143, err[-2000:]
  assert seconds < 5
  assert ("SIGTERM: stopped (no step completed since the last checkpoint, nothing to save)"
          in out)
  assert "Traceback" not in err
  assert not (tmp_path / "run" / LOCK_NAME).exists()
  assert not list((tmp_path / "run" / "checkpoints").glob("[0-9]*"))


@pytest.mark.slow  # a training process, signalled as it ends
def test_a_signal_at_the_end_of_a_run_is_a_clean_exit(tmp_path):
  """SIGTERM as the last step finishes (its save, the shutdown): status 0, the run whole."""
  model_dir = tmp_path / "run"
  process = subprocess.Popen([sys.executable, "-m", "meshbayes.train", *train_args(model_dir, 4)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    wait_for_line(process, " 4/4 [")
    code, _, out, err = stop(process, signal.SIGTERM)
  finally:
    if process.poll() is None:
      process.kill()
  assert code == 0, (code, out[-2000:], err[-2000:])
  assert "SIGTERM: received after the run's last checkpoint; the run is complete" in out
  assert (f"trained to step 4: checkpoints in {model_dir / 'checkpoints'}, metrics in "
          f"{model_dir / 'metrics.jsonl'} (TensorBoard: tensorboard --logdir {model_dir}, from "
          "the [tensorboard] extra: pip install -e '.[tensorboard]')") in out
  assert "Traceback" not in err and saved_steps(model_dir) == [4]
  assert not (model_dir / LOCK_NAME).exists()


@pytest.mark.slow  # trains for seconds, then resumes
def test_sigint_saves_the_last_step_like_sigterm(tmp_path, start_training):
  model_dir = tmp_path / "run"
  process = start_training(model_dir, "--gin.train.log_period=1",
                           "--gin.run_configs.CheckpointConfig.period=100000")
  wait_for_line(process, " 3/100000 [")
  code, _, out, err = stop(process, signal.SIGINT)
  assert code == 130, err[-2000:]
  assert "KeyboardInterrupt" not in err and "Traceback" not in err
  (step,) = saved_steps(model_dir)
  assert step >= 3 and f"SIGINT: saved the checkpoint of step {step}; run again to resume" in out
  assert not (model_dir / LOCK_NAME).exists()


@pytest.mark.slow  # two training processes
def test_kill_9_leaves_a_lock_that_the_next_run_takes_over(tmp_path, start_training):
  model_dir = tmp_path / "run"
  process = start_training(model_dir, "--gin.run_configs.CheckpointConfig.period=2")
  wait_for_line(process, " 6/100000 [")  # the save of step 4 waited for that of step 2
  process.kill()
  process.communicate()
  assert (model_dir / LOCK_NAME).exists()
  resumed = subprocess.run([sys.executable, "-m", "meshbayes.train",
                            *train_args(model_dir, saved_steps(model_dir)[-1] + 2)],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "took over the lock of a run that is gone" in resumed.stdout
  assert "resuming from the checkpoint of step" in resumed.stdout


@pytest.mark.slow  # two starts that train (about a minute)
def test_a_corrupt_newest_checkpoint_stops_the_run_unless_fallback_is_asked(run_dir, capsys):
  code, _, err = train(capsys, *train_args(run_dir, 5),
                       "--gin.run_configs.CheckpointConfig.period=1")
  assert code == 0, err[-2000:]
  # With 8 devices some data files hold bytes no array reads (which ones depends on the
  # save's timing): flip 16 bytes spread over each file.
  for data_file in (run_dir / "checkpoints" / "5" / "state").glob("ocdbt.process_*/d/*"):
    data = bytearray(data_file.read_bytes())
    for position in np.linspace(0, len(data) - 1, 18).astype(int)[1:-1]:
      data[position] ^= 0x10
    data_file.write_bytes(bytes(data))
  code, _, err = train(capsys, *train_args(run_dir, 6))
  assert code == 1
  assert re.search(r"error: checkpoint \S+/5 is corrupt", one_line(err)), one_line(err)
  assert saved_steps(run_dir) == [4, 5]

  code, out, err = train(capsys, *train_args(run_dir, 6),
                         "--gin.run_configs.CheckpointConfig.fallback_on_corrupt=True")
  assert code == 0, err[-2000:]
  assert "falling back to the checkpoint before it" in out
  assert saved_steps(run_dir) == [4, 6]
  assert (run_dir / "checkpoints" / "5.corrupt").is_dir()
