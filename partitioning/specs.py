"""Logical axes for a whole train state, derived from its parameters' annotations.

Parameters carry theirs in ``nn.LogicallyPartitioned`` boxes (a Bayesian layer's
``kernel_loc`` and ``kernel_scale`` the deterministic kernel's). Any other leaf follows the
parameter at the longest common path suffix: same shape (Adam's ``mu``), its axes; one
dimension less (Adafactor's ``v_row``), those less that one; scalars, replicated; else an error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import PartitionSpec

Path = tuple[str, ...]


def _key_name(key: Any) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def path_names(path: tuple[Any, ...]) -> Path:
  """A pytree key path as a tuple of strings (dict keys, attribute names, indices)."""
  return tuple(_key_name(k) for k in path)


def _is_box(x: Any) -> bool:
  return isinstance(x, nn.LogicallyPartitioned)


class _ParamIndex:
  """Finds the parameter a state leaf stands for by the longest common path suffix."""

  def __init__(self, params: Mapping[Path, tuple[PartitionSpec, tuple[int, ...]]]):
    self.params = params
    self.by_suffix: dict[Path, list[Path]] = {}
    for path in params:
      for start in range(len(path)):
        self.by_suffix.setdefault(path[start:], []).append(path)

  def find(self, path: Path) -> Path | None:
    for start in range(len(path)):
      matches = self.by_suffix.get(path[start:])
      if matches:
        return matches[0] if len(matches) == 1 else None
    return None


def _factored_axis(leaf_path: Path, leaf_shape: tuple[int, ...],
                   param_shape: tuple[int, ...]) -> int | None:
  """The dimension of ``param_shape`` a factored statistic of ``leaf_shape`` dropped."""
  candidates = [i for i in range(len(param_shape))
                if param_shape[:i] + param_shape[i + 1:] == leaf_shape]
  if len(candidates) > 1:
    # Equal sizes: follow optax's factorization, where v_row drops the largest
    # dimension and v_col the second largest, in np.argsort order.
    order = np.argsort(param_shape)
    preferred = {"v_row": int(order[-1]), "v_col": int(order[-2])}
    for name, axis in preferred.items():
      if name in leaf_path and axis in candidates:
        return axis
  return candidates[0] if candidates else None


def logical_specs(abstract_state: Any) -> Any:
  """Logical ``PartitionSpec`` of every leaf of a state whose parameters are boxed.

  Args:
    abstract_state: a pytree (e.g. from ``jax.eval_shape``) whose parameter
      leaves are ``nn.LogicallyPartitioned`` boxes and whose other leaves
      (optimizer state, counters) are arrays or ``ShapeDtypeStruct``s.

  Returns:
    A pytree shaped like ``nn.unbox(abstract_state)`` of ``PartitionSpec``s of
    logical names (None for a replicated dimension).

  Raises:
    ValueError: a leaf is neither boxed, nor derivable from a parameter, nor
      a scalar; the message names it.
  """
  flat, treedef = jax.tree_util.tree_flatten_with_path(abstract_state, is_leaf=_is_box)
  params = {path_names(p): (PartitionSpec(*leaf.names), tuple(leaf.value.shape))
            for p, leaf in flat if _is_box(leaf)}
  index = _ParamIndex(params)
  specs = []
  for key_path, leaf in flat:
    if _is_box(leaf):
      specs.append(PartitionSpec(*leaf.names))
      continue
    path, shape = path_names(key_path), tuple(np.shape(leaf))
    param = index.find(path)
    if param is not None:
      names, param_shape = params[param]
      if shape == param_shape:
        specs.append(names)
        continue
      dropped = _factored_axis(path, shape, param_shape)
      if dropped is not None and len(shape) == len(param_shape) - 1:
        specs.append(PartitionSpec(*(n for i, n in enumerate(names) if i != dropped)))
        continue
    if math.prod(shape) == 1:
      specs.append(PartitionSpec(*([None] * len(shape))))
      continue
    what = (f"it matches parameter {'/'.join(param)} of shape {params[param][1]} by path but "
            "not by shape" if param else "it has no logical axes and matches no annotated "
            "parameter by path")
    raise ValueError(f"cannot place state leaf {'/'.join(path)} of shape {shape}: {what}; "
                     "annotate parameters with nn.with_logical_partitioning (or a meshbayes "
                     "layer's kernel_axes=...) and keep optimizer state shaped like them")
  return jax.tree_util.tree_unflatten(treedef, specs)


def param_logical_specs(abstract_params: Any) -> Any:
  """Logical specs of a parameter tree, requiring every parameter to be annotated.

  Raises:
    ValueError: naming the first parameter without logical axes.
  """
  flat, _ = jax.tree_util.tree_flatten_with_path(abstract_params, is_leaf=_is_box)
  for key_path, leaf in flat:
    if not _is_box(leaf):
      raise ValueError(f"parameter {'/'.join(path_names(key_path))} of shape {np.shape(leaf)} "
                       "has no logical axes; create it with nn.with_logical_partitioning (or a "
                       "meshbayes layer's kernel_axes=...)")
  return logical_specs(abstract_params)
