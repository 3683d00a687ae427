"""Priors over a weight tensor's i.i.d. elements, and the KL of a normal posterior from them.

``Prior.kl`` sums the KL over the tensor in float32 (closed form where one
exists, else Monte Carlo). Priors are frozen dataclasses (layer attributes, gin
values); ``for_fan_in`` scales a ``fan_in_scaled`` prior per tensor, and
``trainable_init`` names the parameters ``<weight>_prior_<name>`` a layer creates.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from meshbayes.field_checks import positive_ints, positive_numbers


Array = jax.Array

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def normal_kl(q_loc: Array, q_stddev: Array, p_loc: Array, p_stddev: Array) -> Array:
  """Elementwise ``KL(N(q_loc, q_stddev^2) || N(p_loc, p_stddev^2))``.

  ``log(p_stddev / q_stddev) + (q_stddev^2 + (q_loc - p_loc)^2) / (2 p_stddev^2) - 1/2``.

  Args:
    q_loc: posterior means.
    q_stddev: posterior standard deviations (> 0).
    p_loc: prior mean, broadcastable to ``q_loc``.
    p_stddev: prior standard deviation (> 0), broadcastable to ``q_loc``.

  Returns:
    The KL of each element, in float32.

  >>> float(normal_kl(0.0, 1.0, 0.0, 1.0))
  0.0
  """
  q_loc, q_stddev, p_loc, p_stddev = (
      jnp.asarray(a, jnp.float32) for a in (q_loc, q_stddev, p_loc, p_stddev))
  ratio = q_stddev / p_stddev
  return (0.5 * jnp.square(ratio) + 0.5 * jnp.square((q_loc - p_loc) / p_stddev)
          - jnp.log(ratio) - 0.5)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def normal_kl_sum(q_loc: Array, q_stddev: Array, p_loc: float, p_stddev: float) -> Array:
  """``sum(normal_kl(q_loc, q_stddev, p_loc, p_stddev))`` for a fixed prior, float32.

  Its gradient is written out, ``(q_loc - p_loc) / p_stddev^2`` and
  ``q_stddev / p_stddev^2 - 1 / q_stddev``, from the posterior alone:
  differentiated through ``normal_kl``, a layer inside a scan stored two
  more weight-sized arrays per kernel for the backward pass (its scaled
  mean and stddev), written, kept and read once per step each.

  >>> float(normal_kl_sum(jnp.zeros(3), jnp.ones(3), 0.0, 1.0))
  0.0
  """
  return jnp.sum(normal_kl(q_loc, q_stddev, p_loc, p_stddev))


def _normal_kl_sum_forward(q_loc, q_stddev, p_loc, p_stddev):
  return normal_kl_sum(q_loc, q_stddev, p_loc, p_stddev), (q_loc, q_stddev)


def _normal_kl_sum_backward(p_loc, p_stddev, residuals, grad):
  q_loc, q_stddev = residuals
  precision = 1.0 / (p_stddev * p_stddev)
  d_loc = grad * (q_loc.astype(jnp.float32) - p_loc) * precision
  stddev = q_stddev.astype(jnp.float32)
  d_stddev = grad * (stddev * precision - 1.0 / stddev)
  return d_loc.astype(q_loc.dtype), d_stddev.astype(q_stddev.dtype)


normal_kl_sum.defvjp(_normal_kl_sum_forward, _normal_kl_sum_backward)


def _check_resolved(prior: Prior) -> None:
  if getattr(prior, "fan_in_scaled", False):
    raise ValueError(f"{type(prior).__name__}(fan_in_scaled=True) has no fan-in yet: call "
                     "for_fan_in(fan_in) on it first (the Bayesian layers do)")


def _normal_log_prob(x: Array, stddev: float | Array) -> Array:
  return -0.5 * jnp.square(x / stddev) - jnp.log(stddev) - _HALF_LOG_2PI


class Prior(abc.ABC):
  """A prior over the i.i.d. elements of one weight tensor."""

  def trainable_init(self) -> Mapping[str, float]:
    """Initial unconstrained values of the prior's trainable scalars (none by default)."""
    return {}

  def for_fan_in(self, fan_in: int) -> Prior:
    """The prior of one weight tensor of ``fan_in`` inputs per output (itself by default)."""
    del fan_in
    return self

  @abc.abstractmethod
  def kl(self, loc: Array, stddev: Array, params: Mapping[str, Array],
         key: Array | None) -> Array:
    """KL of ``N(loc, stddev^2)`` from this prior, summed over elements.

    Args:
      loc: posterior means.
      stddev: posterior standard deviations.
      params: the prior's trainable scalars, named as in ``trainable_init``.
      key: a PRNG key for Monte Carlo estimates; closed forms ignore it.

    Returns:
      A float32 scalar.
    """


