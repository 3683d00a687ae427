"""Bayesian drop-ins for ``nn.Conv`` (1-D, 2-D and 3-D by kernel rank), one class per estimator.

Each takes ``nn.Conv``'s arguments and call (channels last, any leading batch
axes); the kernel becomes ``kernel_loc`` and ``kernel_scale`` with the twin's
shape and logical axes. ``ConvFlipout`` draws one kernel per example;
``ConvLocalReparameterization`` samples each output position independently, not
a per-example kernel. ``Conv`` is the deterministic twin; ``conv_class`` picks by name.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.linear import PaddingLike, canonicalize_padding
from jax import lax

from meshbayes.layers import estimators
from meshbayes.layers.dense import ESTIMATORS
from meshbayes.layers.initializers import constant_stddev, fan_in_stddev
from meshbayes.layers.priors import NormalPrior, Prior
from meshbayes.layers.variational import (
  Axes,
  Initializer,
  boxed_init,
  constrain_like,
  partitioning_box,
  record_kl,
  reshaped_init,
  use_posterior_mean,
  variational_param,
)

Array = jax.Array


def flat_kernel_shape(shape: Sequence[int]) -> tuple[int, int]:
  """A convolution kernel seen as a ``(fan_in, features)`` matrix, for stddev initializers."""
  return math.prod(shape[:-1]), shape[-1]


def _dimension_numbers(ndim: int) -> lax.ConvDimensionNumbers:
  """Channels last for inputs and outputs, ``spatial... x in x out`` for the kernel."""
  spatial = tuple(range(1, ndim - 1))
  return lax.ConvDimensionNumbers(lhs_spec=(0, ndim - 1) + spatial,
                                  rhs_spec=(ndim - 1, ndim - 2) + tuple(range(ndim - 2)),
                                  out_spec=(0, ndim - 1) + spatial)


def _convolve(inputs: Array, kernel: Array, *, strides: tuple[int, ...], padding: Any,
              input_dilation: tuple[int, ...], kernel_dilation: tuple[int, ...],
              feature_group_count: int, precision: Any,
              preferred_element_type: Any = None) -> Array:
  """``lax.conv_general_dilated`` channels last: the layer's linear map."""
  return lax.conv_general_dilated(inputs, kernel, strides, padding, lhs_dilation=input_dilation,
                                  rhs_dilation=kernel_dilation,
                                  dimension_numbers=_dimension_numbers(inputs.ndim),
                                  feature_group_count=feature_group_count, precision=precision,
                                  preferred_element_type=preferred_element_type)


