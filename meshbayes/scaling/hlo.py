"""What a compiled step does per device, read from its optimized HLO text.

``analyze`` counts matmul FLOPs, all FLOPs and the collectives (``HloSummary``) with
every computation weighted by the trip counts of the loops around it, which XLA's
``cost_analysis`` ignores. Shapes in SPMD-partitioned HLO are per device, so every
figure is per device and step.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator

import numpy as np

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_ITEM_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
    "f8e4m3": 1, "f8e3m4": 1, "f8e4m3b11fnuz": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8,
    "u64": 8, "f64": 8, "c64": 8, "c128": 16, "token": 0,
}
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_CALLED = re.compile(r"\b(calls|body|condition|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
# GPU matmuls that XLA hands to cuBLAS (and cuBLASLt) are custom calls, not ``dot``s.
_GEMM_TARGET = re.compile(r'custom_call_target="__cublas\$(?:lt\$matmul|gemm)(?:\$f8)?"')
_GEMM_DIMS = re.compile(r'"dot_dimension_numbers"\s*:\s*\{([^}]*)\}')
# cuDNN's fused attention: its scores' shape (batch, heads, queries, keys) is in the backend
# config; the head width is the queries' last dimension.
_FMHA_TARGET = re.compile(r'custom_call_target="__cudnn\$fmha([A-Za-z]*)"')
_FMHA_SCORES = re.compile(r'"intermediate_tensor_shape"\s*:\s*\{[^{}]*?"dimensions"\s*:\s*\[([^\]]*)\]')
# What XLA's cost analysis counts as one flop (or transcendental) per output element.
_ARITHMETIC = frozenset((
    "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power",
    "atan2", "and", "or", "xor", "not", "negate", "abs", "sign", "shift-left",
    "shift-right-arithmetic", "shift-right-logical", "compare", "select", "clamp", "floor",
    "ceil", "round-nearest-afz", "round-nearest-even", "convert", "popcnt", "clz",
    "is-finite", "real", "imag", "complex"))
_TRANSCENDENTAL = frozenset((
    "exponential", "exponential-minus-one", "log", "log-plus-one", "tanh", "logistic", "sqrt",
    "rsqrt", "cbrt", "sin", "cos", "tan", "erf"))


@dataclasses.dataclass(frozen=True)
class Shape:
  """An HLO array shape: element type and dimensions."""

  dtype: str
  dims: tuple[int, ...]

  @property
  def bytes(self) -> float:
    return _ITEM_BYTES.get(self.dtype, 4) * math.prod(self.dims)


@dataclasses.dataclass(frozen=True)
class Instruction:
  name: str
  shapes: tuple[tuple[Shape, ...], ...]  # the result: one group per top-level tuple element
  opcode: str
  operands: tuple[str, ...]
  attributes: str
  is_root: bool = False


@dataclasses.dataclass
class Collective:
  """Census of one kind of collective; the ``-start`` forms count as their kind.

  Attributes:
    count: how many appear in the program.
    executed: how many run per step.
    bytes: result bytes per device, once per appearance (an all-gather's result is the
      gathered array, a reduce-scatter's the shard).
    executed_bytes: result bytes per device and step.
  """

  count: int = 0
  executed: float = 0
  bytes: float = 0
  executed_bytes: float = 0


@dataclasses.dataclass
class HloSummary:
  """Per-device matmul FLOPs and collectives of one compiled program, loops unrolled.

  Attributes:
    matmul_flops: 2 per multiply-add of every ``dot`` and ``convolution`` (TPUs lower
      matmuls to convolutions), cuBLAS GEMM call and cuDNN fused attention (two matmuls
      forward, five backward); Triton GEMMs are ``dot``s inside fusions.
    flops: those plus every other operation as XLA's cost analysis counts them (one per
      output element of arithmetic, one per input element of a reduction).
    transcendentals: counted apart from ``flops``.
    collectives: a ``Collective`` per kind in ``COLLECTIVES``.
    loops: the trip counts of the loops read.
    unknown_trip_counts: loops whose trip count could not be read (counted once).
  """

  matmul_flops: float = 0.0
  flops: float = 0.0
  transcendentals: float = 0.0
  collectives: dict[str, Collective] = dataclasses.field(
      default_factory=lambda: {kind: Collective() for kind in COLLECTIVES})
  loops: list[int] = dataclasses.field(default_factory=list)
  unknown_trip_counts: int = 0

  def as_dict(self) -> dict:
    return {"matmul_flops": self.matmul_flops, "flops": self.flops,
            "transcendentals": self.transcendentals, "loop_trip_counts": self.loops,
            "unknown_trip_counts": self.unknown_trip_counts,
            "collectives": {k: dataclasses.asdict(v) for k, v in self.collectives.items()}}


def _matching(text: str, start: int) -> int:
  """Index just past the bracket that closes ``text[start]``."""
  depth = 0
  for i in range(start, len(text)):
    if text[i] in "([{":
      depth += 1
    elif text[i] in ")]}":
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


def _split_top_level(text: str) -> list[str]:
  parts, depth, start = [], 0, 0
  for i, c in enumerate(text):
    if c in "([{":
      depth += 1
    elif c in ")]}":
      depth -= 1
    elif c == "," and depth == 0:
      parts.append(text[start:i])
      start = i + 1
  parts.append(text[start:])
  return [p for p in (p.strip() for p in parts) if p]


def _shapes(text: str) -> tuple[Shape, ...]:
  # Layouts (``{1,0:T(8,128)}``) hold no ``type[dims]`` pattern, so a scan finds the arrays.
  return tuple(Shape(t, tuple(int(d) for d in dims.split(",") if d))
               for t, dims in _ARRAY.findall(re.sub(r"/\*.*?\*/", "", text)))


def _parse_instruction(line: str) -> Instruction | None:
  match = _INSTRUCTION.match(line)
  if not match:
    return None
  name, rest = match.groups()
  if rest.startswith("("):
    end = _matching(rest, 0)
    groups = tuple(_shapes(part) for part in _split_top_level(rest[1:end - 1]))
  else:
    end = rest.find(" ")
    groups = (_shapes(rest[:end]),)
  rest = rest[end:].strip()
  paren = rest.find("(")
  if paren < 0:
    return None
  opcode = rest[:paren].strip()
  close = _matching(rest, paren)
  operands = tuple(o.split()[-1].lstrip("%") for o in _split_top_level(rest[paren + 1:close - 1]))
  return Instruction(name, groups, opcode, operands, rest[close:],
                     line.lstrip().startswith("ROOT "))


def parse_computations(text: str) -> tuple[dict[str, list[Instruction]], str | None]:
  """Computations by name, and the entry computation's name."""
  computations: dict[str, list[Instruction]] = {}
  entry, current = None, None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header and not line.startswith(" "):
      current = header.group(1)
      computations[current] = []
      if line.startswith("ENTRY"):
        entry = current
      continue
    if line.startswith("}"):
      current = None
      continue
    if current is not None:
      instruction = _parse_instruction(line)
      if instruction is not None:
        computations[current].append(instruction)
  return computations, entry


