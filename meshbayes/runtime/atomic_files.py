"""Files written whole or not at all, and output paths that cannot overwrite an input.

A local file is written beside its path and renamed into place, so an interrupted
write leaves the old file or nothing; ``gs://`` paths are written directly (an
object store's writes are whole).
"""

from __future__ import annotations

import os

from etils import epath


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
  """Writes ``text`` to ``path`` whole or not at all (a local rename)."""
  path = epath.Path(path)
  if "://" in os.fspath(path):
    path.write_text(text)
    return
  partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
  try:
    partial.write_text(text)
    partial.replace(path)
  finally:
    if partial.exists():
      partial.unlink()


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
  """Whether paths ``a`` and ``b`` name one file (through links and ``..``; an
  object store's paths by their text)."""
  a, b = os.fspath(a), os.fspath(b)
  if "://" in a or "://" in b:
    return a.rstrip("/") == b.rstrip("/")
  if os.path.exists(a) and os.path.exists(b):
    return os.path.samefile(a, b)
  return os.path.realpath(a) == os.path.realpath(b)
