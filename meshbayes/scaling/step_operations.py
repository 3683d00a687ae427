"""A compiled program's thunk-level operations by kind of work, and a profile's times.

Splits the operations the CPU runtime executes one by one (a fusion, a matmul,
a copy: the compiled program's thunks), each counted as often as the loops
around it run, by kind of work: FLOPs (``meshbayes.scaling.hlo``'s counting),
transcendentals, and bytes (every operand read once, the result written once);
``profile`` adds each operation's seconds in a ``jax.profiler`` trace. Thunks
may overlap (two cores), so their sum can exceed the step. Eigen's ``dot``
thunks return before their matmul is done: the runtime's wait for them
(``matmul_async_wait``) is that matmul time.

Each operation gets one kind, from the Python functions its (fused) HLO
instructions were traced from, which the compiled program records as stack
frames; the first that applies wins:

- ``matmul``: a ``dot`` or ``convolution``, alone or fused;
- ``layout``: an operation that only moves data (copy, transpose, broadcast,
  slice, concatenate, dynamic-update-slice);
- ``noise``: the estimators' samplers (``threefry2x32``, ``random_words``,
  ``standard_normal``, ``rademacher``) and any elementwise work fused with them;
- ``kl``: the KL (``record_kl``, ``Prior.kl``, ``normal_kl``, ``total_kl``);
- ``optimizer``: optax's update and its application;
- ``checks``: the step's metrics (posterior stddev means, the gradient norm; the
  state's finiteness check, ``all_finite``, left the step);
- ``estimator``: the estimators' other elementwise work (softplus, ``stddev *
  eps``, ``loc + ...``, signs applied, the variance's square root);
- ``dropout``;
- ``model``: the rest (norms, attention softmax, activations, the loss,
  embedding lookups).
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax

from meshbayes.scaling import hlo

KINDS = ("matmul", "layout", "noise", "kl", "optimizer", "checks", "estimator", "dropout",
         "model")
# Python functions (innermost names of the recorded stack frames) by kind.
FUNCTIONS = {
    "noise": ("threefry2x32", "random_words", "standard_normal", "rademacher"),
    "kl": ("record_kl", "NormalPrior.kl", "ScaleMixtureNormalPrior.kl",
           "TrainableNormalPrior.kl", "normal_kl", "normal_kl_sum", "_normal_kl_sum_forward",
           "_normal_kl_sum_backward", "total_kl", "kl_penalty"),
    "checks": ("all_finite", "posterior_stddev_metrics", "layer_stddevs"),
    "estimator": ("flipout", "conv_flipout", "reparameterization", "local_reparameterization",
                  "_gaussian_sample", "_gaussian_sample_backward", "stddev_of_scale",
                  "_stddev_forward", "_stddev_backward",
                  "Normal.sample", "_safe_sqrt", "posterior_mean", "variational_param"),
    "dropout": ("Dropout.__call__",),
}
_DATA_MOVEMENT = frozenset((
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "copy", "transpose",
    "reshape", "broadcast", "slice", "dynamic-slice", "dynamic-update-slice", "concatenate",
    "pad", "reverse", "iota", "copy-start", "copy-done"))
_CONTAINERS = frozenset(("while", "call", "conditional"))
FRAME_ID = re.compile(r"stack_frame_id=(\d+)")


# --- the compiled program: thunk-level operations and their kinds ------------------------------

def stack_frames(text: str) -> dict[int, tuple[tuple[str, str], ...]]:
  """Each stack frame id of an HLO module's text as ``(file, function)`` pairs, innermost first."""
  tables: dict[str, dict[int, str]] = collections.defaultdict(dict)
  section = None
  for line in text.splitlines():
    if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      section = line
      continue
    match = re.match(r"^(\d+) (.*)$", line) if section else None
    if not match:
      section = None if not line.strip() or not line[0].isdigit() else section
      continue
    tables[section][int(match.group(1))] = match.group(2)
  field = lambda entry, name: int(re.search(name + r"=(\d+)", entry).group(1))
  locations = {i: (tables["FileNames"].get(field(e, "file_name_id"), "").strip('"'),
                   tables["FunctionNames"].get(field(e, "function_name_id"), "").strip('"'))
               for i, e in tables["FileLocations"].items()}
  frames: dict[int, tuple[tuple[str, str], ...]] = {}

  def chain(frame: int, seen: tuple[int, ...] = ()) -> tuple[tuple[str, str], ...]:
    if frame in frames:
      return frames[frame]
    entry = tables["StackFrames"].get(frame)
    if entry is None or frame in seen:
      return ()
    parent = field(entry, "parent_frame_id")
    here = (locations.get(field(entry, "file_location_id"), ("", "")),)
    frames[frame] = here + (chain(parent, seen + (frame,)) if parent != frame else ())
    return frames[frame]

  for frame in tables["StackFrames"]:
    chain(frame)
  return frames


