"""Translation tasks, T5X-style: Tatoeba English-French and WMT through TFDS.

Registered on import, read only when requested, never downloaded: ``tatoeba_enfr``,
``tatoeba_fren``, ``tatoeba_enfr_20k`` (``make data``; vocabulary ``tatoeba_en-fr``; its
``pool`` split and ``pool_N`` samples: ``tatoeba_pool``),
``wmt14_enfr``/``fren`` (``wmt_en-fr``), ``wmt14_ende``/``deen`` and
``wmt_t2t_ende``/``deen`` (``wmt_en-de``). Preprocessing: docs/training.md.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Iterator, Mapping, Sequence

from etils import epath

from meshbayes.data import paths, tatoeba, tatoeba_pool
from meshbayes.data.backend import seqio, tf
from meshbayes.data.offline_tfds import OfflineTfdsDataSource
from meshbayes.data.sentencepiece_vocab import PreparedVocabulary
from meshbayes.data.sources import FunctionDataSource

SPLITS = ("train", "validation", "test")
# A subset task's held-out pool (``tatoeba_pool``), all of it in sample order; POOL_SPLIT
# + "_N" names its sample of N sources (any N, so the name is not in the task's splits).
POOL_SPLIT = "pool"
_LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TranslationTask:
  """What a registered translation task translates and with which vocabulary."""

  name: str
  source_language: str
  target_language: str
  vocabulary: PreparedVocabulary


TASKS: dict[str, TranslationTask] = {}


def bleu(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
  """Corpus BLEU, ``{'bleu': score}``: ``meshbayes.metrics.bleu.bleu``, imported when scored."""
  from meshbayes.metrics.bleu import bleu as corpus_bleu  # pylint: disable=import-outside-toplevel
  return corpus_bleu(targets, predictions)


def translate(dataset: tf.data.Dataset, source_language: str, target_language: str
              ) -> tf.data.Dataset:
  """``{source: text, target: text, ...}`` -> ``{'inputs': source, 'targets': target}``."""
  return dataset.map(lambda ex: {"inputs": ex[source_language], "targets": ex[target_language]},
                     num_parallel_calls=tf.data.AUTOTUNE)


def check_vocabularies(dataset: tf.data.Dataset,
                       output_features: Mapping[str, seqio.Feature]) -> tf.data.Dataset:
  """Raises the vocabularies' one-line error before tokenization traces them (inside
  ``Dataset.map`` it would come back wrapped in a multi-line message)."""
  for feature in output_features.values():
    if isinstance(feature.vocabulary, PreparedVocabulary):
      feature.vocabulary.check()
  return dataset


@functools.lru_cache(maxsize=4)
def _read_tatoeba(path: str, size: int, mtime_ns: int) -> tuple[list[str], list[str]]:
  del size, mtime_ns  # cache keys: a rewritten file is read again
  parsed = tatoeba.read_tsv(path)
  if parsed.malformed:
    invalid = f" ({parsed.invalid_utf8} not valid UTF-8)" if parsed.invalid_utf8 else ""
    _LOG.warning("%s: skipped %d malformed lines%s", path, parsed.malformed, invalid)
  return [p.english for p in parsed.pairs], [p.translation for p in parsed.pairs]


def _tatoeba_split(split: str) -> tuple[epath.Path, int, int]:
  """A prepared split's file, size and modification time (ns), or a one-line error saying
  how to prepare it."""
  path = tatoeba.split_path(paths.data_dir(), split)
  if not path.is_file():
    raise ValueError(f"Tatoeba data not found: {path} is missing; run `make data` (or set "
                     "MESHBAYES_DATA_DIR to a prepared data directory)")
  if "://" in str(path):  # epath's stat has whole seconds; os.stat is finer
    stat = path.stat()
    return path, stat.length, int(stat.mtime * 1e9)
  stat = os.stat(path)
  return path, stat.st_size, stat.st_mtime_ns


def tatoeba_fingerprint(split: str) -> str:
  """What a Tatoeba split is read from: its file's size and modification time (a pool
  split's: every split's)."""
  if _pool_size(split) != -1:
    return f"{split} of " + ", ".join(map(tatoeba_fingerprint, SPLITS))
  path, size, mtime_ns = _tatoeba_split(split)
  return f"{path.name}: {size} bytes, modified at {mtime_ns} ns"


def _pool_size(split: str) -> int | None:
  """The sources a pool split takes (None: all of them), or -1 for another split; a
  malformed pool split name is a one-line error."""
  if split == POOL_SPLIT:
    return None
  if not split.startswith(POOL_SPLIT + "_"):
    return -1
  digits = split[len(POOL_SPLIT) + 1:]
  if not (digits.isascii() and digits.isdigit()) or int(digits) < 1:
    raise ValueError(f"split {split!r}: a pool sample is named {POOL_SPLIT}_N with N a whole "
                     f"number of sources, 1 or more (e.g. '{POOL_SPLIT}_22400'), or "
                     f"{POOL_SPLIT!r} for the whole pool")
  return int(digits)


@functools.lru_cache(maxsize=2)
def _read_pool(subset_pairs: int, files: tuple[tuple[str, int, int], ...]
               ) -> list[tatoeba_pool.Source]:
  """The pool of the first ``subset_pairs`` training pairs; ``files``: each split's path,
  size and modification time (ns), as ``_read_tatoeba`` reads them (and keys its cache)."""
  splits = {split: [tatoeba.Pair(e, f) for e, f in zip(*_read_tatoeba(*file))]
            for split, file in zip(SPLITS, files)}
  return tatoeba_pool.build_pool(splits, subset_pairs).sources


def pool_pairs(split: str, train_pairs: int | None) -> tuple[list[str], list[str]]:
  """A pool split's English and French sentences, source by source in sample order.

  Args:
    split: ``POOL_SPLIT`` (the whole pool) or ``POOL_SPLIT + '_N'`` (its first N sources).
    train_pairs: the training subset the pool is held out from (None: the whole
      training split, which leaves no pool: an error).
  """
  if train_pairs is None:
    raise ValueError(f"split {split!r}: a pool is held out from a training subset; this "
                     "task trains on the whole training split (the pool is "
                     "tatoeba_enfr_20k's)")
  size = _pool_size(split)
  files = tuple((str(path), file_size, mtime_ns)
                for path, file_size, mtime_ns in map(_tatoeba_split, SPLITS))
  sources = _read_pool(train_pairs, files)
  if size is not None:
    try:
      sources = tatoeba_pool.sample(sources, size)
    except ValueError as error:
      raise ValueError(f"split {split!r}: {error}") from None
  pairs = [pair for source in sources for pair in source.pairs]
  return [p.english for p in pairs], [p.translation for p in pairs]


def shuffled_epochs(size: int, seed: int) -> tf.data.Dataset:
  """``0, ..., size - 1`` endlessly, each epoch in its own pseudorandom order.

  Epoch ``e``'s order is the permutation ``tf.random.experimental.index_shuffle``
  computes index by index from ``(seed, e)``: deterministic, nothing held in
  memory, and an iterator's saved state is two counters (a few KB at any
  size; a shuffle buffer of the split holds the split). The epochs are counted
  here rather than by a ``repeat`` downstream because a key drawn at random for
  each repetition is lost on restore when a parallel map has read ahead across
  an epoch's end (seqio's tokenizer reads 256 ahead): the resumed epochs would
  differ.
  """
  if size == 0:
    return tf.data.Dataset.range(0)
  return tf.data.Dataset.range(2**62).flat_map(lambda epoch: tf.data.Dataset.range(size).map(
      lambda i: tf.random.experimental.index_shuffle(
          i, tf.stack([tf.constant(seed, tf.int64), epoch]), size - 1)))


def tatoeba_dataset(split: str, shuffle_files: bool, seed: int | None = None,
                    train_pairs: int | None = None) -> tf.data.Dataset:
  """A prepared Tatoeba split as ``{'en', 'fr'}`` text, read when requested.

  ``train_pairs`` keeps the training split's first pairs only: the file holds
  its groups of translations in a salted-hash order (``tatoeba.split_pairs``),
  so they are a fixed sample of the split, not its shortest or oldest pairs.
  With it, split ``POOL_SPLIT`` (or ``POOL_SPLIT + '_N'``) is the pool those pairs
  leave unused (or its first N sources; ``pool_pairs``).

  With ``shuffle_files`` the split is read endlessly (for training), each
  epoch in a new order that depends only on ``seed`` (``shuffled_epochs``), and
  the task adds no shuffle buffer: the file keeps a sentence's translations
  together, and seqio's 1,000-example shuffle buffer alone would leave them in
  neighbouring batches. Without it, the file's order, once.
  """
  if _pool_size(split) != -1:
    english, french = pool_pairs(split, train_pairs)
  else:
    path, size, mtime_ns = _tatoeba_split(split)
    english, french = _read_tatoeba(str(path), size, mtime_ns)
  if split == "train" and train_pairs is not None:
    english, french = english[:train_pairs], french[:train_pairs]
  texts = {"en": tf.constant(english, tf.string), "fr": tf.constant(french, tf.string)}
  if shuffle_files:
    indices = shuffled_epochs(len(english), 0 if seed is None else seed)
  else:
    indices = tf.data.Dataset.range(len(english))
  return indices.map(lambda i: {name: tf.gather(text, i) for name, text in texts.items()},
                     num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def source_pairs(task: str, split: str = "train", max_pairs: int | None = None
                 ) -> Iterator[tuple[str, str]]:
  """A translation task's raw ``(source, target)`` sentences, in order (no vocabulary needed)."""
  spec = TASKS[task]
  ds = seqio.get_mixture_or_task(task).source.get_dataset(split=split, shuffle=False)
  if max_pairs is not None:
    ds = ds.take(max_pairs)
  decode = lambda texts: (text.decode("utf-8") for text in texts)
  for batch in ds.batch(4096).as_numpy_iterator():
    yield from zip(decode(batch[spec.source_language]), decode(batch[spec.target_language]))


