"""The estimators' samplers: exact distributions, determinism, and the same values however
the array is sharded."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from meshbayes.layers import estimators
from meshbayes.scaling import hlo

Z = 4.5


def test_threefry_is_jaxs_hash_bit_for_bit():
  from jax.extend.random import threefry2x32_p
  data = jax.random.key_data(jax.random.key(7))
  counts = jnp.arange(4096, dtype=jnp.uint32).reshape(64, 64)
  ours = estimators.threefry2x32(data[0], data[1], counts[::-1], counts)
  theirs = threefry2x32_p.bind(data[0], data[1], counts[::-1], counts)
  for a, b in zip(ours, theirs):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_standard_normal_matches_the_normal_distribution():
  x = np.asarray(estimators.standard_normal(jax.random.key(0), (1000, 1000)), np.float64).ravel()
  n = x.size
  assert abs(x.mean()) < Z / math.sqrt(n)
  assert abs(x.var() - 1.0) < Z * math.sqrt(2.0 / n)
  assert abs(np.mean(x ** 4) - 3.0) < Z * math.sqrt(96.0 / n)  # kurtosis
  # Empirical CDF within the Kolmogorov-Smirnov bound at the 0.1% level.
  xs = np.sort(x)[::997]
  cdf = 0.5 * (1.0 + np.vectorize(math.erf)(xs / math.sqrt(2.0)))
  assert np.max(np.abs(cdf - (np.arange(n)[::997] + 0.5) / n)) < 1.95 / math.sqrt(n)


def test_rademacher_signs_are_exact_balanced_and_independent():
  signs = np.asarray(estimators.rademacher(jax.random.key(1), (512, 2048), jnp.bfloat16),
                     np.float64)
  assert set(np.unique(signs)) == {-1.0, 1.0}
  n = signs.size
  assert abs(signs.mean()) < Z / math.sqrt(n)
  # Neighbours share a random word: they must still be uncorrelated, as must rows.
  assert abs(np.mean(signs[:, 1:] * signs[:, :-1])) < Z / math.sqrt(n)
  assert abs(np.mean(signs[1:] * signs[:-1])) < Z / math.sqrt(n)


@pytest.mark.parametrize("shape", [(3, 7), (5, 32), (4, 64)])
def test_every_shape_is_drawn(shape):
  key = jax.random.key(2)
  assert estimators.rademacher(key, shape, jnp.float32).shape == shape
  assert estimators.standard_normal(key, shape).shape == shape
  assert estimators.random_words(key, shape).dtype == jnp.uint32


def test_draws_are_deterministic_and_differ_between_keys():
  a, b = jax.random.key(3), jax.random.key(4)
  draw = lambda k: np.asarray(estimators.standard_normal(k, (8, 16)))
  np.testing.assert_array_equal(draw(a), draw(a))
  assert not np.allclose(draw(a), draw(b))
  # vmap over keys gives each key's own draw.
  batched = jax.vmap(lambda k: estimators.standard_normal(k, (8, 16)))(jnp.stack([a, b]))
  np.testing.assert_array_equal(np.asarray(batched[1]), draw(b))


@pytest.mark.parametrize("shape", [(4, 6), (3, 5, 8), (2, 64)])
def test_the_gpu_words_position_by_position_are_the_block_words(shape):
  # GPUs compute each position's word on its own (it fuses into the consumer): the same bits.
  data = jax.random.key_data(jax.random.key(8))
  np.testing.assert_array_equal(np.asarray(estimators._words_by_position(data, shape)),
                                np.asarray(estimators._words_by_block(data, shape)))


def test_other_key_implementations_use_jax_random():
  key = jax.random.key(5, impl="rbg")
  np.testing.assert_array_equal(np.asarray(estimators.random_words(key, (4, 8))),
                                np.asarray(jax.random.bits(key, (4, 8), jnp.uint32)))


@pytest.mark.parametrize("spec", [PartitionSpec("data", "model"), PartitionSpec(None, "model"),
                                  PartitionSpec("data", None)])
def test_a_sharded_draw_equals_the_unsharded_one(spec):
  mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
  key = jax.random.key(6)
  sharding = NamedSharding(mesh, spec)
  for draw in (lambda k: estimators.standard_normal(k, (16, 256)),
               lambda k: estimators.rademacher(k, (16, 256), jnp.float32)):
    program = jax.jit(draw, out_shardings=sharding)
    np.testing.assert_array_equal(np.asarray(program(key)), np.asarray(jax.jit(draw)(key)))
    # Each device draws its own shard: no communication.
    census = hlo.analyze(program.lower(key).compile().as_text()).collectives
    assert not any(c.count for c in census.values())
