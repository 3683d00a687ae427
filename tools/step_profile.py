"""Where the train step's time goes, by kind of work: the compiled program and a profile.

Compiles the trainer's step (``train_step.jit_train_step``, as ``tools/bench.py``'s
``step`` section does) of a preset, deterministic and Bayesian (both AdamW),
and splits each by kind of work three ways:

- ``hlo``: the operations the CPU runtime executes one by one (a fusion, a
  matmul, a copy: the compiled program's thunks), each counted as often as
  the loops around it run: FLOPs (``meshbayes.scaling.hlo``'s counting),
  transcendentals, and bytes (every operand read once, the result written
  once).
- ``profile``: the same operations' times in a ``jax.profiler`` trace of
  ``--profile_steps`` steps (the CPU runtime records one event per thunk),
  per step. Thunks may overlap (two cores), so their sum can exceed the step.
  Eigen's ``dot`` thunks return before their matmul is done: the runtime's
  wait for them (``matmul_async_wait``) is that matmul time.
- ``ablations`` (``--ablations``): the Bayesian step with one kind of work
  taken out, timed alternating with the real step (``bench.alternate``):
  noise drawn as constants, no KL, SGD in place of AdamW. For measurement
  only: no such program is ever trained.

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

  python -m meshbayes.tools.step_profile                       # small, 16 x 64 tokens
  python -m meshbayes.tools.step_profile --ablations --json=runs/step_profile.json
  python -m meshbayes.tools.step_profile --sections=buffers --model=base --batch=24 \\
      --length=192 --dtype=bfloat16

``gpu`` compiles the steps for a GPU (``--target=h200:1``; JAX's CUDA plugin,
the ``gpu-aot`` extra, no GPU) without running them and splits the frozen
step-time model's seconds (``roofline.FROZEN_GPU_MODEL``) by kind of work of
the program's kernels (``hlo_profile.WORK_KINDS``), with each kind's kernels
and HBM bytes and the kernels of avoidable work (``scaling.kernels``).

  python -m meshbayes.tools.step_profile --sections=gpu --target=h200:1 --model=base \\
      --batch=32 --length=256 --dtype=bfloat16 --remat_policy=none

``buffers`` compiles the steps for one CPU device without running them and
lists the buffers live at each program's memory peak (XLA's live-range dump),
each with the kind of the value it holds, from the instruction that computed
it (through loops' stacked outputs): ``parameters``, ``optimizer state``,
``gradients`` (computed by the backward pass or optax), ``saved activations``
(computed by the forward pass and kept for the backward pass), ``noise`` (the
samplers), ``estimator`` (the estimators' own values: perturbations,
variances, sampled outputs), ``other``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import gzip
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.compilation_cache import compilation_cache

from meshbayes.runtime import host_memory, strict_json
from meshbayes.scaling import hlo

KINDS = ("matmul", "layout", "noise", "kl", "optimizer", "checks", "estimator", "dropout",
         "model")
# Python functions (innermost names of the recorded stack frames) by kind.
_FUNCTIONS = {
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
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")


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
    if functions & set(_FUNCTIONS[kind]):
      return kind
  if any("/optax/" in file for file, _ in frames):
    # The gradient norm reported as a metric is optax's tree_norm called by the step.
    return "optimizer" if functions & {"chain", "clip_by_global_norm"} else "checks"
  for kind in ("checks", "estimator", "dropout"):
    if functions & set(_FUNCTIONS[kind]):
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
    match = _FRAME_ID.search(instruction.attributes)
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


# --- ablations: the Bayesian step with one kind of work taken out (measurement only) -----------

@contextlib.contextmanager
def constant_noise():
  """The estimators draw constants instead of noise (same shapes, no hash, no inverse CDF)."""
  from meshbayes.layers import estimators
  saved = estimators.standard_normal, estimators.rademacher
  estimators.standard_normal = lambda key, shape, dtype=jnp.float32: jnp.full(
      tuple(shape), 0.5, dtype)
  estimators.rademacher = lambda key, shape, dtype: jnp.full(tuple(shape), -1, dtype)
  try:
    yield
  finally:
    estimators.standard_normal, estimators.rademacher = saved


@contextlib.contextmanager
def no_kl():
  """Every layer's KL is a constant 0 (nothing computed, no gradient)."""
  from meshbayes.layers import priors
  saved = priors.NormalPrior.kl
  priors.NormalPrior.kl = lambda self, loc, stddev, params, key: jnp.zeros((), jnp.float32)
  try:
    yield
  finally:
    priors.NormalPrior.kl = saved


