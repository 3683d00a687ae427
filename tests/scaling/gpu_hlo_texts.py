"""Compiled-program texts of GPU steps for the scaling tests: a small HLO of every kind of
work, and the custom calls of cuDNN's fused attention at a given shape."""

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


def fused_attention_hlo(batch: int, heads: int, length: int, width: int) -> str:
  """cuDNN's fused attention, one forward and one backward call, as XLA writes them on an
  H200 (backend configs cut to what the readers use)."""
  qkv = f"bf16[{batch},{length},{heads},{width}]"
  out = f"bf16[{batch},{heads},{length},{width}]"
  bias = f"bf16[1,{heads},{length},{length}]"
  stats = f"f32[{batch},{heads},{length}]"
  config = ('"cudnn_fmha_backend_config":{"intermediate_tensor_shape":{"element_type":"BF16",'
            f'"dimensions":["{batch}","{heads}","{length}","{length}"],"tuple_shapes":[]}}}}')
  return f"""HloModule fmha

ENTRY %main (q: {qkv}, k: {qkv}, v: {qkv}, b: {bias}, d: {qkv}) -> {out} {{
  %q = {qkv}{{3,2,1,0}} parameter(0)
  %k = {qkv}{{3,2,1,0}} parameter(1)
  %v = {qkv}{{3,2,1,0}} parameter(2)
  %b = {bias}{{3,2,1,0}} parameter(3)
  %d = {qkv}{{3,2,1,0}} parameter(4)
  %fwd = ({out}{{3,1,2,0}}, {stats}{{2,1,0}}, u8[0]{{0}}) custom-call(%q, %k, %v, %b), custom_call_target="__cudnn$fmhaScaleBiasSoftmax", backend_config={{{config}}}
  %o = {out}{{3,1,2,0}} get-tuple-element(%fwd), index=0
  %stats = {stats}{{2,1,0}} get-tuple-element(%fwd), index=1
  %bwd = ({out}{{3,1,2,0}}, {out}{{3,1,2,0}}, {out}{{3,1,2,0}}, {bias}{{3,2,1,0}}, u8[0]{{0}}) custom-call(%q, %k, %v, %stats, %d, %b, %o), custom_call_target="__cudnn$fmhaScaleBiasSoftmaxBackward", backend_config={{{config}}}
  ROOT %dq = {out}{{3,1,2,0}} get-tuple-element(%bwd), index=0
}}
"""
