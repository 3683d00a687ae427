"""The roofline model of a compiled step (meshbayes.scaling.roofline): its arithmetic on
hand-computed cases, the HLO it reads (meshbayes.scaling.hlo_profile), its errors, and the
tool's ``--from_json``.

Nothing here compiles except the last test (marked ``tpu``; skipped without libtpu),
which checks the profile of a real TPU program against ``hlo.analyze``.
"""

import dataclasses
import importlib.util
import json
import math

import pytest

from meshbayes.scaling import hlo, hlo_profile, roofline
from meshbayes.scaling.roofline import HARDWARE, Hardware, TorusSpan

# A chip with round numbers: 1e14 FLOP/s, 1e12 B/s of HBM, 1e11 B/s per link and direction.
CHIP = Hardware("test", peak_flops_per_chip=1e14, hbm_bytes_per_second_per_chip=1e12,
                ici_link_bytes_per_second=1e11, ici_links_per_chip=4, devices_per_chip=1,
                wraparound_multiple=4, source="round numbers for tests")


def _record(**changes):
  record = {"target": "test:4x4", "generation": "v2", "cores": 16, "mesh": {"data": 4, "model": 4},
            "flops_per_device": 1e15, "model_flops_per_device": 1e15, "batch_size": 8,
            "input_length": 100, "target_length": 150, "collectives": {},
            "collective_groups": []}
  record.update(changes)
  return record


def _group(kind, size, executed_bytes, spans, axes=("data",)):
  return {"kind": kind, "group_size": size, "mesh_axes": list(axes), "torus_spans": spans,
          "count": 1, "executed": 1.0, "executed_bytes": executed_bytes}


# ---------------------------------------------------------------------- the arithmetic

def test_compute_time_is_flops_over_peak():
  p = roofline.predict(_record(), CHIP)
  assert p.compute_seconds == pytest.approx(10.0)  # 1e15 FLOPs / 1e14 FLOP/s
  assert p.memory_seconds is None and p.communication_seconds == 0
  assert p.step_seconds == pytest.approx(10.0)


def test_per_device_peak_splits_the_chip():
  two_cores = dataclasses.replace(CHIP, devices_per_chip=2)
  assert roofline.predict(_record(), two_cores).compute_seconds == pytest.approx(20.0)


@pytest.mark.parametrize("kind, n, factor", [
    ("all-reduce", 8, 2 * 7 / 8), ("all-gather", 8, 7 / 8), ("reduce-scatter", 8, 7),
    ("all-to-all", 8, 2.0), ("collective-permute", 2, 1.0), ("all-reduce", 1, 0.0)])
def test_ring_factors(kind, n, factor):
  assert roofline.ring_factor(kind, n) == pytest.approx(factor)


def test_all_reduce_of_b_bytes_over_n_devices_at_w():
  b, n, w = 3e9, 16, 2e11
  assert roofline.collective_seconds("all-reduce", b, n, w) == pytest.approx(
      2 * (n - 1) / n * b / w)
  assert roofline.collective_seconds("all-gather", b, n, w) == pytest.approx((n - 1) / n * b / w)


def test_ring_bandwidth_on_the_torus():
  link = CHIP.ici_link_bytes_per_second
  # A closed ring (the slice's dimension wraps): both directions, 2 links out.
  assert roofline.ring_bandwidth(CHIP, [TorusSpan(8, 1, 8)]) == pytest.approx(2 * link)
  # A line (no wraparound on a dimension of 6, or a group covering part of it): 1.
  assert roofline.ring_bandwidth(CHIP, [TorusSpan(6, 1, 6)]) == pytest.approx(link)
  assert roofline.ring_bandwidth(CHIP, [TorusSpan(4, 1, 8)]) == pytest.approx(link)
  # Groups interleaved with stride 2 share each link; two dimensions add.
  assert roofline.ring_bandwidth(CHIP, [TorusSpan(4, 2, 8)]) == pytest.approx(link)
  assert roofline.ring_bandwidth(CHIP, [TorusSpan(8, 1, 8), TorusSpan(8, 1, 8)]) == \
      pytest.approx(4 * link)
  # Two devices per chip share its links; a group on one chip uses none.
  two = dataclasses.replace(CHIP, devices_per_chip=2)
  assert roofline.ring_bandwidth(two, [TorusSpan(8, 1, 8)]) == pytest.approx(link)
  assert math.isinf(roofline.ring_bandwidth(CHIP, []))