def flat_shapes(instruction: Instruction) -> tuple[Shape, ...]:
  return tuple(s for group in instruction.shapes for s in group)


def _dims_attribute(attributes: str, name: str) -> tuple[int, ...]:
  match = re.search(name + r"=\{([0-9,]*)\}", attributes)
  return tuple(int(d) for d in match.group(1).split(",") if d) if match else ()


def _matmul_flops(instruction: Instruction, shapes: dict[str, tuple[Shape, ...]]) -> float:
  out = flat_shapes(instruction)
  if not out or len(instruction.operands) < 2:
    return 0.0
  outputs = math.prod(out[0].dims)
  if instruction.opcode == "dot":
    lhs = shapes.get(instruction.operands[0])
    if not lhs:
      return 0.0
    contracting = _dims_attribute(instruction.attributes, "lhs_contracting_dims")
    return 2.0 * outputs * math.prod(lhs[0].dims[d] for d in contracting)
  return _convolution_flops(instruction, shapes)


def _gemm_dims(attributes: str, name: str) -> tuple[int, ...]:
  """``"lhs_contracting_dimensions":["1"]`` of a GEMM's backend_config as a tuple."""
  numbers = _GEMM_DIMS.search(attributes)
  match = re.search(r'"' + name + r'"\s*:\s*\[([^\]]*)\]', numbers.group(1)) if numbers else None
  return tuple(int(d.strip(' "')) for d in match.group(1).split(",") if d.strip()) if match else ()


