"""Train a model: ``python -m meshbayes.train --gin_file=... --gin.MODEL_DIR="'/path'"``.

Running the same command again resumes from the latest checkpoint in MODEL_DIR.
SIGTERM and SIGINT are handled from the start (``meshbayes.launch.StopSignals``).
See ``meshbayes.launch`` for the flags and ``meshbayes.trainer.train`` for what
gin configures.
"""

from meshbayes import host_memory
from meshbayes.launch import STOP_SIGNALS, run


def main() -> None:
  host_memory.exec_with_malloc_tunables()  # before anything: glibc reads it at start-up
  STOP_SIGNALS.install()  # first: a signal during start-up exits cleanly, at once
  run("meshbayes.train", "train")


if __name__ == "__main__":
  main()
