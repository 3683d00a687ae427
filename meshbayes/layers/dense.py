"""Bayesian drop-ins for ``nn.Dense`` and ``nn.DenseGeneral``, one class per estimator.

Each takes its flax twin's arguments and call; the kernel becomes ``kernel_loc``
and ``kernel_scale`` with the twin's shape and logical axes, sampled from the
``'sample'`` rng (``deterministic=True``: the posterior mean), its KL recorded in
``'losses'``. ``Dense`` and ``DenseGeneral`` are the deterministic twins;
``dense_class(estimator)`` picks a class by name (``DENSE_ESTIMATORS``: the
shared ``ESTIMATORS`` and the Dense-only grouped reparameterization).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from meshbayes.layers import estimators
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


def _as_tuple(x: int | Sequence[int]) -> tuple[int, ...]:
  return (x,) if isinstance(x, int) else tuple(x)


def _contract(inputs: Array, kernel: Array, *, axis: tuple[int, ...], precision: Any,
              preferred_element_type: Any = None) -> Array:
  """Contracts ``axis`` of ``inputs`` with the leading axes of ``kernel``.

  With the contracted axes last (the usual case) both operands are reshaped to
  matrices, ``(rows, in) @ (in, out)``, so the kernel's gradient is one
  ``inputs^T @ grad`` that needs no transposed copy of ``grad``
  (docs/results/2026-11-cpu-train-step.md says what the copy cost). The result has the shape
  ``lax.dot_general`` would give.
  """
  num = len(axis)
  if axis == tuple(range(inputs.ndim - num, inputs.ndim)) and inputs.ndim > num + 1:
    rows, features = inputs.shape[:-num], kernel.shape[num:]
    flat = lax.dot_general(
        inputs.reshape(math.prod(rows), math.prod(inputs.shape[-num:])),
        kernel.reshape(math.prod(kernel.shape[:num]), math.prod(features)),
        (((1,), (0,)), ((), ())), precision=precision,
        preferred_element_type=preferred_element_type)
    return flat.reshape(rows + features)
  dims = ((axis, tuple(range(num))), ((), ()))
  return lax.dot_general(inputs, kernel, dims, precision=precision,
                         preferred_element_type=preferred_element_type)


class _Linear(nn.Module):
  """The shared body of the Dense layers; subclasses pick the estimator.

  ``estimator`` names the estimator (a key of ``estimators.DENSE``); ``None``
  (the deterministic twins) keeps point weights: a ``kernel`` and a ``bias``
  as flax's, and the posterior attributes unused.

  Attributes:
    features: number (or, for DenseGeneral, tuple) of output features.
    use_bias: whether to add a bias.
    dtype: computation dtype (default: inferred from inputs and parameters).
    param_dtype: parameter dtype (float32 by default).
    precision: numerical precision of the matmuls (``jax.lax.Precision``).
    kernel_init: initializer of the kernel's posterior mean (the deterministic
      twin's; may be boxed with ``nn.with_logical_partitioning``).
    bias_init: initializer of the bias (or of its posterior mean).
    kernel_axes: logical axis names of the kernel, T5X style (None: take them
      from a boxed ``kernel_init``, or leave the kernel unannotated).
    bias_axes: logical axis names of the bias.
    kernel_stddev_init: initializer of the kernel's posterior standard
      deviation (default ``0.1 / sqrt(fan_in)``; see ``initializers``).
    bias_stddev_init: initializer of a Bayesian bias's standard deviation.
    bayesian_bias: give the bias a normal posterior too.
    prior: prior of every Bayesian weight of the layer (default N(0, 1)); a
      fan-in-scaled prior gets each tensor's fan-in (a bias's is 1).
    deterministic: use the posterior mean instead of sampling; the call
      argument overrides it.
    one_sample_per_example: Flipout only: draw the signs per example and share
      them over the positions (the input axes between the batch and the
      contracted ones), so each example (a sentence) sees one weight sample at
      all its positions, as ``sample_weights`` gives at prediction; False draws
      them per position. Reparameterization always shares one sample; local
      reparameterization samples per position by construction and refuses it.
    noise_dtype: dtype of the activation-sized noise work (None: as written, float32):
      local reparameterization's variance, its square root and noise, Flipout's
      weight perturbation; the compute dtype (``'bfloat16'``) halves their bytes
      (``estimators``). The reparameterizations draw weight-sized noise only: unaffected.
    num_weight_groups: grouped reparameterization only: the batch (axis 0) is cut
      into this many equal groups, each contracted with its own weight sample (1:
      one sample per call; the batch size: one per example; the number of data
      shards: one per shard, drawn where it is used). It must divide the batch;
      the other Bayesian estimators refuse any value but 1.
  """

  features: int | Sequence[int]
  use_bias: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32
  precision: Any = None
  kernel_init: Initializer = nn.initializers.lecun_normal()
  bias_init: Initializer = nn.initializers.zeros_init()
  kernel_axes: Axes = None
  bias_axes: Axes = None
  kernel_stddev_init: Initializer = fan_in_stddev(0.1)
  bias_stddev_init: Initializer = constant_stddev(0.01)
  bayesian_bias: bool = False
  prior: Prior = NormalPrior()
  deterministic: bool | None = None
  one_sample_per_example: bool = False
  noise_dtype: Any = None
  num_weight_groups: int = 1

  estimator: ClassVar[str | None]

  def _contracting_axes(self) -> tuple[int, ...]:
    return (-1,)

  @nn.compact
  def __call__(self, inputs: Array, deterministic: bool | None = None) -> Array:
    """Applies the layer under a weight sample (or the posterior mean).

    Args:
      inputs: the array to transform.
      deterministic: use the posterior mean; overrides the attribute.

    Returns:
      The transformed inputs.
    """
    features = _as_tuple(self.features)
    if not features or min(features) < 1:
      raise ValueError(f"{type(self).__name__} {self.name!r}: features={self.features!r} "
                       "must be a positive int or a tuple of them")
    axis = tuple(a % inputs.ndim for a in self._contracting_axes())
    per_example = self.one_sample_per_example and self.estimator == "flipout"
    if self.one_sample_per_example and self.estimator == "local_reparameterization":
      raise ValueError(f"{type(self).__name__} {self.name!r}: one_sample_per_example=True "
                       "needs a weight sample, but local reparameterization samples each "
                       "output; use Flipout or reparameterization")
    if per_example and axis != tuple(range(inputs.ndim - len(axis), inputs.ndim)):
      raise ValueError(f"{type(self).__name__} {self.name!r}: one_sample_per_example=True "
                       f"needs the contracted axes last, not axis={axis}")
    self._check_weight_groups(inputs)
    kernel_shape = tuple(inputs.shape[a] for a in axis) + features
    flat_kernel = lambda s: (math.prod(s[:len(axis)]), math.prod(s[len(axis):]))
    loc_init = reshaped_init(self.kernel_init, flat_kernel)
    kernel_box = partitioning_box(self, "kernel", loc_init, kernel_shape, self.param_dtype,
                                  self.kernel_axes)
    bayesian = self.estimator is not None
    if bayesian:
      kernel = variational_param(self, "kernel", kernel_shape, loc_init,
                                 reshaped_init(self.kernel_stddev_init, flat_kernel), kernel_box,
                                 self.param_dtype)
      kl_terms = [("kernel", self.prior.for_fan_in(flat_kernel(kernel_shape)[0]), kernel)]
    else:
      kernel = estimators.Normal(self.param("kernel", boxed_init(kernel_box, loc_init),
                                            kernel_shape, self.param_dtype), None)
      kl_terms = []

    bias = deterministic_bias = None
    if self.use_bias:
      flat_bias = lambda s: (math.prod(s),)
      bias_init = reshaped_init(self.bias_init, flat_bias)
      bias_box = partitioning_box(self, "bias", bias_init, features, self.param_dtype,
                                  self.bias_axes)
      if self.bayesian_bias and bayesian:
        bias = variational_param(self, "bias", features, bias_init,
                                 reshaped_init(self.bias_stddev_init, flat_bias), bias_box,
                                 self.param_dtype)
        kl_terms.append(("bias", self.prior.for_fan_in(1), bias))
      else:
        deterministic_bias = self.param("bias", boxed_init(bias_box, bias_init), features,
                                        self.param_dtype)
    if bayesian:
      record_kl(self, kl_terms)

    dtype = self.dtype or jnp.result_type(inputs, self.param_dtype)
    inputs = inputs.astype(dtype)
    contract = functools.partial(_contract, axis=axis, precision=self.precision)
    if not bayesian or use_posterior_mean(self, deterministic):
      outputs = estimators.posterior_mean(contract, inputs, kernel, bias)
    else:
      estimator = estimators.DENSE[self.estimator]
      if per_example:  # batch axis 0, then the positions, in inputs and outputs alike
        estimator = functools.partial(
            estimator, shared_axes=tuple(range(1, inputs.ndim - len(axis))))
      if self.noise_dtype is not None and self.estimator in _ACTIVATION_NOISE:
        estimator = functools.partial(estimator, noise_dtype=jnp.dtype(self.noise_dtype))
      if self.estimator == GROUPED:
        estimator = functools.partial(estimator, num_groups=self.num_weight_groups,
                                      constrain_samples=_constrain_samples(kernel_box))
      outputs = estimator(self.make_rng("sample"), contract, inputs, kernel, bias,
                          constrain_like(kernel_box))
    if deterministic_bias is not None:
      outputs = outputs + deterministic_bias.astype(dtype)
    return outputs

  def _check_weight_groups(self, inputs: Array) -> None:
    groups, owner = self.num_weight_groups, f"{type(self).__name__} {self.name!r}"
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
      raise ValueError(f"{owner}: num_weight_groups={groups!r} must be a positive int")
    if groups == 1 or self.estimator is None:  # the deterministic twin ignores it
      return
    if self.estimator != GROUPED:
      raise ValueError(f"{owner}: num_weight_groups={groups} needs the grouped "
                       f"reparameterization; estimator {self.estimator!r} takes only 1")
    batch = inputs.shape[0] if inputs.ndim else 0
    if batch % groups:
      raise ValueError(f"{owner}: num_weight_groups={groups} does not divide the batch of "
                       f"{batch} examples (inputs {tuple(inputs.shape)}); use a divisor of it")


# The estimators whose activation-sized noise work takes ``noise_dtype``.
_ACTIVATION_NOISE = ("flipout", "local_reparameterization")


def _constrain_samples(kernel_box: Any) -> estimators.Constrain:
  """Places per-group kernel samples: the group axis like the batch, the rest like the
  kernel (the identity when the kernel has no logical axes)."""
  if not isinstance(kernel_box, nn.LogicallyPartitioned):
    return lambda x: x
  return functools.partial(nn.with_logical_constraint,
                           logical_axis_resources=("batch",) + tuple(kernel_box.names))


class Dense(_Linear):
  """``nn.Dense`` with T5X-style ``kernel_axes``: the deterministic twin.

  Computes exactly what ``nn.Dense`` computes; takes (and ignores) the
  ``deterministic`` argument and posterior attributes of its Bayesian
  siblings, so models switch estimator by class alone.

  Example::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers import Dense
    >>> layer = Dense(features=4, kernel_axes=('embed', 'mlp'), bias_axes=('mlp',))
    >>> variables = layer.init(jax.random.key(0), jnp.ones((2, 3)))
    >>> nn.get_partition_spec(variables)['params']['kernel']
    P('embed', 'mlp')

  Attributes are those of ``_Linear``; ``features`` is an int.
  """

  estimator = None


class DenseReparameterization(_Linear):
  """``nn.Dense`` with a normal kernel posterior, one weight sample per call.

  Example::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers import DenseReparameterization
    >>> layer = DenseReparameterization(features=4, kernel_axes=('embed', 'mlp'))
    >>> variables = layer.init(jax.random.key(0), jnp.ones((2, 3)))
    >>> jax.tree_util.tree_map(jnp.shape, nn.unbox(variables['params']))
    {'bias': (4,), 'kernel_loc': (3, 4), 'kernel_scale': (3, 4)}
    >>> y = layer.apply(variables, jnp.ones((2, 3)), rngs={'sample': jax.random.key(1)})
    >>> y.shape
    (2, 4)

  Attributes are those of ``_Linear`` (``nn.Dense``'s plus the
  posterior's); ``features`` is an int.
  """

  estimator = "reparameterization"


class DenseFlipout(_Linear):
  """``nn.Dense`` with a normal kernel posterior and the Flipout estimator.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers import DenseFlipout, total_kl
    >>> layer = DenseFlipout(features=4, kernel_axes=('embed', 'mlp'))
    >>> variables = layer.init(jax.random.key(0), jnp.ones((2, 3)))
    >>> y, state = layer.apply(variables, jnp.ones((2, 3)),
    ...                        rngs={'sample': jax.random.key(1)}, mutable=['losses'])
    >>> y.shape, bool(total_kl(state) > 0)
    ((2, 4), True)

  Attributes are those of ``_Linear``; ``features`` is an int.
  """

  estimator = "flipout"


class DenseLocalReparameterization(_Linear):
  """``nn.Dense`` with a normal kernel posterior and local reparameterization.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers import DenseLocalReparameterization
    >>> layer = DenseLocalReparameterization(features=4)
    >>> variables = layer.init(jax.random.key(0), jnp.ones((2, 3)))
    >>> mean = layer.apply(variables, jnp.ones((2, 3)), deterministic=True)
    >>> bool(jnp.allclose(mean, jnp.ones((2, 3)) @ variables['params']['kernel_loc']))
    True

  Attributes are those of ``_Linear``; ``features`` is an int.
  """

  estimator = "local_reparameterization"


class DenseGroupedReparameterization(_Linear):
  """``nn.Dense`` with a normal kernel posterior, one weight sample per batch group.

  ``num_weight_groups`` equal consecutive groups of the batch each see their own
  sample, in one batched matmul (``estimators.grouped_reparameterization``).

  Example (two groups of two examples; each group's examples share a sample)::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers import DenseGroupedReparameterization
    >>> layer = DenseGroupedReparameterization(features=3, num_weight_groups=2)
    >>> x = jnp.ones((4, 5))
    >>> variables = layer.init(jax.random.key(0), x)
    >>> y = layer.apply(variables, x, rngs={'sample': jax.random.key(1)})
    >>> bool(jnp.all(y[0] == y[1])), bool(jnp.any(y[1] != y[2]))
    (True, True)

  Attributes are those of ``_Linear``; ``features`` is an int.
  """

  estimator = "grouped_reparameterization"


class _DenseGeneralBase(_Linear):
  """``_Linear`` over several input axes and output features.

  Attributes:
    axis: the input axes to contract (int or tuple), as in ``nn.DenseGeneral``.
  """

  axis: int | Sequence[int] = -1

  def _contracting_axes(self) -> tuple[int, ...]:
    return _as_tuple(self.axis)


class DenseGeneral(_DenseGeneralBase):
  """``nn.DenseGeneral`` with T5X-style ``kernel_axes``: the deterministic twin.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers import DenseGeneral
    >>> layer = DenseGeneral(features=(2, 5), use_bias=False, kernel_axes=('embed', 'heads', 'kv'))
    >>> layer.init(jax.random.key(0), jnp.ones((1, 3)))['params']['kernel'].value.shape
    (3, 2, 5)

  Attributes are those of ``_DenseGeneralBase``.
  """

  estimator = None


class DenseGeneralReparameterization(_DenseGeneralBase):
  """``nn.DenseGeneral`` with a normal kernel posterior, one weight sample per call.

  Example::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers import DenseGeneralReparameterization
    >>> layer = DenseGeneralReparameterization(features=(2, 5), use_bias=False)
    >>> variables = layer.init(jax.random.key(0), jnp.ones((1, 3)))
    >>> jax.tree_util.tree_map(jnp.shape, variables['params'])
    {'kernel_loc': (3, 2, 5), 'kernel_scale': (3, 2, 5)}

  Attributes are those of ``_DenseGeneralBase``.
  """

  estimator = "reparameterization"


class DenseGeneralFlipout(_DenseGeneralBase):
  """``nn.DenseGeneral`` with a normal kernel posterior and the Flipout estimator.

  The attention projections of the Bayesian Transformer. Example (a query
  projection from ``embed`` to ``heads x kv``)::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers import DenseGeneralFlipout
    >>> query = DenseGeneralFlipout(features=(2, 4), use_bias=False,
    ...                             kernel_axes=('embed', 'heads', 'kv'))
    >>> x = jnp.ones((1, 5, 8))
    >>> variables = query.init(jax.random.key(0), x)
    >>> nn.get_partition_spec(variables)['params']['kernel_scale']
    P('embed', 'heads', 'kv')
    >>> query.apply(variables, x, rngs={'sample': jax.random.key(1)}).shape
    (1, 5, 2, 4)

  Attributes are those of ``_DenseGeneralBase``.
  """

  estimator = "flipout"


class DenseGeneralLocalReparameterization(_DenseGeneralBase):
  """``nn.DenseGeneral`` with a normal kernel posterior and local reparameterization.

  Example (an attention output projection from ``heads x kv`` to ``embed``)::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers import DenseGeneralLocalReparameterization
    >>> out = DenseGeneralLocalReparameterization(features=8, axis=(-2, -1), use_bias=False)
    >>> x = jnp.ones((1, 5, 2, 4))
    >>> variables = out.init(jax.random.key(0), x)
    >>> out.apply(variables, x, rngs={'sample': jax.random.key(1)}).shape
    (1, 5, 8)

  Attributes are those of ``_DenseGeneralBase``.
  """

  estimator = "local_reparameterization"


class DenseGeneralGroupedReparameterization(_DenseGeneralBase):
  """``nn.DenseGeneral`` with a normal kernel posterior, one weight sample per batch group.

  Example (an attention query projection, one sample per example of three)::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers import DenseGeneralGroupedReparameterization
    >>> query = DenseGeneralGroupedReparameterization(
    ...     features=(2, 4), use_bias=False, kernel_axes=('embed', 'heads', 'kv'),
    ...     num_weight_groups=3)
    >>> x = jnp.ones((3, 5, 8))
    >>> variables = query.init(jax.random.key(0), x)
    >>> nn.get_partition_spec(variables)['params']['kernel_loc']
    P('embed', 'heads', 'kv')
    >>> query.apply(variables, x, rngs={'sample': jax.random.key(1)}).shape
    (3, 5, 2, 4)

  Attributes are those of ``_DenseGeneralBase``.
  """

  estimator = "grouped_reparameterization"


# The estimators every layer family offers; the Dense layers also the grouped one.
ESTIMATORS = ("deterministic", "reparameterization", "flipout", "local_reparameterization")
# The Dense-only estimator: one weight sample per group of the batch.
GROUPED = "grouped_reparameterization"
DENSE_ESTIMATORS = ESTIMATORS + (GROUPED,)
_DENSE = dict(zip(DENSE_ESTIMATORS, (Dense, DenseReparameterization, DenseFlipout,
                                     DenseLocalReparameterization,
                                     DenseGroupedReparameterization)))
_DENSE_GENERAL = dict(zip(DENSE_ESTIMATORS, (
    DenseGeneral, DenseGeneralReparameterization, DenseGeneralFlipout,
    DenseGeneralLocalReparameterization, DenseGeneralGroupedReparameterization)))


def _lookup(table: dict[str, type[_Linear]], estimator: str, what: str) -> type[_Linear]:
  if estimator not in table:
    raise ValueError(f"{what}: estimator={estimator!r} is not one of {', '.join(table)}")
  return table[estimator]


def dense_class(estimator: str) -> type[_Linear]:
  """The Dense class of an estimator name (``'deterministic'``, ``'flipout'``, ...;
  ``DENSE_ESTIMATORS``).

  >>> dense_class('flipout').__name__
  'DenseFlipout'
  """
  return _lookup(_DENSE, estimator, "dense_class")


def dense_general_class(estimator: str) -> type[_Linear]:
  """The DenseGeneral class of an estimator name."""
  return _lookup(_DENSE_GENERAL, estimator, "dense_general_class")
