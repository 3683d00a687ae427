"""The translation tasks: Tatoeba from a data directory and WMT from prepared TFDS data, offline."""

import importlib.resources
import logging
import os
import sys
import types

import numpy as np
import pytest
import seqio
from etils import epath
from etils.epath import gpath

from meshbayes import launch
from meshbayes.data import offline_tfds, paths, pipeline, sentencepiece_vocab, tatoeba, translation
from meshbayes.data.backend import tf
from meshbayes.data.pipeline import TaskData, train_set_size
from meshbayes.partitioning import DataLayout
from tests.data import corpus
from meshbayes.tools import train_vocab

LENGTHS = {"inputs": 32, "targets": 32}
WMT_TASKS = ("wmt14_enfr", "wmt14_fren", "wmt14_ende", "wmt14_deen", "wmt_t2t_ende",
             "wmt_t2t_deen")


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
  """A data directory holding the fake corpus, prepared, and its vocabulary."""
  sdist, sha256 = corpus.write_sdist(tmp_path)
  root = tmp_path / "data"
  tatoeba.prepare(root, sdist, heldout_english=4, ood_sentences=10, expected_sha256=sha256)
  monkeypatch.setenv("MESHBAYES_DATA_DIR", str(root))
  train_vocab.main(["--task=tatoeba_enfr", "--vocab_size=40"])
  return root


@pytest.fixture(autouse=True)
def _default_tfds_dir(monkeypatch):
  monkeypatch.setattr(paths, "_tfds_data_dir", None)
  monkeypatch.delenv("TFDS_DATA_DIR", raising=False)


def _examples(task, split="validation"):
  ds = seqio.get_mixture_or_task(task).get_dataset(LENGTHS, split=split, shuffle=False)
  return list(ds.as_numpy_iterator())


def test_tatoeba_tasks_translate_both_ways(data_dir, caplog):
  path = tatoeba.split_path(data_dir, "validation")
  pairs = tatoeba.read_tsv(path).pairs
  with path.open("ab") as f:
    f.write(b"a line without a tab\n" + corpus.INVALID_UTF8 + b"\n")
  vocabulary = translation.TASKS["tatoeba_enfr"].vocabulary
  assert vocabulary.path == data_dir / "vocabularies" / "tatoeba_en-fr.model"
  assert vocabulary.vocab_size == 40

  with caplog.at_level(logging.WARNING):
    for task, source, target in (("tatoeba_enfr", "english", "translation"),
                                 ("tatoeba_fren", "translation", "english")):
      examples = _examples(task)
      assert [e["inputs_pretokenized"].decode() for e in examples] == [
          getattr(p, source) for p in pairs]
      assert [e["targets_pretokenized"].decode() for e in examples] == [
          getattr(p, target) for p in pairs]
      for e in examples:
        assert e["inputs"][-1] == e["targets"][-1] == 1 and 1 not in e["targets"][:-1]
        assert vocabulary.decode(e["targets"][:-1].tolist()) == e["targets_pretokenized"].decode()
      assert translation.bleu in seqio.get_mixture_or_task(task).metric_fns
  assert f"{path}: skipped 2 malformed lines (1 not valid UTF-8)" in caplog.text


def test_training_order_is_a_seeded_shuffle(data_dir):
  first = lambda seed: next(TaskData("tatoeba_enfr", LENGTHS, batch_size=16, seed=seed)
                            .train_batches(DataLayout(16)))["encoder_input_tokens"]
  np.testing.assert_array_equal(first(1), first(1))
  assert not np.array_equal(first(1), first(2))
  # Not the file's order (which keeps a sentence's translations together).
  in_order = TaskData("tatoeba_enfr", LENGTHS, batch_size=16, shuffle=False)
  assert not np.array_equal(first(1), next(in_order.train_batches(DataLayout(16)))[
      "encoder_input_tokens"])
  pairs = tatoeba.read_tsv(tatoeba.split_path(data_dir, "train")).pairs
  assert train_set_size("tatoeba_enfr", LENGTHS, unit="examples") == len(pairs)


def _pairs(dataset):
  return [(e["en"].decode(), e["fr"].decode()) for e in dataset.as_numpy_iterator()]


def _split_epochs(rows, size):
  return [rows[i:i + size] for i in range(0, len(rows), size)]


