"""The roofline on GPU programs: asynchronous fusions, cuBLAS calls, the frozen model's terms."""

import pytest

from meshbayes.scaling import hlo_profile, roofline
from meshbayes.scaling.roofline import HARDWARE

# A Triton GEMM fusion, a cuBLASLt call, an elementwise fusion and an asynchronous in-place
# dynamic-update-slice fusion (how XLA's GPU backend stacks a scanned layer's residuals).
GPU_HLO = """HloModule gpu

%gemm_fusion (p0: bf16[4,8], p1: bf16[8,16]) -> bf16[4,16] {
  %p0 = bf16[4,8]{1,0} parameter(0)
  %p1 = bf16[8,16]{1,0} parameter(1)
  ROOT %d = bf16[4,16]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%scale (p0: bf16[4,16]) -> f32[1,4,16] {
  %p0 = bf16[4,16]{1,0} parameter(0)
  %c = f32[4,16]{1,0} convert(%p0)
  ROOT %b = f32[1,4,16]{2,1,0} bitcast(%c)
}

%update (p0: f32[3,4,16], p1: f32[1,4,16], p2: s32[]) -> f32[3,4,16] {
  %p0 = f32[3,4,16]{2,1,0} parameter(0)
  %p1 = f32[1,4,16]{2,1,0} parameter(1)
  %p2 = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %u = f32[3,4,16]{2,1,0} dynamic-update-slice(%p0, %p1, %p2, %z, %z)
}

ENTRY %main (x: bf16[4,8], w: bf16[8,16], acc: f32[3,4,16], i: s32[]) -> f32[3,4,16] {
  %x = bf16[4,8]{1,0} parameter(0)
  %w = bf16[8,16]{1,0} parameter(1)
  %acc = f32[3,4,16]{2,1,0} parameter(2)
  %i = s32[] parameter(3)
  %f = bf16[4,16]{1,0} fusion(%x, %w), kind=kCustom, calls=%gemm_fusion
  %g = (bf16[4,16]{1,0}, s8[4096]{0}) custom-call(%x, %w), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_batch_dimensions":[],"lhs_contracting_dimensions":["1"],"rhs_batch_dimensions":[],"rhs_contracting_dimensions":["0"]}}}
  %s = f32[1,4,16]{2,1,0} fusion(%f), kind=kLoop, calls=%scale
  %start = ((f32[3,4,16]{2,1,0}, f32[1,4,16]{2,1,0}, s32[]), f32[3,4,16]{2,1,0}, u32[]) fusion-start(%acc, %s, %i), kind=kLoop, calls=%update
  ROOT %done = f32[3,4,16]{2,1,0} fusion-done(%start)
}
"""


def test_gpu_operations_by_kind_of_work():
  profile = hlo_profile.program_profile(GPU_HLO, {"data": 1})
  ops = profile["operations_per_device"]
  # GEMM fusion and cuBLAS call each read x (64 B) and w (256 B) and write 4x16 bf16 (128 B);
  # the cuBLAS workspace (4096 B) is scratch, not traffic.
  assert ops["matmul"] == {"executed": 2, "bytes": 2 * (64 + 256 + 128)}
  assert ops["elementwise"] == {"executed": 1, "bytes": 128 + 256}
  # The asynchronous fusion updates its buffer in place: it reads the update and the index
  # and writes the update; its fusion-done is no second kernel.
  assert ops["slicing"] == {"executed": 1, "bytes": 256 + 4 + 256}
  assert ops["copy"]["executed"] == ops["collective"]["executed"] == 0
  assert profile["hbm_bytes_per_device"] == {"matmul_ops": 896, "other_ops": 384 + 516}


def test_seconds_by_kind_add_up_to_the_prediction():
  record = hlo_profile.program_record(GPU_HLO, "h100", batch_size=1, input_length=4,
                                      target_length=4)
  flops = 2 * (2 * 4 * 16 * 8)
  assert record["flops_per_device"] == flops
  hw = HARDWARE["h100"]
  assert (hw.peak_flops_per_chip, hw.hbm_bytes_per_second_per_chip) == (989e12, 3.35e12)
  bare = roofline.seconds_by_kind(record, gpu_model=None)
  prediction = roofline.predict(record, gpu_model=None)
  assert sum(bare.values()) == pytest.approx(
      prediction.compute_seconds + prediction.memory_seconds)
  assert bare["matmul"] == pytest.approx(896 / hw.hbm_bytes_per_second_per_chip)
  assert bare["slicing"] == pytest.approx(516 / 3.35e12)
  # The frozen model: matmul FLOPs at 47.5% of peak, other bytes at the bandwidth, 2 us for
  # each of the 4 kernels (two matmuls, the elementwise fusion, the in-place update).
  frozen = roofline.predict(record)
  assert frozen.compute_seconds == pytest.approx(flops / (0.475 * 989e12))
  assert frozen.memory_seconds == pytest.approx((384 + 516) / 3.35e12)
  assert frozen.kernel_seconds == pytest.approx(4 * 2e-6)
  assert frozen.step_seconds == pytest.approx(
      frozen.compute_seconds + frozen.memory_seconds + frozen.kernel_seconds)
  by_kind = roofline.seconds_by_kind(record)
  assert sum(by_kind.values()) == pytest.approx(frozen.step_seconds)
  assert by_kind["slicing"] == pytest.approx(516 / 3.35e12 + 2e-6)


def test_bad_generation_and_unprofiled_records_are_refused():
  with pytest.raises(ValueError, match="generation='a100'"):
    hlo_profile.program_record(GPU_HLO, "a100", batch_size=1, input_length=4, target_length=4)
  with pytest.raises(ValueError, match="no operations_per_device"):
    roofline.seconds_by_kind({"generation": "h200", "flops_per_device": 1.0, "target": "x"})
