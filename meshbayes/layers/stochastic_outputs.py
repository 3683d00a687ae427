"""Stochastic output layers: tensor in, TensorFlow Probability distribution out.

Each reads a distribution's parameters off its input's last axis (projected to
them by a ``Dense`` when ``units`` is set) and returns an elementwise
``tfp.distributions`` object: ``layer(h).log_prob(y)`` per element. ``Discretize``
bins a distribution on the integers; TFP gives neither a mixture's ``entropy``
(``monte_carlo_entropy``) nor a binned one's moments (``discrete_mean``, ``discrete_entropy``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from tensorflow_probability.substrates import jax as tfp

from meshbayes.layers.dense import Dense
from meshbayes.layers.variational import Axes, Initializer

tfd = tfp.distributions
tfb = tfp.bijectors
Array = jax.Array


class _StochasticOutput(nn.Module):
  """Shared body: the optional ``Dense`` projection, then ``_distribution``.

  Attributes:
    units: output size the projection makes (``None``: no projection, the input
      holds the parameters). See each layer for what it counts.
    kernel_axes: logical axes of the projection's kernel ``(in, out)``.
    bias_axes: logical axes of the projection's bias ``(out,)``.
    kernel_init: initializer of the projection's kernel.
    bias_init: initializer of the projection's bias.
    dtype: computation dtype of the projection.
    param_dtype: parameter dtype of the projection.
  """

  units: int | None = None
  kernel_axes: Axes = ("embed", "mlp")
  bias_axes: Axes = ("mlp",)
  kernel_init: Initializer = nn.initializers.lecun_normal()
  bias_init: Initializer = nn.initializers.zeros_init()
  dtype: Any = None
  param_dtype: Any = jnp.float32

  params_per_unit: ClassVar[int] = 1
  # Mixtures keep units on their own axis: (..., units, params_per_unit).
  unit_axis: ClassVar[bool] = False

  @nn.compact
  def __call__(self, inputs: Array) -> tfd.Distribution:
    """Returns the distribution whose parameters are (a projection of) ``inputs``."""
    if self.units is not None:
      if self.units < 1:
        raise ValueError(f"{type(self).__name__} {self.name!r}: units={self.units} must be "
                         "positive or None")
      inputs = Dense(self.units * self.params_per_unit, kernel_init=self.kernel_init,
                     bias_init=self.bias_init, kernel_axes=self.kernel_axes,
                     bias_axes=self.bias_axes, dtype=self.dtype, param_dtype=self.param_dtype,
                     name="projection")(inputs)
      if self.unit_axis:
        inputs = inputs.reshape(inputs.shape[:-1] + (self.units, self.params_per_unit))
    return self._distribution(inputs)

  def _distribution(self, params: Array) -> tfd.Distribution:
    raise NotImplementedError


def _split(params: Array, parts: int, name: str) -> list[Array]:
  if params.shape[-1] % parts:
    raise ValueError(f"{name}: last axis {params.shape[-1]} is not a multiple of {parts}")
  return jnp.split(params, parts, axis=-1)


class Normal(_StochasticOutput):
  """Normal output: loc and ``softplus`` scale from the first and second half of the input.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> layer = Normal(units=3)
    >>> variables = layer.init(jax.random.key(0), jnp.ones((2, 5)))
    >>> dist = layer.apply(variables, jnp.ones((2, 5)))
    >>> tuple(dist.batch_shape), dist.log_prob(jnp.zeros((2, 3))).shape
    ((2, 3), (2, 3))

  ``units``: the number of normal outputs ``d`` (the projection makes ``2 d``).
  """

  params_per_unit: ClassVar[int] = 2

  def _distribution(self, params: Array) -> tfd.Distribution:
    loc, raw_scale = _split(params, 2, type(self).__name__)
    return tfd.Normal(loc=loc, scale=jax.nn.softplus(raw_scale))


class Categorical(_StochasticOutput):
  """Categorical output over the input's last axis (the logits).

  Example::

    >>> import jax, jax.numpy as jnp
    >>> layer = Categorical(units=4)
    >>> variables = layer.init(jax.random.key(0), jnp.ones((2, 5)))
    >>> dist = layer.apply(variables, jnp.ones((2, 5)))
    >>> tuple(dist.batch_shape), dist.probs_parameter().shape
    ((2,), (2, 4))

  ``units``: the number of classes.
  """

  def _distribution(self, params: Array) -> tfd.Distribution:
    return tfd.Categorical(logits=params)


class Bernoulli(_StochasticOutput):
  """Bernoulli outputs, one per element of the input's last axis (the logits).

  Example::

    >>> import jax, jax.numpy as jnp
    >>> dist = Bernoulli().apply({}, jnp.zeros((2, 3)))
    >>> [round(float(v), 4) for v in dist.log_prob(jnp.ones((2, 3)))[0]]
    [-0.6931, -0.6931, -0.6931]

  ``units``: the number of Bernoulli outputs.
  """

  def _distribution(self, params: Array) -> tfd.Distribution:
    return tfd.Bernoulli(logits=params)


class Poisson(_StochasticOutput):
  """Poisson outputs, one per element of the input's last axis (the log rates).

  Example::

    >>> import jax, jax.numpy as jnp
    >>> Poisson().apply({}, jnp.log(jnp.array([2.0, 5.0]))).mean().tolist()
    [2.0, 5.0]

  ``units``: the number of Poisson outputs.
  """

  def _distribution(self, params: Array) -> tfd.Distribution:
    return tfd.Poisson(log_rate=params)


class _Mixture(_StochasticOutput):
  """Mixture of ``num_components`` location-scale components per output.

  Attributes:
    num_components: mixture components ``K``; the parameters' last axis is
      ``3 K``: mixture logits, component locs, raw scales (``softplus``).
    min_scale: added to every component scale (a floor that keeps
      discretized likelihoods from collapsing a component onto one bin).
  """

  num_components: int = 5
  min_scale: float = 0.0

  unit_axis: ClassVar[bool] = True
  component: ClassVar[Any]

  @property
  def params_per_unit(self) -> int:  # type: ignore[override]
    return 3 * self.num_components

  def _distribution(self, params: Array) -> tfd.Distribution:
    if params.shape[-1] != 3 * self.num_components:
      raise ValueError(f"{type(self).__name__} {self.name!r}: last axis {params.shape[-1]} "
                       f"!= 3 * num_components = {3 * self.num_components}")
    logits, loc, raw_scale = jnp.split(params, 3, axis=-1)
    scale = jax.nn.softplus(raw_scale) + self.min_scale
    return tfd.MixtureSameFamily(tfd.Categorical(logits=logits),
                                 type(self).component(loc=loc, scale=scale))


class MixtureLogistic(_Mixture):
  """Mixture of logistic distributions (PixelCNN++'s output before ``Discretize``).

  Example::

    >>> import jax, jax.numpy as jnp
    >>> layer = MixtureLogistic(num_components=2, units=3)
    >>> variables = layer.init(jax.random.key(0), jnp.ones((4, 5)))
    >>> dist = layer.apply(variables, jnp.ones((4, 5)))
    >>> tuple(dist.batch_shape), dist.mean().shape
    ((4, 3), (4, 3))

  ``units``: the number of outputs ``d`` (the projection makes ``d * 3 K``).
  """

  component: ClassVar[Any] = tfd.Logistic


class MixtureNormal(_Mixture):
  """Mixture of normal distributions.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> params = jnp.array([0.0, 0.0, -1.0, 1.0, 0.0, 0.0])   # logits, locs, raw scales
    >>> float(MixtureNormal(num_components=2).apply({}, params).mean())
    0.0

  ``units``: the number of outputs ``d`` (the projection makes ``d * 3 K``).
  """

  component: ClassVar[Any] = tfd.Normal


def discretize(distribution: tfd.Distribution, low: float, high: float) -> tfd.Distribution:
  """The distribution of ``x`` rounded to the integers ``low..high`` (edges absorb the tails).

  ``log_prob(k) = log(CDF(k + 1/2) - CDF(k - 1/2))`` inside, ``log CDF(low + 1/2)``
  and ``log(1 - CDF(high - 1/2))`` at the edges, computed from log-space CDFs.
  A ``MixtureSameFamily`` is discretized per component and re-mixed.

  >>> d = discretize(tfd.Logistic(0.0, 1.0), low=-2, high=2)
  >>> float(jnp.exp(d.log_prob(jnp.arange(-2.0, 3.0))).sum())
  1.0
  """
  if isinstance(distribution, tfd.MixtureSameFamily):
    return tfd.MixtureSameFamily(distribution.mixture_distribution,
                                 discretize(distribution.components_distribution, low, high))
  # QuantizedDistribution's bins are (k - 1, k]; shifting by -1/2 centres them on k.
  shifted = tfd.TransformedDistribution(distribution, tfb.Shift(jnp.asarray(-0.5)))
  return tfd.QuantizedDistribution(shifted, low=jnp.asarray(float(low)),
                                   high=jnp.asarray(float(high)))


class Discretize(nn.Module):
  """Layer form of ``discretize``: takes a continuous distribution, returns the discretized one.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> dist = MixtureLogistic(num_components=2).apply({}, jnp.zeros((3, 6)))
    >>> pixels = Discretize(low=0, high=16).apply({}, dist)
    >>> pixels.log_prob(jnp.array([0.0, 1.0, 16.0])).shape
    (3,)

  Attributes:
    low: lowest integer value (its bin absorbs the lower tail).
    high: highest integer value (its bin absorbs the upper tail).
  """

  low: float = 0.0
  high: float = 255.0

  def __call__(self, distribution: tfd.Distribution) -> tfd.Distribution:
    """Returns ``discretize(distribution, self.low, self.high)``."""
    if self.high <= self.low:
      raise ValueError(f"Discretize {self.name!r}: high={self.high} must exceed low={self.low}")
    return discretize(distribution, self.low, self.high)


def bin_log_probs(distribution: tfd.Distribution, low: int, high: int) -> Array:
  """Log-probabilities of every integer ``low..high``: shape ``batch_shape + (high - low + 1,)``."""
  values = jnp.arange(low, high + 1, dtype=jnp.float32)
  values = values.reshape((-1,) + (1,) * len(distribution.batch_shape))
  return jnp.moveaxis(distribution.log_prob(values), 0, -1)


def discrete_mean(distribution: tfd.Distribution, low: int, high: int) -> Array:
  """Mean of a distribution supported on the integers ``low..high`` (e.g. ``discretize``'s)."""
  probs = jnp.exp(bin_log_probs(distribution, low, high))
  return probs @ jnp.arange(low, high + 1, dtype=probs.dtype)


def discrete_entropy(distribution: tfd.Distribution, low: int, high: int) -> Array:
  """Entropy in nats of a distribution supported on the integers ``low..high``."""
  log_probs = bin_log_probs(distribution, low, high)
  return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)


def monte_carlo_entropy(distribution: tfd.Distribution, key: Array,
                        num_samples: int = 1000) -> Array:
  """Unbiased estimate ``-mean(log_prob(samples))`` of the entropy (TFP has none for mixtures)."""
  samples = distribution.sample(num_samples, seed=key)
  return -jnp.mean(distribution.log_prob(samples), axis=0)