@dataclasses.dataclass(frozen=True)
class NormalPrior(Prior):
  """``N(loc, stddev^2)`` on every element; the KL is in closed form.

  Attributes:
    loc: prior mean.
    stddev: prior standard deviation (> 0).
    fan_in_scaled: the standard deviation is ``stddev / sqrt(fan_in)`` of the
      tensor (``for_fan_in``): ``stddev=1`` is the scale of LeCun-initialized
      weights at every width, where a fixed ``N(0, 1)`` is ``sqrt(fan_in)``
      times wider than the weights.

  >>> NormalPrior(stddev=2.0, fan_in_scaled=True).for_fan_in(16)
  NormalPrior(loc=0.0, stddev=0.5, fan_in_scaled=False)
  """

  loc: float = 0.0
  stddev: float = 1.0
  fan_in_scaled: bool = False

  def __post_init__(self):
    if not self.stddev > 0:
      raise ValueError(f"NormalPrior: stddev={self.stddev!r} must be a positive number")

  def for_fan_in(self, fan_in):
    if not self.fan_in_scaled:
      return self
    return dataclasses.replace(self, stddev=self.stddev / math.sqrt(fan_in), fan_in_scaled=False)

  def kl(self, loc, stddev, params, key):
    del params, key
    _check_resolved(self)
    return normal_kl_sum(loc, stddev, float(self.loc), float(self.stddev))


@dataclasses.dataclass(frozen=True)
class ScaleMixtureNormalPrior(Prior):
  """``mix * N(0, stddev1^2) + (1 - mix) * N(0, stddev2^2)`` (Blundell et al., 2015).

  No closed form exists, so the KL is estimated as the posterior's analytic
  negative entropy minus a Monte Carlo estimate of ``E_q[log p(w)]`` from
  ``num_samples`` reparameterized draws: unbiased, and its relative error
  shrinks as ``1 / sqrt(number of weights)``.

  Attributes:
    mix: weight of the first component, in (0, 1).
    stddev1: standard deviation of the first (wide) component (> 0).
    stddev2: standard deviation of the second (narrow) component (> 0).
    num_samples: Monte Carlo draws per estimate (>= 1).
  """

  mix: float = 0.5
  stddev1: float = 1.0
  stddev2: float = math.exp(-6.0)
  num_samples: int = 1

  def __post_init__(self):
    if not 0.0 < self.mix < 1.0:
      raise ValueError(f"ScaleMixtureNormalPrior: mix={self.mix!r} must lie in (0, 1)")
    positive_numbers("ScaleMixtureNormalPrior", self, "stddev1", "stddev2")
    positive_ints("ScaleMixtureNormalPrior", self, "num_samples")

  def log_prob(self, w: Array) -> Array:
    """Elementwise log density of the mixture."""
    return jnp.logaddexp(math.log(self.mix) + _normal_log_prob(w, self.stddev1),
                         math.log1p(-self.mix) + _normal_log_prob(w, self.stddev2))

  def kl(self, loc, stddev, params, key):
    del params
    if key is None:
      raise ValueError("ScaleMixtureNormalPrior.kl needs a PRNG key for its Monte Carlo estimate")
    loc, stddev = jnp.asarray(loc, jnp.float32), jnp.asarray(stddev, jnp.float32)
    eps = jax.random.normal(key, (self.num_samples,) + loc.shape, jnp.float32)
    cross_entropy = -jnp.sum(self.log_prob(loc + stddev * eps)) / self.num_samples
    entropy = jnp.sum(jnp.log(stddev)) + loc.size * (_HALF_LOG_2PI + 0.5)
    return cross_entropy - entropy


@dataclasses.dataclass(frozen=True)
class TrainableNormalPrior(Prior):
  """``N(m, s^2)`` with a trainable scalar mean ``m`` and stddev ``s`` per weight tensor.

  Empirical Bayes: the prior is fitted with the posterior through the ELBO.
  ``s = softplus(scale)``. One scalar pair per tensor, not per element: a
  per-element prior could copy the posterior and make the KL vanish.

  Attributes:
    init_loc: initial prior mean.
    init_stddev: initial prior standard deviation (> 0).
    fan_in_scaled: start at ``init_stddev / sqrt(fan_in)`` of the tensor
      (``for_fan_in``), the weights' own scale at ``init_stddev=1``.
  """

  init_loc: float = 0.0
  init_stddev: float = 1.0
  fan_in_scaled: bool = False

  def __post_init__(self):
    if not self.init_stddev > 0:
      raise ValueError(f"TrainableNormalPrior: init_stddev={self.init_stddev!r} "
                       "must be a positive number")

  def for_fan_in(self, fan_in):
    if not self.fan_in_scaled:
      return self
    return dataclasses.replace(self, init_stddev=self.init_stddev / math.sqrt(fan_in),
                               fan_in_scaled=False)

  def trainable_init(self):
    _check_resolved(self)
    # In Python: a jnp value here fails under jit (flax initializes inside the trace).
    stddev = self.init_stddev
    return {"loc": self.init_loc, "scale": stddev + math.log(-math.expm1(-stddev))}

  def kl(self, loc, stddev, params, key):
    del key
    return jnp.sum(normal_kl(loc, stddev, params["loc"], jax.nn.softplus(params["scale"])))
