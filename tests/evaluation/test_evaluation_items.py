"""Per-source evaluation items: every figure against its direct computation (the
equivalence-class confidence's included), intervals, paired differences, OOD selection on
a held-out half, and the files' round trip."""

import dataclasses
import functools

import numpy as np
import pytest

from meshbayes import metrics
from meshbayes.evaluation import items as evaluation_items
from meshbayes.evaluation.items import OodScores, SourceItems
from meshbayes.metrics import equivalence, sequence_labels
from meshbayes.metrics import measures as registry
from tests.evaluation.made_items import WORDS, make_items


def test_figures_are_the_metrics_of_their_parts():
  items = make_items(0)
  figures = evaluation_items.figures(items)
  assert figures["bleu"] == pytest.approx(metrics.corpus_bleu(items.predictions,
                                                              items.references).score)
  sentence = metrics.sentence_bleus(items.predictions, items.references)
  assert figures["mean_sentence_bleu"] == pytest.approx(sentence.mean())
  token = metrics.token_calibration_metrics({k: v.sum(0) for k, v in
                                              items.token_statistics.items()})
  assert figures["token_ece"] == pytest.approx(token["ece"])
  assert figures["token_nll"] == pytest.approx(token["nll"])
  p = np.exp(items.log_probs)
  matches = metrics.exact_matches(items.predictions, items.references)
  assert 0 < matches.sum() < len(items)
  assert figures["exact_match"] == matches.mean()
  assert figures["sequence_ece"] == pytest.approx(metrics.binary_ece(p, matches))
  assert figures["calibration_auroc"] == pytest.approx(metrics.calibration_auroc(p, matches))
  error = 1 - sentence / 100
  assert figures["prr_mutual_information"] == pytest.approx(
      metrics.prediction_rejection_ratio(error, items.measures["mutual_information"]))
  assert figures["prr_negative_log_probability"] == pytest.approx(
      metrics.prediction_rejection_ratio(error, -items.log_probs / items.num_tokens))
  # A resample with repeats is the figure of the repeated items.
  index = np.array([3, 3, 7, 1])
  assert evaluation_items.figures(items, index)["token_nll"] == pytest.approx(
      metrics.token_calibration_metrics({k: v[index].sum(0) for k, v in
                                         items.token_statistics.items()})["nll"])


def test_intervals_hold_the_estimate_and_paired_differences_are_paired():
  worse, better = make_items(1, quality=0.4), make_items(1, quality=0.8)
  intervals = evaluation_items.intervals(better, num_resamples=200)
  for name, interval in intervals.items():
    if np.isfinite(interval.estimate) and name != "num_items":
      assert interval.low <= interval.estimate <= interval.high, name
  difference = evaluation_items.paired_differences(better, worse, num_resamples=200)
  assert difference["bleu"].low > 0  # the same sources, better outputs
  assert difference["token_nll"].estimate == difference["token_nll"].low == 0.0  # same stats
  # The sequence ECE is differenced; its null band (Monte Carlo draws) is not.
  assert "sequence_ece" in difference and "sequence_ece_null_mean" in intervals
  assert not any("null" in name or "debiased" in name for name in difference)
  other = SourceItems(["another"] * 60, better.token_statistics, better.references,
                      better.predictions, better.log_probs, better.num_tokens)
  with pytest.raises(ValueError, match="the same sources in the same order"):
    evaluation_items.paired_differences(other, worse)