ABLATIONS: dict[str, Callable[[], Any]] = {
    "constant_noise": constant_noise, "no_kl": no_kl,
    "sgd": contextlib.nullcontext,  # the optimizer is swapped in build_step
}


# --- the memory peak: the buffers live there, by kind -----------------------------------------

BUFFER_KINDS = ("parameters", "optimizer state", "gradients", "saved activations", "noise",
                "estimator", "other")
# Innermost frames that name a value computed inside an estimator (not its noise, not
# the posterior-mean matmul, which the deterministic layer computes as well).
_ESTIMATOR_FUNCTIONS = frozenset((
    "flipout", "conv_flipout", "reparameterization", "local_reparameterization",
    "lookup_flipout", "lookup_reparameterization", "lookup_local_reparameterization",
    "Normal.sample", "_safe_sqrt", "_regenerating_forward", "_regenerating_backward"))
_PEAK_LINE = re.compile(r"^\s+(\S+?)\{([\d,]*)\}: (\d+) bytes")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_INDEX = re.compile(r"index=(\d+)")
_COMMENT = re.compile(r"/\*.*?\*/")


@dataclasses.dataclass
class Buffer:
  """One buffer live at a compiled program's memory peak."""

  name: str  # the HLO value: instruction and tuple index
  bytes: int
  kind: str
  shape: str
  origin: str  # op_name of the instruction that computed its contents


def peak_buffers(live_range: str) -> list[tuple[str, tuple[int, ...], int]]:
  """``(instruction, tuple index, bytes)`` of each buffer live at the peak of an
  ``HloLiveRange`` dump (``*-live-range.txt``)."""
  found, inside = [], False
  for line in live_range.splitlines():
    if "(peak):" in line:
      inside = True
      continue
    if inside:
      match = _PEAK_LINE.match(line)
      if not match:
        break
      index = tuple(int(i) for i in match.group(2).split(",") if i)
      found.append((match.group(1), index, int(match.group(3))))
  return found


def _origin(name: str, index: tuple[int, ...], instructions: dict[str, hlo.Instruction],
            computations: dict[str, list[hlo.Instruction]], depth: int = 0
            ) -> hlo.Instruction | None:
  """The instruction that computed a buffer's contents, through loop outputs, tuples,
  copies and in-place updates (a scan's stacked residual is its body's update)."""
  instruction = instructions.get(name)
  if instruction is None or depth > 40:
    return instruction
  step = lambda n, i=(): _origin(n, i, instructions, computations, depth + 1)
  op = instruction.opcode
  if op == "while" and index:
    body = next((c for role, c in hlo.called_computations(instruction) if role == "body"), None)
    root = next((i for i in computations.get(body, []) if i.is_root), None)
    if root is None or root.opcode != "tuple":
      return instruction
    inner = instructions.get(root.operands[index[0]])
    if (inner is not None and inner.opcode == "get-tuple-element"
        and instructions.get(inner.operands[0], inner).opcode == "parameter"
        and _INDEX.search(inner.attributes)
        and int(_INDEX.search(inner.attributes).group(1)) == index[0]):
      init = instructions.get(instruction.operands[0])  # carried unchanged: the initial value
      return step(init.name, index) if init is not None else instruction
    return step(root.operands[index[0]], index[1:])
  if op == "tuple" and index:
    return step(instruction.operands[index[0]], index[1:])
  if op == "get-tuple-element" and _INDEX.search(instruction.attributes):
    return step(instruction.operands[0], (int(_INDEX.search(instruction.attributes).group(1)),)
                + index)
  if op in ("copy", "bitcast", "copy-done", "copy-start", "optimization-barrier"):
    return step(instruction.operands[0], index)
  if op == "dynamic-update-slice":
    return step(instruction.operands[1])
  if op == "fusion":
    called = next((c for role, c in hlo.called_computations(instruction) if role == "calls"),
                  None)
    fused = computations.get(called, [])
    root = next((i for i in fused if i.is_root), None)
    if root is not None and root.opcode == "tuple" and index:
      root = instructions.get(root.operands[index[0]], root)
    if root is not None and root.opcode == "dynamic-update-slice":
      root = instructions.get(root.operands[1])
    # Through conversions the compiler added (no op_name) to a fused parameter: the operand.
    while (root is not None and not _OP_NAME.search(root.attributes) and root.operands
           and root.opcode != "parameter"):
      root = instructions.get(root.operands[0])
    if root is not None and root.opcode == "parameter":
      return step(instruction.operands[int(root.operands[0])])
    return root or instruction
  return instruction


