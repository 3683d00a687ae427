"""Kernels of a compiled GPU step that do avoidable work, counted per step from its HLO.

``avoidable_work`` sorts the non-GEMM kernels into ``KINDS``, the first that applies:
``attention_scores`` (they touch an array whose last two dimensions are sequence lengths:
softmax, masks, dropout, their gradients; fused attention keeps these on chip),
``copies``, ``transposes`` (fusions that only transpose, slice or reshape) and ``casts``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from meshbayes.scaling import hlo, hlo_profile

KINDS = ("attention_scores", "copies", "transposes", "casts")
# Operations that move nothing themselves inside a fused computation.
_PASSIVE = frozenset(("parameter", "constant", "tuple", "get-tuple-element", "bitcast", "reshape",
                      "broadcast"))


def _body_opcodes(computations: dict[str, list[hlo.Instruction]],
                  instruction: hlo.Instruction) -> set[str]:
  called = [c for role, c in hlo.called_computations(instruction) if role == "calls"]
  return {i.opcode for c in called for i in computations.get(c, [])} - _PASSIVE


def _holds_scores(shapes: Iterable[hlo.Shape], lengths: frozenset[int]) -> bool:
  return any(len(s.dims) >= 3 and s.dims[-1] in lengths and s.dims[-2] in lengths for s in shapes)


def avoidable_work(hlo_text: str, sequence_lengths: Iterable[int]) -> dict[str, Any]:
  """Kernels per step of each of ``KINDS`` (``executed``) and their HBM ``bytes``, per device.

  Args:
    hlo_text: ``compiled.as_text()`` of a GPU program.
    sequence_lengths: the input and target lengths (what an attention score's
      last two dimensions can be).

  Returns:
    ``{kind: {"executed": ..., "bytes": ...}}`` for each of ``KINDS``, and
    ``kernels``: every kernel that runs per step (GEMMs and collectives included).
  """
  lengths = frozenset(int(n) for n in sequence_lengths)
  if not lengths or min(lengths) < 1:
    raise ValueError(f"kernels: sequence_lengths={sorted(lengths)} must be positive lengths")
  computations, entry = hlo.parse_computations(hlo_text)
  found = {kind: {"executed": 0.0, "bytes": 0.0} for kind in KINDS}
  kernels = 0.0
  if entry is None:
    return {**found, "kernels": kernels}
  runs, fused = hlo_profile.runs_per_step(computations, entry)
  fusions = hlo_profile.FusedComputations(computations)
  for name, times in runs.items():
    if name in fused or not times:
      continue
    shapes = {i.name: hlo.flat_shapes(i) for i in computations[name]}
    for instruction in computations[name]:
      opcode = instruction.opcode
      if opcode in hlo_profile.FREE_OPCODES or opcode.endswith("-done"):
        continue
      kernels += times
      operands = [shapes.get(o, ()) for o in instruction.operands]
      is_fusion = opcode in hlo_profile.FUSION_OPCODES
      body = _body_opcodes(computations, instruction) if is_fusion else {opcode}
      if hlo.is_matmul_custom_call(instruction) or body & {"dot", "convolution"}:
        continue
      arrays = [s for group in operands for s in group] + list(hlo.flat_shapes(instruction))
      if _holds_scores(arrays, lengths):
        kind = "attention_scores"
      elif body <= {"copy"}:
        kind = "copies"
      elif "transpose" in body and body <= {"transpose", "slice", "copy"}:
        kind = "transposes"
      elif body == {"convert"}:
        kind = "casts"
      else:
        continue
      moved = fusions.traffic(instruction, operands) if is_fusion else \
          (hlo_profile.shapes_bytes(hlo.flat_shapes(instruction))
           + sum(hlo_profile.shapes_bytes(s) for s in operands))
      found[kind]["executed"] += times
      found[kind]["bytes"] += times * moved
  return {**found, "kernels": kernels}