def test_communication_from_replica_groups_by_axis():
  record = _record(collective_groups=[
      _group("all-reduce", 8, 4e9, [[8, 1, 8]], ("data",)),       # 2*7/8*4e9 / 2e11 = 35 ms
      _group("all-gather", 4, 2e9, [[4, 1, 8]], ("model",)),      # 3/4*2e9 / 1e11 = 15 ms
      _group("all-reduce", 2, 1e9, [], ("model",))])              # on one chip: free
  p = roofline.predict(record, CHIP)
  assert p.communication_by_axis == pytest.approx({"data": 0.035, "model": 0.015})
  assert p.communication_seconds == pytest.approx(0.05)
  assert p.communication_model == "replica groups"


def test_max_overlaps_and_sum_adds():
  record = _record(flops_per_device=1e13,  # 0.1 s of compute
                   collective_groups=[_group("all-gather", 2, 1e10, [[8, 1, 8]])])
  # all-gather over 2: 1/2 * 1e10 B / 2e11 B/s = 25 ms
  hidden = roofline.predict(record, CHIP, overlap="max")
  exposed = roofline.predict(record, CHIP, overlap="sum")
  assert hidden.step_seconds == pytest.approx(0.1)
  assert exposed.step_seconds == pytest.approx(0.125)
  slow = roofline.predict(dict(record, flops_per_device=1e12), CHIP, overlap="max")
  assert slow.step_seconds == pytest.approx(0.025)  # communication-bound


def test_memory_term_counts_what_the_flops_miss():
  # 10 s of compute; the matmul operations' 5e12 bytes take 5 s (hidden), the rest 2e12
  # bytes 2 s; with 1.2e13 matmul bytes (12 s) 2 s of them show.
  record = _record(hbm_bytes_per_device={"matmul_ops": 5e12, "other_ops": 2e12})
  assert roofline.predict(record, CHIP).memory_seconds == pytest.approx(2.0)
  assert roofline.predict(record, CHIP).step_seconds == pytest.approx(12.0)
  record["hbm_bytes_per_device"]["matmul_ops"] = 1.2e13
  assert roofline.predict(record, CHIP).memory_seconds == pytest.approx(4.0)


def test_throughput_tflops_and_mfu():
  record = _record(model_flops_per_device=5e14)  # the compiled step does twice the model's work
  p = roofline.predict(record, CHIP)
  assert p.step_seconds == pytest.approx(10.0)
  assert p.tokens_per_second == pytest.approx(8 * 250 / 10.0)
  assert p.tflops_per_second == pytest.approx(5e14 * 16 / 10.0 / 1e12)
  assert p.mfu == pytest.approx(0.5)


def test_records_without_replica_groups_use_the_fallback():
  record = _record(collective_groups=None, collectives={
      "all-reduce": {"count": 1, "executed": 1, "bytes": 1e9, "executed_bytes": 2e9}})
  p = roofline.predict(record, CHIP)
  # n = data axis (4): 2 * 3/4 * 2e9 over one wrapped ring (2 links x 1e11 B/s)
  assert p.communication_seconds == pytest.approx(1.5 * 2e9 / 2e11)
  assert p.communication_model == roofline.FALLBACK_ASSUMPTION


def test_predictions_for_the_record_generation():
  both = roofline.predictions(_record())
  assert set(both) == {"max", "sum"} and both["max"]["generation"] == "v2"
  v2 = HARDWARE["v2"]
  assert both["max"]["compute_seconds"] == pytest.approx(1e15 / (v2.peak_flops_per_chip / 2))
  assert roofline.predictions(_record(flops_per_device=None)) is None
  assert roofline.predictions(_record(generation=None)) is None


