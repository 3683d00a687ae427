"""What an evaluation keeps of each test item (a distinct source), and every figure computed
from it.

``figures`` is a function of a predictive's items (``SourceItems``), so the same function
gives the estimate, its bootstrap interval over sources (``intervals``) and the paired
difference against another predictive on the same sources (``paired_differences``).
``OodScores`` keeps each input's uncertainty measures for OOD detection (``ood_intervals``,
``measure_chosen_on_half``). ``read_items`` and ``read_ood_scores`` load the files an
evaluation writes, checked against its manifest (``evaluation.manifest``). How evaluation
works: docs/uncertainty.md.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from meshbayes import metrics
from meshbayes.evaluation import manifest
from meshbayes.metrics import (bootstrap, equivalence, rejection, sequence_calibration,
                               sequence_labels, token_labels)
from meshbayes.metrics import measures as registry
from meshbayes.metrics.bleu import bleu_from_statistics, bleu_statistics
from meshbayes.runtime import strict_json

# The length-normalized negative log-probability of an output as decoded (the error
# detection measure every predictive has).
NEGATIVE_LOG_PROBABILITY = "negative_log_probability"
# Error detection measures, in the order reports show them (those an item set has).
ERROR_MEASURES = registry.ERROR_DETECTION_MEASURES
# The token-level figures, each token_<key of metrics.token_calibration_metrics>.
_TOKEN_FIGURES = registry.names(kind=registry.FIGURE, level=registry.TOKEN)
OOD_SPLIT_SEED = 1
# Labels a null band draws per figure (and per bootstrap resample): its quantiles to about
# 1% of the band's width at n = 693.
NULL_DRAWS = 200


@dataclasses.dataclass(frozen=True)
class SourceItems:
  """One predictive's results on a split, one item per distinct source.

  Attributes:
    sources: each source's text.
    token_statistics: name -> ``(n, ...)`` teacher-forced token statistics
      (``metrics.token_calibration_statistics``) summed over each source's pairs.
    references: each source's references (None when the split was not decoded;
      so for the four below).
    predictions: each source's decoded output.
    log_probs: ``(n,)`` log-probability of each output (EOS included) under the
      predictive that decoded it.
    num_tokens: ``(n,)`` tokens of each output, EOS included.
    measures: name -> ``(n,)`` uncertainty measures of each output
      (``predictives.Decoded.measures``).
    decoded_token_statistics: name -> ``(n, bins)`` calibration sums of each output's
      decoded tokens, labelled by their alignment to the closest reference
      (``metrics.token_labels.decoded_token_statistics``); empty when not computed.
    samples: each source's ``K`` ancestral samples (texts, detokenized as the outputs
      are), ``K`` the same for every source; None without equivalence samples.
    sample_log_probs: ``(n, K)`` their log-probabilities under the predictive, on the
      footing of ``log_probs``.
  """

  sources: Sequence[str]
  token_statistics: Mapping[str, np.ndarray]
  references: Sequence[Sequence[str]] | None = None
  predictions: Sequence[str] | None = None
  log_probs: np.ndarray | None = None
  num_tokens: np.ndarray | None = None
  measures: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
  decoded_token_statistics: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
  samples: Sequence[Sequence[str]] | None = None
  sample_log_probs: np.ndarray | None = None

  def __post_init__(self):
    n = len(self.sources)
    sizes = {len(v) for v in self.token_statistics.values()}
    decoded = [self.references, self.predictions, self.log_probs, self.num_tokens]
    if sizes - {n} or (any(x is None for x in decoded) and not all(x is None for x in decoded)):
      raise ValueError(f"SourceItems: {n} sources, but token statistics of sizes {sizes} or "
                       "only part of the decoded outputs")
    if self.decoded and ({len(x) for x in decoded} | {len(v) for v in self.measures.values()}
                         | {len(v) for v in self.decoded_token_statistics.values()}) - {n}:
      raise ValueError(f"SourceItems: {n} sources, but decoded fields of other lengths")
    if (self.samples is None) != (self.sample_log_probs is None):
      raise ValueError("SourceItems: samples and sample_log_probs go together")
    if self.samples is not None:
      sample_counts = {len(drawn) for drawn in self.samples}  # {K}, the same for all
      if not self.decoded or len(self.samples) != n or len(sample_counts) > 1 or np.shape(
          self.sample_log_probs) != (n, *sample_counts):
        raise ValueError(f"SourceItems: {n} decoded sources need samples and sample_log_probs "
                         f"of K each; got sample counts {sorted(sample_counts)} and "
                         f"log-probabilities of shape {np.shape(self.sample_log_probs)}")

  @property
  def decoded(self) -> bool:
    return self.predictions is not None

  def __len__(self) -> int:
    return len(self.sources)

  @functools.cached_property
  def sentence_bleu(self) -> np.ndarray:
    """``(n,)`` multi-reference sentence BLEU of each output, 0 to 100."""
    return metrics.sentence_bleus(self.predictions, self.references)

  @functools.cached_property
  def exact_match(self) -> np.ndarray:
    """``(n,)`` whether each output matches one of its references (normalized)."""
    return self.reference_matches[0] > 0

  @functools.cached_property
  def reference_matches(self) -> tuple[np.ndarray, np.ndarray]:
    """``(n,)`` references each output matches and ``(n,)`` references of its source."""
    return sequence_labels.reference_match_counts(self.predictions, self.references)

  @functools.cached_property
  def equivalence_confidences(self) -> dict[str, np.ndarray]:
    """Equivalence -> ``(n,)`` ``c(y)`` of each output (``metrics.equivalence``; empty
    without samples). Log-probabilities that float32 rounding put above 0 count as 0."""
    if self.samples is None:
      return {}
    return {name: equivalence.equivalence_confidences(
        self.predictions, np.minimum(self.log_probs, 0.0), self.samples,
        np.minimum(self.sample_log_probs, 0.0), name) for name in equivalence.EQUIVALENCES}

  @functools.cached_property
  def equivalent_references(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Equivalence -> ``(n,)`` references equivalent to each output and ``(n,)`` references
    of its source (empty without samples); exact equivalence is ``reference_matches``,
    counted once."""
    if self.samples is None:
      return {}
    return {name: self.reference_matches if name == equivalence.EXACT else
            equivalence.equivalent_reference_counts(self.predictions, self.references, name)
            for name in equivalence.EQUIVALENCES}

  @functools.cached_property
  def bleu_statistics(self) -> np.ndarray:
    """``(n, 10)`` corpus-BLEU sufficient statistics of each output."""
    return bleu_statistics(self.predictions, self.references)

  @functools.cached_property
  def error_measures(self) -> dict[str, np.ndarray]:
    """The uncertainty measures of ``ERROR_MEASURES`` the items have, the negative
    log-probability per token among them."""
    found = dict(self.measures, **{NEGATIVE_LOG_PROBABILITY: -np.asarray(self.log_probs) /
                                   np.maximum(np.asarray(self.num_tokens), 1)})
    return {name: np.asarray(found[name], np.float64) for name in ERROR_MEASURES if name in found}


