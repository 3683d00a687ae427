"""Initializers of a weight posterior's standard deviation (the layer stores ``softplus_inverse``).

The default, ``fan_in_stddev(0.1)``, is ``0.1 / sqrt(fan_in)``: weight noise a
tenth of a LeCun-normal mean's scale at every width (docs/layers.md says why).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array
Initializer = Callable[..., Any]


def softplus_inverse(stddev: Array) -> Array:
  """Inverse of ``jax.nn.softplus``: the unconstrained value of a positive stddev.

  Computed as ``x + log(-expm1(-x))``, stable for small and large ``x``.

  Args:
    stddev: positive values.

  Returns:
    ``log(exp(stddev) - 1)``, elementwise.
  """
  stddev = jnp.asarray(stddev)
  return stddev + jnp.log(-jnp.expm1(-stddev))


def fan_in_stddev(ratio: float = 0.1, in_axis: int | Sequence[int] = -2) -> Initializer:
  """Standard deviation ``ratio / sqrt(fan_in)``, a fraction of a LeCun-normal scale.

  Args:
    ratio: posterior stddev as a fraction of ``1 / sqrt(fan_in)``; must be > 0.
    in_axis: the axes of the (flattened, as flax's ``DenseGeneral`` passes it)
      shape that are summed over by the layer.

  Returns:
    An initializer ``(key, shape, dtype) -> Array`` of constant stddevs.

  >>> import jax
  >>> fan_in_stddev(0.1)(jax.random.key(0), (100, 3))[0, 0].item()
  0.0099999...
  """
  if not ratio > 0:
    raise ValueError(f"fan_in_stddev: ratio={ratio!r} must be a positive number")
  in_axes = (in_axis,) if isinstance(in_axis, int) else tuple(in_axis)

  def init(key: Array, shape: Sequence[int], dtype: Any = jnp.float32) -> Array:
    del key
    fan_in = math.prod(shape[a] for a in in_axes)
    return jnp.full(shape, ratio / math.sqrt(fan_in), dtype)

  return init


def constant_stddev(value: float) -> Initializer:
  """A constant posterior standard deviation (edward2's default is ``0.049``).

  Args:
    value: the stddev; must be > 0.

  Returns:
    An initializer ``(key, shape, dtype) -> Array``.
  """
  if not value > 0:
    raise ValueError(f"constant_stddev: value={value!r} must be a positive number")

  def init(key: Array, shape: Sequence[int], dtype: Any = jnp.float32) -> Array:
    del key
    return jnp.full(shape, value, dtype)

  return init
