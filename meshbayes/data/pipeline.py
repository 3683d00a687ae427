"""Input pipelines: a task's examples as numpy batches for one host.

Training batches are deterministic given the seed and the host's shard. A run
resumes by restoring its iterators' saved state (``TrainIterator.save``/``restore``,
O(1) in the position) or, for checkpoints that hold none, by dropping the batches
it consumed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np
from etils import epath

from meshbayes import field_checks
from meshbayes.data import paths
from meshbayes.runtime import strict_json
from meshbayes.runtime.console import say

if TYPE_CHECKING:  # imported when used: TensorFlow and seqio take seconds (see backend)
  import seqio
  import tensorflow as tf

  from meshbayes.partitioning import DataLayout

Batch = dict[str, np.ndarray]
_LOG = logging.getLogger(__name__)
_FEATURES = ("inputs", "targets")


def _seqio():
  """seqio, with the built-in tasks registered (the first call imports TensorFlow)."""
  # pylint: disable=import-outside-toplevel
  from meshbayes.data import synthetic, translation  # noqa: F401  (register their tasks)
  from meshbayes.data.backend import seqio
  return seqio


def _tf():
  from meshbayes.data.backend import tf  # pylint: disable=import-outside-toplevel
  return tf


def get_task(name: str) -> seqio.Task | seqio.Mixture:
  """A registered task or mixture, with a one-line error naming the known ones."""
  seqio = _seqio()
  try:
    return seqio.get_mixture_or_task(name)
  except ValueError:
    known = sorted(seqio.TaskRegistry.names()) + sorted(seqio.MixtureRegistry.names())
    raise ValueError(f"task {name!r} is not registered; registered tasks: "
                     f"{', '.join(known)}") from None


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
    field_checks.positive_int("TaskData", "batch_size", self.batch_size)

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
    seqio = _seqio()
    return seqio.get_dataset(
        mixture_or_task_name=self.task, task_feature_lengths=dict(self.feature_lengths),
        feature_converter=seqio.EncDecFeatureConverter(pack=False), dataset_split=split,
        shuffle=shuffle, num_epochs=None if repeat else 1,
        shard_info=seqio.ShardInfo(layout.shard_id, layout.num_shards), seed=self.seed,
        use_cached=False, verbose=False)

  def train_dataset(self, layout: DataLayout) -> tf.data.Dataset:
    """This host's training batches, endlessly (``layout.per_host_batch_size`` rows each)."""
    ds = self._dataset("train", layout, self.shuffle, repeat=True)
    return ds.batch(layout.per_host_batch_size, drop_remainder=True).prefetch(2)

  def train_batches(self, layout: DataLayout, start_batch: int = 0) -> TrainIterator:
    """This host's training batches, endlessly, from batch ``start_batch`` on."""
    batches = TrainIterator(self.train_dataset(layout), f"{self.task} shard "
                            f"{layout.shard_id}/{layout.num_shards}")
    batches.skip(start_batch)
    return batches

  def eval_batches(self, layout: DataLayout, split: str | None = None) -> Iterator[Batch]:
    """This host's share of a split, in order; the last batch is padded with empty rows."""
    ds = self._dataset(split or self.eval_split, layout, shuffle=False, repeat=False)
    ds = ds.batch(layout.per_host_batch_size, drop_remainder=False)
    if self.max_eval_batches is not None:
      ds = ds.take(self.max_eval_batches)
    for batch in ds.as_numpy_iterator():
      missing = layout.per_host_batch_size - len(next(iter(batch.values())))
      yield {k: np.pad(v, [(0, missing)] + [(0, 0)] * (v.ndim - 1)) for k, v in batch.items()}


class TrainIterator:
  """Training batches as numpy, endlessly, whose position can be saved and restored.

  The position is tf.data's iterator state (what ``tf.train.Checkpoint(
  iterator=...)`` writes: the sources' offsets and the shuffle and prefetch
  buffers), so restoring it costs the same at any step. Its size is the
  buffers': seqio's 1,000-example shuffle buffer (none for a task whose source
  shuffles the whole split, as Tatoeba's does in a few KB:
  ``translation.shuffled_epochs``) and the prefetched batches, a few hundred KiB.

  Args:
    dataset: the batches (``TaskData.train_dataset``).
    name: what it reads, for messages.
  """

  def __init__(self, dataset: tf.data.Dataset, name: str):
    self._iterator, self.name = iter(dataset), name

  def __iter__(self) -> TrainIterator:
    return self

  def __next__(self) -> Batch:
    return {k: v.numpy() for k, v in next(self._iterator).items()}

  def skip(self, batches: int) -> None:
    """Reads and drops ``batches`` batches: O(batches), for positions saved as a count."""
    for _ in range(batches):
      next(self._iterator)

  def save(self) -> Callable[[], bytes] | None:
    """Captures the position now and returns a function that serializes it (the slow part
    for large buffers, so it can run in the background); None when the pipeline holds
    state tf.data cannot save (a ``py_function``, say): a resume then skips batches."""
    tf = _tf()
    try:
      # The iterator's saveable, as tf.train.Checkpoint reads it (the Trackable API).
      state = self._iterator._serialize_to_tensors()["_STATE"]  # pylint: disable=protected-access
    except (tf.errors.OpError, ValueError) as error:
      _LOG.warning("the input position of %s cannot be saved (%s); a resume will read and "
                   "drop the batches consumed", self.name, _first_line(error))
      return None
    return lambda: tf.io.serialize_tensor(state).numpy()

  def restore(self, state: bytes) -> None:
    """Moves this (fresh) iterator to the position ``state`` (from ``save``) holds.

    Raises:
      ValueError: ``state`` is not a position of this pipeline.
    """
    tf = _tf()
    try:
      self._iterator._restore_from_tensors(  # pylint: disable=protected-access
          {"_STATE": tf.io.parse_tensor(state, tf.variant)})
    except (tf.errors.OpError, ValueError) as error:
      raise ValueError(f"the saved input position of {self.name} does not fit its input "
                       f"pipeline ({_first_line(error)})") from None


