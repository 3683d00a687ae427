"""Console lines of a run that every process executes: printed once, by process 0.

In a multi-host run each process runs the same training loop, checkpoint code and
input pipeline; their notes (``opening the training input ...``, ``removed the
incomplete checkpoint ...``) are printed by process 0 alone, to stdout and
flushed at once, so they interleave in order with the progress bar and the
logs of a run whose output goes to a file.
"""

from __future__ import annotations


def say(message: str) -> None:
  """Prints ``message`` (one console line) on stdout, from process 0 only."""
  # Imported here: the data pipeline prints through this and loads without jax.
  import jax  # pylint: disable=import-outside-toplevel

  if jax.process_index() == 0:
    print(message, flush=True)
