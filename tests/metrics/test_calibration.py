"""Calibration metrics against brute-force loops over their definitions."""

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes.metrics import calibration

NUM_BINS = 15

token_statistics = jax.jit(calibration.token_calibration_statistics, static_argnames="num_bins")


def bin_of(p, num_bins):
  return min(int(math.floor(p * num_bins)), num_bins - 1)


def brute_force_token_metrics(probs, targets, weights, num_bins):
  """Every token metric straight from its definition, one token and one label at a time."""
  batch, length, vocab = probs.shape
  tokens = nll = correct_sum = brier = 0.0
  count, sum_conf, sum_correct = [0.0] * num_bins, [0.0] * num_bins, [0.0] * num_bins
  pair = [0.0] * num_bins
  for i in range(batch):
    for t in range(length):
      w = float(weights[i, t])
      if w == 0:
        continue
      p, y = [float(x) for x in probs[i, t]], int(targets[i, t])
      confidence = max(p)
      correct = float(p.index(confidence) == y)
      b = bin_of(confidence, num_bins)
      count[b] += w
      sum_conf[b] += w * confidence
      sum_correct[b] += w * correct
      for label in range(vocab):
        pair[bin_of(p[label], num_bins)] += w * p[label] * (float(label == y) - p[label])
        brier += w * (p[label] - float(label == y)) ** 2
      tokens += w
      nll += -w * math.log(p[y])
      correct_sum += w * correct
  ece = sum(count[b] / tokens * abs(sum_correct[b] / count[b] - sum_conf[b] / count[b])
            for b in range(num_bins) if count[b] > 0)
  return {
      "ece": ece, "weighted_ece": sum(abs(s) for s in pair) / tokens, "brier": brier / tokens,
      "nll": nll / tokens, "accuracy": correct_sum / tokens, "tokens": tokens,
      "bin_count": np.array(count),
      "bin_confidence": np.array([s / c if c else np.nan for s, c in zip(sum_conf, count)]),
      "bin_accuracy": np.array([s / c if c else np.nan for s, c in zip(sum_correct, count)]),
  }