def _loop_filling(name: str, users: dict[str, list[hlo.Instruction]]
                  ) -> tuple[hlo.Instruction, int] | None:
  """The loop (and its tuple index) that takes the buffer ``name`` as an initial value,
  through copies and bitcasts."""
  frontier, seen = [name], set()
  while frontier:
    current = frontier.pop()
    seen.add(current)
    for user in users.get(current, []):
      if user.opcode == "tuple":
        loop = next((w for w in users.get(user.name, []) if w.opcode == "while"), None)
        if loop is not None:
          return loop, user.operands.index(current)
      elif user.opcode in ("copy", "bitcast") and user.name not in seen:
        frontier.append(user.name)
  return None


def _named_origin(name: str, index: tuple[int, ...], instructions: dict[str, hlo.Instruction],
                  computations: dict[str, list[hlo.Instruction]],
                  users: dict[str, list[hlo.Instruction]]) -> hlo.Instruction | None:
  """``_origin``, continued past instructions the compiler added without an ``op_name``:
  a conversion goes to its operand, and a buffer a loop fills in place (zeros that a
  scan stacks its residuals or accumulates gradients into) to what the loop writes."""
  origin = _origin(name, index, instructions, computations)
  if origin is not None and not _OP_NAME.search(origin.attributes) and not index:
    loop = _loop_filling(name, users)
    if loop is not None:
      filled = _origin(loop[0].name, (loop[1],), instructions, computations)
      if filled is not None and _OP_NAME.search(filled.attributes):
        return filled
  seen: set[str] = set()
  while (origin is not None and not _OP_NAME.search(origin.attributes)
         and origin.name not in seen and origin.operands and origin.operands[0] in instructions):
    seen.add(origin.name)
    origin = _origin(origin.operands[0], (), instructions, computations)
  return origin


def buffer_kind(instruction: hlo.Instruction | None, entry_parameters: frozenset[str],
                frames: dict[int, tuple[tuple[str, str], ...]]) -> str:
  """The kind of a buffer from the instruction that computed it (``BUFFER_KINDS``)."""
  if instruction is None:
    return "other"
  if instruction.name in entry_parameters:
    if instruction.name.startswith("state_params"):
      return "parameters"
    return "optimizer state" if instruction.name.startswith("state_opt_state") else "other"
  match = _FRAME_ID.search(instruction.attributes)
  stack = frames.get(int(match.group(1)), ()) if match else ()
  for _, function in stack:  # innermost first
    function = function.split(".<locals>")[0]
    if function in _FUNCTIONS["noise"]:
      return "noise"
    if function in ("posterior_mean", "_contract"):
      break
    if function in _ESTIMATOR_FUNCTIONS:
      return "estimator"
  op_name = _OP_NAME.search(instruction.attributes)
  op_name = op_name.group(1) if op_name else ""
  if "transpose(" in op_name or any("/optax/" in file for file, _ in stack):
    return "gradients"
  return "saved activations" if "jvp(" in op_name else "other"


