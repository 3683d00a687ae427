"""Input data on the mesh: which examples each host reads, and the global batch.

The batch is split over the mesh axes of the ``batch`` rule; a host reads the examples of
the batch shards its devices hold, so hosts holding the same shards read the same ones.
``data_layout`` gives a host's ``(shard_id, num_shards)`` (seqio's ``ShardInfo``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from meshbayes.field_checks import positive_ints


@dataclasses.dataclass(frozen=True)
class DataLayout:
  """What one host's input pipeline must produce.

  The data layer batches by it (``meshbayes.data.TaskData``); a single host
  reading everything is ``DataLayout(global_batch_size)``.

  Attributes:
    global_batch_size: examples per step over all hosts.
    per_host_batch_size: examples this host feeds per step (default: an equal
      share, ``global_batch_size // num_shards``).
    shard_id: which shard of the dataset this host reads (0-based).
    num_shards: into how many shards the dataset is split.
  """

  global_batch_size: int
  per_host_batch_size: int | None = None
  shard_id: int = 0
  num_shards: int = 1

  def __post_init__(self):
    if self.per_host_batch_size is None:
      object.__setattr__(self, "per_host_batch_size", self.global_batch_size // self.num_shards)
    positive_ints("DataLayout", self, "global_batch_size", "per_host_batch_size", "num_shards")
    if not 0 <= self.shard_id < self.num_shards:
      raise ValueError(f"DataLayout: shard_id={self.shard_id!r} must be in "
                       f"[0, num_shards={self.num_shards})")


def _batch_mesh_axes(batch_spec: PartitionSpec) -> tuple[str, ...]:
  axes = batch_spec[0] if len(batch_spec) else None
  return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def batch_shards(mesh: Mesh, batch_spec: PartitionSpec) -> int:
  """Number of pieces the batch dimension is split into."""
  return math.prod(mesh.shape[a] for a in _batch_mesh_axes(batch_spec))


def data_layout(mesh: Mesh, batch_spec: PartitionSpec, global_batch_size: int,
                process_index: int | None = None) -> DataLayout:
  """The data layout of one host.

  Args:
    mesh: the device mesh.
    batch_spec: the mesh ``PartitionSpec`` of a batch (its first entry splits
      the batch dimension).
    global_batch_size: examples per step over all hosts.
    process_index: the host (default: this process).

  Returns:
    The host's ``DataLayout``.

  Raises:
    ValueError: the batch does not divide over the mesh, or hosts hold
      overlapping but unequal sets of batch shards.
  """
  shards = batch_shards(mesh, batch_spec)
  if global_batch_size % shards:
    raise ValueError(f"global batch of {global_batch_size} examples cannot be split into "
                     f"{shards} equal shards over mesh axes {_batch_mesh_axes(batch_spec)}; "
                     f"use a multiple of {shards}")
  process_index = jax.process_index() if process_index is None else process_index
  per_process = _shards_by_process(mesh, batch_spec)
  groups = _groups(per_process)
  mine = tuple(sorted(per_process[process_index]))
  return DataLayout(global_batch_size=global_batch_size,
                    per_host_batch_size=global_batch_size * len(mine) // shards,
                    shard_id=groups.index(mine), num_shards=len(groups))


def shard_readers(mesh: Mesh, batch_spec: PartitionSpec) -> list[tuple[int, ...]]:
  """The processes that read each data shard (``DataLayout.shard_id``), in order.

  Hosts whose devices hold the same batch rows (model parallelism across
  hosts) read the same examples; the first of each group can speak for it
  (e.g. save the input position once).
  """
  per_process = _shards_by_process(mesh, batch_spec)
  groups = _groups(per_process)
  readers: list[list[int]] = [[] for _ in groups]
  for process, shards in sorted(per_process.items()):
    readers[groups.index(tuple(sorted(shards)))].append(process)
  return [tuple(r) for r in readers]


def _shards_by_process(mesh: Mesh, batch_spec: PartitionSpec) -> dict[int, set[int]]:
  axes = _batch_mesh_axes(batch_spec)
  sizes = [mesh.shape[a] for a in axes]
  positions = [mesh.axis_names.index(a) for a in axes]
  per_process: dict[int, set[int]] = {}
  for coords, device in np.ndenumerate(mesh.devices):
    shard = int(np.ravel_multi_index([coords[p] for p in positions], sizes)) if axes else 0
    per_process.setdefault(device.process_index, set()).add(shard)
  return per_process


def _groups(per_process: dict[int, set[int]]) -> list[tuple[int, ...]]:
  """The distinct sets of batch shards hosts hold, in order: the data shards."""
  groups = sorted({tuple(sorted(s)) for s in per_process.values()})
  held = [shard for group in groups for shard in group]
  if len(held) != len(set(held)):
    raise ValueError(f"hosts hold overlapping but unequal batch shards {groups}; use a mesh "
                     "where each host's devices hold whole, disjoint batch shards")
  return groups


def global_batch(mesh: Mesh, batch_spec: PartitionSpec, local_batch: Any) -> Any:
  """Turns each host's local batch into global ``jax.Array``s split over the batch axes.

  Args:
    mesh: the device mesh.
    batch_spec: the mesh ``PartitionSpec`` of the batch dimension.
    local_batch: a pytree of host arrays, this host's ``per_host_batch_size``
      examples (all of them on a single host).

  Returns:
    The same pytree of global arrays.
  """
  def place(x):
    x = np.asarray(x)
    spec = PartitionSpec(*batch_spec, *([None] * (x.ndim - len(batch_spec))))
    return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), x)

  return jax.tree.map(place, local_batch)
