"""What a compiled program does per device and step, read from its optimized HLO.

``program_profile`` gives every collective's replica groups (size, mesh axes, torus
dimensions) and the HBM bytes of the top-level operations (on a GPU, kernels) by kind of
work (``WORK_KINDS``); its bytes per collective kind add up to ``hlo.analyze``'s.
``program_record`` makes a record for ``roofline.predict`` from a program's HLO alone.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from meshbayes.scaling import hlo, roofline

_IOTA = re.compile(r"^\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_MESH = re.compile(r"^mesh\[([^\]]*)\](?:,\s*device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))?"
                   r"\s*\{([^}]*)\}")
_MESH_AXIS = re.compile(r"'([^']+)'=(\d+)")
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")


def _ints(text: str) -> list[int]:
  return [int(v) for v in text.split(",") if v.strip()]


def _iota(dims: list[int], perm: str | None) -> np.ndarray:
  ids = np.arange(math.prod(dims)).reshape(dims)
  return ids.transpose(_ints(perm)) if perm else ids


def parse_replica_groups(attributes: str, num_devices: int) -> list[list[int]] | None:
  """The device groups of a collective from its HLO attributes; None if unreadable.

  Reads the explicit (``{{0,1},{2,3}}``), iota (``[2,4]<=[4,2]T(1,0)``) and
  mesh (``mesh['a'=4,'b'=2] {'a'}``) forms, and a collective-permute's
  ``source_target_pairs`` (each pair that moves data a group; a device
  sending to itself is a group of one).

  >>> parse_replica_groups("replica_groups=[2,4]<=[4,2]T(1,0), to_apply=%add", 8)
  [[0, 2, 4, 6], [1, 3, 5, 7]]
  >>> parse_replica_groups("replica_groups=mesh['x'=4,'y'=2] {'y'}, to_apply=%add", 8)[:2]
  [[0, 1], [2, 3]]
  """
  pairs = _PAIRS.search(attributes)
  if pairs:
    found = [_ints(p) for p in re.findall(r"\{(\d+,\d+)\}", pairs.group(1))]
    moving = [p for p in found if p[0] != p[1]]
    return (moving or [found[0][:1]]) if found else None
  start = attributes.find("replica_groups=")
  if start < 0:
    return None
  text = attributes[start + len("replica_groups="):]
  if text.startswith("{}"):
    return [list(range(num_devices))]
  if text.startswith("{{"):
    end = text.find("}}")
    return [_ints(g) for g in text[2:end].split("},{")] if end > 0 else None
  iota = _IOTA.match(text)
  if iota:
    groups, size, dims, perm = iota.groups()
    return _iota(_ints(dims), perm).reshape(int(groups), int(size)).tolist()
  mesh = _MESH.match(text)
  if mesh:
    axes_text, id_dims, id_perm, reduced = mesh.groups()
    axes = [(name, int(size)) for name, size in _MESH_AXIS.findall(axes_text)]
    names = [name for name, _ in axes]
    shape = [size for _, size in axes]
    chosen = [names.index(a) for a in re.findall(r"'([^']+)'", reduced)
              if a in names]
    if not axes or not chosen or math.prod(shape) != num_devices:
      return None
    ids = (_iota(_ints(id_dims), id_perm) if id_dims else np.arange(num_devices))
    ids = ids.reshape(shape)
    rest = [i for i in range(len(shape)) if i not in chosen]
    size = math.prod(shape[i] for i in chosen)
    return ids.transpose(rest + chosen).reshape(-1, size).tolist()
  return None


def group_axes(group: Sequence[int], mesh_shape: Mapping[str, int]) -> list[str]:
  """The mesh axes along which a group's devices (flat mesh positions) differ.

  >>> group_axes([0, 8, 16], {"data": 4, "model": 8}), group_axes([0, 1], {"data": 4, "model": 8})
  (['data'], ['model'])
  """
  names = list(mesh_shape)
  coords = np.array(np.unravel_index(np.asarray(group), tuple(mesh_shape.values()))).T
  return [names[i] for i in range(len(names)) if len(set(coords[:, i])) > 1]


def torus_spans(group: Sequence[int], chip_coords: Sequence[Sequence[int]]
                ) -> list[roofline.TorusSpan]:
  """The torus dimensions a group's chips span (``chip_coords``: per flat mesh position).

  >>> coords = [(x, y, 0) for y in range(4) for x in range(4)]
  >>> torus_spans([0, 2], coords)
  [TorusSpan(chips=2, stride=2, slice_chips=4)]
  """
  everything = np.asarray(chip_coords)
  mine = everything[np.asarray(group)]
  spans = []
  for dim in range(everything.shape[1]):
    positions = sorted(set(mine[:, dim].tolist()))
    if len(positions) < 2:
      continue
    stride = min(b - a for a, b in zip(positions, positions[1:]))
    extent = int(everything[:, dim].max() - everything[:, dim].min() + 1)
    spans.append(roofline.TorusSpan(len(positions), int(stride), extent))
  return spans


def runs_per_step(computations: dict[str, list[hlo.Instruction]], entry: str
                  ) -> tuple[dict[str, float], set[str]]:
  """How often each computation runs per step (loops unrolled), and the fused ones."""
  runs: dict[str, float] = defaultdict(float)
  fused: set[str] = set()

  def visit(name: str, times: float, stack: tuple[str, ...], in_fusion: bool) -> None:
    runs[name] += times
    if in_fusion:
      fused.add(name)
    by_name = {i.name: i for i in computations[name]}
    for instruction in computations[name]:
      called = list(hlo.called_computations(instruction))
      trips = 1
      if instruction.opcode == "while":
        condition = next((c for role, c in called if role == "condition"), None)
        trips = hlo.trip_count(instruction, computations.get(condition, []), by_name) or 1
      for role, child in called:
        if child in stack or child not in computations:
          continue
        visit(child, times * (trips if role in ("body", "condition") else 1), stack + (child,),
              in_fusion or instruction.opcode in FUSION_OPCODES)

  visit(entry, 1.0, (entry,), False)
  return runs, fused


# Top-level operations that move no bytes of their own (and launch no kernel on a GPU).
FREE_OPCODES = frozenset((
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "conditional",
    "call", "after-all", "opt-barrier", "partition-id", "replica-id", "add-dependency"))
_SLICING = frozenset(("dynamic-slice", "slice", "gather"))
# A fusion, or its asynchronous form on GPUs (``fusion-start`` calls the fused computation;
# its ``fusion-done`` moves nothing more).
FUSION_OPCODES = ("fusion", "fusion-start")


# Kinds of work the top-level operations (on a GPU, its kernels) are sorted into.
WORK_KINDS = ("matmul", "slicing", "reduction_or_transpose", "elementwise", "copy", "collective")
_SLICE_ROOTS = frozenset(("dynamic-slice", "dynamic-update-slice", "slice", "gather"))


def shapes_bytes(shapes: Iterable[hlo.Shape]) -> float:
  """The bytes of the arrays ``shapes`` (an operation's results or one operand's)."""
  return float(sum(s.bytes for s in shapes))


class FusedComputations:
  """Per fused computation: whether it holds a matmul, and the bytes its operands are read."""

  def __init__(self, computations: dict[str, list[hlo.Instruction]]):
    self.computations = computations
    self._matmul: dict[str, bool] = {}

  def has_matmul(self, name: str) -> bool:
    if name not in self._matmul:
      self._matmul[name] = False  # guards recursion
      self._matmul[name] = any(
          i.opcode in ("dot", "convolution")
          or any(self.has_matmul(c) for _, c in hlo.called_computations(i) if c in self.computations)
          for i in self.computations.get(name, []))
    return self._matmul[name]

  def work_kind(self, instruction: hlo.Instruction) -> str:
    """A non-matmul fusion's kind of work: by its root (slicing) or XLA's fusion kind
    (``kLoop`` elementwise; ``kInput`` and GPU ``kCustom`` ones reduce or transpose)."""
    name = next((c for role, c in hlo.called_computations(instruction) if role == "calls"), None)
    body = self.computations.get(name, [])
    by_name = {i.name: i for i in body}
    root = next((i for i in body if i.is_root), None)
    roots = [by_name[o] for o in root.operands if o in by_name] \
        if root is not None and root.opcode == "tuple" else [root] if root is not None else []
    if roots and all(r.opcode in _SLICE_ROOTS for r in roots):
      return "slicing"
    return "elementwise" if "kind=kLoop" in instruction.attributes else "reduction_or_transpose"

  def traffic(self, instruction: hlo.Instruction, operand_shapes: list[tuple[hlo.Shape, ...]]
              ) -> float:
    """HBM bytes of a fusion: operands read (only the slices a slicing user reads) and
    results written (only the update of an in-place dynamic-update-slice root)."""
    name = next((c for role, c in hlo.called_computations(instruction) if role == "calls"), None)
    body = self.computations.get(name, [])
    params = {}
    for i in body:
      if i.opcode == "parameter" and i.operands:
        try:
          params[int(i.operands[0])] = i.name
        except ValueError:
          pass
    users: dict[str, list[hlo.Instruction]] = defaultdict(list)
    for i in body:
      for operand in i.operands:
        users[operand].append(i)
    in_place = set()
    root = next((i for i in body if i.is_root), None)
    roots = [root] if root is not None else []
    if root is not None and root.opcode == "tuple":
      by_name = {i.name: i for i in body}
      roots = [by_name[o] for o in root.operands if o in by_name]
    written = 0.0
    shapes = {i.name: hlo.flat_shapes(i) for i in body}
    for r in roots:
      if r.opcode == "dynamic-update-slice" and r.operands and r.operands[0] in params.values():
        in_place.add(r.operands[0])
        written += shapes_bytes(shapes.get(r.operands[1], ()))
      else:
        written += shapes_bytes(hlo.flat_shapes(r))
    read = 0.0
    for index, shape in enumerate(operand_shapes):
      param = params.get(index)
      if param in in_place:
        continue
      readers = users.get(param, [])
      if param is not None and readers and all(
          u.opcode in _SLICING and u.operands[0] == param for u in readers):
        read += sum(shapes_bytes(hlo.flat_shapes(u)) for u in readers)
      else:
        read += shapes_bytes(shape)
    return read + written


def _reduce_scatters(body: list[hlo.Instruction]) -> dict[str, float]:
  """All-reduces in a fused computation that only feed dynamic-slices of their result: the
  TPU compiler's reduce-scatter (an "all-reduce-scatter" fusion). Their shard bytes by name."""
  users: dict[str, list[hlo.Instruction]] = defaultdict(list)
  for i in body:
    for operand in i.operands:
      users[operand].append(i)
  found = {}
  for i in body:
    if i.opcode.removesuffix("-start") == "all-reduce":
      readers = users.get(i.name, [])
      if readers and all(u.opcode == "dynamic-slice" and u.operands[0] == i.name
                         for u in readers):
        found[i.name] = shapes_bytes(hlo.flat_shapes(readers[0]))
  return found