def is_gemm_custom_call(instruction: Instruction) -> bool:
  return instruction.opcode == "custom-call" and bool(_GEMM_TARGET.search(instruction.attributes))


def is_attention_custom_call(instruction: Instruction) -> bool:
  """cuDNN's fused attention (``__cudnn$fmha...``), forward or backward."""
  return instruction.opcode == "custom-call" and bool(_FMHA_TARGET.search(instruction.attributes))


def is_matmul_custom_call(instruction: Instruction) -> bool:
  """A library call that multiplies matrices: a cuBLAS GEMM or cuDNN's fused attention."""
  return is_gemm_custom_call(instruction) or is_attention_custom_call(instruction)


def _attention_flops(instruction: Instruction, shapes: dict[str, tuple[Shape, ...]]) -> float:
  """2 x batch x heads x queries x keys x head width per matmul of a cuDNN fused attention:
  two forward (scores, then weights times values), five backward (the scores again and
  the gradients of both products' operands)."""
  scores = _FMHA_SCORES.search(instruction.attributes)
  query = shapes.get(instruction.operands[0]) if instruction.operands else None
  if not scores or not query:
    return 0.0
  dims = [int(v.strip().strip('"')) for v in scores.group(1).split(",") if v.strip()]
  matmuls = 5 if _FMHA_TARGET.search(instruction.attributes).group(1).endswith("Backward") else 2
  return 2.0 * matmuls * math.prod(dims) * query[0].dims[-1]


def custom_call_matmul_flops(instruction: Instruction,
                             shapes: dict[str, tuple[Shape, ...]]) -> float:
  """The matmul FLOPs of a cuBLAS GEMM or a cuDNN fused attention call."""
  if is_attention_custom_call(instruction):
    return _attention_flops(instruction, shapes)
  return _gemm_flops(instruction, shapes)


def _gemm_flops(instruction: Instruction, shapes: dict[str, tuple[Shape, ...]]) -> float:
  """2 x batch x M x N x K of a cuBLAS custom call, from its operands and dot dimensions.

  The result is a tuple (output, workspace); the operands' shapes and the
  backend_config's ``dot_dimension_numbers`` fix the product. A fused bias
  (a third operand) adds no multiply-adds.
  """
  if len(instruction.operands) < 2 or not _GEMM_DIMS.search(instruction.attributes):
    return 0.0
  lhs, rhs = (shapes.get(o) for o in instruction.operands[:2])
  if not lhs or not rhs:
    return 0.0
  lhs, rhs = lhs[0].dims, rhs[0].dims
  batch = math.prod(lhs[d] for d in _gemm_dims(instruction.attributes, "lhs_batch_dimensions"))
  contracting = math.prod(
      lhs[d] for d in _gemm_dims(instruction.attributes, "lhs_contracting_dimensions"))
  if not batch or not contracting:
    return 0.0
  # lhs is batch x M x K and rhs batch x K x N elements: the product is batch x M x N x K.
  return 2.0 * math.prod(lhs) * math.prod(rhs) / (batch * contracting)


def _window(attributes: str) -> dict[str, list[tuple[int, ...]]]:
  """``window={size=8x4 stride=7x3 pad=0_0x3_3 lhs_dilate=8x4}`` as per-dimension tuples."""
  match = re.search(r"window=\{([^}]*)\}", attributes)
  fields: dict[str, list[tuple[int, ...]]] = {}
  for item in (match.group(1).split() if match else ()):
    key, _, value = item.partition("=")
    fields[key] = [tuple(int(v) for v in dim.split("_")) for dim in value.split("x")]
  return fields


def _valid_taps(out: int, size: int, stride: int, low: int, base: int, lhs_dilate: int,
                rhs_dilate: int) -> int:
  """(output, kernel) position pairs of one window dimension that land on an input element.

  TPUs express batched matmuls as convolutions whose windows mostly hit the
  holes of a dilated input; only taps on real elements are multiply-adds.
  """
  position = (np.arange(out)[:, None] * stride + np.arange(size)[None, :] * rhs_dilate - low)
  extent = (base - 1) * lhs_dilate + 1
  valid = (position >= 0) & (position < extent) & (position % lhs_dilate == 0)
  return int(valid.sum())


