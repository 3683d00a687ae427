"""The frozen GPU step-time models against the steps measured on an H200: on the measured
programs (v1's fit), on deviceless compiles of the measured code (the check of v1 and v2),
and the bare roofline and kernel census v1 was read from (docs/results/2026-11-26-h200.md)."""

import gzip
import pathlib

import pytest

from meshbayes.scaling import fused_attention, kernels, roofline
from meshbayes.scaling.measured_steps import MEASURED_H200_STEPS

DATA = pathlib.Path(__file__).parent / "data"
STEPS = {step.name: step for step in MEASURED_H200_STEPS}


def _record(folder: str, name: str) -> dict:
  step = STEPS[name]
  text = gzip.decompress((DATA / folder / f"{name}.hlo.txt.gz").read_bytes()).decode()
  return fused_attention.program_record(text, "h200", batch_size=step.batch_size,
                                        input_length=step.length, target_length=step.length,
                                        model_flops_per_device=step.traced_matmul_flops)


def test_the_model_is_frozen_at_its_published_constants():
  model = roofline.FROZEN_GPU_MODEL
  assert (model.matmul_fraction_of_peak, model.seconds_per_kernel) == (0.475, 2.0e-6)
  assert "h200-2026-11" in model.source and "56c213e" in model.source
  with pytest.raises(ValueError, match="matmul_fraction_of_peak=1.5"):
    roofline.GpuStepModel(1.5, 2e-6, "x")


# Predicted seconds on the programs measured on the H200 (JAX 0.11.2, autotuned): the two
# deterministic steps are the fit, the two Bayesian ones its first check.
FIT = {"base_det_none": 0.0808, "base_bayes_none": 0.1560, "paper_det_full": 0.1614,
       "paper_bayes_full": 0.3737}


@pytest.mark.parametrize("name", FIT)
def test_the_model_on_the_measured_programs(name):
  record = _record("h200", name)
  prediction = roofline.predict(record)
  assert prediction.step_seconds == pytest.approx(FIT[name], abs=5e-5)
  assert abs(prediction.step_seconds / STEPS[name].seconds - 1) < 0.026
  by_kind = roofline.seconds_by_kind(record)
  assert sum(by_kind.values()) == pytest.approx(prediction.step_seconds, rel=1e-9)


# Predicted seconds on deviceless compiles of the measured code (JAX 0.10.2, cuBLAS for every
# matmul: targets.GPU_COMPILER_OPTIONS), made by frozen_model_check: the shared measurement's
# steps (commit 56c213e) and the unrolled paper step at 16 x 256 (commit b53958b).
DEVICELESS = {"base_det_none": 0.0766, "base_bayes_none": 0.1557, "paper_det_full": 0.1644,
              "paper_bayes_full": 0.3736, "paper_det_none": 0.1715,
              "paper_det_unrolled_16": 0.2209}
FOLDERS = {"paper_det_unrolled_16": "h200_deviceless_gpu_shape"}


def test_every_measured_step_has_its_deviceless_program():
  assert set(DEVICELESS) == set(STEPS)


@pytest.mark.parametrize("name", DEVICELESS)
def test_both_models_on_deviceless_programs_of_the_measured_code(name):
  record = _record(FOLDERS.get(name, "h200_deviceless"), name)
  prediction = roofline.predict(record)
  assert prediction.step_seconds == pytest.approx(DEVICELESS[name], abs=5e-5)
  assert abs(prediction.step_seconds / STEPS[name].seconds - 1) <= 0.10  # the goal
  mfu = STEPS[name].traced_matmul_flops / (prediction.step_seconds * 989e12)
  assert prediction.mfu == pytest.approx(mfu)
  # No measured step has a fused-attention call, so v2 charges them exactly as v1: that is
  # why v2 passes v1's check, and why it stays provisional.
  assert record["fused_attention_per_device"] == []
  v2 = roofline.predict(record, gpu_model=roofline.FROZEN_GPU_MODEL_V2)
  assert v2.step_seconds == prediction.step_seconds and v2.attention_seconds == 0.0
  assert abs(v2.step_seconds / STEPS[name].seconds - 1) <= 0.10


def test_v2_is_v1_with_the_fused_attention_rates_measured_alone():
  v1, v2 = roofline.FROZEN_GPU_MODEL, roofline.FROZEN_GPU_MODEL_V2
  assert (v2.matmul_fraction_of_peak, v2.seconds_per_kernel) == (
      v1.matmul_fraction_of_peak, v1.seconds_per_kernel) and v1.fused_attention == ()
  assert [(r.head_width, r.batch, r.heads, r.length, r.seconds, r.generation)
          for r in v2.fused_attention] == [(64, 32, 12, 256, 0.452e-3, "h200"),
                                           (128, 8, 128, 256, 0.973e-3, "h200")]
  assert "provisional" in v2.source and "Attention alone" in v2.source
  assert roofline.GPU_MODELS == {"v1": v1, "v2": v2}


def test_the_bare_roofline_is_the_lower_bound_it_was():
  record = _record("h200", "base_det_none")
  prediction = roofline.predict(record, gpu_model=None)
  assert prediction.kernel_seconds is None
  assert prediction.compute_seconds == pytest.approx(0.0118, rel=0.01)
  assert prediction.memory_seconds == pytest.approx(0.0464, rel=0.01)
  assert prediction.step_seconds == pytest.approx(0.0582, rel=0.01)
  # 28% under the measured 0.0809 s: the roofline misses kernel overheads and cuBLAS's rate.
  assert prediction.step_seconds / 0.0809 - 1 == pytest.approx(-0.281, abs=0.005)
  by_kind = roofline.seconds_by_kind(record, gpu_model=None)
  published = {"matmul": 11.8, "slicing": 19.8, "reduction_or_transpose": 12.2,
               "elementwise": 14.0, "copy": 0.4, "collective": 0.0}
  assert {k: v * 1e3 for k, v in by_kind.items()} == pytest.approx(published, abs=0.06)
  executed = {kind: op["executed"] for kind, op in record["operations_per_device"].items()}
  assert executed == {"matmul": 699, "slicing": 2028, "reduction_or_transpose": 785,
                      "elementwise": 1226, "copy": 43, "collective": 0}


def test_avoidable_work_in_base_det_is_the_published_census():
  text = gzip.decompress((DATA / "h200" / "base_det_none.hlo.txt.gz").read_bytes()).decode()
  found = kernels.avoidable_work(text, [256])
  assert found["kernels"] == 4781
  assert {k: found[k]["executed"] for k in kernels.KINDS} == {
      "attention_scores": 381, "copies": 65, "transposes": 331, "casts": 1}
  assert found["attention_scores"]["bytes"] == pytest.approx(70.4e9, rel=0.002)


def test_avoidable_work_rejects_no_lengths():
  with pytest.raises(ValueError, match="sequence_lengths"):
    kernels.avoidable_work("", [])