def classify_peak(hlo_text: str, live_range: str) -> list[Buffer]:
  """The buffers live at the peak of a compiled program, largest first, each with its kind."""
  computations, entry = hlo.parse_computations(hlo_text)
  # Long operand lists carry /*index=N*/ comments that hlo's parser leaves on the names.
  clean = lambda i: dataclasses.replace(i, operands=tuple(
      _COMMENT.sub("", o).lstrip("%") for o in i.operands))
  computations = {name: [clean(i) for i in c] for name, c in computations.items()}
  instructions = {i.name: i for c in computations.values() for i in c}
  entry_parameters = frozenset(i.name for i in computations.get(entry, [])
                               if i.opcode == "parameter")
  frames = stack_frames(hlo_text)
  users: dict[str, list[hlo.Instruction]] = collections.defaultdict(list)
  for instruction in instructions.values():
    for operand in instruction.operands:
      users[operand].append(instruction)
  buffers = []
  for name, index, size in peak_buffers(live_range):
    origin = _named_origin(name, index, instructions, computations, users)
    shapes = hlo.flat_shapes(instructions[name]) if name in instructions else ()
    group = instructions[name].shapes[index[0]] if name in instructions and index and len(
        instructions[name].shapes) > index[0] else shapes
    op_name = _OP_NAME.search(origin.attributes) if origin is not None else None
    buffers.append(Buffer(name + "{" + ",".join(map(str, index)) + "}", size,
                          buffer_kind(origin, entry_parameters, frames),
                          ",".join(f"{s.dtype}{list(s.dims)}" for s in group[:1]),
                          op_name.group(1).replace("\\'", "'") if op_name
                          else (origin.name if origin else "")))
  return sorted(buffers, key=lambda b: -b.bytes)


@contextlib.contextmanager
def _no_persistent_cache():
  """JAX's persistent compilation cache off: a program read from it is not compiled, so
  XLA dumps no buffer assignment for it."""
  enabled = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()  # the cache's use is decided once, then remembered
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", enabled)
    compilation_cache.reset_cache()


def compile_for_buffers(spec: Any) -> tuple[Any, str, str]:
  """Compiles ``spec``'s step for one CPU device without running it (nothing is allocated):
  the compiled program, its HLO text, and XLA's live-range dump of its buffers."""
  from meshbayes.scaling.aot import prepare_step
  from meshbayes.scaling.targets import parse_target

  prepared = prepare_step(spec, parse_target("cpu:1"))
  with tempfile.TemporaryDirectory() as dump, _no_persistent_cache():
    compiled = prepared.lower().compile(compiler_options={
        "xla_dump_to": dump, "xla_dump_hlo_as_text": True,
        "xla_dump_hlo_module_re": "train_step", "xla_llvm_disable_expensive_passes": True})
    found = sorted(Path(dump).glob("*train_step*after_optimizations-live-range.txt"))
    if not found:
      raise RuntimeError(f"XLA wrote no live-range dump in {dump}: {sorted(os.listdir(dump))}")
    live_range = found[-1].read_text()
  return compiled, compiled.as_text(), live_range


def buffer_report(spec: Any, top: int) -> dict[str, Any]:
  """XLA's memory analysis of ``spec``'s compiled step and its peak buffers by kind."""
  start = time.perf_counter()
  compiled, text, live_range = compile_for_buffers(spec)
  memory = compiled.memory_analysis()
  buffers = classify_peak(text, live_range)
  by = {kind: {"bytes": sum(b.bytes for b in buffers if b.kind == kind),
               "buffers": sum(1 for b in buffers if b.kind == kind)} for kind in BUFFER_KINDS}
  return {"compile_seconds": time.perf_counter() - start,
          "argument_bytes": int(memory.argument_size_in_bytes),
          "output_bytes": int(memory.output_size_in_bytes),
          "alias_bytes": int(memory.alias_size_in_bytes),
          "temp_bytes": int(memory.temp_size_in_bytes),
          "peak_bytes": sum(b.bytes for b in buffers), "by_kind": by,
          "top": [dataclasses.asdict(b) for b in buffers[:top]]}


