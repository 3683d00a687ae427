"""Programs timed against each other in one process, round after round.

Alternating the programs round-robin makes machine load hit all of them alike;
each program's time is its fastest round (load only adds time), its median
reported beside it, and a ratio of two programs can be taken round by round
(``paired_time_ratio``), so that load which hits a whole round cancels.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from meshbayes.metrics import bootstrap


def alternate(programs: dict[str, Callable[[], Any]], rounds: int, warmup: int = 1,
              record: dict[str, list[float]] | None = None
              ) -> tuple[dict[str, float], dict[str, float]]:
  """Fastest and median seconds of each program, timed round-robin (each call blocks);
  every round's seconds go to ``record`` when given."""
  for _ in range(warmup):
    for program in programs.values():
      jax.block_until_ready(program())
  times: dict[str, list[float]] = {name: [] for name in programs}
  for _ in range(rounds):
    for name, program in programs.items():
      start = time.perf_counter()
      jax.block_until_ready(program())
      times[name].append(time.perf_counter() - start)
  if record is not None:
    record.update(times)
  return ({name: min(t) for name, t in times.items()},
          {name: statistics.median(t) for name, t in times.items()})


def paired_time_ratio(times: dict[str, list[float]], name: str, baseline: str
                      ) -> dict[str, float]:
  """The median over rounds of ``name``'s seconds over ``baseline``'s in the same round,
  with its bootstrap interval over rounds (load that hits a whole round cancels)."""
  ratios = np.asarray(times[name]) / np.asarray(times[baseline])
  return bootstrap.bootstrap(lambda i: {"ratio": float(np.median(ratios[i]))},
                             [len(ratios)])["ratio"].as_dict()
