"""Equivalence-class confidence against sacrebleu, brute-force sums and the closed form of
its expectation on a source with a known categorical output distribution."""

import math

import numpy as np
import pytest
from sacrebleu.metrics import CHRF

from meshbayes.metrics import equivalence as eq
from meshbayes.metrics import sequence_labels as sl
from meshbayes.metrics.sequence_calibration import normalize_for_match

Y = "Le petit chat noir dort tranquillement sur le canapé du salon."
# A known output distribution over seven strings: y, another spelling of y (same
# normalized form), three near paraphrases, two unrelated outputs.
CATEGORICAL = {
    Y: 0.30,
    "le petit chat noir dort tranquillement sur le canapé du salon .": 0.05,
    "Le petit chat dort tranquillement sur le canapé du salon.": 0.15,  # chrF++ 0.905
    "Le petit chien noir dort tranquillement sur le canapé du salon.": 0.10,  # 0.891
    "Le petit chat noir dort paisiblement sur le canapé du salon.": 0.10,  # 0.824
    "Un petit chat noir dormait sur le canapé.": 0.15,  # 0.587
    "Un chien aboie dans le jardin.": 0.15,  # 0.133
}
SPELLING, CHAT, CHIEN, PAISIBLEMENT, DORMAIT, ABOIE = list(CATEGORICAL)[1:]
# Which outputs other than y are equivalent to y, fixed by hand (checked against sacrebleu
# in test_chrf_pp_is_the_mean_of_both_sacrebleu_directions).
EQUIVALENT = {"exact": {SPELLING}, "chrf++>=0.9": {SPELLING, CHAT},
              "chrf++>=0.8": {SPELLING, CHAT, CHIEN, PAISIBLEMENT}}


def sacrebleu_mean_chrf_pp(a, b):
  """chrF++ in [0, 1] straight from sacrebleu, both directions on the normalized forms."""
  metric, a, b = CHRF(word_order=2), normalize_for_match(a), normalize_for_match(b)
  return (metric.sentence_score(a, [b]).score + metric.sentence_score(b, [a]).score) / 200


# --------------------------------------------------------------------------- equivalences


def test_the_fixed_equivalences():
  assert eq.EQUIVALENCES == ("exact", "chrf++>=0.9", "chrf++>=0.8")
  assert [eq.get_equivalence(name).chrf_threshold for name in eq.EQUIVALENCES] == [None, 0.9, 0.8]
  same = eq.get_equivalence("exact")
  assert eq.get_equivalence(same) is same


def test_exact_is_normalize_for_match_equality():
  exact = eq.get_equivalence("exact")
  assert exact("Tom  est là!", "tom est là !")  # spacing, case, 13a punctuation split
  assert exact("Ｔｏｍ", "tom")  # NFKC
  assert exact(Y, SPELLING)
  assert not exact("Il pleut.", "Il pleut!")
  assert not exact(Y, CHAT)
  # A normalization-only difference is equivalent under every equivalence.
  for name in eq.EQUIVALENCES:
    assert eq.get_equivalence(name)("Il pleut.", "IL  PLEUT .")
  assert eq.chrf_pp("Il pleut.", "IL  PLEUT .") == 1.0


@pytest.mark.parametrize("other, score, at_90, at_80", [
    (CHAT, 0.9052, True, True),  # just above 0.9
    (CHIEN, 0.8909, False, True),  # just below 0.9
    (PAISIBLEMENT, 0.8239, False, True),  # just above 0.8
    (DORMAIT, 0.5869, False, False),
    (ABOIE, 0.1332, False, False),
])
def test_chrf_pp_is_the_mean_of_both_sacrebleu_directions(other, score, at_90, at_80):
  assert eq.chrf_pp(Y, other) == pytest.approx(sacrebleu_mean_chrf_pp(Y, other), abs=1e-12)
  assert eq.chrf_pp(Y, other) == pytest.approx(score, abs=1e-4)
  for a, b in ((Y, other), (other, Y)):
    assert eq.get_equivalence("chrf++>=0.9")(a, b) == at_90
    assert eq.get_equivalence("chrf++>=0.8")(a, b) == at_80
    assert not eq.get_equivalence("exact")(a, b)
  assert (other in EQUIVALENT["chrf++>=0.9"]) == at_90
  assert (other in EQUIVALENT["chrf++>=0.8"]) == at_80


