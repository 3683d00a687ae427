"""The HLO reader on GPU programs: cuBLAS custom calls and Triton GEMM fusions inside loops."""

import gzip
import pathlib

import pytest

from meshbayes.scaling import hlo

H200 = pathlib.Path(__file__).parent / "data" / "h200"
# Jaxpr-traced matmul FLOPs per step of the same steps (the shared measurement's README).
TRACED = {"base_det_none": 1.1650e13, "base_bayes_none": 2.1391e13,
          "paper_det_full": 4.5758e13, "paper_bayes_full": 9.1937e13}

GEMM_LOOP = """HloModule gemm

%triton_gemm (p0: bf16[2,4,8], p1: bf16[2,8,16]) -> bf16[2,4,16] {
  %p0 = bf16[2,4,8]{2,1,0} parameter(0)
  %p1 = bf16[2,8,16]{2,1,0} parameter(1)
  ROOT %d = bf16[2,4,16]{2,1,0} dot(%p0, %p1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}

%body (state: (s32[], bf16[2,4,8], bf16[2,8,16])) -> (s32[], bf16[2,4,8], bf16[2,8,16]) {
  %state = (s32[], bf16[2,4,8]{2,1,0}, bf16[2,8,16]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %x = bf16[2,4,8]{2,1,0} get-tuple-element(%state), index=1
  %w = bf16[2,8,16]{2,1,0} get-tuple-element(%state), index=2
  %f = bf16[2,4,16]{2,1,0} fusion(%x, %w), kind=kCustom, calls=%triton_gemm, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  %g = (bf16[2,16,8]{2,1,0}, s8[1024]{0}) custom-call(%w, %x), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_batch_dimensions":["0"],"lhs_contracting_dimensions":["1"],"rhs_batch_dimensions":["0"],"rhs_contracting_dimensions":["2"]},"epilogue":"DEFAULT"}}
  %x2 = bf16[8,8]{1,0} bitcast(%x)
  %w2 = bf16[8,32]{1,0} bitcast(%w)
  %h = (bf16[8,32]{1,0}, s8[1024]{0}) custom-call(%x2, %w2), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_batch_dimensions":[],"lhs_contracting_dimensions":["0"],"rhs_batch_dimensions":[],"rhs_contracting_dimensions":["0"]}}}
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %out = (s32[], bf16[2,4,8]{2,1,0}, bf16[2,8,16]{2,1,0}) tuple(%next, %x, %w)
}

%cond (state: (s32[], bf16[2,4,8], bf16[2,8,16])) -> pred[] {
  %state = (s32[], bf16[2,4,8]{2,1,0}, bf16[2,8,16]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: bf16[2,4,8], w: bf16[2,8,16]) -> bf16[2,8,16] {
  %x = bf16[2,4,8]{2,1,0} parameter(0)
  %w = bf16[2,8,16]{2,1,0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[2,4,8]{2,1,0}, bf16[2,8,16]{2,1,0}) tuple(%zero, %x, %w)
  %loop = (s32[], bf16[2,4,8]{2,1,0}, bf16[2,8,16]{2,1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %other = (bf16[4]{0}, s8[8]{0}) custom-call(%x), custom_call_target="__cudnn$norm"
  ROOT %wout = bf16[2,8,16]{2,1,0} get-tuple-element(%loop), index=2
}
"""


def test_gemm_fusions_and_cublas_calls_count_per_loop_iteration():
  # Per iteration: the Triton fusion 2*2*4*16*8 (batch, M, N, K), the batched cuBLASLt call
  # 2*2*16*4*8 (the lhs is batch x K x M) and the plain cuBLAS call 2*8*32*8 (both operands
  # contract their leading dimension); XLA's annotation says 3 trips, not the condition's 5.
  summary = hlo.analyze(GEMM_LOOP)
  per_iteration = 2 * 2 * 4 * 16 * 8 + 2 * 2 * 16 * 4 * 8 + 2 * 8 * 32 * 8
  assert summary.loops == [3]
  assert summary.matmul_flops == pytest.approx(3 * per_iteration)