def test_ood_intervals_and_the_measure_chosen_on_the_other_half():
  rng = np.random.default_rng(2)
  inside = {"good": rng.normal(0, 1, 200), "noise": rng.random(200)}
  outside = {"good": rng.normal(3, 1, 100), "noise": rng.random(100)}
  scores = OodScores(inside, {"far": outside})
  intervals = evaluation_items.ood_intervals(scores, num_resamples=200)["far"]
  assert intervals["auroc_good"].estimate == metrics.auroc(inside["good"], outside["good"])
  assert intervals["auroc_good"].low > 0.95 and intervals["auroc_noise"].low < 0.5
  best, held_out = evaluation_items.measure_chosen_on_half(scores, "far", num_resamples=200)
  assert best == "good" and held_out.low > 0.95
  # Paired against a baseline whose "good" is noise: clearly better.
  baseline = OodScores({"good": inside["noise"]}, {"far": {"good": outside["noise"]}})
  paired = evaluation_items.ood_paired_differences(scores, baseline, {"good": ("good", "good")},
                                                   num_resamples=200)
  assert paired["far"]["good"].low > 0.3


def test_items_and_ood_scores_survive_their_files(tmp_path):
  items = make_items(3, n=10)
  evaluation_items.write_items(items, tmp_path, "model_average")
  again = evaluation_items.read_items(tmp_path, "model_average")
  assert list(again.sources) == list(items.sources) and again.predictions == items.predictions
  assert again.references == items.references
  np.testing.assert_array_equal(again.log_probs, items.log_probs)
  np.testing.assert_array_equal(again.measures["mutual_information"],
                                items.measures["mutual_information"])
  for name, values in items.token_statistics.items():
    np.testing.assert_array_equal(again.token_statistics[name], values)
  assert evaluation_items.figures(again) == pytest.approx(evaluation_items.figures(items),
                                                         nan_ok=True)
  undecoded = SourceItems(items.sources, items.token_statistics)
  evaluation_items.write_items(undecoded, tmp_path, "posterior_mean")
  assert not evaluation_items.read_items(tmp_path, "posterior_mean").decoded
  scores = OodScores({"a": np.arange(3.0)}, {"x": {"a": np.ones(2)}, "y": {"a": np.zeros(4)}})
  evaluation_items.write_ood_scores(scores, tmp_path)
  loaded = evaluation_items.read_ood_scores(tmp_path)
  assert set(loaded.out_of_domain) == {"x", "y"}
  np.testing.assert_array_equal(loaded.out_of_domain["y"]["a"], np.zeros(4))
  assert evaluation_items.read_ood_scores(tmp_path / "nothing") is None


def sampled_items(seed=4, n=48, num_samples=4):
  """Items with ``num_samples`` hand-made samples per source: the reference, a one-word
  variant of it (chrF++ near 0.8-0.9), the output itself, or another sentence."""
  rng = np.random.default_rng(seed)
  items = make_items(seed, n=n, quality=0.7)
  samples = []
  for prediction, references in zip(items.predictions, items.references):
    variant = references[0].split()
    variant[rng.integers(len(variant))] = "gris"
    pool = [references[0], " ".join(variant), prediction, " ".join(rng.choice(WORDS, size=5)),
            references[0].capitalize() + "."]
    samples.append([pool[j] for j in rng.integers(len(pool), size=num_samples)])
  sample_log_probs = np.log(rng.uniform(0.01, 0.3, size=(n, num_samples)))
  return dataclasses.replace(items, samples=samples, sample_log_probs=sample_log_probs)