class ConvBase(nn.Module):
  """``nn.Conv``'s geometry, shared by the Bayesian and variational dropout convolutions.

  Attributes:
    features: number of convolution filters.
    kernel_size: spatial shape of the kernel (an int is one spatial axis).
    strides: an int or one per spatial axis.
    padding: ``'SAME'``, ``'VALID'``, ``'CIRCULAR'``, ``'REFLECT'``, ``'CAUSAL'``
      (1-D only), an int, or ``(low, high)`` pairs per spatial axis, as ``nn.Conv``.
    input_dilation: an int or one per spatial axis (transposed convolution).
    kernel_dilation: an int or one per spatial axis (atrous convolution).
    feature_group_count: input and output features are split into this
      many groups, each convolved separately.
    use_bias: whether to add a bias.
    dtype: computation dtype (default: inferred from inputs and parameters).
    param_dtype: parameter dtype (float32 by default).
    precision: numerical precision of the convolutions.
    kernel_init: initializer of the kernel (its posterior mean); may be boxed
      with ``nn.with_logical_partitioning``.
    bias_init: initializer of the bias (or its posterior mean).
    kernel_axes: logical axis names of the kernel, T5X style, one per kernel
      dimension, e.g. ``(None, None, 'embed', 'mlp')`` for a 2-D kernel.
    bias_axes: logical axis names of the bias.
    deterministic: use the posterior mean; the call argument overrides it.
  """

  features: int
  kernel_size: int | Sequence[int]
  strides: int | Sequence[int] | None = 1
  padding: PaddingLike = "SAME"
  input_dilation: int | Sequence[int] | None = 1
  kernel_dilation: int | Sequence[int] | None = 1
  feature_group_count: int = 1
  use_bias: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32
  precision: Any = None
  kernel_init: Initializer = nn.initializers.lecun_normal()
  bias_init: Initializer = nn.initializers.zeros_init()
  kernel_axes: Axes = None
  bias_axes: Axes = None
  deterministic: bool | None = None

  def _error(self, message: str) -> ValueError:
    return ValueError(f"{type(self).__name__} {self.name!r}: {message}")

  def _geometry(self, inputs: Array
                ) -> tuple[Array, tuple[int, ...], Callable[..., Array], Callable[[Array], Array]]:
    """Validates the attributes and prepares the convolution, as ``nn.Conv`` does.

    Returns:
      The inputs with one batch axis (leading batch axes flattened, or one
      added) and string paddings other than ``SAME``/``VALID`` applied; the
      kernel shape; the linear map ``contract(inputs, kernel,
      preferred_element_type=None)``; and the function that restores the
      caller's batch axes on the outputs.
    """
    kernel_size = (self.kernel_size,) if isinstance(self.kernel_size, int) else tuple(
        self.kernel_size)
    if self.features < 1 or not kernel_size or min(kernel_size) < 1:
      raise self._error(f"features={self.features!r} and kernel_size={self.kernel_size!r} must "
                        "be a positive int and a non-empty tuple of positive ints")
    rank = len(kernel_size)
    if inputs.ndim < rank + 1:
      raise self._error(f"inputs of shape {inputs.shape} have fewer than the {rank + 1} "
                        f"dimensions (spatial..., features) a {rank}-D kernel needs")

    def per_axis(name: str) -> tuple[int, ...]:
      given = getattr(self, name)
      value = tuple(given) if isinstance(given, Sequence) else (
          1 if given is None else given,) * rank
      if len(value) != rank or min(value) < 1:
        raise self._error(f"{name}={given!r} must be a positive int or {rank} positive ints "
                          f"(one per spatial axis of kernel_size={kernel_size})")
      return value

    strides, input_dilation, kernel_dilation = map(
        per_axis, ("strides", "input_dilation", "kernel_dilation"))

    batch_shape = inputs.shape[:inputs.ndim - rank - 1]
    inputs = jnp.reshape(inputs, (-1,) + inputs.shape[len(batch_shape):])
    in_features, groups = inputs.shape[-1], self.feature_group_count
    if groups < 1 or in_features % groups or self.features % groups:
      raise self._error(f"feature_group_count={groups!r} must be a positive int dividing both "
                        f"the {in_features} input features and features={self.features}")

    padding = canonicalize_padding(self.padding, rank)
    if padding in ("CIRCULAR", "REFLECT"):
      dilated = [(k - 1) * d + 1 for k, d in zip(kernel_size, kernel_dilation)]
      pads = [(0, 0)] + [((k - 1) // 2, k // 2) for k in dilated] + [(0, 0)]
      inputs = jnp.pad(inputs, pads, mode={"CIRCULAR": "wrap", "REFLECT": "reflect"}[padding])
      padding = "VALID"
    elif padding == "CAUSAL":
      if rank != 1:
        raise self._error(f"padding='CAUSAL' is only defined for 1-D kernels, not "
                          f"kernel_size={kernel_size}")
      inputs = jnp.pad(inputs, [(0, 0), (kernel_dilation[0] * (kernel_size[0] - 1), 0), (0, 0)])
      padding = "VALID"

    contract = functools.partial(_convolve, strides=strides, padding=padding,
                                 input_dilation=input_dilation, kernel_dilation=kernel_dilation,
                                 feature_group_count=groups, precision=self.precision)
    kernel_shape = kernel_size + (in_features // groups, self.features)
    restore = lambda outputs: jnp.reshape(outputs, batch_shape + outputs.shape[1:])
    return inputs, kernel_shape, contract, restore


class _Conv(ConvBase):
  """The shared body of the Conv layers; subclasses pick the estimator.

  ``estimator`` names the estimator (a key of ``estimators.CONV``); ``None``
  (the deterministic twin) keeps point weights, a ``kernel`` and a ``bias`` as
  flax's, and the posterior attributes unused.

  Attributes (beyond ``ConvBase``'s):
    kernel_stddev_init: initializer of the kernel's posterior standard
      deviation, called on the kernel flattened to ``(fan_in, features)``
      (default ``0.1 / sqrt(fan_in)``, ``fan_in = prod(kernel_size) *
      in_features / feature_group_count``).
    bias_stddev_init: initializer of a Bayesian bias's standard deviation.
    bayesian_bias: give the bias a normal posterior too.
    prior: prior of every Bayesian weight of the layer (default N(0, 1)); a
      fan-in-scaled prior gets each tensor's fan-in (a bias's is 1).
  """

  kernel_stddev_init: Initializer = fan_in_stddev(0.1)
  bias_stddev_init: Initializer = constant_stddev(0.01)
  bayesian_bias: bool = False
  prior: Prior = NormalPrior()

  estimator: ClassVar[str | None]

  @nn.compact
  def __call__(self, inputs: Array, deterministic: bool | None = None) -> Array:
    """Convolves the inputs under a kernel sample (or the posterior mean).

    Args:
      inputs: ``(*batch, spatial..., features)``, channels last.
      deterministic: use the posterior mean; overrides the attribute.

    Returns:
      ``(*batch, output spatial..., self.features)``.
    """
    inputs, kernel_shape, contract, restore = self._geometry(inputs)
    kernel_box = partitioning_box(self, "kernel", self.kernel_init, kernel_shape,
                                  self.param_dtype, self.kernel_axes)
    bayesian = self.estimator is not None
    if bayesian:
      kernel = variational_param(self, "kernel", kernel_shape, self.kernel_init,
                                 reshaped_init(self.kernel_stddev_init, flat_kernel_shape),
                                 kernel_box, self.param_dtype)
      kl_terms = [("kernel", self.prior.for_fan_in(flat_kernel_shape(kernel_shape)[0]), kernel)]
    else:
      kernel = estimators.Normal(self.param("kernel", boxed_init(kernel_box, self.kernel_init),
                                            kernel_shape, self.param_dtype), None)
      kl_terms = []

    bias = deterministic_bias = None
    if self.use_bias:
      bias_shape = (self.features,)
      bias_box = partitioning_box(self, "bias", self.bias_init, bias_shape, self.param_dtype,
                                  self.bias_axes)
      if self.bayesian_bias and bayesian:
        bias = variational_param(self, "bias", bias_shape, self.bias_init,
                                 self.bias_stddev_init, bias_box, self.param_dtype)
        kl_terms.append(("bias", self.prior.for_fan_in(1), bias))
      else:
        deterministic_bias = self.param("bias", boxed_init(bias_box, self.bias_init),
                                        bias_shape, self.param_dtype)
    if bayesian:
      record_kl(self, kl_terms)

    dtype = self.dtype or jnp.result_type(inputs, self.param_dtype)
    inputs = inputs.astype(dtype)
    if not bayesian or use_posterior_mean(self, deterministic):
      outputs = estimators.posterior_mean(contract, inputs, kernel, bias)
    else:
      outputs = estimators.CONV[self.estimator](self.make_rng("sample"), contract, inputs,
                                                kernel, bias, constrain_like(kernel_box))
    if deterministic_bias is not None:
      outputs = outputs + deterministic_bias.astype(dtype)
    return restore(outputs)


class Conv(_Conv):
  """``nn.Conv`` with T5X-style ``kernel_axes``: the deterministic twin.

  Computes exactly what ``nn.Conv`` computes; takes (and ignores) the
  ``deterministic`` argument and posterior attributes of its Bayesian
  siblings, so models switch estimator by class alone.

  Example::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers.conv import Conv
    >>> layer = Conv(features=4, kernel_size=(3, 3), kernel_axes=(None, None, 'embed', 'mlp'))
    >>> variables = layer.init(jax.random.key(0), jnp.ones((2, 8, 8, 3)))
    >>> nn.get_partition_spec(variables)['params']['kernel']
    P(None, None, 'embed', 'mlp')

  Attributes are those of ``_Conv``.
  """

  estimator = None


class ConvReparameterization(_Conv):
  """``nn.Conv`` with a normal kernel posterior, one kernel sample per call.

  Example::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers.conv import ConvReparameterization
    >>> layer = ConvReparameterization(features=4, kernel_size=(3,), padding='VALID')
    >>> variables = layer.init(jax.random.key(0), jnp.ones((2, 8, 3)))
    >>> jax.tree_util.tree_map(jnp.shape, variables['params'])
    {'bias': (4,), 'kernel_loc': (3, 3, 4), 'kernel_scale': (3, 3, 4)}
    >>> layer.apply(variables, jnp.ones((2, 8, 3)), rngs={'sample': jax.random.key(1)}).shape
    (2, 6, 4)

  Attributes are those of ``_Conv``.
  """

  estimator = "reparameterization"


class ConvFlipout(_Conv):
  """``nn.Conv`` with a normal kernel posterior and Flipout: one kernel sample per example.

  The layer of the Bayesian Layers paper's ResNet-50 (its ``Conv2DFlipout``).
  Example::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers import total_kl
    >>> from meshbayes.layers.conv import ConvFlipout
    >>> layer = ConvFlipout(features=8, kernel_size=(3, 3), strides=2)
    >>> x = jnp.ones((2, 8, 8, 3))
    >>> variables = layer.init(jax.random.key(0), x)
    >>> y, state = layer.apply(variables, x, rngs={'sample': jax.random.key(1)},
    ...                        mutable=['losses'])
    >>> y.shape, bool(total_kl(state) > 0)
    ((2, 4, 4, 8), True)

  Attributes are those of ``_Conv``.
  """

  estimator = "flipout"


class ConvLocalReparameterization(_Conv):
  """``nn.Conv`` with a normal kernel posterior and local reparameterization.

  Every output (example, position, feature) is drawn independently from its
  Gaussian ``N(conv(x, loc) + b, conv(x * x, stddev^2))``: not a per-example
  kernel sample (positions of one example are uncorrelated). Example::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers.conv import ConvLocalReparameterization
    >>> layer = ConvLocalReparameterization(features=4, kernel_size=(3, 3, 3))
    >>> x = jnp.ones((1, 4, 4, 4, 2))
    >>> variables = layer.init(jax.random.key(0), x)
    >>> layer.apply(variables, x, rngs={'sample': jax.random.key(1)}).shape
    (1, 4, 4, 4, 4)

  Attributes are those of ``_Conv``.
  """

  estimator = "local_reparameterization"


_CONV = dict(zip(ESTIMATORS, (Conv, ConvReparameterization, ConvFlipout,
                              ConvLocalReparameterization)))


def conv_class(estimator: str) -> type[_Conv]:
  """The Conv class of an estimator name (``'deterministic'``, ``'flipout'``, ...).

  >>> conv_class('flipout').__name__
  'ConvFlipout'
  """
  if estimator not in _CONV:
    raise ValueError(f"conv_class: estimator={estimator!r} is not one of {', '.join(ESTIMATORS)}")
  return _CONV[estimator]
