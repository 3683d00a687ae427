"""Published dense bf16 matmul peaks by JAX device kind, and model FLOP utilization from them.

``peak_flops_per_device(device_kind)`` is one JAX device's peak (dense, no 2:4 sparsity;
``roofline.HARDWARE``'s where it has the device, per device: a v2 or v3 chip is two);
``utilization`` turns a step's model FLOPs and seconds into TFLOP/s and MFU.
"""

from __future__ import annotations

from typing import Any

from meshbayes.scaling import roofline

# GPU device kinds as CUDA names them (``jax.Device.device_kind``) without a
# ``roofline.HARDWARE`` entry -> dense bf16 FLOP/s. NVIDIA quotes bf16 Tensor Core
# peaks with sparsity; dense is half of that.
GPU_PEAK_FLOPS: dict[str, float] = {
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    # (A100 SXM and PCIe, 40 and 80 GB: 312 TFLOP/s bf16 dense)
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-PCIE-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
}

# Device kinds with a ``roofline.HARDWARE`` entry -> its name (peaks and sources there).
ROOFLINE_GENERATIONS: dict[str, str] = {
    "NVIDIA H100 80GB HBM3": "h100", "NVIDIA H200": "h200",
    "TPU v2": "v2", "TPU v3": "v3", "TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e",
    "TPU v5": "v5p", "TPU v5p": "v5p",
}


def peak_flops_per_device(device_kind: str) -> float | None:
  """Dense bf16 peak FLOP/s of one device of this kind; None where none is tabled (CPUs)."""
  if device_kind in GPU_PEAK_FLOPS:
    return GPU_PEAK_FLOPS[device_kind]
  generation = ROOFLINE_GENERATIONS.get(device_kind)
  return roofline.HARDWARE[generation].peak_flops_per_device if generation else None


def utilization(flops: dict[str, float], seconds: dict[str, float], device_kind: str,
                platform: str) -> dict[str, Any]:
  """TFLOP/s and MFU per program, from model FLOPs per device per step and seconds per step.

  Args:
    flops: model (traced matmul) FLOPs per device per step, by program name.
    seconds: step seconds by program name (the same names).
    device_kind: ``jax.Device.device_kind`` of the devices that ran them.
    platform: ``jax.Device.platform``; on ``cpu`` MFU is reported as not applicable.

  Returns:
    ``peak_flops_per_device`` (None where unknown), ``tflops_per_second`` per
    program, and ``mfu`` per program, or a string saying why there is none.
  """
  peak = None if platform == "cpu" else peak_flops_per_device(device_kind)
  rates = {name: flops[name] / seconds[name] for name in seconds if name in flops}
  if platform == "cpu":
    mfu: Any = "n/a on CPU"
  elif peak is None:
    mfu = f"n/a: no published peak for device kind {device_kind!r} in meshbayes.scaling.peaks"
  else:
    mfu = {name: rate / peak for name, rate in rates.items()}
  return {"device_kind": device_kind, "peak_flops_per_device": peak,
          "tflops_per_second": {name: rate / 1e12 for name, rate in rates.items()}, "mfu": mfu}
