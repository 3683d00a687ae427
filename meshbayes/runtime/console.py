"""Console lines of a run that every process executes: printed once, by process 0.

The notes of code every process runs (``opening the training input ...``) go to
stdout from process 0 alone, flushed at once so they keep their order among the
progress bar and the logs when the output goes to a file.
"""

from __future__ import annotations


def say(message: str) -> None:
  """Prints ``message`` (one console line) on stdout, from process 0 only."""
  # Imported here: the data pipeline prints through this and loads without jax.
  import jax  # pylint: disable=import-outside-toplevel

  if jax.process_index() == 0:
    print(message, flush=True)
