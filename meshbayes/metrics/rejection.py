"""Error detection by rejection (Malinin & Gales, ICLR 2021, Section 5): does an uncertainty
measure find the bad outputs?

``prediction_rejection_ratio``: 1 when the measure orders outputs as their errors do,
about 0 for a random order, negative when it rejects the good outputs first. Ties in
uncertainty take their mean error. Definition: docs/measures.md.
"""

from __future__ import annotations

import numpy as np


def _checked(errors, uncertainties) -> tuple[np.ndarray, np.ndarray]:
  e = np.asarray(errors, np.float64)
  u = np.asarray(uncertainties, np.float64)
  if e.ndim != 1 or e.shape != u.shape or e.size == 0:
    raise ValueError(f"errors and uncertainties must be 1-D of one non-zero length; got "
                     f"shapes {e.shape}, {u.shape}")
  if np.isnan(e).any() or np.isnan(u).any():
    raise ValueError("errors and uncertainties must not contain NaN")
  return e, u


def _sorted_errors(e: np.ndarray, u: np.ndarray) -> np.ndarray:
  """The errors in rejection order (most uncertain first), ties at their mean."""
  order = np.argsort(-u, kind="stable")
  e, u = e[order], u[order]
  starts = np.flatnonzero(np.concatenate(([True], u[1:] != u[:-1])))
  if starts.size == e.size:
    return e
  sizes = np.diff(np.append(starts, e.size))
  return np.repeat(np.add.reduceat(e, starts) / sizes, sizes)


def rejection_curve(errors, uncertainties) -> tuple[np.ndarray, np.ndarray]:
  """``(fractions rejected, mean error)``, ``n + 1`` points each, rejecting the most
  uncertain first (ties at their mean error).

  >>> rejection_curve([1.0, 0.0, 0.5], [3.0, 1.0, 2.0])[1]
  array([0.5       , 0.16666667, 0.        , 0.        ])
  """
  e = _sorted_errors(*_checked(errors, uncertainties))
  n = e.size
  remaining = e.sum() - np.concatenate(([0.0], np.cumsum(e)))
  return np.arange(n + 1) / n, np.maximum(remaining, 0.0) / n


def _area(sorted_errors: np.ndarray) -> float:
  """Trapezoid area under the rejection curve of errors in rejection order: the curve's
  points are ``(total - cumsum_k) / n``, ``k = 0..n``, spaced ``1 / n``."""
  n = sorted_errors.size
  remaining = sorted_errors.sum() - np.cumsum(sorted_errors)  # k = 1..n
  return float((remaining.sum() + sorted_errors.sum() / 2.0) / (n * n))


def prediction_rejection_ratio(errors, uncertainties) -> float:
  """PRR of ``uncertainties`` for ``errors`` (higher = the uncertainty finds the errors);
  NaN when every error is the same (nothing to find).

  >>> prediction_rejection_ratio([0.9, 0.1, 0.5], [3.0, 1.0, 2.0])  # the oracle's order
  1.0
  """
  e, u = _checked(errors, uncertainties)
  random = e.mean() / 2.0  # the triangle under the straight line, the same for every order
  oracle = _area(np.sort(e)[::-1])
  if abs(random - oracle) <= 1e-12:
    return float("nan")
  return float((random - _area(_sorted_errors(e, u))) / (random - oracle))