def buffers_markdown(report: dict[str, Any]) -> str:
  """Peak bytes by kind, deterministic and Bayesian side by side, then the largest buffers."""
  det, bay = report["deterministic"], report["bayesian"]
  gib = lambda b: f"{b / 2 ** 30:.2f}"
  lines = ["| at the peak | det. GiB | det. buffers | Bayes. GiB | Bayes. buffers | "
           "Bayes. - det. GiB |", "|---|---:|---:|---:|---:|---:|"]
  for kind in BUFFER_KINDS:
    d, b = det["by_kind"][kind], bay["by_kind"][kind]
    lines.append(f"| {kind} | {gib(d['bytes'])} | {d['buffers']} | {gib(b['bytes'])} | "
                 f"{b['buffers']} | {gib(b['bytes'] - d['bytes'])} |")
  lines.append(f"| peak (live-range) | {gib(det['peak_bytes'])} | | {gib(bay['peak_bytes'])} | | "
               f"{gib(bay['peak_bytes'] - det['peak_bytes'])} |")
  lines.append(f"| XLA temporaries | {gib(det['temp_bytes'])} | | {gib(bay['temp_bytes'])} | | "
               f"ratio {bay['temp_bytes'] / det['temp_bytes']:.2f} |")
  for name in ("deterministic", "bayesian"):
    lines += ["", f"Largest buffers at the {name} step's peak:", "",
              "| MiB | kind | shape | computed by |", "|---:|---|---|---|"]
    for b in report[name]["top"]:
      origin = b["origin"].split("/")
      lines.append(f"| {b['bytes'] / 2 ** 20:.1f} | {b['kind']} | {b['shape']} | "
                   f"{'/'.join(origin[-3:])} |")
  return "\n".join(lines)


# --- gpu: the frozen step-time model by kind of work ---------------------------------------------

def gpu_report(spec: Any, target: Any) -> dict[str, Any]:
  """``spec``'s step compiled for a GPU target: the frozen model's seconds by kind of work."""
  from meshbayes.scaling import aot, roofline

  record = aot.compile_and_profile(spec, target)
  if record.get("error") or not record.get("roofline"):
    raise SystemExit(f"--target={target.name}: the step did not compile: "
                     f"{record.get('error') or record.get('message')}")
  seconds = roofline.seconds_by_kind(record)
  operations = record["operations_per_device"]
  return {"step": record["roofline"]["max"], "fits": record["fits"],
          "peak_bytes": record["peak_bytes_per_device"],
          "by_kind": {kind: {"seconds": seconds[kind], **operations[kind]} for kind in seconds},
          "avoidable_kernels": record["avoidable_kernels"]}


def gpu_markdown(report: dict[str, Any]) -> str:
  """Frozen-model milliseconds, kernels and HBM GB by kind of work, side by side."""
  det, bay = report["deterministic"], report["bayesian"]
  lines = ["| kind of work | det. ms | det. kernels | det. GB | Bayes. ms | Bayes. kernels "
           "| Bayes. GB |", "|---|" + "---:|" * 6]
  row = lambda r: (f"{r['seconds'] * 1e3:.1f} | {r['executed']:,.0f} | "
                   f"{r['bytes'] / 1e9:.1f}")
  for kind in det["by_kind"]:
    lines.append(f"| {kind} | {row(det['by_kind'][kind])} | {row(bay['by_kind'][kind])} |")
  step = lambda r: f"{r['step']['step_seconds'] * 1e3:.1f} ms, MFU {r['step']['mfu']:.1%}"
  lines += [f"| step | {step(det)} | | | {step(bay)} | | |", "",
            "| avoidable work | det. kernels | det. GB | Bayes. kernels | Bayes. GB |",
            "|---|---:|---:|---:|---:|"]
  for kind in det["avoidable_kernels"]:
    if kind != "kernels":
      d, b = det["avoidable_kernels"][kind], bay["avoidable_kernels"][kind]
      lines.append(f"| {kind} | {d['executed']:,.0f} | {d['bytes'] / 1e9:.1f} "
                   f"| {b['executed']:,.0f} | {b['bytes'] / 1e9:.1f} |")
  return "\n".join(lines)