def test_hardware_table():
  assert set(HARDWARE) == {"v2", "v3", "v4", "v5e", "v5p", "h100", "h200"}
  assert HARDWARE["v2"].peak_flops_per_chip * 256 == pytest.approx(11.52e15)  # the v2 pod
  assert HARDWARE["v3"].ici_link_bytes_per_second == pytest.approx(83e9, rel=0.01)
  for hw in HARDWARE.values():
    assert hw.source and hw.peak_flops_per_device > 0
  assert HARDWARE["v2"].wraps(16) and not HARDWARE["v2"].wraps(8)
  assert HARDWARE["v4"].wraps(8) and not HARDWARE["v4"].wraps(2)
  # NVSwitch: a ring of GPUs closes at any size, 450 GB/s out of each GPU.
  h100 = HARDWARE["h100"]
  assert roofline.ring_bandwidth(h100, [TorusSpan(8, 1, 8)]) == pytest.approx(450e9)
  assert HARDWARE["h200"].hbm_bytes_per_second_per_chip / h100.hbm_bytes_per_second_per_chip \
      == pytest.approx(4.8 / 3.35)


# ---------------------------------------------------------------------- bad input

@pytest.mark.parametrize("field, value, words", [
    ("peak_flops_per_chip", 0, "peak_flops_per_chip=0 must be a positive finite number"),
    ("hbm_bytes_per_second_per_chip", -1.0, "hbm_bytes_per_second_per_chip=-1.0 must be"),
    ("ici_link_bytes_per_second", math.inf, "ici_link_bytes_per_second=inf must be"),
    ("devices_per_chip", 0, "devices_per_chip=0 must be a positive int"),
    ("ici_links_per_chip", 4.0, "ici_links_per_chip=4.0 must be a positive int"),
    ("source", " ", "source=' ' must cite"),
    ("generation", "", "generation='' must be a non-empty name")])
def test_hardware_rejects_bad_values(field, value, words):
  with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
    dataclasses.replace(CHIP, **{field: value})


def test_bad_arguments_name_the_value_and_what_is_valid():
  with pytest.raises(ValueError, match="overlap='both' must be one of max, sum"):
    roofline.predict(_record(), CHIP, overlap="both")
  with pytest.raises(ValueError, match="generation='v9' is not one of v2, v3, v4, v5e, v5p"):
    roofline.predict(_record(generation="v9"))
  with pytest.raises(ValueError, match="has no flops_per_device"):
    roofline.predict(_record(flops_per_device=None), CHIP)
  with pytest.raises(ValueError, match="kind='broadcast' is not one of all-reduce"):
    roofline.ring_factor("broadcast", 4)
  with pytest.raises(ValueError, match="group_size=0 must be a positive int"):
    roofline.ring_factor("all-reduce", 0)
  with pytest.raises(ValueError, match="bandwidth=0 must be > 0"):
    roofline.collective_seconds("all-reduce", 1.0, 4, 0)
  with pytest.raises(ValueError, match="bytes_per_device=-1 must be >= 0"):
    roofline.collective_seconds("all-reduce", -1, 4, 1.0)
  with pytest.raises(ValueError, match="stride=0 must be a positive int"):
    TorusSpan(4, 0, 8)


# ---------------------------------------------------------------------- reading HLO

