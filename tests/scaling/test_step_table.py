"""scaling.step_table: a folder of deviceless programs read into rows by both frozen models."""

import gzip
import json

import pytest

from meshbayes.scaling import step_table
from tests.scaling.gpu_hlo_texts import fused_attention_hlo


def test_rows_give_both_models_beside_kernels_and_bytes(tmp_path):
  step = step_table.TableStep("paper", True, 8)
  name = step.name("h200:1")
  assert name == "paper_det_cudnn_h200-1_8x256"
  flops = 7 * 2 * 8 * 128 * 256 * 256 * 128
  record = {"name": name, "target": "h200:1", "generation": "h200", "mesh": {"data": 1},
            "batch_size": 8, "input_length": 256, "target_length": 256, "per_device_batch": 8,
            "model_flops_per_device": flops, "peak_bytes_per_device": 2**30, "fits": True}
  (tmp_path / f"{name}.json").write_text(json.dumps(record))
  (tmp_path / f"{name}.hlo.txt.gz").write_bytes(
      gzip.compress(fused_attention_hlo(8, 128, 256, 128).encode()))
  (found,) = step_table.rows(tmp_path, [name, "not_compiled"])
  # v1: the attention's FLOPs at 47.5% of peak and 2 us for each of its two kernels; v2:
  # the measured 0.973 ms at this shape.
  assert found["v1_seconds"] == pytest.approx(flops / (0.475 * 989e12) + 4e-6)
  assert found["v2_seconds"] == pytest.approx(0.973e-3)
  assert found["v2_attention_seconds"] == pytest.approx(0.973e-3)
  assert (found["fused_attention_calls"], found["kernels"]) == (2, 2)
  assert found["v2_mfu"] == pytest.approx(flops / (0.973e-3 * 989e12))
  assert "| paper_det_cudnn | h200:1 | 8 x 256 | 0.0003 | 0.0010 | 46.8% | 12.5% | 1.0 | 2 " \
         "| 2 | 1 | 1.0 |" in step_table.markdown([found])


def test_gpu_gin_steps_are_its_sequences_per_gpu():
  assert [(s.preset, s.deterministic, s.batch_per_device) for s in step_table.GPU_GIN_STEPS] == [
      ("base", True, 128), ("base", False, 128), ("paper", True, 32), ("paper", False, 16)]


def test_grouped_steps_draw_their_samples_per_device():
  step = step_table.TableStep("paper", False, 16, weight_groups_per_device=1)
  assert step.name("h200:8") == "paper_bayes_g1_cudnn_h200-8_16x256"
  spec = step.spec(8)  # one sample per data-parallel shard: 8 groups of 16 sequences
  assert spec.batch_size == 128 and ("num_weight_groups", 8) in spec.overrides
  assert dict(spec.estimators) == {"attention": "grouped_reparameterization",
                                   "cross_attention": "grouped_reparameterization",
                                   "mlp": "grouped_reparameterization"}
  assert step_table.TableStep("base", False, 128).spec(1).estimators == ()


@pytest.mark.parametrize("groups, deterministic", [(-1, False), (2, True)])
def test_weight_groups_need_a_bayesian_step(groups, deterministic):
  with pytest.raises(ValueError, match=f"weight_groups_per_device={groups} must be"):
    step_table.TableStep("base", deterministic, 8, weight_groups_per_device=groups)
