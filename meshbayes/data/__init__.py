"""The data layer: seqio tasks and input pipelines. TensorFlow is imported here only.

Importing this package registers the built-in tasks (``synthetic_copy``,
``synthetic_reverse``; the translation tasks of ``translation``: ``tatoeba_enfr``,
``tatoeba_fren``, ``wmt14_enfr``, ...) and the gin configurables ``data.TaskData``
and ``data.train_set_size``.
"""

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
  """TensorFlow 2.21 prints start-up notices from C++ (oneDNN, CUDA probing) before its
  logging is configured, so TF_CPP_MIN_LOG_LEVEL cannot silence them; hide file
  descriptor 2 while it loads. ``MESHBAYES_TF_LOGS=1`` shows them."""
  if os.environ.get("MESHBAYES_TF_LOGS"):
    yield
    return
  sys.stderr.flush()
  saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 2)
  try:
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)


os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
with _quiet_native_stderr():
  import tensorflow as tf

  # TensorFlow only feeds data: keep it off accelerators, which JAX owns.
  tf.config.set_visible_devices([], "GPU")
  # Imports seqio; registers the synthetic and the translation tasks.
  from meshbayes.data import synthetic, translation  # noqa: F401

from meshbayes.data.pipeline import TaskData, train_set_size
from meshbayes.data.vocabularies import IdVocabulary

__all__ = ["IdVocabulary", "TaskData", "train_set_size"]
