"""English of another origin: sentences of scikit-learn's docstrings, an OOD set.

``prepare`` (run by ``make data``) writes them from the pinned installed package
to ``<data dir>/ood/technical_english.txt``, one a line, in a salted-hash order
(any prefix is a sample). Which sentences: docs/training.md ("Data inside").
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from etils import epath

RELATIVE_PATH = "ood/technical_english.txt"
_SALT = b"meshbayes-technical-english"
_SECTION = re.compile(r"\n\s*[A-Z][a-z ]+\n\s*-{3,}")   # a numpydoc header and its rule
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_PROSE = re.compile(r"[A-Z][A-Za-z ,;'\-]*[a-z][.?!]")


def path(root: str | os.PathLike) -> epath.Path:
  """The technical-English OOD file under a data directory."""
  return epath.Path(root) / RELATIVE_PATH


def _docstrings(source: str) -> Iterator[str]:
  try:
    tree = ast.parse(source)
  except SyntaxError:
    return
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node)
      if doc:
        yield doc


def docstring_sentences(source: str, min_words: int = 5, max_words: int = 20) -> list[str]:
  """The prose sentences of the docstrings of one Python source, in order."""
  sentences = []
  for doc in _docstrings(source):
    for paragraph in re.split(r"\n\s*\n", _SECTION.split(doc)[0]):
      for sentence in _SENTENCE_END.split(" ".join(paragraph.split())):
        if min_words <= len(sentence.split()) <= max_words and _PROSE.fullmatch(sentence):
          sentences.append(sentence)
  return sentences


def package_sentences(package_dir: str | os.PathLike) -> list[str]:
  """Distinct docstring sentences of a package, outside its tests and vendored code,
  in salted-hash order."""
  sentences: dict[str, None] = {}
  for file in sorted(Path(package_dir).rglob("*.py")):
    if {"tests", "externals"} & set(file.parts):
      continue
    for sentence in docstring_sentences(file.read_text(encoding="utf-8", errors="replace")):
      sentences.setdefault(sentence)
  return sorted(sentences, key=lambda s: hashlib.sha256(_SALT + s.encode()).digest())


def prepare(root: str | os.PathLike, force: bool = False) -> int:
  """Writes the sentences of the installed scikit-learn under ``root``; their number.

  Does nothing (and returns the number already there) when the file exists,
  unless ``force``.
  """
  import sklearn  # pylint: disable=import-outside-toplevel

  target = path(root)
  if target.is_file() and not force:
    return len(target.read_text().splitlines())
  sentences = package_sentences(Path(sklearn.__file__).parent)
  target.parent.mkdir(parents=True, exist_ok=True)
  tmp = target.with_suffix(".tmp")
  tmp.write_text("".join(s + "\n" for s in sentences))
  tmp.replace(target)
  return len(sentences)