def random_batch(seed=0, batch=3, length=4, vocab=7):
  """Random distributions, targets and padding weights; a padded token has a -inf entry."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(batch, length, vocab)) * 2.0
  log_probs = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32))
  log_probs = log_probs.at[0, 3, 0].set(-jnp.inf)  # a masked position may hold -inf
  targets = rng.integers(0, vocab, size=(batch, length))
  targets[0, 3] = 0
  weights = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], np.float32)[:batch]
  return log_probs, jnp.asarray(targets), jnp.asarray(weights)


@pytest.mark.parametrize("num_bins", [NUM_BINS, 4])
def test_token_metrics_match_brute_force(num_bins):
  log_probs, targets, weights = random_batch()
  stats = token_statistics(log_probs, targets, weights, num_bins=num_bins)
  got = calibration.token_calibration_metrics(jax.device_get(stats))
  # The brute force sees the same float32 probabilities the device used.
  want = brute_force_token_metrics(np.asarray(jnp.exp(log_probs), np.float64), np.asarray(targets),
                                   np.asarray(weights), num_bins)
  for key in ["ece", "weighted_ece", "brier", "nll", "accuracy", "tokens"]:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)
  for key in ["bin_count", "bin_confidence", "bin_accuracy"]:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)
  assert got["tokens"] == 9.0 and got["weighted_ece"] > 0 and got["ece"] > 0


def test_fractional_weights_match_brute_force():
  log_probs, targets, padding = random_batch(seed=1)
  weights = padding * jnp.asarray(np.random.default_rng(1).uniform(0.1, 2.0, size=targets.shape),
                                  jnp.float32)
  got = calibration.token_calibration_metrics(token_statistics(log_probs, targets, weights))
  want = brute_force_token_metrics(np.asarray(jnp.exp(log_probs), np.float64), np.asarray(targets),
                                   np.asarray(weights), NUM_BINS)
  for key in ["ece", "weighted_ece", "brier", "nll", "accuracy"]:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_statistics_add_over_batches():
  log_probs, targets, weights = random_batch(seed=2)
  whole = token_statistics(log_probs, targets, weights)
  halves = [token_statistics(log_probs[s], targets[s], weights[s])
            for s in (slice(0, 1), slice(1, 3))]
  summed = calibration.sum_statistics(halves)
  assert summed.keys() == whole.keys()
  for key in whole:
    np.testing.assert_allclose(summed[key], whole[key], rtol=1e-6, atol=1e-6, err_msg=key)
  tree_summed = jax.tree.map(np.add, *jax.device_get(halves))
  for key in whole:
    np.testing.assert_allclose(summed[key], tree_summed[key], rtol=1e-6, err_msg=key)
  with pytest.raises(ValueError, match="no statistics"):
    calibration.sum_statistics([])


def hoeffding_bound(ranges_per_bin, num_tokens, delta):
  """(1/N) sum_b sqrt(ln(2B/delta)/2 * sum_i r_ib^2): with probability >= 1 - delta every bin's
  sum of independent zero-mean terms (ranges r_ib) stays within its Hoeffding radius."""
  log_term = math.log(2 * len(ranges_per_bin) / delta)
  return sum(math.sqrt(log_term / 2 * np.sum(np.square(r))) for r in ranges_per_bin) / num_tokens


def test_perfectly_calibrated_model_has_small_errors():
  # Targets drawn from the model's own distributions: E[correct_i | p_i] = max_y p_iy and
  # E[1[y == y_i] | p_i] = p_iy, so every bin's summed gap is a sum of independent zero-mean
  # terms (bins depend on p only). Hoeffding with a union bound over the bins gives, with
  # probability >= 1 - delta, ECE <= (1/N) sum_b sqrt(n_b ln(2B/delta) / 2): each top-label
  # term lies in an interval of length 1. A token's weighted-ECE term in bin b,
  # sum_{y in b} p_iy (1[y == y_i] - p_iy), lies in one of length r_ib = max_{y in b} p_iy.
  rng = np.random.default_rng(0)
  batch, length, vocab, delta = 50, 200, 7, 1e-6
  probs = rng.dirichlet(np.full(vocab, 0.5), size=(batch, length))
  cumulative = np.cumsum(probs, -1)
  targets = np.minimum((rng.random((batch, length, 1)) > cumulative).sum(-1), vocab - 1)
  weights = np.ones((batch, length), np.float32)
  log_probs = jnp.log(jnp.asarray(probs, jnp.float32))
  metrics = calibration.token_calibration_metrics(
      token_statistics(log_probs, jnp.asarray(targets), jnp.asarray(weights)))

  num_tokens = batch * length
  confidence_bins = calibration.bin_indices(probs.max(-1).reshape(-1), NUM_BINS)
  top_label_ranges = [np.ones(np.sum(confidence_bins == b)) for b in range(NUM_BINS)]
  pair_bins = calibration.bin_indices(probs.reshape(num_tokens, vocab), NUM_BINS)
  pair_ranges = [np.max(np.where(pair_bins == b, probs.reshape(num_tokens, vocab), 0.0), -1)
                 for b in range(NUM_BINS)]
  slack = 1e-4  # float32 rounding of the probabilities the metric sees
  ece_bound = hoeffding_bound(top_label_ranges, num_tokens, delta) + slack
  weighted_bound = hoeffding_bound(pair_ranges, num_tokens, delta) + slack
  assert ece_bound < math.sqrt(NUM_BINS * math.log(2 * NUM_BINS / delta) / (2 * num_tokens)) + slack
  assert metrics["ece"] < ece_bound, (metrics["ece"], ece_bound)
  assert metrics["weighted_ece"] < weighted_bound, (metrics["weighted_ece"], weighted_bound)

  # Not vacuous: the same targets scored by an overconfident (sharpened) model break the bounds.
  sharp = jax.nn.log_softmax(3.0 * log_probs)
  overconfident = calibration.token_calibration_metrics(
      token_statistics(sharp, jnp.asarray(targets), jnp.asarray(weights)))
  assert overconfident["ece"] > 2 * ece_bound
  assert overconfident["weighted_ece"] > 2 * weighted_bound


def test_perfectly_calibrated_1d_confidences():
  rng = np.random.default_rng(1)
  n, delta = 20000, 1e-6
  confidence = rng.random(n)
  correct = (rng.random(n) < confidence).astype(float)
  index = calibration.bin_indices(confidence, NUM_BINS)
  bound = hoeffding_bound([np.ones(np.sum(index == b)) for b in range(NUM_BINS)], n, delta)
  assert calibration.expected_calibration_error(confidence, correct) < bound
  assert calibration.expected_calibration_error(confidence ** 0.25, correct) > 2 * bound


def brute_force_ece(confidences, correctness, num_bins, weights=None):
  weights = [1.0] * len(confidences) if weights is None else list(weights)
  total = sum(weights)
  error = 0.0
  for b in range(num_bins):
    members = [i for i, c in enumerate(confidences) if bin_of(c, num_bins) == b]
    n_b = sum(weights[i] for i in members)
    if n_b == 0:
      continue
    conf_b = sum(weights[i] * confidences[i] for i in members) / n_b
    acc_b = sum(weights[i] * correctness[i] for i in members) / n_b
    error += n_b / total * abs(acc_b - conf_b)
  return error


@pytest.mark.parametrize("num_bins", [15, 10, 3])
def test_1d_ece_matches_brute_force(num_bins):
  rng = np.random.default_rng(num_bins)
  confidences = rng.random(40).tolist() + [0.0, 1.0]
  correct = rng.integers(0, 2, size=42).tolist()
  weights = rng.uniform(0.5, 2.0, size=42).tolist()
  np.testing.assert_allclose(
      calibration.expected_calibration_error(confidences, correct, num_bins),
      brute_force_ece(confidences, correct, num_bins), rtol=1e-12)
  np.testing.assert_allclose(
      calibration.expected_calibration_error(confidences, correct, num_bins, weights=weights),
      brute_force_ece(confidences, correct, num_bins, weights), rtol=1e-12)
  graded = rng.random(42).tolist()  # correctness graded in [0, 1]
  np.testing.assert_allclose(calibration.expected_calibration_error(confidences, graded, num_bins),
                             brute_force_ece(confidences, graded, num_bins), rtol=1e-12)


def test_graded_ece_and_reliability_by_hand():
  confidences = [0.2, 0.3, 0.8, 0.9]
  correctness = [0.1, 0.5, 0.6, 0.6]
  # Two bins: [0, .5) holds conf .2, .3 (mean .25) and correctness .1, .5 (mean .3);
  # [.5, 1] holds conf .8, .9 (mean .85) and correctness .6, .6 (mean .6).
  # Error = 2/4 * |.3 - .25| + 2/4 * |.6 - .85| = .025 + .125 = 3/20.
  assert calibration.expected_calibration_error(confidences, correctness, num_bins=2) == \
      pytest.approx(float(Fraction(3, 20)), abs=1e-12)
  # Fifteen bins: each output alone in its bin (3, 4, 12, 13), so the error is the mean gap
  # (.1 + .2 + .2 + .3) / 4 = 1/5.
  assert calibration.expected_calibration_error(confidences, correctness) == \
      pytest.approx(float(Fraction(1, 5)), abs=1e-12)
  bins = calibration.reliability_bins(confidences, correctness, num_bins=2)
  np.testing.assert_allclose(bins["bin_confidence"], [0.25, 0.85])
  np.testing.assert_allclose(bins["bin_accuracy"], [0.3, 0.6])
  np.testing.assert_array_equal(bins["bin_count"], [2, 2])


def test_bin_edges():
  edges = np.array([0.0, 0.07, 0.5, 0.99, 1.0])
  np.testing.assert_array_equal(calibration.bin_indices(edges, NUM_BINS), [0, 1, 7, 14, 14])
  np.testing.assert_array_equal(calibration.bin_indices(jnp.asarray(edges, jnp.float32), NUM_BINS),
                                [0, 1, 7, 14, 14])
  bins = calibration.reliability_bins([0.0, 1.0], [0, 1])
  np.testing.assert_array_equal(bins["bin_count"], [1] + [0] * 13 + [1])
  assert np.isnan(bins["bin_confidence"][1:-1]).all()
  assert calibration.expected_calibration_error([0.0, 1.0], [0, 1]) == 0.0
  # On device: a one-hot distribution has confidence exactly 1 and lands in the last bin.
  log_probs = jnp.log(jnp.array([[[1.0, 0.0, 0.0]]]))
  stats = token_statistics(log_probs, jnp.array([[0]]), jnp.array([[1.0]]))
  np.testing.assert_array_equal(stats["bin_count"], [0] * 14 + [1])
  np.testing.assert_allclose(stats["pair_bin_sum_prob_correct"], [0] * 14 + [1])
  metrics = calibration.token_calibration_metrics(stats)
  assert metrics["ece"] == 0.0 and metrics["weighted_ece"] == 0.0 and metrics["brier"] == 0.0


def test_invalid_inputs():
  with pytest.raises(ValueError, match=r"\[0, 1\]"):
    calibration.expected_calibration_error([1.5], [1])
  with pytest.raises(ValueError, match=r"\[0, 1\]"):
    calibration.expected_calibration_error([0.5], [np.nan])
  with pytest.raises(ValueError, match="one length"):
    calibration.expected_calibration_error([0.5, 0.2], [1])
  assert math.isnan(calibration.expected_calibration_error([], []))