def token_figures(statistics: Mapping[str, np.ndarray]) -> dict[str, float]:
  """Token-level figures from per-item statistics (summed here)."""
  token = metrics.token_calibration_metrics({k: np.sum(v, axis=0) for k, v in statistics.items()})
  return {name: token[name.removeprefix("token_")] for name in _TOKEN_FIGURES}


def figures(items: SourceItems, index: np.ndarray | None = None,
            num_bins: int = metrics.DEFAULT_NUM_BINS, null_bands: bool = True
            ) -> dict[str, float]:
  """Every scalar figure of ``items`` (or of the items ``index`` picks, with repeats);
  without ``null_bands``, not the sequence ECEs' null bands and debiased ECEs (Monte Carlo
  draws: most of the time, and no use in a difference of two methods).

  Token level: ``token_ece``, ``token_weighted_ece``, ``token_nll``, ``token_brier``,
  ``token_accuracy``. When decoded: ``bleu`` (corpus, multi-reference),
  ``mean_sentence_bleu``; the exact-match sequence calibration (``_calibration_figures``);
  with samples, the same figures of each equivalence's ``c(y)`` against an equivalent
  reference (``measures.equivalence_figure`` names them); and ``prr_<measure>``, the
  prediction rejection ratio of each error measure for the sentence-BLEU error
  ``1 - BLEU / 100``.
  """
  index = np.arange(len(items)) if index is None else np.asarray(index)
  result = token_figures({k: np.asarray(v)[index] for k, v in items.token_statistics.items()})
  result["num_items"] = float(index.size)
  if not items.decoded:
    return result
  probability = np.clip(np.exp(np.asarray(items.log_probs, np.float64)[index]), 0.0, 1.0)
  calibration = _calibration_figures(probability, items.exact_match[index],
                                     *(x[index] for x in items.reference_matches), num_bins,
                                     null_bands)
  for name, confidence in items.equivalence_confidences.items():
    matched, num_references = (x[index] for x in items.equivalent_references[name])
    calibration.update({registry.equivalence_figure(name, figure): value
                        for figure, value in _calibration_figures(
                            confidence[index], sequence_labels.any_reference_labels(
                                matched, num_references), matched, num_references,
                            num_bins, null_bands).items()})
  error = 1.0 - items.sentence_bleu[index] / 100.0
  result.update(bleu=bleu_from_statistics(items.bleu_statistics[index].sum(0)),
                mean_sentence_bleu=float(items.sentence_bleu[index].mean()), **calibration)
  for name, values in items.error_measures.items():
    result[registry.family_name(registry.PRR, name)] = rejection.prediction_rejection_ratio(
        error, values[index])
  if items.decoded_token_statistics:
    tokens = token_labels.decoded_token_metrics(
        {k: np.asarray(v)[index] for k, v in items.decoded_token_statistics.items()})
    result.update(decoded_token_ece=tokens["ece"], decoded_token_accuracy=tokens["accuracy"],
                  decoded_token_confidence_gap=tokens["confidence_gap"])
  return result


