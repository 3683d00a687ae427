"""Each host's share of the training input, the same whatever the number of hosts.

The split is read as ``input_shards`` seqio shards; a step's global batch is
shard 0's batch, then shard 1's, and so on, and a host reads only the shards its
devices' rows need. The position is saved per shard (``HostBatches.states``), so
a checkpoint of N processes resumes in M (docs/multihost.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from meshbayes.data.pipeline import Batch, TaskData, TrainIterator
from meshbayes.field_checks import positive_int
from meshbayes.partitioning import DataLayout


def state_name(shard: int, num_shards: int) -> str:
  """The name of input shard ``shard``'s saved position (a file name in a checkpoint)."""
  return f"shard-{shard:05d}-of-{num_shards:05d}"


@dataclasses.dataclass(frozen=True)
class HostInput:
  """The training batches of one host.

  Attributes:
    data: the task and batching (``data.batch_size`` is the global batch).
    layout: this host's place in the batch (``Partitioner.data_layout``).
    input_shards: shards the training split is read as; a multiple of
      ``layout.num_shards`` that divides the global batch size.
  """

  data: TaskData
  layout: DataLayout
  input_shards: int

  def __post_init__(self):
    shards, hosts = self.input_shards, self.layout.num_shards
    positive_int("train", "input_shards", shards)
    if shards % hosts:
      raise ValueError(f"train: input_shards={shards} must be a multiple of the {hosts} "
                       "groups of hosts that feed different examples; set "
                       "--gin.run_configs.InputConfig.shards=N")
    if self.layout.global_batch_size % shards:
      raise ValueError(f"train: input_shards={shards} must divide the global batch size "
                       f"{self.layout.global_batch_size}")

  @property
  def shard_ids(self) -> range:
    """The input shards this host reads."""
    per_host = self.input_shards // self.layout.num_shards
    return range(self.layout.shard_id * per_host, (self.layout.shard_id + 1) * per_host)

  @property
  def state_names(self) -> list[str]:
    """The names of this host's shards' saved positions."""
    return [state_name(shard, self.input_shards) for shard in self.shard_ids]

  def train_batches(self, start_batch: int = 0, states: Mapping[str, bytes] | None = None
                    ) -> HostBatches:
    """This host's batches (``layout.per_host_batch_size`` rows each), endlessly.

    Args:
      start_batch: where to start when a shard's state is not in ``states``:
        that many batches are read and dropped.
      states: saved positions by ``state_name`` (``HostBatches.states``).
    """
    size = self.layout.global_batch_size // self.input_shards
    streams, restored = [], 0
    for shard, name in zip(self.shard_ids, self.state_names):
      stream = self.data.train_batches(
          DataLayout(self.layout.global_batch_size, size, shard, self.input_shards))
      state = (states or {}).get(name)
      if state is not None:
        stream.restore(state)
        restored += 1
      else:
        stream.skip(start_batch)
      streams.append((name, stream))
    return HostBatches(streams, restored)


class HostBatches:
  """A host's batches: its shards' batches concatenated, and their positions.

  Attributes:
    restored: how many shards started from a saved position (the others
      skipped batches).
  """

  def __init__(self, streams: list[tuple[str, TrainIterator]], restored: int):
    self._streams, self.restored = streams, restored

  def __iter__(self) -> HostBatches:
    return self

  def __next__(self) -> Batch:
    parts = [next(stream) for _, stream in self._streams]
    if len(parts) == 1:
      return parts[0]
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

  def states(self) -> dict[str, Callable[[], bytes]]:
    """Each shard's position now, by ``state_name``, as a function that serializes it
    (shards whose pipeline cannot save its position are left out)."""
    saved = {name: stream.save() for name, stream in self._streams}
    return {name: state for name, state in saved.items() if state is not None}
