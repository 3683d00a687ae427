"""Stopping a run cleanly on SIGTERM (preemption) and SIGINT (Ctrl-C).

``STOP_SIGNALS`` records them for the training loop, which polls ``received``,
saves the last completed step and exits with ``STOP_EXIT_CODES[signal]`` (143,
130); with nothing new to save, or at a second signal, it exits at once.
``meshbayes.train`` installs it first, ``trainer.train`` when called in-process;
a module of its own so the library need not import the command line.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

STOP_EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}  # 128 + the signal


class StopSignals:
  """SIGTERM and SIGINT, recorded for the training loop, which polls ``received``.

  Python runs a signal handler only between bytecodes of the main thread, which
  compilation or a restore holds for minutes; so the signals also wake a
  watcher thread (``signal.set_wakeup_fd``) which, while ``exit_at_once`` is
  set (nothing new to save), runs the ``at_quick_exit`` callbacks and exits.
  """

  def __init__(self):
    self.received: int | None = None
    self.exit_at_once = True
    self._quick_exit_callbacks: list[Callable[[], None]] = []
    self._previous: dict[int, Any] | None = None
    self._previous_wakeup_fd = -1
    self._wakeup: socket.socket | None = None  # written by Python's C-level handler

  def install(self) -> bool:
    """Installs the handlers (main thread only); whether this call installed them."""
    if self._previous is not None or threading.current_thread() is not threading.main_thread():
      return False
    self.received, self.exit_at_once = None, True
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    self._wakeup = writer
    self._previous_wakeup_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    self._previous = {s: signal.signal(s, self._record) for s in STOP_EXIT_CODES}
    threading.Thread(target=self._watch, args=(reader,), name="stop-signals",
                     daemon=True).start()
    return True

  def uninstall(self) -> None:
    """Restores the previous handlers."""
    if self._previous is None:
      return
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    signal.set_wakeup_fd(self._previous_wakeup_fd)
    self._previous = None
    self._quick_exit_callbacks.clear()
    self._wakeup.close()  # ends the watcher

  def at_quick_exit(self, callback: Callable[[], None]) -> None:
    """Runs ``callback`` (e.g. releasing a lock) before exiting at once."""
    self._quick_exit_callbacks.append(callback)

  def _record(self, signum: int, frame: Any) -> None:
    del frame
    if self.received is None:
      self.received = signum

  def _watch(self, reader: socket.socket) -> None:
    seen = False
    while data := reader.recv(64):
      for signum in data:
        if signum not in STOP_EXIT_CODES:
          continue
        if self.exit_at_once or seen:  # nothing new to save, or a second signal
          self._exit_now(signum, saving=seen and not self.exit_at_once)
        seen = True
    reader.close()

  def _exit_now(self, signum: int, saving: bool) -> None:
    name = signal.Signals(signum).name
    why = ("a second signal during the save; the last complete checkpoint is kept" if saving
           else "no step completed since the last checkpoint, nothing to save")
    for callback in self._quick_exit_callbacks:
      try:
        callback()
      except Exception:  # exiting regardless
        pass
    print(f"{name}: stopped ({why})", flush=True)
    sys.stderr.flush()
    os._exit(STOP_EXIT_CODES[signum])


STOP_SIGNALS = StopSignals()