@pytest.mark.parametrize("attributes, groups", [
    ("replica_groups={{0,2},{1,3}}, to_apply=%add", [[0, 2], [1, 3]]),
    ("replica_groups={}, to_apply=%add", [[0, 1, 2, 3]]),
    ("replica_groups=[2,2]<=[4], to_apply=%add", [[0, 1], [2, 3]]),
    ("replica_groups=[2,2]<=[2,2]T(1,0), to_apply=%add", [[0, 2], [1, 3]]),
    ("replica_groups=mesh['a'=2,'b'=2] {'a'}, use_global_device_ids=true", [[0, 2], [1, 3]]),
    ("replica_groups=mesh['a'=2,'b'=1,'c'=2], device_ids=([2,2]T(1,0)) {'a'}, x=1",
     [[0, 1], [2, 3]]),
    ("channel_id=3, source_target_pairs={{0,0},{1,3},{3,1}}", [[1, 3], [3, 1]]),
    ("channel_id=3, source_target_pairs={{0,0},{1,1}}", [[0]]),
    ("channel_id=3, to_apply=%add", None)])
def test_replica_group_forms(attributes, groups):
  assert hlo_profile.parse_replica_groups(attributes, 4) == groups


def test_groups_to_mesh_axes_and_torus_spans():
  mesh = {"data": 4, "model": 2}
  assert hlo_profile.group_axes([0, 2, 4, 6], mesh) == ["data"]
  assert hlo_profile.group_axes([0, 1], mesh) == ["model"]
  assert hlo_profile.group_axes(list(range(8)), mesh) == ["data", "model"]
  # Two cores per chip (same coordinates) and a 2x2 slice of chips.
  coords = [(0, 0, 0), (0, 0, 0), (1, 0, 0), (1, 0, 0), (0, 1, 0), (0, 1, 0), (1, 1, 0),
            (1, 1, 0)]
  assert hlo_profile.torus_spans([0, 1], coords) == []  # the two cores of one chip
  assert hlo_profile.torus_spans([0, 2, 4, 6], coords) == [TorusSpan(2, 1, 2), TorusSpan(2, 1, 2)]


HLO = """HloModule m

%fused_slice (p0: f32[4,8], p1: s32[]) -> f32[1,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %ds = f32[1,8]{1,0} dynamic-slice(%p0, %p1, %z), dynamic_slice_sizes={1,8}
}

%fused_dot (a: f32[1,8], b: f32[8,8]) -> f32[1,8] {
  %a = f32[1,8]{1,0} parameter(0)
  %b = f32[8,8]{1,0} parameter(1)
  ROOT %d = f32[1,8]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%body (s: (s32[], f32[4,8], f32[8,8])) -> (s32[], f32[4,8], f32[8,8]) {
  %s = (s32[], f32[4,8]{1,0}, f32[8,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %w = f32[4,8]{1,0} get-tuple-element(%s), index=1
  %m = f32[8,8]{1,0} get-tuple-element(%s), index=2
  %row = f32[1,8]{1,0} fusion(%w, %i), kind=kLoop, calls=%fused_slice
  %y = f32[1,8]{1,0} fusion(%row, %m), kind=kOutput, calls=%fused_dot
  %r = f32[1,8]{1,0} all-reduce(%y), channel_id=1, replica_groups=[2,2]<=[4], use_global_device_ids=true, to_apply=%add
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[4,8]{1,0}, f32[8,8]{1,0}) tuple(%next, %w, %m)
}

%cond (c: (s32[], f32[4,8], f32[8,8])) -> pred[] {
  %c = (s32[], f32[4,8]{1,0}, f32[8,8]{1,0}) parameter(0)
  %k = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%k, %n), direction=LT
}

ENTRY %main (w: f32[4,8], m: f32[8,8]) -> f32[16,8] {
  %w = f32[4,8]{1,0} parameter(0)
  %m = f32[8,8]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4,8]{1,0}, f32[8,8]{1,0}) tuple(%zero, %w, %m)
  %loop = (s32[], f32[4,8]{1,0}, f32[8,8]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %g = f32[16,8]{1,0} all-gather(%m), channel_id=2, replica_groups={{0,2},{1,3}}, dimensions={0}, use_global_device_ids=true
}
"""


