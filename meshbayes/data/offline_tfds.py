"""A seqio TFDS source that reads prepared data and never downloads.

A dataset not prepared in ``paths.tfds_data_dir()`` is a one-line ValueError
saying how to prepare it, raised before TFDS is asked anything (seqio's own
``read_only`` source fails deep inside TFDS, or looks its metadata up on GCS).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from etils import epath

from meshbayes.data import paths
from meshbayes.data.backend import seqio


class OfflineTfdsDataSource(seqio.TfdsDataSource):
  """``seqio.TfdsDataSource`` for a prepared ``name/config:version``, offline.

  Args:
    tfds_name: e.g. ``'wmt14_translate/de-en:1.0.0'`` (config and version required).
    splits: the canonical splits, read from TFDS splits of the same names.
  """

  def __init__(self, tfds_name: str, splits: Sequence[str] = ("train", "validation", "test")):
    name, _, version = tfds_name.partition(":")
    if name.count("/") != 1 or not version:
      raise ValueError(f"OfflineTfdsDataSource: tfds_name={tfds_name!r} must be "
                       "'name/config:version'")
    self._tfds_name = tfds_name
    super().__init__(tfds_name=tfds_name, splits=splits, read_only=True)

  def info_path(self, root: str | os.PathLike | None = None) -> epath.Path:
    """The ``dataset_info.json`` a prepared copy has under ``root`` (default: the TFDS dir,
    local or a URI such as ``gs://bucket/tfds``)."""
    name, _, version = self._tfds_name.partition(":")
    return epath.Path(root or paths.tfds_data_dir()) / name / version / "dataset_info.json"

  def _require_prepared(self) -> None:
    root = paths.tfds_data_dir()
    if not self.info_path(root).is_file():
      name = self._tfds_name
      raise ValueError(
          f"TFDS dataset {name} is not prepared in {root} (no {self.info_path(root)}) and is "
          f"never downloaded at run time; on a machine with internet run `tfds build {name} "
          f"--data_dir=DIR`, copy DIR here and set TFDS_DATA_DIR=DIR")
    self.tfds_dataset.override_data_dir(str(root))

  def get_dataset(self, split: str | None = None, shuffle: bool = True,
                  seed: int | None = None, shard_info: seqio.ShardInfo | None = None,
                  **kwargs):
    self._require_prepared()
    return super().get_dataset(split, shuffle, seed, shard_info, **kwargs)

  def list_shards(self, split: str) -> Sequence[str]:
    self._require_prepared()
    return super().list_shards(split)

  def fingerprint(self, split: str) -> str:
    """What the split is read from: the prepared files' names, sizes and modification
    times (``tfds build`` writes them anew)."""
    directory = self.info_path().parent
    files = [directory / name for name in self.list_shards(split)] + [self.info_path()]
    return f"{self._tfds_name}: " + ", ".join(
        f"{f.name} {stat.length} bytes at {stat.mtime}" for f in files for stat in [f.stat()])

  def num_input_examples(self, split: str) -> int | None:
    self._require_prepared()
    return super().num_input_examples(split)