# --- the steps ---------------------------------------------------------------------------------

def step_spec(args: argparse.Namespace, deterministic: bool, optimizer: str = "adamw") -> Any:
  """The trainer's step of ``args``' preset and batch on one device (``data_only`` rules)."""
  from meshbayes.scaling.aot import StepSpec

  overrides = {name: value for name, value in (("dtype", args.dtype),
                                               ("remat_policy", args.remat_policy)) if value}
  return StepSpec(model=args.model, deterministic=deterministic, optimizer=optimizer,
                  batch_size=args.batch, input_length=args.length, target_length=args.length,
                  model_parallel=1, partitioning="data_only", num_train_units=1e6,
                  overrides=tuple(overrides.items()))


def build_step(args: argparse.Namespace, deterministic: bool, optimizer: str = "adamw"
               ) -> tuple[Callable[[], Any], str, dict[str, float]]:
  """A runnable step (fresh state, one fixed batch), its HLO text and XLA's cost analysis."""
  from meshbayes.partitioning import Partitioner
  from meshbayes.tools.bench import compiled_train_step

  partitioner = Partitioner(data=1, model=1, rules="data_only", devices=jax.devices()[:1])
  spec = step_spec(args, deterministic, optimizer)
  shapes = spec.input_shapes()
  rng = np.random.default_rng(0)
  vocab = spec.config().vocab_size
  batch = {name: jnp.asarray(rng.integers(1, vocab, size=shape), jnp.int32)
           for name, shape in shapes.items()}
  batch["decoder_loss_weights"] = jnp.ones(shapes["decoder_loss_weights"], jnp.int32)
  state, compiled = compiled_train_step(spec, partitioner, batch)
  holder = [state]

  def run():
    holder[0], metrics = compiled(holder[0], batch)  # the old state is donated
    return metrics["loss"]

  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return run, compiled.as_text(), {k: float(cost.get(k, 0.0))
                                   for k in ("flops", "transcendentals", "bytes accessed")}


def top_operations(ops: Sequence[Operation], seconds: dict[str, float], count: int
                   ) -> list[dict[str, Any]]:
  ranked = sorted(ops, key=lambda op: -seconds.get(op.name, 0.0))[:count]
  return [{"name": op.name, "kind": op.kind, "transposes": op.transposes,
           "seconds": seconds.get(op.name, 0.0),
           "executions": op.executions, "flops": op.flops, "bytes": op.bytes, "shape": op.shape}
          for op in ranked]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", default="small")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--length", type=int, default=64)
  parser.add_argument("--profile_steps", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=3, help="timed rounds (alternating)")
  parser.add_argument("--ablations", action=argparse.BooleanOptionalAction, default=False)
  parser.add_argument("--top", type=int, default=15, help="slowest operations listed")
  parser.add_argument("--json", default=None, help="also write the report here")
  parser.add_argument("--sections", default="time",
                      help="comma-separated: time (work and profiled seconds by kind), "
                           "buffers (the memory peak's buffers by kind; compiled, not run), "
                           "gpu (the frozen model's seconds by kind on --target; compiled)")
  parser.add_argument("--target", default="h200:1", help="the gpu section's GPU: h100:N, h200:N")
  parser.add_argument("--dtype", default=None, help="compute dtype (default: the preset's)")
  parser.add_argument("--remat_policy", default=None, help="none, full or minimal (default: "
                      "the preset's)")
  args = parser.parse_args(argv)
  sections = [s for s in args.sections.split(",") if s]
  unknown = sorted(set(sections) - {"time", "buffers", "gpu"})
  if unknown or not sections:
    parser.error(f"--sections={args.sections!r}: {', '.join(unknown) or 'none given'} not "
                 "among time, buffers, gpu")
  if "gpu" in sections:
    from meshbayes.scaling.targets import parse_target
    try:
      target = parse_target(args.target)
    except ValueError as error:
      parser.error(f"--target: {error}")
    if target.platform != "gpu":
      parser.error(f"--target={args.target}: name a GPU (h100:N, h200:N)")
  report: dict[str, Any] = {"model": args.model, "batch_size": args.batch,
                            "length": args.length, "dtype": args.dtype,
                            "remat_policy": args.remat_policy,
                            "devices": [str(d) for d in jax.devices()]}
  if "buffers" in sections:
    report["buffers"] = {name: buffer_report(step_spec(args, deterministic), args.top)
                         for name, deterministic in (("deterministic", True), ("bayesian", False))}
    print(buffers_markdown(report["buffers"]))
  if "gpu" in sections:
    report["gpu"] = {"target": target.name, **{
        name: gpu_report(step_spec(args, deterministic), target)
        for name, deterministic in (("deterministic", True), ("bayesian", False))}}
    print(gpu_markdown(report["gpu"]))
  if "time" in sections:
    report.update(time_report(args))
    print(markdown(report))
  if args.json:
    text = strict_json.dumps(report, null_reasons=strict_json.NULL_REASONS, indent=2)
    Path(args.json).write_text(text + "\n")
  return report


