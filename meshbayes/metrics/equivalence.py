"""Equivalence-class sequence confidence: the predictive's probability of the outputs
equivalent to a decoded output ``y``, and whether a reference is equivalent to ``y``.

``equivalence_confidence`` gives ``c(y) = p(y)`` plus the probabilities of the distinct
samples equivalent to ``y`` (clipped to 1): a lower bound on the probability of ``y``'s
class. Equivalences (``EQUIVALENCES``): ``exact`` (``normalize_for_match`` equality),
``chrf++>=0.9`` and ``chrf++>=0.8`` (``chrf_pp``, symmetric); at most ``MAX_SAMPLES``
samples. Labels: ``equivalent_to_reference`` or ``equivalent_reference_counts``. Bad input
is a one-line ``ValueError``. Definitions: docs/uncertainty.md, "The measures".
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np
from sacrebleu.metrics import CHRF

from meshbayes.metrics import sequence_calibration, sequence_labels

MAX_SAMPLES = 16
EXACT, CHRF_PP_90, CHRF_PP_80 = "exact", "chrf++>=0.9", "chrf++>=0.8"
EQUIVALENCES = (EXACT, CHRF_PP_90, CHRF_PP_80)
# What counts as one sample in c(y): a string, or a normalize_for_match form.
DISTINCT_OUTPUTS, DISTINCT_FORMS = "output", "form"
_THRESHOLDS = {EXACT: None, CHRF_PP_90: 0.9, CHRF_PP_80: 0.8}


@functools.cache
def _chrf() -> CHRF:
  return CHRF(word_order=2)


@functools.lru_cache(maxsize=1 << 16)
def _normalized(text: str) -> str:
  return sequence_calibration.normalize_for_match(text)


@functools.lru_cache(maxsize=1 << 16)
def _chrf_pp_normalized(a: str, b: str) -> float:
  metric = _chrf()
  return (metric.sentence_score(a, [b]).score + metric.sentence_score(b, [a]).score) / 200.0


def chrf_pp(a: str, b: str) -> float:
  """chrF++ of two outputs in ``[0, 1]``: the mean of sacrebleu's sentence chrF++ of ``a``
  against ``b`` and of ``b`` against ``a``, on their ``normalize_for_match`` forms.

  The mean of both directions makes it symmetric, so ``z ~ y`` does not depend on which
  string plays the reference (chrF++ weighs recall twice: one direction alone would call
  a longer output equivalent to a shorter one but not the reverse).

  >>> chrf_pp("Il pleut.", "il pleut .")
  1.0
  """
  a, b = _normalized(_text(a, "chrf_pp")), _normalized(_text(b, "chrf_pp"))
  if a == b:
    return 1.0
  return _chrf_pp_normalized(*sorted((a, b)))


@dataclasses.dataclass(frozen=True)
class Equivalence:
  """One fixed equivalence.

  Attributes:
    name: one of ``EQUIVALENCES``.
    chrf_threshold: ``None`` for ``exact`` (``normalize_for_match`` equality), else the
      ``chrf_pp`` at or above which two outputs are equivalent (equal normalized forms
      always are, so ``exact`` implies every chrF++ equivalence).
  """

  name: str
  chrf_threshold: float | None

  def __call__(self, a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are equivalent (symmetric)."""
    return self.between_forms(_normalized(_text(a, self.name)), _normalized(_text(b, self.name)))

  def between_forms(self, a: str, b: str) -> bool:
    """``__call__`` on two ``normalize_for_match`` forms (not normalized again)."""
    if a == b:
      return True
    return self.chrf_threshold is not None and _chrf_pp_normalized(
        *sorted((a, b))) >= self.chrf_threshold


def get_equivalence(equivalence: str | Equivalence) -> Equivalence:
  """The ``Equivalence`` of a name in ``EQUIVALENCES`` (an ``Equivalence`` is returned as is).

  >>> get_equivalence("chrf++>=0.8").chrf_threshold
  0.8
  """
  if isinstance(equivalence, Equivalence):
    return equivalence
  if equivalence not in _THRESHOLDS:
    raise ValueError(f"unknown equivalence {equivalence!r}; valid: "
                     f"{', '.join(repr(name) for name in EQUIVALENCES)}")
  return Equivalence(equivalence, _THRESHOLDS[equivalence])


# --------------------------------------------------------------------------- checks


def _text(value, owner: str) -> str:
  if not isinstance(value, str):
    raise ValueError(f"{owner}: outputs must be strings; got {value!r}")
  return value


def _strings(values, name: str, owner: str) -> list[str]:
  if isinstance(values, str):
    raise ValueError(f"{owner}: {name} must be a sequence of strings, not the string "
                     f"{values!r}")
  values = list(values)
  for index, value in enumerate(values):
    if not isinstance(value, str):
      raise ValueError(f"{owner}: {name} must be strings; got {value!r} at index {index}")
  return values


def _log_prob(value, name: str, owner: str) -> float:
  try:
    value = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"{owner}: {name} must be a number <= 0; got {value!r}") from None
  if not value <= 0:  # also NaN
    raise ValueError(f"{owner}: {name} must be a log-probability <= 0; got {value!r}")
  return value