def test_just_below_0_8_and_the_direction_convention():
  metric = CHRF(word_order=2)
  y = normalize_for_match("Je pense que nous devrions partir avant qu'il ne commence à pleuvoir.")
  below = normalize_for_match("Je pense qu'on devrait partir avant qu'il ne commence à pleuvoir.")
  assert eq.chrf_pp(y, below) == pytest.approx(0.7733, abs=1e-4)
  assert not eq.get_equivalence("chrf++>=0.8")(y, below)
  # Directions that straddle the threshold: the mean decides, whichever string comes first.
  short, longer = "Elle aime les chats.", "Elle aime les chats noirs."
  forward = metric.sentence_score(normalize_for_match(longer),
                                  [normalize_for_match(short)]).score / 100
  backward = metric.sentence_score(normalize_for_match(short),
                                   [normalize_for_match(longer)]).score / 100
  assert forward > 0.85 and backward < 0.75  # chrF++ is not symmetric
  assert eq.chrf_pp(short, longer) == eq.chrf_pp(longer, short) == pytest.approx(
      (forward + backward) / 2, abs=1e-12)
  assert eq.get_equivalence("chrf++>=0.8")(short, longer)
  assert eq.get_equivalence("chrf++>=0.8")(longer, short)
  # One direction at or above 0.9, the mean below: not equivalent under chrF++ >= 0.9.
  cut = "Le petit chat noir dort tranquillement sur le canapé."
  one_way = metric.sentence_score(normalize_for_match(Y), [normalize_for_match(cut)]).score
  other_way = metric.sentence_score(normalize_for_match(cut), [normalize_for_match(Y)]).score
  assert one_way > 90 > other_way
  assert not eq.get_equivalence("chrf++>=0.9")(Y, cut)
  assert not eq.get_equivalence("chrf++>=0.9")(cut, Y)
  assert eq.get_equivalence("chrf++>=0.8")(cut, Y)


# --------------------------------------------------------------------------- confidence


def log(value):
  return math.log(value)


def test_hand_made_confidences():
  p = CATEGORICAL
  samples = [CHAT, CHAT, Y, SPELLING, ABOIE, CHIEN, Y]
  log_probs = [log(p[s]) for s in samples]
  confidence = {name: eq.equivalence_confidence(Y, log(p[Y]), samples, log_probs, name)
                for name in eq.EQUIVALENCES}
  # CHAT twice: once; Y twice: not added to p(y); ABOIE: not equivalent.
  assert confidence["exact"] == pytest.approx(0.30 + 0.05)
  assert confidence["chrf++>=0.9"] == pytest.approx(0.30 + 0.05 + 0.15)
  assert confidence["chrf++>=0.8"] == pytest.approx(0.30 + 0.05 + 0.15 + 0.10)
  # Distinct normalized forms: y's other spelling is y's form, and is not added.
  forms = {name: eq.equivalence_confidence(Y, log(p[Y]), samples, log_probs, name,
                                           eq.DISTINCT_FORMS) for name in eq.EQUIVALENCES}
  assert forms == pytest.approx({"exact": 0.30, "chrf++>=0.9": 0.45, "chrf++>=0.8": 0.55})
  # No samples, or none equivalent: p(y).
  assert eq.equivalence_confidence(Y, log(0.3), [], [], "chrf++>=0.8") == pytest.approx(0.3)
  assert eq.equivalence_confidence(Y, log(0.3), [ABOIE] * 16, [log(0.15)] * 16,
                                   "chrf++>=0.8") == pytest.approx(0.3)
  # Log-probabilities that overstate (sum above 1): clipped to 1.
  assert eq.equivalence_confidence(Y, log(0.7), [CHAT], [log(0.6)], "chrf++>=0.9") == 1.0
  # A form drawn with two log-probabilities counts once, with the larger.
  assert eq.equivalence_confidence(Y, log(0.3), [CHAT, CHAT], [log(0.1), log(0.15)],
                                   "chrf++>=0.9") == pytest.approx(0.45)
  # -inf is probability 0.
  assert eq.equivalence_confidence(Y, -math.inf, [CHAT], [log(0.15)], "chrf++>=0.9") == (
      pytest.approx(0.15))