def test_program_profile_by_hand():
  coords = [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]  # a 2x2 slice, one device per chip
  profile = hlo_profile.program_profile(HLO, {"data": 2, "model": 2}, coords)
  groups = {g["kind"]: g for g in profile["collective_groups"]}
  reduce, gather = groups["all-reduce"], groups["all-gather"]
  # The all-reduce runs in the 4-trip loop, over {0,1}: the model axis, along x.
  assert (reduce["group_size"], reduce["mesh_axes"], reduce["executed"]) == (2, ["model"], 4)
  assert reduce["executed_bytes"] == 4 * 32 and reduce["torus_spans"] == [[2, 1, 2]]
  assert (gather["mesh_axes"], gather["executed_bytes"]) == (["data"], 512)
  # Per iteration: the slicing fusion reads one row (32 B) and the index (4 B) and writes
  # 32 B; the dot fusion reads 32 + 256 and writes 32 (a matmul); the all-reduce 32 + 32;
  # the counter's add 12. The condition's compare: 9 B, four times. The all-gather: 256 + 512.
  assert profile["hbm_bytes_per_device"] == pytest.approx(
      {"matmul_ops": 4 * 320, "other_ops": 4 * (68 + 64 + 12) + 4 * 9 + 768})
  # The same census as hlo.analyze.
  summary = hlo.analyze(HLO)
  for kind in ("all-reduce", "all-gather"):
    assert groups[kind]["executed_bytes"] == summary.collectives[kind].executed_bytes


SCATTER = """HloModule s

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%all-reduce-scatter (input: f32[8,16]) -> f32[8,4] {
  %input = f32[8,16]{1,0} parameter(0)
  %ar = f32[8,16]{1,0} all-reduce(%input), channel_id=1, replica_groups=[1,4]<=[4], use_global_device_ids=true, to_apply=%add
  %zero = u32[] constant(0)
  %id = u32[] partition-id()
  ROOT %ds = f32[8,4]{1,0} dynamic-slice(%ar, %zero, %id), dynamic_slice_sizes={8,4}
}

ENTRY %main (g: f32[8,16]) -> f32[8,4] {
  %g = f32[8,16]{1,0} parameter(0)
  ROOT %f = f32[8,4]{1,0} fusion(%g), kind=kCustom, calls=%all-reduce-scatter
}
"""


def test_a_sliced_all_reduce_is_a_reduce_scatter():
  profile = hlo_profile.program_profile(SCATTER, {"data": 4}, [(x, 0, 0) for x in range(4)])
  (group,) = profile["collective_groups"]
  assert (group["kind"], group["hlo_opcode"], group["group_size"]) == ("reduce-scatter",
                                                                      "all-reduce", 4)
  assert group["executed_bytes"] == 8 * 4 * 4  # the shard
  # hlo.analyze counts the all-reduce's whole result: the shard times the group.
  assert hlo.analyze(SCATTER).collectives["all-reduce"].executed_bytes == 4 * 128
  # Its time: (n-1) x shard = (n-1)/n of the buffer, half an all-reduce's.
  assert roofline.ring_factor("reduce-scatter", 4) * 128 == pytest.approx(
      roofline.ring_factor("all-reduce", 4) * 512 / 2)
  # The fusion reads the gradient and writes the shard.
  assert profile["hbm_bytes_per_device"] == {"matmul_ops": 0.0, "other_ops": 512 + 128}


def test_program_profile_without_coordinates():
  profile = hlo_profile.program_profile(HLO, {"data": 2, "model": 2}, None)
  assert all(g["torus_spans"] is None for g in profile["collective_groups"])
  record = _record(collective_groups=profile["collective_groups"])
  assert roofline.predict(record, CHIP).communication_seconds > 0


# ---------------------------------------------------------------------- the tool

