"""Sequence calibration by exact match against plain numpy and scikit-learn, and against a
synthetic task whose calibration is known."""

import math

import numpy as np
import pytest
from sklearn.calibration import calibration_curve
from sklearn.metrics import roc_auc_score

from meshbayes import metrics
from meshbayes.metrics import sequence_calibration
from meshbayes.metrics import sequence_labels as sl


def numpy_binary_ece(p, y, num_bins=15):
  """uncertainty-baselines' definition spelled out: the two-class distribution [1 - p, p],
  its top-label confidence and argmax (the first on ties), equal-width bins."""
  probs = np.stack([1 - p, p], -1)
  confidence, predicted = probs.max(-1), probs.argmax(-1)
  correct = (predicted == y).astype(float)
  error = 0.0
  for b in range(num_bins):
    inside = (confidence >= b / num_bins) & ((confidence < (b + 1) / num_bins) | (b == num_bins - 1))
    error += abs(np.sum(correct[inside] - confidence[inside]))
  return error / len(p)


def random_outputs(seed, n=600):
  rng = np.random.default_rng(seed)
  p = rng.beta(0.7, 2.0, size=n)
  y = (rng.random(n) < np.clip(p * 1.3 - 0.05, 0, 1)).astype(int)  # informative, miscalibrated
  return p, y


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_figures_against_numpy_and_scikit_learn(seed):
  p, y = random_outputs(seed)
  assert metrics.binary_ece(p, y) == pytest.approx(numpy_binary_ece(p, y), abs=1e-12)
  assert metrics.calibration_auroc(p, y) == pytest.approx(roc_auc_score(y, p), abs=1e-12)
  bins = metrics.equal_mass_reliability(p, y, num_bins=15)  # 600 = 15 x 40: equal counts
  rate, mean_p = calibration_curve(y, p, n_bins=15, strategy="quantile")
  np.testing.assert_allclose(bins["bin_accuracy"], rate, atol=1e-12)
  np.testing.assert_allclose(bins["bin_confidence"], mean_p, atol=1e-12)
  np.testing.assert_array_equal(bins["bin_count"], np.full(15, 40.0))
  figures = metrics.sequence_calibration_figures(p, y)
  assert figures["probability_gap"] == pytest.approx(p.mean() - y.mean())
  assert figures["equal_mass_ece"] == pytest.approx(np.mean(np.abs(mean_p - rate)))
  assert figures["ece"] == metrics.binary_ece(p, y)


def test_what_the_figures_say_of_confident_and_of_timid_models():
  """Overconfident (p = 0.9, a tenth match): ECE 0.8; outputs all unlikely and all wrong:
  ECE near 0 (rightly sure they are wrong) and nothing to rank (AUROC NaN)."""
  y = np.r_[np.ones(10), np.zeros(90)]
  assert metrics.binary_ece(np.full(100, 0.9), y) == pytest.approx(0.8)
  assert metrics.binary_ece(np.full(100, 0.003), np.zeros(100)) == pytest.approx(0.003)
  assert np.isnan(metrics.calibration_auroc(np.full(100, 0.003), np.zeros(100)))
  assert metrics.sequence_calibration_figures(np.full(100, 0.9), y)["probability_gap"] == pytest.approx(0.8)


def test_exact_match_normalization_and_several_references():
  assert sequence_calibration.normalize_for_match("  Tom  est là!") == "tom est là !"
  assert sequence_calibration.normalize_for_match("Ｔｏｍ") == "tom"  # NFKC: full-width letters
  matches = metrics.exact_matches(["Je suis là.", "Je suis ici.", "Oui"],
                                  [["je suis là ."], ["Me voici.", "Je suis ici !"], ["Non."]])
  np.testing.assert_array_equal(matches, [True, False, False])
  assert metrics.exact_matches(["Je suis ici!"], [["Me voici.", "je suis ici !"]])[0]


def test_bad_input_is_one_clear_error():
  with pytest.raises(ValueError, match=r"probabilities must lie in \[0, 1\]"):
    metrics.binary_ece([1.5], [1])
  with pytest.raises(ValueError, match="labels must be 0 or 1"):
    metrics.calibration_auroc([0.5], [0.5])
  with pytest.raises(ValueError, match="2 predictions but 1 reference lists"):
    metrics.exact_matches(["a", "b"], [["a"]])