def test_confidence_lies_between_p_and_one_and_is_nested():
  rng = np.random.default_rng(0)
  strings, probs = list(CATEGORICAL), np.array(list(CATEGORICAL.values()))
  for _ in range(200):
    y = strings[rng.integers(len(strings))]
    drawn = [strings[i] for i in rng.choice(len(strings), size=rng.integers(0, 17), p=probs)]
    scale = rng.uniform(0.5, 3.0)  # log-probabilities of a predictive that need not sum to 1
    log_p = lambda s: min(0.0, scale * log(CATEGORICAL[s]))  # noqa: E731
    values = [eq.equivalence_confidence(y, log_p(y), drawn, [log_p(s) for s in drawn], name,
                                        distinct)
              for distinct in (eq.DISTINCT_FORMS, eq.DISTINCT_OUTPUTS)
              for name in eq.EQUIVALENCES]
    assert all(math.exp(log_p(y)) - 1e-12 <= v <= 1.0 for v in values)
    # forms <= outputs; exact <= 0.9 <= 0.8 (every exact pair is a chrF++ pair)
    assert values[0] <= values[1] + 1e-12 <= values[2] + 2e-12
    assert values[3] <= values[4] + 1e-12 <= values[5] + 2e-12
    for a, b in zip(values[:3], values[3:]):
      assert a <= b + 1e-12


SPELLINGS = [["Il pleut.", "il pleut .", "IL PLEUT.", "Il  pleut ."],
             ["Il neige!", "il neige !", "Il neige !"],
             ["Oui.", "oui ."], ["Non"]]


def test_exact_confidence_equals_a_brute_force_sum():
  """Distinct strings other than y with y's normalized form, summed independently."""
  assert [len({normalize_for_match(s) for s in group}) for group in SPELLINGS] == [1, 1, 1, 1]
  vocabulary = [s for group in SPELLINGS for s in group]
  group_of = {s: g for g, group in enumerate(SPELLINGS) for s in group}
  rng = np.random.default_rng(1)
  probability = dict(zip(vocabulary, rng.dirichlet(np.ones(len(vocabulary)))))
  nontrivial = 0
  for _ in range(300):
    y = vocabulary[rng.integers(len(vocabulary))]
    drawn = [vocabulary[i] for i in rng.integers(len(vocabulary), size=rng.integers(0, 17))]
    brute = probability[y] + sum(probability[z] for z in set(drawn) - {y}
                                 if group_of[z] == group_of[y])
    got = eq.equivalence_confidence(y, log(probability[y]), drawn,
                                    [log(probability[z]) for z in drawn], "exact")
    assert got == pytest.approx(brute, abs=1e-12)
    nontrivial += brute > probability[y]
    forms = eq.equivalence_confidence(y, log(probability[y]), drawn,
                                      [log(probability[z]) for z in drawn], "exact",
                                      eq.DISTINCT_FORMS)
    assert forms == pytest.approx(probability[y], abs=1e-15)  # y's form is never added
  assert nontrivial > 100


def expected_confidence(p_y, class_probabilities, num_samples):
  """E[c(y)] = p(y) + sum_{z ~ y, z != y} p(z) (1 - (1 - p(z))^K): each distinct z is
  added when it appears at least once among the K independent draws."""
  p = np.asarray(class_probabilities)
  return p_y + float(np.sum(p * (1 - (1 - p) ** num_samples)))


