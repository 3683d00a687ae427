"""Sequence calibration by exact match against plain numpy and scikit-learn."""

import numpy as np
import pytest
from sklearn.calibration import calibration_curve
from sklearn.metrics import roc_auc_score

from meshbayes import metrics
from meshbayes.metrics import sequence_calibration


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
