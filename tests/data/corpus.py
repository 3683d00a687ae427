"""A small fake Tatoeba corpus and ``nmt`` source distribution, for tests without the download."""

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

ATTRIBUTION = "CC-BY 2.0 (France) Attribution: tatoeba.org #{} (CM) & #{} (someone)"
MALFORMED = [
    "no tab at all",
    "\tan empty English side\t" + ATTRIBUTION.format(1, 2),
    "An empty French side.\t \t" + ATTRIBUTION.format(3, 4),
    "",
    "one\ttab\ttoo\tmany",
]


def french_lines() -> list[str]:
  """40 English sentences with 1 to 3 translations, linked pairs, a duplicate, malformed lines."""
  lines = []
  for i in range(40):
    for j in range(1 + i % 3):
      lines.append(f"I see {i} cats.\tJe vois {i} chats, version {j}.\t"
                   + ATTRIBUTION.format(i, 100 * i + j))
  # "Salut !" translates two English sentences: all three pairs belong together.
  lines += ["Hi.\tSalut !\t" + ATTRIBUTION.format(7, 8),
            "Hello!\tSalut !\t" + ATTRIBUTION.format(9, 8),
            "Hello!\tBonjour !\t" + ATTRIBUTION.format(9, 10)]
  lines.append(lines[0])  # an exact duplicate
  for k, line in enumerate(MALFORMED):
    lines.insert(7 * k + 3, line)
  return lines


def spanish_lines() -> list[str]:
  """English-Spanish pairs: 30 distinct Spanish sentences, one of them twice."""
  lines = [f"I see {i} dogs.\tVeo {i} perros.\t" + ATTRIBUTION.format(i, i) for i in range(30)]
  return lines + ["I see one dog.\tVeo 1 perros.\t" + ATTRIBUTION.format(0, 0), "malformed"]


# A line whose French side holds the byte 0xff, which UTF-8 never uses.
INVALID_UTF8 = b"A bad byte.\tUn mauvais octet \xff.\t" + ATTRIBUTION.format(5, 6).encode()


def _zip(name: str, lines: list[str], extra: bytes = b"") -> bytes:
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w") as archive:
    archive.writestr("_about.txt", "** Info **\n")
    archive.writestr(name, "\n".join(lines).encode() + b"\n" + extra)
  return buffer.getvalue()


def write_sdist(directory: Path, invalid_utf8: bool = False) -> tuple[Path, str]:
  """A fake ``nmt-0.0.6.tar.gz`` holding the two zips; returns it and its SHA-256.

  ``invalid_utf8`` appends ``INVALID_UTF8`` (and a newline) to the French pairs.
  """
  path = directory / "nmt-0.0.6.tar.gz"
  french_extra = INVALID_UTF8 + b"\n" if invalid_utf8 else b""
  with tarfile.open(path, "w:gz") as sdist:
    for member, text, lines, extra in (
        ("data/fra-eng.zip", "fra.txt", french_lines(), french_extra),
        ("data/spa-eng.zip", "spa.txt", spanish_lines(), b"")):
      data = _zip(text, lines, extra)
      info = tarfile.TarInfo(f"nmt-0.0.6/{member}")
      info.size = len(data)
      sdist.addfile(info, io.BytesIO(data))
  return path, hashlib.sha256(path.read_bytes()).hexdigest()


def prepare_with_vocabulary(data_dir: Path) -> None:
  """The fake corpus prepared in ``data_dir`` (4 held-out English sentences, 10 OOD ones) and
  the 40-piece ``tatoeba_en-fr`` vocabulary trained on it; ``MESHBAYES_DATA_DIR`` must name
  ``data_dir``."""
  from meshbayes.data import tatoeba
  from meshbayes.tools import train_vocab

  sdist, sha256 = write_sdist(data_dir.parent)
  tatoeba.prepare(data_dir, sdist, heldout_english=4, ood_sentences=10, expected_sha256=sha256)
  train_vocab.main(["--task=tatoeba_enfr", "--vocab_size=40"])