def _calibration_figures(probability: np.ndarray, labels: np.ndarray, matched: np.ndarray,
                         num_references: np.ndarray, num_bins: int,
                         null_bands: bool = True) -> dict[str, float]:
  """The sequence calibration figures of confidences ``probability`` against any-reference
  ``labels`` (``metrics.sequence_calibration``: ``exact_match``, ``mean_probability``,
  ``probability_gap`` and its absolute value, ``sequence_ece``, ``calibration_auroc``,
  ``equal_mass_ece``), the positives of both labels (``exact_match_positives``,
  ``reference_fraction_positives``: too few make every figure underpowered), and
  ``_label_figures`` with ``matched`` of ``num_references`` references each."""
  result = sequence_calibration.sequence_calibration_figures(probability, labels, num_bins)
  result["sequence_ece"] = result.pop("ece")
  result["abs_probability_gap"] = abs(result["probability_gap"])
  result["exact_match_positives"] = float(np.sum(labels))
  result["reference_fraction_positives"] = float(np.sum(
      sequence_labels.reference_fraction_labels(matched, num_references)))
  result.update(_label_figures(probability, matched, num_references, result["sequence_ece"],
                               num_bins, null_bands))
  return result


def _label_figures(probability: np.ndarray, matched: np.ndarray, num_references: np.ndarray,
                   sequence_ece: float, num_bins: int, null_bands: bool = True
                   ) -> dict[str, float]:
  """The reference-fraction figures (``metrics.sequence_labels``), and with ``null_bands``
  for each sequence ECE the null band of a calibrated model on the same outputs (labels
  drawn from ``p``, each source's references as draws) and the ECE less the band's mean."""
  result = sequence_labels.fraction_calibration_figures(probability, matched, num_references,
                                                        num_bins)
  if not null_bands:
    return result
  for name, ece, label in (("sequence_ece", sequence_labels.two_class_ece, "any"),
                           ("fraction_ece", sequence_labels.one_sided_ece, "fraction")):
    band = sequence_labels.null_band(probability, functools.partial(ece, num_bins=num_bins),
                                     num_draws=NULL_DRAWS, num_references=num_references,
                                     label=label)
    observed = sequence_ece if name == "sequence_ece" else result["fraction_ece"]
    result.update({f"{name}_null_mean": band.mean, f"{name}_null_high": band.high,
                   f"debiased_{name}": sequence_labels.debiased_ece(observed, band)})
  return result


