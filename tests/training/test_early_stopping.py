"""Early stopping: the rule against a brute-force reading of it, its settings checked, and
the trainer stopping where it says, resumed or not."""

import json

import numpy as np
import pytest

from meshbayes.runtime.metrics_writer import MetricsWriter
from meshbayes.training import early_stopping
from meshbayes.training.run_configs import EvaluationConfig
from tests.training.runs import train, train_args


def brute_force_stop(nlls, patience):
  """With ``min_delta = 0``: the first pass whose last ``patience`` passes (itself included)
  are all no lower than the lowest NLL before them."""
  for i in range(patience, len(nlls)):
    if min(nlls[i - patience + 1:i + 1]) >= min(nlls[:i - patience + 1]):
      return i
  return None


@pytest.mark.parametrize("seed", range(20))
def test_stop_point_agrees_with_brute_force(seed):
  rng = np.random.default_rng(seed)
  # A falling curve with noise and ties, so that plateaus occur at random places.
  nlls = np.round(3.0 - np.log1p(np.arange(30)) * rng.uniform(0.1, 0.5)
                  + rng.normal(0, 0.05, 30), 2).tolist()
  for patience in (1, 2, 3, 5):
    want = brute_force_stop(nlls, patience)
    got = early_stopping.stop_point([(100 * (i + 1), x) for i, x in enumerate(nlls)], patience)
    if want is None:
      assert got is None
    else:
      best = int(np.argmin(nlls[:want - patience + 1]))  # the earliest of equals
      assert (got.step, got.best_step, got.best_nll) == (100 * (want + 1), 100 * (best + 1),
                                                         nlls[best])


def test_min_delta_and_nan():
  history = [(1, 3.0), (2, 2.95), (3, 2.9), (4, 2.89)]
  assert early_stopping.stop_point(history, 2) is None
  # 0.1 lower is needed: 2.95 and 2.9 are not, 2.89 neither; the best stays step 1's.
  assert early_stopping.stop_point(history, 2, min_delta=0.1) == early_stopping.EarlyStop(3, 1,
                                                                                          3.0)
  assert early_stopping.stop_point([(1, 3.0), (2, float("nan"))], 1) == early_stopping.EarlyStop(
      2, 1, 3.0)
  assert early_stopping.stop_point([(1, float("nan")), (2, float("nan"))], 1) is None


@pytest.mark.parametrize("fields, message", [
    ({"patience": 2}, "EvaluationConfig: patience=2 needs evaluations (period > 0)"),
    ({"period": 10, "patience": 0}, "EvaluationConfig: patience=0 must be a positive int"),
    ({"period": 10, "patience": 2, "min_delta": -0.1},
     "EvaluationConfig: min_delta=-0.1 must be a non-negative number"),
])
def test_settings_are_checked(fields, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    EvaluationConfig(**fields)


def _stopping_args(model_dir, steps):
  # min_delta = 1e9: no pass after the first improves, so patience 2 stops at step 6.
  return [*train_args(model_dir, steps), "--gin.run_configs.EvaluationConfig.period=2",
          "--gin.run_configs.EvaluationConfig.patience=2",
          "--gin.run_configs.EvaluationConfig.min_delta=1e9"]


@pytest.mark.integration
def test_the_trainer_stops_where_the_rule_says_and_a_resumed_run_too(tmp_path, capsys):
  whole = tmp_path / "whole"
  code, out, _ = train(capsys, *_stopping_args(whole, 20))
  assert code == 0 and "stopped early at step 6" in out
  assert sorted(int(p.name) for p in (whole / "checkpoints").iterdir() if p.name.isdigit())[-1] == 6
  stop = json.loads((whole / early_stopping.STOP_FILE).read_text())
  assert (stop["step"], stop["best_step"], stop["patience"]) == (6, 2, 2)
  assert early_stopping.read_stop(whole) == early_stopping.EarlyStop(6, 2, stop["best_nll"])
  assert [s for s, _ in early_stopping.validation_history(whole)] == [2, 4, 6]
  # Run again: nothing to do.
  code, out, _ = train(capsys, *_stopping_args(whole, 20))
  assert code == 0 and "stopped early at step 6 (best step 2); nothing to do" in out

  # Interrupted at step 4 (one pass without improvement), resumed with the cap of 20.
  resumed = tmp_path / "resumed"
  code, out, _ = train(capsys, *_stopping_args(resumed, 4))
  assert code == 0 and "stopped early" not in out
  assert not (resumed / early_stopping.STOP_FILE).exists()
  code, out, _ = train(capsys, *_stopping_args(resumed, 20))
  assert code == 0 and "resuming from the checkpoint of step 4" in out
  assert "stopped early at step 6" in out
  assert json.loads((resumed / early_stopping.STOP_FILE).read_text()) == stop

  # More patience continues the stopped run; its stale record goes.
  code, out, _ = train(capsys, *_stopping_args(resumed, 8)[:-2],
                       "--gin.run_configs.EvaluationConfig.patience=5")
  assert code == 0 and "trained to step 8" in out
  assert early_stopping.read_stop(resumed) is None


def test_an_undefined_validation_nll_reads_back_as_nan(tmp_path):
  """metrics.jsonl is strict JSON (a NaN is null with its reason); the history reads it
  back as NaN, which never counts as an improvement."""
  (tmp_path / "eval").mkdir()
  writer = MetricsWriter(tmp_path / "eval", tmp_path / "eval" / "metrics.jsonl")
  for step, nll in ((2, 3.0), (4, float("nan")), (6, 2.5)):
    writer.write(step, {"nll": nll})
  writer.close()
  history = early_stopping.validation_history(tmp_path)
  assert [s for s, _ in history] == [2, 4, 6]
  assert history[0][1] == 3.0 and np.isnan(history[1][1]) and history[2][1] == 2.5
