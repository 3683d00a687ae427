"""Where prepared data lives: the data directory, vocabularies and TFDS data.

``data_dir()`` is ``$MESHBAYES_DATA_DIR``, else ``<repository>/data``; vocabularies
are ``<data dir>/vocabularies/<name>.model`` (``vocabulary_path``); TFDS data is in
``tfds_data_dir()``. Each is looked up when used and is an ``etils.epath`` path
(``gs://`` works). Details: docs/training.md ("Data inside").
"""

from __future__ import annotations

import os

from etils import epath

REPOSITORY = epath.Path(__file__).resolve().parents[2]
_tfds_data_dir: str | None = None


def data_dir() -> epath.Path:
  """The directory ``make data`` writes to and the tasks read from."""
  return epath.Path(os.environ.get("MESHBAYES_DATA_DIR") or REPOSITORY / "data")


def vocabulary_path(name: str) -> epath.Path:
  """The SentencePiece model named ``name`` (e.g. ``'tatoeba_en-fr'``)."""
  return data_dir() / "vocabularies" / f"{name}.model"


def set_tfds_data_dir(path: str | os.PathLike | None) -> None:
  """Reads TFDS datasets from ``path`` (None: back to ``$TFDS_DATA_DIR``)."""
  global _tfds_data_dir
  _tfds_data_dir = None if path is None else os.fspath(path)


def tfds_data_dir() -> epath.Path:
  """Where prepared TFDS datasets are read from."""
  return epath.Path(_tfds_data_dir or os.environ.get("TFDS_DATA_DIR")
                    or epath.Path("~/tensorflow_datasets").expanduser())
