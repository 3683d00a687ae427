"""Last-layer Laplace approximation: a diagonal Gaussian over the output projection's
kernel ``W`` around the trained weights, every other weight held.

``precision = ggn_scale * GGN + alpha`` (the GGN of the summed training NLL, exact here:
the logits are linear in ``W``), ``stddev = 1 / sqrt(precision)``. Batches' sums add
(``add_softmax_batch``); ``select_prior_precision`` picks ``alpha`` on validation NLL;
``LastLayerPosterior`` is a ``layers.posteriors.Posterior``; ``fit`` builds the ``laplace``
predictive method's posterior for a trained Transformer.

>>> features = jnp.array([[1.0, 2.0]])  # one token, d = 2
>>> logits = jnp.zeros((1, 2))          # V = 2: p = (1/2, 1/2), p (1 - p) = 1/4
>>> ggn = diagonal_ggn_softmax(features, logits)
>>> ggn.tolist()
[[0.25, 0.25], [1.0, 1.0]]
>>> diagonal_posterior_precision(ggn, prior_precision=3.0).tolist()
[[3.25, 3.25], [4.0, 4.0]]
>>> stddev = diagonal_posterior_stddev(ggn, prior_precision=3.0)
>>> bool(jnp.allclose(stddev, 1 / jnp.sqrt(ggn + 3.0)))
True
>>> posterior = LastLayerPosterior({'body': jnp.ones(3), 'out': jnp.ones((2, 2))},
...                                jnp.full((2, 2), 0.5), ('out',))
>>> member = posterior.sample(jax.random.key(0))
>>> member['body'].tolist(), bool(jnp.all(member['out'] != 1.0))
([1.0, 1.0, 1.0], True)
>>> select_prior_precision(lambda alpha: (np.log10(alpha) - 1.0) ** 2).prior_precision
10.0
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Hashable, Iterable
from typing import Any, NamedTuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from meshbayes.layers import holds_posterior
from meshbayes.layers.estimators import standard_normal
from meshbayes.layers.posteriors import register_kind
from meshbayes.layers.weight_posterior import (drawn_member_keys, drawn_num_members,
                                               weights_only)

Array = jax.Array

# 10^-4 ... 10^4, two values a decade: the grid ``select_prior_precision`` searches.
DEFAULT_PRIOR_PRECISIONS: tuple[float, ...] = tuple(float(x) for x in np.logspace(-4, 4, 17))


def _float_dtype(*arrays: Any) -> jnp.dtype:
  """float32 for low-precision inputs, float64 for float64 ones (under x64)."""
  return jnp.promote_types(jnp.result_type(*arrays), jnp.float32)


def _token_weights(name: str, features: Array, outputs: Array | None, mask: Array | None,
                   dtype: jnp.dtype) -> Array:
  """``mask`` (ones without one) as ``dtype``, after checking the three shapes agree."""
  tokens = features.shape[:-1]
  if outputs is not None and outputs.shape[:-1] != tokens:
    raise ValueError(f"{name}: features {features.shape} and logits {outputs.shape} must "
                     "agree on every axis but the last")
  if mask is None:
    return jnp.ones(tokens, dtype)
  if jnp.shape(mask) != tokens:
    raise ValueError(f"{name}: mask {jnp.shape(mask)} must have the features' leading shape "
                     f"{tokens}")
  return jnp.asarray(mask).astype(dtype)


def diagonal_ggn_softmax(features: Array, logits: Array, mask: Array | None = None) -> Array:
  """The diagonal of the GGN (= Hessian) of the summed softmax cross-entropy wrt ``W``.

  Args:
    features: ``(..., d)`` inputs ``h`` of the output projection ``logits = h @ W``.
    logits: ``(..., V)`` its outputs at the trained ``W`` (``log(probs)`` does as well:
      only their softmax is used).
    mask: ``(...)`` each token's loss weight (0 at padding); None: every token counts once.

  Returns:
    ``(d, V)``: ``sum_i mask_i h_ij^2 p_iv (1 - p_iv)``, float32 (float64 for float64
    inputs). The targets do not enter: the GGN of cross-entropy does not depend on them.
  """
  dtype = _float_dtype(features, logits)
  weights = _token_weights("diagonal_ggn_softmax", features, logits, mask, dtype)
  probs = jax.nn.softmax(logits.astype(dtype), axis=-1)
  curvature = (probs * (1 - probs) * weights[..., None]).reshape(-1, logits.shape[-1])
  squares = jnp.square(features.astype(dtype)).reshape(-1, features.shape[-1])
  return jnp.matmul(squares.T, curvature, precision=jax.lax.Precision.HIGHEST)


class GGNSums(NamedTuple):
  """Running sums over batches: the diagonal GGN ``(d, V)`` and the tokens' total weight
  (the data size, for ``ggn_scale``)."""

  diagonal: Array
  total_weight: Array


def zero_ggn_sums(num_features: int, num_outputs: int, dtype: Any = jnp.float32) -> GGNSums:
  """Sums before the first batch."""
  return GGNSums(jnp.zeros((num_features, num_outputs), dtype), jnp.zeros((), dtype))


def add_softmax_batch(sums: GGNSums, features: Array, logits: Array,
                      mask: Array | None = None) -> GGNSums:
  """``sums`` with one more batch added (arguments as ``diagonal_ggn_softmax``'s); adding
  batches one by one equals taking them all as one batch."""
  dtype = _float_dtype(features, logits)
  weights = _token_weights("add_softmax_batch", features, logits, mask, dtype)
  batch = diagonal_ggn_softmax(features, logits, mask)
  return GGNSums(sums.diagonal + batch.astype(sums.diagonal.dtype),
                 sums.total_weight + jnp.sum(weights).astype(sums.total_weight.dtype))


def gaussian_ggn(features: Array, noise_variance: float | Array,
                 mask: Array | None = None) -> Array:
  """``H^T diag(mask) H / sigma^2`` ``(d, d)``: the Hessian of the summed Gaussian NLL of
  ``y = h @ W + noise`` wrt each output column of ``W`` (the columns are independent).

  Args:
    features: ``(..., d)`` inputs ``h``.
    noise_variance: ``sigma^2``, the likelihood's variance.
    mask: ``(...)`` each row's weight; None: every row counts once.
  """
  dtype = _float_dtype(features, noise_variance)
  weights = _token_weights("gaussian_ggn", features, None, mask, dtype).reshape(-1)
  rows = features.astype(dtype).reshape(-1, features.shape[-1])
  return jnp.matmul(rows.T * weights, rows, precision=jax.lax.Precision.HIGHEST) / noise_variance


def diagonal_ggn_gaussian(features: Array, noise_variance: float | Array, num_outputs: int,
                          mask: Array | None = None) -> Array:
  """The diagonal of ``gaussian_ggn`` for each of ``num_outputs`` columns: ``(d, V)``."""
  dtype = _float_dtype(features, noise_variance)
  weights = _token_weights("diagonal_ggn_gaussian", features, None, mask, dtype)
  column = jnp.einsum("...j,...->j", jnp.square(features.astype(dtype)), weights,
                      precision=jax.lax.Precision.HIGHEST) / noise_variance
  return jnp.broadcast_to(column[:, None], (features.shape[-1], num_outputs))


def _check_positive(name: str, argument: str, value: Any) -> None:
  """A one-line ValueError for a concrete ``value`` that is not positive and finite (a
  traced one passes unchecked)."""
  if isinstance(value, jax.core.Tracer):
    return
  if isinstance(value, bool) or not np.all(np.isfinite(value)) or not np.all(np.asarray(value) > 0):
    shown = repr(value) if np.ndim(value) == 0 else f"an array {np.shape(value)} with a value"
    raise ValueError(f"{name}: {argument}={shown} must be positive and finite")


def diagonal_posterior_precision(ggn_diagonal: Array, prior_precision: float | Array,
                                 ggn_scale: float | Array = 1.0) -> Array:
  """``ggn_scale * ggn_diagonal + prior_precision``, elementwise.

  Args:
    ggn_diagonal: the GGN's diagonal, any shape (a ``(d, V)`` kernel's).
    prior_precision: ``alpha``, the prior ``N(0, 1 / alpha)``'s precision (positive).
    ggn_scale: training-set size over the size the GGN was summed over (positive).
  """
  _check_positive("diagonal_posterior_precision", "prior_precision", prior_precision)
  _check_positive("diagonal_posterior_precision", "ggn_scale", ggn_scale)
  return ggn_scale * ggn_diagonal + prior_precision


def diagonal_posterior_stddev(ggn_diagonal: Array, prior_precision: float | Array,
                              ggn_scale: float | Array = 1.0) -> Array:
  """``1 / sqrt(diagonal_posterior_precision(...))``: the diagonal Laplace's stddev."""
  return jax.lax.rsqrt(diagonal_posterior_precision(ggn_diagonal, prior_precision, ggn_scale))


