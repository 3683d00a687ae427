"""The input's saved position: restored exactly, per input shard, on any number of hosts."""

import itertools

import numpy as np
import pytest

from meshbayes.training import checkpoints
from meshbayes.data import TaskData
from meshbayes.training.host_input import HostInput
from meshbayes.partitioning import DataLayout

DATA = TaskData(task="synthetic_reverse", feature_lengths={"inputs": 8, "targets": 8},
                batch_size=8)
ONE_HOST = DataLayout(8, 8, 0, 1)
TWO_HOSTS = [DataLayout(8, 4, i, 2) for i in range(2)]


def take(batches, n):
  return [b["encoder_input_tokens"] for b in itertools.islice(batches, n)]


def saved(batches):
  return {name: serialize() for name, serialize in batches.states().items()}


def test_a_restored_position_continues_the_batches_exactly(tmp_path):
  host = HostInput(DATA, ONE_HOST, input_shards=1)
  batches = host.train_batches()
  take(batches, 3)
  # Through a checkpoint, written in the background as the trainer does.
  ckpts = checkpoints.Checkpoints(tmp_path / "checkpoints")
  ckpts.save(3, {"x": np.zeros(2, np.float32)}, {"data_position": 3}, batches.states())
  ckpts.close()
  states = checkpoints.read_input_states(tmp_path / "checkpoints" / "3")
  assert list(states) == host.state_names == ["shard-00000-of-00001"]
  expected = take(batches, 3)
  # start_batch only counts for shards without a saved position.
  restored = host.train_batches(start_batch=1000, states=states)
  assert restored.restored == 1
  for got, want in zip(take(restored, 3), expected):
    np.testing.assert_array_equal(got, want)
  skipped = host.train_batches(start_batch=3)
  assert skipped.restored == 0
  np.testing.assert_array_equal(take(skipped, 1)[0], expected[0])


def test_positions_saved_by_one_host_resume_on_two_and_back():
  one = HostInput(DATA, ONE_HOST, input_shards=2)
  two = [HostInput(DATA, layout, input_shards=2) for layout in TWO_HOSTS]
  batches = one.train_batches()
  take(batches, 2)
  states = saved(batches)
  assert sorted(states) == ["shard-00000-of-00002", "shard-00001-of-00002"]
  expected = take(batches, 4)
  # Each of two hosts restores the one shard it reads, from the same checkpoint.
  hosts = [h.train_batches(states=states) for h in two]
  assert [h.restored for h in hosts] == [1, 1]
  for step in range(2):
    parts = [take(h, 1)[0] for h in hosts]
    np.testing.assert_array_equal(np.concatenate(parts), expected[step])
  # Their two saved positions resume on one host again.
  states = {}
  for h in hosts:
    states.update(saved(h))
  for got, want in zip(take(one.train_batches(states=states), 2), expected[2:]):
    np.testing.assert_array_equal(got, want)


def test_a_position_of_another_pipeline_is_a_one_line_error():
  host = HostInput(DATA, ONE_HOST, input_shards=1)
  with pytest.raises(ValueError, match=r"^the saved input position of synthetic_reverse shard "
                                       r"0/1 does not fit its input pipeline \(.+\)$"):
    host.train_batches(states={"shard-00000-of-00001": b"not a position"})
