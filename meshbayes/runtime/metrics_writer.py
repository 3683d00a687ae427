"""Where metrics go: TensorBoard event files, JSON lines, a console progress line, and
progress bars for passes over data.

Only process 0 writes. Directories may be local or URIs such as
``gs://bucket/run/train`` (written through ``etils.epath``). A non-finite scalar (an
undefined figure) is left out of TensorBoard, which has no use for it and warns of it;
its JSON line has it as null and says why.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, TextIO, TypeVar

import jax
from etils import epath

from meshbayes.runtime import strict_json

T = TypeVar("T")
# URI schemes whose event files go through epath.
_URI_SCHEMES = ("gs", "s3", "az")


class _EpathEventFiles:
  """tensorboardX's writer factory interface (``record_writer.register_writer_factory``)
  for URIs: event files opened through ``etils.epath``."""

  # tensorboardX's own gs:// writer needs google-cloud-storage and uploads the whole
  # file at every flush; epath, as orbax, goes through TensorFlow's file systems.

  def open(self, path: str) -> IO[bytes]:
    return epath.Path(path).open("wb")

  def directory_check(self, path: str) -> None:
    epath.Path(path).mkdir(parents=True, exist_ok=True)


def _register_uri_event_files() -> None:
  from tensorboardX import record_writer  # pylint: disable=import-outside-toplevel
  for scheme in _URI_SCHEMES:
    if not isinstance(record_writer.REGISTERED_FACTORIES.get(scheme), _EpathEventFiles):
      record_writer.register_writer_factory(scheme, _EpathEventFiles())


class MetricsWriter:
  """Scalars to ``<directory>/events.*`` (TensorBoard) and ``<jsonl_path>`` (one JSON per write).

  Args:
    directory: the TensorBoard log directory (``MODEL_DIR/train``).
    jsonl_path: the JSON-lines file (``MODEL_DIR/metrics.jsonl``).
  """

  def __init__(self, directory: str | os.PathLike, jsonl_path: str | os.PathLike):
    self.enabled = jax.process_index() == 0
    if not self.enabled:
      return
    from tensorboardX import (
      SummaryWriter,  # writes event files without TensorFlow's API
    )

    _register_uri_event_files()
    self._directory = epath.Path(directory)
    self._directory.mkdir(parents=True, exist_ok=True)
    self._tensorboard = SummaryWriter(os.fspath(self._directory))
    self._jsonl = epath.Path(jsonl_path).open("a")

  def write(self, step: int, metrics: dict[str, float]) -> None:
    """The finite ``metrics`` to TensorBoard at ``step``, and all of them as one JSON line
    (a non-finite one null, its reason under ``null_reasons``)."""
    if not self.enabled:
      return
    for name, value in metrics.items():
      if math.isfinite(value):
        self._tensorboard.add_scalar(name, value, step)
    self._tensorboard.flush()
    self._jsonl.write(strict_json.dumps({"step": step, **metrics}, null_reasons=strict_json.NULL_REASONS,
                                        explain=_not_in_tensorboard) + "\n")
    self._jsonl.flush()

  def close(self) -> None:
    if not self.enabled:
      return
    try:
      self._tensorboard.close()
    except OSError as error:  # a full disk, say
      # tensorboardX would try again at exit, with a traceback.
      for writer in self._tensorboard.all_writers.values():
        writer.event_writer._closed = True  # pylint: disable=protected-access
      raise OSError(f"TensorBoard events in {self._directory} could not be written: "
                    f"{error.strerror or error}") from error
    finally:
      self._jsonl.close()


def read_lines(path: epath.PathLike) -> list[dict[str, float]]:
  """The records of a ``metrics.jsonl`` as written: each null that ``null_reasons``
  explains back as the number it was (older files' bare NaN read too)."""
  return [strict_json.restore(json.loads(line))
          for line in epath.Path(path).read_text().splitlines()]


def _not_in_tensorboard(name: str, value: float) -> str:
  del name
  what = "nan: undefined" if math.isnan(value) else f"{value}: not a finite number"
  return f"{what}; left out of TensorBoard"


def progress(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
  """``items``, with a progress bar on stderr from process 0 (tqdm)."""
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  return iter(tqdm(items, desc=description, total=total, file=sys.stderr, leave=False,
                   disable=jax.process_index() != 0, dynamic_ncols=True))


def _format(value: float) -> str:
  if value == 0 or not math.isfinite(value):
    return str(value)
  return f"{value:.4g}" if 1e-3 <= abs(value) < 1e5 else f"{value:.3e}"


class ProgressBar:
  """One status line per log period: step, a bar, the key metrics, throughput and the time
  left, estimated from the steps since ``start_clock`` (compilation excluded)."""

  KEYS = ("loss", "neg_elbo", "nll", "kl", "accuracy")

  def __init__(self, total_steps: int, start_step: int = 0, stream: TextIO | None = None,
               width: int = 24):
    self.total, self.stream, self.width = total_steps, stream or sys.stdout, width
    self.enabled = jax.process_index() == 0
    self.start_clock(start_step)

  def start_clock(self, step: int) -> None:
    """Times the steps after ``step`` (call it once the first, compiling step is done)."""
    self._start, self._start_step = time.perf_counter(), step

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
