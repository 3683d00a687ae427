"""The loop over train steps that the trainer and the array runs share: a step function
called to a step budget (and an optional time budget), its metrics left on the device until
a step the caller reads them at (T5X style: the host dispatches the next steps meanwhile).

It knows nothing of where batches come from, checkpoints or logs, and imports neither the
data layer nor seqio: ``trainer.train`` drives it with host batches and saves, logs and
evaluates at its readings; ``array_training.train`` with in-memory arrays and
``steps_per_call`` steps per device call.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from meshbayes.field_checks import positive_int, positive_number

# (state, steps to take) -> (state, metrics): scalars for one step, else arrays with a
# leading axis of one entry per step.
Advance = Callable[[Any, int], tuple[Any, dict[str, Any]]]
Pending = list[tuple[int, dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class Reading:
  """The loop at a step whose metrics were read back.

  Attributes:
    step: the steps done so far.
    state: the state after ``step``.
    metrics: ``(step, metrics as floats)`` of every step since the previous reading.
    due: what ``reads_at(step)`` returned; None where the loop reads only because it
      ends (the last step, or the time budget spent).
  """
  step: int
  state: Any
  metrics: list[tuple[int, dict[str, float]]]
  due: Any


def read_metrics(pending: Pending) -> list[tuple[int, dict[str, float]]]:
  """The steps' metrics read back from the device at once: the loop's only wait on it.

  ``pending`` holds ``(step, metrics)`` per call: scalars of that step, or arrays of the
  call's steps ending at ``step``.
  """
  values = jax.device_get([metrics for _, metrics in pending])
  read = []
  for (step, _), metrics in zip(pending, values):
    per_step = {k: np.reshape(v, -1) for k, v in metrics.items()}
    count = len(next(iter(per_step.values()))) if per_step else 1
    read.extend((step - count + 1 + i, {k: float(v[i]) for k, v in per_step.items()})
                for i in range(count))
  return read


def run_steps(advance: Advance, state: Any, *, first_step: int, train_steps: int,
              reads_at: Callable[[int], Any], steps_per_call: int = 1,
              train_seconds: float | None = None, started: float | None = None,
              read: Callable[[Pending], list[tuple[int, dict[str, float]]]] = read_metrics
              ) -> Iterator[Reading]:
  """Trains ``state`` from ``first_step`` to ``train_steps`` by calls of ``advance``.

  Each call takes ``min(steps_per_call, steps left)`` steps. After a call that ends at a
  step where ``reads_at(step)`` is truthy, or at ``train_steps``, the calls' metrics are
  read (``read``) and a ``Reading`` yielded; the caller may stop there. With
  ``train_seconds``, no call starts once that many seconds have passed since ``started``
  (default: now), and the steps since the last reading are read at the end.

  Raises:
    ValueError: ``steps_per_call`` or ``train_seconds`` is not positive.
  """
  positive_int("run_steps", "steps_per_call", steps_per_call)
  if train_seconds is not None:
    positive_number("run_steps", "train_seconds", train_seconds)
  started = time.perf_counter() if started is None else started
  step, pending = first_step, []
  while step < train_steps:
    if train_seconds is not None and time.perf_counter() - started >= train_seconds:
      break
    count = min(steps_per_call, train_steps - step)
    state, metrics = advance(state, count)
    step += count
    pending.append((step, metrics))
    due = reads_at(step)
    if due or step == train_steps:
      yield Reading(step, state, read(pending), due or None)
      pending = []
  if pending:  # the time budget ended the loop between readings
    yield Reading(step, state, read(pending), None)
