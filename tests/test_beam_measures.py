"""The importance-weighted beam measures against loops over their definitions, the
one-hypothesis measures and the exact expectations over a whole support."""

import itertools
import math

import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes import predictive


def measures_of(sample_log_probs, lengths, temperature=1.0):
  return {name: np.asarray(value, np.float64) for name, value in
          predictive.beam_sequence_measures(jnp.asarray(sample_log_probs, jnp.float32),
                                            jnp.asarray(lengths), temperature).items()}


def test_the_names_are_the_registrys_in_order():
  assert tuple(measures_of(np.zeros((2, 1, 3)), np.ones((1, 3)))) == predictive.BEAM_MEASURES


def test_one_hypothesis_gives_the_sequence_measures():
  rng = np.random.default_rng(0)
  sample_log_probs = -rng.uniform(0.1, 6.0, size=(3, 4, 1))  # S=3, 4 inputs, B=1
  lengths = rng.integers(1, 7, size=(4, 1))
  beam = measures_of(sample_log_probs, lengths)
  sequence = predictive.sequence_measures(jnp.asarray(sample_log_probs[..., 0], jnp.float32),
                                          jnp.asarray(lengths[:, 0]))
  for name in ("total_uncertainty", "data_uncertainty", "reverse_mutual_information"):
    np.testing.assert_allclose(beam[f"beam_{name}"], sequence[f"sequence_{name}"], rtol=1e-6,
                               err_msg=name)
  np.testing.assert_allclose(beam["beam_mutual_information"],
                             -beam["beam_reverse_mutual_information"], rtol=1e-5)
  np.testing.assert_allclose(beam["beam_epkl"], 0.0, atol=1e-6)


def loop_measures(probs, lengths, present, temperature):
  """One input's measures by their definitions, looping over samples and hypotheses.

  probs: [S][B] P_s(y_b); lengths: [B]; present: [B] booleans.
  """
  beams = [b for b in range(len(lengths)) if present[b]]
  num_samples = len(probs)
  average = {b: sum(probs[s][b] for s in range(num_samples)) / num_samples for b in beams}
  norm = sum(average[b] ** (1 / temperature) for b in beams)
  pi = {b: average[b] ** (1 / temperature) / norm for b in beams}
  total = -sum(pi[b] * math.log(average[b]) / lengths[b] for b in beams)
  own = []  # each sample's entropy over the beam, weighted by its own probabilities
  for s in range(num_samples):
    norm_s = sum(probs[s][b] ** (1 / temperature) for b in beams)
    own.append(-sum(probs[s][b] ** (1 / temperature) / norm_s * math.log(probs[s][b])
                    / lengths[b] for b in beams))
  data = sum(own) / num_samples
  # Pairs (s, t): the cross-entropy to t (under the average's weights) minus s's entropy.
  epkl = sum(-sum(pi[b] * math.log(probs[t][b]) / lengths[b] for b in beams) - own[s]
             for s in range(num_samples) for t in range(num_samples)) / num_samples ** 2
  rmi = sum(sum(pi[b] * (math.log(average[b]) - math.log(probs[s][b])) / lengths[b]
                for b in beams) for s in range(num_samples)) / num_samples
  return {"beam_total_uncertainty": total, "beam_data_uncertainty": data,
          "beam_mutual_information": total - data, "beam_epkl": epkl,
          "beam_reverse_mutual_information": rmi}


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_a_small_case_against_loops_over_hypotheses_and_samples(temperature):
  """S=2 samples, 2 inputs of B=3 hypotheses, the second input's last one absent."""
  probs = np.array([[[0.30, 0.10, 0.05], [0.02, 0.40, 0.01]],
                    [[0.05, 0.20, 0.15], [0.10, 0.30, 0.50]]])  # [S, input, B]
  lengths = np.array([[3, 1, 4], [2, 5, 2]])
  present = np.array([[True, True, True], [True, True, False]])
  sample_log_probs = np.where(present, np.log(probs), -np.inf)
  measures = measures_of(sample_log_probs, lengths, temperature)
  for row in range(2):
    expected = loop_measures(probs[:, row], lengths[row], present[row], temperature)
    for name, value in expected.items():
      np.testing.assert_allclose(measures[name][row], value, rtol=1e-5, atol=1e-7,
                                 err_msg=f"{name}, input {row}")
  # Jensen for each hypothesis; the mutual information has no sign over part of a support.
  assert np.all(measures["beam_reverse_mutual_information"] > 0)


def test_knowledge_uncertainty_vanishes_when_the_samples_agree():
  rng = np.random.default_rng(1)
  one = np.log(rng.dirichlet(np.ones(6), size=3))[..., :4]  # 3 inputs, B=4 hypotheses
  measures = measures_of(np.broadcast_to(one, (5, 3, 4)), rng.integers(1, 6, (3, 4)))
  for name in ("beam_mutual_information", "beam_epkl", "beam_reverse_mutual_information"):
    np.testing.assert_allclose(measures[name], 0.0, atol=1e-6, err_msg=name)
  np.testing.assert_allclose(measures["beam_data_uncertainty"],
                             measures["beam_total_uncertainty"], rtol=1e-6)


