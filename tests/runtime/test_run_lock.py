"""The model directory's lock: one holder, named to the next; stale locks taken over."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from meshbayes.runtime.run_lock import LOCK_NAME, RunLock


def _dead_pid():
  process = subprocess.Popen([sys.executable, "-c", "pass"])
  process.wait()
  return process.pid


def _write_lock(model_dir, **holder):
  holder = {"host": socket.gethostname(), "pid": os.getppid(), "pid_start": None,
            "started": "2026-01-01 00:00:00 UTC", "token": "other", "heartbeat": time.time(),
            **holder}
  (model_dir / LOCK_NAME).write_text(json.dumps(holder))


def test_the_holder_is_named_to_a_second_run_and_released(tmp_path):
  first = RunLock(tmp_path)
  assert first.acquire() is None
  holder = json.loads((tmp_path / LOCK_NAME).read_text())
  assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()

  # Another live process on this host (the parent) holds it.
  other = tmp_path / "other"
  other.mkdir()
  _write_lock(other)
  with pytest.raises(OSError) as error:
    RunLock(other).acquire()
  assert str(error.value) == (
      f"MODEL_DIR {other} is in use by another training run (host {socket.gethostname()}, "
      f"pid {os.getppid()}, started 2026-01-01 00:00:00 UTC; lock {other / LOCK_NAME}); stop it, "
      "or use another MODEL_DIR")

  first.release()
  assert not (tmp_path / LOCK_NAME).exists()
  first.release()  # idempotent


@pytest.mark.parametrize("holder, why", [
    ({"pid": "DEAD"}, "no process DEAD of that run on this host"),
    ({"pid_start": "1"}, "no process PARENT of that run on this host"),  # the pid was reused
    ({"host": "elsewhere", "heartbeat": 0.0}, "no heartbeat for"),
])
def test_a_stale_lock_is_taken_over(tmp_path, holder, why):
  dead = _dead_pid()
  holder = {k: dead if v == "DEAD" else v for k, v in holder.items()}
  _write_lock(tmp_path, **holder)
  lock = RunLock(tmp_path)
  note = lock.acquire()
  assert note.startswith("took over the lock of a run that is gone")
  assert why.replace("DEAD", str(dead)).replace("PARENT", str(os.getppid())) in note
  assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
  assert [p.name for p in tmp_path.iterdir()] == [LOCK_NAME]  # the stale one is gone
  lock.release()


def test_another_hosts_lock_holds_while_its_heartbeat_is_fresh(tmp_path):
  _write_lock(tmp_path, host="elsewhere", heartbeat=time.time() - 500)
  with pytest.raises(OSError, match="in use by another training run .host elsewhere"):
    RunLock(tmp_path, lease_seconds=600).acquire()


def test_the_heartbeat_is_refreshed(tmp_path):
  lock = RunLock(tmp_path, heartbeat_seconds=0.05, lease_seconds=1)
  lock.acquire()
  first = json.loads((tmp_path / LOCK_NAME).read_text())["heartbeat"]
  time.sleep(0.3)
  assert json.loads((tmp_path / LOCK_NAME).read_text())["heartbeat"] > first + 0.1
  lock.release()
  assert not (tmp_path / LOCK_NAME).exists()
  with pytest.raises(ValueError, match="heartbeat_seconds=5 must be positive and below "
                                       "lease_seconds=1"):
    RunLock(tmp_path, heartbeat_seconds=5, lease_seconds=1)
