"""Attention alone, forward and backward, timed at a preset's shape beside the v2 model's charge.

``attention_section`` times the attention the Transformer trains with (causal mask, a
relative-position bias, bf16 inputs; ``jax.nn.dot_product_attention``, as
``attention_kernel='cudnn'`` calls it) at each shape, forward and backward of one call,
round-robin (``timing.alternate``): cuDNN's fused attention on an NVIDIA GPU; on any other
platform, where cuDNN is unavailable, XLA's attention in its place (the same code path,
recorded as ``implementation``). Beside each: its FLOPs as ``hlo`` counts a fused call
(2 forward and 5 backward matmuls), the rate, and the seconds
``roofline.FROZEN_GPU_MODEL_V2`` charges for it, which these measurements confirm or not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class AttentionShape:
  """One attention call: sequences, heads, queries and keys per sequence, features per head."""

  batch: int
  heads: int
  length: int
  head_width: int

  @property
  def flops(self) -> float:
    """Forward and backward matmul FLOPs as ``hlo`` counts a fused call (no causal discount)."""
    return 7 * 2.0 * self.batch * self.heads * self.length ** 2 * self.head_width


# The presets' measured shapes (docs/results/2026-11-27-gpu.md, "Attention alone") and
# gpu.gin's, whose batch the v2 rule says does not change the rate.
SHAPES = {"base": AttentionShape(32, 12, 256, 64), "paper": AttentionShape(8, 128, 256, 128),
          "base_gpu": AttentionShape(128, 12, 256, 64),
          "paper_gpu": AttentionShape(16, 128, 256, 128)}
TOY_SHAPES = {"tiny": AttentionShape(4, 2, 16, 8)}


def _program(shape: AttentionShape, implementation: str) -> tuple[Any, Any]:
  """The jitted forward and backward of one call, and its compiled form's arguments."""
  import jax
  import jax.numpy as jnp

  keys = jax.random.split(jax.random.key(0), 5)
  qkv = [jax.random.normal(k, (shape.batch, shape.length, shape.heads, shape.head_width),
                           jnp.bfloat16) for k in keys[:3]]
  bias = jax.random.normal(keys[3], (1, shape.heads, shape.length, shape.length), jnp.bfloat16)
  cotangent = jax.random.normal(keys[4], qkv[0].shape, jnp.bfloat16)
  mask = jnp.tril(jnp.ones((shape.length, shape.length), bool))[None, None]

  def loss(query, key, value, bias):
    out = jax.nn.dot_product_attention(query, key, value, bias=bias, mask=mask,
                                       implementation=implementation)
    return jnp.sum(out.astype(jnp.float32) * cotangent)

  arguments = (*qkv, bias)
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(*arguments).compile(), arguments


def attention_section(shapes: Mapping[str, AttentionShape], rounds: int) -> dict[str, Any]:
  """Each shape's attention, forward and backward, timed; the v2 model's charge beside."""
  import jax

  from meshbayes.scaling import fused_attention, hlo, peaks, roofline
  from meshbayes.scaling.timing import alternate

  device = jax.devices()[0]
  implementation = "cudnn" if device.platform == "gpu" else "xla"
  generation = peaks.ROOFLINE_GENERATIONS.get(device.device_kind)
  v2 = roofline.FROZEN_GPU_MODEL_V2
  programs, report = {}, {}
  for name, shape in shapes.items():
    compiled, arguments = _program(shape, implementation)
    text = compiled.as_text()
    report[name] = {**dataclasses.asdict(shape), "implementation": implementation,
                    "flops": shape.flops, "hlo_matmul_flops": hlo.analyze(text).matmul_flops,
                    "fused_calls": sum(c["executed"] for c in fused_attention.census(text))}
    programs[name] = lambda fn=compiled, args=arguments: fn(*args)
  times, medians = alternate(programs, rounds, warmup=1)
  for name, shape in shapes.items():
    entry = report[name]
    entry.update(seconds=times[name], median_seconds=medians[name],
                 flops_per_second=shape.flops / times[name])
    if generation in roofline.GPU_GENERATIONS:
      peak = roofline.HARDWARE[generation].peak_flops_per_device
      charged = shape.flops / (v2.attention_fraction_of_peak(shape.head_width) * peak)
      entry.update(fraction_of_peak=shape.flops / times[name] / peak, v2_seconds=charged,
                   measured_over_v2=times[name] / charged - 1)
    else:
      entry["v2_seconds"] = f"n/a: the v2 model's rates are for " \
                            f"{', '.join(roofline.GPU_GENERATIONS)}, not {device.device_kind!r}"
  return {"device_kind": device.device_kind, "rounds": rounds, "shapes": report}