def test_each_epoch_reads_the_split_in_a_new_seeded_order(data_dir):
  in_file = [(p.english, p.translation)
             for p in tatoeba.read_tsv(tatoeba.split_path(data_dir, "train")).pairs]
  epochs = lambda seed: _split_epochs(_pairs(
      translation.tatoeba_dataset("train", True, seed).take(3 * len(in_file))), len(in_file))
  first = epochs(1)
  assert all(sorted(epoch) == sorted(in_file) for epoch in first)  # each a permutation
  assert len({tuple(in_file), *map(tuple, first)}) == 4  # of its own, none the file's order
  assert epochs(1) == first and epochs(2)[0] != first[0]
  assert _pairs(translation.tatoeba_dataset("train", False)) == in_file


def _saved_size(dataset, elements=3):
  iterator = iter(dataset)
  for _ in range(elements):
    next(iterator)
  return len(tf.io.serialize_tensor(iterator._serialize_to_tensors()["_STATE"]).numpy())


def test_the_saved_position_is_small_and_resumes_exactly_across_epochs(data_dir):
  # The order's state does not grow with the split; a shuffle buffer would hold the
  # split (16.7 KB for this one's 68 pairs).
  assert _saved_size(translation.shuffled_epochs(10**9, 1)) < 2048
  assert _saved_size(translation.tatoeba_dataset("train", True, 1)) < 4096
  data = TaskData("tatoeba_enfr", LENGTHS, batch_size=8, seed=1)
  batches = data.train_batches(DataLayout(8))
  take = lambda stream, n: [next(stream)["encoder_input_tokens"] for _ in range(n)]
  per_epoch = len(tatoeba.read_tsv(tatoeba.split_path(data_dir, "train")).pairs) // 8
  take(batches, per_epoch - 1)
  state = batches.save()()
  expected = take(batches, 2 * per_epoch)  # into the next two epochs
  restored = data.train_batches(DataLayout(8))
  restored.restore(state)
  np.testing.assert_array_equal(take(restored, 2 * per_epoch), expected)


def test_the_cached_split_size_follows_the_data(data_dir, capsys):
  path = tatoeba.split_path(data_dir, "train")
  count = lambda unit: train_set_size("tatoeba_enfr", LENGTHS, unit=unit)
  pipeline._count.cache_clear()
  full = len(tatoeba.read_tsv(path).pairs), count("tokens")
  modified = os.stat(path).st_mtime_ns
  assert count("examples") == full[0] > 10
  lines = path.read_bytes().splitlines(keepends=True)
  path.write_bytes(b"".join(lines[:10]))  # cut, as a user would
  pipeline._count.cache_clear()  # a new run
  capsys.readouterr()
  assert count("examples") == 10
  assert capsys.readouterr().out.startswith("counting the examples of tatoeba_enfr/train")
  assert 0 < count("tokens") < full[1]
  path.write_bytes(b"".join(lines))  # the same file again: its count is in the cache
  os.utime(path, ns=(modified, modified))
  pipeline._count.cache_clear()
  assert count("tokens") == full[1]
  assert " from " in capsys.readouterr().out.splitlines()[-1]


def test_the_preprocessing_is_part_of_the_data_fingerprint(data_dir):
  fingerprint = pipeline._data_fingerprint
  assert fingerprint("tatoeba_enfr", "train") == fingerprint("tatoeba_enfr", "train")
  # The two directions read the same files; only their preprocessing differs.
  assert fingerprint("tatoeba_enfr", "train") != fingerprint("tatoeba_fren", "train")


@pytest.fixture
def fake_gcs(tmp_path, monkeypatch):
  """``gs://bucket/x`` read and written as ``<tmp>/gs:/bucket/x`` through epath."""
  monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)  # else TF's GCS file system
  monkeypatch.chdir(tmp_path)
  with epath.testing.mock_epath():
    yield tmp_path / "gs:" / "bucket"


