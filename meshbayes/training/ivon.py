"""IVON: variational learning with an Adam-like optimizer (Shen et al., ICML 2024).

A diagonal Gaussian posterior over a deterministic model's weights: the mean is the
parameter, the stddev ``1 / sqrt(ess * (h + weight_decay))`` comes from a Hessian
estimate ``h``. ``IVON.transformation``'s ``update`` takes ``GradientStatistics``
(gradients at ``perturb(params, IVON.noise(state, i))``, ``accumulate``d), not
gradients, so it is used alone, not in ``optax.chain``; ``IVON.posterior`` is the
result. The update, its noise and a train step: docs/training.md. A checkpoint of an
IVON run records ``IVON_META``; ``checkpoint_state`` and ``checkpoint_posterior`` restore
its posterior (registered in ``meshbayes.training.run_posteriors``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from meshbayes.layers.weight_posterior import WeightPosterior, perturb, scaled_normal

Array = jax.Array
LearningRate = float | Callable[[Array], Array]

_NOISE_STREAM = 0x49564F4E  # "IVON": keeps this stream apart from the trainer's fold_in(seed, step)
# The checkpoint meta key of an IVON run's ess and weight_decay: with the saved
# optimizer state they give the posterior (``checkpoint_posterior``).
IVON_META = "ivon"


class IVONState(NamedTuple):
  """IVON's optimizer state; ``momentum`` and ``hessian`` mirror the params (float32).

  ``seed`` and ``count`` are scalars (replicated); the step's noise key is
  derived from them, so a checkpoint of the state resumes the noise exactly.
  """

  count: Array
  seed: Array
  momentum: Any
  hessian: Any


class GradientStatistics(NamedTuple):
  """Sums over Monte Carlo samples of ``g`` and ``eps * g`` (float32), and their number."""

  grad: Any
  noise_grad: Any
  count: Array


def zero_statistics(params: Any) -> GradientStatistics:
  """Empty statistics for ``accumulate``."""
  zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
  return GradientStatistics(grad=zeros, noise_grad=zeros, count=jnp.zeros((), jnp.float32))


def accumulate(stats: GradientStatistics, grads: Any, noise: Any) -> GradientStatistics:
  """Adds one sample's gradient ``g`` (taken at ``perturb(params, noise)``) and ``noise * g``."""
  grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
  return GradientStatistics(
      grad=jax.tree.map(jnp.add, stats.grad, grads),
      noise_grad=jax.tree.map(lambda s, g, n: s + n * g, stats.noise_grad, grads, noise),
      count=stats.count + 1)


def posterior_stddev(hessian: Any, ess: float, weight_decay: float) -> Any:
  """``1 / sqrt(ess * (h + weight_decay))`` for each leaf of the Hessian estimate (float32).

  With the ``ess`` and ``weight_decay`` a checkpoint's meta records, its saved
  ``opt_state['hessian']`` gives the posterior: ``WeightPosterior(params, stddev)``.
  """
  return jax.tree.map(lambda h: jax.lax.rsqrt(ess * (h + weight_decay)), hessian)


def checkpoint_state(params: Any, record: dict[str, Any]) -> dict[str, Any]:
  """The checkpoint subtree IVON's posterior is built from besides ``params`` (shapes):
  the optimizer state's Hessian estimate, float32 like the params' tree."""
  del record
  return {"opt_state": {"hessian": jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), params)}}


def checkpoint_posterior(restored: dict[str, Any], record: dict[str, Any]
                         ) -> WeightPosterior:
  """The posterior of a restored IVON checkpoint (``checkpoint_state``'s subtree and
  ``params``), ``record`` its meta's ``IVON_META`` entry (``ess``, ``weight_decay``)."""
  stddev = jax.jit(posterior_stddev, static_argnums=(1, 2))(
      restored["opt_state"]["hessian"], float(record["ess"]), float(record["weight_decay"]))
  return WeightPosterior(restored["params"], stddev)


def check_deterministic(params: Any) -> None:
  """Raises if ``params`` hold Bayesian-layer posteriors: IVON's posterior would count twice.

  Raises:
    ValueError: naming the first ``*_loc`` or ``*_scale`` parameter.
  """
  for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = str(getattr(path[-1], "key", path[-1])) if path else ""
    if name.endswith(("_loc", "_scale")):
      raise ValueError(f"IVON: parameter {jax.tree_util.keystr(path)} belongs to a Bayesian "
                       "layer; IVON learns the posterior of a deterministic model's weights, "
                       "so use deterministic layers (estimator 'deterministic') or another "
                       "optimizer")


