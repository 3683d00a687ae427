"""Mesh construction and logical axis rules."""

from pathlib import Path

import jax
import pytest
from jax.sharding import PartitionSpec as P

from meshbayes import partitioning
from meshbayes.partitioning import Partitioner


@pytest.mark.parametrize("kwargs, shape", [
    ({"num_partitions": 2}, (4, 2)),
    ({"data": -1, "model": 4}, (2, 4)),
    ({"data": 8, "model": -1}, (8, 1)),
    ({"data": 2, "model": 4}, (2, 4)),
    ({}, (8, 1)),
])
def test_mesh_shapes(kwargs, shape):
  mesh = partitioning.create_mesh(**kwargs)
  assert mesh.axis_names == ("data", "model")
  assert tuple(mesh.shape.values()) == shape
  assert sorted(d.id for d in mesh.devices.flat) == list(range(8))


@pytest.mark.parametrize("kwargs, match", [
    ({"data": 3, "model": 2}, r"mesh data=3 x model=2 needs 6 devices but 8 are available"),
    ({"data": 3, "model": -1}, r"mesh data=3 x model=-1: 8 devices do not divide by 3"),
    ({"data": -1, "model": -1}, r"at most one may be -1"),
    ({"data": 0, "model": 8}, r"each axis size must be a positive int"),
    ({"num_partitions": 2, "data": 4}, r"give num_partitions=2 or data=4/model=1, not both"),
    ({"data": "2", "model": 4}, r"^mesh data='2' is a str; expected an int: a positive size, "
                                r"or -1 to fill from the device count$"),
    ({"num_partitions": 2.0}, r"^mesh num_partitions=2.0 is a float; expected an int"),
])
def test_mesh_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    partitioning.create_mesh(**kwargs)


def test_a_mesh_larger_than_the_cpu_devices_says_how_to_simulate_more():
  with pytest.raises(ValueError, match=r"^mesh data=-1 x model=4: 2 devices do not divide by 4; "
                                       r"choose sizes whose product divides 2; on CPU, simulate 4 "
                                       r"devices: --num_cpu_devices=4 on a meshbayes command line, "
                                       r"or XLA_FLAGS=--xla_force_host_platform_device_count=4 set "
                                       r"before jax is imported$"):
    partitioning.create_mesh(jax.devices()[:2], data=-1, model=4)


def test_mesh_on_a_subset_of_devices():
  mesh = partitioning.create_mesh(jax.devices()[:4], num_partitions=2)
  assert dict(mesh.shape) == {"data": 2, "model": 2}


GIN_CONFIGS = Path(__file__).resolve().parents[2] / "gin_configs"
KERNEL = ("embed", "mlp")
ACTIVATION = ("batch", "length", "embed")


@pytest.mark.parametrize("preset, kernel, activation, heads_kernel", [
    ("data_only", P(None, None), P("data", None, None), P(None, None, None)),
    ("megatron", P(None, "model"), P("data", None, None), P(None, "model", None)),
    ("fsdp_tp", P("data", "model"), P("data", None, None), P("data", "model", None)),
])
def test_presets(preset, kernel, activation, heads_kernel):
  rules = partitioning.PRESETS[preset]
  assert partitioning.logical_to_mesh_spec(KERNEL, rules, "k") == kernel
  # 2-D parameter rules put embed on data, but an activation's batch already uses data.
  assert partitioning.logical_to_mesh_spec(ACTIVATION, rules, "a") == activation
  assert partitioning.logical_to_mesh_spec(("embed", "heads", "kv"), rules, "q") == heads_kernel


def test_two_dimensional_activation_rules():
  rules = partitioning.standard_rules(activation_partitioning_dims=2)
  assert partitioning.logical_to_mesh_spec(ACTIVATION, rules, "a") == P("data", None, "model")
  # For a kernel, mlp takes model first, so embed stays whole.
  assert partitioning.logical_to_mesh_spec(KERNEL, rules, "k") == P(None, "model")


def test_additional_rules_and_explicit_tables():
  rules = partitioning.resolve_rules("megatron", additional_rules=[("experts", "data")])
  assert rules[-1] == ("experts", "data")
  table = partitioning.resolve_rules([["batch", "data"], ["embed", ["data", "model"]]])
  assert table == (("batch", "data"), ("embed", ("data", "model")))


@pytest.mark.parametrize("make, match", [
    (lambda: partitioning.resolve_rules("tensor_parallel"),
     r"logical axis rules 'tensor_parallel' is not a preset; valid presets: data_only, fsdp_tp, "
     r"megatron"),
    (lambda: partitioning.resolve_rules([("batch",)]), r"rule \('batch',\) must be a pair"),
    (lambda: Partitioner(rules=[("batch", "data"), ("mlp", "tensor")]),
     r"logical axis rule \('mlp', 'tensor'\) names mesh axis 'tensor', which the mesh "
     r"\('data', 'model'\) does not have"),
    (lambda: partitioning.logical_to_mesh_spec(("embd",), partitioning.PRESETS["megatron"],
                                               "dense/kernel_loc"),
     r"dense/kernel_loc: logical axis 'embd' has no rule; known names: .*embed"),
    (lambda: Partitioner(on_indivisible="ignore"), r"on_indivisible='ignore' must be one of"),
    (lambda: partitioning.standard_rules(parameter_partitioning_dims=3),
     r"parameter_partitioning_dims=3 must be 1 or 2"),
])
def test_rule_errors_name_the_bad_item(make, match):
  with pytest.raises(ValueError, match=match) as info:
    make()
  assert "\n" not in str(info.value)


@pytest.mark.parametrize("preset", ["data_only", "megatron", "fsdp_tp"])
def test_gin_presets_and_user_rules(preset):
  import gin

  import meshbayes.partitioning.configurables  # noqa: F401  (registers the configurables)

  gin.clear_config()
  try:
    gin.parse_config_files_and_bindings(
        [str(GIN_CONFIGS / "partitioning" / f"{preset}.gin")],
        ["partitioning.Partitioner.additional_rules = [('experts', 'data')]"])
    partitioner = gin.get_configurable("partitioning.Partitioner")()
  finally:
    gin.clear_config()
  assert partitioner.rules == preset
  assert partitioner.axis_rules[-1] == ("experts", "data")
  assert dict(partitioner.mesh.shape)["model"] == (1 if preset == "data_only" else 2)