def intervals(items: SourceItems, num_resamples: int = bootstrap.DEFAULT_RESAMPLES,
              seed: int = bootstrap.DEFAULT_SEED, num_bins: int = metrics.DEFAULT_NUM_BINS
              ) -> dict[str, bootstrap.Interval]:
  """Every figure with its bootstrap interval over the sources."""
  return bootstrap.bootstrap(lambda index: figures(items, index, num_bins), [len(items)],
                             num_resamples, seed)


def _check_same_sources(items: SourceItems, baseline: SourceItems) -> None:
  if list(items.sources) != list(baseline.sources):
    raise ValueError(f"paired differences need the same sources in the same order: "
                     f"{len(items)} and {len(baseline)} sources that differ")


def paired_differences(items: SourceItems, baseline: SourceItems,
                       num_resamples: int = bootstrap.DEFAULT_RESAMPLES,
                       seed: int = bootstrap.DEFAULT_SEED,
                       num_bins: int = metrics.DEFAULT_NUM_BINS) -> dict[str, bootstrap.Interval]:
  """``figure(items) - figure(baseline)`` for each figure both have but the null bands and
  the test statistics (``*_z``, ``*_p_value``: a difference of two tests' statistics tests
  nothing), with intervals over the same resampled sources."""
  _check_same_sources(items, baseline)
  return bootstrap.paired_bootstrap(lambda index: _differenced(figures(items, index, num_bins,
                                                                       False)),
                                    lambda index: _differenced(figures(baseline, index,
                                                                       num_bins, False)),
                                    [len(items)], num_resamples, seed)


def _differenced(found: dict[str, float]) -> dict[str, float]:
  """The figures a paired difference is taken of: not a test's statistic or p-value."""
  return {name: value for name, value in found.items()
          if not name.endswith(("_z", "_p_value"))}


# --------------------------------------------------------------------------- OOD


@dataclasses.dataclass(frozen=True)
class OodScores:
  """Uncertainty measures of in-distribution inputs and of each out-of-distribution set.

  Attributes:
    in_domain: measure -> ``(n,)`` of the in-distribution inputs.
    out_of_domain: set -> measure -> ``(m,)``.
  """

  in_domain: Mapping[str, np.ndarray]
  out_of_domain: Mapping[str, Mapping[str, np.ndarray]]

  def measures(self, ood_set: str) -> list[str]:
    """The measures both the in-domain inputs and ``ood_set`` have."""
    return [m for m in self.in_domain if m in self.out_of_domain[ood_set]]


def ood_figures(in_domain: Mapping[str, np.ndarray], out_of_domain: Mapping[str, np.ndarray],
                measures: Sequence[str]) -> dict[str, float]:
  """``auroc_<measure>`` and ``fpr95_<measure>`` (higher measure = out of distribution)."""
  result = {}
  for name in measures:
    inside, outside = np.asarray(in_domain[name]), np.asarray(out_of_domain[name])
    result[registry.family_name(registry.AUROC, name)] = metrics.auroc(inside, outside)
    result[registry.family_name(registry.FPR95, name)] = metrics.fpr_at_tpr(inside, outside, 0.95)
  return result


def _resampled(scores: Mapping[str, np.ndarray], index: np.ndarray) -> dict[str, np.ndarray]:
  return {name: np.asarray(values)[index] for name, values in scores.items()}


def ood_intervals(scores: OodScores, num_resamples: int = bootstrap.DEFAULT_RESAMPLES,
                  seed: int = bootstrap.DEFAULT_SEED) -> dict[str, dict[str, bootstrap.Interval]]:
  """Per OOD set, each measure's AUROC and FPR@95 with intervals (inputs of both kinds
  resampled)."""
  result = {}
  for ood_set, outside in scores.out_of_domain.items():
    measures = scores.measures(ood_set)
    sizes = [len(next(iter(scores.in_domain.values()))), len(next(iter(outside.values())))]
    result[ood_set] = bootstrap.bootstrap(
        lambda i, o: ood_figures(_resampled(scores.in_domain, i), _resampled(outside, o),
                                 measures), sizes, num_resamples, seed)
  return result


