"""What a training run has cost, over every attempt: ``MODEL_DIR/compute.json``.

One entry per attempt (training process), rewritten each time one of its
checkpoints has landed (its save finished and committed), never before: after a
kill at any moment each attempt's ``last_step`` is a complete checkpoint (or one
that keep=N pruned once later ones landed), and the work after it, lost, is redone
and counted by the next attempt. ``total`` sums the attempts.

Both times of an entry span the same interval, from the process's start (Linux:
``/proc/self/stat``) to the start of the save of ``last_step`` (or to its landing,
when the attempt ended with that save): start-up (imports, restoring or initializing
the state, opening the input), compilation, steps, validation passes and saves.
``cpu_seconds`` is the CPU time (user and system) of all the process's threads, not of
its child processes; ``wall_seconds`` the elapsed time. Each entry says so under
``includes``; entries written before that field measured ``wall_seconds`` from after
compilation only (``OLD_INCLUDES``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

from etils import epath

from meshbayes.runtime import run_lock, strict_json
from meshbayes.runtime.atomic_files import write_text_atomically

COMPUTE_FILE = "compute.json"
_IMPORTED = time.monotonic()  # the origin where /proc cannot tell the process's start
_SPAN = ("to the start of the save of last_step (to its landing when the attempt ended with "
         "it): start-up, compilation, steps, validation passes, saves; cpu_seconds: CPU time of "
         "all its threads (user and system, no child processes)")
INCLUDES = f"from the process's start {_SPAN}"
IMPORT_INCLUDES = (f"cpu_seconds from the process's start, wall_seconds from the import of "
                   f"meshbayes.training.compute_log (no /proc), {_SPAN}")
OLD_INCLUDES = ("cpu_seconds from the process's start, wall_seconds from after compilation, to "
                "the start of the save of last_step (which may not have landed)")


def _process_start() -> float | None:
  """When this process started, on ``CLOCK_BOOTTIME`` (seconds, at most a clock tick
  early); None where ``/proc`` cannot say (not Linux)."""
  if not hasattr(time, "CLOCK_BOOTTIME"):
    return None
  ticks = run_lock.process_start_ticks(os.getpid())
  return None if ticks is None else int(ticks) / os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass
class Attempt:
  """One training process of a run, up to its latest checkpoint that landed.

  Attributes:
    first_step: the step it resumed from.
    last_step: its latest checkpoint whose save had landed.
    cpu_seconds: the process's CPU time up to that save (``includes`` says which span).
    wall_seconds: the elapsed time over the same span.
    includes: what the two times span (``OLD_INCLUDES`` for entries without it).
  """

  first_step: int
  last_step: int
  cpu_seconds: float
  wall_seconds: float
  includes: str = OLD_INCLUDES


class ComputeLog:
  """The attempts of the run in ``model_dir``; this process's is the last.

  The trainer calls ``save_started`` when it has started a checkpoint's save and
  ``save_landed`` once it has waited for that save to finish; only then is the step
  recorded.
  """

  def __init__(self, model_dir: epath.PathLike, first_step: int):
    self.path = epath.Path(model_dir) / COMPUTE_FILE
    self.earlier = read(model_dir)
    self.first_step = first_step
    self._pending: Attempt | None = None  # the save started and not yet landed
    self._start = _process_start()
    self._includes = INCLUDES if self._start is not None else IMPORT_INCLUDES

  def _now(self, step: int) -> Attempt:
    if self._start is not None:
      wall = time.clock_gettime(time.CLOCK_BOOTTIME) - self._start
    else:
      wall = time.monotonic() - _IMPORTED
    return Attempt(self.first_step, step, time.process_time(), wall, self._includes)

  def save_started(self, step: int) -> None:
    """Notes that the save of ``step`` has started: the times up to now are recorded
    with it once it lands (``save_landed``)."""
    self._pending = self._now(step)

  def save_landed(self, until_now: bool = False) -> None:
    """Records this attempt up to the started save, which the caller has waited for and
    which landed; with the times taken when it started, or with the times of now when
    ``until_now`` (the attempt ends with it: its save's time counts, and no work after
    it is redone). Nothing to record without a started save."""
    if self._pending is None:
      return
    this = self._now(self._pending.last_step) if until_now else self._pending
    self._pending = None
    write_text_atomically(self.path, strict_json.dumps(
        [dataclasses.asdict(a) for a in [*self.earlier, this]], indent=1))


def read(model_dir: epath.PathLike) -> list[Attempt]:
  """The run's recorded attempts (none before its first checkpoint landed); fields
  unknown to ``Attempt`` are ignored, missing ``includes`` is ``OLD_INCLUDES``."""
  path = epath.Path(model_dir) / COMPUTE_FILE
  if not path.exists():
    return []
  names = {field.name for field in dataclasses.fields(Attempt)}
  return [Attempt(**{k: v for k, v in a.items() if k in names})
          for a in json.loads(path.read_text())]


def total(model_dir: epath.PathLike) -> dict[str, float]:
  """``{'cpu_seconds', 'wall_seconds'}`` summed over the run's attempts (empty if none);
  an attempt recorded before ``includes`` adds its wall time from after compilation."""
  attempts = read(model_dir)
  if not attempts:
    return {}
  return {"cpu_seconds": sum(a.cpu_seconds for a in attempts),
          "wall_seconds": sum(a.wall_seconds for a in attempts)}