def _first_line(error: BaseException) -> str:
  text = str(error).strip()
  return text.splitlines()[0][:300] if text else type(error).__name__


def vocabulary_fingerprint(vocabulary: seqio.Vocabulary) -> str:
  """The SentencePiece model's hash (a model retrained at the same size differs)."""
  if isinstance(vocabulary, _seqio().SentencePieceVocabulary):
    return "sha256:" + hashlib.sha256(vocabulary.sp_model).hexdigest()[:16]
  return f"{type(vocabulary).__name__}:{vocabulary.vocab_size}"


def _describe(preprocessor: Callable) -> str:
  """A preprocessor by name and bound arguments (``repr`` would hold addresses)."""
  if isinstance(preprocessor, functools.partial):
    bound = [repr(a) for a in preprocessor.args] + [
        f"{k}={v!r}" for k, v in sorted(preprocessor.keywords.items())]
    return f"{_describe(preprocessor.func)}({', '.join(bound)})"
  named = preprocessor if hasattr(preprocessor, "__qualname__") else type(preprocessor)
  return f"{named.__module__}.{named.__qualname__}"


def _data_fingerprint(task: str, split: str) -> str | None:
  """A hash of what the split's examples are made of: each task's source (its
  ``fingerprint(split)``: the files' sizes and modification times, or the parameters of
  generated data) and preprocessing; None when a source has no fingerprint."""
  found = get_task(task)
  tasks = found.tasks if isinstance(found, _seqio().Mixture) else [found]
  described = []
  for each in tasks:
    fingerprint = getattr(each.source, "fingerprint", None)
    if fingerprint is None:
      return None
    described.append([fingerprint(split), [_describe(p) for p in each.preprocessors],
                      sorted((name, f.add_eos) for name, f in each.output_features.items())])
  # strict_json writes what json.dumps would for finite numbers: the hashes stay the same.
  return hashlib.sha256(strict_json.dumps(described).encode()).hexdigest()[:16]


def _cache_key(task: str, lengths: Mapping[str, int], unit: str, split: str) -> str | None:
  """What the count depends on: the task and split, the unit, the data and its
  preprocessing (``_data_fingerprint``), and for target tokens the target length
  (truncation) and vocabulary (tokenization); None without a data fingerprint or a
  vocabulary."""
  data = _data_fingerprint(task, split)
  if data is None:
    return None
  if unit == "examples":
    return f"{task}|{split}|examples|data:{data}"
  try:
    vocabulary = vocabulary_fingerprint(get_task(task).output_features["targets"].vocabulary)
  except ValueError:  # no vocabulary yet: counting says what is missing
    return None
  return f"{task}|{split}|tokens|targets<={lengths['targets']}|{vocabulary}|data:{data}"


def _read_cache(cache: epath.Path) -> dict[str, int]:
  with contextlib.suppress(ValueError):  # an unreadable cache is counted again
    return json.loads(cache.read_text()) if cache.is_file() else {}
  return {}


@functools.cache
def _count(task: str, lengths: tuple[tuple[str, int], ...], unit: str, split: str) -> int:
  """Counted once per data directory and data: ``<data dir>/cache/`` keeps it under a key
  that changes with the split's files, the preprocessing and the vocabulary."""
  what = "target tokens" if unit == "tokens" else "examples"
  key = _cache_key(task, dict(lengths), unit, split)
  cache = paths.data_dir() / "cache" / "train_set_size.json"
  known = _read_cache(cache) if key else {}
  if key in known:
    say(f"{task}/{split}: {int(known[key]):,} {what} (the KL's divisor), from {cache} "
        f"[{key}]")
    return int(known[key])
  then = "; cached afterwards" if key else ""
  say(f"counting the {what} of {task}/{split} (the KL's divisor{then})...")
  start = time.perf_counter()
  ds = get_task(task).get_dataset(sequence_length=dict(lengths), split=split, shuffle=False,
                                  use_cached=False)
  if unit == "examples":
    count = int(ds.reduce(0, lambda n, _: n + 1).numpy())
  else:
    size = _tf().size
    count = int(ds.reduce(0, lambda n, ex: n + size(ex["targets"])).numpy())
  seconds = time.perf_counter() - start
  where = f"cached in {cache} [{key}]"
  if key is None:
    where = f"not cached (the source of {task} has no fingerprint to key it by)"
  else:
    try:
      cache.parent.mkdir(parents=True, exist_ok=True)
      partial = cache.parent / f"{cache.name}.{uuid.uuid4().hex}.tmp"  # hosts count at once
      partial.write_text(strict_json.dumps(dict(known, **{key: count}), indent=1))
      partial.replace(cache)
    except OSError as error:  # a read-only data directory only loses the cache
      where = f"not cached ({_first_line(error)})"
  say(f"{task}/{split}: {count:,} {what} (the KL's divisor), counted in {seconds:.1f} s; "
      f"{where}")
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
