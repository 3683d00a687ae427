"""Token-level calibration under teacher forcing (top-label ECE, weighted ECE, Brier, NLL,
accuracy) and the equal-width bins every ECE of meshbayes uses.

``token_calibration_statistics`` runs on device (jit-friendly) and returns additive sums:
add them over batches (``sum_statistics``) and turn the total into figures with
``token_calibration_metrics`` (numpy). Definitions: docs/measures.md; sequence level:
``meshbayes.metrics.sequence_calibration``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

DEFAULT_NUM_BINS = 15


def bin_indices(confidences, num_bins: int = DEFAULT_NUM_BINS):
  """Bin index ``min(floor(c * num_bins), num_bins - 1)`` of each confidence.

  Works on numpy arrays (returns numpy) and on jax arrays, traced ones included
  (returns jax). Values are clipped into ``[0, num_bins - 1]``, so ``1.0`` is in
  the last bin and ``exp`` round-off just above 1 does not leave the range.

  Args:
    confidences: values in ``[0, 1]``, any shape.
    num_bins: number of equal-width bins ``B``.

  Returns:
    int32 bin indices, the shape of ``confidences``.

  >>> bin_indices(np.array([0.0, 0.5, 0.9999, 1.0]), num_bins=4)
  array([0, 2, 3, 3], dtype=int32)
  """
  xp = jnp if isinstance(confidences, jax.Array) else np
  index = xp.floor(confidences * num_bins).astype(xp.int32)
  return xp.clip(index, 0, num_bins - 1)


# --------------------------------------------------------------------------- token level


def token_calibration_statistics(log_probs: Array, targets: Array, weights: Array,
                                 num_bins: int = DEFAULT_NUM_BINS) -> dict[str, Array]:
  """Additive token-level calibration statistics of one batch (jit-friendly).

  Memory stays at a few ``(tokens, vocab)`` arrays: the weighted ECE's per-bin
  sums are scatter-adds over the bin index of every (token, label) pair, and
  the one-hot target is never formed (its terms are added at the target's bin).

  Args:
    log_probs: ``(batch, length, vocab)`` normalized log-probabilities.
    targets: ``(batch, length)`` integer reference labels.
    weights: ``(batch, length)`` token weights (0 for padding).
    num_bins: number of equal-width bins ``B`` (static).

  Returns:
    float32 sums, to be added over batches:
    ``bin_count``, ``bin_sum_confidence``, ``bin_sum_correct`` (``(B,)``, the
    top-label reliability); ``pair_bin_sum_prob_correct`` and
    ``pair_bin_sum_prob_squared`` (``(B,)``: ``sum w_i p_iy 1[y == y_i]`` and
    ``sum w_i p_iy^2`` over the pairs in each bin, the weighted ECE); scalars
    ``tokens``, ``nll``, ``correct``, ``brier``.

  >>> lp = jnp.log(jnp.array([[[0.7, 0.2, 0.1], [0.05, 0.05, 0.9]]]))
  >>> stats = token_calibration_statistics(lp, jnp.array([[0, 1]]), jnp.array([[1., 1.]]),
  ...                                      num_bins=5)
  >>> stats['bin_count'], stats['correct']
  (Array([0., 0., 0., 1., 1.], dtype=float32), Array(1., dtype=float32))
  """
  log_probs = jnp.asarray(log_probs, jnp.float32)
  weights = jnp.asarray(weights, jnp.float32)
  probs = jnp.exp(log_probs)
  target_log_prob = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  target_prob = jnp.exp(target_log_prob)
  confidence = jnp.max(probs, axis=-1)
  correct = (jnp.argmax(log_probs, axis=-1) == targets).astype(jnp.float32)
  sum_prob_squared = jnp.sum(probs * probs, axis=-1)
  # Masked tokens may hold -inf log-probabilities: select rather than multiply by 0.
  mask = weights != 0

  def weighted(x):
    return jnp.where(mask, weights * x, 0.0)

  def bin_sums(values, confidences):
    return jax.ops.segment_sum(values.reshape(-1), bin_indices(confidences, num_bins).reshape(-1),
                               num_segments=num_bins)

  return {
      "bin_count": bin_sums(weighted(1.0), confidence),
      "bin_sum_confidence": bin_sums(weighted(confidence), confidence),
      "bin_sum_correct": bin_sums(weighted(correct), confidence),
      # Only the target label's pair has 1[y == y_i] = 1; it sits in the bin of p_{i, y_i}.
      "pair_bin_sum_prob_correct": bin_sums(weighted(target_prob), target_prob),
      "pair_bin_sum_prob_squared": bin_sums(
          jnp.where(mask[..., None], weights[..., None] * probs * probs, 0.0), probs),
      "tokens": jnp.sum(weighted(1.0)),
      "nll": jnp.sum(weighted(-target_log_prob)),
      "correct": jnp.sum(weighted(correct)),
      # sum_y (p_y - 1[y == t])^2 = sum_y p_y^2 - 2 p_t + 1.
      "brier": jnp.sum(weighted(sum_prob_squared - 2.0 * target_prob + 1.0)),
  }


def sum_statistics(statistics: Iterable[Mapping[str, object]]) -> dict[str, np.ndarray]:
  """Adds statistics dicts (e.g. one per eval batch) leaf by leaf, in float64.

  Args:
    statistics: dicts with the same keys, jax or numpy values.

  Returns:
    Their sum as numpy float64 arrays.

  >>> sum_statistics([{'tokens': 2.0}, {'tokens': np.float32(3.0)}])
  {'tokens': array(5.)}
  """
  total = None
  for stats in statistics:
    stats = {k: np.asarray(v, np.float64) for k, v in stats.items()}
    if total is None:
      total = stats
    else:
      if stats.keys() != total.keys():
        raise ValueError(f"sum_statistics: keys {sorted(stats)} differ from {sorted(total)}")
      total = {k: np.asarray(total[k] + stats[k]) for k in total}
  if total is None:
    raise ValueError("sum_statistics: no statistics to add")
  return total


def _safe_divide(numerator, denominator):
  """numerator / denominator, NaN where the denominator is 0 (an empty bin or batch)."""
  numerator = np.asarray(numerator, np.float64)
  denominator = np.asarray(denominator, np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1.0),
                    np.nan)


def _calibration_error(bin_sum_correct, bin_sum_confidence, total) -> float:
  """(1/N) sum_b |sum_{i in b} (correctness_i - confidence_i)|, the shared ECE formula."""
  gap = np.sum(np.abs(np.asarray(bin_sum_correct, np.float64) -
                      np.asarray(bin_sum_confidence, np.float64)))
  return float(_safe_divide(gap, total))


def _reliability_from_sums(bin_count, bin_sum_confidence, bin_sum_correct) -> dict[str, np.ndarray]:
  """Per-bin means for a reliability diagram (NaN for empty bins)."""
  return {
      "bin_confidence": _safe_divide(bin_sum_confidence, bin_count),
      "bin_accuracy": _safe_divide(bin_sum_correct, bin_count),
      "bin_count": np.asarray(bin_count, np.float64),
  }


def token_calibration_metrics(statistics: Mapping[str, object]) -> dict[str, object]:
  """Token-level metrics from (summed) ``token_calibration_statistics``.

  Args:
    statistics: the statistics of one batch or their sum over batches.

  Returns:
    Floats ``ece``, ``weighted_ece``, ``brier``, ``nll``, ``accuracy``,
    ``tokens`` (NaN when there are no tokens), and the per-bin arrays
    ``bin_confidence``, ``bin_accuracy`` (NaN for empty bins) and
    ``bin_count`` for a reliability diagram.

  >>> stats = {'bin_count': [1., 1.], 'bin_sum_confidence': [0.4, 0.9],
  ...          'bin_sum_correct': [0., 1.], 'pair_bin_sum_prob_correct': [0.1, 1.5],
  ...          'pair_bin_sum_prob_squared': [0.2, 1.2], 'tokens': 2.,
  ...          'nll': 1.2, 'correct': 1., 'brier': 0.5}
  >>> m = token_calibration_metrics(stats)
  >>> round(m['ece'], 6), round(m['weighted_ece'], 6), m['accuracy']
  (0.25, 0.2, 0.5)
  """
  s = {k: np.asarray(v, np.float64) for k, v in statistics.items()}
  tokens = s["tokens"]
  return {
      "ece": _calibration_error(s["bin_sum_correct"], s["bin_sum_confidence"], tokens),
      "weighted_ece": _calibration_error(s["pair_bin_sum_prob_correct"],
                                         s["pair_bin_sum_prob_squared"], tokens),
      "brier": float(_safe_divide(s["brier"], tokens)),
      "nll": float(_safe_divide(s["nll"], tokens)),
      "accuracy": float(_safe_divide(s["correct"], tokens)),
      "tokens": float(tokens),
      **_reliability_from_sums(s["bin_count"], s["bin_sum_confidence"], s["bin_sum_correct"]),
  }


# --------------------------------------------------------------------------- 1-D (numpy)


def _check_unit_interval(name: str, x: np.ndarray) -> None:
  if x.size and not (np.all(x >= 0.0) and np.all(x <= 1.0)):  # also rejects NaN
    raise ValueError(f"{name} must lie in [0, 1]; got values in [{np.min(x)}, {np.max(x)}]")


def reliability_bins(confidences, correctness, num_bins: int = DEFAULT_NUM_BINS,
                     weights=None) -> dict[str, np.ndarray]:
  """Per-bin means of confidence and correctness, for 1-D inputs (numpy).

  Args:
    confidences: ``(n,)`` values in ``[0, 1]``.
    correctness: ``(n,)`` 0/1 correctness (top-label) or graded correctness in
      ``[0, 1]``.
    num_bins: number of equal-width bins.
    weights: optional ``(n,)`` non-negative weights (default 1).

  Returns:
    ``bin_confidence``, ``bin_accuracy`` (the mean correctness; NaN for empty
    bins) and ``bin_count`` (the summed weight), each ``(num_bins,)``.

  >>> reliability_bins([0.1, 0.2, 0.9], [0, 1, 1], num_bins=2)['bin_accuracy']
  array([0.5, 1. ])
  """
  sums = _bin_sums(confidences, correctness, num_bins, weights)
  return _reliability_from_sums(*sums[:3])


def _bin_sums(confidences, correctness, num_bins, weights):
  """(count, sum confidence, sum correctness) per bin and the total weight."""
  confidences = np.asarray(confidences, np.float64)
  correctness = np.asarray(correctness, np.float64)
  weights = np.ones_like(confidences) if weights is None else np.asarray(weights, np.float64)
  if confidences.ndim != 1 or not confidences.shape == correctness.shape == weights.shape:
    raise ValueError("confidences, correctness and weights must be 1-D of one length; got shapes "
                     f"{confidences.shape}, {correctness.shape}, {weights.shape}")
  _check_unit_interval("confidences", confidences)
  _check_unit_interval("correctness", correctness)
  if np.any(weights < 0):
    raise ValueError("weights must be non-negative")
  index = bin_indices(confidences, num_bins)
  count = np.bincount(index, weights, minlength=num_bins)
  sum_confidence = np.bincount(index, weights * confidences, minlength=num_bins)
  sum_correct = np.bincount(index, weights * correctness, minlength=num_bins)
  return count, sum_confidence, sum_correct, np.sum(weights)


def expected_calibration_error(confidences, correct, num_bins: int = DEFAULT_NUM_BINS,
                               weights=None) -> float:
  """Top-label ECE ``sum_b (n_b / N) |acc_b - conf_b|`` of 1-D inputs (numpy).

  Args:
    confidences: ``(n,)`` confidences in ``[0, 1]``.
    correct: ``(n,)`` correctness, 0/1 (or graded in ``[0, 1]``).
    num_bins: number of equal-width bins.
    weights: optional ``(n,)`` non-negative weights; ``N`` is their sum.

  Returns:
    The ECE in ``[0, 1]`` (NaN for empty input).

  >>> expected_calibration_error([0.9, 0.9, 0.6, 0.6], [1, 0, 1, 1], num_bins=10)
  0.4
  """
  count, sum_confidence, sum_correct, total = _bin_sums(confidences, correct, num_bins, weights)
  del count
  return _calibration_error(sum_correct, sum_confidence, total)