# --------------------------------------------------------------------------- ground truth
# On sequence_labels.synthetic_task with one reference per source (mean_references=1), the
# label of the decoded mode is exactly Bernoulli(q), q its true probability: a calibrated
# model (T = 1) has p = q; T = 0.5 and T = 2 sharpen and flatten it.

SHARPENED, FLATTENED = 0.5, 2.0


def population_auroc(scores, q):
  """The AUROC the labels y_i ~ Bernoulli(q_i) give the scores, as a ratio of expectations.

  AUROC = sum_{i != j} y_i (1 - y_j) h_ij / sum_{i != j} y_i (1 - y_j) with h_ij = 1[s_i >
  s_j] + 1/2 1[s_i = s_j] (the i = j terms vanish, y_i (1 - y_i) = 0). For independent
  labels E[y_i (1 - y_j)] = q_i (1 - q_j) (i != j), so the population AUROC is
  sum_{i != j} q_i (1 - q_j) h_ij / sum_{i != j} q_i (1 - q_j); the observed AUROC's mean
  differs from it by O(1/n).
  """
  _, group = np.unique(scores, return_inverse=True)  # O(n log n): sums by distinct score
  negative = np.bincount(group, 1 - q)  # sum of 1 - q_j over each distinct score
  below = np.cumsum(negative) - negative  # ... over the lower scores
  ties = negative[group] - (1 - q)  # ... over the others with the same score
  numerator = np.sum(q * (below[group] + 0.5 * ties))
  return float(numerator / np.sum(q * (np.sum(1 - q) - (1 - q))))


def pairwise_population_auroc(scores, q):
  """population_auroc spelled out over the n x n pairs."""
  weight = q[:, None] * (1 - q[None, :])
  np.fill_diagonal(weight, 0.0)
  h = (scores[:, None] > scores[None, :]) + 0.5 * (scores[:, None] == scores[None, :])
  return float(np.sum(weight * h) / np.sum(weight))


def test_population_auroc_is_the_ratio_of_expectations():
  """Against enumeration of all 2^n label vectors on three outputs (one tie)."""
  scores, q = np.array([0.2, 0.7, 0.7]), np.array([0.3, 0.6, 0.5])
  numerator = denominator = 0.0
  for labels in np.ndindex(2, 2, 2):
    y = np.array(labels)
    probability = np.prod(np.where(y == 1, q, 1 - q))
    pairs = y[:, None] * (1 - y[None, :])
    h = (scores[:, None] > scores[None, :]) + 0.5 * (scores[:, None] == scores[None, :])
    numerator += probability * np.sum(pairs * h)
    denominator += probability * np.sum(pairs)
  assert population_auroc(scores, q) == pytest.approx(numerator / denominator, abs=1e-12)
  assert pairwise_population_auroc(scores, q) == pytest.approx(numerator / denominator,
                                                               abs=1e-12)
  rng = np.random.default_rng(0)
  scores, q = rng.integers(0, 20, 300) / 20, rng.random(300)  # many ties
  assert population_auroc(scores, q) == pytest.approx(pairwise_population_auroc(scores, q),
                                                      abs=1e-12)