def ood_paired_differences(scores: OodScores, baseline: OodScores, measure_pairs: Mapping[
    str, tuple[str, str]], num_resamples: int = bootstrap.DEFAULT_RESAMPLES,
                           seed: int = bootstrap.DEFAULT_SEED
                           ) -> dict[str, dict[str, bootstrap.Interval]]:
  """Per OOD set both have, ``AUROC(scores by a) - AUROC(baseline by b)`` for each
  ``name: (a, b)`` of ``measure_pairs`` (the same inputs, resampled together)."""
  result = {}
  for ood_set in scores.out_of_domain:
    if ood_set not in baseline.out_of_domain:
      continue
    pairs = {name: (a, b) for name, (a, b) in measure_pairs.items()
             if a in scores.measures(ood_set) and b in baseline.measures(ood_set)}
    sizes = [len(next(iter(scores.in_domain.values()))),
             len(next(iter(scores.out_of_domain[ood_set].values())))]

    def auroc_of(which: OodScores, side: int):
      return lambda i, o: {name: metrics.auroc(
          np.asarray(which.in_domain[measures[side]])[i],
          np.asarray(which.out_of_domain[ood_set][measures[side]])[o])
                           for name, measures in pairs.items()}

    result[ood_set] = bootstrap.paired_bootstrap(auroc_of(scores, 0), auroc_of(baseline, 1),
                                                 sizes, num_resamples, seed)
  return result


def measure_chosen_on_half(scores: OodScores, ood_set: str,
                           num_resamples: int = bootstrap.DEFAULT_RESAMPLES,
                           seed: int = bootstrap.DEFAULT_SEED) -> tuple[str, bootstrap.Interval]:
  """The measure with the best AUROC on a random half of the in- and out-of-distribution
  inputs (``OOD_SPLIT_SEED``), and its AUROC with interval on the other half."""
  inside_size = len(next(iter(scores.in_domain.values())))
  outside = scores.out_of_domain[ood_set]
  outside_size = len(next(iter(outside.values())))
  rng = np.random.default_rng(OOD_SPLIT_SEED)
  halves = [np.array_split(rng.permutation(n), 2) for n in (inside_size, outside_size)]
  (choose_in, report_in), (choose_out, report_out) = halves
  chosen = _resampled(scores.in_domain, choose_in), _resampled(outside, choose_out)
  measures = scores.measures(ood_set)
  best = max(measures, key=lambda m: (metrics.auroc(chosen[0][m], chosen[1][m]),
                                      -measures.index(m)))
  inside, held_out = _resampled(scores.in_domain, report_in), _resampled(outside, report_out)
  interval = bootstrap.bootstrap(
      lambda i, o: {"auroc": metrics.auroc(inside[best][i], held_out[best][o])},
      [report_in.size, report_out.size], num_resamples, seed)["auroc"]
  return best, interval


# --------------------------------------------------------------------------- files


def _predictions_name(predictive: str) -> str:
  return f"predictions_{predictive}.jsonl"


def _statistics_name(predictive: str) -> str:
  return f"token_statistics_{predictive}.npz"


OOD_SCORES = "ood_scores.npz"


def write_items(items: SourceItems, directory: str | epath.PathLike, predictive: str
                ) -> list[str]:
  """Writes ``token_statistics_<predictive>.npz`` and (when decoded)
  ``predictions_<predictive>.jsonl`` under ``directory`` (strict JSON: an undefined
  measure is null); returns the names written."""
  directory = epath.Path(directory)
  written = [_statistics_name(predictive)]
  with (directory / written[0]).open("wb") as out:
    np.savez(out, sources=np.asarray(items.sources, object).astype(str),
             **{f"statistic/{k}": np.asarray(v) for k, v in items.token_statistics.items()},
             **{f"decoded_token/{k}": np.asarray(v)
                for k, v in items.decoded_token_statistics.items()})
  if not items.decoded:
    return written
  lines = []
  for k, source in enumerate(items.sources):
    lines.append(strict_json.dumps({
        "input": source, "references": list(items.references[k]),
        "prediction": items.predictions[k], "log_prob": float(items.log_probs[k]),
        "num_tokens": int(items.num_tokens[k]), "sentence_bleu": float(items.sentence_bleu[k]),
        "exact_match": bool(items.exact_match[k]),
        **({} if items.samples is None else {
            "samples": list(items.samples[k]),
            "sample_log_probs": [float(v) for v in items.sample_log_probs[k]]}),
        **{name: float(values[k]) for name, values in items.measures.items()}}))
  written.append(_predictions_name(predictive))
  (directory / written[1]).write_text("\n".join(lines) + "\n")
  return written