@dataclasses.dataclass(frozen=True)
class IVON:
  """IVON's hyperparameters (names and defaults of the authors' ``ivon-opt`` 0.1.3).

  Attributes:
    ess: effective sample size ``lambda``; None: the number of training units,
      filled in by ``with_ess`` (the trainer's ``num_train_units``).
    hess_init: initial Hessian estimate ``h`` (the initial posterior stddev is
      ``1 / sqrt(ess * (hess_init + weight_decay))``).
    beta1: momentum decay.
    beta2: Hessian decay (close to 1: ``h_hat`` is a one-sample estimate).
    weight_decay: ``delta``; the prior precision is ``weight_decay * ess``.
    clip_radius: elementwise clipping of the preconditioned step (inf: none).
    mc_samples: weight samples (gradients) per step; the train step draws them.
  """

  ess: float | None = None
  hess_init: float = 1.0
  beta1: float = 0.9
  beta2: float = 0.99999
  weight_decay: float = 1e-4
  clip_radius: float = math.inf
  mc_samples: int = 1

  def __post_init__(self):
    checks = (
        ("ess", self.ess is None or self.ess > 0, "> 0 (or None: the training set's units)"),
        ("hess_init", self.hess_init > 0, "> 0"),
        ("beta1", 0 <= self.beta1 < 1, "in [0, 1)"),
        ("beta2", 0 <= self.beta2 < 1, "in [0, 1)"),
        ("weight_decay", self.weight_decay > 0, "> 0 (the prior precision / ess)"),
        ("clip_radius", self.clip_radius > 0, "> 0 (inf: no clipping)"),
        ("mc_samples", isinstance(self.mc_samples, int) and self.mc_samples >= 1, "an int >= 1"),
    )
    for name, ok, valid in checks:
      if not ok:
        raise ValueError(f"IVON: {name}={getattr(self, name)!r} must be {valid}")

  def with_ess(self, num_train_units: float) -> IVON:
    """This config with ``ess`` set to ``num_train_units`` unless it was given."""
    return self if self.ess is not None else dataclasses.replace(self, ess=num_train_units)

  def _ess(self) -> float:
    if self.ess is None:
      raise ValueError("IVON: ess is unset; give IVON.ess or call with_ess(num_train_units)")
    return self.ess

  def posterior_stddev(self, state: IVONState) -> Any:
    """``1 / sqrt(ess * (h + weight_decay))`` per weight (float32)."""
    return posterior_stddev(state.hessian, self._ess(), self.weight_decay)

  def posterior(self, params: Any, state: IVONState) -> WeightPosterior:
    """The posterior: mean ``params``, stddev ``posterior_stddev(state)``; evaluation takes
    it in place of ``params`` (``meshbayes.layers.weight_posterior``)."""
    return WeightPosterior(mean=params, stddev=self.posterior_stddev(state))

  def noise(self, state: IVONState, sample_index: int | Array) -> Any:
    """This step's ``eps`` for Monte Carlo sample ``sample_index`` (float32, like the params).

    A pure function of the state and the index (no key to pass or store): a
    run resumed from a checkpoint of the state draws the same noise.
    """
    key = jax.random.fold_in(jax.random.key(state.seed), _NOISE_STREAM)
    key = jax.random.fold_in(jax.random.fold_in(key, state.count), sample_index)
    return scaled_normal(key, self.posterior_stddev(state))

  def transformation(self, learning_rate: LearningRate, clip_gradient_norm: float = 0.0,
                     seed: int = 0) -> optax.GradientTransformation:
    """The optax transformation; ``update`` takes ``GradientStatistics``, not gradients.

    Args:
      learning_rate: a float or a schedule of the step (``optimizers.LearningRate``).
      clip_gradient_norm: clip the mean gradient's global norm (0: no clipping).
      seed: the noise seed, kept in the state.
    """
    ess = self._ess()
    schedule = learning_rate if callable(learning_rate) else (lambda _: learning_rate)
    wd, b1, b2 = self.weight_decay, self.beta1, self.beta2

    def init(params: Any) -> IVONState:
      check_deterministic(params)
      return IVONState(
          count=jnp.zeros((), jnp.int32), seed=jnp.asarray(seed, jnp.int32),
          momentum=jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params),
          hessian=jax.tree.map(lambda p: jnp.full(p.shape, self.hess_init, jnp.float32), params))

    def update(stats: GradientStatistics, state: IVONState, params: Any
               ) -> tuple[Any, IVONState]:
      if params is None:
        raise ValueError("IVON: update needs the params (the posterior mean)")
      grad = jax.tree.map(lambda s: s / stats.count, stats.grad)
      noise_grad = jax.tree.map(lambda s: s / stats.count, stats.noise_grad)
      if clip_gradient_norm:
        scale = jnp.minimum(1.0, clip_gradient_norm / (optax.tree.norm(grad) + 1e-12))
        grad, noise_grad = jax.tree.map(lambda x: x * scale, (grad, noise_grad))
      count = state.count + 1
      debias = 1.0 - b1 ** count.astype(jnp.float32)
      lr = schedule(state.count)

      def leaf(p, g, eps_g, m, h):
        h_hat = ess * eps_g * (h + wd)
        m = b1 * m + (1.0 - b1) * g
        h = b2 * h + (1.0 - b2) * h_hat + 0.5 * (1.0 - b2) ** 2 * (h - h_hat) ** 2 / (h + wd)
        step = jnp.clip((m / debias + wd * p.astype(jnp.float32)) / (h + wd),
                        -self.clip_radius, self.clip_radius)
        return (-lr * step).astype(p.dtype), m, h

      out = jax.tree.map(leaf, params, grad, noise_grad, state.momentum, state.hessian)
      updates, momentum, hessian = (jax.tree.map(lambda _, o: o[i], params, out)
                                    for i in range(3))
      return updates, IVONState(count=count, seed=state.seed, momentum=momentum, hessian=hessian)

    return optax.GradientTransformation(init, update)
