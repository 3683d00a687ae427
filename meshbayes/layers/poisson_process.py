"""Inhomogeneous Poisson process on a box: a Cox process's output layer (Tran et al., 2019, Fig. 8).

``PoissonProcessDistribution`` (pure JAX, TFP-shaped) holds a rate function
``(..., d) -> (...)``: ``log_prob(points, mask)`` of padded point sets
(``sum_i log rate(x_i) - integral_B rate``, the integral by quadrature),
``sample`` by thinning, ``integrated_rate``. ``PoissonProcess`` is the flax
layer of a rate module; evaluate its distribution inside ``apply``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from meshbayes import field_checks

Array = jax.Array
RateFn = Callable[[Array], Array]
QUADRATURES = ("gauss_legendre", "midpoint")


def quadrature_rule(low: Sequence[float], high: Sequence[float], order: int,
                    quadrature: str = "gauss_legendre") -> tuple[np.ndarray, np.ndarray]:
  """Nodes ``(order ** d, d)`` and weights ``(order ** d,)`` of a tensor-product rule on a box.

  >>> nodes, weights = quadrature_rule((0.0,), (2.0,), 3)
  >>> nodes.shape, round(float(weights.sum()), 12)   # the weights sum to the volume
  ((3, 1), 2.0)
  """
  if quadrature == "gauss_legendre":
    unit_nodes, unit_weights = np.polynomial.legendre.leggauss(order)  # on [-1, 1]
    unit_nodes, unit_weights = (unit_nodes + 1.0) / 2.0, unit_weights / 2.0
  elif quadrature == "midpoint":
    unit_nodes, unit_weights = (np.arange(order) + 0.5) / order, np.full(order, 1.0 / order)
  else:
    raise ValueError(f"quadrature={quadrature!r} is not one of {', '.join(QUADRATURES)}")
  low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
  axes = [lo + (hi - lo) * unit_nodes for lo, hi in zip(low, high)]
  nodes = np.stack([a.ravel() for a in np.meshgrid(*axes, indexing="ij")], axis=-1)
  weights = np.prod(np.meshgrid(*[(hi - lo) * unit_weights for lo, hi in zip(low, high)],
                                indexing="ij"), axis=0).ravel()
  return nodes, weights


def _check_box(owner: str, low: Sequence[float], high: Sequence[float]) -> None:
  if len(low) == 0 or len(low) != len(high):
    raise ValueError(f"{owner}: low={tuple(low)} and high={tuple(high)} must be sequences of "
                     "one bound per dimension, of equal length >= 1")
  if not all(math.isfinite(lo) and math.isfinite(hi) and hi > lo for lo, hi in zip(low, high)):
    raise ValueError(f"{owner}: the box low={tuple(low)}, high={tuple(high)} must be finite "
                     "with high > low in every dimension")


class ThinningDiagnostics(NamedTuple):
  """What a thinning sample reports about its bound (a pytree: it leaves ``jit`` as arrays).

  A proposal whose rate exceeds the bound is kept with probability 1 instead of
  ``rate / bound > 1``: the sample has too few points where that happens, by the
  rate's excess over the bound. ``exceeded > 0`` says so; zero everywhere is the
  exact sampler.

  Attributes:
    exceeded: ``(*sample_shape,)`` int32, the proposals with ``rate > bound`` per sample.
    max_rate: ``(*sample_shape,)``, the largest rate at a sample's proposals (0 if none).
    bound: ``()``, the thinning bound used.
  """

  exceeded: Array
  max_rate: Array
  bound: Array

  def check_bound(self) -> None:
    """Raises a one-line ValueError if any proposal's rate exceeded the bound (host-side only).

    >>> diagnostics = ThinningDiagnostics(exceeded=np.array([0, 2]),
    ...                                   max_rate=np.array([9.0, 40.0]), bound=np.array(30.0))
    >>> diagnostics.check_bound()
    Traceback (most recent call last):
    ValueError: PoissonProcess.sample: 2 proposals (in 1 of 2 samples) had rate > the thinning ...
    """
    exceeded = np.asarray(self.exceeded)
    total = int(exceeded.sum())
    if total == 0:
      return
    largest = float(np.max(self.max_rate))
    raise ValueError(
        f"PoissonProcess.sample: {total} proposals (in {int(np.count_nonzero(exceeded))} of "
        f"{exceeded.size} samples) had rate > the thinning bound {float(self.bound):.6g} "
        f"(largest rate seen {largest:.6g}), so the sample has too few points there; pass "
        f"rate_bound above the rate's maximum (>= {largest:.6g}) or a larger rate_bound_margin")


@dataclasses.dataclass(frozen=True)
class PoissonProcessDistribution:
  """An inhomogeneous Poisson process on a box (pure functions; see the module docstring).

  Example (a constant rate of 50 on ``[0, 2] x [0, 1]``: 100 points expected)::

    >>> import jax, jax.numpy as jnp
    >>> process = PoissonProcessDistribution(lambda x: jnp.full(x.shape[:-1], 50.0),
    ...                                      low=(0.0, 0.0), high=(2.0, 1.0))
    >>> round(float(process.integrated_rate()), 4)
    100.0
    >>> points, mask = jax.jit(lambda key: process.sample(key, (3,)))(jax.random.key(0))
    >>> points.shape, mask.shape
    ((3, 256, 2), (3, 256))
    >>> log_prob = process.log_prob(points, mask)   # sum_i log 50 - 100, per set
    >>> bool(jnp.allclose(log_prob, mask.sum(-1) * jnp.log(50.0) - 100.0))
    True
    >>> _, _, diagnostics = process.sample_with_diagnostics(jax.random.key(0), (3,))
    >>> diagnostics.exceeded.tolist()   # no proposal's rate above the bound 75 (1.5 x 50)
    [0, 0, 0]
    >>> diagnostics.check_bound()       # so this passes

  Attributes:
    rate_fn: the intensity, locations ``(..., d)`` to positive rates ``(...)``.
    low: the box's lower corner, one number per dimension.
    high: the box's upper corner.
    quadrature: ``'gauss_legendre'`` or ``'midpoint'`` (the integral's rule).
    quadrature_order: nodes (cells) per axis of the rule.
    rate_bound: the thinning bound ``>= max rate``; None: estimated on a grid.
    rate_bound_margin: the estimated bound's factor over the grid's largest rate.
    max_points: the fixed size of a sample (proposals beyond it are dropped).
  """

  rate_fn: RateFn
  low: Sequence[float] = (0.0,)
  high: Sequence[float] = (1.0,)
  quadrature: str = "gauss_legendre"
  quadrature_order: int = 32
  rate_bound: float | Array | None = None
  rate_bound_margin: float = 1.5
  max_points: int = 256

  def __post_init__(self):
    owner = "PoissonProcess"
    object.__setattr__(self, "low", tuple(float(v) for v in np.atleast_1d(self.low)))
    object.__setattr__(self, "high", tuple(float(v) for v in np.atleast_1d(self.high)))
    _check_box(owner, self.low, self.high)
    if self.quadrature not in QUADRATURES:
      raise ValueError(f"{owner}: quadrature={self.quadrature!r} is not one of "
                       f"{', '.join(QUADRATURES)}")
    if not field_checks.is_int(self.quadrature_order) or self.quadrature_order < 1:
      raise ValueError(f"{owner}: quadrature_order={self.quadrature_order!r} must be a "
                       "positive int (nodes per axis)")
    field_checks.positive_int(owner, "max_points", self.max_points)
    if not self.rate_bound_margin >= 1.0:
      raise ValueError(f"{owner}: rate_bound_margin={self.rate_bound_margin!r} must be >= 1")
    if isinstance(self.rate_bound, (int, float)) and not self.rate_bound > 0:
      raise ValueError(f"{owner}: rate_bound={self.rate_bound!r} must be positive (or None: "
                       "estimated on a grid)")

  @property
  def ndim(self) -> int:
    """Dimension ``d`` of the locations."""
    return len(self.low)

  @property
  def volume(self) -> float:
    """The box's volume ``|B|``."""
    return float(np.prod(np.subtract(self.high, self.low)))

  def integrated_rate(self) -> Array:
    """``integral_B rate(x) dx`` by the quadrature rule: the expected number of points."""
    nodes, weights = quadrature_rule(self.low, self.high, self.quadrature_order, self.quadrature)
    rates = self.rate_fn(jnp.asarray(nodes, jnp.float32))
    return jnp.sum(jnp.asarray(weights, rates.dtype) * rates)

  def log_prob(self, points: Array, mask: Array | None = None) -> Array:
    """``sum_i log rate(x_i) - integral_B rate``, one number per point set.

    Args:
      points: ``(..., N, d)`` locations, padded to ``N``.
      mask: ``(..., N)``, True for the real points (None: all are).

    Returns:
      ``(...)``: the log density of each set; ``-inf`` where a real point is
      outside the box.
    """
    points = jnp.asarray(points)
    if points.ndim < 2 or points.shape[-1] != self.ndim:
      raise ValueError(f"PoissonProcess.log_prob: points of shape {points.shape} must be "
                       f"(..., N, {self.ndim}): point sets in the {self.ndim}-D box")
    mask = (jnp.ones(points.shape[:-1], bool) if mask is None
            else jnp.broadcast_to(jnp.asarray(mask, bool), points.shape[:-1]))
    # One call at the points and the nodes together: a GP rate factorizes its inducing
    # covariance once, and the compiled program holds one copy of the rate.
    nodes, weights = quadrature_rule(self.low, self.high, self.quadrature_order, self.quadrature)
    flat = points.reshape(-1, self.ndim)
    rates = self.rate_fn(jnp.concatenate([flat, jnp.asarray(nodes, flat.dtype)]))
    integral = jnp.sum(jnp.asarray(weights, rates.dtype) * rates[len(flat):])
    rates = rates[:len(flat)].reshape(points.shape[:-1])
    # Padding's rate is replaced before the log: no log(0) NaN in the gradient.
    log_rates = jnp.where(mask, jnp.log(jnp.where(mask, rates, 1.0)), 0.0)
    inside = jnp.all((points >= jnp.asarray(self.low)) & (points <= jnp.asarray(self.high)), -1)
    total = jnp.sum(log_rates, axis=-1) - integral
    return jnp.where(jnp.any(mask & ~inside, axis=-1), -jnp.inf, total)

  def thinning_bound(self) -> Array:
    """The bound the thinning uses: ``rate_bound``, or the margin times the grid's largest rate."""
    if self.rate_bound is not None:
      return jnp.asarray(self.rate_bound, jnp.float32)
    axes = [np.linspace(lo, hi, 2 * self.quadrature_order + 1)
            for lo, hi in zip(self.low, self.high)]
    grid = np.stack([a.ravel() for a in np.meshgrid(*axes, indexing="ij")], axis=-1)
    return self.rate_bound_margin * jnp.max(self.rate_fn(jnp.asarray(grid, jnp.float32)))

  def truncation_probability(self) -> Array:
    """``P(Poisson(bound |B|) > max_points)``: how often a sample drops proposals."""
    return 1.0 - jax.scipy.stats.poisson.cdf(self.max_points,
                                             self.thinning_bound() * self.volume)

  def sample(self, key: Array, sample_shape: Sequence[int] = ()) -> tuple[Array, Array]:
    """Point sets by thinning: ``points`` ``(*sample_shape, max_points, d)`` and their ``mask``.

    The kept points come first in each set (``points[..., :mask.sum(-1), :]``);
    the padding holds rejected proposals, to be ignored. Exact only if the rate
    stays below the bound: where it exceeds it the sample has too few points,
    silently here; ``sample_with_diagnostics`` counts such proposals.
    """
    points, mask, _ = self.sample_with_diagnostics(key, sample_shape)
    return points, mask

  def sample_with_diagnostics(self, key: Array, sample_shape: Sequence[int] = ()
                              ) -> tuple[Array, Array, ThinningDiagnostics]:
    """``sample``'s ``points`` and ``mask`` (the same draws), and its ``ThinningDiagnostics``.

    Jits (no host-side check inside): ``diagnostics.exceeded`` counts, per
    sample, the proposals with ``rate > bound``, which are kept with
    probability 1 instead of ``rate / bound``, so the sample has too few points
    there; call ``diagnostics.check_bound()`` outside ``jit`` to raise on them.
    """
    sample_shape = tuple(sample_shape)
    bound = self.thinning_bound()
    low, high = jnp.asarray(self.low), jnp.asarray(self.high)

    def one(key):
      key_count, key_where, key_keep = jax.random.split(key, 3)
      # The proposals' number is the arrivals of a unit-rate process before bound |B|:
      # Poisson(bound |B|), from cumulated exponential gaps (cheaper to compile than
      # jax.random.poisson's rejection loop).
      arrivals = jnp.cumsum(jax.random.exponential(key_count, (self.max_points,)))
      proposed = arrivals < bound * self.volume
      proposals = low + (high - low) * jax.random.uniform(key_where, (self.max_points, self.ndim))
      rates = self.rate_fn(proposals)
      kept = proposed & (jax.random.uniform(key_keep, (self.max_points,)) * bound < rates)
      # A stable partition, kept points first: each goes to its rank within its group.
      rank = jnp.where(kept, jnp.cumsum(kept) - 1, jnp.sum(kept) + jnp.cumsum(~kept) - 1)
      # Only real proposals count; the slots beyond the Poisson count are never drawn.
      exceeded = jnp.sum(proposed & (rates > bound), dtype=jnp.int32)
      max_rate = jnp.max(jnp.where(proposed, rates, 0.0))
      return (jnp.zeros_like(proposals).at[rank].set(proposals),
              jnp.zeros_like(kept).at[rank].set(kept), exceeded, max_rate)

    keys = jax.random.split(key, math.prod(sample_shape))
    points, mask, exceeded, max_rate = jax.vmap(one)(keys)
    diagnostics = ThinningDiagnostics(exceeded.reshape(sample_shape),
                                      max_rate.reshape(sample_shape), bound)
    return (points.reshape(sample_shape + points.shape[1:]),
            mask.reshape(sample_shape + mask.shape[1:]), diagnostics)


class PoissonProcess(nn.Module):
  """Layer returning the Poisson process of its ``rate`` on the box ``[low, high]``.

  Example (a rate of one Dense layer through softplus; ``log_prob`` inside ``apply``)::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> class Rate(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return 10.0 * jax.nn.softplus(nn.Dense(1)(x))[..., 0]
    >>> layer = PoissonProcess(rate=Rate(), low=(0.0,), high=(1.0,), quadrature_order=16)
    >>> variables = layer.init(jax.random.key(0))
    >>> jax.tree.map(jnp.shape, variables['params'])
    {'rate': {'Dense_0': {'bias': (1,), 'kernel': (1, 1)}}}
    >>> points = jnp.array([[[0.2], [0.7], [0.0]]])   # one set, its last point padding
    >>> log_prob = layer.apply(variables, method=lambda m: m().log_prob(points, [[1, 1, 0]]))
    >>> log_prob.shape
    (1,)

  Attributes:
    rate: the intensity: a flax module (a child of this layer) or a function
      mapping locations ``(..., d)`` to positive rates ``(...)``.
    low: the box's lower corner, one number per dimension.
    high: the box's upper corner.
    quadrature: ``'gauss_legendre'`` or ``'midpoint'`` (the integral's rule).
    quadrature_order: nodes (cells) per axis of the rule.
    rate_bound: the thinning bound ``>= max rate``; None: estimated on a grid.
    rate_bound_margin: the estimated bound's factor over the grid's largest rate.
    max_points: the fixed size of a sample.
  """

  rate: RateFn
  low: Sequence[float] = (0.0,)
  high: Sequence[float] = (1.0,)
  quadrature: str = "gauss_legendre"
  quadrature_order: int = 32
  rate_bound: float | None = None
  rate_bound_margin: float = 1.5
  max_points: int = 256

  def __call__(self) -> PoissonProcessDistribution:
    """The process of ``rate`` (bound to this call's parameters: use it inside ``apply``)."""
    process = PoissonProcessDistribution(
        self.rate, low=self.low, high=self.high, quadrature=self.quadrature,
        quadrature_order=self.quadrature_order, rate_bound=self.rate_bound,
        rate_bound_margin=self.rate_bound_margin, max_points=self.max_points)
    if self.is_initializing():
      process.integrated_rate()  # one call of the rate creates its parameters
    return process
