"""Checksums of a checkpoint's arrays, so that corrupt array data is never restored.

One 32-bit checksum per array, computed by ``jit`` where the array lies (any
mesh, any number of hosts) and the same whatever mesh saved or restores it; the
checksums travel in the checkpoint's ``meta`` item (``CHECKSUMS_KEY``). Why
orbax's own checks miss corrupt chunk data, and the detection odds:
docs/training.md.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from meshbayes.partitioning.specs import path_names

CHECKSUMS_KEY = "state_checksums"


def _mix(h: jax.Array) -> jax.Array:
  """murmur3's 32-bit finalizer: a bijection that spreads every input bit."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _as_uint32(x: jax.Array) -> jax.Array:
  """The element bits as uint32; an 8-byte element becomes a trailing pair."""
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  size = np.dtype(x.dtype).itemsize
  if size in (4, 8):
    return jax.lax.bitcast_convert_type(x, jnp.uint32)
  unsigned = {1: jnp.uint8, 2: jnp.uint16}[size]
  return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _array_checksum(x: jax.Array) -> jax.Array:
  bits = _as_uint32(x)
  # The flat index from per-axis iotas (elementwise, so it stays sharded like x; a
  # reshape to one axis would move data between devices). It wraps above 2^32 elements.
  index = jnp.zeros(bits.shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(bits.ndim)):
    index = index + jax.lax.broadcasted_iota(jnp.uint32, bits.shape, axis) * jnp.uint32(
        stride % 2**32)
    stride *= bits.shape[axis]
  return jnp.sum(_mix(bits ^ (index * jnp.uint32(0x9E3779B9))), dtype=jnp.uint32)


_tree_checksums = jax.jit(lambda tree: jax.tree.map(_array_checksum, tree))


def checksums(tree: Any) -> dict[str, str]:
  """Every array's checksum (8 hex digits), by its path as ``checkpoints`` names it.

  ``tree`` holds global ``jax.Array``s (on any mesh and hosts) or host arrays;
  every process gets the same answer.
  """
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  # One program per set of devices (arrays on different ones cannot meet in one program).
  groups: dict[Any, list[int]] = {}
  for i, (_, x) in enumerate(leaves):
    devices = x.sharding.device_set if isinstance(x, jax.Array) else None
    groups.setdefault(frozenset(d.id for d in devices) if devices else None, []).append(i)
  sums = {}
  for members in groups.values():
    sums.update(zip(members, jax.device_get(_tree_checksums([leaves[i][1] for i in members]))))
  return {"/".join(path_names(p)): f"{int(sums[i]):08x}" for i, (p, _) in enumerate(leaves)}


def mismatches(expected: dict[str, str], tree: Any) -> list[str]:
  """The paths of ``tree``'s arrays whose checksum differs from ``expected``'s (arrays
  ``expected`` has no checksum for are not checked)."""
  actual = checksums(tree)
  return sorted(path for path, value in actual.items()
                if path in expected and expected[path] != value)
