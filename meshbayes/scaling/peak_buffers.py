"""The buffers live at a compiled train step's memory peak, each with the kind of its value.

Compiles a step for one CPU device without running it and reads XLA's
live-range dump of its buffers; each buffer live at the peak gets the kind of
the value it holds, from the instruction that computed it (through loops'
stacked outputs): ``parameters``, ``optimizer state``, ``gradients`` (computed
by the backward pass or optax), ``saved activations`` (computed by the forward
pass and kept for the backward pass), ``noise`` (the samplers), ``estimator``
(the estimators' own values: perturbations, variances, sampled outputs), ``other``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
from jax.experimental.compilation_cache import compilation_cache

from meshbayes.scaling import hlo
from meshbayes.scaling.step_operations import FRAME_ID, FUNCTIONS, stack_frames

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
  match = FRAME_ID.search(instruction.attributes)
  stack = frames.get(int(match.group(1)), ()) if match else ()
  for _, function in stack:  # innermost first
    function = function.split(".<locals>")[0]
    if function in FUNCTIONS["noise"]:
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

