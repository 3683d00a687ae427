"""One writer per model directory: a lock file held for the life of a training run.

``RunLock`` holds ``MODEL_DIR/RUN_LOCK`` (JSON naming its holder, and a
heartbeat); a second trainer stops with one line naming the holder. A lock left
by a dead process is taken over once its pid is gone (same host) or its
heartbeat is older than ``lease_seconds``. Details, ``gs://`` included:
docs/training.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
from etils import epath

from meshbayes.runtime import strict_json

LOCK_NAME = "RUN_LOCK"


class LockHeldError(OSError):
  """Another live process holds the lock.

  Attributes:
    holder: its record (``host``, ``pid``, ``started``, ...).
    path: the lock file.
  """

  def __init__(self, message: str, holder: dict[str, Any], path: epath.Path):
    super().__init__(message)
    self.holder, self.path = holder, path


def process_start_ticks(pid: int) -> str | None:
  """The process's start time in clock ticks since boot (Linux), None where unknown."""
  try:
    stat = epath.Path(f"/proc/{pid}/stat").read_text()
  except OSError:
    return None
  return stat.rsplit(")", 1)[1].split()[19]  # field 22, after the command name


def _process_is_alive(pid: int, start: str | None) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process: alive
    pass
  return start is None or process_start_ticks(pid) in (None, start)


def _is_local(path: epath.Path) -> bool:
  return "://" not in os.fspath(path)


