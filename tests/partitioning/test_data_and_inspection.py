"""Host data layouts, global batches, and the inspection table and tool."""

import dataclasses
import importlib.util
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from meshbayes import partitioning
from meshbayes.partitioning import DataLayout, Partitioner

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class FakeDevice:
  process_index: int


@dataclasses.dataclass
class FakeMesh:
  """Enough of a ``Mesh`` for layouts of hosts this machine does not have."""

  devices: np.ndarray
  axis_names: tuple = ("data", "model")

  @property
  def shape(self):
    return dict(zip(self.axis_names, self.devices.shape))


def two_hosts(data, model):
  """8 devices, 4 per host, host-major as jax.devices() orders them."""
  devices = np.array([FakeDevice(i // 4) for i in range(8)], dtype=object)
  return FakeMesh(devices.reshape(data, model))


@pytest.mark.parametrize("data, model, expected", [
    (8, 1, [DataLayout(32, 16, 0, 2), DataLayout(32, 16, 1, 2)]),
    (2, 4, [DataLayout(32, 16, 0, 2), DataLayout(32, 16, 1, 2)]),
    # Model parallelism spans both hosts: both feed the same, whole batch.
    (1, 8, [DataLayout(32, 32, 0, 1), DataLayout(32, 32, 0, 1)]),
])
def test_two_host_layouts(data, model, expected):
  mesh = two_hosts(data, model)
  assert [partitioning.data_layout(mesh, P("data"), 32, host) for host in (0, 1)] == expected


def test_layout_errors():
  with pytest.raises(ValueError, match=r"global batch of 30 examples cannot be split into 8 equal "
                                       r"shards over mesh axes \('data',\); use a multiple of 8"):
    partitioning.data_layout(two_hosts(8, 1), P("data"), 30, 0)
  # Hosts interleaved so that host 0 holds batch shards {0, 1, 3} and host 1 {1, 2, 3}.
  devices = np.array([FakeDevice(p) for p in (0, 0, 0, 1, 1, 1, 1, 0)], dtype=object)
  with pytest.raises(ValueError, match="hosts hold overlapping but unequal batch shards"):
    partitioning.data_layout(FakeMesh(devices.reshape(4, 2)), P("data"), 32, 0)


def test_single_host_layout_and_global_batch():
  partitioner = Partitioner(data=4, model=2)
  assert partitioner.data_layout(16) == DataLayout(16, 16, 0, 1)
  local = {"inputs": np.arange(16 * 3).reshape(16, 3), "targets": np.arange(16)}
  batch = partitioner.global_batch(local)
  assert batch["inputs"].sharding.spec == P("data", None)
  assert {s.data.shape for s in batch["inputs"].addressable_shards} == {(4, 3)}
  np.testing.assert_array_equal(batch["inputs"], local["inputs"])
  np.testing.assert_array_equal(batch["targets"], local["targets"])


def test_inspection_table_for_a_2x4_mesh():
  import flax.linen as nn

  from meshbayes.models import MLP

  model = MLP((64, 64), 32)
  optimizer = optax.adamw(1e-3)
  x = np.ones((8, 32), np.float32)

  def init(key):
    params = model.init(key, x)["params"]
    return {"params": params, "opt_state": optimizer.init(nn.unbox(params))}

  partitioner = Partitioner(data=2, model=4)
  rows = partitioning.placements(partitioner, jax.eval_shape(init, jax.random.key(0)))
  params = [r for r in rows if r.group == "params"]
  assert rows[:len(params)] == params  # parameters listed first
  total_params = 2 * (32 * 64 + 64 * 64 + 64 * 32) + 64 + 64 + 32
  assert sum(int(np.prod(r.shape)) for r in params) == total_params
  table = partitioning.format_table(partitioner, rows)
  assert "mesh data=2 x model=4 (8 devices)" in table
  assert "params/dense_0/kernel_scale" in table and "(embed, mlp)" in table and "(-, model)" in table
  per_device = sum(r.per_device_bytes for r in rows)
  assert table.rstrip().endswith(f"{per_device / 1024:.2f} KiB")


@pytest.mark.integration
def test_inspect_partitioning_tool():
  spec = importlib.util.spec_from_file_location("inspect_tool",
                                                ROOT / "tools" / "inspect_partitioning.py")
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  table = tool.main(["--mesh=2x4", "--rules=fsdp_tp", "--hidden=64", "--input_dim=32",
                     "--classes=32", "--optimizer=adafactor"])
  assert "params/dense_0/kernel_loc" in table and "(data, model)" in table
  table = tool.main(["--model=tiny", "--mesh=-1x2", "--rules=megatron"])
  assert "params/encoder/layers/attention/query/kernel_scale" in table
  assert "(layers, embed, heads, kv)  (-, -, model, -)" in table
  with pytest.raises(SystemExit):
    tool.main(["--mesh=2by4"])
