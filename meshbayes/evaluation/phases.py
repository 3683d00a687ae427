"""An evaluation's phases announced one line each, with the time left for the whole.

``EvalPhases`` numbers the passes (``phase 3/12: ...``) and prices each in units (batches
times forward passes, times the beam for beam search) at its kind's measured seconds per
unit; a kind not yet timed is priced from the scoring rate by a fixed ratio.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

from meshbayes.runtime import console
from meshbayes.runtime.metrics_writer import progress

T = TypeVar("T")

KINDS = ("read", "score", "decode")
# A decoding unit's cost in scoring units until a decode has been timed (a greedy decode
# of a batch against one teacher-forced pass of it: about 2.7 on the CPU demo).
DECODE_TO_SCORE = 3.0


@dataclasses.dataclass
class Phase:
  """One pass of an evaluation.

  Attributes:
    name: what it does, as its progress bar says (``token calibration (model_average)``).
    kind: ``read`` (not priced: it comes first), ``score`` or ``decode``.
    passes: forward passes per batch (x beam size for beam search).
    batches: its number of batches; None: the evaluated split's (``EvalPhases.split_batches``).
  """

  name: str
  kind: str
  passes: float = 1.0
  batches: int | None = None

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"Phase: kind={self.kind!r} must be one of {KINDS}")
    if not self.passes > 0 or (self.batches is not None and self.batches < 0):
      raise ValueError(f"Phase: passes={self.passes!r} must be > 0 and batches="
                       f"{self.batches!r} None or >= 0")


def _minutes(seconds: float) -> str:
  return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


class EvalPhases:
  """Announces ``phases`` in order and estimates the time left.

  Example:
    >>> seconds = iter([0, 0, 1, 1, 5, 5, 13, 20]).__next__  # a fake clock
    >>> phases = EvalPhases([Phase("reading", "read"), Phase("scoring", "score"),
    ...                      Phase("decoding", "decode", passes=2)], clock=seconds, say=print)
    >>> batches = list(phases.track(range(4), "reading"))
    phase 1/3: reading
    >>> phases.split_batches = len(batches)
    >>> _ = list(phases.track(batches, "scoring"))
    phase 2/3: scoring
    >>> _ = list(phases.track(batches, "decoding"))  # 8 units at 3 x 1 s each
    phase 3/3: decoding; about 24 s left
    >>> phases.finish()
    evaluation done in 20 s
  """

  def __init__(self, phases: Sequence[Phase], clock=time.perf_counter, say=None):
    self.phases = list(phases)
    self.split_batches = 0  # set once the evaluated split is read
    self._clock, self._say = clock, say or console.say
    self._next = 0
    self._started = self._clock()
    self._spent = {kind: 0.0 for kind in KINDS}  # seconds per kind
    self._done = {kind: 0.0 for kind in KINDS}  # units per kind

  def _units(self, phase: Phase) -> float:
    batches = self.split_batches if phase.batches is None else phase.batches
    return batches * phase.passes

  def _rate(self, kind: str) -> float | None:
    """Seconds per unit of ``kind``: measured, or priced from the scoring rate."""
    if self._done[kind] > 0:
      return self._spent[kind] / self._done[kind]
    if self._done["score"] > 0:
      score = self._spent["score"] / self._done["score"]
      return score * (DECODE_TO_SCORE if kind == "decode" else 1.0)
    return None

  def seconds_left(self) -> float | None:
    """The estimated seconds of the phases not yet started (None before any is timed)."""
    total = 0.0
    for phase in self.phases[self._next:]:
      if phase.kind == "read":
        continue
      rate = self._rate(phase.kind)
      if rate is None:
        return None
      total += rate * self._units(phase)
    return total

  def track(self, items: Iterable[T], description: str, total: int | None = None
            ) -> Iterator[T]:
    """``items`` with a progress bar, announced as the next phase, which must be named
    ``description``; times the phase as the items are consumed."""
    if self._next >= len(self.phases) or self.phases[self._next].name != description:
      expected = (self.phases[self._next].name if self._next < len(self.phases)
                  else "no more phases")
      raise ValueError(f"EvalPhases: phase {description!r} is not the one planned "
                       f"({expected!r})")
    phase = self.phases[self._next]
    self._next += 1
    left = self.seconds_left()
    if left is not None:  # this phase included
      left += (self._rate(phase.kind) or 0.0) * self._units(phase)
    self._say(f"phase {self._next}/{len(self.phases)}: {description}"
              + ("" if left is None or phase.kind == "read" else f"; about {_minutes(left)} left"))
    started = self._clock()
    yield from progress(items, description, total)
    self._spent[phase.kind] += self._clock() - started
    self._done[phase.kind] += self._units(phase)

  def finish(self) -> None:
    """Says how long the evaluation took."""
    self._say(f"evaluation done in {_minutes(self._clock() - self._started)}")
