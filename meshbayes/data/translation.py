"""Translation tasks, T5X-style: Tatoeba English-French and WMT through TFDS.

Registered on import, read only when requested, never downloaded: ``tatoeba_enfr``,
``tatoeba_fren``, ``tatoeba_enfr_20k`` (``make data``; vocabulary ``tatoeba_en-fr``),
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

from meshbayes.data import paths, tatoeba
from meshbayes.data.backend import seqio, tf
from meshbayes.data.offline_tfds import OfflineTfdsDataSource
from meshbayes.data.sentencepiece_vocab import PreparedVocabulary
from meshbayes.data.sources import FunctionDataSource

SPLITS = ("train", "validation", "test")
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
  """What a Tatoeba split is read from: its file's size and modification time."""
  path, size, mtime_ns = _tatoeba_split(split)
  return f"{path.name}: {size} bytes, modified at {mtime_ns} ns"


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

  With ``shuffle_files`` the split is read endlessly (for training), each
  epoch in a new order that depends only on ``seed`` (``shuffled_epochs``), and
  the task adds no shuffle buffer: the file keeps a sentence's translations
  together, and seqio's 1,000-example shuffle buffer alone would leave them in
  neighbouring batches. Without it, the file's order, once.
  """
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
# A training set small for its model (the Bayesian Layers paper's regime; `make experiment`):
# the first 20,000 training pairs, the same validation and test splits.
TATOEBA_SUBSET_PAIRS = 20_000
_register("tatoeba_enfr_20k", FunctionDataSource(
    functools.partial(tatoeba_dataset, train_pairs=TATOEBA_SUBSET_PAIRS), SPLITS,
    tatoeba_fingerprint, shuffles_whole_split=True), "en", "fr", _TATOEBA_VOCABULARY)

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