def direct_equivalence_figures(items, name, index):
  """The figures of ``name``'s confidence on the items ``index`` picks, from
  ``metrics.equivalence`` and ``metrics.sequence_labels`` directly."""
  pick = lambda values: [values[i] for i in index]
  confidence = equivalence.equivalence_confidences(
      pick(items.predictions), items.log_probs[index], pick(items.samples),
      items.sample_log_probs[index], name)
  matched, counts = equivalence.equivalent_reference_counts(
      pick(items.predictions), pick(items.references), name)
  any_label = sequence_labels.any_reference_labels(matched, counts)
  fraction = sequence_labels.reference_fraction_labels(matched, counts)
  two_class = functools.partial(sequence_labels.two_class_ece, num_bins=15)
  one_sided = functools.partial(sequence_labels.one_sided_ece, num_bins=15)
  any_band = sequence_labels.null_band(confidence, two_class, evaluation_items.NULL_DRAWS,
                                       num_references=counts, label="any")
  fraction_band = sequence_labels.null_band(confidence, one_sided, evaluation_items.NULL_DRAWS,
                                            num_references=counts, label="fraction")
  return confidence, any_label, {
      "match_rate": any_label.mean(), "positives": any_label.sum(),
      "fraction_positives": fraction.sum(), "mean_confidence": confidence.mean(),
      "confidence_gap": confidence.mean() - any_label.mean(),
      "sequence_ece": two_class(confidence, any_label),
      "calibration_auroc": metrics.calibration_auroc(confidence, any_label),
      "reference_fraction": fraction.mean(),
      "fraction_confidence_gap": confidence.mean() - fraction.mean(),
      "fraction_ece": one_sided(confidence, fraction),
      "sequence_ece_null_mean": any_band.mean, "sequence_ece_null_high": any_band.high,
      "debiased_sequence_ece": two_class(confidence, any_label) - any_band.mean,
      "fraction_ece_null_mean": fraction_band.mean, "fraction_ece_null_high": fraction_band.high,
      "debiased_fraction_ece": one_sided(confidence, fraction) - fraction_band.mean}


def test_equivalence_figures_are_the_direct_computations_and_resample_by_source():
  items = sampled_items()
  for index in (np.arange(len(items)), np.array([5, 5, 0, 17, 30, 30, 30, 41, 2, 9])):
    figures = evaluation_items.figures(items, index)
    for name in equivalence.EQUIVALENCES:
      confidence, any_label, expected = direct_equivalence_figures(items, name, index)
      assert np.all(confidence >= np.exp(items.log_probs[index]) - 1e-12)
      for figure, value in expected.items():
        assert figures[f"equivalence_{registry.EQUIVALENCE_SLUGS[name]}_{figure}"] == (
            pytest.approx(value, abs=1e-12, nan_ok=True)), (name, figure)
  # Looser equivalences give more positives and more confidence, on these items nontrivially.
  figures = evaluation_items.figures(items)
  rates = [figures[f"equivalence_{slug}_positives"] for slug in ("exact", "chrf90", "chrf80")]
  assert 0 < rates[0] < rates[2] < len(items) and rates[0] <= rates[1] <= rates[2]
  assert (figures["equivalence_exact_mean_confidence"]
          < figures["equivalence_chrf80_mean_confidence"])
  # Exact equivalence against any reference is the exact-match label.
  assert figures["equivalence_exact_match_rate"] == figures["exact_match"]
  assert figures["exact_match_positives"] == figures["exact_match"] * len(items)


def test_equivalence_figures_come_with_samples_only_and_survive_the_files(tmp_path):
  items = sampled_items(n=16)
  unsampled = dataclasses.replace(items, samples=None, sample_log_probs=None)
  assert not any(name.startswith("equivalence_") for name in evaluation_items.figures(unsampled))
  intervals = evaluation_items.intervals(items, num_resamples=50)
  assert len([name for name in intervals if name.startswith("equivalence_")]) == 3 * len(
      registry.EQUIVALENCE_MIRRORED_FIGURES)
  interval = intervals["equivalence_chrf80_mean_confidence"]
  assert interval.low <= interval.estimate <= interval.high and interval.low < interval.high
  evaluation_items.write_items(items, tmp_path, "posterior_mean")
  again = evaluation_items.read_items(tmp_path, "posterior_mean")
  assert again.samples == items.samples and not set(again.measures) - set(items.measures)
  np.testing.assert_array_equal(again.sample_log_probs, items.sample_log_probs)
  assert evaluation_items.figures(again) == pytest.approx(evaluation_items.figures(items),
                                                         nan_ok=True)
  with pytest.raises(ValueError, match="sample counts \\[3, 4\\]"):
    dataclasses.replace(items, samples=[s[:3] if k else s for k, s in enumerate(items.samples)])
  with pytest.raises(ValueError, match="go together"):
    dataclasses.replace(items, samples=None)