def _register(name: str, source: seqio.DataSource, source_language: str,
              target_language: str, vocabulary: PreparedVocabulary) -> None:
  TASKS[name] = TranslationTask(name, source_language, target_language, vocabulary)
  if name in seqio.TaskRegistry.names():
    return
  features = {key: seqio.Feature(vocabulary, add_eos=True) for key in ("inputs", "targets")}
  seqio.TaskRegistry.add(
      name, source=source,
      preprocessors=[
          functools.partial(translate, source_language=source_language,
                            target_language=target_language),
          check_vocabularies,
          seqio.preprocessors.tokenize,
          seqio.CacheDatasetPlaceholder(),
          seqio.preprocessors.append_eos_after_trim,
      ],
      output_features=features, metric_fns=[bleu],
      # A source that shuffles the whole split needs no shuffle buffer (nor its state).
      shuffle_buffer_size=(None if source.performs_internal_shuffling
                           else seqio.SHUFFLE_BUFFER_SIZE))


_TATOEBA_VOCABULARY = PreparedVocabulary(
    "tatoeba_en-fr", "run `make data` (it prepares the corpus and trains this vocabulary)")
_TATOEBA_SOURCE = FunctionDataSource(tatoeba_dataset, SPLITS, tatoeba_fingerprint,
                                     shuffles_whole_split=True)
