"""The data layer: the synthetic tasks, the id vocabulary and the input pipeline."""

import numpy as np
import pytest

from meshbayes import data
from meshbayes.data import synthetic
from meshbayes.data.pipeline import TaskData
from meshbayes.partitioning import DataLayout

LENGTHS = {"inputs": 16, "targets": 16}


def test_id_vocabulary_round_trip_and_errors():
  vocabulary = data.IdVocabulary(32)
  assert vocabulary.encode("5 7 31") == [5, 7, 31]
  assert vocabulary.decode([5, 7, 31, 1, 0, 0]) == "5 7 31"
  with pytest.raises(ValueError, match=r"token '32' is not an id in \[1, 32\)"):
    vocabulary.encode("5 32")
  with pytest.raises(ValueError, match=r"token 'x' is not an id"):
    vocabulary.encode("x")


def test_reverse_task_examples_and_their_batches():
  task = TaskData("synthetic_reverse", LENGTHS, batch_size=4, shuffle=False)
  batch = next(task.train_batches(DataLayout(4)))
  for row in range(4):
    inputs = [int(t) for t in batch["encoder_input_tokens"][row] if t]
    targets = [int(t) for t in batch["decoder_target_tokens"][row] if t]
    assert inputs[-1] == targets[-1] == synthetic.VOCABULARY.eos_id
    assert targets[:-1] == inputs[:-1][::-1]
    np.testing.assert_array_equal(batch["decoder_input_tokens"][row, 1:],
                                  batch["decoder_target_tokens"][row, :-1])
    assert batch["decoder_input_tokens"][row, 0] == 0
    assert batch["decoder_loss_weights"][row].sum() == len(targets)


def test_train_batches_resume_exactly_and_shards_are_disjoint():
  task = TaskData("synthetic_copy", LENGTHS, batch_size=8, seed=3)
  straight = task.train_batches(DataLayout(8))
  for _ in range(5):
    next(straight)
  resumed = next(task.train_batches(DataLayout(8), start_batch=5))
  np.testing.assert_array_equal(resumed["encoder_input_tokens"],
                                next(straight)["encoder_input_tokens"])
  rows = lambda shard: {tuple(r) for r in next(task.train_batches(
      DataLayout(64, 32, shard, 2)))["encoder_input_tokens"]}
  assert not rows(0) & rows(1)


def test_eval_batches_cover_the_split_once_with_padding():
  task = TaskData("synthetic_reverse", LENGTHS, batch_size=100)
  batches = list(task.eval_batches(DataLayout(100)))
  assert len(batches) == 6 and all(b["encoder_input_tokens"].shape == (100, 16) for b in batches)
  real = sum(int(b["decoder_loss_weights"].any(axis=1).sum()) for b in batches)
  assert real == synthetic.NUM_EXAMPLES["validation"]


def test_train_set_size_counts_target_tokens_after_truncation():
  lengths = {"inputs": 16, "targets": 8}
  expected = sum(min(len(s) + 1, 8) for s in synthetic.sequences("train"))
  assert data.train_set_size("synthetic_reverse", lengths) == expected
  assert data.train_set_size("synthetic_reverse", lengths, unit="examples") == 50_000
  with pytest.raises(ValueError, match="unit='bytes' must be 'tokens' or 'examples'"):
    data.train_set_size("synthetic_reverse", lengths, unit="bytes")


@pytest.mark.parametrize("kwargs, match", [
    (dict(task="synthetic_revers"), r"task 'synthetic_revers' is not registered; registered "
                                    r"tasks: .*synthetic_reverse"),
    (dict(feature_lengths={"inputs": 16}), r"feature_lengths=\{'inputs': 16\} must map"),
    (dict(batch_size=0), r"batch_size=0 must be a positive int"),
    (dict(batch_size=True), r"batch_size=True must be a positive int"),
])
def test_task_data_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    TaskData(**({"task": "synthetic_reverse", "feature_lengths": LENGTHS, "batch_size": 8}
                | kwargs))