# --------------------------------------------------------------------------- confidence


def equivalence_confidence(output: str, output_log_prob: float, samples: Sequence[str],
                           sample_log_probs: Sequence[float],
                           equivalence: str | Equivalence,
                           distinct: str = DISTINCT_OUTPUTS) -> float:
  """``c(y) = p(y) + sum_z p(z)``, clipped to 1: a lower bound on ``y``'s class probability.

  The sum runs over the distinct samples ``z`` equivalent to ``y`` other than ``y``:
  distinct strings (``DISTINCT_OUTPUTS``, the default: another spelling of ``y``'s form is
  added) or distinct ``normalize_for_match`` forms (``DISTINCT_FORMS``: none of ``y``'s
  form is added, so the ``exact`` confidence is ``p(y)``). A repeated sample counts once
  (its largest log-probability). So ``p(y) <= c(y) <= P(class of y)``, up to rounding.

  Args:
    output: ``y``, the decoded output.
    output_log_prob: ``log p(y)`` under the predictive, ``<= 0``.
    samples: ``K <= MAX_SAMPLES`` ancestral samples from the predictive for the source.
    sample_log_probs: their ``log p``, ``<= 0`` each.
    equivalence: a name in ``EQUIVALENCES`` or an ``Equivalence``.
    distinct: ``DISTINCT_OUTPUTS`` or ``DISTINCT_FORMS``, what counts as one sample.

  Returns:
    ``c(y)`` in ``[p(y), 1]``.

  Raises:
    ValueError: one line naming the bad value (more than ``MAX_SAMPLES`` samples, lengths
      that differ, a log-probability above 0 or NaN, an unknown equivalence or
      ``distinct``).

  >>> import math
  >>> samples = ["Il pleut beaucoup!", "il pleut beaucoup .", "Il pleut beaucoup.", "Il neige."]
  >>> log_probs = [math.log(v) for v in (0.3, 0.1, 0.2, 0.3)]
  >>> # y itself is not added again; "Il pleut beaucoup." is chrF++ 0.87 from y
  >>> round(equivalence_confidence("Il pleut beaucoup!", math.log(0.3), samples,
  ...                              log_probs, "chrf++>=0.8"), 6)  # 0.3 + 0.1 + 0.2
  0.6
  >>> round(equivalence_confidence("Il pleut beaucoup!", math.log(0.3), samples,
  ...                              log_probs, "chrf++>=0.8", DISTINCT_FORMS), 6)  # 0.3 + 0.2
  0.5
  """
  return _confidence(output, output_log_prob, samples, sample_log_probs,
                     get_equivalence(equivalence), _distinct(distinct, "equivalence_confidence"),
                     "equivalence_confidence")


def _distinct(distinct, owner: str) -> str:
  if distinct not in (DISTINCT_OUTPUTS, DISTINCT_FORMS):
    raise ValueError(f"{owner}: distinct={distinct!r} must be {DISTINCT_OUTPUTS!r} or "
                     f"{DISTINCT_FORMS!r}")
  return distinct


def _confidence(output, output_log_prob, samples, sample_log_probs, equivalence: Equivalence,
                distinct: str, owner: str) -> float:
  output = _text(output, owner)
  log_p = _log_prob(output_log_prob, "output_log_prob", owner)
  samples = _strings(samples, "samples", owner)
  if isinstance(sample_log_probs, str):
    raise ValueError(f"{owner}: sample_log_probs must be numbers; got {sample_log_probs!r}")
  sample_log_probs = list(np.asarray(sample_log_probs, dtype=object).reshape(-1))
  if len(samples) > MAX_SAMPLES:
    raise ValueError(f"{owner}: {len(samples)} samples; K must be at most {MAX_SAMPLES}")
  if len(samples) != len(sample_log_probs):
    raise ValueError(f"{owner}: {len(samples)} samples but {len(sample_log_probs)} "
                     "sample_log_probs")
  key = (lambda text: text) if distinct == DISTINCT_OUTPUTS else _normalized
  best: dict[str, float] = {}
  for index, (sample, value) in enumerate(zip(samples, sample_log_probs)):
    value = _log_prob(value, f"sample_log_probs[{index}]", owner)
    best[key(sample)] = max(best.get(key(sample), -math.inf), value)
  best.pop(key(output), None)
  target = _normalized(output)
  total = math.exp(log_p) + sum(math.exp(value) for sample, value in best.items()
                                if equivalence.between_forms(_normalized(sample), target))
  return min(total, 1.0)


