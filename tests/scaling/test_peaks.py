"""Published peaks by device kind, and the MFU bench reports from them."""

import pytest

from meshbayes.scaling import peaks, roofline


def test_h100_sxm_and_h200_have_the_dense_bf16_peak():
  assert peaks.peak_flops_per_device("NVIDIA H200") == 989e12
  assert peaks.peak_flops_per_device("NVIDIA H100 80GB HBM3") == 989e12
  assert peaks.peak_flops_per_device("NVIDIA A100-SXM4-80GB") == 312e12
  # The roofline's GPU entries agree with the table.
  assert roofline.HARDWARE["h200"].peak_flops_per_device == 989e12
  assert roofline.HARDWARE["h100"].peak_flops_per_device == 989e12


def test_tpus_take_their_per_device_peak_from_the_roofline():
  assert peaks.peak_flops_per_device("TPU v4") == roofline.HARDWARE["v4"].peak_flops_per_chip
  # A v3 chip is two JAX devices.
  assert peaks.peak_flops_per_device("TPU v3") == 123e12 / 2
  assert peaks.peak_flops_per_device("TPU v5 lite") == 197e12


def test_unknown_kinds_have_no_peak():
  assert peaks.peak_flops_per_device("cpu") is None
  assert peaks.peak_flops_per_device("NVIDIA GeForce RTX 4090") is None


def test_mfu_of_the_measured_h200_base_step():
  # Shared measurement h200-2026-11: base, bf16, 32 x 256, deterministic, 0.0809 s per step.
  report = peaks.utilization({"deterministic": 1.1650e13}, {"deterministic": 0.0809},
                             "NVIDIA H200", "gpu")
  assert report["tflops_per_second"]["deterministic"] == pytest.approx(144.0, abs=0.1)
  assert report["mfu"]["deterministic"] == pytest.approx(0.146, abs=0.0005)


def test_no_mfu_on_cpus_or_unknown_accelerators():
  flops, seconds = {"deterministic": 1e9}, {"deterministic": 0.5}
  cpu = peaks.utilization(flops, seconds, "cpu", "cpu")
  assert cpu["mfu"] == "n/a on CPU" and cpu["peak_flops_per_device"] is None
  assert cpu["tflops_per_second"]["deterministic"] == pytest.approx(2e-3)
  unknown = peaks.utilization(flops, seconds, "NVIDIA GeForce RTX 4090", "gpu")
  assert "no published peak" in unknown["mfu"] and "RTX 4090" in unknown["mfu"]