def test_other_custom_calls_count_no_matmul_flops():
  text = GEMM_LOOP.replace('custom_call_target="__cublas$lt$matmul"',
                           'custom_call_target="__cudnn$convBiasActivationForward"')
  assert hlo.analyze(text).matmul_flops == pytest.approx(
      hlo.analyze(GEMM_LOOP).matmul_flops - 3 * 2 * 2 * 16 * 8 * 4)


@pytest.fixture(scope="module")
def h200_summaries() -> dict[str, hlo.HloSummary]:
  """Each shared H200 program parsed once (a few seconds in all)."""
  return {name: hlo.analyze(gzip.decompress((H200 / f"{name}.hlo.txt.gz").read_bytes()).decode())
          for name in TRACED}


@pytest.mark.parametrize("name", sorted(TRACED))
def test_h200_programs_matmul_flops_match_the_traced_count(h200_summaries, name):
  summary = h200_summaries[name]
  assert summary.unknown_trip_counts == 0
  assert summary.matmul_flops == pytest.approx(TRACED[name], rel=0.03)


# cuDNN's fused attention, forward and backward, as XLA writes it on an H200 (backend
# configs cut to what the reader uses): batch 4, 4 heads, 32 queries and keys, width 64.
_SCORES = ('"cudnn_fmha_backend_config":{"intermediate_tensor_shape":{"element_type":"BF16",'
           '"dimensions":["4","4","32","32"],"tuple_shapes":[]},"is_flash_attention":true}')
FUSED_ATTENTION = f"""HloModule fmha

ENTRY %main (q: bf16[4,32,4,64], k: bf16[4,32,4,64], v: bf16[4,32,4,64], b: bf16[4,4,32,32], d: bf16[4,32,4,64]) -> bf16[4,4,32,64] {{
  %q = bf16[4,32,4,64]{{3,2,1,0}} parameter(0)
  %k = bf16[4,32,4,64]{{3,2,1,0}} parameter(1)
  %v = bf16[4,32,4,64]{{3,2,1,0}} parameter(2)
  %b = bf16[4,4,32,32]{{3,2,1,0}} parameter(3)
  %d = bf16[4,32,4,64]{{3,2,1,0}} parameter(4)
  %fwd = (bf16[4,4,32,64]{{3,1,2,0}}, f32[4,4,32]{{2,1,0}}, u8[0]{{0}}) custom-call(%q, %k, %v, %b), custom_call_target="__cudnn$fmhaScaleBiasSoftmax", backend_config={{{_SCORES}}}
  %o = bf16[4,4,32,64]{{3,1,2,0}} get-tuple-element(%fwd), index=0
  %stats = f32[4,4,32]{{2,1,0}} get-tuple-element(%fwd), index=1
  %bwd = (bf16[4,4,32,64]{{3,1,2,0}}, bf16[4,4,32,64]{{3,1,2,0}}, bf16[4,4,32,64]{{3,1,2,0}}, bf16[4,4,32,32]{{3,2,1,0}}, u8[0]{{0}}) custom-call(%q, %k, %v, %stats, %d, %b, %o), custom_call_target="__cudnn$fmhaScaleBiasSoftmaxBackward", backend_config={{{_SCORES}}}
  ROOT %dq = bf16[4,4,32,64]{{3,1,2,0}} get-tuple-element(%bwd), index=0
}}
"""


def test_fused_attention_counts_its_matmuls_and_moves_no_scores_of_its_own():
  from meshbayes.scaling import hlo_profile, kernels
  per_matmul = 2 * 4 * 4 * 32 * 32 * 64
  assert hlo.analyze(FUSED_ATTENTION).matmul_flops == pytest.approx((2 + 5) * per_matmul)
  ops = hlo_profile.program_profile(FUSED_ATTENTION, {"data": 1})["operations_per_device"]
  # Two kernels, both matmuls: their operands read and their outputs written, the empty
  # scratch buffer left out.
  qkv, bias, stats = 4 * 32 * 4 * 64 * 2, 4 * 4 * 32 * 32 * 2, 4 * 4 * 32 * 4
  forward = 3 * qkv + bias + qkv + stats
  backward = 3 * qkv + stats + qkv + bias + qkv + 3 * qkv + bias
  assert ops["matmul"] == {"executed": 2, "bytes": forward + backward}
  assert kernels.avoidable_work(FUSED_ATTENTION, [32])["attention_scores"]["executed"] == 0
