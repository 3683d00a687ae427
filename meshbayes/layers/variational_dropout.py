"""Sparse variational dropout (Molchanov et al., 2017) for ``nn.Dense`` and ``nn.Conv``.

Parameters ``kernel_loc`` (``theta``) and ``kernel_log_sigma2``; outputs drawn by
local reparameterization; the log-uniform prior's KL recorded like every
Bayesian layer's; at evaluation weights with ``log alpha >= threshold`` are
dropped (``sparsity``). ``LogUniformPrior`` is that KL as a ``Prior``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util
from flax.core import meta
from jax import lax

from meshbayes.layers import estimators
from meshbayes.layers.conv import ConvBase
from meshbayes.layers.priors import Prior
from meshbayes.layers.variational import (
  Axes,
  Initializer,
  boxed_init,
  partitioning_box,
  record_kl,
  use_posterior_mean,
)

Array = jax.Array

K1, K2, K3 = 0.63576, 1.87320, 1.48695
THRESHOLD = 3.0
LOG_ALPHA_LIMIT = 10.0
_LOG_SIGMA2 = "_log_sigma2"


def log_alpha(loc: Array, log_sigma2: Array) -> Array:
  """``log sigma^2 - log theta^2`` per weight, clipped to ``[-10, 10]``.

  >>> float(log_alpha(jnp.float32(0.5), jnp.log(jnp.float32(0.25))))
  0.0
  """
  loc = jnp.asarray(loc, jnp.float32)
  value = jnp.asarray(log_sigma2, jnp.float32) - jnp.log(jnp.square(loc) + 1e-8)
  return jnp.clip(value, -LOG_ALPHA_LIMIT, LOG_ALPHA_LIMIT)


def log_uniform_kl(log_alpha: Array) -> Array:
  """Molchanov et al.'s approximation of ``KL(N(theta, alpha theta^2) || log-uniform)``.

  Elementwise ``k1 - k1 * sigmoid(k2 + k3 log_alpha) + 0.5 * log1p(1 / alpha)``,
  in float32; the improper prior's constant is chosen so that it tends to 0 as
  ``alpha -> inf``.

  >>> round(float(log_uniform_kl(jnp.float32(0.0))), 4)
  0.4312
  """
  log_alpha = jnp.asarray(log_alpha, jnp.float32)
  return (K1 - K1 * jax.nn.sigmoid(K2 + K3 * log_alpha)
          + 0.5 * jax.nn.softplus(-log_alpha))


@dataclasses.dataclass(frozen=True)
class LogUniformPrior(Prior):
  """The scale-invariant log-uniform prior ``p(|w|) ~ 1 / |w|`` of variational dropout.

  The KL depends on each weight's ``alpha = stddev^2 / loc^2`` only
  (``log_uniform_kl``); it drives weights to ``alpha -> inf``, which prunes them.
  """

  def kl(self, loc, stddev, params, key):
    del params, key
    log_sigma2 = 2.0 * jnp.log(jnp.asarray(stddev, jnp.float32))
    return jnp.sum(log_uniform_kl(log_alpha(loc, log_sigma2)))


def _apply(module: nn.Module, inputs: Array, kernel_shape: tuple[int, ...],
           contract: Callable[..., Array], deterministic: bool | None) -> Array:
  """The variational dropout layer's body, for a linear map ``contract`` of the inputs."""
  box = partitioning_box(module, "kernel", module.kernel_init, kernel_shape,
                         module.param_dtype, module.kernel_axes)
  theta = module.param("kernel_loc", boxed_init(box, module.kernel_init), kernel_shape,
                       module.param_dtype)
  log_sigma2 = module.param(f"kernel{_LOG_SIGMA2}", boxed_init(box, module.log_sigma2_init),
                            kernel_shape, module.param_dtype)
  bias = None
  if module.use_bias:
    bias_box = partitioning_box(module, "bias", module.bias_init, (module.features,),
                                module.param_dtype, module.bias_axes)
    bias = module.param("bias", boxed_init(bias_box, module.bias_init), (module.features,),
                        module.param_dtype)
  posterior = estimators.Normal(theta, jnp.exp(0.5 * log_sigma2))
  record_kl(module, [("kernel", LogUniformPrior(), posterior)])

  dtype = module.dtype or jnp.result_type(inputs, module.param_dtype)
  inputs = inputs.astype(dtype)
  if use_posterior_mean(module, deterministic):
    kept = log_alpha(theta, log_sigma2) < module.threshold
    outputs = estimators.posterior_mean(
        contract, inputs, estimators.Normal(jnp.where(kept, theta, 0.0), None))
  else:
    outputs = estimators.DENSE["local_reparameterization"](module.make_rng("sample"), contract,
                                                           inputs, posterior)
  if bias is not None:
    outputs = outputs + bias.astype(dtype)
  return outputs


def _dense_contract(inputs: Array, kernel: Array, *, precision: Any,
                    preferred_element_type: Any = None) -> Array:
  """Contracts the last axis of ``inputs`` with the first of ``kernel``."""
  dims = (((inputs.ndim - 1,), (0,)), ((), ()))
  return lax.dot_general(inputs, kernel, dims, precision=precision,
                         preferred_element_type=preferred_element_type)