def equivalence_confidences(outputs: Sequence[str], output_log_probs: Sequence[float],
                            samples: Sequence[Sequence[str]],
                            sample_log_probs: Sequence[Sequence[float]],
                            equivalence: str | Equivalence,
                            distinct: str = DISTINCT_OUTPUTS) -> np.ndarray:
  """``equivalence_confidence`` of each source's output: ``(n,)`` float64.

  Every source must have the same number ``K <= MAX_SAMPLES`` of samples (``K`` is fixed
  in advance: ``E[c(y)]`` depends on it).

  Raises:
    ValueError: as ``equivalence_confidence``, naming the source; lengths that differ;
      sources with different ``K``.

  >>> equivalence_confidences(["a", "b"], [-1.0, -2.0], [["a"], ["c"]], [[-1.0], [-0.5]],
  ...                         "exact").round(4)
  array([0.3679, 0.1353])
  """
  owner = "equivalence_confidences"
  equivalence = get_equivalence(equivalence)
  distinct = _distinct(distinct, owner)
  outputs = _strings(outputs, "outputs", owner)
  lengths = {"output_log_probs": len(output_log_probs), "samples": len(samples),
             "sample_log_probs": len(sample_log_probs)}
  for name, length in lengths.items():
    if length != len(outputs):
      raise ValueError(f"{owner}: {len(outputs)} outputs but {length} {name}")
  result = np.empty(len(outputs), np.float64)
  num_samples = None
  for index, (output, log_p, drawn, drawn_log_p) in enumerate(
      zip(outputs, output_log_probs, samples, sample_log_probs)):
    where = f"{owner} (source {index})"
    if not isinstance(drawn, str) and num_samples is not None and len(drawn) != num_samples:
      raise ValueError(f"{where}: {len(drawn)} samples but source 0 has {num_samples}; "
                       "K must be the same for every source")
    result[index] = _confidence(output, log_p, drawn, drawn_log_p, equivalence, distinct, where)
    num_samples = len(drawn)
  return result


# --------------------------------------------------------------------------- labels


def _references(references, owner: str) -> list[str]:
  references = _strings(references, "references", owner)
  if not references:
    raise ValueError(f"{owner}: no reference")
  return references


def equivalent_to_reference(output: str, references: Sequence[str],
                            equivalence: str | Equivalence) -> bool:
  """Whether any of the source's references is equivalent to ``output`` (the label of
  ``c(y)``; for ``exact``, ``sequence_calibration.exact_matches``).

  >>> equivalent_to_reference("Il pleut.", ["Il neige.", "il pleut ."], "exact")
  True
  """
  equivalence = get_equivalence(equivalence)
  output = _text(output, "equivalent_to_reference")
  return any(equivalence(output, reference)
             for reference in _references(references, "equivalent_to_reference"))


def equivalent_reference_fraction(output: str, references: Sequence[str],
                                  equivalence: str | Equivalence) -> float:
  """The fraction of the source's references equivalent to ``output``, in ``[0, 1]`` (a
  reference listed twice counts twice, as in ``sequence_labels.reference_match_counts``).

  >>> equivalent_reference_fraction("Il pleut.", ["Il neige.", "il pleut ."], "exact")
  0.5
  """
  matched, count = equivalent_reference_counts([output], [references], equivalence)
  return float(matched[0] / count[0])


def equivalent_reference_counts(outputs: Sequence[str], references: Sequence[Sequence[str]],
                                equivalence: str | Equivalence
                                ) -> tuple[np.ndarray, np.ndarray]:
  """How many of its source's references are equivalent to each output, and how many
  there are: ``(num_matched, num_references)``, two ``(n,)`` int64 arrays, to pass to
  ``sequence_labels.reference_fraction_labels`` or ``any_reference_labels`` (and their
  ``null_band``). For ``exact``, ``sequence_labels.reference_match_counts``.

  >>> equivalent_reference_counts(["Il pleut."], [["il pleut .", "Il neige."]], "exact")
  (array([1]), array([2]))
  """
  owner = "equivalent_reference_counts"
  equivalence = get_equivalence(equivalence)
  outputs = _strings(outputs, "outputs", owner)
  if len(outputs) != len(references):
    raise ValueError(f"{owner}: {len(outputs)} outputs but {len(references)} reference lists")
  matched, counts = [], []
  for index, (output, refs) in enumerate(zip(outputs, references)):
    refs = _references(refs, f"{owner} (source {index})")
    matched.append(sum(equivalence(output, reference) for reference in refs))
    counts.append(len(refs))
  return np.array(matched, np.int64), np.array(counts, np.int64)


def equivalence_labels(outputs: Sequence[str], references: Sequence[Sequence[str]],
                       equivalence: str | Equivalence,
                       label: str = sequence_labels.ANY) -> np.ndarray:
  """``(n,)`` float64 labels: ``ANY`` (1 when a reference is equivalent) or ``FRACTION``
  (the fraction of references equivalent), from ``equivalent_reference_counts``.

  >>> equivalence_labels(["Il pleut."], [["il pleut .", "Il neige."]], "exact", "fraction")
  array([0.5])
  """
  if label not in (sequence_labels.ANY, sequence_labels.FRACTION):
    raise ValueError(f"equivalence_labels: label={label!r} must be "
                     f"{sequence_labels.ANY!r} or {sequence_labels.FRACTION!r}")
  matched, counts = equivalent_reference_counts(outputs, references, equivalence)
  if label == sequence_labels.ANY:
    return sequence_labels.any_reference_labels(matched, counts)
  return sequence_labels.reference_fraction_labels(matched, counts)