def program_profile(hlo_text: str, mesh_shape: Mapping[str, int],
                    chip_coords: Sequence[Sequence[int]] | None = None) -> dict[str, Any]:
  """Replica groups of every collective and the HBM bytes of a compiled program, per step.

  Args:
    hlo_text: ``compiled.as_text()`` of an SPMD program.
    mesh_shape: the mesh's axes and sizes, in order (``{"data": 64, "model": 8}``).
    chip_coords: the chip coordinates of the device at each flat mesh position
      (``device.coords``); None where the devices have none (CPU meshes).

  Returns:
    ``collective_groups``: one entry per kind and placement with ``group_size``,
    ``mesh_axes``, ``torus_spans`` (``[chips, stride, slice_chips]`` per torus
    dimension; None without coordinates), ``count``, ``executed`` and
    ``executed_bytes`` (result bytes per device and step, as ``hlo.analyze``
    counts them, except that an all-reduce whose result is only sliced, the TPU
    compiler's reduce-scatter, is a ``reduce-scatter`` of its shard, with
    ``hlo_opcode`` all-reduce); ``hbm_bytes_per_device``: ``matmul_ops`` and ``other_ops``,
    the bytes the program's top-level operations (fusions, copies, collectives)
    read and write, loops unrolled, split by whether an operation holds a matmul;
    ``operations_per_device``: for each of ``WORK_KINDS``, how many top-level
    operations run per step (``executed``; on a GPU, kernels) and their ``bytes``.
  """
  computations, entry = hlo.parse_computations(hlo_text)
  num_devices = math.prod(mesh_shape.values())
  census: dict[tuple, list[float]] = {}
  traffic = {"matmul_ops": 0.0, "other_ops": 0.0}
  operations = {kind: {"executed": 0.0, "bytes": 0.0} for kind in WORK_KINDS}
  if entry is None:
    return {"collective_groups": [], "hbm_bytes_per_device": traffic,
            "operations_per_device": operations}
  runs, fused = runs_per_step(computations, entry)
  fusions = FusedComputations(computations)
  for name, times in runs.items():
    if times == 0:
      continue
    shapes = {i.name: hlo.flat_shapes(i) for i in computations[name]}
    scatters = _reduce_scatters(computations[name]) if name in fused else {}
    for instruction in computations[name]:
      opcode = instruction.opcode
      kind = opcode.removesuffix("-start")
      if kind in hlo.COLLECTIVES and not opcode.endswith("-done"):
        groups = parse_replica_groups(instruction.attributes, num_devices)
        group = groups[0] if groups else None
        size = hlo.collective_bytes(kind, instruction)
        if instruction.name in scatters:  # an all-reduce whose result is sliced: a reduce-scatter
          kind, size = "reduce-scatter", scatters[instruction.name]
        key = (kind, opcode.removesuffix("-start"), len(group) if group else None,
               tuple(group_axes(group, mesh_shape)) if group else None,
               tuple(tuple(dataclasses.astuple(s)) for s in torus_spans(group, chip_coords))
               if group and chip_coords is not None else None)
        entry_census = census.setdefault(key, [0, 0.0, 0.0])
        entry_census[0] += 1
        entry_census[1] += times
        entry_census[2] += times * size
      if name in fused or opcode in FREE_OPCODES or opcode.endswith("-done"):
        continue
      operands = [shapes.get(o, ()) for o in instruction.operands]
      if opcode in FUSION_OPCODES:
        moved = fusions.traffic(instruction, operands)
        called = [c for role, c in hlo.called_computations(instruction) if role == "calls"]
        matmul = any(fusions.has_matmul(c) for c in called)
        work = "matmul" if matmul else fusions.work_kind(instruction)
      elif hlo.is_matmul_custom_call(instruction):
        # A cuBLAS GEMM or cuDNN attention: its operands read, its outputs written (not its
        # scratch workspace, the last element of the result).
        results = hlo.flat_shapes(instruction)
        moved = (shapes_bytes(results[:-1] if len(results) > 1 else results)
                 + sum(shapes_bytes(s) for s in operands))
        matmul, work = True, "matmul"
      elif opcode in _SLICING:
        moved, matmul, work = 2 * shapes_bytes(hlo.flat_shapes(instruction)), False, "slicing"
      elif opcode == "dynamic-update-slice":
        moved, matmul = 2 * shapes_bytes(operands[1]) if len(operands) > 1 else 0.0, False
        work = "slicing"
      else:
        result = hlo.collective_bytes(kind, instruction) if kind in hlo.COLLECTIVES else \
            shapes_bytes(hlo.flat_shapes(instruction))
        moved = result + sum(shapes_bytes(s) for s in operands)
        matmul = opcode in ("dot", "convolution")
        work = ("matmul" if matmul else "collective" if kind in hlo.COLLECTIVES
                else "copy" if kind == "copy"
                else "reduction_or_transpose" if opcode in ("reduce", "transpose", "sort")
                else "elementwise")
      traffic["matmul_ops" if matmul else "other_ops"] += times * moved
      operations[work]["executed"] += times
      operations[work]["bytes"] += times * moved
  groups_out = []
  for (kind, opcode, size, axes, spans), (count, executed, executed_bytes) in sorted(
      census.items(), key=lambda item: (item[0][0], -item[1][2])):
    groups_out.append({
        "kind": kind, "hlo_opcode": opcode, "group_size": size if size is not None else num_devices,
        "mesh_axes": list(axes) if axes is not None else None,
        "torus_spans": [list(s) for s in spans] if spans is not None else None,
        "count": int(count), "executed": executed, "executed_bytes": executed_bytes})
  return {"collective_groups": groups_out, "hbm_bytes_per_device": traffic,
          "operations_per_device": operations}


