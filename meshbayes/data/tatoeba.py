"""The Tatoeba English-French corpus: preparation (``make data``) and reading.

``prepare`` writes the splits, Spanish OOD sentences, attribution and manifest
under ``<data dir>/tatoeba/`` from the ``nmt==0.0.6`` source distribution;
``split_pairs`` keeps every sentence's translations in one split. Files and the
split rule: docs/training.md ("Data inside").
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import tqdm
from etils import epath

from meshbayes.runtime import strict_json

SDIST_REQUIREMENT = "nmt==0.0.6"
SDIST_NAME = "nmt-0.0.6.tar.gz"
SDIST_SHA256 = "65db964c0afd5b0dbc4baecdce736f53222f63b791958176b5771db78a005096"
FRENCH_MEMBER, SPANISH_MEMBER = "data/fra-eng.zip", "data/spa-eng.zip"
SPLITS = ("train", "validation", "test")
HELDOUT_ENGLISH = 2000  # distinct English sentences in validation, and in test
OOD_SENTENCES = 3000
FORMAT_VERSION = 1
_SALT = b"meshbayes/tatoeba/v1/"

ATTRIBUTION = """\
# Tatoeba sentence pairs

These files are derived from the Tatoeba Project (https://tatoeba.org) through
the sentence-pair exports of manythings.org (https://www.manythings.org/anki/),
as shipped in the `nmt==0.0.6` source distribution on PyPI
(`data/fra-eng.zip`, `data/spa-eng.zip`).

Licence: Creative Commons Attribution 2.0 France (CC-BY 2.0 FR),
https://creativecommons.org/licenses/by/2.0/fr/ ; terms of use:
https://tatoeba.org/eng/terms_of_use . Attribution: www.manythings.org/anki
and tatoeba.org. The third column of every `.tsv` line keeps the original
per-sentence attribution (sentence numbers and contributors).

Changes: English-French pairs split into train/validation/test by groups of
shared sentences (see `meshbayes/data/tatoeba.py`); a deterministic sample of
the Spanish side of the English-Spanish pairs as out-of-distribution inputs.
"""


class Pair(NamedTuple):
  """One line of a corpus: an English sentence, its translation, their attribution."""

  english: str
  translation: str
  attribution: str = ""


@dataclasses.dataclass(frozen=True)
class Parsed:
  """A corpus read line by line: the well-formed pairs and how many lines were skipped.

  Attributes:
    pairs: the well-formed lines.
    malformed: lines skipped, ``invalid_utf8`` included.
    invalid_utf8: lines skipped because they are not valid UTF-8.
  """

  pairs: list[Pair]
  malformed: int
  invalid_utf8: int = 0


def parse_line(line: str) -> Pair | None:
  """A line ``english<TAB>translation[<TAB>attribution]``, or None when malformed."""
  fields = line.rstrip("\r\n").split("\t")
  if len(fields) not in (2, 3):
    return None  # a tab inside a sentence would make the columns ambiguous
  english, translation = fields[0].strip(), fields[1].strip()
  if not english or not translation:
    return None
  return Pair(english, translation, fields[2].strip() if len(fields) == 3 else "")


def parse_lines(lines: Iterable[str | bytes]) -> Parsed:
  """Well-formed pairs of ``lines`` (text, or bytes decoded as UTF-8), counting the
  malformed ones."""
  pairs, malformed, invalid_utf8 = [], 0, 0
  for line in lines:
    if isinstance(line, bytes):
      try:
        line = line.decode("utf-8")
      except UnicodeDecodeError:
        invalid_utf8 += 1
        continue
    pair = parse_line(line)
    if pair is None:
      malformed += 1
    else:
      pairs.append(pair)
  return Parsed(pairs, malformed + invalid_utf8, invalid_utf8)


def _lines(data: bytes) -> list[bytes]:
  # Split before decoding, so that one bad byte costs one line; only "\n" ends a line
  # (str.splitlines would also split at U+2028, U+0085, ...).
  lines = data.split(b"\n")
  return lines[:-1] if lines and lines[-1] == b"" else lines


def _progress(items: Sequence, description: str, unit: str, enabled: bool) -> Iterable:
  """``items`` with a progress bar on stderr when ``enabled``."""
  return tqdm.tqdm(items, desc=description, unit=f" {unit}", unit_scale=True,
                   disable=not enabled, file=sys.stderr)


def read_tsv(path: str | os.PathLike) -> Parsed:
  """A prepared split (or any file of corpus lines), malformed lines skipped and counted."""
  return parse_lines(_lines(epath.Path(path).read_bytes()))


def _digest(text: str) -> bytes:
  return hashlib.sha256(_SALT + text.encode("utf-8")).digest()


def _groups(pairs: Sequence[Pair], progress: bool = False) -> list[list[int]]:
  """Indices of ``pairs`` grouped by shared English or translated sentences (union-find)."""
  parent = list(range(len(pairs)))

  def root(i: int) -> int:
    while parent[i] != i:
      parent[i] = parent[parent[i]]
      i = parent[i]
    return i

  first: dict[tuple[int, str], int] = {}
  for i, pair in enumerate(_progress(pairs, "grouping pairs by sentence", "pairs", progress)):
    for key in ((0, pair.english), (1, pair.translation)):
      a, b = root(i), root(first.setdefault(key, i))
      if a != b:
        parent[a] = b
  groups = collections.defaultdict(list)
  for i in range(len(pairs)):
    groups[root(i)].append(i)
  return list(groups.values())


def split_pairs(pairs: Sequence[Pair], heldout_english: int = HELDOUT_ENGLISH,
                progress: bool = False) -> dict[str, list[Pair]]:
  """``{'train', 'validation', 'test'}`` -> pairs; no sentence is in two splits.

  Deterministic and independent of the order of ``pairs``: groups are ordered
  by hash, pairs within a group keep their order. ``progress`` shows a bar on
  stderr.
  """
  groups = sorted(_groups(pairs, progress),
                  key=lambda g: _digest(min(pairs[i].english for i in g)))
  splits: dict[str, list[Pair]] = {name: [] for name in SPLITS}
  english: dict[str, set[str]] = {name: set() for name in SPLITS}
  for group in groups:
    name = next((s for s in ("test", "validation") if len(english[s]) < heldout_english),
                "train")
    splits[name].extend(pairs[i] for i in group)
    english[name].update(pairs[i].english for i in group)
  return splits


def ood_sample(pairs: Sequence[Pair], size: int = OOD_SENTENCES) -> list[str]:
  """A deterministic sample of ``size`` distinct translated sentences."""
  return sorted({p.translation for p in pairs}, key=_digest)[:size]


def split_statistics(splits: dict[str, list[Pair]]) -> dict[str, dict[str, int]]:
  """Pairs and distinct sentences of each split."""
  return {name: {"pairs": len(pairs), "english": len({p.english for p in pairs}),
                 "french": len({p.translation for p in pairs})}
          for name, pairs in splits.items()}


def download_sdist(directory: str | Path) -> Path:
  """Downloads the ``nmt`` source distribution with pip into ``directory``."""
  command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--no-binary", ":all:", SDIST_REQUIREMENT, "-d", str(directory)]
  # pip prepares the package's metadata even to download it; its setup.py asks
  # setuptools-scm for a version, which current setuptools no longer finds in the sdist.
  env = dict(os.environ, SETUPTOOLS_SCM_PRETEND_VERSION=SDIST_REQUIREMENT.split("==")[1])
  result = subprocess.run(command, check=False, capture_output=True, text=True, env=env)
  path = Path(directory) / SDIST_NAME
  if result.returncode != 0 or not path.is_file():
    detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"`{' '.join(command)}` failed ({detail}); the corpus needs the "
                       "package registry once, or pass --sdist=PATH to a copy of "
                       f"{SDIST_NAME}")
  return path


def check_sha256(path: str | Path, expected: str = SDIST_SHA256) -> None:
  """Raises ValueError unless the file's SHA-256 is ``expected``."""
  actual = hashlib.sha256(Path(path).read_bytes()).hexdigest()
  if actual != expected:
    raise ValueError(f"{path}: sha256 {actual} is not the expected {expected}; the "
                     f"{SDIST_REQUIREMENT} source distribution differs from the one this "
                     "split was made for")


def _zip_bytes(sdist: tarfile.TarFile, member: str, suffix: str) -> bytes:
  names = [m for m in sdist.getnames() if m.endswith("/" + member)]
  if not names:
    raise ValueError(f"{sdist.name}: no {member} inside")
  with zipfile.ZipFile(io.BytesIO(sdist.extractfile(names[0]).read())) as archive:
    inner = [n for n in archive.namelist() if n.endswith(suffix)]
    if not inner:
      raise ValueError(f"{sdist.name}: {member} has no {suffix}")
    return archive.read(inner[0])


def read_sdist(path: str | Path, progress: bool = False) -> tuple[Parsed, Parsed]:
  """English-French and English-Spanish pairs, read straight from the tarball
  (``progress``: a bar per file on stderr)."""
  with tarfile.open(path) as sdist:
    french = _zip_bytes(sdist, FRENCH_MEMBER, "fra.txt")
    spanish = _zip_bytes(sdist, SPANISH_MEMBER, "spa.txt")
  return (parse_lines(_progress(_lines(french), f"reading {FRENCH_MEMBER}", "lines", progress)),
          parse_lines(_progress(_lines(spanish), f"reading {SPANISH_MEMBER}", "lines", progress)))


def corpus_dir(root: str | os.PathLike) -> epath.Path:
  """The Tatoeba directory under a data directory (local or a URI such as ``gs://b/data``)."""
  return epath.Path(root) / "tatoeba"


def split_path(root: str | os.PathLike, split: str) -> epath.Path:
  """A prepared English-French split under a data directory."""
  return corpus_dir(root) / "fra-eng" / f"{split}.tsv"


def ood_path(root: str | os.PathLike) -> epath.Path:
  """The out-of-distribution Spanish sentences under a data directory."""
  return corpus_dir(root) / "spa-eng" / "ood_spanish.txt"


def _manifest_path(root: str | os.PathLike) -> epath.Path:
  return corpus_dir(root) / "manifest.json"


def read_manifest(root: str | os.PathLike) -> dict | None:
  """The manifest of a complete preparation of this format, or None."""
  path = _manifest_path(root)
  if not path.is_file():
    return None
  manifest = json.loads(path.read_text())
  files = [split_path(root, s) for s in SPLITS] + [ood_path(root)]
  if manifest.get("format_version") != FORMAT_VERSION or not all(f.is_file() for f in files):
    return None
  return manifest


def _write_lines(path: epath.Path, lines: Iterable[str]) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
  tmp.replace(path)


def prepare(root: str | os.PathLike, sdist: str | Path, heldout_english: int = HELDOUT_ENGLISH,
            ood_sentences: int = OOD_SENTENCES, expected_sha256: str = SDIST_SHA256,
            progress: bool = False) -> dict:
  """Writes the corpus under ``root`` from the source distribution; returns its manifest.

  ``progress`` shows bars on stderr while the corpus is read and split.
  """
  check_sha256(sdist, expected_sha256)
  cache = epath.Path(root) / "cache"  # counts of the old corpus
  if cache.exists():
    cache.rmtree()
  french, spanish = read_sdist(sdist, progress)
  splits = split_pairs(french.pairs, heldout_english, progress)
  for name, pairs in splits.items():
    _write_lines(split_path(root, name), ("\t".join(p) for p in pairs))
  ood = ood_sample(spanish.pairs, ood_sentences)
  _write_lines(ood_path(root), ood)
  (corpus_dir(root) / "ATTRIBUTION.md").write_text(ATTRIBUTION)
  manifest = {
      "format_version": FORMAT_VERSION, "source": SDIST_REQUIREMENT, "sha256": expected_sha256,
      "heldout_english": heldout_english, "splits": split_statistics(splits),
      "malformed": {"fra-eng": french.malformed, "spa-eng": spanish.malformed},
      "invalid_utf8": {"fra-eng": french.invalid_utf8, "spa-eng": spanish.invalid_utf8},
      "ood_spanish": len(ood),
  }
  # Written last: its presence means the preparation finished.
  _manifest_path(root).write_text(strict_json.dumps(manifest, indent=2) + "\n")
  return manifest