def time_report(args: argparse.Namespace) -> dict[str, Any]:
  """Work and profiled seconds by kind, deterministic and Bayesian, and the step times."""
  from meshbayes.tools.bench import alternate

  report: dict[str, Any] = {}
  programs = {}
  for name, deterministic in (("deterministic", True), ("bayesian", False)):
    run, text, cost = build_step(args, deterministic)
    ops = operations(text)
    seconds = profile(run, args.profile_steps)
    programs[name] = run
    report[name] = {"cost_analysis": cost, "by_kind": by_kind(ops, seconds),
                    "profiled_seconds": sum(seconds.values()),
                    "top": top_operations(ops, seconds, args.top),
                    "operation_seconds": seconds}
  if args.ablations:
    for ablation, context in ABLATIONS.items():
      with context():
        programs[ablation] = build_step(args, False,
                                        "sgd" if ablation == "sgd" else "adamw")[0]
    programs["deterministic_sgd"] = build_step(args, True, "sgd")[0]
  fastest, medians = alternate(programs, args.rounds)
  report["seconds"], report["median_seconds"] = fastest, medians
  return report


def markdown(report: dict[str, Any]) -> str:
  """The report's tables: work and profiled seconds by kind, then the programs' step times."""
  det, bay = report["deterministic"]["by_kind"], report["bayesian"]["by_kind"]
  lines = ["| kind | det. GFLOP | det. GB | det. s | Bayes. GFLOP | Bayes. GB | Bayes. s "
           "| excess s |", "|---|" + "---:|" * 7]
  for kind in (*KINDS, "matmul_async_wait"):
    d, b = det[kind], bay[kind]
    work = lambda row, key, scale: f"{row[key] / scale:.2f}" if key in row else "-"
    lines.append(f"| {kind} | {work(d, 'flops', 1e9)} | {work(d, 'bytes', 1e9)} | "
                 f"{d['seconds']:.3f} | {work(b, 'flops', 1e9)} | {work(b, 'bytes', 1e9)} | "
                 f"{b['seconds']:.3f} | {b['seconds'] - d['seconds']:+.3f} |")
  lines.append(f"| all profiled | | | {report['deterministic']['profiled_seconds']:.3f} | | | "
               f"{report['bayesian']['profiled_seconds']:.3f} | "
               f"{report['bayesian']['profiled_seconds'] - report['deterministic']['profiled_seconds']:+.3f} |")
  seconds = report["seconds"]
  lines += ["", "| program | step s (fastest) | median | / Bayesian |", "|---|---:|---:|---:|"]
  lines += [f"| {name} | {t:.3f} | {report['median_seconds'][name]:.3f} | "
            f"{t / seconds['bayesian']:.3f} |" for name, t in seconds.items()]
  return "\n".join(lines)


if __name__ == "__main__":
  host_memory.exec_with_malloc_tunables()
  main()