_RECORD_FIELDS = ("input", "references", "prediction", "log_prob", "num_tokens",
                  "sentence_bleu", "exact_match", "samples", "sample_log_probs")


def read_items(directory: str | epath.PathLike, predictive: str, *, step: int | None = None,
               method: str | None = None) -> SourceItems:
  """The items ``write_items`` wrote, checked against the evaluation's manifest
  (``manifest.read_checked``: a file of another evaluation, or of another ``step`` or
  ``method`` than given, is refused in one line). A null (undefined) number reads as NaN."""
  statistics_file = manifest.read_checked(directory, _statistics_name(predictive),
                                          f"the token statistics of {predictive}", step=step,
                                          method=method)
  if statistics_file is None:
    raise FileNotFoundError(f"{epath.Path(directory) / _statistics_name(predictive)}: no "
                            f"items of {predictive} there")
  stored = np.load(io.BytesIO(statistics_file))
  sources = [str(s) for s in stored["sources"]]
  statistics = {k.split("/", 1)[1]: stored[k] for k in stored.files if k.startswith("statistic/")}
  decoded_tokens = {k.split("/", 1)[1]: stored[k] for k in stored.files
                    if k.startswith("decoded_token/")}
  predictions = manifest.read_checked(directory, _predictions_name(predictive),
                                      f"the predictions of {predictive}", step=step,
                                      method=method)
  if predictions is None:
    return SourceItems(sources, statistics)
  # json.loads: files written before strict JSON may hold NaN.
  records = [json.loads(line) for line in predictions.decode().splitlines() if line]
  measures = {name: np.array([r[name] for r in records], np.float64)
              for name in records[0] if name not in _RECORD_FIELDS} if records else {}
  sampled = ([r["samples"] for r in records],
             np.array([r["sample_log_probs"] for r in records], np.float64)) if (
                 records and "samples" in records[0]) else (None, None)
  return SourceItems(sources, statistics, [r["references"] for r in records],
                     [r["prediction"] for r in records],
                     np.array([r["log_prob"] for r in records], np.float64),
                     np.array([r["num_tokens"] for r in records], np.int64), measures,
                     decoded_tokens, *sampled)


def write_ood_scores(scores: OodScores, directory: str | epath.PathLike) -> str:
  """Writes ``ood_scores.npz`` under ``directory``; returns its name."""
  arrays = {f"in_domain/{m}": np.asarray(v) for m, v in scores.in_domain.items()}
  arrays.update({f"ood/{s}/{m}": np.asarray(v) for s, measures in scores.out_of_domain.items()
                 for m, v in measures.items()})
  with (epath.Path(directory) / OOD_SCORES).open("wb") as out:
    np.savez(out, **arrays)
  return OOD_SCORES


def read_ood_scores(directory: str | epath.PathLike, *, step: int | None = None,
                    method: str | None = None) -> OodScores | None:
  """The scores ``write_ood_scores`` wrote, or None when there are none; checked as
  ``read_items``' files are."""
  data = manifest.read_checked(directory, OOD_SCORES, "the OOD scores", step=step,
                               method=method)
  if data is None:
    return None
  stored = np.load(io.BytesIO(data))
  in_domain = {k.split("/", 1)[1]: stored[k] for k in stored.files if k.startswith("in_domain/")}
  out_of_domain: dict[str, dict[str, np.ndarray]] = {}
  for key in stored.files:
    if key.startswith("ood/"):
      _, ood_set, measure = key.split("/", 2)
      out_of_domain.setdefault(ood_set, {})[measure] = stored[key]
  return OodScores(in_domain, out_of_domain)


def as_json(tree: Any) -> Any:
  """Intervals (nested in dicts) as ``{'estimate', 'low', 'high'}`` dicts."""
  if isinstance(tree, bootstrap.Interval):
    return tree.as_dict()
  if isinstance(tree, Mapping):
    return {k: as_json(v) for k, v in tree.items()}
  return tree