@pytest.mark.parametrize("name", eq.EQUIVALENCES)
@pytest.mark.parametrize("distinct", [eq.DISTINCT_OUTPUTS, eq.DISTINCT_FORMS])
def test_mean_confidence_matches_the_closed_form(name, distinct):
  strings, probs = list(CATEGORICAL), np.array(list(CATEGORICAL.values()))
  num_samples, draws = 4, 4000
  rng = np.random.default_rng(2)
  members = EQUIVALENT[name] - ({SPELLING} if distinct == eq.DISTINCT_FORMS else set())
  truth = expected_confidence(CATEGORICAL[Y], [CATEGORICAL[z] for z in members], num_samples)
  values = []
  for indices in rng.choice(len(strings), size=(draws, num_samples), p=probs):
    drawn = [strings[i] for i in indices]
    values.append(eq.equivalence_confidence(Y, log(CATEGORICAL[Y]), drawn,
                                            [log(CATEGORICAL[s]) for s in drawn], name,
                                            distinct))
  values = np.array(values)
  error = values.std() / math.sqrt(draws)
  assert abs(values.mean() - truth) <= 4 * error + 1e-12, (values.mean(), truth, error)
  # A lower bound on the class probability, strictly when the class has other members.
  class_probability = CATEGORICAL[Y] + sum(CATEGORICAL[z] for z in members)
  assert truth <= class_probability
  if members:
    assert class_probability - truth > 10 * error
  if name == "chrf++>=0.8":  # Counting duplicates (K sum p(z)^2 on average) is told apart.
    naive = CATEGORICAL[Y] + num_samples * sum(CATEGORICAL[z] ** 2 for z in members)
    assert abs(naive - truth) > 4 * error


def test_batched_equals_one_by_one():
  outputs = [Y, "Il pleut.", CHAT]
  samples = [[CHAT, SPELLING, ABOIE], ["il pleut .", "Il neige!", "Il pleut."], [Y, Y, CHIEN]]
  log_probs = [[-1.0, -2.0, -0.5], [-0.3, -1.0, -0.1], [-1.2, -1.2, -3.0]]
  for name in eq.EQUIVALENCES:
    batched = eq.equivalence_confidences(outputs, [-1.5, -0.4, -2.0], samples, log_probs, name)
    one_by_one = [eq.equivalence_confidence(*args, name)
                  for args in zip(outputs, [-1.5, -0.4, -2.0], samples, log_probs)]
    np.testing.assert_allclose(batched, one_by_one, rtol=0, atol=0)
    assert batched.dtype == np.float64 and batched.shape == (3,)


# --------------------------------------------------------------------------- labels


def test_reference_labels():
  references = ["Un chien aboie dans le jardin.", CHIEN, "le petit chat noir dort "
                "tranquillement sur le canapé du salon ."]
  assert eq.equivalent_to_reference(Y, references, "exact")
  assert eq.equivalent_reference_fraction(Y, references, "exact") == pytest.approx(1 / 3)
  assert eq.equivalent_reference_fraction(Y, references, "chrf++>=0.9") == pytest.approx(1 / 3)
  assert eq.equivalent_reference_fraction(Y, references, "chrf++>=0.8") == pytest.approx(2 / 3)
  assert not eq.equivalent_to_reference(Y, references[:2], "chrf++>=0.9")
  assert eq.equivalent_to_reference(Y, references[:2], "chrf++>=0.8")
  matched, counts = eq.equivalent_reference_counts([Y, DORMAIT], [references, [ABOIE]],
                                                   "chrf++>=0.8")
  assert matched.tolist() == [2, 0] and counts.tolist() == [3, 1]
  np.testing.assert_array_equal(
      eq.equivalence_labels([Y, DORMAIT], [references, [ABOIE]], "chrf++>=0.8", sl.FRACTION),
      [2 / 3, 0.0])
  np.testing.assert_array_equal(
      eq.equivalence_labels([Y, DORMAIT], [references, [ABOIE]], "chrf++>=0.8"), [1.0, 0.0])