class DenseVariationalDropout(nn.Module):
  """``nn.Dense`` with sparse variational dropout (Molchanov et al., 2017).

  Example::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers import total_kl
    >>> from meshbayes.layers.variational_dropout import DenseVariationalDropout, sparsity
    >>> layer = DenseVariationalDropout(features=4, kernel_axes=('embed', 'mlp'))
    >>> x = jnp.ones((2, 3))
    >>> variables = layer.init(jax.random.key(0), x)
    >>> nn.get_partition_spec(variables)['params']['kernel_log_sigma2']
    P('embed', 'mlp')
    >>> y, state = layer.apply(variables, x, rngs={'sample': jax.random.key(1)},
    ...                        mutable=['losses'])
    >>> y.shape, bool(total_kl(state) > 0), sparsity(variables['params'])
    ((2, 4), True, 0.0)

  Attributes:
    features: number of output features.
    use_bias: whether to add a (deterministic) bias.
    dtype: computation dtype (default: inferred from inputs and parameters).
    param_dtype: parameter dtype (float32 by default).
    precision: numerical precision of the matmuls.
    kernel_init: initializer of ``theta`` (may be boxed).
    bias_init: initializer of the bias.
    kernel_axes: logical axis names of the kernel (``theta`` and ``log sigma^2``).
    bias_axes: logical axis names of the bias.
    log_sigma2_init: initializer of ``log sigma^2`` (default -10, the reference's).
    threshold: weights with ``log alpha`` at or above it are dropped at evaluation.
    deterministic: evaluate (the pruned ``theta``) instead of sampling; the
      call argument overrides it.
  """

  features: int
  use_bias: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32
  precision: Any = None
  kernel_init: Initializer = nn.initializers.lecun_normal()
  bias_init: Initializer = nn.initializers.zeros_init()
  kernel_axes: Axes = None
  bias_axes: Axes = None
  log_sigma2_init: Initializer = nn.initializers.constant(-10.0)
  threshold: float = THRESHOLD
  deterministic: bool | None = None

  @nn.compact
  def __call__(self, inputs: Array, deterministic: bool | None = None) -> Array:
    """Applies the layer: a local reparameterization sample, or the pruned mean.

    Args:
      inputs: ``(..., in_features)``.
      deterministic: evaluate instead of sampling; overrides the attribute.

    Returns:
      ``(..., features)``.
    """
    if self.features < 1:
      raise ValueError(f"{type(self).__name__} {self.name!r}: features={self.features!r} "
                       "must be a positive int")
    kernel_shape = (inputs.shape[-1], self.features)
    contract = lambda x, w, **kwargs: _dense_contract(x, w, precision=self.precision, **kwargs)
    return _apply(self, inputs, kernel_shape, contract, deterministic)


class ConvVariationalDropout(ConvBase):
  """``nn.Conv`` (1-D/2-D/3-D) with sparse variational dropout (Molchanov et al., 2017).

  Each output is drawn by local reparameterization, ``N(conv(x, theta) + b,
  conv(x * x, sigma^2))``, independently per position. Example::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers.variational_dropout import ConvVariationalDropout
    >>> layer = ConvVariationalDropout(features=4, kernel_size=(3, 3))
    >>> x = jnp.ones((2, 6, 6, 3))
    >>> variables = layer.init(jax.random.key(0), x)
    >>> sorted(variables['params'])
    ['bias', 'kernel_loc', 'kernel_log_sigma2']
    >>> layer.apply(variables, x, rngs={'sample': jax.random.key(1)}).shape
    (2, 6, 6, 4)

  Attributes:
    log_sigma2_init: initializer of ``log sigma^2`` (default -10).
    threshold: weights with ``log alpha`` at or above it are dropped at evaluation.
    (others): ``ConvBase``'s, as ``nn.Conv``'s.
  """

  log_sigma2_init: Initializer = nn.initializers.constant(-10.0)
  threshold: float = THRESHOLD

  @nn.compact
  def __call__(self, inputs: Array, deterministic: bool | None = None) -> Array:
    """Convolves the inputs: a local reparameterization sample, or the pruned mean.

    Args:
      inputs: ``(*batch, spatial..., features)``, channels last.
      deterministic: evaluate instead of sampling; overrides the attribute.

    Returns:
      ``(*batch, output spatial..., self.features)``.
    """
    inputs, kernel_shape, contract, restore = self._geometry(inputs)
    return restore(_apply(self, inputs, kernel_shape, contract, deterministic))


def _unbox(value: Any) -> Any:
  return value.unbox() if isinstance(value, meta.AxisMetadata) else value


def sparsity(params: Mapping[str, Any], threshold: float = THRESHOLD) -> float:
  """The fraction of variational dropout weights dropped at evaluation (``log alpha >= threshold``).

  Args:
    params: a ``params`` collection (boxed or not) with variational dropout
      layers (their ``*_loc`` and ``*_log_sigma2`` pairs); other parameters
      are ignored.
    threshold: the ``log alpha`` at and above which a weight is dropped.

  Returns:
    Dropped weights over all variational dropout weights, in [0, 1].

  Raises:
    ValueError: ``params`` has no variational dropout weights.

  >>> sparsity({'kernel_loc': jnp.array([1.0, 0.01]), 'kernel_log_sigma2': jnp.zeros(2)})
  0.5
  """
  flat = traverse_util.flatten_dict(dict(params))
  dropped = total = 0
  for path, value in flat.items():
    if not path[-1].endswith(_LOG_SIGMA2):
      continue
    loc = flat.get(path[:-1] + (path[-1].removesuffix(_LOG_SIGMA2) + "_loc",))
    if loc is None:
      continue
    dropped += int(jnp.sum(log_alpha(_unbox(loc), _unbox(value)) >= threshold))
    total += _unbox(value).size
  if not total:
    raise ValueError("sparsity: params hold no variational dropout weights (no '*_loc' with a "
                     "'*_log_sigma2' beside it)")
  return dropped / total