def kind_of_frames(frames: Sequence[tuple[str, str]]) -> str | None:
  """The kind named by one instruction's stack (innermost frame first), or None."""
  # 'all_finite.<locals>.<listcomp>' is all_finite's.
  functions = {function.split(".<locals>")[0] for _, function in frames}
  for kind in ("noise", "kl"):
    if functions & set(FUNCTIONS[kind]):
      return kind
  if "clip_by_global_norm" in functions:  # optax's, or training.multi_tensor's
    return "optimizer"
  if any("/optax/" in file for file, _ in frames):
    # The gradient norm reported as a metric is optax's tree_norm called by the step.
    return "optimizer" if "chain" in functions else "checks"
  for kind in ("checks", "estimator", "dropout"):
    if functions & set(FUNCTIONS[kind]):
      return kind
  return None


@dataclasses.dataclass
class Operation:
  """One thunk-level operation of a compiled program, per step."""

  name: str
  opcode: str
  kind: str
  executions: float  # times it runs per step (loop trip counts)
  flops: float  # per step, all executions
  transcendentals: float
  bytes: float
  shape: str
  transposes: bool  # moves data across the layout (a physical transpose)


def _instructions_called(computations: dict[str, list[hlo.Instruction]], name: str
                         ) -> Iterator[hlo.Instruction]:
  """Every instruction of a fused computation and the computations it calls."""
  for instruction in computations.get(name, []):
    yield instruction
    for _, child in hlo.called_computations(instruction):
      if child != name:
        yield from _instructions_called(computations, child)


def _bytes_moved(instruction: hlo.Instruction, shapes: dict[str, tuple[hlo.Shape, ...]],
                 fused: list[hlo.Instruction]) -> tuple[float, float]:
  """Bytes an operation reads and writes: each operand once, the result once, except
  that a fused slice of an operand reads the slice, and an in-place update of a
  buffer (``dynamic-update-slice``, a scan's stacking) writes the update alone."""
  size = lambda names, table: sum(s.bytes for n in names for s in table.get(n, ()))
  if instruction.opcode == "dynamic-update-slice":
    return size(instruction.operands[1:], shapes), size(instruction.operands[1:2], shapes)
  if not fused:
    return size(instruction.operands, shapes), sum(s.bytes for s in hlo.flat_shapes(instruction))
  inner = {i.name: hlo.flat_shapes(i) for i in fused}
  users = collections.defaultdict(list)
  for i in fused:
    for position, operand in enumerate(i.operands):
      users[operand].append((i, position))
  read = 0.0
  for i in fused:
    if i.opcode != "parameter":
      continue
    index = int(i.operands[0])
    whole = size(instruction.operands[index:index + 1], shapes)
    uses = users.get(i.name, [])
    if uses and all(u.opcode in ("dynamic-slice", "slice") and p == 0 for u, p in uses):
      read += min(whole, sum(s.bytes for u, _ in uses for s in inner[u.name]))
    elif uses and all(u.opcode == "dynamic-update-slice" and p == 0 for u, p in uses):
      continue  # the buffer updated in place
    else:
      read += whole
  root = next((i for i in fused if i.is_root), None)
  by_name = {i.name: i for i in fused}
  outputs = root.operands if root is not None and root.opcode == "tuple" else (
      [root.name] if root is not None else [])
  written = 0.0
  for name in outputs:
    out = by_name.get(name)
    if out is not None and out.opcode == "dynamic-update-slice":
      written += size(out.operands[1:2], inner)
    else:
      written += sum(s.bytes for s in inner.get(name, ()))
  return read, written


