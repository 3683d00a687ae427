"""Calibration of decoded tokens (after Wang et al., 2020): each token of a decoded output
labelled correct when its edit-distance alignment to the closest reference aligns it to
an equal token.

Sequences are the model's own token ids without EOS or padding (the hypothesis is
``Decoded.output_ids``; label ``i`` goes with ``exp(token_log_probs[i])``). The alignment
is Levenshtein without TER's shifts: least edits, then most matches, then a fixed
tie-break; the closest reference has the least edits per reference token. The ECE is
one-sided over 15 equal-width bins, from per-output sums that a bootstrap over sources
adds. Numpy and Python (the bins are ``metrics.calibration``'s, a module that imports
jax). Choices and cost: docs/measures.md.

>>> labels, distance = align_labels([5, 9, 6, 7], [5, 6, 7, 8])
>>> labels.tolist(), distance
([True, False, True, True], 2)
>>> closest_reference_labels([5, 9, 6], [[4, 4, 4, 4], [5, 6]]).tolist()
[True, False, True]
>>> figures = decoded_token_calibration([[0.9, 0.3, 0.8]], [[True, False, True]], num_bins=2)
>>> round(figures['ece'], 6), round(figures['accuracy'], 6), figures['tokens']
(0.2, 0.666667, 3.0)
"""

from __future__ import annotations

import fractions
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from meshbayes.metrics import calibration

DEFAULT_NUM_BINS = calibration.DEFAULT_NUM_BINS
# The keys of decoded_token_statistics, per-bin sums as metrics.token_calibration_statistics
# names its top-label ones.
STATISTICS = ("bin_count", "bin_sum_confidence", "bin_sum_correct")


class Alignment(NamedTuple):
  """A hypothesis's labels against its closest reference.

  Attributes:
    labels: ``(n,)`` bool, whether each hypothesis token is matched.
    distance: the edit distance to that reference.
    reference_index: which reference (position in the list given).
  """

  labels: np.ndarray
  distance: int
  reference_index: int


def _ids(name: str, ids) -> np.ndarray:
  """``ids`` as a 1-D int64 array of non-negative ids, or a one-line ValueError."""
  array = np.asarray(ids)
  if array.size == 0:
    return np.zeros(0, np.int64)
  if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or
                             np.issubdtype(array.dtype, np.bool_)):
    raise ValueError(f"{name} must be a 1-D sequence of integer token ids; got shape "
                     f"{array.shape}, dtype {array.dtype}")
  if np.any(array < 0):
    raise ValueError(f"{name} must hold non-negative token ids; got {int(array.min())}")
  return array.astype(np.int64)


def _key_tables(hypothesis: np.ndarray, references: np.ndarray, big: int) -> np.ndarray:
  """``(n + 1, R, m + 1)`` least ``cost * big - matches`` of aligning each hypothesis prefix
  with each reference prefix (references padded with -1, which matches nothing).

  ``big`` exceeds any number of matches, so ordering the integer key orders the pair
  ``(cost, -matches)`` lexicographically, and both add along an alignment.
  """
  n, (num_references, m) = hypothesis.size, references.shape
  offsets = np.arange(m + 1, dtype=np.int64) * big
  table = np.empty((n + 1, num_references, m + 1), np.int64)
  table[0] = offsets  # reference tokens left unaligned
  for i in range(1, n + 1):
    previous = table[i - 1]
    step = previous + big  # hypothesis token i unaligned
    diagonal = previous[:, :-1] + np.where(references == hypothesis[i - 1], -1, big)
    step[:, 1:] = np.minimum(step[:, 1:], diagonal)
    # Leaving reference tokens unaligned within the row: D[j] = min_{k <= j} E[k] + (j - k) big.
    table[i] = np.minimum.accumulate(step - offsets, axis=1) + offsets
  return table


def _cost_and_matches(key: int, big: int) -> tuple[int, int]:
  cost = -(-key // big)
  return cost, cost * big - key


def _backtrace(table: list[list[int]], hypothesis: np.ndarray, reference: np.ndarray,
               big: int) -> np.ndarray:
  """The labels of the tie-break's alignment through ``table`` (one reference's)."""
  i, j = hypothesis.size, reference.size
  labels = np.zeros(i, bool)
  while i > 0 or j > 0:
    key = table[i][j]
    if i > 0 and j > 0:
      same = hypothesis[i - 1] == reference[j - 1]
      if table[i - 1][j - 1] + (-1 if same else big) == key:
        labels[i - 1] = same
        i, j = i - 1, j - 1
        continue
    if i > 0 and table[i - 1][j] + big == key:
      i -= 1
      continue
    if not (j > 0 and table[i][j - 1] + big == key):  # the table is inconsistent: a bug
      raise AssertionError(f"token_labels: no optimal move at ({i}, {j})")
    j -= 1
  return labels


def _alignments(hypothesis, references: Sequence, eos_id: int | None
                ) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, int]:
  hyp = _ids("hypothesis", hypothesis)
  if isinstance(references, (str, bytes)) or len(references) == 0:
    raise ValueError(f"references must be a non-empty sequence of id sequences; got "
                     f"{references!r:.80}")
  refs = [_ids(f"references[{r}]", ref) for r, ref in enumerate(references)]
  if eos_id is not None:
    for name, ids in [("hypothesis", hyp)] + [(f"references[{r}]", x) for r, x in enumerate(refs)]:
      if np.any(ids == eos_id):
        raise ValueError(f"{name} holds EOS ({eos_id}) at position "
                         f"{int(np.flatnonzero(ids == eos_id)[0])}; pass the ids before it")
  big = hyp.size + 1
  m = max(ref.size for ref in refs)
  padded = np.full((len(refs), m), -1, np.int64)
  for r, ref in enumerate(refs):
    padded[r, :ref.size] = ref
  return hyp, refs, _key_tables(hyp, padded, big), big


