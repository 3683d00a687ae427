"""Reversible layers over the last axis: MADE, affine coupling (RealNVP), Reverse and Flow.

Each layer is a bijection with ``__call__`` (forward), ``reverse`` and
``log_det_jacobian`` (one number per batch index). Given a TFP distribution
instead of an array, ``__call__`` returns the transformed distribution, a pure
function of the parameters (its ``log_prob`` and ``sample`` differentiate).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from tensorflow_probability.substrates import jax as tfp

from meshbayes.layers.variational import Axes, Initializer

tfd, tfb = tfp.distributions, tfp.bijectors
Array = jax.Array
Order = str | Sequence[int]


def made_degrees(order: Order, event_size: int) -> np.ndarray:
  """The degree of each input dimension: an output depends on inputs of smaller degree.

  Args:
    order: ``'left-to-right'`` (degrees ``1..D``), ``'right-to-left'``
      (``D..1``), or one positive integer per dimension (equal degrees do not
      see each other: ``[1, 1, 2, 2]`` is an affine coupling's bipartition).
    event_size: ``D``, the size of the last axis.

  >>> made_degrees('right-to-left', 3), made_degrees((1, 1, 2), 3)
  (array([3, 2, 1]), array([1, 1, 2]))
  """
  if order == "left-to-right":
    return np.arange(1, event_size + 1)
  if order == "right-to-left":
    return np.arange(event_size, 0, -1)
  if isinstance(order, str):
    raise ValueError(f"order={order!r}: use 'left-to-right', 'right-to-left' or a degree per "
                     "dimension")
  degrees = np.asarray(order, np.int64)
  if degrees.shape != (event_size,) or degrees.min(initial=1) < 1:
    raise ValueError(f"order={tuple(order)} must give a positive degree to each of the "
                     f"{event_size} dimensions")
  return degrees


def made_masks(degrees: np.ndarray, hidden_dims: Sequence[int]) -> list[np.ndarray]:
  """The 0/1 masks of MADE's kernels, input to output, given the inputs' degrees.

  Hidden units take degrees cyclically in ``1..max_degree - 1`` (the
  deterministic assignment of Germain et al.); a hidden unit sees inputs of
  degree at most its own, an output sees hidden units of strictly smaller
  degree than its dimension, so output ``d`` depends only on inputs of smaller
  degree than ``d``'s.

  >>> [m.astype(int).tolist() for m in made_masks(np.array([1, 2]), [2])]
  [[[1, 1], [0, 0]], [[0, 1], [0, 1]]]
  """
  max_degree = int(degrees.max())
  masks, previous = [], degrees
  for width in hidden_dims:
    hidden = 1 + np.arange(width) % max(max_degree - 1, 1)
    masks.append(hidden[None, :] >= previous[:, None])
    previous = hidden
  masks.append(degrees[None, :] > previous[:, None])
  return [m.astype(np.float32) for m in masks]


def _logical(init: Initializer, axes: Axes) -> Initializer:
  return init if axes is None else nn.with_logical_partitioning(init, tuple(axes))


class MaskedDense(nn.Module):
  """A dense layer whose kernel is multiplied by a constant 0/1 mask.

  Attributes:
    features: output features; a tuple gives a multi-axis output, the mask
      covering its first axis and broadcast over the rest.
    mask: ``(in_features, features[0])`` of zeros and ones.
    use_bias: whether to add a bias.
    dtype: computation dtype (default: inferred from inputs and parameters).
    param_dtype: parameter dtype.
    precision: numerical precision of the matmul.
    kernel_init: initializer of the kernel (of its unmasked shape).
    bias_init: initializer of the bias.
    kernel_axes: logical axis names of the kernel, one per dimension.
    bias_axes: logical axis names of the bias.
  """

  features: int | Sequence[int]
  mask: np.ndarray
  use_bias: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32
  precision: Any = None
  kernel_init: Initializer = nn.initializers.lecun_normal()
  bias_init: Initializer = nn.initializers.zeros_init()
  kernel_axes: Axes = None
  bias_axes: Axes = None

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    """Returns ``inputs @ (kernel * mask) + bias`` over the last axis of ``inputs``."""
    features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
    shape = (inputs.shape[-1],) + features
    kernel = self.param("kernel", _logical(self.kernel_init, self.kernel_axes), shape,
                        self.param_dtype)
    mask = jnp.asarray(self.mask).reshape(self.mask.shape + (1,) * (len(features) - 1))
    dtype = self.dtype or jnp.result_type(inputs, self.param_dtype)
    outputs = jnp.tensordot(inputs.astype(dtype), (kernel * mask).astype(dtype), axes=1,
                            precision=self.precision)
    if self.use_bias:
      bias = self.param("bias", _logical(self.bias_init, self.bias_axes), features,
                        self.param_dtype)
      outputs = outputs + bias.astype(dtype)
    return outputs


class MADE(nn.Module):
  """Masked autoencoder for distribution estimation (Germain et al., 2015).

  Maps ``(..., D)`` to ``(..., D, num_params)``: for each input dimension
  ``num_params`` numbers (a flow's shift and log scale) that depend only on
  the dimensions before it in ``order``, so the Jacobian of each output
  slice is strictly triangular in that order.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> made = MADE(num_params=2, hidden_dims=(8,))
    >>> x = jnp.ones((4, 3))
    >>> variables = made.init(jax.random.key(0), x)
    >>> made.apply(variables, x).shape
    (4, 3, 2)
    >>> jac = jax.jacfwd(lambda v: made.apply(variables, v)[:, 0])(x[0])   # shift vs inputs
    >>> (jac != 0).astype(int).tolist()      # row d sees only the dimensions before d
    [[0, 0, 0], [1, 0, 0], [1, 1, 0]]

  Attributes:
    num_params: outputs per input dimension.
    hidden_dims: widths of the masked hidden layers.
    order: ``'left-to-right'``, ``'right-to-left'`` or a degree per input
      dimension (see ``made_degrees``).
    activation: nonlinearity after each hidden layer.
    use_bias: whether the layers add biases.
    dtype: computation dtype.
    param_dtype: parameter dtype.
    precision: numerical precision of the matmuls.
    kernel_init: initializer of the hidden kernels.
    output_kernel_init: initializer of the output kernel (None: ``kernel_init``;
      zeros make a flow start at the identity).
    bias_init: initializer of the biases.
    kernel_axes: logical axes of each hidden kernel ``(in, out)``.
    bias_axes: logical axes of each hidden bias.
    output_kernel_axes: logical axes of the output kernel
      ``(hidden, D, num_params)``.
    output_bias_axes: logical axes of the output bias ``(D, num_params)``.
  """

  num_params: int = 2
  hidden_dims: Sequence[int] = (64, 64)
  order: Order = "left-to-right"
  activation: Callable[[Array], Array] = nn.relu
  use_bias: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32
  precision: Any = None
  kernel_init: Initializer = nn.initializers.lecun_normal()
  output_kernel_init: Initializer | None = None
  bias_init: Initializer = nn.initializers.zeros_init()
  kernel_axes: Axes = ("embed", "mlp")
  bias_axes: Axes = ("mlp",)
  output_kernel_axes: Axes = ("mlp", "embed", None)
  output_bias_axes: Axes = ("embed", None)

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    """Returns ``(..., D, num_params)``, output ``d`` a function of the inputs before ``d``."""
    degrees = made_degrees(self.order, inputs.shape[-1])
    masks = made_masks(degrees, self.hidden_dims)
    common = dict(use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
                  precision=self.precision, bias_init=self.bias_init)
    x = inputs
    for i, (width, mask) in enumerate(zip(self.hidden_dims, masks)):
      x = MaskedDense(width, mask, kernel_init=self.kernel_init, kernel_axes=self.kernel_axes,
                      bias_axes=self.bias_axes, name=f"hidden_{i}", **common)(x)
      x = self.activation(x)
    return MaskedDense((inputs.shape[-1], self.num_params), masks[-1],
                       kernel_init=self.output_kernel_init or self.kernel_init,
                       kernel_axes=self.output_kernel_axes, bias_axes=self.output_bias_axes,
                       name="output", **common)(x)


class LayerBijector(tfb.Bijector):
  """A TFP bijector of the event axis from a layer's three pure functions."""

  def __init__(self, forward_fn: Callable[[Array], Array], inverse_fn: Callable[[Array], Array],
               forward_log_det_jacobian_fn: Callable[[Array], Array], name: str = "layer"):
    parameters = dict(locals())
    self._forward_fn = forward_fn
    self._inverse_fn = inverse_fn
    self._fldj_fn = forward_log_det_jacobian_fn
    super().__init__(forward_min_event_ndims=1, validate_args=False, parameters=parameters,
                     name=name)

  def _forward(self, x: Array) -> Array:
    return self._forward_fn(x)

  def _inverse(self, y: Array) -> Array:
    return self._inverse_fn(y)

  def _forward_log_det_jacobian(self, x: Array) -> Array:
    return self._fldj_fn(x)


def _check_owns_submodules(layer: nn.Module, module: nn.Module) -> None:
  """Raises unless every submodule given as an attribute is a child (so its variables are ours)."""
  for field in dataclasses.fields(module):
    if field.name == "parent":
      continue
    value = getattr(module, field.name, None)
    for sub in value if isinstance(value, (list, tuple)) else (value,):
      if isinstance(sub, nn.Module):
        if sub.parent is not module:
          raise ValueError(
              f"{type(layer).__name__} {layer.name!r}: to transform a distribution, its "
              f"{type(sub).__name__} {sub.name!r} must be its own child, with its parameters "
              "inside the layer's; construct it outside any compact method (or with "
              "parent=None), not inside another module's")
        _check_owns_submodules(layer, sub)


def transform_distribution(layer: nn.Module, distribution: tfd.Distribution
                           ) -> tfd.TransformedDistribution:
  """The distribution of ``layer(x)`` for ``x ~ distribution``, for a bound reversible layer.

  The layer's parameters are created first (at ``init``) by a forward pass on
  zeros of the event shape; the bijector then holds an unbound copy of the
  layer and its variables, so the distribution outlives the ``apply`` call.
  """
  if len(distribution.event_shape) != 1:
    raise ValueError(f"{type(layer).__name__} {layer.name!r}: reversible layers transform a "
                     f"vector event; got event shape {distribution.event_shape}")
  _check_owns_submodules(layer, layer)
  layer(jnp.zeros(distribution.event_shape, distribution.dtype))
  module, variables = layer.unbind()
  call = lambda method: lambda x: module.apply(variables, x, method=method)
  bijector = LayerBijector(call("__call__"), call("reverse"), call("log_det_jacobian"),
                           name=type(layer).__name__)
  return tfd.TransformedDistribution(distribution, bijector)


class RealNVP(nn.Module):
  """Affine coupling (Dinh et al., 2017), or a MADE autoregressive affine transform.

  The first ``num_masked`` dimensions pass unchanged; every other dimension
  ``d`` is scaled and shifted, ``y_d = x_d * exp(log_scale_d) + shift_d``,
  with ``shift`` and ``log_scale`` computed by the conditioner from
  dimensions that ``y`` keeps recoverable, so ``reverse`` exists and
  ``log_det_jacobian = sum_d log_scale_d``:

  - default (``conditioner=None``): a MADE whose degrees are 1 for the masked
    dimensions and 2 for the rest, i.e. an MLP of the masked half (a
    coupling layer; ``reverse`` is one pass);
  - a ``MADE`` conditioner sees all of ``x``: each transformed dimension is
    conditioned on those before it in the MADE's order (the autoregressive
    flow of the paper's Figure 7; ``num_masked=0`` transforms every
    dimension). ``reverse`` takes one pass per distinct degree among the
    transformed dimensions (``D - num_masked`` for a left-to-right MADE);
  - any other module is called on ``x[..., :num_masked]`` and must return
    ``(..., D - num_masked, 2)``.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from tensorflow_probability.substrates import jax as tfp
    >>> flow = RealNVP(num_masked=1, hidden_dims=(8,))
    >>> x = jax.random.normal(jax.random.key(0), (5, 2))
    >>> variables = flow.init(jax.random.key(1), x)
    >>> y = flow.apply(variables, x)
    >>> bool(jnp.allclose(flow.apply(variables, y, method='reverse'), x, atol=1e-6))
    True
    >>> base = tfp.distributions.MultivariateNormalDiag(jnp.zeros(2))
    >>> flow.apply(variables, base).log_prob(y).shape
    (5,)

  Attributes:
    num_masked: dimensions passed through unchanged (the first ones).
    conditioner: the network giving ``(shift, log_scale)`` (see above); None
      builds a coupling MADE of ``hidden_dims``.
    hidden_dims: hidden widths of the default conditioner.
    activation: its nonlinearity.
    kernel_init: its hidden kernels' initializer.
    output_kernel_init: its output kernel's initializer (zeros by default:
      the layer starts as the identity).
    kernel_axes: logical axes of its hidden kernels.
    bias_axes: logical axes of its hidden biases.
    output_kernel_axes: logical axes of its output kernel.
    output_bias_axes: logical axes of its output bias.
    log_scale_bound: None (the default) uses the conditioner's log scale as
      is; a number ``b`` squashes it to ``b * tanh(log_scale / b)``, so one
      layer scales by at most ``exp(b)``: a deep flow evaluated far from its
      data (a density plot's corners) then cannot overflow.
  """

  num_masked: int
  conditioner: nn.Module | None = None
  hidden_dims: Sequence[int] = (64, 64)
  activation: Callable[[Array], Array] = nn.relu
  kernel_init: Initializer = nn.initializers.lecun_normal()
  output_kernel_init: Initializer = nn.initializers.zeros_init()
  kernel_axes: Axes = ("embed", "mlp")
  bias_axes: Axes = ("mlp",)
  output_kernel_axes: Axes = ("mlp", "embed", None)
  output_bias_axes: Axes = ("embed", None)
  log_scale_bound: float | None = None

  def _check(self, event_size: int) -> None:
    if not 0 <= self.num_masked < event_size:
      raise ValueError(f"RealNVP {self.name!r}: num_masked={self.num_masked} must be in "
                       f"[0, {event_size}) for {event_size} dimensions")
    if self.conditioner is None and self.num_masked == 0:
      raise ValueError(f"RealNVP {self.name!r}: a coupling needs num_masked > 0 (or pass a MADE "
                       "conditioner for an autoregressive transform)")

  def _degrees(self, event_size: int) -> np.ndarray:
    """The conditioner's input degrees (a coupling's: masked 1, transformed 2)."""
    if isinstance(self.conditioner, MADE):
      return made_degrees(self.conditioner.order, event_size)
    return np.where(np.arange(event_size) < self.num_masked, 1, 2)

  @nn.compact
  def _shift_and_log_scale(self, x: Array) -> tuple[Array, Array]:
    """``(shift, log_scale)`` of ``x``'s shape, zero on the masked dimensions."""
    size = x.shape[-1]
    self._check(size)
    if self.conditioner is None:
      net = MADE(2, self.hidden_dims, tuple(self._degrees(size).tolist()), self.activation,
                 kernel_init=self.kernel_init, output_kernel_init=self.output_kernel_init,
                 kernel_axes=self.kernel_axes, bias_axes=self.bias_axes,
                 output_kernel_axes=self.output_kernel_axes,
                 output_bias_axes=self.output_bias_axes, name="made")
      params = net(x)
    elif isinstance(self.conditioner, MADE):
      params = self.conditioner(x)
    else:
      params = self.conditioner(x[..., :self.num_masked])
      expected = x.shape[:-1] + (size - self.num_masked, 2)
      if params.shape != expected:
        raise ValueError(f"RealNVP {self.name!r}: the conditioner returned {params.shape}, "
                         f"expected {expected}")
      params = jnp.concatenate([jnp.zeros(x.shape[:-1] + (self.num_masked, 2), params.dtype),
                                params], axis=-2)
    # The masked dimensions' outputs are discarded, not merely unused: y keeps x there.
    shift, log_scale = params[..., 0], params[..., 1]
    if self.log_scale_bound is not None:
      log_scale = self.log_scale_bound * jnp.tanh(log_scale / self.log_scale_bound)
    transformed = jnp.arange(size) >= self.num_masked
    return jnp.where(transformed, shift, 0.0), jnp.where(transformed, log_scale, 0.0)

  def __call__(self, inputs: Array | tfd.Distribution) -> Array | tfd.Distribution:
    """``y = x * exp(log_scale(x)) + shift(x)``, or the distribution of ``y``."""
    if isinstance(inputs, tfd.Distribution):
      return transform_distribution(self, inputs)
    shift, log_scale = self._shift_and_log_scale(inputs)
    return inputs * jnp.exp(log_scale) + shift

  def reverse(self, outputs: Array) -> Array:
    """``x`` with ``self(x) == outputs``: one conditioner pass per degree level.

    The shift and scale of a dimension depend only on dimensions of smaller
    degree, so pass ``t`` solves ``x = (y - shift(x)) * exp(-log_scale(x))``
    exactly for the ``t``-th smallest degree among the transformed dimensions
    (a coupling has one level: one pass). Unsolved dimensions are held at
    zero, not at a guess: a huge guess times a masked (zero) weight is NaN.
    """
    size = outputs.shape[-1]
    self._check(size)
    degrees = self._degrees(size)
    transformed = np.arange(size) >= self.num_masked
    x = jnp.where(transformed, 0.0, outputs)
    for level in np.unique(degrees[transformed]):  # unrolled: one conditioner pass each
      shift, log_scale = self._shift_and_log_scale(x)
      solved = jnp.asarray(transformed & (degrees == level))
      x = jnp.where(solved, (outputs - shift) * jnp.exp(-log_scale), x)
    return x

  def log_det_jacobian(self, inputs: Array) -> Array:
    """``log |det dy/dx|`` at ``inputs``: the sum of the log scales, shape ``inputs.shape[:-1]``."""
    return jnp.sum(self._shift_and_log_scale(inputs)[1], axis=-1)


class Reverse(nn.Module):
  """Reverses the event (last) axis: a volume-preserving permutation between flows.

  Example::

    >>> import jax.numpy as jnp
    >>> Reverse().apply({}, jnp.array([[1., 2., 3.]]))
    Array([[3., 2., 1.]], dtype=float32)
  """

  def __call__(self, inputs: Array | tfd.Distribution) -> Array | tfd.Distribution:
    """The inputs with the last axis reversed, or the distribution of that."""
    if isinstance(inputs, tfd.Distribution):
      return transform_distribution(self, inputs)
    return inputs[..., ::-1]

  def reverse(self, outputs: Array) -> Array:
    """The inverse: reversing again."""
    return outputs[..., ::-1]

  def log_det_jacobian(self, inputs: Array) -> Array:
    """Zero: a permutation preserves volume."""
    return jnp.zeros(inputs.shape[:-1], inputs.dtype)


class Flow(nn.Module):
  """Reversible layers applied in sequence (``nn.Sequential`` with ``reverse`` and the log det).

  Given a distribution, the flow transforms it once, by a single bijector of
  the whole stack (nested per-layer transforms, as ``nn.Sequential`` would
  give, trace very slowly: docs/layers.md).

  Example::

    >>> import jax, jax.numpy as jnp
    >>> flow = Flow([RealNVP(1, hidden_dims=(8,)), Reverse(), RealNVP(1, hidden_dims=(8,))])
    >>> x = jnp.ones((3, 2))
    >>> variables = flow.init(jax.random.key(0), x)
    >>> flow.apply(variables, x, method='log_det_jacobian').shape
    (3,)

  Attributes:
    layers: the reversible layers, input to output.
  """

  layers: Sequence[nn.Module]

  def __call__(self, inputs: Array | tfd.Distribution) -> Array | tfd.Distribution:
    """Applies the layers in order, or returns the distribution they map ``inputs`` to."""
    if isinstance(inputs, tfd.Distribution):
      return transform_distribution(self, inputs)
    for layer in self.layers:
      inputs = layer(inputs)
    return inputs

  def reverse(self, outputs: Array) -> Array:
    """Reverses the layers in the opposite order."""
    for layer in reversed(self.layers):
      outputs = layer.reverse(outputs)
    return outputs

  def log_det_jacobian(self, inputs: Array) -> Array:
    """The sum of the layers' log determinants along the forward pass from ``inputs``."""
    total = jnp.zeros(inputs.shape[:-1], inputs.dtype)
    for layer in self.layers:
      total = total + layer.log_det_jacobian(inputs)
      inputs = layer(inputs)
    return total
