"""Checks of the arrays sequence calibration is computed from: probabilities, labels in
``[0, 1]`` and reference counts, each bad value a one-line ``ValueError`` naming its owner,
the value and its index.

Shared by ``sequence_labels`` (labels, ECEs, null bands) and ``sequence_gap`` (the signed
gap and its test), so both word a bad value alike.

>>> probabilities([0.2, 1.5], "one_sided_ece")
Traceback (most recent call last):
ValueError: one_sided_ece: probabilities must lie in [0, 1]; got 1.5 at index 1
"""

from __future__ import annotations

import numpy as np


def first_bad(values: np.ndarray, bad: np.ndarray) -> str:
  """``'<value> at index <i>'`` of the first ``True`` of ``bad`` (row-major)."""
  index = np.unravel_index(np.flatnonzero(bad.reshape(-1))[0], values.shape)
  where = int(index[0]) if len(index) == 1 else tuple(int(i) for i in index)
  return f"{values[index].item()!r} at index {where}"


def probabilities(values, owner: str) -> np.ndarray:
  """``values`` as a 1-D float64 array in ``[0, 1]``."""
  p = np.asarray(values, np.float64)
  if p.ndim != 1:
    raise ValueError(f"{owner}: probabilities must be 1-D; got shape {p.shape}")
  bad = ~((p >= 0) & (p <= 1))
  if bad.any():
    raise ValueError(f"{owner}: probabilities must lie in [0, 1]; got {first_bad(p, bad)}")
  return p


def labels(values, n: int, owner: str) -> np.ndarray:
  """``values`` as float64 labels in ``[0, 1]`` of shape ``(n,)`` or ``(draws, n)``."""
  y = np.asarray(values, np.float64)
  if y.ndim not in (1, 2) or y.shape[-1] != n:
    raise ValueError(f"{owner}: labels must have shape ({n},) or (draws, {n}) to match "
                     f"{n} probabilities; got shape {y.shape}")
  bad = ~((y >= 0) & (y <= 1))
  if bad.any():
    raise ValueError(f"{owner}: labels must lie in [0, 1]; got {first_bad(y, bad)}")
  return y


def counts(num_matched, num_references, owner: str) -> tuple[np.ndarray, np.ndarray]:
  """``(m, k)`` as int64 arrays of one length: ints ``0 <= m <= k``, ``k >= 1``."""
  m, k = np.asarray(num_matched), np.asarray(num_references)
  for name, values, low in (("num_matched", m, 0), ("num_references", k, 1)):
    if values.ndim != 1:
      raise ValueError(f"{owner}: {name} must be 1-D; got shape {values.shape}")
    as_float = values.astype(np.float64)
    bad = ~((as_float >= low) & (as_float == np.round(as_float))) | (values.dtype == bool)
    if bad.any():
      raise ValueError(f"{owner}: {name} must be ints >= {low}; got {first_bad(values, bad)}")
  if m.shape != k.shape:
    raise ValueError(f"{owner}: num_matched and num_references must have one length; got "
                     f"{m.size} and {k.size}")
  m, k = m.astype(np.int64), k.astype(np.int64)
  if (m > k).any():
    index = int(np.flatnonzero(m > k)[0])
    raise ValueError(f"{owner}: num_matched {m[index]} exceeds num_references {k[index]} "
                     f"at index {index}")
  return m, k