def operations(text: str) -> list[Operation]:
  """The thunk-level operations of an HLO module (``compiled.as_text()``) with their kinds."""
  computations, entry = hlo.parse_computations(text)
  frames = stack_frames(text)
  found: list[Operation] = []

  def frame_kind(instruction: hlo.Instruction) -> str | None:
    match = FRAME_ID.search(instruction.attributes)
    return kind_of_frames(frames.get(int(match.group(1)), ())) if match else None

  def visit(name: str, executions: float, stack: tuple[str, ...]) -> None:
    instructions = computations.get(name, [])
    shapes = {i.name: hlo.flat_shapes(i) for i in instructions}
    by_name = {i.name: i for i in instructions}
    for instruction in instructions:
      called = list(hlo.called_computations(instruction))
      if instruction.opcode == "call":
        called += [("calls", c) for c in re.findall(r"to_apply=%?([\w.\-]+)",
                                                     instruction.attributes)]
      if instruction.opcode in _CONTAINERS:
        trips = 1
        if instruction.opcode == "while":
          condition = next((c for role, c in called if role == "condition"), None)
          trips = hlo.trip_count(instruction, computations.get(condition, []), by_name) or 1
        for role, child in called:
          if child not in stack:
            visit(child, executions * (trips if role in ("body", "condition") else 1),
                  stack + (child,))
        continue
      if instruction.opcode in ("parameter", "constant", "tuple", "get-tuple-element",
                                "bitcast"):
        continue  # no work: buffers are aliased
      inner = [instruction]
      for role, child in called:
        if role == "calls":
          inner.extend(_instructions_called(computations, child))
      inner_shapes = dict(shapes, **{i.name: hlo.flat_shapes(i) for i in inner})
      flops = transcendentals = 0.0
      for i in inner:
        if i.opcode in ("dot", "convolution"):
          flops += hlo._matmul_flops(i, inner_shapes)
        elif i.opcode != "fusion":
          f, t = hlo._elementwise_flops(i, inner_shapes)
          flops, transcendentals = flops + f, transcendentals + t
      opcodes = {i.opcode for i in inner} - {"fusion"}
      if opcodes & {"dot", "convolution"}:
        kind = "matmul"
      elif opcodes <= _DATA_MOVEMENT:
        kind = "layout"
      else:
        kinds = {frame_kind(i) for i in inner} - {None}
        kind = next((k for k in KINDS if k in kinds), "model")
      fused = next((c for role, c in called if role == "calls"), None)
      operand_bytes, result_bytes = _bytes_moved(instruction, shapes,
                                                 computations.get(fused, []))
      result = hlo.flat_shapes(instruction)
      found.append(Operation(instruction.name, instruction.opcode, kind, executions,
                             executions * flops, executions * transcendentals,
                             executions * (operand_bytes + result_bytes),
                             ",".join(f"{s.dtype}{list(s.dims)}" for s in result[:2]),
                             "transpose" in opcodes))

  visit(entry, 1.0, (entry,))
  return found


def by_kind(ops: Sequence[Operation], seconds: dict[str, float] | None = None
            ) -> dict[str, dict[str, float]]:
  """Totals per kind: operations, FLOPs, transcendentals, bytes, and profiled seconds."""
  table: dict[str, dict[str, float]] = {}
  for kind in KINDS:
    mine = [op for op in ops if op.kind == kind]
    row = {"operations": len(mine), "flops": sum(op.flops for op in mine),
           "transcendentals": sum(op.transcendentals for op in mine),
           "bytes": sum(op.bytes for op in mine)}
    if seconds is not None:
      row["seconds"] = sum(seconds.get(op.name, 0.0) for op in mine)
      row["transposing_seconds"] = sum(seconds.get(op.name, 0.0) for op in mine
                                       if op.transposes)
    table[kind] = row
  if seconds is not None:  # the Eigen dots' work, done after their thunks return
    table["matmul_async_wait"] = {"seconds": seconds.get(ASYNC_WAIT, 0.0)}
  return table


# --- the profile: per-thunk times from a jax.profiler trace ------------------------------------

ASYNC_WAIT = "(waiting for asynchronous thunks)"


def thunk_seconds(trace_dir: str, module: str | None = "jit_train_step") -> dict[str, float]:
  """Total seconds of each HLO operation of ``module`` in the trace(s) under ``trace_dir``.

  Some thunks (the Eigen ``dot``s) return before their work is done; the
  runtime's wait for them is recorded apart and summed here as ``ASYNC_WAIT``.
  """
  totals: dict[str, float] = collections.defaultdict(float)
  for path in Path(trace_dir).rglob("*.trace.json.gz"):
    with gzip.open(path, "rt") as f:
      events = [e for e in json.load(f).get("traceEvents", []) if e.get("ph") == "X"]
    runs = set()
    for event in events:
      args = event.get("args") or {}
      if (module is None or args.get("hlo_module") == module) and "hlo_op" in args:
        totals[args["hlo_op"]] += event.get("dur", 0.0) * 1e-6
        runs.add(args.get("run_id"))
    for event in events:
      args = event.get("args") or {}
      if event["name"].startswith("ThunkExecutor::Execute (wait") and args.get("run_id") in runs:
        totals[ASYNC_WAIT] += event.get("dur", 0.0) * 1e-6
  return dict(totals)


def profile(program: Callable[[], Any], steps: int, module: str | None = "jit_train_step"
            ) -> dict[str, float]:
  """Per-step seconds of each operation of ``module`` over ``steps`` steps of ``program``."""
  jax.block_until_ready(program())
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
      for _ in range(steps):
        jax.block_until_ready(program())
    return {name: s / steps for name, s in thunk_seconds(trace_dir, module).items()}


def top_operations(ops: Sequence[Operation], seconds: dict[str, float], count: int
                   ) -> list[dict[str, Any]]:
  """The ``count`` operations that took the most profiled seconds, slowest first."""
  ranked = sorted(ops, key=lambda op: -seconds.get(op.name, 0.0))[:count]
  return [{"name": op.name, "kind": op.kind, "transposes": op.transposes,
           "seconds": seconds.get(op.name, 0.0),
           "executions": op.executions, "flops": op.flops, "bytes": op.bytes, "shape": op.shape}
          for op in ranked]

