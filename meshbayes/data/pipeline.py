"""Input pipelines: a task's examples as numpy batches for one host.

Training batches are deterministic given the seed and the host's shard, so a
run restarts exactly where it stopped by skipping the batches it consumed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Iterator, Mapping

import numpy as np
import seqio
import tensorflow as tf

from meshbayes.data import paths

Batch = dict[str, np.ndarray]
_FEATURES = ("inputs", "targets")


def get_task(name: str) -> seqio.Task | seqio.Mixture:
  """A registered task or mixture, with a one-line error naming the known ones."""
  try:
    return seqio.get_mixture_or_task(name)
  except ValueError:
    known = sorted(seqio.TaskRegistry.names()) + sorted(seqio.MixtureRegistry.names())
    raise ValueError(f"task {name!r} is not registered; registered tasks: "
                     f"{', '.join(known)}") from None


@dataclasses.dataclass(frozen=True)
class DataLayout:
  """What this host reads: see ``partitioning.DataLayout`` (same fields)."""

  per_host_batch_size: int
  shard_id: int = 0
  num_shards: int = 1


@dataclasses.dataclass(frozen=True, eq=False)
class TaskData:
  """Where a run's examples come from and how they are batched.

  Attributes:
    task: a registered seqio task or mixture.
    feature_lengths: ``{'inputs': L_in, 'targets': L_out}``; longer examples
      are truncated (EOS kept).
    batch_size: global batch size (examples per step over all hosts).
    seed: shuffling seed of the training split.
    shuffle: shuffle the training split.
    eval_split: split for teacher-forced evaluation.
    max_eval_batches: evaluate at most this many batches (None: the split).
  """

  task: str
  feature_lengths: Mapping[str, int]
  batch_size: int
  seed: int = 0
  shuffle: bool = True
  eval_split: str = "validation"
  max_eval_batches: int | None = None

  def __post_init__(self):
    get_task(self.task)
    lengths = dict(self.feature_lengths)
    if sorted(lengths) != sorted(_FEATURES) or any(
        not isinstance(v, int) or v < 1 for v in lengths.values()):
      raise ValueError(f"TaskData: feature_lengths={lengths!r} must map 'inputs' and 'targets' "
                       "to positive ints")
    if not isinstance(self.batch_size, int) or self.batch_size < 1:
      raise ValueError(f"TaskData: batch_size={self.batch_size!r} must be a positive int")

  def input_shapes(self) -> dict[str, tuple[int, int]]:
    """The global batch's feature shapes (``EncDecFeatureConverter``'s features)."""
    lengths = {"encoder_input_tokens": "inputs", "decoder_input_tokens": "targets",
               "decoder_target_tokens": "targets", "decoder_loss_weights": "targets"}
    return {name: (self.batch_size, self.feature_lengths[feature])
            for name, feature in lengths.items()}

  @property
  def vocabulary(self) -> seqio.Vocabulary:
    """The targets' vocabulary (the inputs' for encoder-decoder tasks is the same)."""
    return get_task(self.task).output_features["targets"].vocabulary

  def _dataset(self, split: str, layout: DataLayout, shuffle: bool, repeat: bool
               ) -> tf.data.Dataset:
    return seqio.get_dataset(
        mixture_or_task_name=self.task, task_feature_lengths=dict(self.feature_lengths),
        feature_converter=seqio.EncDecFeatureConverter(pack=False), dataset_split=split,
        shuffle=shuffle, num_epochs=None if repeat else 1,
        shard_info=seqio.ShardInfo(layout.shard_id, layout.num_shards), seed=self.seed,
        use_cached=False, verbose=False)

  def train_batches(self, layout: DataLayout, start_batch: int = 0) -> Iterator[Batch]:
    """This host's training batches, endlessly, from batch ``start_batch`` on."""
    ds = self._dataset("train", layout, self.shuffle, repeat=True)
    ds = ds.batch(layout.per_host_batch_size, drop_remainder=True).skip(start_batch)
    return ds.prefetch(2).as_numpy_iterator()

  def eval_batches(self, layout: DataLayout, split: str | None = None) -> Iterator[Batch]:
    """This host's share of a split, in order; the last batch is padded with empty rows."""
    ds = self._dataset(split or self.eval_split, layout, shuffle=False, repeat=False)
    ds = ds.batch(layout.per_host_batch_size, drop_remainder=False)
    if self.max_eval_batches is not None:
      ds = ds.take(self.max_eval_batches)
    for batch in ds.as_numpy_iterator():
      missing = layout.per_host_batch_size - len(next(iter(batch.values())))
      yield {k: np.pad(v, [(0, missing)] + [(0, 0)] * (v.ndim - 1)) for k, v in batch.items()}


def _vocabulary_fingerprint(vocabulary: seqio.Vocabulary) -> str:
  if isinstance(vocabulary, seqio.SentencePieceVocabulary):
    return hashlib.sha256(vocabulary.sp_model).hexdigest()[:16]
  return f"{type(vocabulary).__name__}:{vocabulary.vocab_size}"


@functools.cache
def _count(task: str, lengths: tuple[tuple[str, int], ...], unit: str, split: str) -> int:
  """Counted once per data directory: ``<data dir>/cache/`` keeps it (``make data``
  clears it when it prepares the corpus again; a new vocabulary changes the key)."""
  vocabulary = get_task(task).output_features["targets"].vocabulary
  try:
    fingerprint = _vocabulary_fingerprint(vocabulary)
  except ValueError:  # no vocabulary yet: counting below says what is missing first
    fingerprint = None
  key = f"{task}|{dict(lengths)}|{unit}|{split}|{fingerprint}"
  cache = paths.data_dir() / "cache" / "train_set_size.json"
  known = json.loads(cache.read_text()) if cache.is_file() else {}
  if fingerprint and key in known:
    return int(known[key])
  ds = get_task(task).get_dataset(sequence_length=dict(lengths), split=split, shuffle=False,
                                  use_cached=False)
  if unit == "examples":
    count = int(ds.reduce(0, lambda n, _: n + 1).numpy())
  else:
    count = int(ds.reduce(0, lambda n, ex: n + tf.size(ex["targets"])).numpy())
  with contextlib.suppress(OSError):  # a read-only data directory only loses the cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(dict(known, **{key: count}), indent=1))
    partial.replace(cache)
  return count


def train_set_size(task: str, feature_lengths: Mapping[str, int], unit: str = "tokens",
                   split: str = "train") -> int:
  """Size of a task's training split in target tokens (after truncation) or examples.

  This is the ``D`` the KL is divided by (``meshbayes.layers.kl``): use the
  unit the loss averages the NLL over.
  """
  if unit not in ("tokens", "examples"):
    raise ValueError(f"train_set_size: unit={unit!r} must be 'tokens' or 'examples'")
  return _count(task, tuple(sorted(dict(feature_lengths).items())), unit, split)
