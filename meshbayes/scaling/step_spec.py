"""The one-device train step that the measurements compile: its spec, a batch, the step.

``tools/bench.py``, ``tools/step_profile.py`` and ``tools/gpu_check.py`` time
and profile the trainer's own jitted step (``train_step.jit_train_step``) of a
preset on one device with ``data_only`` rules; this module builds it once for all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from meshbayes.scaling.aot import StepSpec, build_steps, jaxpr_matmul_flops


def step_spec(model: str, batch_size: int, length: int, deterministic: bool,
              optimizer: str = "adamw", *, dtype: str | None = None,
              remat_policy: str | None = None,
              overrides: Sequence[tuple[str, Any]] = ()) -> StepSpec:
  """The trainer's step of preset ``model`` on one device (``data_only`` rules).

  ``batch_size`` sequences of ``length`` tokens in and out; ``dtype`` and
  ``remat_policy`` (None: the preset's), then ``overrides`` (``TransformerConfig``
  fields, winning over both), change the model's config.
  """
  changed = {name: value for name, value in (("dtype", dtype), ("remat_policy", remat_policy))
             if value}
  changed.update(overrides)
  return StepSpec(model=model, deterministic=deterministic, optimizer=optimizer,
                  batch_size=batch_size, input_length=length, target_length=length,
                  model_parallel=1, partitioning="data_only", num_train_units=1e6,
                  overrides=tuple(changed.items()))


def one_device_partitioner() -> Any:
  """A ``data_only`` partitioner over the first device (the one the step runs on)."""
  from meshbayes.partitioning import Partitioner

  return Partitioner(data=1, model=1, rules="data_only", devices=jax.devices()[:1])


def random_batch(spec: StepSpec, rng: np.random.Generator, high: int | None = None
                 ) -> dict[str, jax.Array]:
  """A batch of ``spec``'s shapes: tokens drawn from ``[1, high)`` (default: the model's
  vocabulary) by ``rng``, every loss weight 1."""
  shapes = spec.input_shapes()
  high = spec.config().vocab_size if high is None else high
  batch = {name: jnp.asarray(rng.integers(1, high, size=shape), jnp.int32)
           for name, shape in shapes.items()}
  batch["decoder_loss_weights"] = jnp.ones(shapes["decoder_loss_weights"], jnp.int32)
  return batch


def compiled_train_step(spec: StepSpec, partitioner: Any, batch: dict[str, Any]
                        ) -> tuple[Any, Any]:
  """A fresh train state of ``spec`` and the trainer's jitted step compiled for ``batch``."""
  from meshbayes.training.train_step import abstract_state, init_train_state, jit_train_step

  model, steps = build_steps(spec)
  shapes = spec.input_shapes()
  # Placed outside the activation rules: unboxing inside them would constrain.
  placed = partitioner.placed(abstract_state(model, steps, shapes))
  state, shardings = partitioner.init(
      lambda k: init_train_state(model, steps.optimizer, shapes, k), jax.random.key(0))
  with partitioner.activation_rules():
    compiled = jit_train_step(steps, partitioner, shardings).lower(placed, batch).compile()
  return state, compiled


def traced_step_flops(spec: StepSpec, partitioner: Any, batch: dict[str, Any]) -> float:
  """Matmul FLOPs of one train step over all devices, counted in its jaxpr (any platform)."""
  from meshbayes.training.train_step import abstract_state

  model, steps = build_steps(spec)
  placed = partitioner.placed(abstract_state(model, steps, spec.input_shapes()))
  with partitioner.activation_rules():
    return jaxpr_matmul_flops(jax.make_jaxpr(steps.train_step)(placed, batch).jaxpr)
