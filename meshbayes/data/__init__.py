"""The data layer: seqio tasks and input pipelines.

Importing this package is light (no TensorFlow, no seqio) and gives the gin
configurables ``data.TaskData`` and ``data.train_set_size``; the built-in tasks
(``synthetic``, ``translation``) are registered, and TensorFlow imported, when a
task is first looked up (``pipeline.get_task``) or their module is imported.
"""

from meshbayes.data.pipeline import TaskData, train_set_size

__all__ = ["IdVocabulary", "TaskData", "train_set_size"]


def __getattr__(name: str):
  # IdVocabulary is a seqio vocabulary: seqio is imported when it is asked for.
  if name == "IdVocabulary":
    from meshbayes.data.vocabularies import IdVocabulary  # pylint: disable=import-outside-toplevel
    return IdVocabulary
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
