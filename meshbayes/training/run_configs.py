"""The grouped settings of a training run (T5X style): checkpoints, evaluation, input.

``meshbayes.training.trainer.train`` takes one of each; gin files bind them as
``train.checkpoint = @run_configs.CheckpointConfig()`` and set their fields as
``run_configs.CheckpointConfig.period = 100``. Each checks its values when built, so
a bad one is a one-line ValueError naming it before anything is loaded.
"""

from __future__ import annotations

import dataclasses

from meshbayes.field_checks import booleans, positive_ints, positive_numbers


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """When checkpoints are saved and kept, and where a new run's parameters come from.

  Attributes:
    period: steps between checkpoints (a final one is always saved).
    keep: keep the newest N >= 1 checkpoints (None: all); the final one is
      always kept.
    async_save: save in the background.
    initial_checkpoint: a checkpoint (model dir, checkpoints dir or step dir)
      to take the parameters from when ``model_dir`` has none.
    initial_from_deterministic: ``initial_checkpoint`` is of the deterministic
      twin: set posterior means to its weights and stddevs to
      ``moped_delta * |w|`` (MOPED).
    moped_delta: see ``initial_from_deterministic``.
    fallback_on_corrupt: when the newest checkpoint is corrupt or incomplete,
      set it aside as ``<step>.corrupt`` and resume from the newest one that
      verifies; default: stop with a one-line error.
    frozen_stddevs_from: a run with Bayesian layers of the same model shape whose
      posterior stddevs a new run takes and never trains (the noise-without-KL
      control, ``meshbayes.training.frozen_stddevs``); None: trained as usual.
    frozen_stddevs_step: the step of ``frozen_stddevs_from`` to take them from;
      None: its best checkpoint by validation NLL.
  """

  period: int = 100
  keep: int | None = 3
  async_save: bool = True
  initial_checkpoint: str | None = None
  initial_from_deterministic: bool = False
  moped_delta: float = 0.1
  fallback_on_corrupt: bool = False
  frozen_stddevs_from: str | None = None
  frozen_stddevs_step: int | None = None

  def __post_init__(self):
    positive_ints("CheckpointConfig", self, "period")
    positive_ints("CheckpointConfig", self, "keep", allow_none=True)
    booleans("CheckpointConfig", self, "async_save", "initial_from_deterministic",
             "fallback_on_corrupt")
    if self.initial_checkpoint is not None and not isinstance(self.initial_checkpoint, str):
      raise ValueError(f"CheckpointConfig: initial_checkpoint={self.initial_checkpoint!r} must "
                       "be a path (a string) or None")
    if self.initial_from_deterministic and not self.initial_checkpoint:
      raise ValueError("CheckpointConfig: initial_from_deterministic=True needs an "
                       "initial_checkpoint (the deterministic twin's)")
    positive_numbers("CheckpointConfig", self, "moped_delta")
    if self.frozen_stddevs_from is not None and not (isinstance(self.frozen_stddevs_from, str)
                                                     and self.frozen_stddevs_from):
      raise ValueError(f"CheckpointConfig: frozen_stddevs_from={self.frozen_stddevs_from!r} "
                       "must be a run directory (a non-empty string) or None")
    positive_ints("CheckpointConfig", self, "frozen_stddevs_step", allow_none=True)
    if self.frozen_stddevs_step is not None and self.frozen_stddevs_from is None:
      raise ValueError(f"CheckpointConfig: frozen_stddevs_step={self.frozen_stddevs_step} "
                       "needs frozen_stddevs_from (the run to take the stddevs from)")


@dataclasses.dataclass(frozen=True)
class EvaluationConfig:
  """The teacher-forced evaluations on the validation split during training.

  Attributes:
    period: steps between evaluations, each with the posterior's median stddev
      per layer group (0: none).
    patience: stop training at the evaluation that completes this many in a row
      without a validation NLL below the best so far by more than ``min_delta``
      (``meshbayes.training.early_stopping``); ``train_steps`` stays the cap. None: no early
      stopping.
    min_delta: see ``patience``.
  """

  period: int = 0
  patience: int | None = None
  min_delta: float = 0.0

  def __post_init__(self):
    positive_ints("EvaluationConfig", self, "period", allow_zero=True)
    positive_ints("EvaluationConfig", self, "patience", allow_none=True)
    if self.patience is not None and not self.period:
      raise ValueError(f"EvaluationConfig: patience={self.patience} needs evaluations "
                       "(period > 0)")
    positive_numbers("EvaluationConfig", self, "min_delta", allow_zero=True)


@dataclasses.dataclass(frozen=True)
class InputConfig:
  """How the training batches are read and fed to the train step.

  Attributes:
    shards: shards the training split is read as (``HostInput``); the batches
      depend on it, not on the number of processes. None: the resumed
      checkpoint's, else one per group of hosts feeding distinct examples (1
      on a single host).
    num_microbatches: each batch is split into this many microbatches whose
      gradients are accumulated (1: none).
  """

  shards: int | None = None
  num_microbatches: int = 1

  def __post_init__(self):
    positive_ints("InputConfig", self, "shards", allow_none=True)
    positive_ints("InputConfig", self, "num_microbatches")
