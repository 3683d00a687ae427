"""Direct loops the tests check vectorized metrics against."""

import numpy as np


def loop_one_sided_ece(p: np.ndarray, y: np.ndarray, num_bins: int = 15) -> float:
  """sum_b n_b / n |mean_b(p) - mean_b(y)| over bins [b/B, (b+1)/B), the last one closed."""
  error = 0.0
  for b in range(num_bins):
    inside = (p >= b / num_bins) & ((p < (b + 1) / num_bins) | (b == num_bins - 1))
    if inside.any():
      error += inside.sum() / p.size * abs(p[inside].mean() - y[inside].mean())
  return error
