"""Optimizers, learning-rate schedules and the KL-weight schedule (optax underneath).

``Optimizer(name='ivon', ivon=IVON(...))`` is variational learning
(``meshbayes.training.ivon``): its train step differs (gradients at sampled weights).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from meshbayes.field_checks import positive_ints, positive_numbers
from meshbayes.layers.variational import posterior_part
from meshbayes.training import multi_tensor
from meshbayes.training.ivon import IVON
# Re-exported: the trainer, evaluation and tools read IVON runs' meta key from here.
from meshbayes.training.ivon import IVON_META  # pylint: disable=unused-import

Array = jax.Array

SCHEDULES = ("constant", "rsqrt", "cosine")
OPTIMIZERS = ("adamw", "adafactor", "sgd", "ivon")
KL_SCHEDULES = ("constant", "linear")


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class LearningRate:
  """A learning-rate schedule with linear warm-up.

  Attributes:
    schedule: ``constant``; ``rsqrt`` (T5's inverse square root decay after
      warm-up, continuous at its end); ``cosine`` (to ``end_value`` at
      ``decay_steps``).
    base: the peak learning rate, reached at the end of warm-up.
    warmup_steps: linear warm-up from 0 (0: none).
    decay_steps: length of the cosine decay (``cosine`` only).
    end_value: final learning rate of the cosine decay.
  """

  schedule: str = "rsqrt"
  base: float = 1e-3
  warmup_steps: int = 1000
  decay_steps: int | None = None
  end_value: float = 0.0

  def __post_init__(self):
    if self.schedule not in SCHEDULES:
      raise ValueError(f"LearningRate: schedule={self.schedule!r} must be one of {SCHEDULES}")
    positive_numbers("LearningRate", self, "base")
    positive_ints("LearningRate", self, "warmup_steps", allow_zero=True)
    if self.schedule == "cosine" and not (self.decay_steps or 0) > self.warmup_steps:
      raise ValueError(f"LearningRate: cosine needs decay_steps > warmup_steps, got "
                       f"decay_steps={self.decay_steps!r}")

  def __call__(self, step: Array) -> Array:
    step = jnp.asarray(step, jnp.float32)
    warmup = jnp.minimum(1.0, (step + 1) / max(self.warmup_steps, 1))
    if self.schedule == "constant":
      return self.base * warmup
    if self.schedule == "rsqrt":
      return self.base * warmup * jnp.sqrt(max(self.warmup_steps, 1)
                                            / jnp.maximum(step + 1, max(self.warmup_steps, 1)))
    return optax.warmup_cosine_decay_schedule(0.0, self.base, self.warmup_steps, self.decay_steps,
                                              self.end_value)(step)


def decay_mask(params: Any) -> Any:
  """True for the weights weight decay applies to: not posterior scales, not prior scalars.

  Decaying an unconstrained ``*_scale`` toward 0 would push every posterior
  stddev toward ``softplus(0) = 0.69``; the KL is the Bayesian weights' regularizer.
  """
  flat = traverse_util.flatten_dict(params)
  return traverse_util.unflatten_dict({
      path: not (path[-1].endswith("_scale") or "_prior_" in path[-1]) for path in flat})


def posterior_scale_mask(params: Any) -> Any:
  """True for the posterior scales (``w_scale``, ``stddev = softplus(w_scale)``) of Bayesian
  layers; not a prior's trainable scalars, not a norm's ``scale``."""
  flat = traverse_util.flatten_dict(params)
  return traverse_util.unflatten_dict({
      path: (posterior_part(str(path[-1])) or ("", ""))[1] == "scale" for path in flat})


@dataclasses.dataclass(frozen=True)
class Optimizer:
  """An optax optimizer with gradient clipping.

  Attributes:
    name: ``adamw``, ``adafactor`` (factored second moments: less memory),
      ``sgd`` (with momentum) or ``ivon`` (a posterior over every weight).
    learning_rate: the schedule.
    weight_decay: decoupled weight decay (AdamW), never on posterior scales.
    b1: first-moment decay (momentum for SGD).
    b2: second-moment decay (AdamW).
    clip_gradient_norm: clip the global gradient norm (0: no clipping).
    scale_lr_multiplier: the learning rate of posterior scales (``w_scale``) as a
      multiple of the others'. Adam moves a parameter by about the learning rate
      per step and ``log stddev`` is about ``w_scale``, so at 1 a stddev can change
      by at most ``exp(summed learning rate)`` in a run (docs/uncertainty.md).
    ivon: IVON's settings, including its own ``beta1``, ``beta2`` and
      ``weight_decay`` (a prior, not decoupled decay); ``name='ivon'`` only,
      default ``IVON()``.
  """

  name: str = "adamw"
  learning_rate: LearningRate = LearningRate()
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  clip_gradient_norm: float = 1.0
  scale_lr_multiplier: float = 10.0
  ivon: IVON | None = None

  def __post_init__(self):
    if self.name not in OPTIMIZERS:
      raise ValueError(f"Optimizer: name={self.name!r} must be one of {OPTIMIZERS}")
    for name, note in (("weight_decay", ""), ("clip_gradient_norm", " (0: no clipping)")):
      value = getattr(self, name)
      if not _is_number(value) or value < 0:
        raise ValueError(f"Optimizer: {name}={value!r} must be a number >= 0{note}")
    if not _is_number(self.scale_lr_multiplier) or not self.scale_lr_multiplier > 0:
      raise ValueError(f"Optimizer: scale_lr_multiplier={self.scale_lr_multiplier!r} must be "
                       "> 0 (1: the same learning rate as the other parameters)")
    if self.ivon is not None and self.name != "ivon":
      raise ValueError(f"Optimizer: ivon=IVON(...) is given but name={self.name!r}; set "
                       "name='ivon' or drop ivon")
    if self.name == "ivon":
      defaults = {f.name: f.default for f in dataclasses.fields(self)}
      moved = [f"{k}={getattr(self, k)!r}" for k in ("weight_decay", "b1", "b2")
               if getattr(self, k) != defaults[k]]
      if moved:
        raise ValueError(f"Optimizer: name='ivon' takes beta1, beta2 and weight_decay from "
                         f"IVON(...), not Optimizer's {', '.join(moved)}")
      if self.ivon is None:
        object.__setattr__(self, "ivon", IVON())

  def with_ess(self, num_train_units: float) -> Optimizer:
    """For IVON without ``ess``: ``ess = num_train_units``; other optimizers unchanged."""
    if self.ivon is None:
      return self
    return dataclasses.replace(self, ivon=self.ivon.with_ess(num_train_units))

  def transformation(self, seed: int = 0) -> optax.GradientTransformation:
    """The optax transformation (a pure function pair; its state mirrors the params).

    Args:
      seed: IVON's noise seed (kept in its state); unused by the others.
    """
    if self.name == "ivon":
      return self.ivon.transformation(self.learning_rate, self.clip_gradient_norm, seed)
    if self.name == "adamw":
      core = optax.adamw(self.learning_rate, b1=self.b1, b2=self.b2,
                         weight_decay=self.weight_decay, mask=decay_mask)
    elif self.name == "adafactor":
      core = optax.adafactor(self.learning_rate, weight_decay_rate=self.weight_decay or None,
                             weight_decay_mask=decay_mask)
    else:
      core = optax.sgd(self.learning_rate, momentum=self.b1)
    # One flat chain: the core's state keeps its path (opt_state/1/0/mu with clipping).
    parts = [core]
    if self.clip_gradient_norm:
      # optax's clipping with the norm in a kernel per group of layers, not two per array.
      parts.insert(0, multi_tensor.clip_by_global_norm(self.clip_gradient_norm))
    if self.scale_lr_multiplier != 1:
      parts.append(optax.masked(optax.scale(self.scale_lr_multiplier), posterior_scale_mask))
    return optax.chain(*parts) if len(parts) > 1 else core


@dataclasses.dataclass(frozen=True)
class KLWeight:
  """The weight of the KL term over training.

  Attributes:
    schedule: ``constant`` (``value`` throughout) or ``linear`` (from
      ``start_value`` to ``value`` over ``warmup_steps``: KL annealing).
    value: the final weight; 1 is the ELBO, below 1 a tempered posterior.
    start_value: the weight at step 0 (``linear``).
    warmup_steps: annealing length (``linear``).
  """

  schedule: str = "constant"
  value: float = 1.0
  start_value: float = 0.0
  warmup_steps: int = 0

  def __post_init__(self):
    if self.schedule not in KL_SCHEDULES:
      raise ValueError(f"KLWeight: schedule={self.schedule!r} must be one of {KL_SCHEDULES}")
    if self.value < 0 or self.start_value < 0:
      raise ValueError(f"KLWeight: value={self.value!r} and start_value={self.start_value!r} "
                       "must be >= 0")
    if self.schedule == "linear" and self.warmup_steps < 1:
      raise ValueError(f"KLWeight: linear annealing needs warmup_steps >= 1, got "
                       f"{self.warmup_steps!r}")

  def __call__(self, step: Array) -> Array:
    if self.schedule == "constant":
      return jnp.asarray(self.value, jnp.float32)
    fraction = jnp.minimum(1.0, jnp.asarray(step, jnp.float32) / self.warmup_steps)
    return self.start_value + (self.value - self.start_value) * fraction
