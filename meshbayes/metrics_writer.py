"""Where metrics go: TensorBoard event files, JSON lines, and a console progress bar.

Only process 0 writes (on a single host that is the only process).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import TextIO

import jax


class MetricsWriter:
  """Scalars to ``<directory>/events.*`` (TensorBoard) and ``<jsonl_path>`` (one JSON per write).

  Args:
    directory: the TensorBoard log directory (``MODEL_DIR/train``).
    jsonl_path: the JSON-lines file (``MODEL_DIR/metrics.jsonl``).
  """

  def __init__(self, directory: Path, jsonl_path: Path):
    self.enabled = jax.process_index() == 0
    if not self.enabled:
      return
    from tensorboardX import (
      SummaryWriter,  # writes event files without TensorFlow's API
    )

    Path(directory).mkdir(parents=True, exist_ok=True)
    self._tensorboard = SummaryWriter(str(directory))
    self._jsonl = open(jsonl_path, "a")

  def write(self, step: int, metrics: dict[str, float]) -> None:
    if not self.enabled:
      return
    for name, value in metrics.items():
      self._tensorboard.add_scalar(name, value, step)
    self._tensorboard.flush()
    self._jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
    self._jsonl.flush()

  def close(self) -> None:
    if self.enabled:
      self._tensorboard.close()
      self._jsonl.close()


def _format(value: float) -> str:
  if value == 0 or not math.isfinite(value):
    return str(value)
  return f"{value:.4g}" if 1e-3 <= abs(value) < 1e5 else f"{value:.3e}"


class ProgressBar:
  """One status line per log period: step, a bar, the key metrics and throughput."""

  KEYS = ("loss", "neg_elbo", "nll", "kl", "accuracy")

  def __init__(self, total_steps: int, start_step: int = 0, stream: TextIO | None = None,
               width: int = 24):
    self.total, self.stream, self.width = total_steps, stream or sys.stdout, width
    self.enabled = jax.process_index() == 0
    self._start, self._start_step = time.perf_counter(), start_step

  def update(self, step: int, metrics: dict[str, float]) -> None:
    if not self.enabled:
      return
    done = int(self.width * step / max(self.total, 1))
    bar = "=" * done + (">" if done < self.width else "") + " " * (self.width - done - 1)
    shown = " ".join(f"{k} {_format(metrics[k])}" for k in self.KEYS if k in metrics)
    elapsed = time.perf_counter() - self._start
    remaining = elapsed / max(step - self._start_step, 1) * (self.total - step)
    self.stream.write(f"step {step:>{len(str(self.total))}}/{self.total} [{bar}] {shown} | "
                      f"{metrics.get('tokens_per_second', 0):,.0f} tok/s, "
                      f"{metrics.get('step_seconds', 0):.3f} s/step, ~{remaining:.0f} s left\n")
    self.stream.flush()
