"""Run a multi-host command as N processes on this machine (CPU devices, loopback only).

  python -m meshbayes.tools.launch_local --num_processes 2 --devices_per_process 4 -- \\
    --gin_file=gin_configs/examples/tiny_synthetic_bayesian.gin --gin.MODEL_DIR="'runs/mh'" \\
    --gin.TRAIN_STEPS=20

Starts ``python -m MODULE ARGS --coordinator_address=127.0.0.1:PORT
--num_processes=N --process_id=I --num_cpu_devices=D`` for I = 0..N-1 (a free
port is picked; the coordinator and every process listen on 127.0.0.1 only),
streams their output line by line prefixed with ``[I] ``, and exits with the
worst exit status. When one process fails, the others are stopped (SIGTERM,
then SIGKILL after ``--grace_seconds``). CPU collectives between the processes
go through gloo, JAX's default.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from meshbayes.field_checks import positive_ints

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"
_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


@dataclasses.dataclass(frozen=True)
class LocalRun:
  """N processes of one command on this machine.

  Attributes:
    args: the command's arguments (after ``python -m module``).
    num_processes: how many processes.
    devices_per_process: CPU devices each presents.
    module: the module to run (``meshbayes.train``, ``meshbayes.eval``, ...).
    port: the coordinator's port on 127.0.0.1 (0: pick a free one).
    heartbeat_timeout_seconds: passed on when given.
  """

  args: Sequence[str]
  num_processes: int = 2
  devices_per_process: int = 4
  module: str = "meshbayes.train"
  port: int = 0
  heartbeat_timeout_seconds: int | None = None

  def __post_init__(self):
    positive_ints("launch_local", self, "num_processes", "devices_per_process")
    if not 0 <= self.port < 65536:
      raise ValueError(f"launch_local: port={self.port} must be in [0, 65535]")

  def commands(self, port: int) -> list[list[str]]:
    """The command line of each process."""
    extra = ([f"--heartbeat_timeout_seconds={self.heartbeat_timeout_seconds}"]
             if self.heartbeat_timeout_seconds else [])
    return [[sys.executable, "-m", self.module, *self.args,
             f"--coordinator_address={LOOPBACK}:{port}",
             f"--num_processes={self.num_processes}", f"--process_id={i}",
             f"--num_cpu_devices={self.devices_per_process}", *extra]
            for i in range(self.num_processes)]


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind((LOOPBACK, 0))
    return s.getsockname()[1]


def child_environment(base: dict[str, str] | None = None) -> dict[str, str]:
  """The environment of a worker: CPU platform, and no simulated-device-count flag
  (each worker sets its own count with ``--num_cpu_devices``)."""
  env = dict(os.environ if base is None else base)
  flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_COUNT_FLAG)]
  env["XLA_FLAGS"] = " ".join(flags)
  env.setdefault("JAX_PLATFORMS", "cpu")
  env["PYTHONUNBUFFERED"] = "1"  # lines appear as they are printed
  return env


def start(commands: Sequence[Sequence[str]], env: dict[str, str] | None = None
          ) -> list[subprocess.Popen]:
  """Starts every command in its own process group, output piped (stderr into stdout)."""
  return [subprocess.Popen(list(c), cwd=ROOT, env=env or child_environment(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True) for c in commands]


def _stream(index: int, process: subprocess.Popen, out: TextIO, lock: threading.Lock) -> None:
  for line in process.stdout:
    with lock:
      # A process killed mid-line leaves its last line without a newline; ending it here
      # keeps the next process's line from being glued onto it.
      out.write(f"[{index}] {line}" if line.endswith("\n") else f"[{index}] {line}\n")
      out.flush()


def exit_status(returncode: int) -> int:
  """A shell's view of a status: 128 + N for a process ended by signal N."""
  return 128 - returncode if returncode < 0 else returncode


def stop(processes: Sequence[subprocess.Popen], grace_seconds: float) -> None:
  """SIGTERM to those still running, SIGKILL to those still running after the grace."""
  for p in processes:
    if p.poll() is None:
      p.send_signal(signal.SIGTERM)
  deadline = time.monotonic() + grace_seconds
  for p in processes:
    try:
      p.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()


def supervise(processes: Sequence[subprocess.Popen], out: TextIO = sys.stdout,
              grace_seconds: float = 10.0) -> int:
  """Streams the processes' output until all end; stops the rest when one fails.

  Returns:
    0 when every process succeeded, else the status of the first failure seen
    (the cause: a peer then aborted by the coordination service, or stopped here,
    only follows it); among failures seen at once, the smallest status, an error's
    exit rather than an abort's signal.
  """
  lock = threading.Lock()
  streams = [threading.Thread(target=_stream, args=(i, p, out, lock), daemon=True)
             for i, p in enumerate(processes)]
  for t in streams:
    t.start()
  first_failure = None
  try:
    while any(p.poll() is None for p in processes):
      failed = [i for i, p in enumerate(processes) if p.poll() not in (None, 0)]
      if failed:
        first = min(failed, key=lambda i: exit_status(processes[i].returncode))
        first_failure = exit_status(processes[first].returncode)
        with lock:
          out.write(f"launch_local: process {first} exited with status {first_failure}; "
                    "stopping the others\n")
        stop(processes, grace_seconds)
        break
      time.sleep(0.2)
  except KeyboardInterrupt:
    stop(processes, grace_seconds)
  for t in streams:
    t.join(timeout=5)
  if first_failure is not None:
    return first_failure
  return min((exit_status(p.returncode) for p in processes if p.returncode), default=0)


def main(argv: Sequence[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if "--" in argv:
    split = argv.index("--")
    own, args = argv[:split], argv[split + 1:]
  else:
    own, args = argv, []
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   usage="launch_local.py [options] -- ARGS")
  parser.add_argument("--num_processes", type=int, default=2)
  parser.add_argument("--devices_per_process", type=int, default=4)
  parser.add_argument("--module", default="meshbayes.train")
  parser.add_argument("--port", type=int, default=0, help="coordinator port (0: a free one)")
  parser.add_argument("--heartbeat_timeout_seconds", type=int, default=None)
  parser.add_argument("--grace_seconds", type=float, default=10.0)
  options = parser.parse_args(own)
  if not args:
    parser.error("give the command's arguments after --")
  try:
    run = LocalRun(args=args, num_processes=options.num_processes,
                   devices_per_process=options.devices_per_process, module=options.module,
                   port=options.port, heartbeat_timeout_seconds=options.heartbeat_timeout_seconds)
  except ValueError as error:
    parser.error(str(error))
  processes = start(run.commands(run.port or free_port()))
  return supervise(processes, grace_seconds=options.grace_seconds)


if __name__ == "__main__":
  sys.exit(main())
