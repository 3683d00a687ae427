"""What a training run has cost, over every attempt: ``MODEL_DIR/compute.json``.

The trainer records its process's CPU and wall seconds at every checkpoint it
saves, one entry per attempt, so the time of an attempt that was killed is not
lost (work after its last save is redone, and counted, by the next); ``total``
sums them.
"""

from __future__ import annotations

import dataclasses
import json
import time

from etils import epath

from meshbayes.runtime.atomic_files import write_text_atomically

COMPUTE_FILE = "compute.json"


@dataclasses.dataclass
class Attempt:
  """One training process of a run, up to its latest checkpoint.

  Attributes:
    first_step: the step it resumed from.
    last_step: its latest saved step.
    cpu_seconds: the process's CPU time (all threads, from its start) at that save.
    wall_seconds: wall time from the trainer's start to that save.
  """

  first_step: int
  last_step: int
  cpu_seconds: float
  wall_seconds: float


class ComputeLog:
  """The attempts of the run in ``model_dir``; this process's is the last."""

  def __init__(self, model_dir: epath.PathLike, first_step: int):
    self.path = epath.Path(model_dir) / COMPUTE_FILE
    self.earlier = read(model_dir)
    self.first_step, self.started = first_step, time.perf_counter()

  def saved(self, step: int) -> None:
    """Records this attempt up to the checkpoint of ``step``."""
    this = Attempt(self.first_step, step, time.process_time(),
                   time.perf_counter() - self.started)
    write_text_atomically(self.path, json.dumps(
        [dataclasses.asdict(a) for a in [*self.earlier, this]], indent=1))


def read(model_dir: epath.PathLike) -> list[Attempt]:
  """The run's recorded attempts (none before its first checkpoint)."""
  path = epath.Path(model_dir) / COMPUTE_FILE
  return [Attempt(**a) for a in json.loads(path.read_text())] if path.exists() else []


def total(model_dir: epath.PathLike) -> dict[str, float]:
  """``{'cpu_seconds', 'wall_seconds'}`` summed over the run's attempts (empty if none)."""
  attempts = read(model_dir)
  if not attempts:
    return {}
  return {"cpu_seconds": sum(a.cpu_seconds for a in attempts),
          "wall_seconds": sum(a.wall_seconds for a in attempts)}