def full_posterior_precision(ggn: Array, prior_precision: float | Array,
                             ggn_scale: float | Array = 1.0) -> Array:
  """``ggn_scale * ggn + prior_precision * I`` for a square ``(n, n)`` GGN."""
  _check_positive("full_posterior_precision", "prior_precision", prior_precision)
  _check_positive("full_posterior_precision", "ggn_scale", ggn_scale)
  if ggn.ndim != 2 or ggn.shape[0] != ggn.shape[1]:
    raise ValueError(f"full_posterior_precision: ggn {ggn.shape} must be a square matrix")
  return ggn_scale * ggn + prior_precision * jnp.eye(ggn.shape[0], dtype=ggn.dtype)


def full_posterior_covariance(ggn: Array, prior_precision: float | Array,
                              ggn_scale: float | Array = 1.0) -> Array:
  """The inverse of ``full_posterior_precision(...)`` (by its Cholesky factor)."""
  precision = full_posterior_precision(ggn, prior_precision, ggn_scale)
  factor = jax.scipy.linalg.cho_factor(precision, lower=True)
  return jax.scipy.linalg.cho_solve(factor, jnp.eye(ggn.shape[0], dtype=precision.dtype))


class PriorPrecisionChoice(NamedTuple):
  """The chosen prior precision and each candidate's validation NLL, ``(alpha, nll)``
  pairs in increasing ``alpha``."""

  prior_precision: float
  validation_nlls: tuple[tuple[float, float], ...]


