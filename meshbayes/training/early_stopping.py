"""Early stopping on the validation NLL of the trainer's periodic evaluations.

``stop_point`` is a pure function of the run's evaluation history
(``MODEL_DIR/eval/metrics.jsonl``) and ``run_configs.EvaluationConfig``'s
``patience`` and ``min_delta``, so a resumed run stops where the uninterrupted one
would; a stopped run writes ``MODEL_DIR/early_stopping.json`` (``STOP_FILE``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence

from etils import epath

from meshbayes.runtime import metrics_writer

STOP_FILE = "early_stopping.json"


@dataclasses.dataclass(frozen=True)
class EarlyStop:
  """Where a run stopped.

  Attributes:
    step: the validation pass that stopped it.
    best_step: the pass of the best validation NLL before it.
    best_nll: that NLL.
  """

  step: int
  best_step: int
  best_nll: float


def stop_point(history: Sequence[tuple[int, float]], patience: int,
               min_delta: float = 0.0) -> EarlyStop | None:
  """The first pass of ``history`` at which ``patience`` passes in a row have not
  improved on the best NLL so far by more than ``min_delta``; None if there is none.

  Args:
    history: ``(step, validation NLL)`` by step. A NaN NLL never improves.
    patience: passes without improvement that stop the run (>= 1).
    min_delta: how much lower than the best an NLL must be to count as better.

  >>> stop_point([(100, 3.0), (200, 2.9), (300, 2.95), (400, 2.91)], patience=2)
  EarlyStop(step=400, best_step=200, best_nll=2.9)
  >>> stop_point([(100, 3.0), (200, 2.9), (300, 2.95)], patience=2) is None
  True
  """
  best_step, best, passes_since = None, math.inf, 0
  for step, nll in history:
    if nll < best - min_delta:
      best_step, best, passes_since = step, nll, 0
      continue
    passes_since += 1
    if passes_since >= patience and best_step is not None:
      return EarlyStop(int(step), int(best_step), float(best))
  return None


def validation_history(model_dir: str | epath.PathLike, up_to_step: int | None = None
                       ) -> list[tuple[int, float]]:
  """``(step, nll)`` of a run's periodic evaluations, by step, up to ``up_to_step``; a
  step evaluated again after a resume counts once, with its latest value."""
  path = epath.Path(model_dir) / "eval" / "metrics.jsonl"
  found = {}
  if path.exists():
    for record in metrics_writer.read_lines(path):
      if "nll" in record and (up_to_step is None or record["step"] <= up_to_step):
        found[int(record["step"])] = float(record["nll"])
  return sorted(found.items())


def read_stop(model_dir: str | epath.PathLike) -> EarlyStop | None:
  """The run's ``STOP_FILE`` as an ``EarlyStop``; None if it did not stop early."""
  path = epath.Path(model_dir) / STOP_FILE
  if not path.exists():
    return None
  record = json.loads(path.read_text())
  return EarlyStop(int(record["step"]), int(record["best_step"]), float(record["best_nll"]))
