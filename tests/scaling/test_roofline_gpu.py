"""The roofline on GPU programs: asynchronous fusions, cuBLAS calls, the frozen model's terms."""

import pytest

from meshbayes.scaling import hlo_profile, roofline
from meshbayes.scaling.roofline import HARDWARE
from tests.scaling.gpu_hlo_texts import GPU_HLO, fused_attention_hlo


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


def _attention_record(batch, heads, length, width, generation="h200"):
  from meshbayes.scaling import fused_attention
  return fused_attention.program_record(fused_attention_hlo(batch, heads, length, width),
                                        generation, batch_size=batch, input_length=length,
                                        target_length=length)


def test_v2_charges_a_fused_attention_call_as_measured_at_its_shape():
  # Paper's measured shape: forward and backward take the measured 0.973 ms under v2,
  # where v1 charges their 120.3 GFLOPs at 47.5% of peak (0.256 ms) and 2 us a kernel.
  record = _attention_record(8, 128, 256, 128)
  flops = 7 * 2 * 8 * 128 * 256 * 256 * 128
  assert record["flops_per_device"] == flops
  v1 = roofline.predict(record)
  v2 = roofline.predict(record, gpu_model=roofline.FROZEN_GPU_MODEL_V2)
  assert v1.compute_seconds == pytest.approx(flops / (0.475 * 989e12))
  assert v1.kernel_seconds == pytest.approx(2 * 2e-6) and v1.attention_seconds is None
  assert v2.attention_seconds == pytest.approx(0.973e-3)
  assert v2.compute_seconds == pytest.approx(0.973e-3)
  assert v2.kernel_seconds == 0.0  # the measured time includes the calls' launches
  assert v2.memory_seconds == v1.memory_seconds == 0.0
  by_kind = roofline.seconds_by_kind(record, gpu_model=roofline.FROZEN_GPU_MODEL_V2)
  assert by_kind["matmul"] == pytest.approx(0.973e-3)
  assert sum(by_kind.values()) == pytest.approx(v2.step_seconds)
  # Base's measured shape, and four times its batch: the same rate, four times the time.
  assert roofline.predict(_attention_record(32, 12, 256, 64), gpu_model=roofline.GPU_MODELS[
      "v2"]).step_seconds == pytest.approx(0.452e-3)
  assert roofline.predict(_attention_record(128, 12, 256, 64), gpu_model=roofline.GPU_MODELS[
      "v2"]).step_seconds == pytest.approx(4 * 0.452e-3)
  # On an H100 (the same dense peak) the same share of it.
  assert roofline.predict(_attention_record(8, 128, 256, 128, "h100"),
                          gpu_model=roofline.FROZEN_GPU_MODEL_V2).step_seconds == \
      pytest.approx(0.973e-3)


def test_v2_rate_between_and_outside_the_measured_head_widths():
  v2 = roofline.FROZEN_GPU_MODEL_V2
  base, paper = (rate.flops / rate.seconds / 989e12 for rate in v2.fused_attention)
  # 49.9 and 123.6 TFLOP/s as hlo counts a call (2.0x the 25 and 62: it halves
  # them for the causal mask), 5.0% and 12.5% of the peak.
  assert (base, paper) == (pytest.approx(0.05044, abs=1e-5), pytest.approx(0.12497, abs=1e-5))
  assert v2.attention_fraction_of_peak(64) == v2.attention_fraction_of_peak(16) == base
  assert v2.attention_fraction_of_peak(128) == v2.attention_fraction_of_peak(256) == paper
  assert v2.attention_fraction_of_peak(80) == pytest.approx(base + (paper - base) / 4)
  with pytest.raises(ValueError, match="no fused_attention rates"):
    roofline.FROZEN_GPU_MODEL.attention_fraction_of_peak(64)


def test_v2_refuses_a_record_without_its_census_and_bad_rates():
  from meshbayes.scaling import hlo_profile
  record = hlo_profile.program_record(GPU_HLO, "h200", batch_size=1, input_length=4,
                                      target_length=4)
  record["target"] = "h200:1"
  with pytest.raises(ValueError, match="record for target 'h200:1' has no "
                                       "fused_attention_per_device"):
    roofline.predict(record, gpu_model=roofline.FROZEN_GPU_MODEL_V2)
  assert roofline.predict(record).step_seconds > 0  # v1 needs none
  with pytest.raises(ValueError, match=r"head widths \[128, 64\] must be distinct"):
    roofline.GpuStepModel(0.5, 1e-6, "x", fused_attention=tuple(
        reversed(roofline.FROZEN_GPU_MODEL_V2.fused_attention)))
  with pytest.raises(ValueError, match="seconds=0 must be a positive finite number"):
    roofline.AttentionRate(64, 1, 1, 16, 0)
  with pytest.raises(ValueError, match="gpu model 'v3' is not one of v1, v2"):
    roofline.gpu_model("v3")