def test_tatoeba_and_tfds_data_may_be_in_a_bucket(tmp_path, fake_gcs, monkeypatch):
  sdist, sha256 = corpus.write_sdist(tmp_path)
  tatoeba.prepare("gs://bucket/data", sdist, heldout_english=4, ood_sentences=10,
                  expected_sha256=sha256)
  local = fake_gcs / "data" / "tatoeba" / "fra-eng" / "validation.tsv"
  assert str(tatoeba.split_path("gs://bucket/data", "validation")) == \
      "gs://bucket/data/tatoeba/fra-eng/validation.tsv"
  monkeypatch.setenv("MESHBAYES_DATA_DIR", "gs://bucket/data")
  assert _pairs(translation.tatoeba_dataset("validation", False)) == [
      (p.english, p.translation) for p in tatoeba.read_tsv(local).pairs]
  assert translation.tatoeba_fingerprint("validation").startswith(
      f"validation.tsv: {local.stat().st_size} bytes")
  model = sentencepiece_vocab.train(["a b c d e f g"] * 20, "gs://bucket/data/v.model",
                                    vocab_size=12)
  assert str(model) == "gs://bucket/data/v.model" and (fake_gcs / "data" / "v.model").is_file()

  source = offline_tfds.OfflineTfdsDataSource("wmt14_translate/de-en:1.0.0")
  paths.set_tfds_data_dir("gs://bucket/tfds")
  info = "gs://bucket/tfds/wmt14_translate/de-en/1.0.0/dataset_info.json"
  assert str(source.info_path()) == info
  with pytest.raises(ValueError, match=rf"^TFDS dataset \S+ is not prepared in gs://bucket/tfds "
                                       rf"\(no {info}\)"):
    source.list_shards("train")


