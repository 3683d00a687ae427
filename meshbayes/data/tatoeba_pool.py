"""The pool: held-out Tatoeba sources that a training subset leaves unused, in a fixed order.

A task that trains on the training split's first pairs (``tatoeba_enfr_20k``)
leaves the rest of the split unused. Its pool is every source of those unused
pairs (an English sentence with all of its pairs) that shares no English or
French sentence with the training subset, the validation split or the test
split. The pool is grouped by source as the test split is (each source's pairs
in the file's order, every pair kept) and ordered by a salted SHA-256 of the
source text: a permutation the same on every machine, whose first N sources are
the sample of N, so a larger sample only adds sources after a smaller one.
Figures and use: docs/training.md ("Data inside").
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import statistics as stats
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from meshbayes.data import tatoeba

_SALT = b"meshbayes/tatoeba/pool/v1/"  # not the split's salt: an order of its own


class Source(NamedTuple):
  """One source of the pool: an English sentence and its pairs, in the file's order."""

  english: str
  pairs: tuple[tatoeba.Pair, ...]

  @property
  def references(self) -> list[str]:
    """The distinct translations, in order of appearance (as the evaluation groups them)."""
    return list(dict.fromkeys(p.translation for p in self.pairs))


@dataclasses.dataclass(frozen=True)
class Pool:
  """A training subset's pool.

  Attributes:
    sources: the pool's sources, in sample order.
    unused_pairs: pairs of the training split after the subset.
    excluded_sources: sources of the unused pairs left out for sharing a sentence
      with the subset or a held-out split.
  """

  sources: list[Source]
  unused_pairs: int
  excluded_sources: int


def sort_key(english: str) -> bytes:
  """A source's place in the pool's order: a salted SHA-256 of its text."""
  return hashlib.sha256(_SALT + english.encode("utf-8")).digest()


def build_pool(splits: Mapping[str, Sequence[tatoeba.Pair]], subset_pairs: int) -> Pool:
  """The pool of the training subset ``splits['train'][:subset_pairs]``.

  Args:
    splits: ``{'train', 'validation', 'test'}`` -> pairs, as ``tatoeba.split_pairs``
      makes them (or the prepared files hold them).
    subset_pairs: how many of the training split's first pairs the subset takes.
  """
  if isinstance(subset_pairs, bool) or not isinstance(subset_pairs, int) or subset_pairs < 0:
    raise ValueError(f"subset_pairs={subset_pairs!r} must be a whole number of pairs, 0 or more")
  train = splits["train"]
  used = [*train[:subset_pairs], *splits["validation"], *splits["test"]]
  used_english = {p.english for p in used}
  used_french = {p.translation for p in used}
  unused = collections.defaultdict(list)
  for pair in train[subset_pairs:]:
    unused[pair.english].append(pair)
  # Whole sources only: one shared sentence leaves out the source and all its pairs.
  sources = [Source(english, tuple(pairs)) for english, pairs in unused.items()
             if english not in used_english
             and not any(p.translation in used_french for p in pairs)]
  sources.sort(key=lambda s: sort_key(s.english))
  return Pool(sources, len(train) - min(subset_pairs, len(train)),
              len(unused) - len(sources))


def sample(sources: Sequence[Source], size: int) -> list[Source]:
  """The pool's sample of ``size`` sources: its first ones in sample order."""
  if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= len(sources):
    raise ValueError(f"a pool sample of {size!r} sources: the pool has {len(sources):,} "
                     f"sources; a sample takes 1 to {len(sources):,}")
  return list(sources[:size])


def read_splits(root: str | os.PathLike) -> dict[str, list[tatoeba.Pair]]:
  """The prepared English-French splits under a data directory (``make data``)."""
  if tatoeba.read_manifest(root) is None:
    raise ValueError(f"no prepared Tatoeba corpus in {tatoeba.corpus_dir(root)}; run "
                     "`make data` (or set MESHBAYES_DATA_DIR to a prepared data directory)")
  return {name: tatoeba.read_tsv(tatoeba.split_path(root, name)).pairs
          for name in tatoeba.SPLITS}


def pool_statistics(pool: Pool) -> dict:
  """Sources, pairs and references per source of a pool (and what it left out)."""
  references = [len(s.references) for s in pool.sources]
  return {
      "sources": len(pool.sources),
      "pairs": sum(len(s.pairs) for s in pool.sources),
      "references": sum(references),
      "references_per_source": {
          "mean": stats.fmean(references) if references else float("nan"),
          "median": stats.median(references) if references else float("nan"),
          "max": max(references, default=0),
          "distribution": dict(sorted(collections.Counter(references).items())),
      },
      "unused_pairs": pool.unused_pairs,
      "excluded_sources": pool.excluded_sources,
  }


def describe(figures: Mapping) -> str:
  """``pool_statistics`` as a few lines of text."""
  per_source = figures["references_per_source"]
  sources = figures["sources"]
  share = lambda count: f"{count:,} ({100 * count / sources:.1f}%)"
  top = [f"{k}: {share(v)}" for k, v in per_source["distribution"].items() if k <= 5]
  rest = sum(v for k, v in per_source["distribution"].items() if k > 5)
  return "\n".join([
      f"pool: {sources:,} sources, {figures['pairs']:,} pairs, {figures['references']:,} "
      f"references ({figures['unused_pairs']:,} unused training pairs; "
      f"{figures['excluded_sources']:,} of their sources left out for a shared sentence)",
      f"references per source: mean {per_source['mean']:.3f}, median {per_source['median']:g}, "
      f"max {per_source['max']}",
      "sources by references: " + ", ".join(top + ([f"6 or more: {share(rest)}"] if rest else [])),
  ])


def print_statistics(root: str | os.PathLike, subset_pairs: int) -> dict:
  """Prints the pool of the prepared corpus under ``root`` (``describe``); returns its
  ``pool_statistics``."""
  figures = pool_statistics(build_pool(read_splits(root), subset_pairs))
  print(describe(figures))
  return figures
