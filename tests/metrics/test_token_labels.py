"""Decoded-token labels against a brute force over every alignment, and their calibration
against a direct computation."""

import fractions
import itertools

import numpy as np
import pytest

from meshbayes.metrics import calibration, token_labels
from meshbayes.metrics.token_labels import (
    align_labels,
    closest_reference_alignment,
    closest_reference_labels,
    decoded_token_calibration,
    decoded_token_metrics,
    decoded_token_statistics,
)
from tests.metrics.reference_loops import loop_one_sided_ece

# Moves of an alignment, ranked as the module's tie-break prefers them from the end:
# align the two tokens, leave the hypothesis token unaligned, leave the reference token.
ALIGN, HYPOTHESIS_ONLY, REFERENCE_ONLY = 0, 1, 2
STEP = {ALIGN: (1, 1), HYPOTHESIS_ONLY: (1, 0), REFERENCE_ONLY: (0, 1)}


def all_alignments(n, m):
  """Every order-keeping alignment of n hypothesis and m reference tokens, as move lists."""
  if n == 0 and m == 0:
    yield []
    return
  for move, (di, dj) in STEP.items():
    if di <= n and dj <= m:
      for rest in all_alignments(n - di, m - dj):
        yield rest + [move]


def brute_force(hypothesis, reference):
  """(cost, matches, labels, tie-break key) of every alignment."""
  results = []
  for moves in all_alignments(len(hypothesis), len(reference)):
    i = j = cost = matches = 0
    labels = [False] * len(hypothesis)
    for move in moves:
      if move == ALIGN:
        same = hypothesis[i] == reference[j]
        labels[i] = same
        matches += same
        cost += not same
      else:
        cost += 1
      di, dj = STEP[move]
      i, j = i + di, j + dj
    results.append((cost, matches, labels, tuple(reversed(moves))))
  return results


def brute_force_choice(hypothesis, reference):
  """The least cost, the most matches among least-cost alignments, and the labels of the
  alignment the module's definition picks (least cost, most matches, first by the
  tie-break's order of moves read from the end)."""
  results = brute_force(hypothesis, reference)
  best = min(results, key=lambda r: (r[0], -r[1], r[3]))
  least = min(r[0] for r in results)
  most = max(r[1] for r in results if r[0] == least)
  return least, most, best[2]


def small_cases():
  """Every pair over {0, 1} of lengths <= 3, and random pairs of lengths <= 5 over <= 3 ids."""
  sequences = [list(s) for n in range(4) for s in itertools.product(range(2), repeat=n)]
  cases = [(a, b) for a in sequences for b in sequences]
  rng = np.random.default_rng(0)
  for _ in range(150):
    vocab = int(rng.integers(1, 4))
    cases.append(tuple(rng.integers(0, vocab, size=int(rng.integers(0, 6))).tolist()
                       for _ in range(2)))
  return cases


def test_brute_force_enumerates_every_alignment():
  # The Delannoy numbers: D(2, 2) = 13, D(5, 5) = 1683.
  assert len(list(all_alignments(2, 2))) == 13
  assert len(list(all_alignments(5, 5))) == 1683


def test_labels_equal_the_brute_force_alignments():
  cases = small_cases()
  assert len(cases) == 375
  differ = 0
  for hypothesis, reference in cases:
    labels, distance = align_labels(hypothesis, reference)
    least, most, chosen = brute_force_choice(hypothesis, reference)
    assert distance == least, (hypothesis, reference)
    assert int(labels.sum()) == most, (hypothesis, reference)
    assert labels.tolist() == chosen, (hypothesis, reference)
    assert labels.dtype == bool and labels.shape == (len(hypothesis),)
    # Where least-cost alignments disagree on the number of matches, the most is taken.
    results = brute_force(hypothesis, reference)
    differ += len({r[1] for r in results if r[0] == least}) > 1
  assert differ > 10  # the cases do test the choice of the most matches


@pytest.mark.parametrize("hypothesis, reference, labels, distance", [
    ([4, 5, 6], [4, 5, 6], [True, True, True], 0),  # identical
    ([4, 5, 6], [7, 8], [False, False, False], 3),  # disjoint
    ([1, 2, 3, 4], [1, 9, 3, 4], [True, False, True, True], 1),  # one substitution
    ([1, 2, 9, 3, 4], [1, 2, 3, 4], [True, True, False, True, True], 1),  # extra token
    ([1, 3, 4], [1, 2, 3, 4], [True, True, True], 1),  # missing token
    ([5, 1, 2, 3], [1, 2, 3, 6], [False, True, True, True], 2),  # shifted by one
    ([], [1, 2], [], 2),
    ([1, 2], [], [False, False], 2),
    ([7, 7], [7], [False, True], 1),  # the tie-break matches the later token
    ([1, 2], [2, 1], [True, False], 2),  # one match, though two substitutions cost as much
])
def test_hand_made_alignments(hypothesis, reference, labels, distance):
  got, got_distance = align_labels(hypothesis, reference)
  assert got.tolist() == labels
  assert got_distance == distance


