"""Train a model: ``python -m meshbayes.train --gin_file=... --gin.MODEL_DIR="'/path'"``.

The same command again resumes from MODEL_DIR's latest checkpoint. SIGTERM and
SIGINT are handled from start to exit (one after the last checkpoint ends a
complete run with status 0). Flags: ``meshbayes.launch``; what gin configures:
``meshbayes.training.trainer.train``.
"""

import atexit
import os
import signal
import sys

from meshbayes.launch import run
from meshbayes.runtime import host_memory
from meshbayes.runtime.preemption import STOP_SIGNALS


def main() -> None:
  host_memory.exec_with_malloc_tunables()  # before anything: glibc reads it at start-up
  STOP_SIGNALS.install()  # first: a signal during start-up exits cleanly, at once
  try:
    run("meshbayes.train", "train")
    status = 0
    if STOP_SIGNALS.received:
      print(f"{signal.Signals(STOP_SIGNALS.received).name}: received after the run's last "
            "checkpoint; the run is complete", flush=True)
  except SystemExit as exit_:  # as Python would exit: None is 0, a message is printed and 1
    status = 0 if exit_.code is None else exit_.code
    if not isinstance(status, int):
      print(status, file=sys.stderr)
      status = 1
  # Python restores the default signal actions while it tears itself down (seconds with
  # jax loaded): a signal then would kill the process. The exit handlers run (jax's
  # distributed shutdown among them) while ours are still in place; then leave at once.
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)


if __name__ == "__main__":
  main()
