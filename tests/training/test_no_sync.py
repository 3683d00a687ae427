"""The training loop waits on the device only at steps that log, evaluate, save or stop."""

import json

import pytest

from meshbayes.training import trainer
from tests.training.runs import train_args, train_or_fail

pytestmark = pytest.mark.integration


def test_metrics_are_read_only_at_steps_that_log_or_save(tmp_path, monkeypatch):
  reads = []
  read_metrics = trainer.read_metrics

  def recording(pending):
    reads.append([step for step, _ in pending])
    return read_metrics(pending)

  monkeypatch.setattr(trainer, "read_metrics", recording)
  train_or_fail(train_args(tmp_path / "run", 8, "--gin.train.log_period=4",
                           "--gin.run_configs.CheckpointConfig.period=8", kind="deterministic"))
  # Step 1 (compilation, timed apart), then the log step 4, then the log and save step 8.
  assert reads == [[1], [2, 3, 4], [5, 6, 7, 8]]
  logged = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(line)["step"] for line in logged] == [4, 8]
