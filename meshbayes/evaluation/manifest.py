"""One evaluation's outputs as one set: ``manifest.json`` says which files, of what.

An evaluation's outputs (``OUTPUT_PATTERNS``: each predictive's items, the OOD scores, the
reliability diagrams, ``metrics.json``) belong together: ``begin`` marks the directory as
being written and removes the previous set, the new files are written, and ``finish``
writes the manifest last (atomically), naming each file with its checksum, the checkpoint
step, the predictive method, the task and split and the fingerprint of the settings.
``read_checked`` reads a file of the set, refusing in one line one that is not in the
manifest, differs from its checksum, or is of another step or method than the caller
expects. A directory written before manifests existed is read with one warning line.
``metrics.jsonl``, the TensorBoard events and the resumable decodes (``partial/``) are a
history across evaluations, not part of a set.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from etils import epath

from meshbayes.runtime import strict_json
from meshbayes.runtime.atomic_files import write_text_atomically

MANIFEST = "manifest.json"
FORMAT = 1
# What an evaluation writes into its directory (a directory without a manifest: the files
# of the set before it).
OUTPUT_PATTERNS = ("predictions_*.jsonl", "token_statistics_*.npz", "ood_scores.npz",
                   "reliability.json", "reliability.png", "metrics.json")
# Directories already warned about (one warning line each per process).
_WARNED: set[str] = set()


def checksum(data: bytes) -> str:
  return "sha256:" + hashlib.sha256(data).hexdigest()


def settings_fingerprint(settings: Mapping[str, Any]) -> str:
  """A checksum of ``settings`` (JSON with sorted keys): equal settings, equal fingerprint."""
  return checksum(strict_json.dumps(dict(settings), sort_keys=True, default=str).encode())


def _previous_files(directory: epath.Path) -> list[str]:
  """The files the previous set's manifest lists (none when it has none or is unreadable)."""
  try:
    files = json.loads((directory / MANIFEST).read_text()).get("files", {})
  except (FileNotFoundError, ValueError, AttributeError):
    return []
  return [name for name in files if os.path.basename(name) == name]


def begin(directory: epath.PathLike) -> None:
  """Marks ``directory`` as being written (its manifest says so, so no reader takes what
  is there as a set) and removes the previous set's files: those its manifest lists and
  any of ``OUTPUT_PATTERNS``."""
  directory = epath.Path(directory)
  previous = _previous_files(directory)
  write_text_atomically(directory / MANIFEST, strict_json.dumps(
      {"format": FORMAT, "complete": False}, indent=2) + "\n")
  stale = {directory / name for name in previous}
  stale.update(path for pattern in OUTPUT_PATTERNS for path in directory.glob(pattern))
  for path in sorted(stale):
    if path.is_file():
      path.unlink()


def finish(directory: epath.PathLike, files: Sequence[str], *, step: int, method: str,
           task: str, split: str, settings: Mapping[str, Any]) -> None:
  """Writes the manifest of the set ``files`` (names under ``directory``), last."""
  directory = epath.Path(directory)
  listed = {name: checksum((directory / name).read_bytes()) for name in sorted(files)}
  write_text_atomically(directory / MANIFEST, strict_json.dumps({
      "format": FORMAT, "complete": True, "step": step, "method": method, "task": task,
      "split": split, "settings_fingerprint": settings_fingerprint(settings),
      "settings": dict(settings), "files": listed}, indent=2, default=str) + "\n")


def _manifest(directory: epath.Path) -> dict[str, Any] | None:
  path = directory / MANIFEST
  if not path.exists():
    return None
  try:
    manifest = json.loads(path.read_text())
  except ValueError as error:
    raise ValueError(f"{path}: not a readable evaluation manifest ({error}); evaluate "
                     "again") from None
  if not manifest.get("complete"):
    raise ValueError(f"{path}: an evaluation is writing its results there or was "
                     "interrupted while writing them; evaluate again")
  return manifest


def _warn_unchecked(directory: epath.Path) -> None:
  if str(directory) not in _WARNED:
    _WARNED.add(str(directory))
    print(f"warning: {directory} has no {MANIFEST} (written before evaluations had one): "
          "its files cannot be checked for step or method", file=sys.stderr, flush=True)


def read_checked(directory: epath.PathLike, name: str, what: str, *, step: int | None = None,
                 method: str | None = None) -> bytes | None:
  """The bytes of ``directory/name`` (``what`` it is, for messages), or None when there is
  no such file and the manifest lists none.

  Raises:
    ValueError: (one line naming the file) the file is not in the manifest, differs from
      its checksum or is missing from it, or the set is of another ``step`` or ``method``
      than given, or the directory is being (or was partly) written.
  """
  directory = epath.Path(directory)
  path = directory / name
  manifest = _manifest(directory)
  if manifest is None:
    if not path.exists():
      return None
    _warn_unchecked(directory)
    return path.read_bytes()
  made = f"the set of step {manifest['step']}, method {manifest['method']}"
  for key, expected in (("step", step), ("method", method)):
    if expected is not None and manifest[key] != expected:
      raise ValueError(f"{path}: {what} of {key} {manifest[key]!r} ({MANIFEST}), expected "
                       f"{key} {expected!r}")
  listed = manifest["files"].get(name)
  if listed is None:
    if path.exists():
      raise ValueError(f"{path}: {what} not in {MANIFEST} ({made}): a file of another "
                       "evaluation; remove it or evaluate again")
    return None
  if not path.exists():
    raise ValueError(f"{path}: {what} of {made} is missing")
  data = path.read_bytes()
  if checksum(data) != listed:
    raise ValueError(f"{path}: {what} whose checksum differs from {MANIFEST}'s ({made}): "
                     "changed or replaced since that evaluation wrote it")
  return data
