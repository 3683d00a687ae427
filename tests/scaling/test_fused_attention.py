"""scaling.fused_attention: the cuDNN fused-attention calls of a GPU program, by shape."""

import pytest

from meshbayes.scaling import fused_attention, hlo
from tests.scaling.gpu_hlo_texts import GPU_HLO, fused_attention_hlo


def test_census_lists_each_call_with_its_shape_and_flops():
  calls = fused_attention.census(fused_attention_hlo(4, 2, 32, 64))
  per_matmul = 2 * 4 * 2 * 32 * 32 * 64
  shape = {"batch": 4, "heads": 2, "queries": 32, "keys": 32, "head_width": 64}
  assert calls == [{"direction": "forward", **shape, "flops": 2 * per_matmul, "executed": 1.0},
                   {"direction": "backward", **shape, "flops": 5 * per_matmul, "executed": 1.0}]
  # What the model's FLOPs add up to is hlo's count of the program.
  assert sum(c["flops"] * c["executed"] for c in calls) == \
      hlo.analyze(fused_attention_hlo(4, 2, 32, 64)).matmul_flops


def test_a_program_without_fused_attention_has_an_empty_census():
  assert fused_attention.census(GPU_HLO) == []
  record = fused_attention.program_record(GPU_HLO, "h200", batch_size=1, input_length=4,
                                          target_length=4)
  assert record["fused_attention_per_device"] == []


def test_an_unreadable_call_is_refused_in_one_line():
  text = fused_attention_hlo(4, 2, 32, 64).replace('"intermediate_tensor_shape"', '"other"')
  with pytest.raises(ValueError, match="call 'fwd' has no readable scores shape"):
    fused_attention.census(text)
