"""Logical axis rules: which mesh axis each logical axis name is split over.

A table maps logical names (``batch``, ``embed``, ``mlp``, ...) to mesh axes in priority
order (T5X, flax): for each dimension the first rule naming it wins unless its mesh axis
is already used by the same array; a name mapped to None is replicated. ``PRESETS``:
``data_only``, ``megatron``, ``fsdp_tp`` (T5X's standard rules; docs/partitioning.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from flax import linen as nn
from jax.sharding import PartitionSpec

from meshbayes.partitioning.mesh import DATA_AXIS, MODEL_AXIS

MeshAxes = str | tuple[str, ...] | None
LogicalRules = tuple[tuple[str, MeshAxes], ...]

# Logical names every table replicates (T5X's bookkeeping axes).
_REPLICATED = ("kv", "length", "layers", "stack", "relpos_buckets", "abspos_buckets",
               "mlp_activations")


def standard_rules(activation_partitioning_dims: int = 1,
                   parameter_partitioning_dims: int = 1) -> LogicalRules:
  """T5X's standard logical axis rules.

  Args:
    activation_partitioning_dims: 1 splits activations over ``data`` (batch)
      only; 2 also splits their ``embed`` over ``model``.
    parameter_partitioning_dims: 1 splits weights over ``model`` only; 2 also
      splits their ``embed`` over ``data`` (FSDP-like).

  Returns:
    The priority-ordered table.

  >>> dict(standard_rules())['mlp']
  'model'
  """
  for name, dims in (("activation_partitioning_dims", activation_partitioning_dims),
                     ("parameter_partitioning_dims", parameter_partitioning_dims)):
    if dims not in (1, 2):
      raise ValueError(f"standard_rules: {name}={dims!r} must be 1 or 2")
  rules: list[tuple[str, MeshAxes]] = [
      ("batch", DATA_AXIS), ("vocab", MODEL_AXIS), ("mlp", MODEL_AXIS), ("heads", MODEL_AXIS),
      ("joined_kv", MODEL_AXIS)]
  if activation_partitioning_dims == 2:
    rules.append(("embed", MODEL_AXIS))
  if parameter_partitioning_dims == 2:
    rules.append(("embed", DATA_AXIS))
  rules.append(("embed", None))
  return tuple(rules) + tuple((name, None) for name in _REPLICATED)


def data_only_rules() -> LogicalRules:
  """Pure data parallelism: the batch over ``data``, every weight replicated."""
  return tuple((name, DATA_AXIS if name == "batch" else None)
               for name, _ in standard_rules() if name != "embed") + (("embed", None),)


PRESETS = {
    "data_only": data_only_rules(),
    "megatron": standard_rules(1, 1),
    "fsdp_tp": standard_rules(1, 2),
}


def resolve_rules(rules: str | Sequence[Sequence], additional_rules: Sequence[Sequence] = ()
                  ) -> LogicalRules:
  """A rule table from a preset name or an explicit table, plus additional rules.

  Args:
    rules: a name in ``PRESETS`` or a sequence of ``(logical name, mesh axes)``.
    additional_rules: appended after ``rules`` (lower priority), as T5X's
      ``additional_rules``: for names the table does not know.

  Returns:
    The table as a tuple of pairs.
  """
  if isinstance(rules, str):
    if rules not in PRESETS:
      raise ValueError(f"logical axis rules {rules!r} is not a preset; valid presets: "
                       f"{', '.join(sorted(PRESETS))}, or give a table of (name, mesh axis) pairs")
    rules = PRESETS[rules]
  table = []
  for rule in tuple(rules) + tuple(additional_rules):
    if len(rule) != 2 or not isinstance(rule[0], str):
      raise ValueError(f"logical axis rule {tuple(rule)!r} must be a pair (logical name, mesh "
                       "axis or tuple of mesh axes or None)")
    name, axes = rule
    table.append((name, tuple(axes) if isinstance(axes, (list, tuple)) else axes))
  return tuple(table)


def validate_rules(rules: LogicalRules, mesh_axis_names: Sequence[str]) -> None:
  """Checks that every rule names only mesh axes the mesh has.

  Raises:
    ValueError: naming the first rule that does not fit the mesh.
  """
  for name, axes in rules:
    for axis in (axes,) if isinstance(axes, str) else axes or ():
      if axis not in mesh_axis_names:
        raise ValueError(f"logical axis rule {(name, axes)!r} names mesh axis {axis!r}, which "
                         f"the mesh {tuple(mesh_axis_names)} does not have")


def logical_to_mesh_spec(logical: Sequence[str | None], rules: LogicalRules, where: str
                         ) -> PartitionSpec:
  """The mesh ``PartitionSpec`` of an array with logical axis names ``logical``.

  Args:
    logical: one logical name (or None) per dimension.
    rules: the rule table.
    where: what the array is, for errors (a parameter path).

  Raises:
    ValueError: a name no rule knows (a typo would otherwise silently
      replicate the array).
  """
  known = {name for name, _ in rules}
  unknown = [name for name in logical if name is not None and name not in known]
  if unknown:
    raise ValueError(f"{where}: logical axis {unknown[0]!r} has no rule; known names: "
                     f"{', '.join(sorted(known))} (add a rule, e.g. additional_rules="
                     f"(({unknown[0]!r}, None),))")
  return nn.logical_to_mesh_axes(tuple(logical), rules)