@pytest.mark.integration
def test_missing_data_names_the_path_and_make_data(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("MESHBAYES_DATA_DIR", str(tmp_path / "absent"))
  expected = tmp_path / "absent" / "tatoeba" / "fra-eng" / "validation.tsv"
  with pytest.raises(ValueError, match=rf"^Tatoeba data not found: {expected} is missing; run "
                                       r"`make data`"):
    _examples("tatoeba_fren")

  # The training command: one line, exit status 1.
  with pytest.raises(SystemExit) as exit_:
    launch.run("meshbayes.train", "train", [
        "--gin_file=examples/tatoeba_enfr_tiny_bayesian.gin", f"--gin.MODEL_DIR='{tmp_path}/run'",
        "--gin.TRAIN_STEPS=2"])
  assert exit_.value.code == 1
  error = capsys.readouterr().err.strip()
  assert error.startswith("meshbayes.train: error: Tatoeba data not found: ")
  assert "absent/tatoeba/fra-eng/train.tsv is missing; run `make data`" in error
  assert "\n" not in error


def test_missing_vocabulary_names_the_path_and_make_data(data_dir):
  (data_dir / "vocabularies" / "tatoeba_en-fr.model").unlink()
  with pytest.raises(ValueError, match=r"^vocabulary \S+/data/vocabularies/tatoeba_en-fr.model "
                                       r"not found; run `make data`"):
    _examples("tatoeba_enfr")


@pytest.mark.integration
def test_corrupt_vocabulary_is_one_line_naming_it_and_make_data(data_dir, capsys):
  path = data_dir / "vocabularies" / "tatoeba_en-fr.model"
  model = path.read_bytes()
  path.write_bytes(model[:len(model) // 2] + b"garbage \xff\xfe")
  with pytest.raises(ValueError, match=rf"^vocabulary {path} is not a valid SentencePiece model "
                                       r"\([^\n]+\); run `make data` \(it prepares the corpus and "
                                       r"trains this vocabulary\)$"):
    _examples("tatoeba_enfr")

  # The training command: one line, exit status 1.
  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_:
    launch.run("meshbayes.train", "train", [
        "--gin_file=examples/tatoeba_enfr_tiny_bayesian.gin",
        f"--gin.MODEL_DIR='{data_dir.parent}/run'", "--gin.TRAIN_STEPS=2"])
  assert exit_.value.code == 1
  error = capsys.readouterr().err.strip()
  assert error.startswith(f"meshbayes.train: error: vocabulary {path} is not a valid "
                          "SentencePiece model") and "\n" not in error

  # `make data` trains it again.
  train_vocab.main(["--task=tatoeba_enfr", "--vocab_size=40"])
  assert f"{path} is not a valid SentencePiece model" in capsys.readouterr().out
  assert path.read_bytes() == model  # deterministic training
  validation = tatoeba.read_tsv(tatoeba.split_path(data_dir, "validation")).pairs
  assert len(_examples("tatoeba_enfr")) == len(validation)


def test_bleu_is_meshbayes_metrics_bleu(monkeypatch):
  calls = []
  fake = types.ModuleType("meshbayes.metrics.bleu")
  fake.bleu = lambda targets, predictions: calls.append((targets, predictions)) or {"bleu": 7.0}
  monkeypatch.setitem(sys.modules, "meshbayes.metrics.bleu", fake)
  assert translation.bleu(["a b"], ["a c"]) == {"bleu": 7.0}
  assert calls == [(["a b"], ["a c"])]


@pytest.mark.parametrize("task", WMT_TASKS)
def test_wmt_without_tfds_data_says_how_to_prepare_it(task, tmp_path):
  paths.set_tfds_data_dir(tmp_path)
  name = {"wmt14_enfr": "wmt14_translate/fr-en", "wmt14_fren": "wmt14_translate/fr-en",
          "wmt_t2t_ende": "wmt_t2t_translate/de-en", "wmt_t2t_deen": "wmt_t2t_translate/de-en",
          }.get(task, "wmt14_translate/de-en") + ":1.0.0"
  with pytest.raises(ValueError, match=rf"^TFDS dataset {name} is not prepared in {tmp_path} "
                                       r".*never downloaded.*`tfds build .* set TFDS_DATA_DIR"):
    _examples(task, "train")
  # TFDS was not asked: no builder (which would look for the data) was made.
  assert not any(str(tmp_path) in str(key)
                 for key in seqio.utils.LazyTfdsLoader._MEMOIZED_BUILDERS)


def test_tfds_data_dir_comes_from_the_setter_then_the_environment(tmp_path, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "env"))
  with pytest.raises(ValueError, match="is not prepared in .*/env "):
    _examples("wmt14_ende")
  paths.set_tfds_data_dir(tmp_path / "set")
  assert paths.tfds_data_dir() == tmp_path / "set"
  paths.set_tfds_data_dir(None)
  assert paths.tfds_data_dir() == tmp_path / "env"


def _prepare_fake_wmt(root, monkeypatch):
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  # Preparing (never reading) needs importlib_resources, which the pinned set lacks.
  monkeypatch.setitem(sys.modules, "importlib_resources", importlib.resources)
  builder = tfds.builder("wmt_t2t_translate/de-en", data_dir=root)
  examples = lambda numbers: ((str(i), {"en": f"The house {i}.", "de": f"Das Haus {i}."})
                              for i in numbers)
  builder._split_generators = lambda dl_manager: {  # fake examples, nothing downloaded
      "train": examples(range(40)), "validation": examples(range(100, 104)),
      "test": examples(range(200, 204))}
  builder.download_and_prepare()


@pytest.mark.integration
def test_wmt_task_reads_prepared_tfds_data(tmp_path, monkeypatch):
  _prepare_fake_wmt(tmp_path / "tfds", monkeypatch)
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
  monkeypatch.setenv("MESHBAYES_DATA_DIR", str(tmp_path / "data"))
  train_vocab.main(["--task=wmt_t2t_deen", "--vocab_size=30"])
  assert (tmp_path / "data" / "vocabularies" / "wmt_en-de.model").is_file()

  examples = _examples("wmt_t2t_deen")
  assert sorted(e["inputs_pretokenized"].decode() for e in examples) == [
      f"Das Haus {i}." for i in range(100, 104)]
  vocabulary = translation.TASKS["wmt_t2t_deen"].vocabulary
  for e in examples:
    assert e["targets_pretokenized"].decode() == e["inputs_pretokenized"].decode().replace(
        "Das", "The").replace("Haus", "house")
    assert vocabulary.decode(e["targets"][:-1].tolist()) == e["targets_pretokenized"].decode()



def test_the_subset_task_trains_on_the_first_pairs_and_keeps_the_heldout_splits(data_dir):
  train = tatoeba.read_tsv(tatoeba.split_path(data_dir, "train")).pairs
  subset = translation.tatoeba_dataset("train", shuffle_files=False, train_pairs=5)
  assert len(train) > 5
  assert [e["en"].decode() for e in subset.as_numpy_iterator()] == [
      p.english for p in train[:5]]
  for split in ("validation", "test"):
    inputs = lambda task: [e["inputs_pretokenized"] for e in _examples(task, split)]
    assert inputs("tatoeba_enfr_20k") == inputs("tatoeba_enfr") != []
  # The fake corpus is smaller than the subset: all of its training split.
  assert len(_examples("tatoeba_enfr_20k", "train")) == len(train) < translation.TATOEBA_SUBSET_PAIRS
  # Its pool (tests/data/test_tatoeba_pool.py) is a split of its own; the whole training
  # split leaves none.
  assert seqio.get_mixture_or_task("tatoeba_enfr_20k").splits == (
      "train", "validation", "test", "pool")
  assert seqio.get_mixture_or_task("tatoeba_enfr").splits == ("train", "validation", "test")
