"""The training command as a user runs it: outputs, exact resume, and preemption."""

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.trainer.runs import ROOT, run, tool, train_args

pytestmark = pytest.mark.integration

REQUIRED_METRICS = {"loss", "nll", "kl", "kl_weight", "neg_elbo", "accuracy", "learning_rate",
                    "gradient_norm", "posterior_stddev/attention", "posterior_stddev/mlp",
                    "tokens_per_second", "step_seconds"}


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
  """8 steps straight versus 4 steps, a new process, and 4 more: identical state."""
  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  first = run("meshbayes.train", train_args(straight, 8))
  assert first.returncode == 0, first.stderr[-2000:]
  assert run("meshbayes.train", train_args(resumed, 4)).returncode == 0
  second = run("meshbayes.train", train_args(resumed, 8))
  assert second.returncode == 0, second.stderr[-2000:]
  assert "resuming from the checkpoint of step 4" in second.stdout
  assert ("opening the training input (1 shard(s) on this host), restoring its saved position"
          in second.stdout)

  diff = tool("inspect_checkpoint.py", "diff", straight, resumed, "--step", 8)
  assert diff.returncode == 0, diff.stdout[-3000:]
  assert diff.stdout.strip().endswith("identical")
  assert "opt_state/1/0/mu" in diff.stdout or "opt_state" in diff.stdout  # optimizer state too

  # What a run leaves behind.
  assert (straight / "config.gin").read_text().count("train.train_steps") == 1
  lines = [json.loads(l) for l in (straight / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines] == [2, 4, 6, 8]
  assert REQUIRED_METRICS <= set(lines[-1])
  assert list((straight / "train").glob("events.out.tfevents.*"))
  assert "step 8/8 [" in first.stdout and "tok/s" in first.stdout


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