def test_exact_labels_are_reference_match_counts():
  rng = np.random.default_rng(3)
  vocabulary = [s for group in SPELLINGS for s in group]
  outputs = [vocabulary[i] for i in rng.integers(len(vocabulary), size=100)]
  references = [[vocabulary[i] for i in rng.integers(len(vocabulary), size=rng.integers(1, 5))]
                for _ in outputs]
  matched, counts = eq.equivalent_reference_counts(outputs, references, "exact")
  expected_matched, expected_counts = sl.reference_match_counts(outputs, references)
  np.testing.assert_array_equal(matched, expected_matched)
  np.testing.assert_array_equal(counts, expected_counts)
  assert 0 < (matched > 0).mean() < 1
  assert [eq.equivalent_to_reference(o, r, "exact") for o, r in zip(outputs, references)] == (
      (matched > 0).tolist())


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("call, message", [
    (lambda: eq.equivalence_confidence(Y, -1.0, [CHAT] * 17, [-1.0] * 17, "exact"),
     "17 samples; K must be at most 16"),
    (lambda: eq.equivalence_confidence(Y, -1.0, [CHAT, CHIEN], [-1.0], "exact"),
     "2 samples but 1 sample_log_probs"),
    (lambda: eq.equivalence_confidence(Y, 0.5, [], [], "exact"),
     "output_log_prob must be a log-probability <= 0; got 0.5"),
    (lambda: eq.equivalence_confidence(Y, -1.0, [CHAT, CHIEN], [-1.0, 0.2], "exact"),
     "sample_log_probs[1] must be a log-probability <= 0; got 0.2"),
    (lambda: eq.equivalence_confidence(Y, float("nan"), [], [], "exact"), "got nan"),
    (lambda: eq.equivalence_confidence(Y, -1.0, [], [], "bleu>=0.5"),
     "unknown equivalence 'bleu>=0.5'; valid: 'exact', 'chrf++>=0.9', 'chrf++>=0.8'"),
    (lambda: eq.equivalence_confidence(Y, -1.0, [], [], "exact", distinct="token"),
     "distinct='token' must be 'output' or 'form'"),
    (lambda: eq.equivalence_confidence(Y, -1.0, CHAT, [-1.0], "exact"),
     "samples must be a sequence of strings, not the string"),
    (lambda: eq.equivalence_confidence(Y, -1.0, [None], [-1.0], "exact"),
     "samples must be strings; got None at index 0"),
    (lambda: eq.equivalence_confidences([Y, Y], [-1.0], [[], []], [[], []], "exact"),
     "2 outputs but 1 output_log_probs"),
    (lambda: eq.equivalence_confidences([Y, Y], [-1.0, -1.0], [[CHAT], []], [[-1.0], []],
                                        "exact"),
     "(source 1): 0 samples but source 0 has 1; K must be the same for every source"),
    (lambda: eq.equivalence_confidences([Y], [-1.0], [[CHAT]], [[1.0]], "exact"),
     "(source 0): sample_log_probs[0] must be a log-probability <= 0; got 1.0"),
    (lambda: eq.equivalent_to_reference(Y, [], "exact"), "no reference"),
    (lambda: eq.equivalent_reference_counts([Y], [], "exact"), "1 outputs but 0 reference lists"),
    (lambda: eq.equivalent_to_reference(Y, [CHAT], "chrf"), "unknown equivalence 'chrf'"),
    (lambda: eq.equivalence_labels([Y], [[Y]], "exact", label="all"), "label='all'"),
])
def test_bad_input_is_a_one_line_value_error(call, message):
  with pytest.raises(ValueError) as error:
    call()
  assert message in str(error.value) and "\n" not in str(error.value), str(error.value)
