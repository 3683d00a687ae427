"""The Tatoeba corpus: parsing, the split by sentence groups, preparation and idempotency."""

import collections
import json
import random

import pytest

from meshbayes.data import paths, tatoeba
from tests.data import corpus
from meshbayes.tools import prepare_data


def _write(tmp_path, lines):
  path = tmp_path / "fra.txt"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


@pytest.mark.parametrize("line, expected", [
    ("Go.\tVa !\tCC-BY", tatoeba.Pair("Go.", "Va !", "CC-BY")),
    ("Go.\tVa !", tatoeba.Pair("Go.", "Va !", "")),
    (" Go. \t Va !\r\n", tatoeba.Pair("Go.", "Va !", "")),
    ("Go. Va !", None),
    ("\tVa !\tCC-BY", None),
    ("Go.\t  \tCC-BY", None),
    ("Go.\tVa\t!\tCC-BY", None),
    ("", None),
])
def test_parse_line(line, expected):
  assert tatoeba.parse_line(line) == expected


def test_malformed_lines_are_skipped_and_counted(tmp_path):
  parsed = tatoeba.read_tsv(_write(tmp_path, corpus.french_lines()))
  assert parsed.malformed == len(corpus.MALFORMED) == 5
  assert len(parsed.pairs) == len(corpus.french_lines()) - 5 == 83
  # A line holding U+2028 is one line (str.splitlines would cut it in two).
  assert tatoeba.parse_lines(["A\u2028B.\tC.\tx"]).pairs == [tatoeba.Pair("A\u2028B.", "C.", "x")]


def test_invalid_utf8_lines_are_skipped_and_counted(tmp_path, capsys):
  path = tmp_path / "fra.txt"
  path.write_bytes(b"Go.\tVa !\n" + corpus.INVALID_UTF8 + b"\nHi.\tSalut.\n\xff\n")
  parsed = tatoeba.read_tsv(path)
  assert parsed.pairs == [tatoeba.Pair("Go.", "Va !"), tatoeba.Pair("Hi.", "Salut.")]
  assert (parsed.malformed, parsed.invalid_utf8) == (2, 2)

  # Preparing from a corpus holding one: skipped, counted, reported; progress on stderr.
  sdist, sha256 = corpus.write_sdist(tmp_path, invalid_utf8=True)
  root = tmp_path / "data"
  manifest = tatoeba.prepare(root, sdist, heldout_english=4, ood_sentences=10,
                             expected_sha256=sha256, progress=True)
  assert manifest["malformed"] == {"fra-eng": 6, "spa-eng": 1}
  assert manifest["invalid_utf8"] == {"fra-eng": 1, "spa-eng": 0}
  assert sum(s["pairs"] for s in manifest["splits"].values()) == 83
  assert "malformed lines skipped: 6 (fra-eng, 1 not valid UTF-8), 1 (spa-eng); " in (
      prepare_data._summary(manifest, tatoeba.corpus_dir(root)))
  progress = capsys.readouterr().err
  for bar in (f"reading {tatoeba.FRENCH_MEMBER}: 100%", f"reading {tatoeba.SPANISH_MEMBER}: 100%",
              "grouping pairs by sentence: 100%"):
    assert bar in progress


def test_split_puts_every_sentence_in_one_split(tmp_path):
  pairs = tatoeba.read_tsv(_write(tmp_path, corpus.french_lines())).pairs
  splits = tatoeba.split_pairs(pairs, heldout_english=4)

  english = {name: {p.english for p in split} for name, split in splits.items()}
  french = {name: {p.translation for p in split} for name, split in splits.items()}
  for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
    assert not english[a] & english[b] and not french[a] & french[b]
  # Whole groups: at least 4 English sentences, and fewer than 4 + the largest group (2).
  assert all(4 <= len(english[name]) <= 5 for name in ("validation", "test"))
  assert len(english["train"]) == 42 - len(english["validation"]) - len(english["test"])
  # Every pair (the duplicate too) lands somewhere, exactly once.
  assert collections.Counter(p for s in splits.values() for p in s) == collections.Counter(pairs)
  # "Hi." and "Hello!" share "Salut !": same split.
  assert len({name for name, e in english.items() if {"Hi.", "Hello!"} & e}) == 1

  # Deterministic and independent of the corpus order.
  shuffled = list(pairs)
  random.Random(0).shuffle(shuffled)
  again = tatoeba.split_pairs(shuffled, heldout_english=4)
  assert {n: sorted(s) for n, s in again.items()} == {n: sorted(s) for n, s in splits.items()}


