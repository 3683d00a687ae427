"""Lines of text as model inputs: read from a file, encoded, truncated, batched.

Inference decodes a file of inputs this way, and evaluation its out-of-distribution sets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from etils import epath

NAMED_TRUNCATIONS = 5  # truncated inputs named one by one in the warning


def read_lines(path: str | Path, skip_empty: bool = False) -> list[str]:
  """The lines of a UTF-8 text file (local or ``gs://``), with a one-line error when it is
  missing or a line is not UTF-8.

  Only ``\\n`` ends a line (a trailing ``\\r`` is dropped), so the lines are those
  ``wc -l`` counts, whatever Unicode line separators the text holds.
  """
  path = epath.Path(path)
  if not path.is_file():
    raise ValueError(f"input file {str(path)!r} does not exist")
  raw = path.read_bytes().split(b"\n")
  if raw[-1] == b"":
    raw.pop()  # the last newline ends a line; it does not start one
  lines = []
  for number, line in enumerate(raw, 1):
    try:
      text = line.decode("utf-8").removesuffix("\r")
    except UnicodeDecodeError as error:
      raise ValueError(f"{path}:{number}: not valid UTF-8 (byte 0x{line[error.start]:02x} at "
                       f"position {error.start + 1} of the line)") from None
    if text.strip() or not skip_empty:
      lines.append(text)
  return lines


@dataclasses.dataclass(frozen=True)
class EncodedLines:
  """Lines of text as encoder inputs.

  Attributes:
    rows: ``(lines, length)`` token ids, EOS-terminated and zero-padded; a
      blank line is an all-zero row (no input, nothing to decode).
    tokens_cut: ``(lines,)`` tokens each line lost to fit ``length`` (EOS kept).
  """

  rows: np.ndarray
  tokens_cut: np.ndarray

  @property
  def present(self) -> np.ndarray:
    """Which lines hold an input."""
    return self.rows.any(-1)


def encode_inputs(lines: Sequence[str], vocabulary: Any, length: int,
                  source: str = "input") -> EncodedLines:
  """Each line's token ids, truncated to ``length`` and EOS-terminated.

  Raises:
    ValueError: naming ``source`` and the line number of a line the vocabulary
      cannot encode.
  """
  rows = np.zeros((len(lines), length), np.int32)
  tokens_cut = np.zeros(len(lines), np.int64)
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      ids = list(vocabulary.encode(line.strip()))
    except ValueError as error:
      raise ValueError(f"{source}:{number}: cannot encode {line.strip()!r}: {error}") from None
    tokens_cut[number - 1] = max(len(ids) + 1 - length, 0)
    ids = ids[:length - 1] + [vocabulary.eos_id]
    rows[number - 1, :len(ids)] = ids
  return EncodedLines(rows, tokens_cut)


def encode_lines(lines: Sequence[str], vocabulary: Any, length: int,
                 source: str = "input") -> np.ndarray:
  """``encode_inputs(...).rows``: the token ids alone."""
  return encode_inputs(lines, vocabulary, length, source).rows


def truncation_warning(tokens_cut: np.ndarray, source: str, length: int,
                       named: int = NAMED_TRUNCATIONS) -> str | None:
  """One line naming the first ``named`` truncated inputs (line number, tokens cut) and
  how many there are; None when no input was truncated."""
  truncated = np.flatnonzero(tokens_cut)
  if not truncated.size:
    return None
  plural = lambda n, word: f"{n} {word}{'' if n == 1 else 's'}"
  listed = ", ".join(f"line {i + 1} ({plural(int(tokens_cut[i]), 'token')} cut)"
                     for i in truncated[:named])
  more = f" and {truncated.size - named} more" if truncated.size > named else ""
  return (f"warning: {source}: {plural(truncated.size, 'input')} longer than the input length "
          f"{length} (EOS included) truncated: {listed}{more}")


def in_batches(rows: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
  """``rows`` in chunks of ``batch_size``, the last one padded with all-zero rows."""
  for start in range(0, len(rows), batch_size):
    chunk = rows[start:start + batch_size]
    yield np.pad(chunk, [(0, batch_size - len(chunk)), (0, 0)])
