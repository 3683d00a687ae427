"""The pool a Tatoeba training subset leaves unused: disjoint, grouped as the test split, in a
fixed order whose prefixes are its samples."""

import random

import pytest
import seqio

from meshbayes.data import paths, tatoeba, tatoeba_pool, translation
from meshbayes.data.pipeline import TaskData
from meshbayes.evaluation.sources import group_sources
from meshbayes.partitioning import DataLayout
from tests.data import corpus

Pair = tatoeba.Pair
LENGTHS = {"inputs": 32, "targets": 32}
SUBSET_TASK = "tatoeba_enfr_pool_test"  # the fake corpus is smaller than 20,000 pairs
SUBSET_PAIRS = 20


def _fake_splits():
  """The fake corpus split as `make data` splits it (4 held-out English sentences each)."""
  return tatoeba.split_pairs(tatoeba.parse_lines(corpus.french_lines()).pairs, heldout_english=4)


def _shared_sentences(pool, splits, subset_pairs):
  used = [*splits["train"][:subset_pairs], *splits["validation"], *splits["test"]]
  pairs = [p for s in pool.sources for p in s.pairs]
  return ({p.english for p in pairs} & {p.english for p in used},
          {p.translation for p in pairs} & {p.translation for p in used})


def test_sources_sharing_a_sentence_are_left_out_whole():
  splits = {
      "train": [Pair("A.", "a1"), Pair("B.", "shared"),  # the subset
                Pair("A.", "a2"),  # its English is in the subset
                Pair("C.", "shared"), Pair("C.", "c"),  # a French sentence is in the subset
                Pair("D.", "d1"), Pair("E.", "e"), Pair("D.", "d2"), Pair("D.", "d1"),
                Pair("F.", "v"),  # its French is in validation
                Pair("T.", "t2"), Pair("G.", "g")],  # T.: its English is in test
      "validation": [Pair("V.", "v")],
      "test": [Pair("T.", "t")],
  }
  pool = tatoeba_pool.build_pool(splits, subset_pairs=2)
  assert sorted(s.english for s in pool.sources) == ["D.", "E.", "G."]
  assert (pool.unused_pairs, pool.excluded_sources) == (10, 4)
  # A source keeps every pair in the file's order (the duplicate too); references are distinct.
  d = next(s for s in pool.sources if s.english == "D.")
  assert d.pairs == (Pair("D.", "d1"), Pair("D.", "d2"), Pair("D.", "d1"))
  assert d.references == ["d1", "d2"]
  assert _shared_sentences(pool, splits, 2) == (set(), set())

  assert tatoeba_pool.pool_statistics(pool) == {
      "sources": 3, "pairs": 5, "references": 4,
      "references_per_source": {"mean": 4 / 3, "median": 1, "max": 2,
                                "distribution": {1: 2, 2: 1}},
      "unused_pairs": 10, "excluded_sources": 4}
  assert tatoeba_pool.describe(tatoeba_pool.pool_statistics(pool)).splitlines() == [
      "pool: 3 sources, 5 pairs, 4 references (10 unused training pairs; 4 of their sources "
      "left out for a shared sentence)",
      "references per source: mean 1.333, median 1, max 2",
      "sources by references: 1: 2 (66.7%), 2: 1 (33.3%)"]


def test_the_pool_of_a_split_corpus_is_disjoint_at_every_cut():
  splits = _fake_splits()
  train = splits["train"]
  straddled = 0
  for cut in range(len(train) + 1):
    pool = tatoeba_pool.build_pool(splits, cut)
    assert _shared_sentences(pool, splits, cut) == (set(), set()), cut
    unused = {p.english for p in train[cut:]}
    assert len(pool.sources) + pool.excluded_sources == len(unused)
    # Every pool source has every pair of its English sentence in the corpus.
    for source in pool.sources:
      assert list(source.pairs) == [p for p in train if p.english == source.english]
    straddled += pool.excluded_sources > 0
  assert straddled > 0  # some cuts fall inside a source: the test saw an exclusion


def test_the_order_is_fixed_and_a_sample_is_a_prefix():
  splits = _fake_splits()
  sources = tatoeba_pool.build_pool(splits, subset_pairs=10).sources
  assert [s.english for s in tatoeba_pool.sample(sources, 5)] == [
      "I see 6 cats.", "I see 5 cats.", "I see 28 cats.", "I see 19 cats.", "I see 18 cats."]
  # SHA-256 of the salted text: the same on every machine and Python.
  assert tatoeba_pool.sort_key("I see 6 cats.").hex()[:16] == "15bbe19e27a75f05"
  # Independent of the order of the unused pairs (only the subset is the file's first pairs).
  rest = list(splits["train"][10:])
  random.Random(0).shuffle(rest)
  shuffled = dict(splits, train=splits["train"][:10] + rest)
  assert [s.english for s in tatoeba_pool.build_pool(shuffled, 10).sources] == [
      s.english for s in sources]
  for small, large in ((1, 2), (3, 7), (7, len(sources))):
    assert tatoeba_pool.sample(sources, large)[:small] == tatoeba_pool.sample(sources, small)


@pytest.mark.parametrize("size", [0, -3, len(_fake_splits()["train"]), 2.0, True, "5"])
def test_a_bad_sample_size_is_one_line(size):
  sources = tatoeba_pool.build_pool(_fake_splits(), subset_pairs=10).sources
  assert len(sources) == 30
  with pytest.raises(ValueError) as error:
    tatoeba_pool.sample(sources, size)
  assert str(error.value) == (f"a pool sample of {size!r} sources: the pool has 30 sources; "
                              "a sample takes 1 to 30")


