"""Gradient estimators for linear maps with a factorized normal weight posterior.

Pure functions of a key, ``contract`` (the layer's linear map), the inputs and
the kernel's (and a Bayesian bias's) ``Normal`` posterior. All give each output
the mean ``contract(x, loc)`` and variance ``contract(x * x, stddev^2)``; they
differ in which outputs share a weight sample (docs/layers.md). Compute is in
``inputs.dtype``, weight samples are formed in float32. ``random_words``,
``standard_normal`` and ``rademacher`` are jax's samplers as fusible expressions.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name

Array = jax.Array
Contract = Callable[..., Array]
Constrain = Callable[[Array], Array]
# (key, contract, inputs, kernel, bias=None, constrain_kernel=identity) -> outputs
Estimator = Callable[..., Array]


def _identity(x: Array) -> Array:
  return x


def _threefry(key: Array) -> bool:
  """Whether ``key`` is a typed threefry key sampled in jax's partitionable mode."""
  return (jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
          and str(jax.random.key_impl(key)) == "threefry2x32"
          and bool(jax.config.jax_threefry_partitionable))


# The name of the local reparameterization's float32 output variance: a checkpoint policy
# that saves it (``regenerating``'s ``policy``) spares the backward pass its matmul.
VARIANCE_NAME = "local_reparameterization_variance"
# The name of the keys an estimator splits from its own: ``regenerating`` keeps them (a
# few bytes), so the backward pass does not split again (two small kernels a call on GPUs).
KEYS_NAME = "estimator_keys"

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))  # Threefry-2x32's (Salmon et al., 2011)


def threefry2x32(key1: Array, key2: Array, count1: Array, count2: Array) -> tuple[Array, Array]:
  """The Threefry-2x32 hash (20 rounds) of the counter pairs under a key, elementwise.

  Bit for bit jax's ``threefry2x32`` primitive, written out so that XLA fuses
  the rounds into one pass (jax's CPU lowering loops over the array).
  """
  keys = (key1, key2, key1 ^ key2 ^ np.uint32(0x1BD11BDA))
  x0, x1 = count1 + keys[0], count2 + keys[1]
  for group in range(5):
    for rotation in _ROTATIONS[group % 2]:
      x0 = x0 + x1
      x1 = (x1 << np.uint32(rotation)) | (x1 >> np.uint32(32 - rotation))
      x1 = x1 ^ x0
    x0 = x0 + keys[(group + 1) % 3]
    x1 = x1 + keys[(group + 2) % 3] + np.uint32(group + 1)
  return x0, x1


