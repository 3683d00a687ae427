"""cuDNN's fused-attention calls of a compiled GPU program, which the v2 step-time model
charges at their own measured rate.

``census`` reads every ``__cudnn$fmha*`` custom call of an optimized HLO (loops unrolled)
with its shape; ``program_record`` is ``hlo_profile.program_record`` with that census as
``fused_attention_per_device``, what ``roofline.predict`` needs for
``roofline.FROZEN_GPU_MODEL_V2``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from meshbayes.scaling import hlo, hlo_profile

# The scores' (batch, heads, queries, keys) in the call's backend config; the head width
# is its queries' last dimension.
_SCORES = re.compile(r'"intermediate_tensor_shape"\s*:\s*\{[^{}]*?"dimensions"\s*:\s*'
                     r'\[([^\]]*)\]')
_TARGET = re.compile(r'custom_call_target="__cudnn\$fmha([A-Za-z]*)"')


def census(hlo_text: str) -> list[dict[str, Any]]:
  """The fused-attention calls of a program per device and step, one entry per shape and
  direction: ``direction`` (``forward``, ``backward``), ``batch``, ``heads``, ``queries``,
  ``keys``, ``head_width``, ``flops`` (one call's, as ``hlo`` counts them) and
  ``executed`` (calls per step, loops unrolled). Empty for a program without any.

  Raises:
    ValueError: a call whose scores' shape or queries cannot be read.
  """
  computations, entry = hlo.parse_computations(hlo_text)
  if entry is None:
    return []
  runs, fused = hlo_profile.runs_per_step(computations, entry)
  found: dict[tuple, dict[str, Any]] = {}
  for name, times in runs.items():
    if times == 0 or name in fused:
      continue
    shapes = {i.name: hlo.flat_shapes(i) for i in computations[name]}
    for instruction in computations[name]:
      if not hlo.is_attention_custom_call(instruction):
        continue
      scores = _SCORES.search(instruction.attributes)
      query = shapes.get(instruction.operands[0]) if instruction.operands else None
      if not scores or not query:
        raise ValueError(f"fused_attention: call {instruction.name!r} has no readable scores "
                         "shape (backend config intermediate_tensor_shape) or queries")
      dims = tuple(int(v.strip().strip('"')) for v in scores.group(1).split(",") if v.strip())
      direction = "backward" if _TARGET.search(instruction.attributes).group(1).endswith(
          "Backward") else "forward"
      key = (direction, *dims, query[0].dims[-1])
      entry_census = found.setdefault(key, {
          "direction": direction, "batch": dims[0], "heads": dims[1], "queries": dims[2],
          "keys": dims[3], "head_width": query[0].dims[-1],
          "flops": hlo.custom_call_matmul_flops(instruction, shapes), "executed": 0.0})
      entry_census["executed"] += times
  return sorted(found.values(), key=lambda c: (c["direction"] != "forward", c["head_width"],
                                               c["batch"], c["heads"], c["queries"]))


def program_record(hlo_text: str, generation: str, *, batch_size: int, input_length: int,
                   target_length: int, mesh_shape: Mapping[str, int] | None = None,
                   model_flops_per_device: float | None = None) -> dict[str, Any]:
  """``hlo_profile.program_record`` of the program with its ``census`` as
  ``fused_attention_per_device``: a record both frozen GPU models predict."""
  record = hlo_profile.program_record(
      hlo_text, generation, batch_size=batch_size, input_length=input_length,
      target_length=target_length, mesh_shape=mesh_shape,
      model_flops_per_device=model_flops_per_device)
  record["fused_attention_per_device"] = census(hlo_text)
  return record