def test_calibration_auroc_matches_the_population_auroc_and_temperature_changes_it():
  """The observed AUROC is the population AUROC of its scores, within noise, for every T.

  A temperature is monotone within a source (the mode stays the mode, so the labels are
  the same) but not across sources: p_T(mode) = 1 / sum_j (q_j / q_mode)^(1/T) depends on
  the rest of q, so sources swap ranks (about 7% of pairs here) and the AUROC changes.
  Ranking by q is optimal pair by pair (q_i (1 - q_j) > q_j (1 - q_i) iff q_i > q_j), so
  the calibrated model's population AUROC is the highest, and both temperatures lower it
  by about half a point.
  """
  n, seeds = 1000, 60
  error = {T: [] for T in (1.0, SHARPENED, FLATTENED)}
  drop, population_drop, discordant = ({T: [] for T in (SHARPENED, FLATTENED)} for _ in range(3))
  for seed in range(seeds):
    task = sl.synthetic_task(n, mean_references=1.0, seed=seed)
    calibrated = task.decode(1.0)
    q, y = calibrated["true_probability"], calibrated["num_matched"]
    np.testing.assert_array_equal(task.num_references, 1)
    truth = population_auroc(q, q)
    error[1.0].append(metrics.calibration_auroc(calibrated["probability"], y) - truth)
    for T in (SHARPENED, FLATTENED):
      decoded = task.decode(T)
      np.testing.assert_array_equal(decoded["num_matched"], y)  # the same mode and labels
      p = decoded["probability"]
      error[T].append(metrics.calibration_auroc(p, y) - population_auroc(p, q))
      drop[T].append(metrics.calibration_auroc(q, y) - metrics.calibration_auroc(p, y))
      population_drop[T].append(truth - population_auroc(p, q))
      if seed < 5:
        discordant[T].append(np.mean(np.sign(p[:, None] - p[None, :]) *
                                     np.sign(q[:, None] - q[None, :]) < 0))
  for T, values in error.items():
    values = np.array(values)
    assert abs(values.mean()) < 4 * values.std() / math.sqrt(seeds), (T, values.mean())
  for T in (SHARPENED, FLATTENED):
    observed, truth = np.array(drop[T]), np.array(population_drop[T])
    assert np.all(truth >= 0)  # q's ranking is optimal on every task
    assert np.mean(discordant[T]) > 0.05  # ranks are not preserved across sources
    paired = (observed - truth).std() / math.sqrt(seeds)
    assert abs(observed.mean() - truth.mean()) < 4 * paired, (T, observed.mean(), truth.mean())
    assert truth.mean() == pytest.approx(0.0047, abs=0.001)  # half a point of AUROC
    assert observed.mean() > 5 * observed.std() / math.sqrt(seeds)  # the data show it


def equal_mass_ece(p, y):
  return metrics.sequence_calibration_figures(p, y)["equal_mass_ece"]


@pytest.mark.parametrize("temperature, sign", [(1.0, 0), (SHARPENED, 1), (FLATTENED, -1)])
def test_equal_mass_ece_against_the_null_band_and_the_true_gap(temperature, sign):
  task = sl.synthetic_task(5000, mean_references=1.0, seed=0)
  decoded = task.decode(temperature)
  p, q = decoded["probability"], decoded["true_probability"]
  y = decoded["num_matched"].astype(float)
  figures = metrics.sequence_calibration_figures(p, y)
  ece, gap = figures["equal_mass_ece"], figures["probability_gap"]
  assert ece == pytest.approx(equal_mass_ece(p, y))
  band = sl.null_band(p, equal_mass_ece, num_draws=300, seed=1)
  # The truth: the equal-mass ECE of p against q itself, and the true gap mean(p - q).
  # (equal_mass_reliability takes 0/1 labels only: the same bins, summed directly.)
  index = sequence_calibration.equal_mass_bins(p)
  true_ece = float(np.sum(np.abs(np.bincount(index, p - q))) / p.size)
  true_gap = float(np.mean(p - q))
  error = math.sqrt(np.sum(q * (1 - q))) / p.size  # standard error of mean(y) - mean(q)
  assert abs(gap - true_gap) < 4 * error, (gap, true_gap, error)
  if sign == 0:
    assert true_gap == pytest.approx(0.0, abs=1e-12) and true_ece == pytest.approx(0, abs=1e-12)
    assert band.contains(ece), (ece, band)
    return
  # Every mode's p moves the same way: the true equal-mass ECE is the true |gap|.
  assert np.all(np.sign(p - q) == sign)
  assert true_ece == pytest.approx(abs(true_gap), rel=1e-9)
  assert abs(true_gap) == pytest.approx(0.19 if sign > 0 else 0.20, abs=0.015)
  assert np.sign(gap) == sign
  assert ece > band.high, (ece, band)
  assert abs(ece - true_ece) < 4 * error, (ece, true_ece, error)