def _words_by_block(data: Array, shape: tuple[int, ...]) -> Array:
  # Each block hashed once and its two words interleaved: half the hashing (CPU, TPU).
  half = shape[:-1] + (shape[-1] // 2,)
  counter, stride = jnp.zeros(half, jnp.uint32), 1
  for axis in reversed(range(len(half))):
    counter = counter + lax.broadcasted_iota(jnp.uint32, half, axis) * np.uint32(stride)
    stride *= half[axis]
  first, second = threefry2x32(data[..., 0], data[..., 1], jnp.zeros_like(counter), counter)
  return jnp.stack([first, second], axis=-1).reshape(shape)


def _words_by_position(data: Array, shape: tuple[int, ...]) -> Array:
  # The same words, each position hashing its block and keeping its word: elementwise, so
  # XLA's GPU fusion folds the draw into its consumer instead of writing the words (and
  # the interleaved normals) to memory; twice the hashing, which a GPU has to spare.
  last = lax.broadcasted_iota(jnp.uint32, shape, len(shape) - 1)
  counter, stride = last >> np.uint32(1), shape[-1] // 2
  for axis in reversed(range(len(shape) - 1)):
    counter = counter + lax.broadcasted_iota(jnp.uint32, shape, axis) * np.uint32(stride)
    stride *= shape[axis]
  first, second = threefry2x32(data[..., 0], data[..., 1], jnp.zeros_like(counter), counter)
  return jnp.where((last & np.uint32(1)) == 0, first, second)


def random_words(key: Array, shape: Sequence[int]) -> Array:
  """Uniform random ``uint32`` words, two from each threefry block.

  Block ``i`` (counted over ``shape`` with its last axis halved) fills
  positions ``2i`` and ``2i + 1`` of the last axis, so the words of a shard
  depend only on the shard's own positions. The words are the same on every
  platform; on GPUs they are computed position by position, which fuses into
  their consumer. Other key implementations, an odd last axis and arrays of
  ``2**33`` words or more go to ``jax.random.bits``.
  """
  shape = tuple(shape)
  if not shape or shape[-1] % 2 or math.prod(shape) >= 2 ** 33 or not _threefry(key):
    return jax.random.bits(key, shape, jnp.uint32)
  by_block = functools.partial(_words_by_block, shape=shape)
  by_position = functools.partial(_words_by_position, shape=shape)
  return lax.platform_dependent(jax.random.key_data(key), cuda=by_position,
                                rocm=by_position, default=by_block)


def standard_normal(key: Array, shape: Sequence[int], dtype=jnp.float32) -> Array:
  """Standard normal samples: the inverse CDF of a uniform with 23 random bits.

  The construction of ``jax.random.normal`` on ``random_words``; dtypes
  other than float32 use ``jax.random.normal``.
  """
  if jnp.dtype(dtype) != jnp.float32:
    return jax.random.normal(key, tuple(shape), dtype)
  mantissa = (random_words(key, shape) >> np.uint32(9)) | np.uint32(0x3F800000)
  unit = lax.bitcast_convert_type(mantissa, jnp.float32) - 1.0  # [0, 1)
  low = np.nextafter(np.float32(-1.0), np.float32(0.0))  # keep erf_inv finite
  uniform = jnp.maximum(low, unit * (1.0 - low) + low)  # (-1, 1)
  return np.float32(math.sqrt(2.0)) * lax.erf_inv(uniform)


def rademacher(key: Array, shape: Sequence[int], dtype) -> Array:
  """Signs -1 and +1 with probability 1/2 each, exactly representable in ``dtype``.

  Each random word gives the signs of 32 neighbouring positions of the last
  axis (``jax.random.rademacher`` spends a word on each); a last axis that 32
  does not divide goes to ``jax.random.rademacher``.
  """
  shape = tuple(shape)
  if not shape or shape[-1] % 32:
    return jax.random.rademacher(key, shape, dtype)
  words = random_words(key, shape[:-1] + (shape[-1] // 32,))
  bits = (words[..., None] >> jnp.arange(32, dtype=jnp.uint32)) & np.uint32(1)
  return (1 - 2 * bits.astype(jnp.int32)).reshape(shape).astype(dtype)


class Normal(NamedTuple):
  """A factorized normal posterior: elementwise mean and standard deviation.

  ``scale``, when given, is the parameter the stddev was computed from
  (``stddev = softplus(scale)``): a ``regenerating`` estimator recomputes the
  stddev from it in the backward pass instead of keeping it.
  """

  loc: Array
  stddev: Array
  scale: Array | None = None

  def sample(self, key: Array, constrain: Constrain = _identity) -> Array:
    """One draw ``loc + stddev * eps``, in the posterior's dtype.

    Args:
      key: PRNG key for ``eps``.
      constrain: a sharding constraint for ``eps`` (place it like the weight,
        so each device draws only its shard).
    """
    eps = constrain(standard_normal(key, self.loc.shape, self.loc.dtype))
    return self.loc + self.stddev * eps


def _split(key: Array, num: int) -> Array:
  """``jax.random.split(key, num)``, named ``KEYS_NAME`` for checkpoint policies."""
  return checkpoint_name(jax.random.split(key, num), KEYS_NAME)


def posterior_mean(contract: Contract, inputs: Array, kernel: Normal,
                   bias: Normal | None = None) -> Array:
  """The output under the posterior mean: ``contract(x, kernel.loc) + bias.loc``."""
  outputs = contract(inputs, kernel.loc.astype(inputs.dtype))
  if bias is not None:
    outputs = outputs + bias.loc.astype(inputs.dtype)
  return outputs


def reparameterization(key: Array, contract: Contract, inputs: Array, kernel: Normal,
                       bias: Normal | None = None,
                       constrain_kernel: Constrain = _identity) -> Array:
  """One weight sample for the whole call: ``contract(x, loc + stddev * eps)``.

  Args:
    key: PRNG key.
    contract: the layer's linear map.
    inputs: activations in the compute dtype.
    kernel: the kernel's posterior.
    bias: a Bayesian bias's posterior, or None.
    constrain_kernel: places a kernel-shaped array on the mesh like the kernel
      (a sharding constraint), so the noise is drawn shard by shard.

  Returns:
    The outputs under the sampled weights.
  """
  key_kernel, key_bias = _split(key, 2)
  outputs = contract(inputs, kernel.sample(key_kernel, constrain_kernel).astype(inputs.dtype))
  if bias is not None:
    outputs = outputs + bias.sample(key_bias).astype(inputs.dtype)
  return outputs


def grouped_reparameterization(key: Array, contract: Contract, inputs: Array, kernel: Normal,
                               bias: Normal | None = None,
                               constrain_kernel: Constrain = _identity, *, num_groups: int,
                               constrain_samples: Constrain = _identity) -> Array:
  """One weight sample per group: group ``g`` contracts with ``loc + stddev * eps_g``.

  The batch (axis 0 of the inputs) is cut into ``num_groups`` equal consecutive
  groups; one batched matmul contracts each with its own sample, so the matmul
  FLOPs are the deterministic layer's. ``eps`` is one ``(num_groups, *kernel)``
  draw, whose words depend on positions only: a device holding some groups draws
  only theirs. The keys are split as ``reparameterization`` splits them, so
  ``num_groups=1`` is that estimator bit for bit; ``num_groups`` = batch gives
  each example its own sample. A Bayesian bias gets one sample per group too.

  Args:
    key: PRNG key.
    contract: the layer's linear map.
    inputs: activations in the compute dtype, the batch on axis 0.
    kernel: the kernel's posterior.
    bias: a Bayesian bias's posterior, or None.
    constrain_kernel: unused (the samples are placed by ``constrain_samples``);
      accepted so all estimators share one signature.
    num_groups: how many weight samples; must divide the batch.
    constrain_samples: places the ``(num_groups, *kernel)`` samples: the group
      axis like the batch, the rest like the kernel (each group's sample then
      lives with its data shard).

  Returns:
    The outputs under each group's sampled weights.
  """
  del constrain_kernel
  batch = inputs.shape[0] if inputs.ndim else 0
  if (not isinstance(num_groups, int) or isinstance(num_groups, bool) or num_groups < 1
      or batch % num_groups):
    raise ValueError(f"grouped_reparameterization: num_groups={num_groups!r} must be a "
                     f"positive int that divides the batch of {batch} examples")
  key_kernel, key_bias = _split(key, 2)
  dtype = inputs.dtype
  eps = constrain_samples(standard_normal(key_kernel, (num_groups,) + kernel.loc.shape,
                                          kernel.loc.dtype))
  samples = (kernel.loc + kernel.stddev * eps).astype(dtype)
  grouped = inputs.reshape((num_groups, batch // num_groups) + inputs.shape[1:])
  outputs = jax.vmap(contract)(grouped, samples)
  if bias is not None:
    bias_eps = standard_normal(key_bias, (num_groups,) + bias.loc.shape, bias.loc.dtype)
    bias_samples = (bias.loc + bias.stddev * bias_eps).astype(dtype)
    # Each group's bias sample, broadcast over its examples and positions.
    middle = (1,) * (outputs.ndim - 1 - bias.loc.ndim)
    outputs = outputs + bias_samples.reshape((num_groups,) + middle + bias.loc.shape)
  return outputs.reshape((batch,) + outputs.shape[2:])


def flipout(key: Array, contract: Contract, inputs: Array, kernel: Normal,
            bias: Normal | None = None, constrain_kernel: Constrain = _identity,
            shared_axes: Sequence[int] = (), noise_dtype: Any = None) -> Array:
  """Flipout: ``x @ loc + ((x * s) @ (stddev * eps) + bias noise) * r``.

  ``eps`` (and the bias noise) is drawn once per call; ``s`` (input-shaped)
  and ``r`` (output-shaped) are integer-valued Rademacher signs drawn for every
  example and position. Flipping signs of a symmetric perturbation leaves its
  distribution unchanged, so each example keeps the exact marginal, while the
  perturbations of different examples become uncorrelated.

  Args:
    key: PRNG key.
    contract: the layer's linear map.
    inputs: activations in the compute dtype.
    kernel: the kernel's posterior.
    bias: a Bayesian bias's posterior, or None.
    constrain_kernel: sharding constraint for kernel-shaped arrays.
    shared_axes: non-negative axes of the inputs and outputs along which the
      signs are shared (``conv_flipout``'s spatial axes).
    noise_dtype: dtype of the weight perturbation ``stddev * eps`` (None: the
      posterior's, float32); ``eps`` is drawn in the posterior's dtype either way, so
      only rounding differs.

  Returns:
    The perturbed outputs.
  """
  key_eps, key_in, key_out, key_bias = _split(key, 4)
  dtype = inputs.dtype
  sign_shape = lambda shape: tuple(1 if a in shared_axes else n for a, n in enumerate(shape))
  eps = constrain_kernel(standard_normal(key_eps, kernel.loc.shape, kernel.loc.dtype))
  sign_in = rademacher(key_in, sign_shape(inputs.shape), dtype)
  noise_dtype = noise_dtype or kernel.loc.dtype
  weight_noise = kernel.stddev.astype(noise_dtype) * eps.astype(noise_dtype)
  perturbation = contract(inputs * sign_in, weight_noise.astype(dtype))
  if bias is not None:
    perturbation = perturbation + (bias.sample(key_bias) - bias.loc).astype(dtype)
  sign_out = rademacher(key_out, sign_shape(perturbation.shape), dtype)
  return posterior_mean(contract, inputs, kernel, bias) + perturbation * sign_out


def conv_flipout(key: Array, contract: Contract, inputs: Array, kernel: Normal,
                 bias: Normal | None = None, constrain_kernel: Constrain = _identity) -> Array:
  """Flipout for a convolution (channels last): signs per example and channel.

  ``s`` (per example and input channel) and ``r`` (per example and output
  channel) are shared over the spatial positions, as in TFP's ``Conv2DFlipout``:
  each example sees one kernel sample ``loc + stddev * eps * s r^T`` at all of
  its positions.

  Args are those of ``flipout``; ``inputs`` are ``(batch, spatial..., channels)``.
  """
  return flipout(key, contract, inputs, kernel, bias, constrain_kernel,
                 shared_axes=tuple(range(1, inputs.ndim - 1)))


def _safe_sqrt(x: Array) -> Array:
  # sqrt has an infinite derivative at 0 (all-zero inputs such as padding), which
  # would turn into NaN gradients; the derivative there is taken as 0 instead.
  positive = x > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def local_reparameterization(key: Array, contract: Contract, inputs: Array, kernel: Normal,
                             bias: Normal | None = None,
                             constrain_kernel: Constrain = _identity,
                             noise_dtype: Any = None) -> Array:
  """Local reparameterization: sample each pre-activation from its Gaussian.

  ``mean = x @ loc + bias.loc``, ``variance = (x * x) @ stddev^2 + bias.stddev^2``,
  and the output is ``mean + sqrt(variance) * z`` with ``z`` standard normal
  per example, position and feature.

  Args:
    key: PRNG key.
    contract: the layer's linear map.
    inputs: activations in the compute dtype.
    kernel: the kernel's posterior.
    bias: a Bayesian bias's posterior, or None.
    constrain_kernel: unused (no kernel-shaped noise is drawn); accepted so
      all estimators share one signature.
    noise_dtype: dtype of the variance path (the variance matmul's output, its
      square root, the noise and the sum with the mean): None is float32; the
      compute dtype (bfloat16) halves that activation-sized work's bytes. ``z`` is
      drawn in float32 either way, so only rounding differs.

  Returns:
    The sampled outputs, in ``inputs.dtype``.
  """
  del constrain_kernel
  dtype, noise_dtype = inputs.dtype, noise_dtype or jnp.float32
  mean = posterior_mean(contract, inputs, kernel, bias)
  variance = contract(jnp.square(inputs), jnp.square(kernel.stddev).astype(dtype),
                      preferred_element_type=noise_dtype)
  if bias is not None:
    variance = variance + jnp.square(bias.stddev).astype(noise_dtype)
  variance = checkpoint_name(variance, VARIANCE_NAME)
  noise = _safe_sqrt(variance) * standard_normal(key, variance.shape,
                                                 jnp.float32).astype(noise_dtype)
  return (mean.astype(noise_dtype) + noise).astype(dtype)



def lookup_posterior_mean(ids: Array, table: Normal) -> Array:
  """Rows ``ids`` of the posterior mean table."""
  return jnp.take(table.loc, ids, axis=0)


def lookup_reparameterization(key: Array, ids: Array, table: Normal,
                              constrain_table: Constrain = _identity) -> Array:
  """Rows of one table sample for the whole call (a repeated id gets the same row)."""
  return jnp.take(table.sample(key, constrain_table), ids, axis=0)


def lookup_flipout(key: Array, ids: Array, table: Normal,
                   constrain_table: Constrain = _identity) -> Array:
  """Flipout for a lookup (a one-hot input): ``loc[id] + (stddev * eps)[id] * r``.

  With a one-hot input the input sign only flips the one selected row, so the
  two signs of Flipout combine into one output sign ``r`` per token and feature.
  """
  key_eps, key_sign = _split(key, 2)
  eps = constrain_table(standard_normal(key_eps, table.loc.shape, table.loc.dtype))
  perturbation = jnp.take(table.stddev * eps, ids, axis=0)
  sign = rademacher(key_sign, perturbation.shape, perturbation.dtype)
  return lookup_posterior_mean(ids, table) + perturbation * sign


def lookup_local_reparameterization(key: Array, ids: Array, table: Normal,
                                    constrain_table: Constrain = _identity) -> Array:
  """Each looked-up vector drawn from its Gaussian, independently per token."""
  del constrain_table
  mean = lookup_posterior_mean(ids, table)
  stddev = jnp.take(table.stddev, ids, axis=0)
  return mean + stddev * standard_normal(key, mean.shape, mean.dtype)


def _kept_for_backward(posterior: Normal | None) -> Normal | None:
  # With a scale, the stddev is recomputed from it: the parameter is kept, not its softplus.
  if posterior is None or posterior.scale is None:
    return posterior
  return Normal(posterior.loc, None, posterior.scale)


def _recomputed(posterior: Normal | None) -> Normal | None:
  if posterior is None or posterior.stddev is not None:
    return posterior
  return Normal(posterior.loc, jax.nn.softplus(posterior.scale), posterior.scale)


def regenerating(estimator: Estimator,
                 policy: Callable[..., bool] = jax.checkpoint_policies.save_only_these_names(
                     KEYS_NAME)) -> Estimator:
  """``estimator`` with its noise drawn again in the backward pass instead of kept.

  The backward pass recomputes the noise, and all computed from it, from the
  key; it keeps only the estimator's arguments (inputs, ``loc``, ``scale``, key),
  which the deterministic layer keeps too, and the keys split from the key
  (``KEYS_NAME``). Outputs and gradients equal the estimator's to float rounding;
  the cost is that forward work done again. Works for the linear-map estimators
  and the lookups alike. ``policy`` is ``jax.checkpoint``'s
  (``save_only_these_names(KEYS_NAME, VARIANCE_NAME)`` keeps the variance too).
  """

  @functools.wraps(estimator)
  def regenerated(key: Array, *args, **options) -> Array:
    # The static arguments (contract, constrain, options) are closed over; the arrays
    # and posteriors go through the checkpoint, posteriors with their stddev dropped.
    arrays = [i for i, a in enumerate(args) if not callable(a)]
    given = [_kept_for_backward(args[i]) if isinstance(args[i], Normal) else args[i]
             for i in arrays]

    def sample(key: Array, *values: Any) -> Array:
      full = list(args)
      for i, value in zip(arrays, values):
        full[i] = _recomputed(value) if isinstance(value, Normal) else value
      return estimator(key, *full, **options)

    return jax.checkpoint(sample, policy=policy)(key, *given)

  return regenerated


# The estimators as written, keeping what autodiff keeps: what the layers' regenerating
# ones are checked and measured against.
STORED = {
    "DENSE": {"reparameterization": reparameterization, "flipout": flipout,
              "local_reparameterization": local_reparameterization,
              "grouped_reparameterization": grouped_reparameterization},
    "CONV": {"reparameterization": reparameterization, "flipout": conv_flipout,
             "local_reparameterization": local_reparameterization},
    "LOOKUP": {"reparameterization": lookup_reparameterization, "flipout": lookup_flipout,
               "local_reparameterization": lookup_local_reparameterization},
}
# Estimators by name: for linear maps, convolutions, and embedding lookups. The layers
# use these, which regenerate their noise in the backward pass.
DENSE, CONV, LOOKUP = ({name: regenerating(estimator) for name, estimator in STORED[table].items()}
                       for table in ("DENSE", "CONV", "LOOKUP"))


@contextlib.contextmanager
def swapped(tables: Mapping[str, Mapping[str, Estimator]]) -> Iterator[None]:
  """Within the block, layers traced use ``tables``' estimators in place of these ones.

  ``tables`` maps ``"DENSE"``, ``"CONV"`` or ``"LOOKUP"`` to ``{name: estimator}``
  (e.g. ``swapped(STORED)``: the noise kept, what the tests and ``tools/bench.py``
  compare the layers' estimators with). Restored on leaving; for measurement and tests.
  """
  layers_tables = {"DENSE": DENSE, "CONV": CONV, "LOOKUP": LOOKUP}
  unknown = set(tables) - set(layers_tables)
  if unknown:
    raise ValueError(f"swapped: tables {sorted(unknown)} are not among {list(layers_tables)}")
  saved = {table: dict(layers_tables[table]) for table in tables}
  try:
    for table, entries in tables.items():
      layers_tables[table].update(entries)
    yield
  finally:
    for table, entries in saved.items():
      layers_tables[table].clear()
      layers_tables[table].update(entries)
