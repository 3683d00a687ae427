"""The training command as a user runs it, preempted: a signal saves the last step and the
run resumes (the exact resume of a new process: test_train_in_process)."""

import signal
import subprocess
import sys
import time

import pytest

from tests.training.runs import ROOT, run, tool, train_args

pytestmark = pytest.mark.integration


@pytest.mark.slow  # three training processes
def test_sigterm_saves_the_last_step_and_the_run_resumes(tmp_path):
  model_dir = tmp_path / "run"
  process = subprocess.Popen(
      [sys.executable, "-m", "meshbayes.train",
       *train_args(model_dir, 100_000, "--gin.train.log_period=1",
                   "--gin.run_configs.CheckpointConfig.period=100000")],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  metrics = model_dir / "metrics.jsonl"
  deadline = time.monotonic() + 300
  while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
    assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()[-2000:]
    time.sleep(0.2)
  process.send_signal(signal.SIGTERM)
  stdout, stderr = process.communicate(timeout=120)
  assert process.returncode == 143, stderr[-2000:]
  saved = sorted(int(p.name) for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit())
  assert len(saved) == 1 and saved[0] >= 3
  step = saved[0]
  assert f"SIGTERM: saved the checkpoint of step {step}" in stdout

  resumed = run("meshbayes.train", train_args(model_dir, step + 2))
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert f"resuming from the checkpoint of step {step}" in resumed.stdout
  listing = tool("inspect_checkpoint.py", "list", model_dir)
  assert (f"step {step + 2:>8}  (input position: {step + 2} batches; iterator state of 1 of 1 "
          "input shards)") in listing.stdout