def test_numpy_ids_and_large_ids():
  labels, distance = align_labels(np.array([31999, 5, 7], np.int32), (31999, 7))
  assert labels.tolist() == [True, False, True] and distance == 1


def test_closest_reference_against_brute_force():
  rng = np.random.default_rng(1)
  for normalized in (True, False):
    for _ in range(60):
      hypothesis = rng.integers(0, 3, size=int(rng.integers(0, 5))).tolist()
      references = [rng.integers(0, 3, size=int(rng.integers(0, 5))).tolist()
                    for _ in range(int(rng.integers(1, 4)))]
      choices = [brute_force_choice(hypothesis, r) for r in references]
      scores = [fractions.Fraction(c[0], max(len(r), 1)) if normalized else c[0]
                for c, r in zip(choices, references)]
      best = scores.index(min(scores))  # the first on ties
      got = closest_reference_alignment(hypothesis, references, normalized=normalized)
      assert got.reference_index == best, (hypothesis, references)
      assert got.distance == choices[best][0]
      assert got.labels.tolist() == choices[best][2]
      assert closest_reference_labels(hypothesis, references,
                                      normalized=normalized).tolist() == choices[best][2]


def test_closest_reference_hand_made():
  hypothesis = [1, 2, 3]
  long, short = [1, 2, 3, 4, 5, 6, 7], [1, 9]  # 4 edits in 7 tokens; 2 edits in 2
  assert closest_reference_alignment(hypothesis, [short, long]).reference_index == 1
  assert closest_reference_labels(hypothesis, [short, long]).tolist() == [True, True, True]
  raw = closest_reference_alignment(hypothesis, [short, long], normalized=False)
  assert raw.reference_index == 0 and raw.distance == 2
  assert raw.labels.tolist() == [True, False, False]
  # Ties (1 edit in 2 tokens each): the first reference.
  assert closest_reference_alignment([1], [[1, 3], [1, 2]]).reference_index == 0
  assert closest_reference_alignment([1], [[1, 2], [1, 2]]).reference_index == 0
  # An exact match wins, wherever it is.
  exact = closest_reference_alignment([4, 5], [[4], [6, 5], [4, 5]])
  assert (exact.labels.tolist(), exact.distance, exact.reference_index) == ([True, True], 0, 2)


def test_labels_per_source_at_evaluation_sizes():
  """A source of 12 references of <= 64 tokens: the vectorized tables equal one pair's."""
  rng = np.random.default_rng(2)
  hypothesis = rng.integers(3, 40, size=60)
  references = [rng.integers(3, 40, size=int(rng.integers(1, 65))) for _ in range(12)]
  got = closest_reference_alignment(hypothesis, references)
  alone = [align_labels(hypothesis, r) for r in references]
  scores = [fractions.Fraction(d, len(r)) for (_, d), r in zip(alone, references)]
  assert got.reference_index == scores.index(min(scores))
  assert got.distance == alone[got.reference_index][1]
  np.testing.assert_array_equal(got.labels, alone[got.reference_index][0])


@pytest.mark.parametrize("call, message", [
    (lambda: align_labels([1, -2], [1]), "non-negative token ids; got -2"),
    (lambda: align_labels([[1, 2]], [1]), "1-D sequence of integer token ids; got shape (1, 2)"),
    (lambda: align_labels([1.5], [1]), "dtype float64"),
    (lambda: closest_reference_labels([1], []), "non-empty sequence"),
    (lambda: closest_reference_labels([1, 2, 1], [[2]], eos_id=1),
     "hypothesis holds EOS (1) at position 0"),
    (lambda: closest_reference_labels([2], [[2], [2, 1]], eos_id=1),
     "references[1] holds EOS (1) at position 1"),
])
def test_bad_ids(call, message):
  with pytest.raises(ValueError) as error:
    call()
  assert message in str(error.value) and "\n" not in str(error.value)


# --------------------------------------------------------------------------- calibration