def _convolution_flops(instruction: Instruction, shapes: dict[str, tuple[Shape, ...]]) -> float:
  """2 x (output batch x output features x kernel input features x valid window taps)."""
  lhs, kernel = (shapes.get(o) for o in instruction.operands[:2])
  labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", instruction.attributes)
  if not lhs or not kernel or not labels:
    return 0.0
  lhs_labels, kernel_labels, out_labels = labels.groups()
  out, lhs, kernel = flat_shapes(instruction)[0].dims, lhs[0].dims, kernel[0].dims
  if len(out) != len(out_labels) or len(lhs) != len(lhs_labels):
    return 0.0
  macs = out[out_labels.index("b")] * out[out_labels.index("f")] * kernel[kernel_labels.index("i")]
  window = _window(instruction.attributes)

  def field(name: str, dim: int, default: int) -> int:
    values = window.get(name)
    return values[dim][0] if values and dim < len(values) else default

  for dim in range(len(out_labels) - 2):
    spatial = str(dim)
    macs *= _valid_taps(out[out_labels.index(spatial)],
                        field("size", dim, kernel[kernel_labels.index(spatial)]),
                        field("stride", dim, 1), field("pad", dim, 0),
                        lhs[lhs_labels.index(spatial)], field("lhs_dilate", dim, 1),
                        field("rhs_dilate", dim, 1))
  return 2.0 * macs


def collective_bytes(kind: str, instruction: Instruction) -> float:
  groups = instruction.shapes
  if instruction.opcode.endswith("-start") and kind in ("all-gather", "collective-permute",
                                                         "all-to-all", "reduce-scatter"):
    # The asynchronous forms return (operands, results[, context]): count the results.
    groups = groups[1:2] if len(groups) > 1 else groups
  return sum(s.bytes for group in groups for s in group)


def trip_count(instruction: Instruction, condition: list[Instruction],
                caller: dict[str, Instruction]) -> int | None:
  """The trip count of a ``while``: from XLA's annotation, else from ``i < N`` in its condition."""
  known = _TRIP_COUNT.search(instruction.attributes)
  if known:
    return int(known.group(1))
  by_name = {i.name: i for i in condition}
  root = next((i for i in condition if i.is_root), None)
  if root is None or root.opcode != "compare" or len(root.operands) != 2:
    return None
  direction = re.search(r"direction=(\w+)", root.attributes)
  limit = None
  for position, operand in enumerate(root.operands):
    constant = by_name.get(operand)
    if constant is not None and constant.opcode == "constant" and constant.operands:
      try:
        limit = (position, int(constant.operands[0]))
      except ValueError:
        pass
  if limit is None or direction is None:
    return None
  position, bound = limit
  op = direction.group(1)
  if position == 0:  # N > i is i < N
    op = {"GT": "LT", "GE": "LE", "LT": "GT", "LE": "GE"}.get(op, op)
  start = _initial_counter(instruction, condition, root.operands[1 - position], caller)
  if op == "LT":
    return max(bound - start, 0)
  if op == "LE":
    return max(bound - start + 1, 0)
  return None


def _initial_counter(instruction: Instruction, condition: list[Instruction], counter: str,
                     caller: dict[str, Instruction]) -> int:
  """The loop counter's initial value when the caller passes a constant; else 0 (scans)."""
  by_name = {i.name: i for i in condition}
  element = by_name.get(counter)
  index = re.search(r"index=(\d+)", element.attributes) if element else None
  init = caller.get(instruction.operands[0]) if instruction.operands else None
  if index is None or init is None or init.opcode != "tuple":
    return 0
  position = int(index.group(1))
  source = caller.get(init.operands[position]) if position < len(init.operands) else None
  if source is not None and source.opcode == "constant" and source.operands:
    try:
      return int(source.operands[0])
    except ValueError:
      return 0
  return 0


def called_computations(instruction: Instruction) -> Iterator[tuple[str, str]]:
  for role, name in _CALLED.findall(instruction.attributes):
    yield role, name
  branches = _BRANCHES.search(instruction.attributes)
  if branches:
    for name in branches.group(1).split(","):
      yield "branch", name.strip().lstrip("%")


