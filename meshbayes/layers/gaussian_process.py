"""Gaussian process layers (Tran et al., 2019, Section 2): distributions over functions.

``GaussianProcess`` (exact regression: a TFP distribution, ``(units,)`` GPs over
the ``N`` inputs), ``SparseGaussianProcess`` (whitened inducing points: a
``tfd.Normal`` of ``q(f(x))``, its KL recorded for ``total_kl``; given a
distribution it draws one sample, so stacks are deep GPs) and
``RandomFourierFeatures`` (Bayesian weights on random features: a tensor). The
math is in pure functions (``whitened_conditional``, ``whitened_kl``, ...).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular
from tensorflow_probability.substrates import jax as tfp

from meshbayes import field_checks
from meshbayes.layers.dense import ESTIMATORS, dense_class
from meshbayes.layers.kl import KL_COLLECTION, KL_NAME
from meshbayes.layers.priors import NormalPrior, Prior
from meshbayes.layers.variational import SAMPLE_RNG, Initializer

tfd = tfp.distributions
tfb = tfp.bijectors
tfpk = tfp.math.psd_kernels
Array = jax.Array
MeanFn = Callable[[Array], Array]

# The lower-triangular L_S with a softplus diagonal, from an unconstrained square matrix.
_SOFTPLUS_DIAGONAL = tfb.TransformDiagonal(tfb.Softplus())


def _softplus_inverse(value: float) -> float:
  """``log(exp(v) - 1)`` in float64, so float64 parameters start exactly at ``v``."""
  return float(value + np.log(-np.expm1(-value)))


def make_kernel(amplitude: Array, lengthscale: Array,
                kernel_fn: Callable[..., tfpk.PositiveSemidefiniteKernel] = tfpk.ExponentiatedQuadratic
                ) -> tfpk.PositiveSemidefiniteKernel:
  """``kernel_fn(amplitude, lengthscale)``; a vector lengthscale scales each feature (ARD).

  ``kernel_fn`` is a TFP kernel class taking ``amplitude`` and ``length_scale``
  (``ExponentiatedQuadratic``, ``MaternFiveHalves``, ...). A lengthscale of
  shape ``(d,)`` divides each input feature by its own (``tfpk.FeatureScaled``).

  >>> k = make_kernel(jnp.asarray(2.0), jnp.asarray(1.0))
  >>> round(float(k.apply(jnp.zeros(1), jnp.ones(1))), 4)   # 2^2 exp(-1/2)
  2.4261
  """
  if jnp.ndim(lengthscale) == 0:
    return kernel_fn(amplitude=amplitude, length_scale=lengthscale)
  return tfpk.FeatureScaled(kernel_fn(amplitude=amplitude, length_scale=None),
                            scale_diag=lengthscale)


def scale_tril(raw: Array) -> Array:
  """``L_S`` from its unconstrained parameter: the lower triangle, diagonal through softplus."""
  return _SOFTPLUS_DIAGONAL.forward(jnp.tril(raw))


def scale_tril_inverse(scale: Array) -> Array:
  """The unconstrained parameter of a lower-triangular ``L_S`` with a positive diagonal.

  >>> L = jnp.array([[1.0, 0.0], [0.5, 2.0]])
  >>> bool(jnp.allclose(scale_tril(scale_tril_inverse(L)), L))
  True
  """
  return _SOFTPLUS_DIAGONAL.inverse(jnp.tril(scale))


def whitened_conditional(kernel: tfpk.PositiveSemidefiniteKernel, inducing_inputs: Array,
                         inputs: Array, inducing_mean: Array, inducing_scale_tril: Array,
                         jitter: float = 1e-6) -> tuple[Array, Array]:
  """Marginals of ``q(f(x)) = integral p(f(x) | u = L v) q(v) dv`` (zero prior mean).

  With ``L L^T = K(Z, Z) + jitter I`` and ``A = L^{-1} K(Z, x)``::

    mean = A^T m,   variance = k(x, x) - diag(A^T A) + diag(A^T S A),  S = L_S L_S^T

  Args:
    kernel: the GP's kernel.
    inducing_inputs: ``Z``, ``(M, d)``.
    inputs: ``x``, ``(N, d)``.
    inducing_mean: ``m``, ``(M, units)``.
    inducing_scale_tril: ``L_S``, ``(units, M, M)``, lower triangular.
    jitter: added to the diagonal of ``K(Z, Z)`` before its Cholesky factor,
      and the floor of the returned variances.

  Returns:
    ``(mean, variance)``, each ``(N, units)``.
  """
  num_inducing = inducing_inputs.shape[0]
  kzz = kernel.matrix(inducing_inputs, inducing_inputs)
  chol = jnp.linalg.cholesky(kzz + jitter * jnp.eye(num_inducing, dtype=kzz.dtype))
  a = solve_triangular(chol, kernel.matrix(inducing_inputs, inputs), lower=True)  # (M, N)
  mean = a.T @ inducing_mean
  projected = jnp.einsum("umk,mn->ukn", inducing_scale_tril, a)  # L_S^T A, per unit
  variance = (kernel.apply(inputs, inputs)[:, None] - jnp.sum(jnp.square(a), axis=0)[:, None]
              + jnp.sum(jnp.square(projected), axis=1).T)
  return mean, jnp.maximum(variance, jitter)


def whitened_kl(inducing_mean: Array, inducing_scale_tril: Array) -> Array:
  """``sum_units KL(N(m_u, L_u L_u^T) || N(0, I))``, a scalar (TFP's MVN KL), float32 or wider.

  >>> float(whitened_kl(jnp.zeros((3, 2)), jnp.broadcast_to(jnp.eye(3), (2, 3, 3))))
  0.0
  """
  num_inducing = inducing_mean.shape[0]
  q = tfd.MultivariateNormalTriL(inducing_mean.T, inducing_scale_tril)
  p = tfd.MultivariateNormalDiag(jnp.zeros(num_inducing, inducing_mean.dtype))
  kl = jnp.sum(tfd.kl_divergence(q, p))
  return kl.astype(jnp.promote_types(kl.dtype, jnp.float32))


def optimal_variational_distribution(kernel: tfpk.PositiveSemidefiniteKernel,
                                     inducing_inputs: Array, inputs: Array, outputs: Array,
                                     noise_variance: float | Array, jitter: float = 1e-6,
                                     prior_mean: Array | None = None) -> tuple[Array, Array]:
  """The ``q(v)`` maximizing the ELBO under a Gaussian likelihood (Titsias, 2009), whitened.

  With ``A = L^{-1} K(Z, x)`` as in ``whitened_conditional``::

    S = (I + A A^T / noise_variance)^{-1},   m = S A (y - prior_mean) / noise_variance

  Its ELBO is Titsias's collapsed bound; with ``Z = x`` it is the exact log
  marginal likelihood and ``q(f)`` the exact posterior.

  Args:
    kernel: the GP's kernel.
    inducing_inputs: ``Z``, ``(M, d)``.
    inputs: training inputs ``(N, d)``.
    outputs: training outputs ``(N, units)``.
    noise_variance: the Gaussian likelihood's variance.
    jitter: as in ``whitened_conditional``.
    prior_mean: the mean function at ``inputs``, ``(N, units)`` (default 0).

  Returns:
    ``(m, L_S)``: ``(M, units)`` and ``(units, M, M)`` (one ``S``, shared).
  """
  num_inducing = inducing_inputs.shape[0]
  eye = jnp.eye(num_inducing, dtype=inputs.dtype)
  chol = jnp.linalg.cholesky(kernel.matrix(inducing_inputs, inducing_inputs) + jitter * eye)
  a = solve_triangular(chol, kernel.matrix(inducing_inputs, inputs), lower=True)
  covariance = jnp.linalg.inv(eye + a @ a.T / noise_variance)
  covariance = 0.5 * (covariance + covariance.T)
  residual = outputs if prior_mean is None else outputs - prior_mean
  mean = covariance @ a @ residual / noise_variance
  return mean, jnp.broadcast_to(jnp.linalg.cholesky(covariance),
                                (outputs.shape[-1], num_inducing, num_inducing))


def gaussian_expected_log_likelihood(outputs: Array, mean: Array, variance: Array,
                                     noise_variance: float | Array) -> Array:
  """``E_{f ~ N(mean, variance)} log N(outputs | f, noise_variance)``, elementwise.

  ``-log(2 pi noise_variance) / 2 - ((outputs - mean)^2 + variance) / (2 noise_variance)``:
  the ELBO's data term for a Gaussian likelihood, in closed form.

  >>> round(float(gaussian_expected_log_likelihood(0.0, 0.0, 0.0, 1.0)), 4)   # log N(0 | 0, 1)
  -0.9189
  """
  return (-0.5 * jnp.log(2.0 * jnp.pi * noise_variance)
          - 0.5 * (jnp.square(outputs - mean) + variance) / noise_variance)


def fourier_frequencies(key: Array, input_dim: int, num_features: int,
                        dtype: Any = jnp.float32) -> tuple[Array, Array]:
  """Frequencies ``W ~ N(0, 1)`` of shape ``(input_dim, num_features)`` and phases ``U(0, 2 pi)``.

  The squared exponential kernel's spectral density is normal, so
  ``cos`` features at these frequencies approximate it (Bochner's theorem).
  """
  key_w, key_b = jax.random.split(key)
  frequencies = jax.random.normal(key_w, (input_dim, num_features), dtype)
  phases = jax.random.uniform(key_b, (num_features,), dtype, 0.0, 2.0 * jnp.pi)
  return frequencies, phases


def random_fourier_features(inputs: Array, frequencies: Array, phases: Array,
                            amplitude: Array, lengthscale: Array) -> Array:
  """``phi(x) = amplitude sqrt(2 / D) cos((x / lengthscale) W + b)``, shape ``(..., D)``.

  ``phi(x) . phi(x')`` is an unbiased estimate of the squared exponential kernel
  ``amplitude^2 exp(-|x - x'|^2 / (2 lengthscale^2))``, with error ``O(1 / sqrt(D))``.

  >>> w, b = fourier_frequencies(jax.random.key(0), 2, 20000)
  >>> phi = random_fourier_features(jnp.zeros((1, 2)), w, b, 1.0, 1.0)
  >>> round(float((phi @ phi.T)[0, 0]), 1)    # k(x, x) = amplitude^2
  1.0
  """
  num_features = frequencies.shape[-1]
  projection = (inputs / lengthscale) @ frequencies + phases
  return amplitude * math.sqrt(2.0 / num_features) * jnp.cos(projection)


def _input_tensor(module: nn.Module, inputs: Any, deterministic: bool | None) -> Array:
  """The layer's input: a tensor, or one reparameterized sample of a distribution (DSVI)."""
  if not isinstance(inputs, tfd.Distribution):
    return jnp.asarray(inputs)
  if deterministic is None:
    deterministic = module.deterministic
  if deterministic or (module.is_initializing() and not module.has_rng(SAMPLE_RNG)):
    return inputs.mean()
  if not module.has_rng(SAMPLE_RNG):
    raise ValueError(f"{type(module).__name__} {module.name!r} samples its input distribution and "
                     f"needs a '{SAMPLE_RNG}' rng: pass rngs={{'{SAMPLE_RNG}': key}} to apply, or "
                     "deterministic=True to use the input's mean")
  return inputs.sample(seed=module.make_rng(SAMPLE_RNG))


class _Kernelized(nn.Module):
  """Attributes shared by the GP layers: the output size, kernel, mean function.

  Attributes:
    units: output dimensions (one GP, or one variational posterior, each).
    kernel_fn: a TFP kernel class taking ``amplitude`` and ``length_scale``
      (default ``tfpk.ExponentiatedQuadratic``, the squared exponential).
    mean_fn: the prior mean function, ``inputs (..., d) -> (...)`` or
      ``(..., units)``; None is zero. A flax module works too (its
      parameters live where it was created, e.g. in the enclosing model).
    amplitude_init: the kernel amplitude's initial value (trained through
      ``softplus``, as ``raw_amplitude``).
    lengthscale_init: the lengthscale's initial value (``raw_lengthscale``).
    ard: one lengthscale per input feature (automatic relevance
      determination) instead of one for all.
    axes: logical names of the inducing-point (or random-feature) axis and
      of the feature axes (inputs, units).
    param_dtype: dtype of the parameters (and the computation).
  """

  units: int
  kernel_fn: Callable[..., Any] = tfpk.ExponentiatedQuadratic
  mean_fn: MeanFn | None = None
  amplitude_init: float = 1.0
  lengthscale_init: float = 1.0
  ard: bool = False
  axes: tuple[str | None, str | None] = ("mlp", "embed")
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    owner = type(self).__name__
    if not field_checks.is_int(self.units) or self.units < 1:
      raise ValueError(f"{owner}: units={self.units!r} must be a positive int (output dimensions)")
    for name in ("amplitude_init", "lengthscale_init"):
      if not getattr(self, name) > 0:
        raise ValueError(f"{owner}: {name}={getattr(self, name)!r} must be a positive number")
    if len(self.axes) != 2:
      raise ValueError(f"{owner}: axes={self.axes!r} must name two logical axes "
                       "(inducing or feature axis, feature axis), e.g. ('mlp', 'embed')")
    super().__post_init__()

  def _positive(self, name: str, init: float, shape: tuple[int, ...], axes: tuple) -> Array:
    raw = self.param(f"raw_{name}", nn.with_logical_partitioning(
        nn.initializers.constant(_softplus_inverse(init)), axes), shape, self.param_dtype)
    return jax.nn.softplus(raw)

  def _kernel_parameters(self, input_dim: int) -> tuple[Array, Array]:
    amplitude = self._positive("amplitude", self.amplitude_init, (), ())
    shape, axes = ((input_dim,), (self.axes[1],)) if self.ard else ((), ())
    return amplitude, self._positive("lengthscale", self.lengthscale_init, shape, axes)

  def _prior_mean(self, inputs: Array) -> Array:
    """The mean function at ``inputs (..., d)``, as ``(..., units)``."""
    shape = inputs.shape[:-1] + (self.units,)
    if self.mean_fn is None:
      return jnp.zeros(shape, inputs.dtype)
    mean = jnp.asarray(self.mean_fn(inputs))
    if mean.shape == inputs.shape[:-1]:
      mean = mean[..., None]
    if mean.shape not in (shape, inputs.shape[:-1] + (1,)):
      raise ValueError(f"{type(self).__name__} {self.name!r}: mean_fn returned shape {mean.shape}; "
                       f"expected {inputs.shape[:-1]} or {shape} for inputs {inputs.shape}")
    return jnp.broadcast_to(mean, shape)


class GaussianProcess(_Kernelized):
  """Exact GP regression: the posterior predictive at the inputs, one GP per output dimension.

  Example (conditioned on 8 points; the predictive of 3 new ones)::

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.linspace(-1.0, 1.0, 8)[:, None]
    >>> gp = GaussianProcess(units=2, conditional_inputs=x,
    ...                      conditional_outputs=jnp.concatenate([jnp.sin(3 * x), x], -1))
    >>> variables = jax.jit(gp.init)(jax.random.key(0), x)
    >>> sorted(variables['params'])
    ['raw_amplitude', 'raw_lengthscale', 'raw_noise_variance']
    >>> predictive = gp.apply(variables, jnp.zeros((3, 1)))
    >>> tuple(predictive.batch_shape), tuple(predictive.event_shape)
    ((2,), (3,))
    >>> jax.jit(lambda v, x: gp.apply(v, x).mean())(variables, jnp.zeros((3, 1))).shape
    (2, 3)

  Without conditioning data it returns the prior, so (with the default
  ``predict_noisy_outputs=True``) ``log_prob`` of the training outputs
  (transposed to ``(units, N)``) is the log marginal likelihood that trains
  the kernel and the noise variance.

  The returned distribution is a ``tfd.TransformedDistribution``: TFP's
  ``GaussianProcessRegressionModel`` (or ``GaussianProcess``) of the
  zero-mean process, shifted by the mean function at the inputs (evaluated
  here, so it may be a flax module). Its ``batch_shape`` is ``(units,)``, its
  ``event_shape`` ``(N,)``: ``mean()`` is ``(units, N)``.

  Attributes (and those of ``_Kernelized``):
    conditional_inputs: training inputs ``(N_train, d)``, or None; the call's
      argument overrides it.
    conditional_outputs: training outputs ``(N_train, units)``, or None.
    noise_variance_init: the observation noise variance's initial value
      (trained through ``softplus``, as ``raw_noise_variance``).
    predict_noisy_outputs: True: the distribution of noisy outputs
      ``y = f + noise`` at the inputs (the posterior predictive); False: of the
      function values ``f``.
    jitter: added to the diagonal of every covariance before its Cholesky
      factor (TFP's ``jitter``).
  """

  conditional_inputs: Array | None = None
  conditional_outputs: Array | None = None
  noise_variance_init: float = 0.1
  predict_noisy_outputs: bool = True
  jitter: float = 1e-6

  def __post_init__(self):
    if not self.noise_variance_init > 0:
      raise ValueError(f"GaussianProcess: noise_variance_init={self.noise_variance_init!r} must "
                       "be a positive number")
    if not self.jitter >= 0:
      raise ValueError(f"GaussianProcess: jitter={self.jitter!r} must be >= 0")
    super().__post_init__()

  @nn.compact
  def __call__(self, inputs: Array, conditional_inputs: Array | None = None,
               conditional_outputs: Array | None = None) -> tfd.Distribution:
    """The predictive distribution at ``inputs`` ``(N, d)``.

    Args:
      inputs: where to predict, ``(N, d)``.
      conditional_inputs: training inputs (overrides the attribute).
      conditional_outputs: training outputs ``(N_train, units)`` (overrides the attribute).

    Returns:
      The posterior predictive (the prior without conditioning data), batch
      shape ``(units,)``, event shape ``(N,)``.
    """
    owner = f"GaussianProcess {self.name!r}"
    x_train = self.conditional_inputs if conditional_inputs is None else conditional_inputs
    y_train = self.conditional_outputs if conditional_outputs is None else conditional_outputs
    inputs = jnp.asarray(inputs, self.param_dtype)
    if inputs.ndim != 2:
      raise ValueError(f"{owner}: inputs of shape {inputs.shape} must be (N, features)")
    if (x_train is None) != (y_train is None):
      raise ValueError(f"{owner}: give both conditional_inputs and conditional_outputs, or "
                       "neither (the prior)")
    if x_train is not None:
      x_train = jnp.asarray(x_train, self.param_dtype)
      y_train = jnp.asarray(y_train, self.param_dtype)
      if x_train.ndim != 2 or x_train.shape[-1] != inputs.shape[-1]:
        raise ValueError(f"{owner}: conditional_inputs of shape {x_train.shape} must be "
                         f"(N_train, {inputs.shape[-1]}), the inputs' features")
      if y_train.shape != (x_train.shape[0], self.units):
        raise ValueError(f"{owner}: conditional_outputs of shape {y_train.shape} must be "
                         f"{(x_train.shape[0], self.units)}: (N_train, units)")
    amplitude, lengthscale = self._kernel_parameters(inputs.shape[-1])
    noise_variance = self._positive("noise_variance", self.noise_variance_init, (), ())
    kernel = make_kernel(amplitude, lengthscale, self.kernel_fn)
    predictive_noise = noise_variance if self.predict_noisy_outputs else 0.0
    if x_train is None:
      base = tfd.GaussianProcess(kernel, index_points=inputs, jitter=self.jitter,
                                 observation_noise_variance=predictive_noise)
    else:
      centered = y_train - self._prior_mean(x_train)
      base = tfd.GaussianProcessRegressionModel(
          kernel, index_points=inputs, observation_index_points=x_train,
          observations=centered.T, observation_noise_variance=noise_variance,
          predictive_noise_variance=predictive_noise, jitter=self.jitter)
    return tfd.TransformedDistribution(base, tfb.Shift(self._prior_mean(inputs).T))


def _scale_tril_init(diagonal: float) -> Initializer:
  """``(units, M, M)`` raw ``L_S`` parameters whose ``scale_tril`` is ``diagonal * I``."""
  def init(key, shape, dtype=jnp.float32):
    del key
    return jnp.broadcast_to(jnp.eye(shape[-1], dtype=dtype) * _softplus_inverse(diagonal),
                            shape).astype(dtype)
  return init


class SparseGaussianProcess(_Kernelized):
  """Variational GP with ``num_inducing`` inducing points, whitened; KL recorded.

  Example (two stacked layers, a deep GP; the second samples the first's output)::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers import total_kl
    >>> class DeepGP(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     hidden = SparseGaussianProcess(units=3, num_inducing=4, scale_init=1e-3)(x)
    ...     return SparseGaussianProcess(units=1, num_inducing=4)(hidden)
    >>> x = jnp.ones((5, 2))
    >>> variables = jax.jit(DeepGP().init)(jax.random.key(0), x)
    >>> jax.tree.map(jnp.shape, nn.unbox(variables['params']['SparseGaussianProcess_0']))
    {'inducing_inputs': (4, 2), 'inducing_mean': (4, 3), 'inducing_scale_tril': (3, 4, 4), 'raw_amplitude': (), 'raw_lengthscale': ()}
    >>> @jax.jit
    ... def mean_and_kl(variables, key):
    ...   f, state = DeepGP().apply(variables, x, rngs={'sample': key}, mutable=['losses'])
    ...   return f.mean(), total_kl(state)
    >>> mean, kl = mean_and_kl(variables, jax.random.key(1))
    >>> mean.shape, float(kl) > 0.0     # q(v) of the first layer starts narrower than N(0, I)
    ((5, 1), True)

  Parameters: ``inducing_inputs`` ``Z`` ``(M, d)`` (axes ``(axes[0], axes[1])``),
  ``inducing_mean`` ``m`` ``(M, units)``, ``inducing_scale_tril`` ``(units, M, M)``
  (its lower triangle, diagonal through softplus, is ``L_S``; the upper
  triangle is unused), ``raw_amplitude``, ``raw_lengthscale``. The mean
  function is added outside the inducing variables (Salimbeni & Deisenroth's
  convention): ``f(x) = mean_fn(x) + g(x)`` with ``g`` the zero-mean GP.

  Attributes (and those of ``_Kernelized``):
    num_inducing: number of inducing points ``M``.
    inducing_inputs_init: initializer of ``Z`` (default ``N(0, 1)``, for
      standardized inputs; a subset of the training inputs is better).
    scale_init: the initial diagonal of ``L_S`` (1: ``q(v)`` starts at the
      prior, KL 0; about 0.1 for a deep GP's hidden layers, whose samples then
      start nearly deterministic; docs/layers.md on smaller values).
    jitter: added to ``K(Z, Z)``'s diagonal before its Cholesky factor, and the
      floor of the predictive variances.
    deterministic: given a distribution as input, use its mean instead of a
      sample; the call argument overrides it.
  """

  num_inducing: int = 16
  inducing_inputs_init: Initializer = nn.initializers.normal(1.0)
  scale_init: float = 1.0
  jitter: float = 1e-6
  deterministic: bool | None = None

  def __post_init__(self):
    if not isinstance(self.num_inducing, int) or self.num_inducing < 1:
      raise ValueError(f"SparseGaussianProcess: num_inducing={self.num_inducing!r} must be a "
                       "positive int")
    if not self.scale_init > 0:
      raise ValueError(f"SparseGaussianProcess: scale_init={self.scale_init!r} must be a "
                       "positive number (the initial diagonal of L_S)")
    if not self.jitter >= 0:
      raise ValueError(f"SparseGaussianProcess: jitter={self.jitter!r} must be >= 0")
    super().__post_init__()

  @nn.compact
  def __call__(self, inputs: Array | tfd.Distribution,
               deterministic: bool | None = None) -> tfd.Distribution:
    """The marginals of ``q(f)`` at ``inputs``.

    Args:
      inputs: ``(..., d)``, or a distribution over them (one sample is drawn
        from the ``'sample'`` rng, or its mean taken when deterministic).
      deterministic: use an input distribution's mean; overrides the attribute.

    Returns:
      ``tfd.Normal`` of shape ``inputs.shape[:-1] + (units,)``.
    """
    x = _input_tensor(self, inputs, deterministic).astype(self.param_dtype)
    input_dim, (inducing_axis, feature_axis) = x.shape[-1], self.axes
    boxed = nn.with_logical_partitioning
    z = self.param("inducing_inputs", boxed(self.inducing_inputs_init, (inducing_axis,
                                                                         feature_axis)),
                   (self.num_inducing, input_dim), self.param_dtype)
    m = self.param("inducing_mean", boxed(nn.initializers.zeros_init(), (inducing_axis,
                                                                         feature_axis)),
                   (self.num_inducing, self.units), self.param_dtype)
    raw = self.param("inducing_scale_tril", boxed(_scale_tril_init(self.scale_init),
                                                  (feature_axis, inducing_axis, None)),
                     (self.units, self.num_inducing, self.num_inducing), self.param_dtype)
    amplitude, lengthscale = self._kernel_parameters(input_dim)
    l_s = scale_tril(raw)
    if self.is_mutable_collection(KL_COLLECTION) and not self.is_initializing():
      self.sow(KL_COLLECTION, KL_NAME, whitened_kl(m, l_s),
               init_fn=lambda: jnp.zeros((), jnp.float32), reduce_fn=lambda _, new: new)
    flat = x.reshape(-1, input_dim)
    mean, variance = whitened_conditional(make_kernel(amplitude, lengthscale, self.kernel_fn),
                                          z, flat, m, l_s, self.jitter)
    shape = x.shape[:-1] + (self.units,)
    return tfd.Normal((mean + self._prior_mean(flat)).reshape(shape),
                      jnp.sqrt(variance).reshape(shape))


class RandomFourierFeatures(_Kernelized):
  """A GP with the squared exponential kernel in weight space: Bayesian weights on random features.

  ``f(x) = phi(x) w + mean_fn(x)`` with ``phi`` the ``num_features`` random
  Fourier features (``random_fourier_features``) and ``w`` the kernel of a
  Bayesian Dense layer (``dense_class(estimator)``, named ``output``, no
  bias): under its prior ``N(0, 1)`` the function is (approximately) the GP
  prior, and its posterior a GP posterior. Each call draws one weight sample
  (one function); ``deterministic=True`` uses the posterior mean. The Dense
  layer records its KL.

  The frequencies and phases are fixed, not parameters: drawn at every call
  from ``fold_in(key(seed), crc32(the layer's path))``, the same for a layer
  across calls and runs, different between layers; placed like a
  ``(axes[1], axes[0])`` weight (each device draws its shard).

  Example::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> layer = RandomFourierFeatures(units=2, num_features=64, estimator='flipout')
    >>> x = jnp.ones((5, 3))
    >>> variables = jax.jit(layer.init)(jax.random.key(0), x)
    >>> jax.tree.map(jnp.shape, nn.unbox(variables['params']))
    {'output': {'kernel_loc': (64, 2), 'kernel_scale': (64, 2)}, 'raw_amplitude': (), 'raw_lengthscale': ()}
    >>> jax.jit(layer.apply)(variables, x, rngs={'sample': jax.random.key(1)}).shape
    (5, 2)

  Attributes (and those of ``_Kernelized``, whose ``kernel_fn`` must stay the
  squared exponential: the frequencies are its spectral density's):
    num_features: random features ``D``.
    estimator: the output layer's estimator: ``reparameterization``,
      ``flipout`` or ``local_reparameterization``.
    prior: prior of the output weights (default ``N(0, 1)``, the GP's).
    seed: seeds the frequencies.
    deterministic: use the posterior mean weights (and an input
      distribution's mean); the call argument overrides it.
  """

  num_features: int = 1024
  estimator: str = "reparameterization"
  prior: Prior = NormalPrior()
  seed: int = 0
  deterministic: bool | None = None

  def __post_init__(self):
    if not isinstance(self.num_features, int) or self.num_features < 1:
      raise ValueError(f"RandomFourierFeatures: num_features={self.num_features!r} must be a "
                       "positive int")
    bayesian = [e for e in ESTIMATORS if e != "deterministic"]
    if self.estimator not in bayesian:
      raise ValueError(f"RandomFourierFeatures: estimator={self.estimator!r} is not one of "
                       f"{', '.join(bayesian)}")
    if self.kernel_fn is not tfpk.ExponentiatedQuadratic:
      raise ValueError(f"RandomFourierFeatures: kernel_fn={self.kernel_fn!r}; random Fourier "
                       "features here approximate only tfpk.ExponentiatedQuadratic")
    super().__post_init__()

  @nn.compact
  def __call__(self, inputs: Array | tfd.Distribution, deterministic: bool | None = None) -> Array:
    """One function sample (or the posterior mean function) at ``inputs``.

    Args:
      inputs: ``(..., d)``, or a distribution over them (sampled, as in
        ``SparseGaussianProcess``).
      deterministic: use the posterior mean; overrides the attribute.

    Returns:
      ``(..., units)``.
    """
    if deterministic is None:
      deterministic = self.deterministic
    x = _input_tensor(self, inputs, deterministic).astype(self.param_dtype)
    amplitude, lengthscale = self._kernel_parameters(x.shape[-1])
    key = jax.random.fold_in(jax.random.key(self.seed),
                             zlib.crc32("/".join(self.path).encode()))
    frequencies, phases = fourier_frequencies(key, x.shape[-1], self.num_features, x.dtype)
    frequencies = nn.with_logical_constraint(frequencies, (self.axes[1], self.axes[0]))
    features = random_fourier_features(x, frequencies, phases, amplitude, lengthscale)
    output = dense_class(self.estimator)(
        self.units, use_bias=False, kernel_axes=self.axes, prior=self.prior,
        param_dtype=self.param_dtype, name="output")
    return output(features, deterministic=deterministic) + self._prior_mean(x)