def autoregressive_support(rng, num_samples):
  """Every output of at most 2 words over {a, b} (then EOS) and each of ``num_samples``
  random autoregressive models' probability of it: ``(outputs, lengths with EOS, [S, B])``."""
  outputs = [()] + [(w,) for w in "ab"] + list(itertools.product("ab", repeat=2))
  probs = np.ones((num_samples, len(outputs)))
  for s in range(num_samples):
    first = dict(zip("ab$", rng.dirichlet(np.ones(3))))
    second = {w: dict(zip("ab$", rng.dirichlet(np.ones(3)))) for w in "ab"}
    for b, output in enumerate(outputs):  # the third token is always EOS
      probs[s, b] = (first[output[0]] * second[output[0]][output[1]] if len(output) == 2
                     else first[output[0]] * second[output[0]]["$"] if output
                     else first["$"])
  return outputs, np.array([len(o) + 1 for o in outputs]), probs


def exact_measures(probs, lengths):
  """Each measure's definition as an expectation over the whole support of
  length-normalized terms: E_P[f(y) / L(y)] = sum_y P(y) f(y) / L(y)."""
  average = probs.mean(0)
  expect = lambda p, f: float(np.sum(p * f / lengths))
  total = expect(average, -np.log(average))
  data = np.mean([expect(p, -np.log(p)) for p in probs])
  return {"beam_total_uncertainty": total, "beam_data_uncertainty": data,
          "beam_mutual_information": total - data,
          "beam_epkl": np.mean([expect(p, np.log(p) - np.log(q)) for p in probs for q in probs]),
          "beam_reverse_mutual_information": np.mean(
              [expect(average, np.log(average) - np.log(q)) for q in probs])}


def test_over_the_whole_support_each_measure_is_its_exact_expectation():
  """When the hypotheses are every output (T = 1, so pi_b = P(y_b) and w_sb = P_s(y_b)),
  e.g. beam_total_uncertainty = sum_y P(y) (-log P(y)) / L(y), exactly; in any order, an
  absent (-inf) hypothesis among them changing nothing."""
  rng = np.random.default_rng(2)
  rows = [autoregressive_support(rng, num_samples=3) for _ in range(2)]
  for _, _, probs in rows:
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-12)  # a whole support
  order = rng.permutation(7)
  sample_log_probs = np.stack([np.log(probs[:, order]) for _, _, probs in rows], 1)
  lengths = np.stack([lengths[order] for _, lengths, _ in rows])
  padded = np.concatenate([sample_log_probs, np.full((3, 2, 1), -np.inf)], -1)
  measures = measures_of(padded, np.concatenate([lengths, np.ones((2, 1), int)], -1))
  for row, (_, lengths_of_row, probs) in enumerate(rows):
    for name, value in exact_measures(probs, lengths_of_row).items():
      np.testing.assert_allclose(measures[name][row], value, rtol=1e-5, atol=1e-6,
                                 err_msg=f"{name}, input {row}")
  # The relation needs the probabilities themselves as weights: T = 2 flattens them.
  flattened = measures_of(padded, np.concatenate([lengths, np.ones((2, 1), int)], -1), 2.0)
  assert abs(flattened["beam_total_uncertainty"][0]
             - exact_measures(rows[0][2], rows[0][1])["beam_total_uncertainty"]) > 1e-3


def test_an_absent_hypothesis_is_the_same_as_none():
  rng = np.random.default_rng(3)
  sample_log_probs = -rng.uniform(0.5, 5.0, size=(4, 2, 3))
  lengths = rng.integers(1, 6, size=(2, 3))
  padded = np.insert(sample_log_probs, 1, -np.inf, axis=-1)
  with_absent = measures_of(padded, np.insert(lengths, 1, 9, axis=-1))
  for name, value in measures_of(sample_log_probs, lengths).items():
    np.testing.assert_allclose(with_absent[name], value, rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("shape, lengths, temperature, words", [
    ((2, 3, 4), (3, 5), 1.0, ["shape (2, 3, 4)", "shape (3, 5)", "[S, ..., B]"]),
    ((4,), (), 1.0, ["shape (4,)"]),
    ((2, 3, 4), (3, 4), 0.0, ["temperature=0.0 must be a positive number"]),
])
def test_bad_shapes_and_temperatures_are_one_line_errors(shape, lengths, temperature, words):
  with pytest.raises(ValueError) as error:
    predictive.beam_sequence_measures(jnp.zeros(shape), jnp.ones(lengths), temperature)
  assert "\n" not in str(error.value)
  for word in words:
    assert word in str(error.value)