def _elementwise_flops(instruction: Instruction, shapes: dict[str, tuple[Shape, ...]]
                       ) -> tuple[float, float]:
  """(flops, transcendentals) of a non-matmul instruction, as XLA's cost analysis counts them:
  one per output element of arithmetic, one per input element of a reduction."""
  if instruction.opcode in _ARITHMETIC or instruction.opcode in _TRANSCENDENTAL:
    out = flat_shapes(instruction)
    elements = math.prod(out[0].dims) if len(out) == 1 else 0
    return (0.0, elements) if instruction.opcode in _TRANSCENDENTAL else (elements, 0.0)
  if instruction.opcode in ("reduce", "reduce-window"):
    operands = [shapes.get(o) for o in instruction.operands[:len(instruction.operands) // 2]]
    return float(sum(math.prod(o[0].dims) for o in operands if o)), 0.0
  return 0.0, 0.0


def analyze(text: str) -> HloSummary:
  """FLOPs and the collective census of an HLO module's text (``compiled.as_text()``).

  >>> text = '''HloModule m
  ... ENTRY %main (a: f32[4,8], b: f32[8,2]) -> f32[4,2] {
  ...   %a = f32[4,8]{1,0} parameter(0)
  ...   %b = f32[8,2]{1,0} parameter(1)
  ...   %d = f32[4,2]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ...   %e = f32[4,2]{1,0} exponential(%d)
  ...   ROOT %r = f32[4,2]{1,0} all-reduce(%e), replica_groups={}, to_apply=%add
  ... }'''
  >>> summary = analyze(text)
  >>> summary.matmul_flops, summary.transcendentals, summary.collectives['all-reduce'].bytes
  (128.0, 8.0, 32.0)
  """
  computations, entry = parse_computations(text)
  summary = HloSummary()
  if entry is None:
    return summary
  # Per computation, for one run: [matmul flops, other flops, transcendentals] and the
  # census {kind: [count, executed, bytes, executed bytes]}.
  memo: dict[str, tuple[list[float], dict[str, list[float]]]] = {}

  def visit(name: str, stack: tuple[str, ...]) -> tuple[list[float], dict[str, list[float]]]:
    if name in memo:
      return memo[name]
    instructions = computations.get(name, [])
    shapes = {i.name: flat_shapes(i) for i in instructions}
    by_name = {i.name: i for i in instructions}
    cost, census = [0.0, 0.0, 0.0], {kind: [0, 0.0, 0.0, 0.0] for kind in COLLECTIVES}
    for instruction in instructions:
      if instruction.opcode in ("dot", "convolution"):
        cost[0] += _matmul_flops(instruction, shapes)
      elif is_matmul_custom_call(instruction):
        cost[0] += custom_call_matmul_flops(instruction, shapes)
      else:
        flops, transcendentals = _elementwise_flops(instruction, shapes)
        cost[1] += flops
        cost[2] += transcendentals
      kind = instruction.opcode.removesuffix("-start")
      if kind in census and not instruction.opcode.endswith("-done"):
        size = collective_bytes(kind, instruction)
        census[kind] = [a + b for a, b in zip(census[kind], (1, 1, size, size))]
      called = list(called_computations(instruction))
      trips = 1
      if instruction.opcode == "while":
        condition = next((c for role, c in called if role == "condition"), None)
        count = trip_count(instruction, computations.get(condition, []), by_name)
        if count is None:
          summary.unknown_trip_counts += 1
          count = 1
        summary.loops.append(count)
        trips = count
      for role, child in called:
        if child in stack or child not in computations:
          continue
        child_cost, child_census = visit(child, stack + (child,))
        factor = trips if role in ("body", "condition") else 1
        cost = [a + factor * b for a, b in zip(cost, child_cost)]
        for kind, (count, executed, size, executed_size) in child_census.items():
          census[kind] = [a + b for a, b in zip(
              census[kind], (count, factor * executed, size, factor * executed_size))]
    memo[name] = (cost, census)
    return memo[name]

  (matmul, other, transcendentals), census = visit(entry, (entry,))
  summary.matmul_flops, summary.flops, summary.transcendentals = matmul, matmul + other, \
      transcendentals
  for kind, (count, executed, size, executed_size) in census.items():
    summary.collectives[kind] = Collective(int(count), executed, size, executed_size)
  return summary