def program_record(hlo_text: str, generation: str, *, batch_size: int, input_length: int,
                   target_length: int, mesh_shape: Mapping[str, int] | None = None,
                   chip_coords: Sequence[Sequence[int]] | None = None,
                   model_flops_per_device: float | None = None) -> dict[str, Any]:
  """A record for ``roofline.predict`` from a compiled program's HLO alone (any platform's).

  Args:
    hlo_text: ``compiled.as_text()`` of the step.
    generation: a ``roofline.HARDWARE`` name to predict it for.
    batch_size, input_length, target_length: the global batch of one step.
    mesh_shape: the mesh's axes and sizes; default one device (``{"data": 1}``).
    chip_coords: as for ``program_profile``.
    model_flops_per_device: the model's FLOPs for MFU (default: the program's matmul FLOPs).
  """
  roofline.hardware(generation)
  mesh_shape = dict(mesh_shape or {"data": 1})
  summary = hlo.analyze(hlo_text)
  record = {"generation": generation, "cores": math.prod(mesh_shape.values()),
            "mesh": mesh_shape, "batch_size": batch_size, "input_length": input_length,
            "target_length": target_length, "flops_per_device": summary.matmul_flops,
            "model_flops_per_device": model_flops_per_device,
            "unknown_trip_counts": summary.unknown_trip_counts,
            "collectives": {k: dataclasses.asdict(v) for k, v in summary.collectives.items()}}
  record.update(program_profile(hlo_text, mesh_shape, chip_coords))
  return record



def mesh_chip_coords(mesh: Any) -> list[tuple[int, ...]] | None:
  """``device.coords`` of a ``jax.sharding.Mesh``'s devices in flat order; None without them."""
  coords = [getattr(d, "coords", None) for d in mesh.devices.flat]
  if any(c is None for c in coords):
    return None
  return [tuple(int(v) for v in c) for c in coords]
