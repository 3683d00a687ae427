"""The partitioner: a mesh and a rule table, and what follows from them.

``Partitioner`` gives a whole train state's ``NamedSharding``s from logical annotations,
initializes a state directly sharded, sets the context for a model's activation
constraints, and lays out input batches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from meshbayes.partitioning import data as data_lib
from meshbayes.partitioning.mesh import create_mesh
from meshbayes.partitioning.rules import (
  LogicalRules,
  logical_to_mesh_spec,
  resolve_rules,
  validate_rules,
)
from meshbayes.partitioning.specs import logical_specs, path_names

_ON_INDIVISIBLE = ("error", "replicate")


@dataclasses.dataclass(frozen=True, eq=False)
class Partitioner:
  """Places arrays with logical axes on a ``(data, model)`` mesh.

  Attributes:
    num_partitions: model-parallel size (T5X's name); or give ``data``/``model``.
    data: data-parallel size, -1 to fill from the device count.
    model: model-parallel size, -1 to fill from the device count.
    rules: a preset name (``data_only``, ``megatron``, ``fsdp_tp``) or a table
      of ``(logical name, mesh axes)`` pairs.
    additional_rules: pairs appended to ``rules`` (lower priority).
    on_indivisible: what to do with a dimension its mesh axes cannot split
      evenly: ``'error'``, or ``'replicate'`` that dimension with a warning.
    devices: the devices (default ``jax.devices()``; compile-only TPU
      topology devices work too).
    mesh: the mesh built from the above.
    axis_rules: the resolved rule table.

  >>> import jax
  >>> p = Partitioner(model=1, devices=jax.devices()[:1])
  >>> p.mesh_spec(('batch', 'embed'), (8, 16), 'x')
  P('data', None)
  """

  num_partitions: int | None = None
  data: int = -1
  model: int = 1
  rules: str | Sequence[Sequence[Any]] = "megatron"
  additional_rules: Sequence[Sequence[Any]] = ()
  on_indivisible: str = "error"
  devices: Sequence[jax.Device] | None = None
  mesh: Mesh = dataclasses.field(init=False)
  axis_rules: LogicalRules = dataclasses.field(init=False)

  def __post_init__(self):
    if self.on_indivisible not in _ON_INDIVISIBLE:
      raise ValueError(f"Partitioner: on_indivisible={self.on_indivisible!r} must be one of "
                       f"{_ON_INDIVISIBLE}")
    mesh = create_mesh(self.devices, num_partitions=self.num_partitions, data=self.data,
                       model=self.model)
    axis_rules = resolve_rules(self.rules, self.additional_rules)
    validate_rules(axis_rules, mesh.axis_names)
    object.__setattr__(self, "mesh", mesh)
    object.__setattr__(self, "axis_rules", axis_rules)

  def mesh_spec(self, logical: Sequence[str | None], shape: Sequence[int], where: str
                ) -> PartitionSpec:
    """The mesh ``PartitionSpec`` of an array, checked against its shape.

    Args:
      logical: one logical axis name (or None) per dimension.
      shape: the array's shape.
      where: the array's name, for errors and warnings.

    Raises:
      ValueError: a name without a rule, or (with ``on_indivisible='error'``)
        a dimension its mesh axes cannot split evenly.
    """
    if len(logical) != len(shape):
      raise ValueError(f"{where}: logical axes {tuple(logical)} do not match shape {tuple(shape)}")
    spec = list(logical_to_mesh_spec(logical, self.axis_rules, where))
    for dim, (size, axes) in enumerate(zip(shape, spec)):
      if axes is None:
        continue
      ways = math.prod(self.mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))
      if size % ways:
        message = (f"{where}: dimension {dim} ({logical[dim]!r}, size {size}) cannot be split "
                   f"{ways} ways over mesh axis {axes!r}")
        if self.on_indivisible == "error":
          raise ValueError(f"{message}; choose a size divisible by {ways}, another mesh, or "
                           "on_indivisible='replicate'")
        logging.warning("%s; replicating that dimension", message)
        spec[dim] = None
    return PartitionSpec(*spec)

  def shardings(self, abstract_state: Any) -> Any:
    """``NamedSharding``s for every leaf of a state whose parameters are boxed.

    Args:
      abstract_state: e.g. ``jax.eval_shape`` of a function returning the
        state, with parameters as ``nn.LogicallyPartitioned`` boxes.

    Returns:
      A pytree shaped like ``nn.unbox(abstract_state)``.
    """
    specs = logical_specs(abstract_state)
    flat, treedef = jax.tree_util.tree_flatten_with_path(nn.unbox(abstract_state))
    spec_leaves = treedef.flatten_up_to(specs)
    return treedef.unflatten([
        NamedSharding(self.mesh, self.mesh_spec(spec, np.shape(leaf), "/".join(path_names(path))))
        for (path, leaf), spec in zip(flat, spec_leaves)])

  def placed(self, abstract_state: Any) -> Any:
    """``ShapeDtypeStruct``s carrying their shardings, for a state whose parameters are boxed.

    The target of a sharded checkpoint restore, or the input of an ahead-of-time
    compile; shaped like ``nn.unbox(abstract_state)``.
    """
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        nn.unbox(abstract_state), self.shardings(abstract_state))

  @contextlib.contextmanager
  def activation_rules(self) -> Iterator[None]:
    """Mesh and rules in scope, so ``nn.with_logical_constraint`` in a model takes effect.

    Trace (jit, lower) model code inside this context.
    """
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.axis_rules):
      yield

  def init(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
    """Runs ``fn(*args)`` with its outputs created directly sharded.

    ``fn`` returns a state whose parameters are boxed (e.g. a model's
    ``init``, plus an optimizer state from the unboxed parameters). No device
    ever holds more than its shards.

    Returns:
      ``(state, shardings)``: the unboxed state and its ``NamedSharding``s.
    """
    abstract = jax.eval_shape(fn, *args)
    shardings = self.shardings(abstract)
    with self.activation_rules():
      state = jax.jit(lambda *a: nn.unbox(fn(*a)), out_shardings=shardings)(*args)
    return state, shardings

  @property
  def batch_spec(self) -> PartitionSpec:
    """Mesh spec of a batch's leading dimension (the ``batch`` rule)."""
    return logical_to_mesh_spec(("batch",), self.axis_rules, "batch")

  def data_layout(self, global_batch_size: int, process_index: int | None = None
                  ) -> data_lib.DataLayout:
    """Which shard of the data this host (or ``process_index``) reads, and how much."""
    return data_lib.data_layout(self.mesh, self.batch_spec, global_batch_size, process_index)

  def shard_readers(self) -> list[tuple[int, ...]]:
    """The processes that read each data shard (``DataLayout.shard_id``), in order."""
    return data_lib.shard_readers(self.mesh, self.batch_spec)

  def global_batch(self, local_batch: Any) -> Any:
    """This host's examples as global arrays split over the batch axes."""
    return data_lib.global_batch(self.mesh, self.batch_spec, local_batch)