def closest_reference_alignment(hypothesis: Sequence[int], references: Sequence[Sequence[int]],
                                *, normalized: bool = True, eos_id: int | None = None
                                ) -> Alignment:
  """The labels of ``hypothesis``'s tokens against its closest reference.

  Args:
    hypothesis: the decoded output's token ids, without EOS or padding.
    references: one or more references' token ids (same vocabulary), without EOS.
    normalized: pick the reference with the least edit distance per reference token
      (TER); False: the least edit distance (sacrebleu's choice). The first on ties.
    eos_id: if given, an EOS in any sequence is a ValueError (they must be cut before).

  Returns:
    ``Alignment(labels, distance, reference_index)``.

  Raises:
    ValueError: one line, for no references, ids that are not non-negative integers of
      a 1-D sequence, or an EOS left in.

  >>> closest_reference_alignment([3, 4], [[3, 5, 5, 5], [3, 4, 6]])
  Alignment(labels=array([ True,  True]), distance=1, reference_index=1)
  """
  hyp, refs, tables, big = _alignments(hypothesis, references, eos_id)
  costs = [_cost_and_matches(int(tables[-1, r, ref.size]), big)[0] for r, ref in enumerate(refs)]
  scores = [fractions.Fraction(cost, max(ref.size, 1)) if normalized else cost
            for cost, ref in zip(costs, refs)]
  best = min(range(len(refs)), key=lambda r: (scores[r], r))
  table = tables[:, best, :refs[best].size + 1].tolist()
  return Alignment(_backtrace(table, hyp, refs[best], big), costs[best], best)


def closest_reference_labels(hypothesis: Sequence[int], references: Sequence[Sequence[int]],
                             *, normalized: bool = True, eos_id: int | None = None
                             ) -> np.ndarray:
  """``(len(hypothesis),)`` bool: whether each hypothesis token is matched in its alignment
  to the closest reference (``closest_reference_alignment``, whose arguments these are).

  >>> closest_reference_labels([3, 4, 4], [[3, 4], [4, 4, 4]]).tolist()  # 1 edit in 3 < 1 in 2
  [False, True, True]
  """
  return closest_reference_alignment(hypothesis, references, normalized=normalized,
                                     eos_id=eos_id).labels


def align_labels(hypothesis: Sequence[int], reference: Sequence[int]) -> tuple[np.ndarray, int]:
  """Labels of ``hypothesis``'s tokens aligned to one ``reference``, and the edit distance.

  The alignment is the module's: least edits, then most matches, then the backtrace's
  tie-break. ``labels.sum()`` is the most matches of any least-cost alignment.

  Args:
    hypothesis: token ids (non-negative integers), without EOS.
    reference: token ids of the same vocabulary, without EOS.

  Returns:
    ``(labels, distance)``: ``(len(hypothesis),)`` bool, True where the token is aligned
    to an equal reference token; the Levenshtein distance (an int).

  >>> labels, distance = align_labels([1, 2, 3], [2, 3, 4])
  >>> labels.tolist(), distance
  ([False, True, True], 2)
  """
  alignment = closest_reference_alignment(hypothesis, [reference])
  return alignment.labels, alignment.distance


# --------------------------------------------------------------------------- calibration


def _checked_pairs(token_probs: Sequence, labels: Sequence) -> list[tuple[np.ndarray, np.ndarray]]:
  if len(token_probs) != len(labels):
    raise ValueError(f"token_probs has {len(token_probs)} outputs but labels has {len(labels)}")
  pairs = []
  for k, (p, y) in enumerate(zip(token_probs, labels)):
    p, y = np.asarray(p, np.float64).reshape(-1), np.asarray(y)
    y = y.reshape(-1) if y.size else np.zeros(0, bool)
    if p.size != y.size:
      raise ValueError(f"token_probs[{k}] has {p.size} values but labels[{k}] has {y.size}")
    bad = np.flatnonzero(~((p >= 0.0) & (p <= 1.0)))  # NaN included
    if bad.size:
      raise ValueError(f"token_probs[{k}] must lie in [0, 1]; got {p[bad[0]].item()} at "
                       f"position {bad[0]}")
    wrong = np.flatnonzero((y != 0) & (y != 1))
    if wrong.size:
      raise ValueError(f"labels[{k}] must be 0 or 1 (or bool); got {y[wrong[0]].item()!r} at "
                       f"position {wrong[0]}")
    pairs.append((p, y.astype(np.float64)))
  return pairs