def select_prior_precision(validation_nll: Callable[[float], float],
                           grid: Iterable[float] = DEFAULT_PRIOR_PRECISIONS
                           ) -> PriorPrecisionChoice:
  """The prior precision of least validation NLL on ``grid``.

  ``validation_nll`` runs once per distinct grid value, in increasing order; a tie goes
  to the larger precision (the narrower posterior), a NaN NLL loses to any number.

  Args:
    validation_nll: ``alpha -> NLL`` of the posterior with prior precision ``alpha``.
    grid: candidate precisions, each positive and finite (default 10^-4 ... 10^4).

  Raises:
    ValueError: an empty grid, a grid value not positive and finite, or no candidate
      whose NLL is a number.
  """
  values = list(grid)
  if not values:
    raise ValueError("select_prior_precision: the grid of prior precisions is empty")
  for value in values:
    if (isinstance(value, bool) or not isinstance(value, (int, float, np.number))
        or not math.isfinite(value) or value <= 0):
      raise ValueError(f"select_prior_precision: grid value {value!r} must be a positive, "
                       "finite number")
  nlls, best, best_nll = [], None, math.inf
  for alpha in sorted({float(value) for value in values}):
    nll = float(validation_nll(alpha))
    nlls.append((alpha, nll))
    if nll <= best_nll:
      best, best_nll = alpha, nll
  if best is None:
    raise ValueError(f"select_prior_precision: validation_nll gave no number on the grid: "
                     f"{nlls!r}")
  return PriorPrecisionChoice(best, tuple(nlls))


@register_kind
@flax.struct.dataclass
class LastLayerPosterior:
  """``N(params[path], stddev^2)`` over one parameter, every other held at ``params``.

  Attributes:
    params: the trained weights (the posterior mean).
    stddev: the layer's stddev, the shape of ``params`` at ``path``.
    path: the keys leading to the layer's parameter.
  """

  params: Any
  stddev: Array
  path: tuple[Hashable, ...] = flax.struct.field(pytree_node=False)

  external = True
  has_mean = True

  def mean_weights(self) -> Any:
    return self.params

  def sample(self, key: Array) -> Any:
    flat = traverse_util.flatten_dict(dict(self.params))
    weight = flat[self.path]
    noise = self.stddev * standard_normal(key, weight.shape)
    flat[self.path] = (weight.astype(jnp.float32) + noise).astype(weight.dtype)
    return traverse_util.unflatten_dict(flat)

  member_keys = drawn_member_keys
  num_members = drawn_num_members
  apply_options = weights_only

  def sampled_axes(self) -> Any:
    flat = traverse_util.flatten_dict(dict(self.params))
    return traverse_util.unflatten_dict({p: 0 if p == self.path else None for p in flat})

  def stacked(self, keys: Array) -> Any:
    return jax.vmap(self.sample, out_axes=self.sampled_axes())(keys)


# The encoder-decoder Transformer's output projection and the module whose output feeds it
# (models/transformer/network.py: the final norm; the dropout after it is off at evaluation).
OUTPUT_KERNEL = ("decoder", "logits_dense", "kernel")
FEATURES_MODULE = "decoder_norm"
# Prior precisions tried on validation: 10^-2 ... 10^8, one a decade. With a vocabulary of
# thousands, most output columns have almost no curvature: their stddev is the prior's,
# 1 / sqrt(alpha), so the useful precisions are large (Tatoeba's demo: 10^4 and up).
EVALUATION_PRIOR_PRECISIONS = tuple(float(x) for x in np.logspace(-2, 8, 11))


