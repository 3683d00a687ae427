"""The uncertainty recipes trained on token-id arrays (``data.arrays``) with the trainer's
step and loop, in a process without seqio or TensorFlow (a lent GPU's).

A recipe (``gin_configs/uncertainty/``: its model, optimizer, KL weight, batch and seed, as
``tools/gpu_sequence_run.py`` reads it) is given as a dict; ``train`` runs the trainer's
train step over the training split in memory by ``step_loop.run_steps``, ``steps_per_call``
steps per device call (a ``lax.scan``), to a step and a time budget; ``validation`` is the
trainer's validation pass.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from meshbayes.data import arrays as arrays_lib
from meshbayes.partitioning import Partitioner
from meshbayes.training.step_loop import run_steps
from meshbayes.training.teacher_forced import teacher_forced_metrics
from meshbayes.training.train_step import StepFunctions, all_finite, init_train_state


@dataclasses.dataclass(frozen=True)
class Trained:
  """A recipe trained.

  Attributes:
    steps: its step functions (``StepFunctions``).
    state: the final train state.
    log: batch size, ``chunks`` (step, mean loss and seconds at each device call), steps,
      seconds (compilation included) and epochs.
    losses: every step's loss, in order.
  """
  steps: StepFunctions
  state: Any
  log: dict[str, Any]
  losses: list[float]


def train(setup: dict[str, Any], arrays: dict[str, np.ndarray], lengths: dict[str, int],
          partitioner: Partitioner, train_steps: int, train_seconds: float | None,
          steps_per_call: int) -> Trained:
  """Trains the recipe ``setup`` on the training split with the trainer's step and loop,
  ``steps_per_call`` steps per device call, until ``train_steps`` or ``train_seconds``
  (compilation included); batches of ``arrays.batch_indices`` (seeded by the recipe).

  Raises:
    FloatingPointError: a loss, or the final state, is not finite.
  """
  model, batch_size = setup["model"], setup["batch_size"]
  steps = StepFunctions.build(model, setup["optimizer"], setup["kl_weight"], setup["seed"])
  shapes = {name: (batch_size, lengths["inputs" if name.startswith("encoder") else "targets"])
            for name in arrays_lib.FEATURES}
  state, _ = partitioner.init(lambda k: init_train_state(model, steps.optimizer, shapes, k),
                              jax.random.key(setup["seed"]))
  replicated = NamedSharding(partitioner.mesh, PartitionSpec())
  data = jax.device_put(arrays_lib.split_features(arrays, "train", lengths), replicated)

  def chunk(state, data, rows):
    def body(state, index):
      state, metrics = steps.train_step(state, {k: v[index] for k, v in data.items()})
      return state, metrics["loss"]
    return jax.lax.scan(body, state, rows)

  run_chunk = jax.jit(chunk, donate_argnums=(0,))
  order = arrays_lib.batch_indices(len(arrays["train_inputs"]), batch_size, setup["seed"])

  def advance(state, count):
    rows = np.stack([next(order) for _ in range(count)]).astype(np.int32)
    state, losses = run_chunk(state, data, rows)
    return state, {"loss": losses}

  log: dict[str, Any] = {"batch_size": batch_size, "chunks": []}
  losses: list[float] = []
  started, done = time.perf_counter(), 0
  with partitioner.activation_rules():
    for reading in run_steps(advance, state, first_step=0, train_steps=train_steps,
                             reads_at=lambda step: True, steps_per_call=steps_per_call,
                             train_seconds=train_seconds, started=started):
      state, done = reading.state, reading.step
      read = [metrics["loss"] for _, metrics in reading.metrics]
      if not np.all(np.isfinite(read)):
        raise FloatingPointError(f"run: non-finite loss by step {done}")
      losses.extend(read)
      log["chunks"].append({"step": done, "loss": float(np.mean(read)),
                            "seconds": time.perf_counter() - started})
    if not bool(all_finite((state.params, state.opt_state))):
      raise FloatingPointError(f"run: non-finite parameters after step {done}")
  log.update(steps=done, seconds=time.perf_counter() - started,
             epochs=done * batch_size / len(arrays["train_inputs"]))
  return Trained(steps, state, log, losses)


def validation(steps: StepFunctions, params: Any, arrays: dict[str, np.ndarray],
               lengths: dict[str, int], partitioner: Partitioner, batch_size: int
               ) -> dict[str, float]:
  """The trainer's validation pass (``steps.eval_step``, the posterior mean's) over the
  validation split: its teacher-forced NLL and accuracy per token."""
  pairs = arrays_lib.split_features(arrays, "validation", lengths)
  return teacher_forced_metrics(jax.jit(steps.eval_step), params,
                                arrays_lib.in_batches(pairs, batch_size), partitioner)
