"""compute.json: an attempt counts a checkpoint only once its save has landed, and its
CPU and wall times span the same interval, from the process's start."""

import errno
import json
import shutil
import subprocess
import sys
import threading
import time

import orbax.checkpoint as ocp
import pytest

from meshbayes.training import checkpoints, compute_log
from tests.training.runs import ROOT, train, train_args, train_or_fail


def strict_loads(text):
  def refuse(constant):
    raise ValueError(f"non-standard JSON constant {constant}")
  return json.loads(text, parse_constant=refuse)


def recorded_steps(model_dir):
  path = model_dir / compute_log.COMPUTE_FILE
  return [a["last_step"] for a in strict_loads(path.read_text())] if path.exists() else []


def landed_steps(model_dir):
  """The complete step directories (orbax renames a save's directory into place when it
  commits)."""
  return [int(d.name) for d in checkpoints.step_dirs(model_dir / "checkpoints")
          if not checkpoints.missing_parts(d)]


@pytest.fixture(scope="module")
def held_run(tmp_path_factory):
  """An 8-step run (saves at 4 and 8) whose every save is held in flight until the
  trainer waits for it: at each wait, before the save may land, what compute.json
  records and which checkpoints have landed, with the time (``time.monotonic``)."""
  model_dir = tmp_path_factory.mktemp("held") / "run"
  gates, seen = [], []
  save_input, wait = checkpoints.InputStateHandler.async_save, checkpoints.Checkpoints.wait

  async def held_save(self, directory, args):  # the input item's write, in the background
    gate = threading.Event()
    gates.append(gate)

    def held_until_waited_for():
      gate.wait(timeout=600)
      return b""

    held = {**args.states, "held": held_until_waited_for}
    return await save_input(self, directory, checkpoints.InputStateSave(held))

  def observed_wait(self):
    seen.append((recorded_steps(model_dir), landed_steps(model_dir), time.monotonic()))
    for gate in gates:  # the saves in flight may land now
      gate.set()
    wait(self)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(checkpoints.InputStateHandler, "async_save", held_save)
    patch.setattr(checkpoints.Checkpoints, "wait", observed_wait)
    started = time.monotonic()
    try:
      train_or_fail(train_args(model_dir, 8))
    finally:
      for gate in gates:
        gate.set()
  return model_dir, started, seen


@pytest.mark.integration
def test_a_step_is_recorded_only_once_its_checkpoint_has_landed(held_run):
  """A kill -9 at any of the waits, while a save is in flight, finds compute.json naming
  only checkpoints that landed."""
  model_dir, _, seen = held_run
  states = []
  for recorded, landed, _ in seen:
    if (recorded, landed) not in states:
      states.append((recorded, landed))
  # In flight: 4 (nothing recorded), 8 (4 recorded); then 8 landed and recorded.
  assert states == [([], []), ([4], [4]), ([8], [4, 8])]
  [attempt] = compute_log.read(model_dir)
  assert (attempt.first_step, attempt.last_step) == (0, 8)
  assert attempt.includes == compute_log.INCLUDES


@pytest.mark.integration
def test_wall_time_counts_from_the_process_start_like_cpu_time(held_run):
  """The final save lands after the trainer's last wait began: the attempt's wall time
  (to that landing) covers at least the span from before ``train`` was called (start-up
  and compilation included) to that wait."""
  model_dir, started, seen = held_run
  last_wait = max(at for recorded, landed, at in seen if landed == [4])
  [attempt] = compute_log.read(model_dir)
  assert attempt.wall_seconds >= last_wait - started > 0


@pytest.mark.integration
def test_a_save_that_fails_in_flight_is_not_recorded(held_run, tmp_path, capsys, monkeypatch):
  """Resumed from 8 to 12, the save of step 12 fails in the background: the attempt, which
  landed no checkpoint, is not recorded; the earlier one is kept as it was."""
  model_dir = tmp_path / "run"
  shutil.copytree(held_run[0], model_dir)
  before = (model_dir / compute_log.COMPUTE_FILE).read_text()

  async def full_disk(self, directory, args):
    async def write():
      raise OSError(errno.ENOSPC, "No space left on device")
    return [ocp.future.CommitFutureAwaitingContractedSignals(write(), name="full_disk")]

  monkeypatch.setattr(checkpoints.InputStateHandler, "async_save", full_disk)
  code, out, err = train(capsys, *train_args(model_dir, 12))
  assert code == 1 and "checkpoint of step 12 could not be written" in err, err[-2000:]
  assert (model_dir / compute_log.COMPUTE_FILE).read_text() == before
  assert recorded_steps(model_dir) == [8]


@pytest.mark.integration
def test_cpu_and_wall_time_share_the_process_start_as_origin(tmp_path):
  """A process that works on the CPU for 0.3 s and sleeps 0.5 s before it records: both
  times include that start-up, and wall time, single-threaded, is at least CPU time."""
  child = ("import sys, time\n"
           "while time.process_time() < 0.3:\n"
           "  pass\n"
           "time.sleep(0.5)\n"
           "from meshbayes.training import compute_log\n"
           "log = compute_log.ComputeLog(sys.argv[1], 0)\n"
           "log.save_started(4)\n"
           "log.save_landed()\n")
  before = time.monotonic()
  result = subprocess.run([sys.executable, "-c", child, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
  elapsed = time.monotonic() - before
  assert result.returncode == 0, result.stderr[-2000:]
  [attempt] = compute_log.read(tmp_path)
  assert (attempt.first_step, attempt.last_step) == (0, 4)
  assert attempt.cpu_seconds >= 0.3
  assert attempt.wall_seconds >= max(0.8, attempt.cpu_seconds)
  assert attempt.wall_seconds <= elapsed


def test_a_started_save_is_not_recorded_until_it_lands(tmp_path):
  log = compute_log.ComputeLog(tmp_path, 0)
  log.save_landed()  # nothing started: nothing to record
  log.save_started(4)
  assert compute_log.read(tmp_path) == []
  log.save_landed()
  assert recorded_steps(tmp_path) == [4]
  log.save_started(8)
  assert recorded_steps(tmp_path) == [4]
  log.save_landed(until_now=True)
  [attempt] = compute_log.read(tmp_path)
  assert attempt.last_step == 8


def test_old_files_read_as_before_and_are_kept(tmp_path):
  """An entry without ``includes`` (its wall time from after compilation) reads as before,
  and stays as it was beside a new attempt's."""
  old = {"first_step": 0, "last_step": 4, "cpu_seconds": 10.0, "wall_seconds": 12.0}
  (tmp_path / compute_log.COMPUTE_FILE).write_text(json.dumps([old]))
  [earlier] = compute_log.read(tmp_path)
  assert (earlier.first_step, earlier.last_step, earlier.cpu_seconds,
          earlier.wall_seconds) == (0, 4, 10.0, 12.0)
  assert earlier.includes == compute_log.OLD_INCLUDES
  assert compute_log.total(tmp_path) == {"cpu_seconds": 10.0, "wall_seconds": 12.0}

  log = compute_log.ComputeLog(tmp_path, 4)
  log.save_started(8)
  log.save_landed()
  first, second = strict_loads((tmp_path / compute_log.COMPUTE_FILE).read_text())
  assert first == dict(old, includes=compute_log.OLD_INCLUDES)
  assert (second["first_step"], second["last_step"]) == (4, 8)
  assert second["includes"] == compute_log.INCLUDES
  assert compute_log.total(tmp_path) == {"cpu_seconds": 10.0 + second["cpu_seconds"],
                                         "wall_seconds": 12.0 + second["wall_seconds"]}