def decoded_token_statistics(token_probs: Sequence[Sequence[float]], labels: Sequence[Sequence],
                             num_bins: int = DEFAULT_NUM_BINS) -> dict[str, np.ndarray]:
  """Per-output additive calibration sums of decoded tokens.

  Args:
    token_probs: per output, the probability of each labelled token, in ``[0, 1]``.
    labels: per output, each token's label (bool or 0/1), as many as its probabilities.
    num_bins: number of equal-width bins of the probability.

  Returns:
    ``bin_count``, ``bin_sum_confidence`` and ``bin_sum_correct``, each
    ``(outputs, num_bins)`` float64: per output and bin, the number of tokens, the sum
    of their probabilities and the number labelled correct. Sum rows (e.g. a bootstrap
    resample of sources) and pass them to ``decoded_token_metrics``.

  Raises:
    ValueError: one line, for output counts or lengths that differ, a probability
      outside ``[0, 1]`` (or NaN), or a label other than 0 or 1.

  >>> decoded_token_statistics([[0.2, 0.9], []], [[0, 1], []], num_bins=2)['bin_sum_correct']
  array([[0., 1.],
         [0., 0.]])
  """
  if not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
    raise ValueError(f"num_bins must be a positive integer; got {num_bins!r}")
  pairs = _checked_pairs(token_probs, labels)
  statistics = {name: np.zeros((len(pairs), num_bins)) for name in STATISTICS}
  for k, (p, y) in enumerate(pairs):
    index = calibration.bin_indices(p, num_bins)
    statistics["bin_count"][k] = np.bincount(index, minlength=num_bins)
    statistics["bin_sum_confidence"][k] = np.bincount(index, p, minlength=num_bins)
    statistics["bin_sum_correct"][k] = np.bincount(index, y, minlength=num_bins)
  return statistics


def decoded_token_metrics(statistics: Mapping[str, np.ndarray]) -> dict[str, object]:
  """Figures from ``decoded_token_statistics`` (``(..., B)`` arrays; leading axes summed).

  Returns:
    ``ece`` (one-sided, the module's definition), ``accuracy`` (the fraction of tokens
    labelled correct), ``mean_confidence`` (mean probability), ``confidence_gap``
    (mean probability minus accuracy; > 0: overconfident), ``tokens`` (floats; NaN but
    ``tokens`` when there are none) and per bin ``bin_confidence``, ``bin_accuracy``
    (NaN for empty bins) and ``bin_count``.

  >>> m = decoded_token_metrics({'bin_count': [[1., 1.]], 'bin_sum_confidence': [[0.2, 0.9]],
  ...                            'bin_sum_correct': [[0., 1.]]})
  >>> round(m['ece'], 6), m['accuracy'], round(m['confidence_gap'], 6)
  (0.15, 0.5, 0.05)
  """
  missing = [name for name in STATISTICS if name not in statistics]
  if missing:
    raise ValueError(f"decoded_token_metrics: statistics lack {missing}; "
                     f"got {sorted(statistics)}")
  count, confidence, correct = (
      np.asarray(statistics[name], np.float64).reshape(-1, np.shape(statistics[name])[-1]).sum(0)
      for name in STATISTICS)
  tokens = float(count.sum())
  with np.errstate(divide="ignore", invalid="ignore"):
    def mean(total):
      return float(total / tokens) if tokens > 0 else float("nan")

    return {"ece": mean(np.sum(np.abs(correct - confidence))),
            "accuracy": mean(correct.sum()), "mean_confidence": mean(confidence.sum()),
            "confidence_gap": mean(confidence.sum() - correct.sum()), "tokens": tokens,
            "bin_confidence": np.where(count > 0, confidence / np.maximum(count, 1), np.nan),
            "bin_accuracy": np.where(count > 0, correct / np.maximum(count, 1), np.nan),
            "bin_count": count}


def decoded_token_calibration(token_probs: Sequence[Sequence[float]], labels: Sequence[Sequence],
                              num_bins: int = DEFAULT_NUM_BINS) -> dict[str, object]:
  """Calibration of decoded tokens' probabilities against their labels, all outputs pooled.

  Args:
    token_probs: per output, the probability of each labelled token under the
      predictive (``exp`` of its log-probability, clipped to ``[0, 1]`` by the caller).
    labels: per output, each token's label (``closest_reference_labels``).
    num_bins: number of equal-width bins (``metrics.calibration``'s bins).

  Returns:
    ``decoded_token_metrics`` of all tokens: ``ece``, ``accuracy``, ``mean_confidence``,
    ``confidence_gap``, ``tokens``, ``bin_confidence``, ``bin_accuracy``, ``bin_count``.

  Raises:
    ValueError: as ``decoded_token_statistics``.
  """
  return decoded_token_metrics(decoded_token_statistics(token_probs, labels, num_bins))
