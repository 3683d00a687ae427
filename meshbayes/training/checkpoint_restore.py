"""A trained run restored for prediction: its parameters (or posterior), placed on a mesh;
the vocabulary it was trained with; the model as it was trained.

Training, evaluation and inference all restore runs through here
(``meshbayes.training.checkpoints`` reads and writes the checkpoints themselves).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import jax

from meshbayes.data.pipeline import TaskData, vocabulary_fingerprint
from meshbayes.models.base import BaseModel
from meshbayes.partitioning import Partitioner
from meshbayes.training import checkpoints as checkpoints_lib
from meshbayes.training import run_posteriors


class CorruptRunCheckpointError(checkpoints_lib.CorruptCheckpointError):
  """A corrupt checkpoint of a run restored for prediction; the message names the
  checkpoint before it, which ``meshbayes.launch`` turns into the command's
  ``checkpoint_step`` binding.

  Attributes:
    model_dir: the run, as given.
    earlier_step: the newest complete checkpoint before the corrupt one (None: none).
  """

  def __init__(self, message: str, arrays: Any, model_dir: str, earlier_step: int | None):
    super().__init__(message, arrays)
    self.model_dir, self.earlier_step = model_dir, earlier_step


def _corrupt(error: checkpoints_lib.CorruptCheckpointError, model_dir: str | Path,
             step_dir: Any) -> CorruptRunCheckpointError:
  """``error`` with what to do next: the complete checkpoint before it, and the tool that
  verifies them all."""
  step = int(step_dir.name) if step_dir.name.isdigit() else None
  earlier = [int(d.name) for d in checkpoints_lib.step_dirs(step_dir.parent)
             if step is not None and int(d.name) < step
             and not checkpoints_lib.missing_parts(d)]
  before = (f"the checkpoint before it is step {earlier[-1]}" if earlier
            else "no complete checkpoint precedes it: train the run again")
  return CorruptRunCheckpointError(
      f"{error}; {before} (python -m meshbayes.tools.inspect_checkpoint verify {model_dir} "
      "checks every step)", error.arrays, str(model_dir), earlier[-1] if earlier else None)


def restore_params(model_dir: str | Path, model: BaseModel, data: TaskData,
                   partitioner: Partitioner, step: int | None = None) -> tuple[Any, int]:
  """The parameters of a checkpoint, sharded for ``partitioner``, and its step; a
  vocabulary other than the run's is refused (``check_vocabulary``).

  A run whose checkpoint records a posterior kept beside its parameters (the kinds of
  ``run_posteriors``) is restored as that posterior, which evaluation and decoding take
  in place of the parameters.

  Raises:
    CheckpointError: no checkpoint (of that step), or one of another model.
    CorruptRunCheckpointError: the checkpoint is corrupt or incomplete.
  """
  shapes = data.input_shapes()
  params = jax.eval_shape(lambda k: model.get_initial_variables(k, shapes)["params"],
                          jax.random.key(0))
  step_dir = checkpoints_lib.find_step_dir(model_dir, step)
  try:
    meta = checkpoints_lib.read_meta(step_dir)
  except checkpoints_lib.CorruptCheckpointError as error:
    raise _corrupt(error, model_dir, step_dir) from error
  check_vocabulary(meta, data, model_dir)
  held = run_posteriors.held_by(meta)
  record = held.record(meta)
  target = {"params": params, **held.state(params, record)}
  try:
    restored = checkpoints_lib.restore_subtree(step_dir, partitioner.placed(target))
  except checkpoints_lib.CorruptCheckpointError as error:
    raise _corrupt(error, model_dir, step_dir) from error
  return held.build(restored, record), int(step_dir.name)


def check_vocabulary(meta: dict[str, Any], data: TaskData, model_dir: str | Path) -> None:
  """Raises a one-line ValueError when ``data``'s vocabulary is not the one the run
  was trained with (its checkpoint's ``meta``; runs older than the record pass)."""
  trained = meta.get("vocabulary")
  given = vocabulary_fingerprint(data.vocabulary)
  if trained is not None and trained != given:
    task = f" of task {meta['task']!r}" if meta.get("task") else ""
    raise ValueError(f"the run {model_dir} was trained with the vocabulary{task} ({trained}), "
                     f"not with task {data.task!r}'s ({given}): use the run's task, or one "
                     "with its vocabulary")


def as_trained(model: BaseModel, data: TaskData, model_dir: str | Path,
               step: int | None = None) -> BaseModel:
  """``model`` with the KL divisor ``D`` (``num_train_units``) the run was trained
  with, whatever task is evaluated; says so on stderr when the task is not the
  run's (out-of-distribution evaluation: allowed, the vocabulary being the same)."""
  meta = checkpoints_lib.read_meta(checkpoints_lib.find_step_dir(model_dir, step))
  say = (lambda line: print(line, file=sys.stderr, flush=True)) if (
      jax.process_index() == 0) else (lambda line: None)
  if meta.get("task") and meta["task"] != data.task:
    say(f"note: the run {model_dir} was trained on task {meta['task']!r}; evaluating it on "
        f"{data.task!r} (the same vocabulary) is out-of-distribution")
  if not hasattr(model, "num_train_units"):
    return model
  if "num_train_units" not in meta:
    if model.is_bayesian:
      say(f"warning: the run {model_dir} does not record its training set's size; the KL "
          f"divisor D = {model.num_train_units:,.0f} is task {data.task!r}'s")
    return model
  return dataclasses.replace(model, num_train_units=float(meta["num_train_units"]))