def random_outputs(seed, outputs=40):
  rng = np.random.default_rng(seed)
  probs, labels = [], []
  for _ in range(outputs):
    p = rng.beta(2.0, 1.0, size=int(rng.integers(0, 12)))
    probs.append(p)
    labels.append(rng.random(p.size) < p ** 1.5)  # overconfident
  return probs, labels


@pytest.mark.parametrize("seed, num_bins", [(0, 15), (1, 15), (2, 4)])
def test_ece_against_direct_computation(seed, num_bins):
  probs, labels = random_outputs(seed)
  p, y = np.concatenate(probs), np.concatenate(labels).astype(float)
  figures = decoded_token_calibration(probs, labels, num_bins)
  assert figures["ece"] == pytest.approx(loop_one_sided_ece(p, y, num_bins), abs=1e-12)
  assert figures["ece"] == pytest.approx(calibration.expected_calibration_error(p, y, num_bins),
                                         abs=1e-12)
  assert figures["tokens"] == p.size
  assert figures["accuracy"] == pytest.approx(y.mean(), abs=1e-12)
  assert figures["mean_confidence"] == pytest.approx(p.mean(), abs=1e-12)
  assert figures["confidence_gap"] == pytest.approx(p.mean() - y.mean(), abs=1e-12)
  counts = np.histogram(p, bins=np.linspace(0, 1, num_bins + 1))[0]
  np.testing.assert_array_equal(figures["bin_count"], counts)
  reliability = calibration.reliability_bins(p, y, num_bins)
  np.testing.assert_allclose(figures["bin_accuracy"], reliability["bin_accuracy"], atol=1e-12)
  np.testing.assert_allclose(figures["bin_confidence"], reliability["bin_confidence"],
                             atol=1e-12)


def test_hand_computed_ece():
  # Bins of width 1/2: {0.3 wrong} and {0.9, 0.8, 1.0 right, 0.6 wrong}.
  figures = decoded_token_calibration([[0.9, 0.3], [], [0.8, 1.0, 0.6]],
                                      [[1, 0], [], [True, True, False]], num_bins=2)
  assert figures["ece"] == pytest.approx((0.3 + abs(3 - 3.3)) / 5)
  assert figures["accuracy"] == pytest.approx(0.6)
  assert figures["bin_count"].tolist() == [1.0, 4.0]
  empty = decoded_token_calibration([[]], [[]])
  assert empty["tokens"] == 0.0 and np.isnan(empty["ece"]) and np.isnan(empty["accuracy"])


def test_per_output_statistics_resample_like_sources():
  probs, labels = random_outputs(3)
  statistics = decoded_token_statistics(probs, labels)
  assert statistics["bin_count"].shape == (40, 15)
  index = np.random.default_rng(4).integers(0, 40, size=40)  # a bootstrap resample
  resampled = decoded_token_metrics({k: v[index] for k, v in statistics.items()})
  direct = decoded_token_calibration([probs[k] for k in index], [labels[k] for k in index])
  assert resampled["ece"] == pytest.approx(direct["ece"], abs=1e-12)
  assert resampled["tokens"] == direct["tokens"]


@pytest.mark.parametrize("probs, labels, message", [
    ([[0.5, 0.5]], [[1]], "token_probs[0] has 2 values but labels[0] has 1"),
    ([[0.5], [0.2]], [[1]], "token_probs has 2 outputs but labels has 1"),
    ([[0.5], [0.2, 1.5]], [[1], [0, 1]], "token_probs[1] must lie in [0, 1]; got 1.5 at "
                                         "position 1"),
    ([[-0.1]], [[0]], "got -0.1 at position 0"),
    ([[np.nan]], [[0]], "got nan at position 0"),
    ([[0.5]], [[2]], "labels[0] must be 0 or 1 (or bool); got 2 at position 0"),
])
def test_bad_calibration_input(probs, labels, message):
  with pytest.raises(ValueError) as error:
    decoded_token_calibration(probs, labels)
  assert message in str(error.value) and "\n" not in str(error.value)


def test_bad_num_bins_and_statistics():
  with pytest.raises(ValueError, match="num_bins must be a positive integer; got 0"):
    decoded_token_statistics([[0.5]], [[1]], num_bins=0)
  with pytest.raises(ValueError, match="lack"):
    decoded_token_metrics({"bin_count": np.ones(3)})


def test_default_bins_are_the_token_calibration_bins():
  assert token_labels.DEFAULT_NUM_BINS == calibration.DEFAULT_NUM_BINS == 15