@pytest.fixture
def subset_task(tmp_path, monkeypatch):
  """The fake corpus prepared with its vocabulary, and a task training on its first pairs."""
  monkeypatch.setenv("MESHBAYES_DATA_DIR", str(tmp_path / "data"))
  corpus.prepare_with_vocabulary(tmp_path / "data")
  translation.register_tatoeba_subset(SUBSET_TASK, SUBSET_PAIRS)
  yield tmp_path / "data"
  seqio.TaskRegistry.remove(SUBSET_TASK)
  del translation.TASKS[SUBSET_TASK]


def _grouped(split):
  data = TaskData(SUBSET_TASK, LENGTHS, batch_size=8)
  vocabulary = translation.TASKS[SUBSET_TASK].vocabulary
  return group_sources(list(data.eval_batches(DataLayout(8), split)), vocabulary, vocabulary)


def test_the_pool_splits_are_grouped_as_the_test_split(subset_task):
  splits = {name: tatoeba.read_tsv(tatoeba.split_path(subset_task, name)).pairs
            for name in tatoeba.SPLITS}
  expected = tatoeba_pool.build_pool(splits, SUBSET_PAIRS).sources
  assert len(expected) == 25

  # The evaluation's grouping (distinct sources, each with its distinct references) of the
  # test split is its sources; of a pool split, the pool's in sample order.
  test = _grouped("test")
  assert sorted(test.texts) == sorted({p.english for p in splits["test"]})
  for text, references in zip(test.texts, test.references):
    assert references == list(dict.fromkeys(p.translation for p in splits["test"]
                                            if p.english == text))
  for split, size in (("pool_5", 5), ("pool_9", 9), ("pool", 25)):
    grouped = _grouped(split)
    assert grouped.texts == [s.english for s in expected[:size]], split
    assert grouped.references == [s.references for s in expected[:size]], split
    assert int((grouped.row_source >= 0).sum()) == sum(len(s.pairs) for s in expected[:size])

  # The same records as the test split's, source by source.
  source = seqio.get_mixture_or_task(SUBSET_TASK).source
  pool = source.get_dataset("pool_9", shuffle=False)
  assert pool.element_spec == source.get_dataset("test", shuffle=False).element_spec
  assert [(e["en"].decode(), e["fr"].decode()) for e in pool.as_numpy_iterator()] == [
      tuple(p[:2]) for s in expected[:9] for p in s.pairs]
  assert translation.tatoeba_fingerprint("pool_9").startswith("pool_9 of train.tsv: ")
  # The task's training split is still its first pairs.
  train = _grouped("train")
  assert int((train.row_source >= 0).sum()) == SUBSET_PAIRS


def test_a_bad_pool_split_is_one_line(subset_task):
  rule = ("a pool sample is named pool_N with N a whole number of sources, 1 or more "
          "(e.g. 'pool_22400'), or 'pool' for the whole pool")
  for split, message in (
      ("pool_0", f"split 'pool_0': {rule}"), ("pool_x", f"split 'pool_x': {rule}"),
      ("pool_26", "split 'pool_26': a pool sample of 26 sources: the pool has 25 sources; a "
                  "sample takes 1 to 25")):
    with pytest.raises(ValueError) as error:
      list(TaskData(SUBSET_TASK, LENGTHS, batch_size=8).eval_batches(DataLayout(8), split))
    assert str(error.value) == message
  # A task training on the whole training split has no pool.
  with pytest.raises(ValueError, match=r"^split 'pool': a pool is held out from a training "
                                       r"subset; this task trains on the whole training split"):
    translation.tatoeba_dataset("pool", shuffle_files=False)


def test_the_pool_of_the_real_prepared_corpus():
  """The pool of `make data`'s corpus and `tatoeba_enfr_20k` (skipped before it ran)."""
  root = paths.data_dir()
  if tatoeba.read_manifest(root) is None:
    pytest.skip(f"no prepared corpus in {root}; run `make data`")
  splits = tatoeba_pool.read_splits(root)
  pool = tatoeba_pool.build_pool(splits, translation.TATOEBA_SUBSET_PAIRS)
  assert _shared_sentences(pool, splits, translation.TATOEBA_SUBSET_PAIRS) == (set(), set())
  figures = tatoeba_pool.pool_statistics(pool)
  assert (figures["sources"], figures["pairs"], figures["references"]) == (
      106_997, 152_232, 152_232)
  assert (figures["unused_pairs"], figures["excluded_sources"]) == (152_232, 0)
  per_source = figures["references_per_source"]
  assert (round(per_source["mean"], 4), per_source["median"], per_source["max"]) == (1.4228, 1, 32)
  assert [per_source["distribution"][k] for k in range(1, 6)] == [
      76_454, 24_148, 2_361, 2_511, 323]
  # The task's pool splits are this pool, in sample order.
  english, french = translation.pool_pairs("pool_3", translation.TATOEBA_SUBSET_PAIRS)
  assert english == ["He's wearing a new coat.", "I couldn't rent a car.", "Now it's personal."]
  assert french == ["Il porte un nouveau manteau.", "Je n'ai pas pu louer de voiture.",
                    "Maintenant, c'est personnel."]
  assert english == [s.english for s in pool.sources[:3]]
