"""Sums over every array of a parameter tree in few kernels: the gradient norm, its clipping,
the posterior stddev metrics.

Written leaf by leaf (``optax.tree.norm``), a sum over a tree compiles on a GPU to one
reduction kernel per array and a scalar addition per array: about two kernels per
parameter array, and a Bayesian model has twice the arrays. ``layer_groups`` stacks the
arrays that are one parameter of different layers (the same ``/``-joined path but for the
layer index, the same shape and dtype): the same module made them, so they carry the same
logical axes and the stack is sharded as each of them (nothing moves between devices), and
XLA fuses the stack into the reduction that reads it: one kernel per group. Sums are in
float32; they differ from the leaf-by-leaf ones by float rounding (the order of addition).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

Array = jax.Array

# A layer index in a path part (``layers_3``): the same parameter of another layer.
_LAYER_INDEX = re.compile(r"^(layers)_\d+$")


def group_key(path: str, value: Array) -> tuple[str, tuple[int, ...], str]:
  """The group of an array: its path without layer indices, its shape and dtype.

  >>> group_key('decoder/layers_3/mlp/wo/kernel_loc', jnp.zeros((4, 2)))
  ('decoder/layers/mlp/wo/kernel_loc', (4, 2), 'float32')
  """
  parts = [_LAYER_INDEX.sub(r"\1", part) for part in path.split("/")]
  return "/".join(parts), tuple(value.shape), str(value.dtype)


def layer_groups(flat: Mapping[str, Array]) -> list[list[Array]]:
  """The arrays of ``flat`` (``/``-joined path -> array) grouped by ``group_key``, in a fixed
  order (sorted keys, and paths within a group)."""
  groups: dict[tuple, list[Array]] = {}
  for path in sorted(flat):
    groups.setdefault(group_key(path, flat[path]), []).append(flat[path])
  return [groups[key] for key in sorted(groups)]


def grouped_sum(fn: Callable[[Array], Array], flat: Mapping[str, Array]) -> Array:
  """``sum(fn(x))`` over every array ``x`` of ``flat``, in float32: one stacked reduction per
  ``layer_groups`` group. ``fn`` must be elementwise (it sees a stack of a group's arrays)."""
  total = jnp.zeros((), jnp.float32)
  for group in layer_groups(flat):
    stacked = group[0][None] if len(group) == 1 else jnp.stack(group)
    total = total + jnp.sum(fn(stacked.astype(jnp.float32)))
  return total


def _flat(tree: Any) -> dict[str, Array]:
  return {"/".join(map(str, path)): value for path, value in
          traverse_util.flatten_dict(tree).items()} if isinstance(tree, Mapping) else \
      {str(index): value for index, value in enumerate(jax.tree.leaves(tree))}


def global_norm(tree: Any) -> Array:
  """The L2 norm of every array of ``tree`` together, float32 (``optax.tree.norm``'s value
  to float rounding), in one reduction kernel per ``layer_groups`` group."""
  return jnp.sqrt(grouped_sum(jnp.square, _flat(tree)))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """``optax.clip_by_global_norm`` with the norm of ``global_norm``: updates whose global
  norm exceeds ``max_norm`` are scaled to it, the others kept (the same arithmetic)."""
  if not max_norm > 0:
    raise ValueError(f"clip_by_global_norm: max_norm={max_norm!r} must be > 0")

  def update_fn(updates, state, params=None):
    del params
    norm = global_norm(updates)
    trigger = norm < max_norm
    clip = lambda t: jax.lax.select(trigger, t, (t / norm.astype(t.dtype)) * max_norm)
    return jax.tree.map(clip, updates), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)
