"""Files written whole or not at all, and output paths that cannot overwrite an input.

A local file is written beside its path and renamed into place, so an interrupted
write leaves the old file or nothing; ``gs://`` paths are written directly (an
object store's writes are whole).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

from etils import epath


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
  """Writes ``text`` to ``path`` whole or not at all (a local rename)."""
  write_files_atomically([(path, text.encode("utf-8"))])


def write_files_atomically(files: Sequence[tuple[str | os.PathLike, bytes]]) -> None:
  """Writes each ``(path, data)`` whole: locally all beside their paths first, then renamed
  into place in order (interrupted before the renames, nothing changed); on an object
  store directly (its writes are whole)."""
  files = [(epath.Path(path), data) for path, data in files]
  if any("://" in os.fspath(path) for path, _ in files):
    for path, data in files:
      path.write_bytes(data)
    return
  partials = [(path.with_name(f"{path.name}.{os.getpid()}.tmp"), path, data)
              for path, data in files]
  try:
    for partial, _, data in partials:
      partial.write_bytes(data)
    for partial, path, _ in partials:
      os.replace(partial, path)
  finally:
    for partial, _, _ in partials:
      with contextlib.suppress(FileNotFoundError):
        os.unlink(partial)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
  """Whether paths ``a`` and ``b`` name one file (through links and ``..``; an
  object store's paths by their text)."""
  a, b = os.fspath(a), os.fspath(b)
  if "://" in a or "://" in b:
    return a.rstrip("/") == b.rstrip("/")
  if os.path.exists(a) and os.path.exists(b):
    return os.path.samefile(a, b)
  return os.path.realpath(a) == os.path.realpath(b)