_register("tatoeba_enfr", _TATOEBA_SOURCE, "en", "fr", _TATOEBA_VOCABULARY)
_register("tatoeba_fren", _TATOEBA_SOURCE, "fr", "en", _TATOEBA_VOCABULARY)


def register_tatoeba_subset(name: str, train_pairs: int) -> None:
  """Registers English -> French task ``name``: the first ``train_pairs`` training pairs,
  the same validation and test splits, and the pool the other training pairs give
  (``POOL_SPLIT``, ``POOL_SPLIT + '_N'``)."""
  _register(name, FunctionDataSource(
      functools.partial(tatoeba_dataset, train_pairs=train_pairs), SPLITS + (POOL_SPLIT,),
      tatoeba_fingerprint, shuffles_whole_split=True), "en", "fr", _TATOEBA_VOCABULARY)


# A training set small for its model (the Bayesian Layers paper's regime; `make experiment`);
# its pool is a test split some 50 times the test split's size.
TATOEBA_SUBSET_PAIRS = 20_000
register_tatoeba_subset("tatoeba_enfr_20k", TATOEBA_SUBSET_PAIRS)

_WMT = (  # task prefix, TFDS name, other language
    ("wmt14", "wmt14_translate/fr-en:1.0.0", "fr"),
    ("wmt14", "wmt14_translate/de-en:1.0.0", "de"),
    ("wmt_t2t", "wmt_t2t_translate/de-en:1.0.0", "de"),
)
_WMT_VOCABULARIES = {  # one per language pair, whichever WMT edition
    other: PreparedVocabulary(f"wmt_en-{other}", "train it with `python -m meshbayes.tools.train_vocab "
                              f"--task=wmt14_en{other}` once the TFDS data is prepared")
    for other in ("fr", "de")}
for _prefix, _tfds_name, _other in _WMT:
  _source = OfflineTfdsDataSource(_tfds_name, SPLITS)
  _register(f"{_prefix}_en{_other}", _source, "en", _other, _WMT_VOCABULARIES[_other])
  _register(f"{_prefix}_{_other}en", _source, _other, "en", _WMT_VOCABULARIES[_other])