@pytest.mark.integration
def test_from_json_recomputes_predictions(tmp_path, capsys):
  from meshbayes.tools import scaling_study
  path = tmp_path / "study.json"
  record = _record(target="v2:4x4", model="paper", estimators="bayesian", emb_dim=1024,
                   num_heads=128, head_dim=128, num_encoder_layers=6, num_decoder_layers=6,
                   mlp_dim=65536, remat_policy="none", dtype="float32",
                   flops_per_device=22.5e12)
  path.write_text(json.dumps([record, dict(record, flops_per_device=None)]))
  scaling_study.main(["--from_json", str(path)])
  out = capsys.readouterr().out
  assert "study.json: predicted step time" in out
  assert "| v2:4x4 | 16 | paper Bayes" in out and "| 1000 |" in out  # 1 s of compute
  table = tmp_path / "table.md"
  scaling_study.main(["--from_json", str(path), f"--markdown={table}"])
  assert "| 1000 / 1000 |" in table.read_text()


@pytest.mark.integration
def test_from_json_errors(tmp_path):
  from meshbayes.tools import scaling_study
  with pytest.raises(SystemExit, match="cannot read"):
    scaling_study.main(["--from_json", str(tmp_path / "missing.json")])
  with pytest.raises(SystemExit):
    scaling_study.main(["--model=tiny"])  # neither --topologies/--json nor --from_json


def test_weak_scaling_holds_the_batch_per_core():
  from meshbayes.scaling.study import weak_batch
  from meshbayes.scaling.targets import parse_targets
  targets = parse_targets("v2:2x2,v2:4x4,v2:16x16")
  assert [weak_batch(4, targets, t) for t in targets] == [4, 16, 256]
  assert [weak_batch(4, targets, t, weak_scaling=False) for t in targets] == [4, 4, 4]
  with pytest.raises(ValueError, match="--batch_size=3 x 8 / 32 cores is not a whole batch"):
    weak_batch(3, parse_targets("v2:4x4,v2:2x2"), parse_targets("v2:2x2")[0])
  assert weak_batch(3, targets, targets[1]) == 12


def test_a_study_refuses_estimators_that_are_not_pairs():
  from meshbayes.scaling.study import base_spec
  from meshbayes.tools import scaling_study
  options = vars(scaling_study.parse_args(["--topologies=v2:2x2", "--json=x.json",
                                           "--estimators=mlp=deterministic,flipout"]))
  with pytest.raises(ValueError, match=r"--estimators='mlp=deterministic,flipout' must be "
                                       r"component=estimator pairs"):
    base_spec(options)
  options["estimators"] = "mlp=deterministic"
  assert base_spec(options).estimators == (("mlp", "deterministic"),)


@pytest.mark.tpu
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed (make test-tpu installs it)")
def test_profile_of_a_tpu_program_matches_hlo_analyze():
  from meshbayes.scaling import aot, targets
  spec = aot.StepSpec(model="tiny", batch_size=16, input_length=16, target_length=16,
                      model_parallel=2, overrides=(("num_layers", 2),))
  target = targets.parse_target("v2:2x2")
  record = aot.compile_step(spec, target, keep_hlo=True)
  mesh = aot.make_partitioner(spec, target).mesh
  profile = hlo_profile.program_profile(record["hlo_text"], dict(mesh.shape),
                                        hlo_profile.mesh_chip_coords(mesh))
  totals = {}  # per HLO opcode, as hlo.analyze counts (a reduce-scatter's all-reduce: n shards)
  for g in profile["collective_groups"]:
    scale = g["group_size"] if g["kind"] != g["hlo_opcode"] else 1
    totals[g["hlo_opcode"]] = totals.get(g["hlo_opcode"], 0.0) + g["executed_bytes"] * scale
    assert g["mesh_axes"] is not None and g["torus_spans"] is not None
  for kind, census in record["collectives"].items():
    assert totals.get(kind, 0.0) == pytest.approx(census["executed_bytes"])
  # The model axis (2) holds the two cores of a chip: no torus link.
  assert all(g["torus_spans"] == [] for g in profile["collective_groups"]
             if g["mesh_axes"] == ["model"])
  assert profile["hbm_bytes_per_device"]["matmul_ops"] > 0
  prediction = roofline.predict(dict(record, **profile))
  assert prediction.communication_model == "replica groups" and prediction.step_seconds > 0
