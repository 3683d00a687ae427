"""GPU records both frozen models predict: ``aot.compile_and_profile`` keeps the program's
fused-attention census, and ``benchmarks.gpu_step_prediction`` reports v2 beside v1.

No CUDA plugin needed: the compile is replaced by a record with a stored HLO text of cuDNN's
fused attention (tests/scaling/gpu_hlo_texts.py) at paper's measured shape (8 x 256, 128
heads of 128), whose call v2 charges at exactly the measured 0.973 ms.
"""

import pytest

from meshbayes.scaling import aot, benchmarks, fused_attention, hlo, roofline, targets
from meshbayes.scaling.step_spec import one_device_partitioner, step_spec
from tests.scaling.gpu_hlo_texts import fused_attention_hlo

MEASURED = 0.973e-3  # v2's rate at head width 128: one call's forward and backward
KERNEL = 2e-6


def flops(batch):
  return 7 * 2.0 * batch * 128 * 256 * 256 * 128  # two forward matmuls, five backward


@pytest.fixture
def compiled_from_text(monkeypatch):
  """``aot.compile_step`` returns the stored program (the deterministic step's one call at
  batch 8, the Bayesian step's at batch 16) on a one-device CPU mesh."""

  def compile_step(spec, target, *, keep_hlo=False):
    text = fused_attention_hlo(8 if spec.deterministic else 16, 128, 256, 128)
    matmuls = hlo.analyze(text).matmul_flops
    record = aot.describe(spec, target)
    record.update(flops_per_device=matmuls, model_flops_per_device=matmuls, fits=True,
                  compile_seconds=1.0, argument_bytes_per_device=1, temp_bytes_per_device=2,
                  peak_bytes_per_device=3)
    if keep_hlo:
      record["hlo_text"] = text
    return record

  monkeypatch.setattr(aot, "compile_step", compile_step)
  monkeypatch.setattr(aot, "make_partitioner", lambda spec, target: one_device_partitioner())


def test_a_gpu_record_holds_its_fused_attention_census_for_v2(compiled_from_text):
  spec = step_spec("tiny", 8, 256, deterministic=True, dtype="bfloat16")
  record = aot.compile_and_profile(spec, targets.parse_target("h200:1"))
  assert "hlo_text" not in record
  assert record["fused_attention_per_device"] == fused_attention.census(
      fused_attention_hlo(8, 128, 256, 128))
  assert [c["executed"] for c in record["fused_attention_per_device"]] == [1.0, 1.0]
  v2 = roofline.predict(record, gpu_model=roofline.FROZEN_GPU_MODEL_V2)
  assert v2.attention_seconds == pytest.approx(MEASURED)
  # The record's own roofline stays v1's: the call at 47.5% of peak, two kernels.
  assert record["roofline"]["max"]["step_seconds"] == pytest.approx(
      flops(8) / (0.475 * 989e12) + 2 * KERNEL)
  # A CPU target keeps no program text: nothing to count.
  cpu = aot.compile_and_profile(spec, targets.parse_target("cpu:1"))
  assert "fused_attention_per_device" not in cpu


def test_the_gpu_step_prediction_gives_v2_beside_v1(compiled_from_text):
  report = benchmarks.gpu_step_prediction(targets.parse_target("h200:1"), "tiny", 8, 256,
                                          dtype="bfloat16")
  det, bayes = report["programs"]["deterministic"], report["programs"]["bayesian"]
  v1 = {name: flops(batch) / (0.475 * 989e12) + 2 * KERNEL
        for name, batch in (("det", 8), ("bayes", 16))}
  assert det["seconds"] == pytest.approx(v1["det"])
  assert bayes["seconds"] == pytest.approx(v1["bayes"])
  assert det["v2_seconds"] == pytest.approx(MEASURED)
  assert det["v2_attention_seconds"] == pytest.approx(MEASURED)
  assert bayes["v2_seconds"] == pytest.approx(2 * MEASURED)  # twice the FLOPs at one rate
  assert det["fused_attention_calls"] == bayes["fused_attention_calls"] == 2
  assert det["v2_mfu"] == pytest.approx(flops(8) / MEASURED / 989e12)
  assert det["v2_tflops_per_second"] == pytest.approx(flops(8) / MEASURED / 1e12)
  assert report["time_ratio"] == pytest.approx(v1["bayes"] / v1["det"])
  assert report["v2_time_ratio"] == pytest.approx(2.0)
  assert report["v2_efficiency_quotient"] == pytest.approx(1.0)
  assert report["efficiency_quotient"] == pytest.approx(v1["bayes"] / v1["det"] / 2)
  assert report["v2_step_time_model"] == "roofline.FROZEN_GPU_MODEL_V2 (provisional)"
