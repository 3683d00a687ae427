"""Where an evaluation writes without ``ReportConfig.output_dir``: the test split's and the
task's evaluation split's folder as always, a folder of its own for another split (the
pool's), so that its set never replaces the test split's."""

import pytest

from meshbayes.evaluation import driver
from meshbayes.runtime import strict_json
from tests.training.runs import command, eval_args, train_args, train_or_fail


def test_the_test_splits_folder_is_unchanged_and_the_pools_is_its_own():
  folder = lambda split: str(driver.default_output_dir("runs/x", "tatoeba_enfr_20k", split,
                                                       "validation"))
  assert folder("test") == folder("validation") == "runs/x/eval/tatoeba_enfr_20k"
  assert folder("pool_24000") == "runs/x/eval/tatoeba_enfr_20k/pool_24000"
  assert folder("pool") == "runs/x/eval/tatoeba_enfr_20k/pool"


@pytest.mark.integration
def test_an_evaluation_of_another_split_leaves_the_test_splits_set_as_it_was(tmp_path, capsys):
  """``python -m meshbayes.eval`` of a tiny run on the test split, then on the training
  split (standing in for the pool: a split that is neither test nor the task's evaluation
  split): each set in its folder, the test split's untouched by the second."""
  model_dir = tmp_path / "run"
  train_or_fail(train_args(model_dir, 2, kind="deterministic"))
  shared = model_dir / "eval" / "synthetic_reverse"
  for split in ("test", "train"):
    code, _, err = command(capsys, "evaluate", *eval_args(
        model_dir, f"--gin.evaluate.split='{split}'",
        "--gin.evaluation.ReportConfig.bootstrap_resamples=10"), model_from_model_dir=True)
    assert code == 0, err[-2000:]
  tested = strict_json.loads_strict((shared / "metrics.json").read_text())
  other = strict_json.loads_strict((shared / "train" / "metrics.json").read_text())
  assert (tested["split"], other["split"]) == ("test", "train")
  assert strict_json.loads_strict((shared / "manifest.json").read_text())["split"] == "test"