def _check_fittable(model: Any, params: Any) -> None:
  config = getattr(model, "config", None)
  if model.is_bayesian or holds_posterior(params) or getattr(config, "logits_via_embedding",
                                                            False):
    raise ValueError("laplace: needs a deterministic run with its own output projection "
                     "(not Bayesian or IVON, logits_via_embedding=False)")
  if OUTPUT_KERNEL not in traverse_util.flatten_dict(dict(params)):
    raise ValueError(f"laplace: the run has no output kernel at {OUTPUT_KERNEL!r}")


def curvature(model: Any, params: Any, batches: Iterable[dict[str, np.ndarray]],
              partitioner: Any) -> GGNSums:
  """The diagonal GGN of the summed NLL wrt the output kernel over ``batches``."""
  kernel = traverse_util.flatten_dict(dict(params))[OUTPUT_KERNEL]

  @jax.jit
  def add(params: Any, sums: GGNSums, batch: dict[str, Array]) -> GGNSums:
    logits, state = model.module.apply(
        {"params": params}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
        batch["decoder_target_tokens"], deterministic=True, mutable=["intermediates"],
        capture_intermediates=lambda module, _: module.name == FEATURES_MODULE)
    features = state["intermediates"]["decoder"][FEATURES_MODULE]["__call__"][0]
    return add_softmax_batch(sums, features, logits, batch["decoder_loss_weights"])

  sums = zero_ggn_sums(*kernel.shape)
  with partitioner.activation_rules():
    for batch in batches:
      sums = add(params, sums, partitioner.global_batch(batch))
  return sums


def fit(model: Any, params: Any, inputs: Any) -> tuple[Any, LastLayerPosterior]:
  """The ``laplace`` predictive method's posterior for a trained deterministic run.

  The curvature is summed over the training split's first ``max_eval_batches`` batches
  and scaled to the whole split's tokens; the prior precision is the one of
  ``EVALUATION_PRIOR_PRECISIONS`` whose model average over ``inputs.num_samples`` members
  has the least teacher-forced NLL on the validation split.

  Args:
    model: the run's encoder-decoder model.
    params: its trained parameters.
    inputs: ``evaluation.methods.MethodInputs`` (its ``context``: the evaluation's data,
      partitioner and seed).
  """
  _check_fittable(model, params)
  if inputs.num_samples < 1:
    raise ValueError(f"laplace: needs num_samples > 0, not {inputs.num_samples}")
  from meshbayes.data.pipeline import train_set_size  # the data layer loads TensorFlow

  data, partitioner = inputs.context.data, inputs.context.partitioner
  layout = partitioner.data_layout(data.batch_size)
  sums = curvature(model, params, data.eval_batches(layout, "train"), partitioner)
  train_tokens = train_set_size(data.task, data.feature_lengths, "tokens")
  scale = train_tokens / max(float(sums.total_weight), 1.0)
  validation = list(data.eval_batches(layout, "validation"))
  rng = jax.random.key(inputs.context.seed)

  @jax.jit
  def nll_sums(params: Any, diagonal: Array, alpha: Array, batch: dict[str, Array],
               key: Array) -> tuple[Array, Array]:
    stddev = diagonal_posterior_stddev(diagonal, alpha, scale)
    posterior = LastLayerPosterior(params, stddev, OUTPUT_KERNEL)
    log_probs, _ = model.score_batch(posterior, batch, key, num_samples=inputs.num_samples)
    return -jnp.sum(log_probs), jnp.sum(batch["decoder_loss_weights"])

  def validation_nll(alpha: float) -> float:
    total, tokens = 0.0, 0.0
    with partitioner.activation_rules():
      for i, batch in enumerate(validation):
        nll, count = nll_sums(params, sums.diagonal, jnp.float32(alpha),
                              partitioner.global_batch(batch),
                              jax.random.fold_in(rng, i))
        total, tokens = total + float(nll), tokens + float(count)
    return total / max(tokens, 1.0)

  choice = select_prior_precision(validation_nll, EVALUATION_PRIOR_PRECISIONS)
  print("laplace: prior precision {:g} (validation NLL per token {})".format(
      choice.prior_precision, ", ".join(f"{a:g}: {n:.4f}" for a, n in choice.validation_nlls)),
      file=sys.stderr, flush=True)
  if choice.prior_precision in (min(EVALUATION_PRIOR_PRECISIONS),
                                max(EVALUATION_PRIOR_PRECISIONS)):
    print(f"warning: laplace: the prior precision chosen, {choice.prior_precision:g}, is at the "
          "edge of the grid searched", file=sys.stderr, flush=True)
  stddev = diagonal_posterior_stddev(sums.diagonal, choice.prior_precision, scale)
  return model, LastLayerPosterior(params, stddev, OUTPUT_KERNEL)