@pytest.mark.integration
def test_prepare_writes_the_splits_and_is_idempotent(tmp_path, capsys):
  sdist, sha256 = corpus.write_sdist(tmp_path)
  root = tmp_path / "data"
  manifest = tatoeba.prepare(root, sdist, heldout_english=4, ood_sentences=10,
                             expected_sha256=sha256)

  assert manifest["malformed"] == {"fra-eng": 5, "spa-eng": 1}
  assert sum(s["pairs"] for s in manifest["splits"].values()) == 83
  assert sum(s["english"] for s in manifest["splits"].values()) == 42
  written = {name: tatoeba.read_tsv(tatoeba.split_path(root, name)) for name in tatoeba.SPLITS}
  assert all(w.malformed == 0 for w in written.values())
  assert {name: len(w.pairs) for name, w in written.items()} == {
      name: s["pairs"] for name, s in manifest["splits"].items()}
  assert all(p.attribution.startswith("CC-BY 2.0 (France)")
             for w in written.values() for p in w.pairs)
  ood = tatoeba.ood_path(root).read_text(encoding="utf-8").splitlines()
  assert len(ood) == len(set(ood)) == manifest["ood_spanish"] == 10
  assert all(line.startswith("Veo ") for line in ood)
  assert "CC-BY 2.0 FR" in (root / "tatoeba" / "ATTRIBUTION.md").read_text()
  assert json.loads((root / "tatoeba" / "manifest.json").read_text()) == manifest

  # Prepared: the command line leaves it alone, or does it again with --force.
  capsys.readouterr()
  assert prepare_data.main(["--data_dir", str(root), "--sdist", str(sdist)]) == manifest
  out = capsys.readouterr().out
  assert out.startswith("prepare_data: preparing the Tatoeba English-French corpus")
  assert "already prepared" in out
  tatoeba.split_path(root, "test").unlink()  # incomplete: prepared again
  assert tatoeba.read_manifest(root) is None


@pytest.mark.integration
def test_prepare_rejects_another_source_distribution(tmp_path, capsys):
  sdist, _ = corpus.write_sdist(tmp_path)
  with pytest.raises(ValueError, match=rf"sha256 \w+ is not the expected {tatoeba.SDIST_SHA256}"):
    tatoeba.prepare(tmp_path / "data", sdist)
  with pytest.raises(SystemExit):
    prepare_data.main(["--data_dir", str(tmp_path / "data"), "--sdist", str(sdist)])
  error = capsys.readouterr().err
  assert error.startswith("prepare_data: error: ") and error.count("\n") == 1
  assert not (tmp_path / "data" / "tatoeba").exists()


def test_the_real_prepared_corpus():
  """The corpus `make data` prepared (skipped before it ran)."""
  root = paths.data_dir()
  manifest = tatoeba.read_manifest(root)
  if manifest is None:
    pytest.skip(f"no prepared corpus in {root}; run `make data`")
  splits = {name: tatoeba.read_tsv(tatoeba.split_path(root, name)) for name in tatoeba.SPLITS}
  assert all(s.malformed == 0 for s in splits.values())
  assert sum(len(s.pairs) for s in splits.values()) == 178_009
  english = {name: {p.english for p in s.pairs} for name, s in splits.items()}
  french = {name: {p.translation for p in s.pairs} for name, s in splits.items()}
  assert sum(map(len, english.values())) == len(set().union(*english.values())) == 125_045
  assert sum(map(len, french.values())) == len(set().union(*french.values()))
  assert len(english["validation"]) == len(english["test"]) == 2000
  assert manifest["malformed"] == {"fra-eng": 0, "spa-eng": 0}
  assert len(tatoeba.ood_path(root).read_text(encoding="utf-8").splitlines()) == 3000
