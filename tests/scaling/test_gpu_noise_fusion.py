"""The estimators' noise as an H200 program (deviceless): drawn inside the kernels that use it.

Needs JAX's CUDA plugin (``make test-gpu-aot``); skipped without it. Seconds: one layer.
"""

import math

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from meshbayes.layers import estimators
from meshbayes.scaling import hlo, hlo_profile, targets

pytestmark = [
    pytest.mark.gpu_aot,
    pytest.mark.skipif(not targets.gpu_aot_available(),
                       reason="JAX's CUDA plugin is not installed (make test-gpu-aot)"),
]

TOKENS, IN, OUT = 8192, 768, 2048  # base's feed-forward input layer, 32 sequences of 256


def _layer_program(estimator: str) -> str:
  """The compiled H200 program of one Bayesian dense layer's gradients (noise regenerated)."""
  target = targets.parse_target("h200:1")
  replicated = NamedSharding(Mesh(target.devices(), ("data",)), PartitionSpec())
  contract = lambda x, w, **options: jnp.einsum("td,df->tf", x, w, **options)

  def loss(inputs, loc, scale, key_data):
    kernel = estimators.Normal(loc, jax.nn.softplus(scale), scale)
    outputs = estimators.DENSE[estimator](jax.random.wrap_key_data(key_data), contract,
                                          inputs, kernel)
    return jnp.sum(jnp.square(outputs.astype(jnp.float32)))

  arrays = [jax.ShapeDtypeStruct(shape, dtype, sharding=replicated) for shape, dtype in (
      ((TOKENS, IN), jnp.bfloat16), ((IN, OUT), jnp.float32), ((IN, OUT), jnp.float32),
      ((2,), jnp.uint32))]
  program = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*arrays)
  return program.compile(compiler_options=target.compiler_options).as_text()


def _bytes(text: str) -> float:
  operations = hlo_profile.program_profile(text, {"data": 1})["operations_per_device"]
  return sum(entry["bytes"] for entry in operations.values())


def _written(text: str) -> list:
  computations, entry = hlo.parse_computations(text)
  return [shape for instruction in computations[entry] if instruction.opcode == "fusion"
          for shape in hlo.flat_shapes(instruction)]


@pytest.mark.parametrize("estimator", ["local_reparameterization", "flipout"])
def test_no_kernel_writes_activation_sized_random_words(estimator):
  text = _layer_program(estimator)
  # The activation's noise needs TOKENS x OUT / 2 words (local reparameterization); written
  # to memory they would be read back by the kernel using them, as would interleaved pairs.
  large = [s for s in _written(text) if math.prod(s.dims) >= TOKENS * OUT // 4]
  assert not [s for s in large if s.dtype == "u32" or s.dims[-1] == 2], large


def test_the_fused_draw_moves_a_third_less_than_the_block_words(monkeypatch):
  fused = _bytes(_layer_program("local_reparameterization"))
  # Force the CPU's construction (words interleaved after hashing each block once).
  monkeypatch.setattr(estimators, "_words_by_position", estimators._words_by_block)
  blocks = _bytes(_layer_program("local_reparameterization"))
  # Measured at this shape: 1.07 GB against 1.74 GB (the noise and its words written, read).
  assert fused < 0.7 * blocks, (fused, blocks)
