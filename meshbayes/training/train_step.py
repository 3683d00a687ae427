"""The train state, the pure training and evaluation steps, and how the trainer jits
the training step (``jit_train_step``).

``tools/bench.py`` and ``tools/scaling_study.py`` compile the same jitted step;
this module imports no data pipeline, so they do not load TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from flax import traverse_util
from jax.sharding import NamedSharding

from meshbayes.field_checks import positive_ints
from meshbayes.models.base import LOSS, BaseModel, per_loss_unit
from meshbayes.partitioning import Partitioner
from meshbayes.training import ivon as ivon_lib
from meshbayes.training import multi_tensor
from meshbayes.training.ivon import IVON
from meshbayes.training.optimizers import Optimizer
from meshbayes.training.posterior_diagnostics import layer_stddevs

Array = jax.Array
Batch = Mapping[str, Array]

# Parameters whose posterior stddev the trainer reports, by a substring of their path.
STDDEV_GROUPS = {"attention": "attention", "mlp": "mlp"}


@flax.struct.dataclass
class TrainState:
  """Everything a checkpoint holds: the step, the parameters, the optimizer state."""

  step: Array
  params: Any
  opt_state: Any


def init_train_state(model: BaseModel, optimizer: optax.GradientTransformation,
                     input_shapes: Mapping[str, tuple[int, ...]], rng: Array) -> TrainState:
  """A fresh state; its parameters stay boxed so the partitioner can read their axes."""
  params = model.get_initial_variables(rng, input_shapes)["params"]
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(flax.linen.unbox(params)))


def posterior_stddev_metrics(stddevs: Mapping[str, Array]) -> dict[str, Array]:
  """Mean posterior stddev of the weights in each of ``STDDEV_GROUPS``.

  Each group's sum is one reduction per group of layers (``multi_tensor.grouped_sum``).

  Args:
    stddevs: path -> stddevs (``layer_stddevs``, or an IVON posterior's, flattened).
  """
  metrics = {}
  for group, substring in STDDEV_GROUPS.items():
    leaves = {k: v for k, v in stddevs.items() if substring in k}
    if leaves:
      # A Python float: an int count of a giant model's weights overflows int32 under jit.
      metrics[f"posterior_stddev/{group}"] = (multi_tensor.grouped_sum(lambda x: x, leaves)
                                              / float(sum(v.size for v in leaves.values())))
  return metrics


def all_finite(tree: Any) -> Array:
  """Whether every floating-point value in ``tree`` is finite (a scalar).

  Not part of the train step: it reads the whole state (one reduction kernel per array on a
  GPU), so the trainer runs it where it saves a state, and when a loss is not finite.
  """
  checks = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(checks)) if checks else jnp.bool_(True)


def gradients(model: BaseModel, params: Any, batch: Batch, rng: Array, kl_weight: Array,
              num_microbatches: int = 1) -> tuple[Any, dict[str, Array]]:
  """The gradient of the batch's loss and the batch's metrics, computed in microbatches.

  The microbatches' gradients and ``loss_sums`` are summed in float32 and divided
  once by the batch's loss units, so both are the whole batch's however many
  target tokens each microbatch holds. Microbatch ``i`` draws its dropout and
  weight noise from ``fold_in(rng, i)``: the sum is an unbiased estimate of the
  batch's gradient, but not the unsplit step's number (one sample for the batch).

  Args:
    model: the model (its ``loss_sums`` and ``metrics_from_sums``).
    params: the parameters.
    batch: the global batch; its examples are split into ``num_microbatches``
      equal, consecutive parts.
    rng: this step's PRNG key.
    kl_weight: weight of the KL term.
    num_microbatches: how many parts; 1 differentiates ``model.loss_fn`` at once.

  Returns:
    ``(gradient, metrics)``, the gradient in the parameters' dtypes.
  """
  if num_microbatches == 1:
    return jax.grad(model.loss_fn, has_aux=True)(params, batch, rng, kl_weight)
  size = next(iter(batch.values())).shape[0]
  if size % num_microbatches:
    raise ValueError(f"batch of {size} examples cannot be split into num_microbatches="
                     f"{num_microbatches} equal parts")
  micro = jax.tree.map(
      lambda x: x.reshape((num_microbatches, size // num_microbatches) + x.shape[1:]), batch)

  def loss_sum(params, microbatch, rng):
    sums = model.loss_sums(params, microbatch, rng, kl_weight)
    return sums[LOSS], sums

  grad_fn = jax.grad(loss_sum, has_aux=True)

  def accumulate(carry, inputs):
    index, microbatch = inputs
    parts = grad_fn(params, microbatch, jax.random.fold_in(rng, index))
    return jax.tree.map(lambda total, x: total + x.astype(jnp.float32), carry, parts), None

  zero = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro), rng)
  zero = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), zero)
  (grads, sums), _ = jax.lax.scan(accumulate, zero, (jnp.arange(num_microbatches), micro))
  grads = jax.tree.map(lambda g, p: g.astype(p.dtype), per_loss_unit(grads, sums), params)
  return grads, model.metrics_from_sums(sums)


@dataclasses.dataclass(frozen=True)
class StepFunctions:
  """The model's training and evaluation steps.

  Attributes:
    model: the model (its ``loss_fn`` and ``eval_fn``).
    optimizer: the optax transformation.
    learning_rate: step -> learning rate (reported only).
    kl_weight: step -> weight of the KL term.
    seed: the run's seed; step ``s`` uses ``fold_in(key(seed), s)``, split by
      the model into ``'dropout'`` and ``'sample'`` streams.
    num_microbatches: split each batch into this many microbatches and
      accumulate their gradients (float32), for batches that do not fit at
      once (``gradients``).
    ivon: IVON's settings (``ess`` set) when ``optimizer`` is its
      transformation: gradients are then taken at ``mc_samples`` weight
      samples drawn from its state, and it updates from their statistics.
  """

  model: BaseModel
  optimizer: optax.GradientTransformation
  learning_rate: Callable[[Array], Array]
  kl_weight: Callable[[Array], Array]
  seed: int = 0
  num_microbatches: int = 1
  ivon: IVON | None = None

  def __post_init__(self):
    positive_ints("StepFunctions", self, "num_microbatches")

  @classmethod
  def build(cls, model: BaseModel, optimizer: Optimizer, kl_weight: Callable[[Array], Array],
            seed: int = 0, num_microbatches: int = 1) -> StepFunctions:
    """The steps of ``model`` under ``optimizer``'s settings, as the trainer runs them.

    IVON's ``ess`` defaults to the model's ``num_train_units``.

    Raises:
      ValueError: IVON with a Bayesian-layer model (two posteriors over the same
        weights), or no ``ess`` to be had.
    """
    if optimizer.ivon is not None:
      if model.is_bayesian:
        raise ValueError("train: optimizers.Optimizer.name='ivon' learns a posterior over a "
                         "deterministic model's weights, but this model has Bayesian layers; "
                         "set every estimator to 'deterministic' (models/deterministic.gin) "
                         "or use another optimizer")
      units = getattr(model, "num_train_units", None)
      if optimizer.ivon.ess is None and units is None:
        raise ValueError(f"train: IVON needs ess: set optimizers.IVON.ess (the model "
                         f"{type(model).__name__} has no num_train_units to take it from)")
      optimizer = optimizer.with_ess(units)
    return cls(model=model, optimizer=optimizer.transformation(seed=seed),
               learning_rate=optimizer.learning_rate, kl_weight=kl_weight, seed=seed,
               num_microbatches=num_microbatches, ivon=optimizer.ivon)

  def train_step(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, Array]]:
    """One optimizer step on a global batch; returns the new state and scalar metrics."""
    rng = jax.random.fold_in(jax.random.key(self.seed), state.step)
    kl_weight = self.kl_weight(state.step)
    if self.ivon is None:
      grads, metrics = gradients(self.model, state.params, batch, rng, kl_weight,
                                 self.num_microbatches)
      updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
    else:
      statistics, metrics = self._ivon_statistics(state, batch, rng, kl_weight)
      grads = jax.tree.map(lambda g: g / statistics.count, statistics.grad)
      updates, opt_state = self.optimizer.update(statistics, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    # The clipping's norm, computed the same way: XLA computes it once.
    metrics = dict(metrics, gradient_norm=multi_tensor.global_norm(grads),
                   learning_rate=self.learning_rate(state.step),
                   **posterior_stddev_metrics(self.posterior_stddevs(params, opt_state)))
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  def posterior_stddevs(self, params: Any, opt_state: Any) -> dict[str, Array]:
    """The posterior's stddevs by ``/``-joined path: the Bayesian layers' or IVON's (none
    for a deterministic model trained otherwise)."""
    if self.ivon is None:
      return layer_stddevs(params)
    return traverse_util.flatten_dict(self.ivon.posterior_stddev(opt_state), sep="/")

  def _ivon_statistics(self, state: TrainState, batch: Batch, rng: Array, kl_weight: Array
                       ) -> tuple[ivon_lib.GradientStatistics, dict[str, Array]]:
    """IVON's gradient statistics at ``mc_samples`` weight samples, and their mean metrics.

    Sample ``i`` perturbs the weights by ``ivon.noise(state, i)`` and draws
    its dropout from ``fold_in(rng, i)``; the samples run one after another
    (one perturbed copy of the weights in memory).
    """
    config = self.ivon

    def one_sample(index):
      noise = config.noise(state.opt_state, index)
      grads, metrics = gradients(self.model, ivon_lib.perturb(state.params, noise), batch,
                                 jax.random.fold_in(rng, index), kl_weight,
                                 self.num_microbatches)
      return noise, grads, metrics

    zero = ivon_lib.zero_statistics(state.params)
    if config.mc_samples == 1:
      noise, grads, metrics = one_sample(0)
      return ivon_lib.accumulate(zero, grads, noise), metrics

    def body(index, carry):
      statistics, metric_sums = carry
      noise, grads, metrics = one_sample(index)
      return (ivon_lib.accumulate(statistics, grads, noise),
              jax.tree.map(jnp.add, metric_sums, metrics))

    zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                jax.eval_shape(lambda: one_sample(0)[2]))
    statistics, metric_sums = jax.lax.fori_loop(0, config.mc_samples, body,
                                                (zero, zero_metrics))
    return statistics, jax.tree.map(lambda m: m / config.mc_samples, metric_sums)

  def eval_step(self, params: Any, batch: Batch) -> dict[str, Array]:
    """Teacher-forced evaluation metrics of one batch."""
    return self.model.eval_fn(params, batch)[1]


def abstract_state(model: BaseModel, steps: StepFunctions, shapes: Mapping[str, tuple[int, ...]]
                   ) -> TrainState:
  """The train state's shapes with boxed parameters (their logical axes)."""
  return jax.eval_shape(lambda k: init_train_state(model, steps.optimizer, shapes, k),
                        jax.random.key(0))


def jit_train_step(steps: StepFunctions, partitioner: Partitioner, state_shardings: Any):
  """The jitted train step: explicit in/out shardings, the old state's buffers donated.

  Call and lower it inside ``partitioner.activation_rules()``.
  """
  batch = NamedSharding(partitioner.mesh, partitioner.batch_spec)
  return jax.jit(steps.train_step, in_shardings=(state_shardings, batch),
                 out_shardings=(state_shardings, None), donate_argnums=(0,))