@dataclasses.dataclass
class RunLock:
  """The lock of one model directory; ``acquire`` it, ``release`` it when the run ends.

  Attributes:
    model_dir: the run's directory (local or a URI such as ``gs://bucket/run``).
    lock_name: the lock file's name in it (another writer's lock: inference's outputs).
    heartbeat_seconds: how often the holder rewrites its heartbeat.
    lease_seconds: a lock whose heartbeat is older is stale for other hosts.
    confirm_seconds: on object stores, the pause before reading the lock back.
  """

  model_dir: epath.Path
  lock_name: str = LOCK_NAME
  heartbeat_seconds: float = 60.0
  lease_seconds: float = 600.0
  confirm_seconds: float = 2.0

  def __post_init__(self):
    self.model_dir = epath.Path(self.model_dir)
    if not 0 < self.heartbeat_seconds < self.lease_seconds:
      raise ValueError(f"RunLock: heartbeat_seconds={self.heartbeat_seconds!r} must be "
                       f"positive and below lease_seconds={self.lease_seconds!r}")
    self.path = self.model_dir / self.lock_name
    self._holder: dict[str, Any] | None = None
    self._stop = threading.Event()
    self._heartbeat: threading.Thread | None = None

  def acquire(self) -> str | None:
    """Takes the lock; returns a note when a stale lock was taken over, else None.

    Raises:
      LockHeldError: another live process holds it (one line naming the holder).
      OSError: the lock file keeps changing.
    """
    pid = os.getpid()
    self._holder = {"host": socket.gethostname(), "pid": pid, "pid_start": process_start_ticks(pid),
                    "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "token": uuid.uuid4().hex,
                    "heartbeat": time.time()}
    note = None
    for _ in range(3):  # a stale lock removed, then a race lost to a new one: tell it
      if self._create():
        break
      holder = self._read()
      if holder is None:  # released (or half-written) meanwhile
        continue
      why = self._stale(holder)
      if why is None:
        raise LockHeldError(
            f"MODEL_DIR {self.model_dir} is in use by another training run (host "
            f"{holder.get('host')}, pid {holder.get('pid')}, started {holder.get('started')}; "
            f"lock {self.path}); stop it, or use another MODEL_DIR", holder, self.path)
      self._remove_stale(holder)
      note = (f"took over the lock of a run that is gone (host {holder.get('host')}, pid "
              f"{holder.get('pid')}, started {holder.get('started')}: {why})")
    else:
      raise OSError(f"could not lock MODEL_DIR {self.model_dir}: {self.path} keeps changing")
    self._heartbeat = threading.Thread(target=self._beat, name="run-lock-heartbeat",
                                       daemon=True)
    self._heartbeat.start()
    return note

  def release(self) -> None:
    """Removes the lock if this process holds it (idempotent)."""
    if self._holder is None:
      return
    self._stop.set()
    if self._heartbeat is not None:
      self._heartbeat.join()
    if (self._read() or {}).get("token") == self._token:
      with contextlib.suppress(OSError):
        self.path.unlink()
    self._holder = None

  @property
  def _token(self) -> str | None:
    return self._holder and self._holder["token"]

  def _create(self) -> bool:
    """Writes the lock if there is none; whether this process now holds it."""
    text = strict_json.dumps(self._holder)
    if _is_local(self.path):
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        return False
      with os.fdopen(fd, "w") as file:
        file.write(text)
      return True
    if self.path.exists():
      return False
    self.path.write_text(text)
    time.sleep(self.confirm_seconds)
    return (self._read() or {}).get("token") == self._token

  def _read(self) -> dict[str, Any] | None:
    try:
      return json.loads(self.path.read_text())
    except (OSError, ValueError):  # gone, or being written
      return None

  def _stale(self, holder: dict[str, Any]) -> str | None:
    """Why ``holder`` no longer holds the lock, None while it may."""
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
      if holder["pid"] == os.getpid() or not _process_is_alive(holder["pid"],
                                                               holder.get("pid_start")):
        return f"no process {holder['pid']} of that run on this host"
      return None
    age = time.time() - float(holder.get("heartbeat", 0))
    if age > self.lease_seconds:
      return f"no heartbeat for {age:.0f} s > lease {self.lease_seconds:.0f} s"
    return None

  def _remove_stale(self, holder: dict[str, Any]) -> None:
    """Removes the lock ``holder`` left, not one another process wrote since."""
    if not _is_local(self.path):
      if (self._read() or {}).get("token") == holder.get("token"):
        with contextlib.suppress(OSError):
          self.path.unlink()
      return
    aside = self.path.with_name(f"{self.path.name}.stale-{uuid.uuid4().hex}")
    try:
      os.rename(self.path, aside)  # atomic: of two processes recovering, one moves it
    except FileNotFoundError:
      return
    moved = json.loads(aside.read_text() or "{}")
    if moved.get("token") != holder.get("token"):  # a new holder's: put it back
      with contextlib.suppress(FileExistsError):
        os.link(aside, self.path)
    aside.unlink()

  def _beat(self) -> None:
    while not self._stop.wait(self.heartbeat_seconds):
      if (self._read() or {}).get("token") not in (None, self._token):
        return  # taken over (this process was silent past the lease): leave it
      self._holder["heartbeat"] = time.time()
      text = strict_json.dumps(self._holder)
      with contextlib.suppress(OSError):  # a missed beat is retried at the next one
        if _is_local(self.path):
          partial = self.path.with_name(f"{self.path.name}.{self._token}.tmp")
          partial.write_text(text)
          partial.replace(self.path)
        else:
          self.path.write_text(text)


def acquire_on_process_0(acquire: Callable[[], tuple[RunLock, str | None]],
                         say: Callable[[str], None], elsewhere: str) -> RunLock | None:
  """Takes a lock on process 0 alone and tells every process whether it failed.

  Args:
    acquire: ``acquire() -> (the held lock, a note or None)``, run on process 0.
    say: prints the note (a stale lock taken over).
    elsewhere: the one line the other processes raise when process 0 failed.

  Returns:
    The held lock on process 0, None on the others.

  Raises:
    OSError, RuntimeError: process 0's own error there, ``elsewhere`` (an OSError) on
      the others.
  """
  import jax  # pylint: disable=import-outside-toplevel  (the lock itself needs no device)
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

  lock, error = None, None
  if jax.process_index() == 0:
    try:
      lock, note = acquire()
      if note:
        say(note)
    except (OSError, RuntimeError) as raised:
      error = raised
  if jax.process_count() > 1:
    failed = bool(multihost_utils.broadcast_one_to_all(np.int32(error is not None)))
    if failed and error is None:
      raise OSError(elsewhere)
  if error is not None:
    raise error
  return lock
