"""The scaling study on a TPU topology: the trainer's step compiled for v2:2x2 (8 cores).

Needs libtpu (``make test-tpu`` installs the ``tpu`` extra); skipped without it.
"""

import importlib.util
import math

import jax
import jax.numpy as jnp
import pytest

from meshbayes.scaling import aot, targets

pytestmark = [
    pytest.mark.tpu,
    pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                       reason="libtpu is not installed (make test-tpu installs it)"),
]

SPEC = aot.StepSpec(model="tiny", batch_size=16, input_length=16, target_length=16,
                    model_parallel=2, overrides=(("num_layers", 2),))


def _padded_bytes(shard_shape, dtype, layout) -> int:
  """Bytes of one shard in TPU memory: minor dimensions rounded up to the layout's first tile."""
  dims = [shard_shape[d] for d in layout.major_to_minor] or [1]
  tile = layout.tiling[0] if layout.tiling else ()
  dims = [1] * (len(tile) - len(dims)) + dims
  for i, size in enumerate(tile, start=len(dims) - len(tile)):
    dims[i] = -(-dims[i] // size) * size
  return math.prod(dims) * jnp.dtype(dtype).itemsize


@pytest.fixture(scope="module")
def compiled():
  prepared = aot.prepare_step(SPEC, targets.parse_target("v2:2x2"))
  return prepared, prepared.lower().compile()


def test_argument_bytes_per_device_are_the_sharding_arithmetic(compiled):
  prepared, executable = compiled
  leaves = jax.tree.leaves((prepared.placed, prepared.batch))
  layouts = [f.layout for f in jax.tree.leaves(executable.input_formats[0])]
  assert len(layouts) == len(leaves)
  expected = sum(_padded_bytes(x.sharding.shard_shape(x.shape), x.dtype, layout)
                 for x, layout in zip(leaves, layouts))
  assert executable.memory_analysis().argument_size_in_bytes == expected
  # Unpadded, every kernel of the 2-D (fsdp_tp) layout is split over all 8 cores.
  query = prepared.placed.params["encoder"]["layers"]["attention"]["query"]["kernel_loc"]
  assert math.prod(query.sharding.shard_shape(query.shape)) * 8 == math.prod(query.shape)


def test_the_record_of_a_fitting_step():
  record = aot.compile_step(SPEC, targets.parse_target("v2:2x2"))
  assert record["error"] is None
  assert (record["fits"], record["fit_source"]) == (True, "compiler")
  assert record["cores"] == 8 and record["mesh"] == {"data": 4, "model": 2}
  assert record["flops_per_device"] > 0 and record["unknown_trip_counts"] == 0
  assert record["collectives"]["all-reduce"]["count"] > 0


def test_out_of_memory_is_a_record_with_the_compilers_message():
  spec = aot.StepSpec(model="tiny", batch_size=8, input_length=8, target_length=8,
                      model_parallel=2, overrides=(("emb_dim", 32768), ("mlp_dim", 131072)))
  record = aot.compile_step(spec, targets.parse_target("v2:2x2"))
  assert record["fits"] is False and record["fit_source"] == "compiler"
  assert "RESOURCE_EXHAUSTED" in record["message"]
  assert record["required_bytes_per_device"] > targets.parse_target("v2:2x2").usable_hbm_bytes


def test_usable_memory_table_matches_the_compiler():
  assert targets.probe_usable_hbm("v2:2x2") == targets.GENERATIONS["v2"][1]
