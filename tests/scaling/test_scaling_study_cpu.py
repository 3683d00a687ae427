"""The scaling study on a simulated CPU mesh (no libtpu): the trainer's step, compiled only.

One small compile (the deterministic twin of the tiny preset, which the CPU
backend compiles fastest) through the command line tool; what it reports is
checked against the sharding arithmetic.
"""

import json
import math

import jax
import jax.numpy as jnp
import pytest

from meshbayes.scaling import aot
from meshbayes.scaling.study import base_spec
from meshbayes.scaling.targets import parse_target
from meshbayes.tools import scaling_study

pytestmark = pytest.mark.integration

ARGS = ["--model=tiny", "--deterministic", "--topologies=v2:2x2", "--target=cpu",
        "--model_parallel=2", "--num_layers=2", "--batch_size=8", "--input_length=8",
        "--target_length=8"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
  out = tmp_path_factory.mktemp("scaling") / "tiny.json"
  records = scaling_study.main(ARGS + [f"--json={out}"])
  return out, records


def test_the_tool_writes_json_markdown_and_plots(study):
  out, records = study
  saved = json.loads(out.read_text())
  assert len(saved) == len(records) == 1
  record = saved[0]
  for field in ("cores", "fits", "argument_bytes_per_device", "temp_bytes_per_device",
                "flops_per_device", "variational_params", "mesh", "collectives",
                "compile_seconds", "command"):
    assert field in record, field
  assert record["error"] is None
  assert record["cores"] == 8 and record["mesh"] == {"data": 4, "model": 2}
  # A CPU mesh named after a TPU slice is judged against that TPU's memory.
  assert record["fits"] is True and record["fit_source"] == "estimate"
  table = out.with_suffix(".md").read_text()
  assert "| v2:2x2 (cpu) | 8 | 4 x 2 |" in table
  assert out.with_suffix(".png").stat().st_size > 0


def test_argument_bytes_are_the_sharding_arithmetic(study):
  _, (record,) = study
  spec = base_spec(vars(scaling_study.parse_args(ARGS + ["--json=x"])))
  prepared = aot.prepare_step(spec, parse_target("v2:2x2", "cpu"))
  shard_bytes = sum(math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
                    for x in jax.tree.leaves((prepared.placed, prepared.batch)))
  # CPU buffers are unpadded: the arguments are exactly the shards of state and batch.
  assert record["argument_bytes_per_device"] == shard_bytes
  # The donated state comes back in place.
  assert record["alias_bytes_per_device"] == record["state_bytes_per_device"]
  # fsdp_tp splits the big kernels over all 8 devices.
  wi = prepared.placed.params["encoder"]["layers"]["mlp"]["wi_0"]["kernel"]
  assert math.prod(wi.sharding.shard_shape(wi.shape)) * 8 == math.prod(wi.shape)


def test_flops_count_every_layer_and_collectives_are_censused(study):
  _, (record,) = study
  assert 2 in record["loop_trip_counts"]  # the scanned layers
  # The compiled program does every matmul of the traced step, split evenly over
  # the 8 devices (XLA's own count sees each scanned layer once).
  assert record["flops_per_device"] == pytest.approx(record["model_flops_per_device"], rel=0.02)
  assert record["xla_flops_per_device"] < record["all_flops_per_device"]
  census = record["collectives"]
  assert set(census) == {"all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                         "collective-permute"}
  assert census["all-reduce"]["count"] > 0  # gradients summed over data
  assert all(c["executed"] >= c["count"] for c in census.values())
