"""The HLO reader: matmul FLOPs and collectives, with loop bodies counted per iteration."""

from meshbayes.scaling import hlo

LOOP = """HloModule loop

%fused_dot (p0: f32[4,8], p1: f32[8,16]) -> f32[4,16] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[8,16]{1,0} parameter(1)
  ROOT %d = f32[4,16]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (state: (s32[], f32[4,8], f32[8,16])) -> (s32[], f32[4,8], f32[8,16]) {
  %state = (s32[], f32[4,8]{1,0}, f32[8,16]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %x = f32[4,8]{1,0} get-tuple-element(%state), index=1
  %w = f32[8,16]{1,0} get-tuple-element(%state), index=2
  %f = f32[4,16]{1,0:T(8,128)} fusion(%x, %w), kind=kOutput, calls=%fused_dot
  %ag = (f32[2,16]{1,0}, f32[4,16]{1,0}) all-gather-start(%f), dimensions={0}
  %agd = f32[4,16]{1,0} all-gather-done(%ag)
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %out = (s32[], f32[4,8]{1,0}, f32[8,16]{1,0}) tuple(%next, %x, %w)
}

%cond (state: (s32[], f32[4,8], f32[8,16])) -> pred[] {
  %state = (s32[], f32[4,8]{1,0}, f32[8,16]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %n = s32[] constant(6)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: f32[4,8], w: f32[8,16]) -> f32[8,16] {
  %x = f32[4,8]{1,0} parameter(0)
  %w = f32[8,16]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4,8]{1,0}, f32[8,16]{1,0}) tuple(%zero, %x, %w)
  %loop = (s32[], f32[4,8]{1,0}, f32[8,16]{1,0}) while(%init), condition=%cond, body=%body
  %wout = f32[8,16]{1,0} get-tuple-element(%loop), index=2
  ROOT %ar = f32[8,16]{1,0} all-reduce(%wout), replica_groups={}, to_apply=%add
}
"""


def test_loop_bodies_count_once_per_iteration():
  summary = hlo.analyze(LOOP)
  assert summary.loops == [6]
  assert summary.unknown_trip_counts == 0
  assert summary.matmul_flops == 6 * 2 * 4 * 16 * 8
  gather = summary.collectives["all-gather"]
  # One asynchronous all-gather in the program, run 6 times; its result is f32[4,16].
  assert (gather.count, gather.executed, gather.bytes, gather.executed_bytes) == (
      1, 6, 4 * 16 * 4, 6 * 4 * 16 * 4)
  reduce = summary.collectives["all-reduce"]
  assert (reduce.count, reduce.executed, reduce.bytes) == (1, 1, 8 * 16 * 4)
  assert summary.collectives["reduce-scatter"].count == 0


def test_xla_trip_count_annotation_wins():
  text = LOOP.replace("condition=%cond, body=%body",
                      'condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}')
  summary = hlo.analyze(text)
  assert summary.loops == [3]
  assert summary.matmul_flops == 3 * 2 * 4 * 16 * 8


def test_a_loop_without_a_readable_bound_counts_once_and_is_reported():
  text = LOOP.replace("direction=LT", "direction=NE")
  summary = hlo.analyze(text)
  assert summary.unknown_trip_counts == 1
  assert summary.matmul_flops == 2 * 4 * 16 * 8


# A batched matmul ('bqhd,bkhd->bhqk', b=8, q=k=128, h=4, d=64) as the TPU compiler writes
# it: a convolution whose window mostly lands in the holes of a dilated input.
TPU_BATCHED_MATMUL = """HloModule bmm

ENTRY %main (a: f32[8,128,4,64], b: f32[8,128,4,64]) -> f32[8,4,128,128] {
  %a = f32[8,128,4,64]{3,2,1,0:T(8,128)} parameter(0)
  %b = f32[8,128,4,64]{3,2,1,0:T(8,128)} parameter(1)
  ROOT %c = f32[8,4,128,128]{3,2,1,0:T(8,128)} convolution(%a, %b), \
window={size=8x4 stride=7x3 lhs_dilate=8x4}, dim_labels=0b1f_0o1i->01bf
}
"""


def test_convolutions_count_only_taps_on_real_inputs():
  assert hlo.analyze(TPU_BATCHED_MATMUL).matmul_flops == 2 * 8 * 4 * 128 * 128 * 64


def test_a_plain_matmul_as_a_convolution():
  text = """HloModule mm

ENTRY %main (a: f32[64,256], b: f32[256,512]) -> f32[64,512] {
  %a = f32[64,256]{1,0} parameter(0)
  %b = f32[256,512]{1,0} parameter(1)
  ROOT %c = f32[64,512]{1,0} convolution(%a, %b), dim_labels=bf_io->bf
}
"""
  assert hlo.analyze(text).matmul_flops == 2 * 64 * 512 * 256


def test_combined_all_reduce_counts_every_operand():
  text = """HloModule combined

ENTRY %main (a: f32[16], b: bf16[8,8]) -> (f32[16], bf16[8,8]) {
  %a = f32[16]{0} parameter(0)
  %b = bf16[8,8]{1,0} parameter(1)
  ROOT %ar = (f32[16]{0}, bf16[8,8]{1,0}) all-reduce(%a, %b), replica_groups={}, to_apply=%add
}
"""
  reduce = hlo.analyze(text).collectives["all-reduce"]
  assert (reduce.count, reduce.bytes) == (1, 16 * 4 + 64 * 2)
